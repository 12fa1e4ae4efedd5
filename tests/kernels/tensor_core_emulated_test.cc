// The tensor-core instructions of kernels/cuda/tensor_core.cuh, run by the SIMT emulator
// (tests/support/simt_emulator.h), against the PTX ISA (sections named as in the ISA; their
// numbers change between versions):
//  - "Matrix Fragments for mma.m16n8k16 with floating point type": which lane holds which element
//    of A (a0..a7), B (b0..b3) and C/D (c0..c3), for .f16/.bf16 inputs and .f32 accumulators;
//  - "Multiply-and-Accumulate Instruction: mma": D = A * B + C; its "Precision and rounding" leaves
//    the accumulation order and rounding unspecified, so products are compared exactly only for
//    small-integer inputs (every partial sum exact), and otherwise within an fp32 summation bound;
//  - "Warp-level matrix load instruction: ldmatrix": lanes 8j..8j+7 give the row addresses of
//    matrix j; a group of four lanes receives one row, two elements each ("Figure: ldmatrix
//    fragment layout for one 8x8 Matrix with 16-bit elements"); .trans gives the transpose;
//  - "Data Movement and Conversion Instructions: cp.async", "... cp.async.commit_group" and
//    "... cp.async.wait_group / cp.async.wait_all".
// The hand tables below are written from those formulas again (not from the header's helpers or
// the emulator's model, which they check), with three lanes also worked out by hand.
// What this cannot tell: the GPU's bits of a non-exact mma, or anything about timing.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
//
#include <gtest/gtest-spi.h>
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/tensor_core.cuh"
//
#include <array>
#include <cmath>
#include <random>
#include <sstream>

#include "kernels/cpu/float16.h"
#include "support/gpu_support.h"

namespace strata::cuda_kernels {
namespace {

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer does not follow the emulator's fiber stacks (ucontext) reliably.
TEST(EmulatedTensorCore, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

using testing::expect_bitwise_equal;

const simt::Launcher kEmulator;

constexpr bool same(TileIndex x, TileIndex y) {
  return x.row == y.row && x.col == y.col;
}

// Each lane's fragment positions for mma.m16n8k16 (16-bit A and B, fp32 C/D).
struct Fragments {
  TileIndex a[32][8];  // A (M x K)
  TileIndex b[32][4];  // B (K x N)
  TileIndex c[32][4];  // C and D (M x N)
};

// The PTX ISA's formulas ("Matrix Fragments for mma.m16n8k16 with floating point type"):
//   groupID = %laneid >> 2, threadID_in_group = %laneid % 4
//   A: row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise;
//      col = (threadID_in_group * 2) + (i & 0x1) for ai where i < 4, the same + 8 for i >= 4
//   B: row = (threadID_in_group * 2) + (i & 0x1) for bi where i < 2, the same + 8 for i >= 2;
//      col = groupID
//   C: row = groupID for ci where i < 2, groupID + 8 for i >= 2;
//      col = (threadID_in_group * 2) + (i & 0x1)
constexpr Fragments isa_fragments() {
  Fragments t{};
  for (int lane = 0; lane < 32; ++lane) {
    const int group_id = lane >> 2;
    const int thread_id_in_group = lane % 4;
    for (int i = 0; i < 8; ++i) {
      const int row = (i < 2 || (4 <= i && i < 6)) ? group_id : group_id + 8;
      const int col =
          i < 4 ? thread_id_in_group * 2 + (i & 0x1) : thread_id_in_group * 2 + (i & 0x1) + 8;
      t.a[lane][i] = {row, col};
    }
    for (int i = 0; i < 4; ++i) {
      const int k =
          i < 2 ? thread_id_in_group * 2 + (i & 0x1) : thread_id_in_group * 2 + (i & 0x1) + 8;
      t.b[lane][i] = {k, group_id};
      t.c[lane][i] = {i < 2 ? group_id : group_id + 8, thread_id_in_group * 2 + (i & 0x1)};
    }
  }
  return t;
}
constexpr Fragments kIsa = isa_fragments();

// Three lanes of A, B and C/D worked out by hand (the ISA's figures draw them as T0, T5, T31).
constexpr bool hand_lanes_agree() {
  constexpr std::array<std::array<TileIndex, 8>, 3> a = {{
      {{{0, 0}, {0, 1}, {8, 0}, {8, 1}, {0, 8}, {0, 9}, {8, 8}, {8, 9}}},
      {{{1, 2}, {1, 3}, {9, 2}, {9, 3}, {1, 10}, {1, 11}, {9, 10}, {9, 11}}},
      {{{7, 6}, {7, 7}, {15, 6}, {15, 7}, {7, 14}, {7, 15}, {15, 14}, {15, 15}}},
  }};
  constexpr std::array<std::array<TileIndex, 4>, 3> b = {{
      {{{0, 0}, {1, 0}, {8, 0}, {9, 0}}},
      {{{2, 1}, {3, 1}, {10, 1}, {11, 1}}},
      {{{6, 7}, {7, 7}, {14, 7}, {15, 7}}},
  }};
  constexpr std::array<std::array<TileIndex, 4>, 3> c = {{
      {{{0, 0}, {0, 1}, {8, 0}, {8, 1}}},
      {{{1, 2}, {1, 3}, {9, 2}, {9, 3}}},
      {{{7, 6}, {7, 7}, {15, 6}, {15, 7}}},
  }};
  constexpr int lanes[3] = {0, 5, 31};
  for (int n = 0; n < 3; ++n) {
    for (int i = 0; i < 8; ++i)
      if (!same(kIsa.a[lanes[n]][i], a[n][i])) return false;
    for (int i = 0; i < 4; ++i)
      if (!same(kIsa.b[lanes[n]][i], b[n][i]) || !same(kIsa.c[lanes[n]][i], c[n][i])) return false;
  }
  return true;
}
static_assert(hand_lanes_agree(), "the formula table disagrees with the lanes worked by hand");

// ---- 16-bit values and the CPU reference ------------------------------------------------------

std::uint16_t to_bits(float v, bool bf16) {
  return bf16 ? kernels::float_to_bf16(v) : kernels::float_to_fp16(v);
}
float from_bits(std::uint16_t h, bool bf16) {
  return bf16 ? kernels::bf16_to_float(h) : kernels::fp16_to_float(h);
}
std::vector<std::uint16_t> to_bits(const std::vector<float>& v, bool bf16) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = to_bits(v[i], bf16);
  return out;
}

// Seeded values: small integers in [-range, range], or reals in [-1, 1) rounded to the 16-bit type
// (so the CPU reference sees exactly the values the mma sees).
std::vector<float> values16(std::size_t n, std::uint64_t seed, bool bf16, int range) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  if (range > 0) {
    std::uniform_int_distribution<int> dist(-range, range);
    for (float& x : v)
      x = static_cast<float>(dist(rng));
  } else {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& x : v)
      x = from_bits(to_bits(dist(rng), bf16), bf16);
  }
  return v;
}

// D (m x n) = A (m x k, row-major) * B (k x n, row-major) + C, in double, and for each element the
// bound that any fp32 summation of its k + 1 terms meets: gamma_k * (|c| + sum |a b|), with
// gamma_k = k u / (1 - k u), u = 2^-24 (the products of 16-bit floats are exact in fp32).
struct Reference {
  std::vector<double> d, bound;
};
Reference reference_product(const std::vector<float>& a, const std::vector<float>& b,
                            const std::vector<float>& c, int m, int n, int k) {
  const double u = std::ldexp(1.0, -24);
  const double gamma = k * u / (1.0 - k * u);
  Reference r{std::vector<double>(static_cast<std::size_t>(m * n)),
              std::vector<double>(static_cast<std::size_t>(m * n))};
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = c.empty() ? 0.0 : c[static_cast<std::size_t>(i * n + j)];
      double magnitude = std::abs(sum);
      for (int p = 0; p < k; ++p) {
        const double product = static_cast<double>(a[static_cast<std::size_t>(i * k + p)]) *
                               b[static_cast<std::size_t>(p * n + j)];
        sum += product;
        magnitude += std::abs(product);
      }
      r.d[static_cast<std::size_t>(i * n + j)] = sum;
      r.bound[static_cast<std::size_t>(i * n + j)] = gamma * magnitude * (1.0 + 1e-9);
    }
  }
  return r;
}

// Element-wise |got - want| <= bound, failing on NaN; returns the largest error.
double expect_within(const std::string& what, const std::vector<float>& got, const Reference& r) {
  EXPECT_EQ(got.size(), r.d.size()) << what;
  int failures = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < std::min(got.size(), r.d.size()); ++i) {
    const double error = std::abs(static_cast<double>(got[i]) - r.d[i]);
    if (std::isnan(got[i]) || !(error <= r.bound[i])) {
      if (++failures <= 3) {
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << r.d[i]
                      << " (error " << error << ", bound " << r.bound[i] << ")";
      }
    } else {
      worst = std::max(worst, error);
    }
  }
  EXPECT_EQ(failures, 0) << what;
  return worst;
}

// ---- (a) fragment layouts -------------------------------------------------------------------

// One warp: each lane builds its A, B and C fragments from whole matrices with `table` (A 16x16,
// B 16x8 K x N, C 16x8, row-major, 16-bit A and B), runs one mma and writes its four D registers
// to d[lane * 4 + i].
__global__ void mma_probe_kernel(float* d, const std::uint16_t* a, const std::uint16_t* b,
                                 const float* c, const Fragments* table, bool bf16) {
  const int lane = static_cast<int>(threadIdx.x);
  const auto at_a = [&](int i) {
    const TileIndex e = table->a[lane][i];
    return a[e.row * 16 + e.col];
  };
  const auto at_b = [&](int i) {
    const TileIndex e = table->b[lane][i];
    return b[e.row * 8 + e.col];
  };
  MmaA fa;
  for (int r = 0; r < 4; ++r)
    fa.reg[r] = pack_16x2(at_a(2 * r), at_a(2 * r + 1));
  MmaB fb;
  for (int r = 0; r < 2; ++r)
    fb.reg[r] = pack_16x2(at_b(2 * r), at_b(2 * r + 1));
  MmaAcc fc;
  for (int i = 0; i < 4; ++i) {
    const TileIndex e = table->c[lane][i];
    fc.reg[i] = c[e.row * 8 + e.col];
  }
  MmaAcc fd;
  if (bf16) {
    mma_m16n8k16_bf16(fd, fa, fb, fc);
  } else {
    mma_m16n8k16_f16(fd, fa, fb, fc);
  }
  for (int i = 0; i < 4; ++i)
    d[lane * 4 + i] = fd.reg[i];
}

// What each lane's D registers hold after mma_probe_kernel with the fragments placed by `table`.
std::vector<float> run_mma_probe(const Fragments& table, const std::vector<float>& a,
                                 const std::vector<float>& b, const std::vector<float>& c,
                                 bool bf16) {
  const std::vector<std::uint16_t> a16 = to_bits(a, bf16), b16 = to_bits(b, bf16);
  std::vector<float> d(32 * 4, std::nanf(""));
  EXPECT_EQ(kEmulator(mma_probe_kernel, dim3(1), dim3(32), 0, d.data(), a16.data(), b16.data(),
                      c.data(), &table, bf16),
            0);
  return d;
}

// Each lane's D registers as the ISA places them, from D = A * B + C computed on the CPU.
std::vector<float> expected_d_registers(const std::vector<float>& a, const std::vector<float>& b,
                                        const std::vector<float>& c) {
  const Reference r = reference_product(a, b, c, 16, 8, 16);
  std::vector<float> d(32 * 4);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const TileIndex e = kIsa.c[lane][i];
      d[static_cast<std::size_t>(lane * 4 + i)] =
          static_cast<float>(r.d[static_cast<std::size_t>(e.row * 8 + e.col)]);
    }
  }
  return d;
}

// The first few registers (lane, i) where `got` and `want` differ, or "" when none does.
std::string register_mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  std::ostringstream out;
  int shown = 0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    if (!(got[j] == want[j]) && shown++ < 4) {
      out << "lane " << j / 4 << " d" << j % 4 << ": got " << got[j] << ", want " << want[j]
          << "; ";
    }
  }
  return out.str();
}

// Probe matrices whose D shows where each element went. Values encode positions and are small
// integers (exact in bf16 and fp16, so every accumulation order gives the same bits).
//  - A probe, half h: A(r, k) = 16 r + k + 1, B selects columns 8h..8h+7 of A (B(k, n) = 1 when
//    k = n + 8h), C = 0: D(r, n) = A(r, n + 8h).
//  - B probe: A = I (16 x 16), B(k, n) = 8 k + n + 1, C(r, n) = 1000 (r + 1): D = B + C.
struct Probe {
  std::vector<float> a, b, c;
};
std::vector<Probe> layout_probes() {
  std::vector<Probe> probes;
  for (int h = 0; h < 2; ++h) {
    Probe p{std::vector<float>(256), std::vector<float>(128, 0.0f), std::vector<float>(128, 0.0f)};
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 16; ++k)
        p.a[static_cast<std::size_t>(r * 16 + k)] = static_cast<float>(16 * r + k + 1);
    for (int n = 0; n < 8; ++n)
      p.b[static_cast<std::size_t>((n + 8 * h) * 8 + n)] = 1.0f;
    probes.push_back(p);
  }
  Probe p{std::vector<float>(256, 0.0f), std::vector<float>(128), std::vector<float>(128)};
  for (int r = 0; r < 16; ++r)
    p.a[static_cast<std::size_t>(r * 16 + r)] = 1.0f;
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      p.b[static_cast<std::size_t>(k * 8 + n)] = static_cast<float>(8 * k + n + 1);
      p.c[static_cast<std::size_t>(k * 8 + n)] = static_cast<float>(1000 * (k + 1));
    }
  probes.push_back(p);
  return probes;
}

// Runs every probe with fragments placed by `table`; "" when every lane's D registers are the
// ISA's, else the mismatches.
std::string layout_mismatches(const Fragments& table, bool bf16) {
  std::string all;
  for (const Probe& p : layout_probes()) {
    all += register_mismatches(run_mma_probe(table, p.a, p.b, p.c, bf16),
                               expected_d_registers(p.a, p.b, p.c));
  }
  return all;
}

TEST(EmulatedTensorCore, FragmentTablesCoverEachElementOnce) {
  int a_seen[16][16] = {}, b_seen[16][8] = {}, c_seen[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i)
      ++a_seen[kIsa.a[lane][i].row][kIsa.a[lane][i].col];
    for (int i = 0; i < 4; ++i) {
      ++b_seen[kIsa.b[lane][i].row][kIsa.b[lane][i].col];
      ++c_seen[kIsa.c[lane][i].row][kIsa.c[lane][i].col];
    }
  }
  for (int r = 0; r < 16; ++r) {
    for (int k = 0; k < 16; ++k)
      EXPECT_EQ(a_seen[r][k], 1) << "A(" << r << "," << k << ")";
    for (int n = 0; n < 8; ++n) {
      EXPECT_EQ(b_seen[r][n], 1) << "B(" << r << "," << n << ")";
      EXPECT_EQ(c_seen[r][n], 1) << "C(" << r << "," << n << ")";
    }
  }
}

TEST(EmulatedTensorCore, KernelHelpersAndEmulatorModelMatchTheIsaTables) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(same(mma_a_element(lane, i), kIsa.a[lane][i])) << "lane " << lane << " a" << i;
      const simt::Element e = simt::mma_a_element(lane, i);
      EXPECT_TRUE(same({e.row, e.col}, kIsa.a[lane][i])) << "emulator, lane " << lane << " a" << i;
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(same(mma_b_element(lane, i), kIsa.b[lane][i])) << "lane " << lane << " b" << i;
      EXPECT_TRUE(same(mma_c_element(lane, i), kIsa.c[lane][i])) << "lane " << lane << " c" << i;
      const simt::Element b = simt::mma_b_element(lane, i), c = simt::mma_c_element(lane, i);
      EXPECT_TRUE(same({b.row, b.col}, kIsa.b[lane][i])) << "emulator, lane " << lane << " b" << i;
      EXPECT_TRUE(same({c.row, c.col}, kIsa.c[lane][i])) << "emulator, lane " << lane << " c" << i;
    }
  }
}

// Each lane's D registers after mmas on position-encoding probes, with fragments placed by the
// ISA table: the emulated instruction reads A, B, C and writes D where the ISA says.
TEST(EmulatedTensorCore, MmaReadsAndWritesFragmentsWhereTheIsaSays) {
  for (bool bf16 : {true, false}) {
    EXPECT_EQ(layout_mismatches(kIsa, bf16), "") << (bf16 ? "bf16" : "fp16");
  }
}

// (f) The check above is not vacuous: a table with one wrong lane mapping fails it.
TEST(EmulatedTensorCore, AWrongLaneMappingFailsTheLayoutCheck) {
  Fragments swapped_a = kIsa;  // a2, a3 <-> a4, a5 in every lane
  Fragments swapped_b = kIsa;  // b0, b1 <-> b2, b3
  Fragments swapped_c = kIsa;  // c0, c1 <-> c2, c3
  for (int lane = 0; lane < 32; ++lane) {
    std::swap(swapped_a.a[lane][2], swapped_a.a[lane][4]);
    std::swap(swapped_a.a[lane][3], swapped_a.a[lane][5]);
    std::swap(swapped_b.b[lane][0], swapped_b.b[lane][2]);
    std::swap(swapped_b.b[lane][1], swapped_b.b[lane][3]);
    std::swap(swapped_c.c[lane][0], swapped_c.c[lane][2]);
    std::swap(swapped_c.c[lane][1], swapped_c.c[lane][3]);
  }
  EXPECT_NE(layout_mismatches(swapped_a, true), "") << "a2,a3 <-> a4,a5 went unnoticed";
  EXPECT_NE(layout_mismatches(swapped_b, true), "") << "b0,b1 <-> b2,b3 went unnoticed";
  EXPECT_NE(layout_mismatches(swapped_c, true), "") << "c0,c1 <-> c2,c3 went unnoticed";
}

// ---- (b) a product against the CPU ------------------------------------------------------------

// One warp: D (16x8) = A (16x16) * B (16x8, K x N) + C, all row-major, fragments loaded and
// stored with the header's helpers.
__global__ void mma_tile_kernel(float* d, const std::uint16_t* a, const std::uint16_t* b,
                                const float* c, bool bf16) {
  const int lane = static_cast<int>(threadIdx.x);
  MmaA fa;
  MmaB fb;
  MmaAcc acc;
  for (int r = 0; r < 4; ++r) {
    const TileIndex lo = mma_a_element(lane, 2 * r), hi = mma_a_element(lane, 2 * r + 1);
    fa.reg[r] = pack_16x2(a[lo.row * 16 + lo.col], a[hi.row * 16 + hi.col]);
  }
  for (int r = 0; r < 2; ++r) {
    const TileIndex lo = mma_b_element(lane, 2 * r), hi = mma_b_element(lane, 2 * r + 1);
    fb.reg[r] = pack_16x2(b[lo.row * 8 + lo.col], b[hi.row * 8 + hi.col]);
  }
  for (int i = 0; i < 4; ++i) {
    const TileIndex e = mma_c_element(lane, i);
    acc.reg[i] = c[e.row * 8 + e.col];
  }
  if (bf16) {
    mma_m16n8k16_bf16(acc, fa, fb, acc);
  } else {
    mma_m16n8k16_f16(acc, fa, fb, acc);
  }
  for (int i = 0; i < 4; ++i) {
    const TileIndex e = mma_c_element(lane, i);
    d[e.row * 8 + e.col] = acc.reg[i];
  }
}

TEST(EmulatedTensorCore, MmaProductMatchesTheCpu) {
  for (bool bf16 : {true, false}) {
    const char* type = bf16 ? "bf16" : "fp16";
    // Small integers: every partial sum is exact, so any accumulation order gives these bits.
    std::vector<float> a = values16(256, 1, bf16, 8), b = values16(128, 2, bf16, 8);
    std::vector<float> c = values16(128, 3, bf16, 64);
    std::vector<float> d(128, std::nanf(""));
    ASSERT_EQ(kEmulator(mma_tile_kernel, dim3(1), dim3(32), 0, d.data(), to_bits(a, bf16).data(),
                        to_bits(b, bf16).data(), c.data(), bf16),
              0);
    const Reference exact = reference_product(a, b, c, 16, 8, 16);
    std::vector<float> want(128);
    for (std::size_t i = 0; i < want.size(); ++i)
      want[i] = static_cast<float>(exact.d[i]);
    expect_bitwise_equal(std::string("integers, ") + type, d, want);

    // Reals in [-1, 1): within the fp32 summation bound of the 17 terms.
    a = values16(256, 4, bf16, 0);
    b = values16(128, 5, bf16, 0);
    c = testing::random_floats(128, 6);
    ASSERT_EQ(kEmulator(mma_tile_kernel, dim3(1), dim3(32), 0, d.data(), to_bits(a, bf16).data(),
                        to_bits(b, bf16).data(), c.data(), bf16),
              0);
    expect_within(std::string("reals, ") + type, d, reference_product(a, b, c, 16, 8, 16));
  }
}

// ---- (c) ldmatrix ------------------------------------------------------------------------------

constexpr int kSlotElements = 24;  // a row slot in shared memory: 48 bytes, 16-byte aligned

// Element (row, col) of matrix j in the ldmatrix test tile: encodes its position.
constexpr std::uint16_t tile_code(int j, int row, int col) {
  return static_cast<std::uint16_t>(j * 64 + row * 8 + col + 1);
}

// The word lane `lane` receives for matrix j, from the ISA's text: a group of four lanes loads one
// row, lane 0 the first two elements ("row lane / 4, elements 2 (lane % 4) and + 1"); with .trans
// the matrix is read column-major (column lane / 4, rows 2 (lane % 4) and + 1).
constexpr std::uint32_t isa_ldmatrix_word(int lane, int j, bool trans) {
  const int g = lane / 4, t = lane % 4;
  return trans ? pack_16x2(tile_code(j, 2 * t, g), tile_code(j, 2 * t + 1, g))
               : pack_16x2(tile_code(j, g, 2 * t), tile_code(j, g, 2 * t + 1));
}
// Spelled out: lane 13 is in row group 3, pair 1.
static_assert(isa_ldmatrix_word(13, 2, false) == pack_16x2(155, 156));  // row 3, cols 2, 3
static_assert(isa_ldmatrix_word(13, 2, true) == pack_16x2(148, 156));   // col 3, rows 2, 3
static_assert(isa_ldmatrix_word(0, 0, false) == pack_16x2(1, 2));

// One warp: lane 8j + r copies row r of matrix j (tile: 4 matrices x 8 rows x 8) into row slot
// (5 lane) % 32 of shared memory, so rows are neither contiguous nor in order; lanes below
// 8 kCount give ldmatrix their row's address, the others nullptr (which the instruction ignores).
template <int kCount, bool kTrans>
__global__ void ldmatrix_kernel(std::uint32_t* out, const std::uint16_t* tile) {
  STRATA_DYNAMIC_SHARED(std::uint16_t, smem);
  const int lane = static_cast<int>(threadIdx.x);
  std::uint16_t* slot = smem + (lane * 5 % 32) * kSlotElements;
  for (int c = 0; c < 8; ++c)
    slot[c] = tile[lane * 8 + c];
  __syncthreads();
  std::uint32_t r[kCount];
  const void* row = lane < 8 * kCount ? slot : nullptr;
  if constexpr (kTrans) {
    ldmatrix_trans<kCount>(r, row);
  } else {
    ldmatrix<kCount>(r, row);
  }
  for (int j = 0; j < kCount; ++j)
    out[lane * 4 + j] = r[j];
}

template <int kCount, bool kTrans>
std::vector<std::uint32_t> run_ldmatrix(const std::vector<std::uint16_t>& tile) {
  std::vector<std::uint32_t> out(32 * 4, 0);
  EXPECT_EQ(kEmulator(ldmatrix_kernel<kCount, kTrans>, dim3(1), dim3(32),
                      32 * kSlotElements * sizeof(std::uint16_t), out.data(), tile.data()),
            0);
  return out;
}

using LdmatrixShape = std::tuple<int, bool>;  // matrices, .trans
class EmulatedLdmatrix : public ::testing::TestWithParam<LdmatrixShape> {};

TEST_P(EmulatedLdmatrix, EachLaneGetsTheIsasElements) {
  const auto [count, trans] = GetParam();
  std::vector<std::uint16_t> tile(4 * 64);
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c)
        tile[static_cast<std::size_t>(j * 64 + r * 8 + c)] = tile_code(j, r, c);
  std::vector<std::uint32_t> got;
  if (count == 1) got = trans ? run_ldmatrix<1, true>(tile) : run_ldmatrix<1, false>(tile);
  if (count == 2) got = trans ? run_ldmatrix<2, true>(tile) : run_ldmatrix<2, false>(tile);
  if (count == 4) got = trans ? run_ldmatrix<4, true>(tile) : run_ldmatrix<4, false>(tile);
  std::vector<std::uint32_t> want(32 * 4, 0);
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < count; ++j)
      want[static_cast<std::size_t>(lane * 4 + j)] = isa_ldmatrix_word(lane, j, trans);
  expect_bitwise_equal("ldmatrix words", got, want);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmulatedLdmatrix,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return "x" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "Trans" : "");
                         });

// The header's ldmatrix.x4 row helpers, composed with the ISA's ldmatrix layout, give exactly the
// mma fragments. Register j, half h of lane l holds element 2 (l % 4) + h of the row that lane
// 8j + l / 4 points at; with .trans, element l / 4 of the row that lane 8j + 2 (l % 4) + h does.
TEST(EmulatedTensorCore, LdmatrixRowHelpersFeedTheMmaFragments) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < 4; ++j) {
      for (int h = 0; h < 2; ++h) {
        const TileIndex a_row = ldmatrix_x4_a_row(8 * j + lane / 4);
        EXPECT_TRUE(same({a_row.row, a_row.col + 2 * (lane % 4) + h}, kIsa.a[lane][2 * j + h]))
            << "A: lane " << lane << " register " << j;
        // B from its transpose (N x K): stored (n, k) is B(k, n); registers 2, 3 are columns 8-15.
        const TileIndex bt_row = ldmatrix_x4_b_row(8 * j + lane / 4);
        const TileIndex b_want = kIsa.b[lane][2 * (j % 2) + h];
        EXPECT_TRUE(same({bt_row.col + 2 * (lane % 4) + h, bt_row.row},
                         {b_want.row, b_want.col + 8 * (j / 2)}))
            << "B from N x K: lane " << lane << " register " << j;
        // B stored K x N, loaded with .trans.
        const TileIndex b_row = ldmatrix_x4_trans_b_row(8 * j + 2 * (lane % 4) + h);
        EXPECT_TRUE(same({b_row.row, b_row.col + lane / 4}, {b_want.row, b_want.col + 8 * (j / 2)}))
            << "B from K x N: lane " << lane << " register " << j;
      }
    }
  }
}

// .sync.aligned: a warp whose lanes reach different warp-level instructions fails the test.
std::uint32_t divergent_out[32];
__global__ void divergent_kernel(std::uint32_t* out) {
  STRATA_DYNAMIC_SHARED(std::uint16_t, smem);
  const int lane = static_cast<int>(threadIdx.x);
  smem[lane] = 0;
  __syncthreads();
  std::uint32_t r[1];
  if (lane < 16) {
    ldmatrix<1>(r, smem);
  } else {
    ldmatrix_trans<1>(r, smem);
  }
  out[lane] = r[0];
}

TEST(EmulatedTensorCore, LanesAtDifferentInstructionsFail) {
  EXPECT_NONFATAL_FAILURE(kEmulator(divergent_kernel, dim3(1), dim3(32), 64, divergent_out),
                          "reach different warp-level instructions");
}

// ---- (d) an mma tile product fed by ldmatrix --------------------------------------------------

constexpr int kPad = 40;  // shared row stride in elements (80 bytes): rows are not contiguous

// One warp: D (16 x 16) = A (16 x 32) * B (32 x 16), as a GEMM or attention kernel computes a
// tile: A row-major, B given as its transpose (N x K, as K in attention; plain ldmatrix) or as is
// (K x N, as V; ldmatrix .trans); both copied to shared memory with cp.async in 16-byte pieces;
// two k-steps of 16, two mma (columns 0-7 and 8-15) per step. D is row-major.
template <bool kBf16, bool kBTransposed>
__global__ void tile_product_kernel(float* d, const std::uint16_t* a, const std::uint16_t* b) {
  STRATA_DYNAMIC_SHARED(std::uint16_t, smem);
  std::uint16_t* sa = smem;              // 16 rows (m) of 32 (k)
  std::uint16_t* sb = smem + 16 * kPad;  // 16 rows (n) of 32 (k), or 32 rows (k) of 16 (n)
  const int lane = static_cast<int>(threadIdx.x);
  for (int piece = lane; piece < 64; piece += 32) {
    cp_async_cg(sa + (piece / 4) * kPad + (piece % 4) * 8, a + piece * 8);
    if constexpr (kBTransposed) {
      cp_async_cg(sb + (piece / 4) * kPad + (piece % 4) * 8, b + piece * 8);
    } else {
      cp_async_ca<16>(sb + (piece / 2) * kPad + (piece % 2) * 8, b + piece * 8);
    }
  }
  cp_async_commit_group();
  cp_async_wait_group<0>();
  __syncthreads();
  MmaAcc acc[2] = {};
  for (int ks = 0; ks < 2; ++ks) {
    MmaA fa;
    const TileIndex ra = ldmatrix_x4_a_row(lane);
    ldmatrix<4>(fa.reg, sa + ra.row * kPad + ks * 16 + ra.col);
    std::uint32_t r[4];
    if constexpr (kBTransposed) {
      const TileIndex rb = ldmatrix_x4_b_row(lane);
      ldmatrix<4>(r, sb + rb.row * kPad + ks * 16 + rb.col);
    } else {
      const TileIndex rb = ldmatrix_x4_trans_b_row(lane);
      ldmatrix_trans<4>(r, sb + (ks * 16 + rb.row) * kPad + rb.col);
    }
    const MmaB b_lo{{r[0], r[1]}}, b_hi{{r[2], r[3]}};
    if constexpr (kBf16) {
      mma_m16n8k16_bf16(acc[0], fa, b_lo, acc[0]);
      mma_m16n8k16_bf16(acc[1], fa, b_hi, acc[1]);
    } else {
      mma_m16n8k16_f16(acc[0], fa, b_lo, acc[0]);
      mma_m16n8k16_f16(acc[1], fa, b_hi, acc[1]);
    }
  }
  for (int n = 0; n < 2; ++n) {
    for (int i = 0; i < 4; ++i) {
      const TileIndex e = mma_c_element(lane, i);
      d[e.row * 16 + n * 8 + e.col] = acc[n].reg[i];
    }
  }
}

template <bool kBf16, bool kBTransposed>
std::vector<float> run_tile_product(const std::vector<float>& a, const std::vector<float>& b) {
  const std::vector<std::uint16_t> a16 = to_bits(a, kBf16);
  std::vector<std::uint16_t> b16(b.size());  // B (32 x 16) row-major, or its transpose
  for (int k = 0; k < 32; ++k)
    for (int n = 0; n < 16; ++n)
      b16[static_cast<std::size_t>(kBTransposed ? n * 32 + k : k * 16 + n)] =
          to_bits(b[static_cast<std::size_t>(k * 16 + n)], kBf16);
  std::vector<float> d(256, std::nanf(""));
  EXPECT_EQ(kEmulator(tile_product_kernel<kBf16, kBTransposed>, dim3(1), dim3(32),
                      (16 + 32) * kPad * sizeof(std::uint16_t), d.data(), a16.data(), b16.data()),
            0);
  return d;
}

TEST(EmulatedTensorCore, LdmatrixFedTileProductMatchesTheCpu) {
  for (bool bf16 : {true, false}) {
    for (bool transposed : {true, false}) {
      for (int range : {4, 0}) {  // small integers (exact), then reals (bound)
        const std::string what = std::string(bf16 ? "bf16" : "fp16") +
                                 (transposed ? ", B as N x K" : ", B as K x N") +
                                 (range > 0 ? ", integers" : ", reals");
        const std::vector<float> a = values16(16 * 32, 7, bf16, range);
        const std::vector<float> b = values16(32 * 16, 8, bf16, range);
        std::vector<float> d;
        if (bf16) {
          d = transposed ? run_tile_product<true, true>(a, b) : run_tile_product<true, false>(a, b);
        } else {
          d = transposed ? run_tile_product<false, true>(a, b)
                         : run_tile_product<false, false>(a, b);
        }
        const Reference r = reference_product(a, b, {}, 16, 16, 32);
        if (range > 0) {
          std::vector<float> want(r.d.begin(), r.d.end());
          expect_bitwise_equal(what, d, want);
        } else {
          expect_within(what, d, r);
        }
      }
    }
  }
}

// ---- (e) cp.async ------------------------------------------------------------------------------

constexpr int kCopyThreads = 64;
constexpr int kSlotBytes = 64;  // per thread: [0,16) ca 16 | [16,32) cg | [32,48) zfill |
                                //             [48,56) ca 8 | [56,60) ca 4 | [60,64) a plain store

// Two warps. Group 1: ca 16, ca 8, ca 4; group 2: cg 16; then a zero-filling cg of t % 17 bytes
// left uncommitted, which wait_all commits. After wait_group 1 a thread reads back its own group-1
// bytes (`early`); after wait_all and a barrier, thread t reads thread (t + 1)'s whole slot.
__global__ void cp_async_kernel(unsigned char* early, unsigned char* late,
                                const unsigned char* src) {
  STRATA_DYNAMIC_SHARED(unsigned char, smem);
  const int t = static_cast<int>(threadIdx.x);
  unsigned char* mine = smem + t * kSlotBytes;
  const unsigned char* from = src + t * kSlotBytes;
  cp_async_ca<16>(mine, from);
  cp_async_ca<8>(mine + 48, from + 48);
  cp_async_ca<4>(mine + 56, from + 56);
  cp_async_commit_group();
  cp_async_cg(mine + 16, from + 16);
  cp_async_commit_group();
  cp_async_cg_zfill(mine + 32, from + 32, t % 17);
  const std::uint32_t stamp = 0xabc00000u + static_cast<std::uint32_t>(t);
  std::memcpy(mine + 60, &stamp, sizeof(stamp));
  cp_async_wait_group<1>();
  for (int i = 0; i < 16; ++i)
    early[t * 28 + i] = mine[i];
  for (int i = 0; i < 12; ++i)
    early[t * 28 + 16 + i] = mine[48 + i];
  cp_async_wait_all();
  __syncthreads();
  const unsigned char* next = smem + ((t + 1) % kCopyThreads) * kSlotBytes;
  for (int i = 0; i < kSlotBytes; ++i)
    late[t * kSlotBytes + i] = next[i];
}

TEST(EmulatedTensorCore, CpAsyncCopiesLandByTheirWait) {
  std::vector<unsigned char> src(kCopyThreads * kSlotBytes);
  std::mt19937_64 rng(9);
  for (unsigned char& byte : src)
    byte = static_cast<unsigned char>(rng());
  std::vector<unsigned char> early(kCopyThreads * 28, 0), late(src.size(), 0);
  ASSERT_EQ(kEmulator(cp_async_kernel, dim3(1), dim3(kCopyThreads), kCopyThreads * kSlotBytes,
                      early.data(), late.data(), src.data()),
            0);
  std::vector<unsigned char> early_want(early.size()), late_want(late.size());
  for (int t = 0; t < kCopyThreads; ++t) {
    const unsigned char* s = src.data() + t * kSlotBytes;
    std::memcpy(&early_want[static_cast<std::size_t>(t * 28)], s, 16);
    std::memcpy(&early_want[static_cast<std::size_t>(t * 28 + 16)], s + 48, 12);
    const int u = (t + kCopyThreads - 1) % kCopyThreads;  // whose slot thread u read: t's
    unsigned char* w = &late_want[static_cast<std::size_t>(u * kSlotBytes)];
    std::memcpy(w, s, 60);
    for (int i = 0; i < 16; ++i)
      w[32 + i] = i < t % 17 ? s[32 + i] : 0;
    const std::uint32_t stamp = 0xabc00000u + static_cast<std::uint32_t>(t);
    std::memcpy(w + 60, &stamp, sizeof(stamp));
  }
  expect_bitwise_equal("own group-1 bytes after wait_group 1", early, early_want);
  expect_bitwise_equal("a neighbour's slot after wait_all and a barrier", late, late_want);
}

// A kernel bug the emulator makes visible: reading a cp.async destination before the wait that
// covers it (on a GPU those bytes are unspecified until then; here they are 0xff). With one group
// outstanding, wait_group 3 and wait_group 1 allow it to stay pending (a count above the groups
// outstanding is fine); wait_group 0 completes it.
__global__ void early_read_kernel(unsigned char* seen, const unsigned char* src) {
  STRATA_DYNAMIC_SHARED(unsigned char, smem);
  const int t = static_cast<int>(threadIdx.x);
  smem[t * 16] = 0;  // a value the copy replaces: what an early read must not see either
  cp_async_cg(smem + t * 16, src + t * 16);
  cp_async_commit_group();
  const auto snapshot = [&](int n) {
    for (int i = 0; i < 16; ++i)
      seen[t * 64 + n * 16 + i] = smem[t * 16 + i];
  };
  snapshot(0);
  cp_async_wait_group<3>();
  snapshot(1);
  cp_async_wait_group<1>();
  snapshot(2);
  cp_async_wait_group<0>();
  snapshot(3);
}

TEST(EmulatedTensorCore, CpAsyncReadBeforeItsWaitIsVisible) {
  std::vector<unsigned char> src(32 * 16);
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<unsigned char>(i * 7 + 1);
  std::vector<unsigned char> seen(32 * 64, 0);
  ASSERT_EQ(kEmulator(early_read_kernel, dim3(1), dim3(32), 32 * 16, seen.data(), src.data()), 0);
  std::vector<unsigned char> want(seen.size(), 0xff);  // before any wait, after 3, after 1
  for (int t = 0; t < 32; ++t)
    for (int i = 0; i < 16; ++i)
      want[static_cast<std::size_t>(t * 64 + 48 + i)] = src[static_cast<std::size_t>(t * 16 + i)];
  expect_bitwise_equal("bytes seen before and after the waits", seen, want);
}

#endif  // __SANITIZE_ADDRESS__

}  // namespace
}  // namespace strata::cuda_kernels

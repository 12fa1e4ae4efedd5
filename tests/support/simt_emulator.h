// A small SIMT emulator that runs the CUDA kernels' own source (kernels/cuda/*_kernels.cuh) on the
// CPU, so their indexing, masking, tiling, reductions and shuffles are tested on machines without
// a GPU. Include this header FIRST in a test file, then the kernel headers.
//
// Each block runs as one fiber per CUDA thread on the calling thread (switched by a few
// instructions on x86-64, by ucontext elsewhere). A fiber runs until
// it reaches __syncthreads or a warp-level operation (shuffle, ballot), where it waits; a block
// barrier opens when every live thread of the block waits at one, a warp barrier when all 32
// lanes of the warp wait at one. Anything else (a barrier some threads never reach, a shuffle with
// lanes missing) is reported as a deadlock and fails the test. Fibers run in alternating forward
// and reverse order between barriers, and dynamic shared memory starts each block filled with
// 0xff bytes (NaN), so a missing barrier or a read of unwritten shared memory shows up in results.
//
// What it cannot tell: a fiber is never interrupted between two waits, so a read that races with
// another thread's later write (a barrier missing AFTER a read) goes unnoticed; nothing about real
// hardware (memory model, occupancy, register limits, speed) or about cuBLASLt. Blocks run one at
// a time, so code that relied on blocks running concurrently (none here does) would deadlock.
//
// Tensor-core instructions (mma.sync m16n8k16, ldmatrix, cp.async; kernels/cuda/tensor_core.cuh
// calls them) are modelled at the end of this file, after the PTX ISA; see the comment there.
#pragma once

#define STRATA_SIMT_EMULATION 1

#include <gtest/gtest.h>
#include <math.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#else
#include <ucontext.h>
#endif

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/float16.h"

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace simt {

inline constexpr std::size_t kStackBytes = 128 * 1024;
inline constexpr int kThreadsMax = 1024;

// A cp.async issued by a thread and not yet complete: its source bytes (read at issue) and the
// group it was committed to (0 while uncommitted; a thread's groups count from 1).
struct PendingCopy {
  unsigned char* dst = nullptr;
  unsigned char bytes[16] = {};
  int size = 0;
  int group = 0;
};

// A fiber's saved execution context, and the switch from one to another.
#if defined(__x86_64__)
// On x86-64 a switch saves and restores only what the System V ABI makes callee-saved (rbx, rbp,
// r12-r15, the stack pointer, MXCSR and the x87 control word): ucontext's swapcontext also saves
// and restores the signal mask, a system call each way, which made it most of an emulated kernel's
// time. A context is the stack pointer of a stopped fiber, its registers pushed below it.
struct Context {
  void* sp = nullptr;
};

// Saves the caller's context in *from and resumes `to`.
[[gnu::naked, gnu::noinline]] inline void switch_stack(void** /*from: rdi*/, void* /*to: rsi*/) {
  asm("pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $8, %rsp\n\t"
      "stmxcsr (%rsp)\n\t"
      "fnstcw 4(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "ldmxcsr (%rsp)\n\t"
      "fldcw 4(%rsp)\n\t"
      "addq $8, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}

inline void switch_context(Context* from, const Context& to) {
  switch_stack(&from->sp, to.sp);
}

// A context that starts `start` (which must never return) on the stack [stack, stack + bytes): the
// frame switch_stack pops, with `start` as its return address and the stack aligned as at a call.
inline Context make_context(char* stack, std::size_t bytes, void (*start)()) {
  const std::uintptr_t top =
      (reinterpret_cast<std::uintptr_t>(stack) + bytes) & ~std::uintptr_t{15};
  auto* frame = reinterpret_cast<std::uint64_t*>(top - 72);
  std::uint16_t control = 0;
  asm volatile("fnstcw %0" : "=m"(control));
  frame[0] = _mm_getcsr() | (std::uint64_t{control} << 32);
  for (int r = 1; r <= 6; ++r)
    frame[r] = 0;
  frame[7] = reinterpret_cast<std::uint64_t>(start);
  frame[8] = 0;  // start's return address: it never returns
  return Context{frame};
}
#else
struct Context {
  ucontext_t context{};
};

inline void switch_context(Context* from, const Context& to) {
  swapcontext(&from->context, &to.context);
}

inline Context make_context(char* stack, std::size_t bytes, void (*start)()) {
  Context c;
  getcontext(&c.context);
  c.context.uc_stack.ss_sp = stack;
  c.context.uc_stack.ss_size = bytes;
  c.context.uc_link = nullptr;  // start never returns
  makecontext(&c.context, start, 0);
  return c;
}
#endif

struct Fiber {
  enum class State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };
  Context context;
  uint3 index;
  int warp = 0;
  int lane = 0;
  State state = State::kRunnable;
  int vote = 0;
  std::vector<PendingCopy> copies;  // cp.async in flight, in issue order
  int groups_committed = 0;         // cp.async.commit_group calls so far
};

// The operands of one warp-collective tensor-core instruction (mma, ldmatrix), per lane, and the
// results the first lane to resume computes for all 32.
struct WarpOp {
  int kind[32] = {};  // which instruction each lane executes (0: none), for the .aligned check
  std::uint32_t in[32][10] = {};
  const void* address[32] = {};
  std::uint32_t out[32][4] = {};
  bool done = false;
};

struct Machine {
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  Context scheduler;
  int current = -1;
  uint3 block_index, block_dim, grid_dim;
  std::vector<std::max_align_t> shared;
  std::uint64_t slots[kThreadsMax / 32][32] = {};
  int block_vote = 0;
  WarpOp warp_ops[kThreadsMax / 32];
  std::function<void()> body;
  std::string error;
};

inline Machine& machine() {
  static Machine m;
  return m;
}

inline Fiber& fiber() {
  Machine& m = machine();
  return m.fibers[static_cast<std::size_t>(m.current)];
}

template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(machine().shared.data());
}

inline void wait_at(Fiber::State state) {
  Machine& m = machine();
  Fiber& f = fiber();
  f.state = state;
  switch_context(&f.context, m.scheduler);
}

inline void complete_copies(Fiber& f, int through_group);

// A fiber's whole life: the kernel's body, then back to the scheduler for good.
[[noreturn]] inline void entry() {
  machine().body();
  complete_copies(fiber(), -1);  // copies a thread never waited for still land
  fiber().state = Fiber::State::kDone;
  switch_context(&fiber().context, machine().scheduler);
  std::abort();  // a finished fiber is never resumed
}

// A warp-level exchange: every lane deposits `v`, all wait, each reads lane `source`'s value, all
// wait again (so a later exchange cannot overwrite a slot before everyone has read it).
template <typename T>
T exchange(T v, int source) {
  static_assert(sizeof(T) <= 8);
  Machine& m = machine();
  const int warp = fiber().warp;
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  m.slots[warp][fiber().lane] = bits;
  wait_at(Fiber::State::kWarpBarrier);
  T result;
  const std::uint64_t got = m.slots[warp][source & 31];
  std::memcpy(&result, &got, sizeof(T));
  wait_at(Fiber::State::kWarpBarrier);
  return result;
}

// Runs the current block to completion; false (and machine().error) on a deadlock.
inline bool run_block() {
  Machine& m = machine();
  const int threads = static_cast<int>(m.block_dim.x * m.block_dim.y * m.block_dim.z);
  if (threads > kThreadsMax) {
    m.error = "block of " + std::to_string(threads) + " threads";
    return false;
  }
  m.fibers.assign(static_cast<std::size_t>(threads), Fiber{});
  while (m.stacks.size() < static_cast<std::size_t>(threads))
    m.stacks.push_back(std::make_unique<char[]>(kStackBytes));
  std::memset(m.shared.data(), 0xff, m.shared.size() * sizeof(std::max_align_t));
  for (int t = 0; t < threads; ++t) {
    Fiber& f = m.fibers[static_cast<std::size_t>(t)];
    f.index.x = static_cast<unsigned>(t) % m.block_dim.x;
    f.index.y = (static_cast<unsigned>(t) / m.block_dim.x) % m.block_dim.y;
    f.index.z = static_cast<unsigned>(t) / (m.block_dim.x * m.block_dim.y);
    f.warp = t / 32;
    f.lane = t % 32;
    f.context = make_context(m.stacks[static_cast<std::size_t>(t)].get(), kStackBytes, entry);
  }
  using State = Fiber::State;
  for (int pass = 0;; ++pass) {
    for (int i = 0; i < threads; ++i) {
      const int t = pass % 2 == 0 ? i : threads - 1 - i;
      if (m.fibers[static_cast<std::size_t>(t)].state != State::kRunnable) continue;
      m.current = t;
      switch_context(&m.scheduler, m.fibers[static_cast<std::size_t>(t)].context);
    }
    int live = 0;
    int at_block = 0;
    int vote = 0;
    for (const Fiber& f : m.fibers) {
      if (f.state == State::kDone) continue;
      ++live;
      if (f.state == State::kBlockBarrier) {
        ++at_block;
        vote |= f.vote;
      }
    }
    if (live == 0) return true;
    bool released = false;
    if (at_block == live) {
      m.block_vote = vote;
      for (Fiber& f : m.fibers) {
        if (f.state == State::kBlockBarrier) f.state = State::kRunnable;
      }
      released = true;
    }
    for (int w = 0; w * 32 < threads; ++w) {
      int warp_live = 0;
      int waiting = 0;
      for (int l = 0; l < 32 && w * 32 + l < threads; ++l) {
        const Fiber& f = m.fibers[static_cast<std::size_t>(w * 32 + l)];
        if (f.state == State::kDone) continue;
        ++warp_live;
        if (f.state == State::kWarpBarrier) ++waiting;
      }
      if (warp_live == 0 || waiting != warp_live) continue;
      if (warp_live != 32) {
        m.error = "a full-warp operation in warp " + std::to_string(w) + " with only " +
                  std::to_string(warp_live) + " live lanes";
        return false;
      }
      for (int l = 0; l < 32; ++l) {
        Fiber& f = m.fibers[static_cast<std::size_t>(w * 32 + l)];
        f.state = State::kRunnable;
      }
      released = true;
    }
    if (!released) {
      m.error = "deadlock: " + std::to_string(at_block) + " of " + std::to_string(live) +
                " live threads wait at __syncthreads, the rest at warp operations";
      return false;
    }
  }
}

// Runs kernel(args...) over the grid, one block at a time; 0 on success, 1 (and a test failure
// naming the block) on a deadlock. Same call shape as CudaLauncher (kernels/cuda/device_math.cuh).
struct Launcher {
  template <typename Kernel, typename... Args>
  int operator()(Kernel kernel, dim3 grid, dim3 block, std::size_t smem, Args... args) const {
    Machine& m = machine();
    m.shared.assign(smem / sizeof(std::max_align_t) + 1, std::max_align_t{});
    m.grid_dim = {grid.x, grid.y, grid.z};
    m.block_dim = {block.x, block.y, block.z};
    m.body = [&] { kernel(args...); };
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          m.block_index = {x, y, z};
          if (!run_block()) {
            ADD_FAILURE() << "SIMT emulator, block (" << x << "," << y << "," << z
                          << "): " << m.error;
            return 1;
          }
        }
      }
    }
    return 0;
  }
};

}  // namespace simt

// ---- CUDA's built-ins, as the kernels use them
// ------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define STRATA_DYNAMIC_SHARED(type, name) type* name = ::simt::dynamic_shared<type>()
#define threadIdx (::simt::fiber().index)
#define blockIdx (::simt::machine().block_index)
#define blockDim (::simt::machine().block_dim)
#define gridDim (::simt::machine().grid_dim)

inline void __syncthreads() {
  simt::wait_at(simt::Fiber::State::kBlockBarrier);
}

inline int __syncthreads_or(int predicate) {
  simt::fiber().vote = predicate != 0;
  simt::wait_at(simt::Fiber::State::kBlockBarrier);
  return simt::machine().block_vote;
}

template <typename T>
T __shfl_sync(unsigned mask, T v, int source) {
  EXPECT_EQ(mask, 0xffffffffu) << "the kernels only use full-warp shuffles";
  return simt::exchange(v, source);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  EXPECT_EQ(mask, 0xffffffffu) << "the kernels only use full-warp shuffles";
  return simt::exchange(v, simt::fiber().lane ^ lane_mask);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  EXPECT_EQ(mask, 0xffffffffu) << "the kernels only use full-warp ballots";
  simt::Machine& m = simt::machine();
  const int warp = simt::fiber().warp;
  m.slots[warp][simt::fiber().lane] = predicate != 0 ? 1 : 0;
  simt::wait_at(simt::Fiber::State::kWarpBarrier);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l)
    bits |= static_cast<unsigned>(m.slots[warp][l] & 1u) << l;
  simt::wait_at(simt::Fiber::State::kWarpBarrier);
  return bits;
}

inline int __popc(unsigned x) {
  return std::popcount(x);
}
inline int __clz(int x) {
  return std::countl_zero(static_cast<unsigned>(x));
}
inline float __uint_as_float(unsigned x) {
  return std::bit_cast<float>(x);
}
inline unsigned __float_as_uint(float x) {
  return std::bit_cast<unsigned>(x);
}
// Each rounds once, as the CUDA intrinsics do (volatile keeps GCC from contracting).
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fdiv_rn(float a, float b) {
  volatile float r = a / b;
  return r;
}
inline float __fsqrt_rn(float x) {
  return std::sqrt(x);
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}

// ---- Tensor-core instructions ---------------------------------------------------------------
// The warp-level instructions that kernels/cuda/tensor_core.cuh wraps, modelled after the PTX ISA
// (sections named as in the ISA; their numbers change between versions):
//   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: "Matrix Fragments for
//     mma.m16n8k16 with floating point type" (which lane holds which element) and
//     "Multiply-and-Accumulate Instruction: mma" (what it computes);
//   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16: "Warp-level matrix load
//     instruction: ldmatrix";
//   cp.async.{ca,cg}.shared.global, cp.async.commit_group, cp.async.wait_group/wait_all: "Data
//     Movement and Conversion Instructions: cp.async" and the two sections after it.
// The layouts are written here from the ISA's formulas, apart from the kernel-side helpers in
// tensor_core.cuh, so that the emulator stays a model of the hardware rather than a copy of the
// code under test; tests/kernels/tensor_core_emulated_test.cc checks both against hand tables.
//
// mma and ldmatrix are warp-collective (.sync.aligned): every lane deposits its operands, all 32
// wait at a warp barrier (as shuffles do), the first lane to resume computes every lane's result,
// each lane takes its own, and all wait again before the slots are reused. A warp whose lanes
// reach different instructions fails the test.
//
// Numerics of mma: A and B elements are widened exactly to fp32; each of D's elements is C plus
// the 16 products added in increasing k, one fma per k (the product of two 16-bit floats is exact
// in fp32, so each step rounds once, to nearest even); subnormal inputs are kept. The ISA leaves
// "the accumulation order, rounding and handling of subnormal inputs" unspecified, and tensor
// cores add several products at once with their own alignment and truncation, so these bits are
// not the GPU's: tests compare with a tolerance, or use inputs whose partial sums are all exact
// (small integers), where every order gives the same bits.
//
// cp.async: the source is read at issue, but the destination is written only when the issuing
// thread's cp.async.wait_group/wait_all covers the copy's group (or when the thread ends); until
// then it holds 0xff bytes (NaN). So a read of the destination before the matching wait (or, by
// another thread, before the issuing thread's wait and a barrier) shows up in the results, as
// long as the reading thread runs after the issuing one (the limit of the barrier checks above).
namespace simt {

// Row and column of one fragment element in its matrix.
struct Element {
  int row = 0;
  int col = 0;
};

// "Matrix Fragments for mma.m16n8k16 with floating point type", .f16/.bf16 multiplicands, .f32
// accumulators: where element i of a lane's fragment sits. Elements pack low to high, two to a
// 32-bit register in A and B (element i is half i % 2 of register i / 2), one per register in C/D.
inline Element mma_a_element(int lane, int i) {  // A: 16 x 16 (M x K), a0..a7
  const int group_id = lane >> 2, thread_id_in_group = lane % 4;
  const bool upper = (0 <= i && i < 2) || (4 <= i && i < 6);
  return {upper ? group_id : group_id + 8, thread_id_in_group * 2 + (i & 0x1) + (i < 4 ? 0 : 8)};
}
inline Element mma_b_element(int lane, int i) {  // B: 16 x 8 (K x N), b0..b3
  const int group_id = lane >> 2, thread_id_in_group = lane % 4;
  return {thread_id_in_group * 2 + (i & 0x1) + (i < 2 ? 0 : 8), group_id};
}
inline Element mma_c_element(int lane, int i) {  // C and D: 16 x 8 (M x N), c0..c3
  const int group_id = lane >> 2, thread_id_in_group = lane % 4;
  return {i < 2 ? group_id : group_id + 8, thread_id_in_group * 2 + (i & 0x1)};
}

// Which warp-collective instruction a lane executes (ldmatrix adds 2 * count + trans).
enum OpKind : int { kOpNone = 0, kOpMmaBF16 = 1, kOpMmaF16 = 2, kOpLdmatrix = 16 };

// Runs one warp-collective instruction whose operands the calling lane has put in its slots of
// its warp's WarpOp: waits for the warp, lets the first lane to resume compute every lane's `out`
// with `compute`, and copies the calling lane's first `words` words of it to `result`.
template <typename Compute>
void warp_collective(int kind, std::uint32_t* result, int words, Compute compute) {
  WarpOp& op = machine().warp_ops[fiber().warp];
  const int lane = fiber().lane;
  op.kind[lane] = kind;
  op.done = false;
  wait_at(Fiber::State::kWarpBarrier);
  if (!op.done) {
    op.done = true;
    for (int l = 0; l < 32; ++l) {
      if (op.kind[l] != kind) {
        ADD_FAILURE() << "SIMT emulator: the lanes of warp " << fiber().warp
                      << " reach different warp-level instructions (lane " << lane << ": " << kind
                      << ", lane " << l << ": " << op.kind[l] << "); .sync.aligned needs one";
        break;
      }
    }
    compute(op);
  }
  std::memcpy(result, op.out[lane], sizeof(std::uint32_t) * static_cast<std::size_t>(words));
  op.kind[lane] = kOpNone;
  wait_at(Fiber::State::kWarpBarrier);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16|f16}.{bf16|f16}.f32 {d}, {a}, {b}, {c}.
inline void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                         const float (&c)[4], bool bf16) {
  std::uint32_t* in = machine().warp_ops[fiber().warp].in[fiber().lane];
  for (int r = 0; r < 4; ++r)
    in[r] = a[r];
  in[4] = b[0];
  in[5] = b[1];
  for (int i = 0; i < 4; ++i)
    in[6 + i] = std::bit_cast<std::uint32_t>(c[i]);
  std::uint32_t result[4];
  warp_collective(bf16 ? kOpMmaBF16 : kOpMmaF16, result, 4, [bf16](WarpOp& w) {
    const auto widen = [bf16](std::uint32_t reg, int i) {
      const auto h = static_cast<std::uint16_t>(i % 2 == 0 ? reg & 0xffffu : reg >> 16);
      return bf16 ? strata::kernels::bf16_to_float(h) : strata::kernels::fp16_to_float(h);
    };
    float a_full[16][16] = {}, b_full[16][8] = {}, c_full[16][8] = {};  // (M,K) (K,N) (M,N)
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 8; ++i) {
        const Element e = mma_a_element(l, i);
        a_full[e.row][e.col] = widen(w.in[l][i / 2], i);
      }
      for (int i = 0; i < 4; ++i) {
        const Element e = mma_b_element(l, i);
        b_full[e.row][e.col] = widen(w.in[l][4 + i / 2], i);
        const Element f = mma_c_element(l, i);
        c_full[f.row][f.col] = std::bit_cast<float>(w.in[l][6 + i]);
      }
    }
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 4; ++i) {
        const Element e = mma_c_element(l, i);
        float acc = c_full[e.row][e.col];
        for (int k = 0; k < 16; ++k)
          acc = std::fma(a_full[e.row][k], b_full[k][e.col], acc);
        w.out[l][i] = std::bit_cast<std::uint32_t>(acc);
      }
    }
  });
  for (int i = 0; i < 4; ++i)
    d[i] = std::bit_cast<float>(result[i]);
}

// ldmatrix.sync.aligned.m8n8.x{kCount}{.trans}.shared.b16 {r}, [row]. Lanes 8j..8j+7 give the
// addresses of rows 0..7 of matrix j (8 16-bit elements each, 16-byte aligned; the other lanes'
// addresses are not read). Register j of lane l receives, of matrix j, row l / 4, elements
// 2 (l % 4) and 2 (l % 4) + 1 (low half, high half); with .trans, the same of the transposed
// matrix: column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1.
template <int kCount>
void ldmatrix(std::uint32_t (&r)[kCount], const void* row, bool trans) {
  static_assert(kCount == 1 || kCount == 2 || kCount == 4);
  machine().warp_ops[fiber().warp].address[fiber().lane] = row;
  warp_collective(kOpLdmatrix + 2 * kCount + (trans ? 1 : 0), r, kCount, [trans](WarpOp& w) {
    for (int l = 0; l < 8 * kCount; ++l) {
      if (w.address[l] == nullptr || reinterpret_cast<std::uintptr_t>(w.address[l]) % 16 != 0) {
        ADD_FAILURE() << "SIMT emulator: ldmatrix row address of lane " << l << " (" << w.address[l]
                      << ") is not a 16-byte aligned address";
        std::memset(w.out, 0xff, sizeof(w.out));
        return;
      }
    }
    const auto element = [&w](int matrix, int row_index, int col) {
      std::uint16_t h;
      std::memcpy(&h,
                  static_cast<const unsigned char*>(w.address[matrix * 8 + row_index]) + 2 * col,
                  sizeof(h));
      return static_cast<std::uint32_t>(h);
    };
    for (int j = 0; j < kCount; ++j) {
      for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l % 4;
        const std::uint32_t lo = trans ? element(j, 2 * t, g) : element(j, g, 2 * t);
        const std::uint32_t hi = trans ? element(j, 2 * t + 1, g) : element(j, g, 2 * t + 1);
        w.out[l][j] = lo | hi << 16;
      }
    }
  });
}

// cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_size: src_size bytes from src, then
// zeros up to cp_size (4, 8 or 16; both addresses aligned to it). See above for when it lands.
inline void cp_async(void* dst, const void* src, int cp_size, int src_size) {
  if ((cp_size != 4 && cp_size != 8 && cp_size != 16) || src_size < 0 || src_size > cp_size) {
    ADD_FAILURE() << "SIMT emulator: cp.async of " << src_size << " of " << cp_size << " bytes";
    return;
  }
  const auto size = static_cast<std::uintptr_t>(cp_size);
  if (reinterpret_cast<std::uintptr_t>(dst) % size != 0 ||
      (src_size > 0 && reinterpret_cast<std::uintptr_t>(src) % size != 0)) {
    ADD_FAILURE() << "SIMT emulator: cp.async of " << cp_size << " bytes from " << src << " to "
                  << dst << ": both addresses must be aligned to the size";
    return;
  }
  PendingCopy c;
  c.dst = static_cast<unsigned char*>(dst);
  c.size = cp_size;
  if (src_size > 0) std::memcpy(c.bytes, src, static_cast<std::size_t>(src_size));
  std::memset(c.dst, 0xff, size);
  fiber().copies.push_back(c);
}

// cp.async.commit_group: the thread's uncommitted copies become its next group (maybe empty).
inline void cp_async_commit_group() {
  Fiber& f = fiber();
  ++f.groups_committed;
  for (PendingCopy& c : f.copies) {
    if (c.group == 0) c.group = f.groups_committed;
  }
}

// Writes the destinations of f's copies in groups up to `through_group` (every copy, committed or
// not, when it is negative), in issue order.
inline void complete_copies(Fiber& f, int through_group) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < f.copies.size(); ++i) {
    const PendingCopy& c = f.copies[i];
    if (through_group < 0 || (c.group != 0 && c.group <= through_group)) {
      std::memcpy(c.dst, c.bytes, static_cast<std::size_t>(c.size));
    } else {
      f.copies[kept++] = c;
    }
  }
  f.copies.resize(kept);
}

// cp.async.wait_group n: all but the n most recent groups are complete (fewer groups is fine).
inline void cp_async_wait_group(int n) {
  Fiber& f = fiber();
  const int through_group = f.groups_committed - n;
  if (through_group > 0) complete_copies(f, through_group);
}

// cp.async.wait_all: commit_group, then wait_group 0.
inline void cp_async_wait_all() {
  cp_async_commit_group();
  cp_async_wait_group(0);
}

}  // namespace simt

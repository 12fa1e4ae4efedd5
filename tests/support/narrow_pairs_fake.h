// The pairing of fp32 buffers with 16-bit companions (Ops::pair_narrow, pair_narrow_alone) as the
// start-up checks' CPU fakes keep it (alone_check_test.cc, attention_alone_check_test.cc,
// gate_up_check_test.cc, norm_grad_check_test.cc): the pairs, and a buffer read as the backend's
// readers read it, from its companion where it has one; and what a failing check of a path kept
// alone must leave behind.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/fast_path.h"
#include "common/status.h"
#include "kernels/cpu/float16.h"

namespace strata::testing {

inline std::uint16_t to16(float f, backend::DType type) {
  return type == backend::DType::kBF16 ? kernels::float_to_bf16(f) : kernels::float_to_fp16(f);
}
inline float from16(std::uint16_t h, backend::DType type) {
  return type == backend::DType::kBF16 ? kernels::bf16_to_float(h) : kernels::fp16_to_float(h);
}

struct FakePair {
  float* wide;
  std::uint16_t* narrow;
  std::int64_t n;
  bool alone;  // pair_narrow_alone: `wide` has nothing behind it
};

struct FakePairs {
  backend::DType type = backend::DType::kBF16;
  std::vector<FakePair> pairs;

  // The pair the n values at p lie inside, or null.
  const FakePair* pair_of(const float* p, std::int64_t n) const {
    for (const FakePair& f : pairs) {
      if (p >= f.wide && p + n <= f.wide + f.n) return &f;
    }
    return nullptr;
  }
  // `extent` floats at p as a reader of paired buffers reads them: from the companion where p has
  // one (zeros where `zeros` and p is kept alone: the faults of the checks' tests), else p's.
  std::vector<float> read(const float* p, std::int64_t extent, bool zeros = false) const {
    const FakePair* f = pair_of(p, extent);
    std::vector<float> v(static_cast<std::size_t>(extent));
    if (f == nullptr) {
      std::copy(p, p + extent, v.begin());
      return v;
    }
    if (f->alone && zeros) return v;
    const std::uint16_t* narrow = f->narrow + (p - f->wide);
    for (std::int64_t i = 0; i < extent; ++i)
      v[static_cast<std::size_t>(i)] = from16(narrow[i], type);
    return v;
  }
  // pair_narrow (alone false) or pair_narrow_alone (true); `refuse`: the latter refused.
  Status pair(float* wide, void* narrow, std::int64_t n, bool alone, bool refuse) {
    if (alone && refuse) {
      return Status(ErrorCode::kUnavailable, "the ops refused to keep an activation alone");
    }
    pairs.push_back({wide, static_cast<std::uint16_t*>(narrow), n, alone});
    return Status::ok();
  }
  // Whether a product reading the n values at p reads them from a companion (`unread`: not from
  // one kept alone, the fault).
  bool reads_companion(const float* p, std::int64_t n, bool unread) const {
    const FakePair* f = pair_of(p, n);
    return f != nullptr && !(f->alone && unread);
  }
  void unpair(const float* wide) {
    std::erase_if(pairs, [wide](const FakePair& f) { return f.wide == wide; });
  }
  // C = op(A) op(B) by `ops` (alpha 1, beta 0), rounded into the companion of `c`, which must be
  // kept alone, as the backend's product writing an output kept alone does; `off_at` >= 0: that
  // element 2 units off (the checks' tests' fault).
  void product_alone(backend::Ops<float>& ops, bool ta, bool tb, std::int64_t m, std::int64_t n,
                     std::int64_t k, const float* a, std::int64_t lda, const float* b,
                     std::int64_t ldb, float* c, std::int64_t ldc, std::int64_t off_at = -1) const {
    const FakePair* f = pair_of(c, (m - 1) * ldc + n);
    ASSERT_TRUE(f != nullptr && f->alone) << "the product writes an output kept alone";
    std::vector<float> product(static_cast<std::size_t>(m * ldc));
    ops.gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, product.data(), ldc);
    std::uint16_t* narrow = f->narrow + (c - f->wide);
    for (std::int64_t i = 0; i < m * ldc; ++i) {
      narrow[i] = to16(product[static_cast<std::size_t>(i)], type);
      if (i == off_at) narrow[i] += 2;
    }
  }
};

// C = op(A) op(B) (alpha 1, beta 0) by `ops` as the backend's products run it: A and B read from
// their companions where they have one (B as zeros where it is kept alone and `zeros_as_b`: the
// checks' tests' fault), C written in fp32, or rounded into its companion where it is kept alone
// (product_alone, with its `off_at`).
inline void paired_product(const FakePairs& pairs, backend::Ops<float>& ops, bool ta, bool tb,
                           std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                           std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                           std::int64_t ldc, bool zeros_as_b = false, std::int64_t off_at = -1) {
  const std::vector<float> a_in = pairs.read(a, (ta ? k : m) * lda);
  const std::vector<float> b_in = pairs.read(b, (tb ? n : k) * ldb, zeros_as_b);
  const FakePair* f = pairs.pair_of(c, (m - 1) * ldc + n);
  if (f == nullptr || !f->alone) {
    ops.gemm(ta, tb, m, n, k, 1.0f, a_in.data(), lda, b_in.data(), ldb, 0.0f, c, ldc);
    return;
  }
  pairs.product_alone(ops, ta, tb, m, n, k, a_in.data(), lda, b_in.data(), ldb, c, ldc, off_at);
}

// `check` failing on `path` (a check's path with `pair` and `unpair`, which this counts) leaves
// the fast path `name` off with one warning naming it and what it `replaces`, and unpairs all it
// paired.
template <typename Path>
void expect_listed_off_unpairing(Path path, const char* name, const char* replaces,
                                 const std::function<Status(const Path&)>& check) {
  std::vector<std::string> warnings;
  backend::FastPaths paths([&](const std::string& m) { warnings.push_back(m); });
  int paired = 0;
  const auto pair = path.pair;
  path.pair = [&](float* wide, void* narrow, std::int64_t n, bool alone) {
    ++paired;
    return pair(wide, narrow, n, alone);
  };
  const auto unpair = path.unpair;
  path.unpair = [&](const float* wide) {
    --paired;
    unpair(wide);
  };
  const bool on = paths.adopt(name, replaces, "kept alone", [&] { return check(path); });
  EXPECT_FALSE(on) << name;
  EXPECT_FALSE(paths.active(name)) << name;
  EXPECT_EQ(paired, 0) << name;
  ASSERT_EQ(warnings.size(), 1u) << name;
  EXPECT_NE(warnings[0].find(std::string("fast path ") + name + " is off"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find(replaces), std::string::npos) << warnings[0];
}

}  // namespace strata::testing

// The Comm interface on one rank (argument checks, handles, copies) and the rank-order fold that
// defines every host reduction.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "comm/comm.h"
#include "comm/reduce.h"
#include "kernels/cpu/float16.h"

namespace strata::comm {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  std::vector<float> v(n);
  for (float& x : v)
    x = dist(rng);
  return v;
}

// ---- the fold -----------------------------------------------------------------------------------

TEST(Fold, Fp32SumIsALeftFoldInRankOrder) {
  constexpr int kRanks = 5;
  constexpr std::size_t kCount = 3000;  // not a multiple of the block size
  std::vector<std::vector<float>> inputs;
  std::vector<const void*> sources;
  for (int r = 0; r < kRanks; ++r) {
    inputs.push_back(random_floats(kCount, 100 + static_cast<std::uint32_t>(r)));
    sources.push_back(inputs.back().data());
  }
  std::vector<float> out(kCount);
  fold_in_order(out.data(), sources.data(), kRanks, kCount, DataType::kF32, ReduceOp::kSum);
  int order_matters = 0;
  for (std::size_t i = 0; i < kCount; ++i) {
    float acc = inputs[0][i];
    for (int r = 1; r < kRanks; ++r)
      acc += inputs[static_cast<std::size_t>(r)][i];
    EXPECT_EQ(std::bit_cast<std::uint32_t>(out[i]), std::bit_cast<std::uint32_t>(acc)) << i;
    float reversed = inputs[kRanks - 1][i];
    for (int r = kRanks - 2; r >= 0; --r)
      reversed += inputs[static_cast<std::size_t>(r)][i];
    order_matters += reversed != acc;
  }
  // The data is such that another order gives other bits somewhere, so the test sees the order.
  EXPECT_GT(order_matters, 0);
}

TEST(Fold, Bf16SumAccumulatesInFp32AndRoundsOnce) {
  // 1 + 2^-8 + 2^-8: in bf16 (ulp 2^-7 at 1) each step is a tie that rounds back to 1; in fp32
  // the sum is 1 + 2^-7, which bf16 holds exactly.
  const std::uint16_t one = kernels::float_to_bf16(1.0f);
  const std::uint16_t tiny = kernels::float_to_bf16(std::ldexp(1.0f, -8));
  std::vector<std::uint16_t> a{one}, b{tiny}, c{tiny};
  const void* sources[] = {a.data(), b.data(), c.data()};
  std::uint16_t out = 0;
  fold_in_order(&out, sources, 3, 1, DataType::kBF16, ReduceOp::kSum);
  EXPECT_EQ(kernels::bf16_to_float(out), 1.0f + std::ldexp(1.0f, -7));
}

TEST(Fold, Fp16SumAccumulatesInFp32) {
  const std::uint16_t big = kernels::float_to_fp16(2048.0f);
  const std::uint16_t one = kernels::float_to_fp16(1.0f);
  std::vector<std::uint16_t> a{big}, b{one}, c{one};
  const void* sources[] = {a.data(), b.data(), c.data()};
  std::uint16_t out = 0;
  fold_in_order(&out, sources, 3, 1, DataType::kF16, ReduceOp::kSum);
  EXPECT_EQ(kernels::fp16_to_float(out), 2050.0f);  // fp16 steps would give 2048
}

TEST(Fold, MaxPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a{1.0f, nan, -3.0f}, b{nan, 2.0f, -4.0f};
  const void* sources[] = {a.data(), b.data()};
  std::vector<float> out(3);
  fold_in_order(out.data(), sources, 2, 3, DataType::kF32, ReduceOp::kMax);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], -3.0f);
}

TEST(Fold, IntegerMaxIsSigned) {
  std::vector<std::int32_t> a{-5, 7}, b{-2, -9};
  const void* sources[] = {a.data(), b.data()};
  std::vector<std::int32_t> out(2);
  fold_in_order(out.data(), sources, 2, 2, DataType::kI32, ReduceOp::kMax);
  EXPECT_EQ(out[0], -2);
  EXPECT_EQ(out[1], 7);
}

TEST(Fold, IntegerSumWraps) {
  std::vector<std::int32_t> a{std::numeric_limits<std::int32_t>::max()}, b{1};
  const void* sources[] = {a.data(), b.data()};
  std::int32_t out = 0;
  fold_in_order(&out, sources, 2, 1, DataType::kI32, ReduceOp::kSum);
  EXPECT_EQ(out, std::numeric_limits<std::int32_t>::min());
}

TEST(Fold, OutputMayBeOneOfTheSources) {
  std::vector<float> a = random_floats(5000, 1);
  std::vector<float> b = random_floats(5000, 2);
  std::vector<float> expected(5000);
  for (std::size_t i = 0; i < a.size(); ++i)
    expected[i] = a[i] + b[i];
  const void* sources[] = {a.data(), b.data()};
  fold_in_order(b.data(), sources, 2, b.size(), DataType::kF32, ReduceOp::kSum);
  EXPECT_EQ(b, expected);
}

// ---- the single-rank Comm -----------------------------------------------------------------------

TEST(SingleComm, CollectivesCopyTheInput) {
  std::unique_ptr<Comm> c = create_single_comm();
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_EQ(c->rank(), 0);
  std::vector<float> in = random_floats(1000, 7);
  for (auto run : {+[](Comm&comm, const float*s, float*r) {
                     return comm.all_gather(s, r, 1000, DataType::kF32);
                   },
                   +[](Comm&comm, const float*s, float*r) {
                     return comm.reduce_scatter(s, r, 1000, DataType::kF32, ReduceOp::kSum);
                   },
                   +[](Comm&comm, const float*s, float*r) {
                     return comm.all_reduce(s, r, 1000, DataType::kF32, ReduceOp::kSum);
                   }}) {
    std::vector<float> out(1000, 0.0f);
    Result<Handle> h = run(*c, in.data(), out.data());
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    ASSERT_TRUE(c->wait(*h).is_ok());
    EXPECT_EQ(out, in);
  }
}

TEST(SingleComm, HandlesAreSequentialAndComplete) {
  std::unique_ptr<Comm> c = create_single_comm();
  Result<Handle> a = c->barrier();
  Result<Handle> b = c->barrier();
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->sequence, 1u);
  EXPECT_EQ(b->sequence, 2u);
  Result<bool> done = c->test(*b);
  ASSERT_TRUE(done.is_ok());
  EXPECT_TRUE(*done);
  EXPECT_TRUE(c->wait_all().is_ok());
  EXPECT_EQ(c->issued(), 2u);
}

TEST(SingleComm, UnknownHandleIsAnError) {
  std::unique_ptr<Comm> c = create_single_comm();
  Result<bool> done = c->test(Handle{5});
  ASSERT_FALSE(done.is_ok());
  EXPECT_EQ(done.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(c->wait(Handle{}).is_ok());
}

TEST(CommArguments, OverlappingAllGatherBuffersAreRejected) {
  std::unique_ptr<Comm> c = create_single_comm();
  std::vector<float> buf(100);
  Result<Handle> h = c->all_gather(buf.data() + 1, buf.data(), 10, DataType::kF32);
  ASSERT_FALSE(h.is_ok());
  EXPECT_CONTAINS(h.status().to_string(), "overlap");
  EXPECT_CONTAINS(h.status().to_string(), "all_gather");
  EXPECT_EQ(c->issued(), 0u);  // a rejected call issues nothing
}

TEST(CommArguments, InPlaceAllReduceIsAllowed) {
  std::unique_ptr<Comm> c = create_single_comm();
  std::vector<float> buf = random_floats(10, 3);
  const std::vector<float> before = buf;
  Result<Handle> h = c->all_reduce(buf.data(), buf.data(), 10, DataType::kF32, ReduceOp::kMax);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_EQ(buf, before);
}

TEST(CommArguments, BroadcastRootMustBeARank) {
  std::unique_ptr<Comm> c = create_single_comm();
  float x = 0;
  Result<Handle> h = c->broadcast(&x, 1, DataType::kF32, 1);
  ASSERT_FALSE(h.is_ok());
  EXPECT_CONTAINS(h.status().to_string(), "root 1 is not a rank; valid: 0 to 0");
}

TEST(CommArguments, NullBufferIsRejected) {
  std::unique_ptr<Comm> c = create_single_comm();
  Result<Handle> h = c->reduce_scatter(nullptr, nullptr, 4, DataType::kF32, ReduceOp::kSum);
  ASSERT_FALSE(h.is_ok());
  EXPECT_EQ(h.status().code(), ErrorCode::kInvalidArgument);
}

TEST(CommArguments, ZeroCountIsANoOp) {
  std::unique_ptr<Comm> c = create_single_comm();
  Result<Handle> h = c->all_reduce(nullptr, nullptr, 0, DataType::kF32, ReduceOp::kSum);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_TRUE(c->wait(*h).is_ok());
}

TEST(CommOptions, InvalidOptionsAreRejected) {
  CommOptions o;
  o.timeout_s = 0;
  EXPECT_CONTAINS(validate(o).to_string(), "timeout");
  o.timeout_s = 1;
  o.in_flight_max = 0;
  EXPECT_CONTAINS(validate(o).to_string(), "in_flight_max 0");
}

}  // namespace
}  // namespace strata::comm

// Blocked causal attention against a plain reference that materialises the T x T scores, in
// float and double, with grouped KV heads; and bit-identical results whatever the thread count.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/nn_ops.h"
#include "tests/kernels/grad_check.h"

namespace strata::kernels {
namespace {

AttentionShape make_shape(std::int64_t batch, std::int64_t seq, std::int64_t heads,
                          std::int64_t kv_heads, std::int64_t d) {
  AttentionShape s;
  s.batch = batch;
  s.seq_len = seq;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = d;
  s.q_stride = heads * d;
  s.kv_stride = kv_heads * d;
  s.out_stride = heads * d;
  s.scale = 1.0 / std::sqrt(static_cast<double>(d));
  return s;
}

// out(B*T, H*D) by the textbook formula, in double.
std::vector<double> reference(const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const AttentionShape& s) {
  const std::int64_t T = s.seq_len, D = s.head_dim, group = s.heads / s.kv_heads;
  std::vector<double> out(s.batch * T * s.heads * D, 0.0);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t t = 0; t < T; ++t) {
        std::vector<double> p(t + 1);
        double m = -1e300;
        for (std::int64_t u = 0; u <= t; ++u) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < D; ++d) {
            dot +=
                q[(b * T + t) * s.q_stride + h * D + d] * k[(b * T + u) * s.kv_stride + g * D + d];
          }
          p[u] = dot * s.scale;
          m = std::max(m, p[u]);
        }
        double z = 0.0;
        for (double& x : p)
          z += (x = std::exp(x - m));
        for (std::int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (std::int64_t u = 0; u <= t; ++u)
            acc += p[u] * v[(b * T + u) * s.kv_stride + g * D + d];
          out[(b * T + t) * s.out_stride + h * D + d] = acc / z;
        }
      }
    }
  }
  return out;
}

TEST(Attention, ForwardMatchesReferenceInDoubleAndFloat) {
  const AttentionShape s = make_shape(2, 150, 6, 2, 16);
  const std::int64_t rows = s.batch * s.seq_len;
  const auto q = testing::random_vector(rows * s.q_stride, 1, -2, 2);
  const auto k = testing::random_vector(rows * s.kv_stride, 2, -2, 2);
  const auto v = testing::random_vector(rows * s.kv_stride, 3);
  const auto want = reference(q, k, v, s);

  std::vector<double> out(want.size()), lse(s.batch * s.heads * s.seq_len);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(out[i], want[i], 1e-12) << i;

  std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end());
  std::vector<float> outf(want.size()), lsef(lse.size());
  attention_forward(outf.data(), lsef.data(), qf.data(), kf.data(), vf.data(), s);
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(outf[i], want[i], 2e-5) << i;
  for (std::size_t i = 0; i < lse.size(); ++i)
    ASSERT_NEAR(lsef[i], lse[i], 1e-5) << i;
}

TEST(Attention, FirstTokenAttendsOnlyToItself) {
  const AttentionShape s = make_shape(1, 3, 1, 1, 4);
  const auto q = testing::random_vector(12, 4), k = testing::random_vector(12, 5);
  const auto v = testing::random_vector(12, 6);
  std::vector<double> out(12), lse(3);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  for (int d = 0; d < 4; ++d)
    EXPECT_DOUBLE_EQ(out[d], v[d]);
}

TEST(Attention, BitIdenticalWithOneOrTwoThreads) {
  const AttentionShape s = make_shape(2, 130, 4, 1, 32);
  const std::int64_t rows = s.batch * s.seq_len;
  const auto qd = testing::random_vector(rows * s.q_stride, 7);
  const auto kd = testing::random_vector(rows * s.kv_stride, 8);
  const auto vd = testing::random_vector(rows * s.kv_stride, 9);
  const auto dod = testing::random_vector(rows * s.out_stride, 10);
  std::vector<float> q(qd.begin(), qd.end()), k(kd.begin(), kd.end()), v(vd.begin(), vd.end()),
      dout(dod.begin(), dod.end());
  auto run = [&](int threads) {
    std::vector<float> out(rows * s.out_stride), lse(s.batch * s.heads * s.seq_len);
    std::vector<float> grads(q.size() + 2 * k.size());
    tbb::task_arena(threads).execute([&] {
      attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
      attention_backward(grads.data(), grads.data() + q.size(), grads.data() + q.size() + k.size(),
                         dout.data(), out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    });
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  };
  const auto one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace strata::kernels

// The CUDA attention kernels against the CPU's: causal, grouped KV heads, inputs as column ranges
// of one fused qkv buffer with padded strides, sequence lengths that are not multiples of the
// tiles, and head sizes for every per-lane variant (8, 64, 96, 128, 256). Forward output and
// log-sum-exp, then dq, dk, dv; and the backward gives the same bits when run twice. Also with
// sliding windows and packed documents (positions restarting inside a row). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "support/gpu_support.h"

namespace strata::backend {
namespace {

struct Shape {
  std::int64_t batch, seq_len, heads, kv_heads, head_dim;
  std::int64_t window = 0;  // sliding window; 0 = none
  std::int64_t doc = 0;     // > 0: packed documents, position t % doc (and shorter ones)
};

struct Buffers {
  Buffer qkv, out, lse, dout, dqkv, positions;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "B" << s.batch << " T" << s.seq_len << " H" << s.heads << " KV" << s.kv_heads << " D"
      << s.head_dim << " W" << s.window << " doc" << s.doc;
}

// Documents of `doc` tokens, every third one cut to a third of that.
std::vector<std::int32_t> positions_of(const Shape& s) {
  std::vector<std::int32_t> p;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    std::int64_t at = 0, n = 0;
    for (std::int64_t t = 0; t < s.seq_len; ++t) {
      const std::int64_t length = n % 3 == 2 ? std::max<std::int64_t>(1, s.doc / 3) : s.doc;
      if (at == length) {
        at = 0;
        ++n;
      }
      p.push_back(static_cast<std::int32_t>(at++));
    }
  }
  return p;
}

class CudaAttention : public ::testing::TestWithParam<Shape> {};

AttentionShape attention_shape(const Shape& s) {
  AttentionShape a;
  a.batch = s.batch;
  a.seq_len = s.seq_len;
  a.heads = s.heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.q_stride = (s.heads + 2 * s.kv_heads) * s.head_dim + 3;  // fused q|k|v plus padding
  a.kv_stride = a.q_stride;
  a.out_stride = s.heads * s.head_dim + 5;
  a.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  a.window = s.window;
  return a;
}

Buffers make(Backend& backend, const Shape& s, AttentionShape& a) {
  const std::int64_t rows = a.batch * a.seq_len;
  Buffers b;
  b.qkv = testing::to_device(backend, testing::random_floats(rows * a.q_stride, 1, -2.0f, 2.0f));
  b.out = testing::to_device(backend, testing::random_floats(rows * a.out_stride, 2));
  b.lse = testing::to_device(backend, testing::random_floats(a.batch * a.heads * a.seq_len, 3));
  b.dout = testing::to_device(backend, testing::random_floats(rows * a.out_stride, 4));
  b.dqkv = testing::to_device(backend, testing::random_floats(rows * a.q_stride, 5));
  if (s.doc > 0) {
    b.positions = testing::to_device(backend, positions_of(s));
    a.positions = b.positions.as<std::int32_t>();
  }
  return b;
}

void forward(Backend& backend, Buffers& b, const AttentionShape& a) {
  const std::int64_t hd = a.heads * a.head_dim, kvd = a.kv_heads * a.head_dim;
  float* qkv = b.qkv.as<float>();
  backend.ops_f32().attention_forward(b.out.as<float>(), b.lse.as<float>(), qkv, qkv + hd,
                                      qkv + hd + kvd, a);
}

void backward(Backend& backend, Buffers& b, const AttentionShape& a) {
  const std::int64_t hd = a.heads * a.head_dim, kvd = a.kv_heads * a.head_dim;
  float* qkv = b.qkv.as<float>();
  float* d = b.dqkv.as<float>();
  backend.ops_f32().attention_backward(d, d + hd, d + hd + kvd, b.dout.as<float>(),
                                       b.out.as<float>(), b.lse.as<float>(), qkv, qkv + hd,
                                       qkv + hd + kvd, a);
}

// Only the columns the kernels own are compared (padding is not written by either).
std::vector<float> columns(const std::vector<float>& all, std::int64_t stride, std::int64_t width) {
  std::vector<float> out;
  for (std::size_t r = 0; r * static_cast<std::size_t>(stride) < all.size(); ++r) {
    for (std::int64_t c = 0; c < width; ++c)
      out.push_back(all[r * static_cast<std::size_t>(stride) + static_cast<std::size_t>(c)]);
  }
  return out;
}

TEST_P(CudaAttention, MatchesTheCpuKernelsForwardAndBackward) {
  STRATA_GPU_OR_SKIP(gpu, {});
  auto cpu = testing::make_reference_backend();
  AttentionShape a = attention_shape(GetParam()), ac = a;
  Buffers g = make(gpu, GetParam(), a), c = make(*cpu, GetParam(), ac);
  forward(gpu, g, a);
  forward(*cpu, c, ac);
  const std::int64_t width = a.heads * a.head_dim;
  const testing::Tolerance tol{1e-5, 1e-4};
  testing::expect_all_close(
      "out", columns(testing::to_host<float>(gpu, g.out), a.out_stride, width),
      columns(testing::to_host<float>(*cpu, c.out), a.out_stride, width), tol);
  testing::expect_all_close("lse", testing::to_host<float>(gpu, g.lse),
                            testing::to_host<float>(*cpu, c.lse), tol);
  backward(gpu, g, a);
  backward(*cpu, c, ac);
  const std::int64_t qkv_width = (a.heads + 2 * a.kv_heads) * a.head_dim;
  const std::vector<float> first = testing::to_host<float>(gpu, g.dqkv);
  testing::expect_all_close("dq|dk|dv", columns(first, a.q_stride, qkv_width),
                            columns(testing::to_host<float>(*cpu, c.dqkv), a.q_stride, qkv_width),
                            testing::Tolerance{1e-5, 2e-4});
  backward(gpu, g, a);
  testing::expect_bitwise_equal("second backward", testing::to_host<float>(gpu, g.dqkv), first);
  EXPECT_TRUE(gpu.synchronize(StreamKind::kCompute).is_ok());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    ::testing::Values(Shape{2, 77, 4, 2, 64},            // GPT-2-like head size, GQA, partial tiles
                      Shape{1, 130, 4, 1, 128},          // Llama head size, one KV head
                      Shape{3, 33, 3, 3, 8},             // tiny heads (per lane 1), no grouping
                      Shape{1, 40, 2, 1, 256},           // the largest head size
                      Shape{2, 65, 6, 2, 96},            // head size below its padded 128
                      Shape{1, 1, 2, 2, 64},             // a single position
                      Shape{2, 150, 4, 2, 64, 40},       // sliding window across tiles
                      Shape{1, 130, 4, 1, 128, 7},       // window shorter than a key tile
                      Shape{2, 200, 4, 2, 64, 0, 70},    // packed documents
                      Shape{1, 160, 2, 2, 96, 24, 90}),  // both
    [](const auto& info) {
      const Shape& s = info.param;
      return "B" + std::to_string(s.batch) + "T" + std::to_string(s.seq_len) + "H" +
             std::to_string(s.heads) + "KV" + std::to_string(s.kv_heads) + "D" +
             std::to_string(s.head_dim) + "W" + std::to_string(s.window) + "Doc" +
             std::to_string(s.doc);
    });

}  // namespace
}  // namespace strata::backend

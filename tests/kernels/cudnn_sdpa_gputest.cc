// cuDNN's fused attention graphs (kernels/cuda/cudnn_sdpa.h), the `cudnn_attention` fast path.
// Without a GPU: the forward and backward graphs' every tensor and operation node is built with
// the real libcudnn and finalized (cuDNN checks each node's attributes: types, dimensions that
// multiply, strides, the masks' index comparisons) for the variants the backend asks for: causal
// with H == KV and grouped KV heads, a sliding window, bf16 and fp16, head sizes 64, 80, 128 and
// 256. A graph whose products do not match (KV heads that do not divide the query heads) is
// refused, naming the node. Whether a fused engine takes the whole graph, and its numbers, need
// the GPU: the backend's start-up check (cuda_fast_path_gputest.cc) compares it with the CPU
// reference there. Skips, saying why, where cuDNN's headers were not found at build time or
// libcudnn cannot be loaded.
#include <gtest/gtest.h>

#if defined(STRATA_HAVE_CUDNN)
#include "kernels/cuda/cudnn_api.h"
#include "kernels/cuda/cudnn_sdpa.h"
#endif

namespace strata {
namespace {

#if defined(STRATA_HAVE_CUDNN)

const cuda::CudnnApi* api_or_skip(std::string* why) {
  auto api = cuda::load_cudnn();
  if (!api.is_ok()) {
    *why = api.status().to_string();
    return nullptr;
  }
  return api.value();
}

cuda::SdpaSpec spec(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                    std::int64_t window, bool bf16) {
  cuda::SdpaSpec s;
  s.batch = 2;
  s.seq_len = 70;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.window = window;
  s.scale = 1.0f / 8.0f;
  s.bf16 = bf16;
  return s;
}

TEST(CudnnSdpaGraph, EveryNodeFinalizesForEachVariant) {
  std::string why;
  const cuda::CudnnApi* api = api_or_skip(&why);
  if (api == nullptr) GTEST_SKIP() << "libcudnn not loadable: " << why;
  std::printf("cudnn: %s, version %zu\n", api->path.c_str(), api->version);
  const cuda::SdpaSpec specs[] = {spec(4, 4, 64, 0, true), spec(4, 2, 64, 0, true),
                                  spec(4, 1, 128, 33, true), spec(2, 2, 80, 0, false),
                                  spec(4, 2, 256, 17, false)};
  for (const cuda::SdpaSpec& s : specs) {
    SCOPED_TRACE(testing::Message()
                 << "H=" << s.heads << " KV=" << s.kv_heads << " D=" << s.head_dim
                 << " window=" << s.window << (s.bf16 ? " bf16" : " fp16"));
    auto forward = cuda::finalize_sdpa_nodes(*api, s, false);
    ASSERT_TRUE(forward.is_ok()) << forward.status().to_string();
    auto backward = cuda::finalize_sdpa_nodes(*api, s, true);
    ASSERT_TRUE(backward.is_ok()) << backward.status().to_string();
    // Forward: Q·Kᵀ, scale, the masks, max, − max, exp, sum, log, stats, P, P·V. Backward: dO∘O,
    // its row sum and the softmax sum, Q·Kᵀ, scale, − stats, the masks, exp, Pᵀ, dV (1, or 2 with
    // a group), dO·Vᵀ, − sum, ∘ P, scale, dSᵀ, dK (1 or 2), K, dS·K. The causal mask is two
    // indices, a comparison and a select; a window adds five more.
    const int masks = s.window > 0 ? 9 : 4;
    const int grouped = s.heads != s.kv_heads ? 1 : 0;
    EXPECT_EQ(forward.value(), 10 + masks);
    EXPECT_EQ(backward.value(), 17 + masks + 2 * grouped);
  }
}

TEST(CudnnSdpaGraph, ProductsThatDoNotMatchAreRefusedNamingTheNode) {
  std::string why;
  const cuda::CudnnApi* api = api_or_skip(&why);
  if (api == nullptr) GTEST_SKIP() << "libcudnn not loadable: " << why;
  cuda::SdpaSpec s = spec(4, 3, 64, 0, true);  // 3 KV heads cannot serve 4 query heads
  auto forward = cuda::finalize_sdpa_nodes(*api, s, false);
  ASSERT_FALSE(forward.is_ok());
  EXPECT_NE(forward.status().to_string().find("Q·Kᵀ"), std::string::npos)
      << forward.status().to_string();
}

#else

TEST(CudnnSdpaGraph, EveryNodeFinalizesForEachVariant) {
  GTEST_SKIP() << "built without cuDNN's headers (CUDA off, or cudnn_graph.h not found)";
}

#endif

}  // namespace
}  // namespace strata

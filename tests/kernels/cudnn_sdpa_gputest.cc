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
//
// The engine choice and the calls, against a fake cuDNN table on the CPU
// (CudnnAttention::for_test): engines cuDNN marks nondeterministic, whose plan does not finalize or
// whose workspace is larger than the one lent are passed over, mode A's list before the fallback
// list, and a spec no engine takes is refused naming each engine and why (and tried once); a
// prepared call passes the tensors by their uids with the right pointers, the scalars by value, the
// lent workspace and the call's stream, and a call for a shape never prepared fails naming it.
#include <gtest/gtest.h>

#if defined(STRATA_HAVE_CUDNN)
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

// ---- a fake cuDNN table ----------------------------------------------------------------------

struct FakeEngine {
  bool nondeterministic = false;
  bool plan_refused = false;
  std::int64_t workspace = 0;
};
struct FakeScenario {
  std::vector<FakeEngine> mode_a, fallback;
  int graphs_finalized = 0;
  int plans_built = 0;
  // The last execute: its plan's engine, uids, pointers, workspace and the handle's stream.
  int executed_engine = -1;
  std::vector<std::int64_t> uids;
  std::vector<void*> pointers;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
};
FakeScenario* g_fake = nullptr;

struct FakeDesc {
  cudnnBackendDescriptorType_t type{};
  int mode = -1;    // heuristics: CUDNN_HEUR_MODE_*
  int engine = -1;  // engine config, engine, plan: index into its mode's list (fallback + 1000)
  std::vector<std::int64_t> uids;
  std::vector<void*> pointers;
  void* workspace = nullptr;
};

const FakeEngine& engine_of(int index) {
  return index >= 1000 ? g_fake->fallback[static_cast<std::size_t>(index - 1000)]
                       : g_fake->mode_a[static_cast<std::size_t>(index)];
}

cudnnStatus_t fake_create(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* d) {
  auto* desc = new FakeDesc();
  desc->type = type;
  *d = desc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t fake_destroy(cudnnBackendDescriptor_t d) {
  delete static_cast<FakeDesc*>(d);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t fake_set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                       cudnnBackendAttributeType_t, std::int64_t count, const void* value) {
  auto* desc = static_cast<FakeDesc*>(d);
  if (name == CUDNN_ATTR_ENGINEHEUR_MODE) desc->mode = *static_cast<const int*>(value);
  if (name == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) {
    desc->engine = (*static_cast<FakeDesc* const*>(value))->engine;
  }
  if (name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) {
    const auto* u = static_cast<const std::int64_t*>(value);
    desc->uids.assign(u, u + count);
  }
  if (name == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) {
    void* const* p = static_cast<void* const*>(value);
    desc->pointers.assign(p, p + count);
  }
  if (name == CUDNN_ATTR_VARIANT_PACK_WORKSPACE)
    desc->workspace = *static_cast<void* const*>(value);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t fake_get(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t name,
                       cudnnBackendAttributeType_t, std::int64_t requested, std::int64_t* count,
                       void* out) {
  auto* desc = static_cast<FakeDesc*>(d);
  if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
    const bool a = desc->mode == CUDNN_HEUR_MODE_A;
    const auto n = static_cast<std::int64_t>((a ? g_fake->mode_a : g_fake->fallback).size());
    *count = requested == 0 ? n : std::min(requested, n);
    for (std::int64_t i = 0; requested > 0 && i < *count; ++i)
      static_cast<FakeDesc**>(out)[i]->engine = static_cast<int>(i) + (a ? 0 : 1000);
    return CUDNN_STATUS_SUCCESS;
  }
  if (name == CUDNN_ATTR_ENGINECFG_ENGINE) {
    static_cast<FakeDesc**>(out)[0]->engine = desc->engine;
    *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  if (name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
    *count = 0;
    if (engine_of(desc->engine).nondeterministic) {
      static_cast<cudnnBackendNumericalNote_t*>(out)[0] = CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
      static_cast<cudnnBackendNumericalNote_t*>(out)[1] = CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
      *count = 2;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
    *static_cast<std::int64_t*>(out) = engine_of(desc->engine).workspace;
    *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t fake_finalize(cudnnBackendDescriptor_t d) {
  auto* desc = static_cast<FakeDesc*>(d);
  if (desc->type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) ++g_fake->graphs_finalized;
  if (desc->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) {
    if (engine_of(desc->engine).plan_refused) return CUDNN_STATUS_NOT_SUPPORTED;
    ++g_fake->plans_built;
  }
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t fake_set_stream(cudnnHandle_t, cudaStream_t stream) {
  g_fake->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t fake_execute(cudnnHandle_t, cudnnBackendDescriptor_t plan,
                           cudnnBackendDescriptor_t pack) {
  g_fake->executed_engine = static_cast<FakeDesc*>(plan)->engine;
  g_fake->uids = static_cast<FakeDesc*>(pack)->uids;
  g_fake->pointers = static_cast<FakeDesc*>(pack)->pointers;
  g_fake->workspace = static_cast<FakeDesc*>(pack)->workspace;
  return CUDNN_STATUS_SUCCESS;
}
const char* fake_error_string(cudnnStatus_t status) {
  return status == CUDNN_STATUS_NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED" : "CUDNN_STATUS_?";
}
void fake_last_error(char* message, std::size_t size) {
  std::snprintf(message, size, "%s", "no kernel for this configuration");
}

cuda::CudnnApi fake_api() {
  cuda::CudnnApi api;
  api.error_string = fake_error_string;
  api.last_error = fake_last_error;
  api.set_stream = fake_set_stream;
  api.create_descriptor = fake_create;
  api.destroy_descriptor = fake_destroy;
  api.set_attribute = fake_set;
  api.get_attribute = fake_get;
  api.finalize = fake_finalize;
  api.execute = fake_execute;
  api.path = "fake";
  api.version = 92600;
  return api;
}

// The pass shape a spec describes.
kernels::AttentionShape pass_of(const cuda::SdpaSpec& s) {
  kernels::AttentionShape pass;
  pass.batch = s.batch;
  pass.seq_len = s.seq_len;
  pass.heads = s.heads;
  pass.kv_heads = s.kv_heads;
  pass.head_dim = s.head_dim;
  pass.window = s.window;
  pass.scale = s.scale;
  return pass;
}

struct FakeFixture {
  FakeScenario scenario;
  cuda::CudnnApi api = fake_api();
  alignas(16) char workspace[64] = {};
  std::unique_ptr<cuda::CudnnAttention> attention;
  explicit FakeFixture(std::size_t workspace_bytes) {
    g_fake = &scenario;
    attention = cuda::CudnnAttention::for_test(&api, reinterpret_cast<void*>(0x10), kStream,
                                               workspace, workspace_bytes);
  }
  ~FakeFixture() {
    attention.reset();
    g_fake = nullptr;
  }
  static inline const cudaStream_t kStream = reinterpret_cast<cudaStream_t>(0x20);
};

TEST(CudnnSdpaPlans, TheFirstDeterministicEngineThatBuildsAndFitsIsChosen) {
  FakeFixture f(1 << 20);
  f.scenario.mode_a = {{.nondeterministic = true},
                       {.plan_refused = true},
                       {.workspace = 2 << 20},
                       {.workspace = 4096},
                       {}};
  const Status s = f.attention->prepare(spec(4, 2, 64, 0, true));
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(f.scenario.graphs_finalized, 2);  // forward and backward
  // Engine 3 for both directions: 0 is nondeterministic, 1 refuses its plan, 2 needs 2 MiB.
  EXPECT_EQ(f.scenario.plans_built, 2 * 2);  // engines 2 and 3 built, per direction
  // A second prepare of the same spec builds nothing.
  ASSERT_TRUE(f.attention->prepare(spec(4, 2, 64, 0, true)).is_ok());
  EXPECT_EQ(f.scenario.graphs_finalized, 2);
  std::uint16_t q[8], k[8], v[8], o[8];
  float lse[4];
  ASSERT_EQ(f.attention->forward(o, lse, q, k, v, pass_of(spec(4, 2, 64, 0, true))), cudaSuccess);
  EXPECT_EQ(f.scenario.executed_engine, 3);
}

TEST(CudnnSdpaPlans, TheFallbackListIsTriedAfterModeA) {
  FakeFixture f(1 << 20);
  f.scenario.mode_a = {{.nondeterministic = true}};
  f.scenario.fallback = {{.plan_refused = true}, {}};
  ASSERT_TRUE(f.attention->prepare(spec(2, 2, 128, 33, false)).is_ok());
  const kernels::AttentionShape pass = pass_of(spec(2, 2, 128, 33, false));
  f.attention->set_bf16(false);
  std::uint16_t q[8], k[8], v[8], o[8];
  float lse[4];
  ASSERT_EQ(f.attention->forward(o, lse, q, k, v, pass), cudaSuccess)
      << f.attention->take_error().to_string();
  EXPECT_EQ(f.scenario.executed_engine, 1001);
}

TEST(CudnnSdpaPlans, ASpecNoEngineTakesIsRefusedNamingEachEngineAndTriedOnce) {
  FakeFixture f(4096);
  f.scenario.mode_a = {{.nondeterministic = true}, {.workspace = 8192}};
  f.scenario.fallback = {{.plan_refused = true}};
  const Status s = f.attention->prepare(spec(4, 4, 64, 0, true));
  ASSERT_FALSE(s.is_ok());
  const std::string m = s.to_string();
  EXPECT_NE(m.find("no cuDNN engine runs the forward attention graph here"), std::string::npos)
      << m;
  EXPECT_NE(m.find("mode A: engine 0: nondeterministic"), std::string::npos) << m;
  EXPECT_NE(m.find("mode A: engine 1: needs 8192 bytes of workspace, 4096 lent"), std::string::npos)
      << m;
  EXPECT_NE(m.find("fallback: engine 0: CUDNN_STATUS_NOT_SUPPORTED: no kernel for this "
                   "configuration"),
            std::string::npos)
      << m;
  const int graphs = f.scenario.graphs_finalized;
  EXPECT_EQ(f.attention->prepare(spec(4, 4, 64, 0, true)).to_string(), m);
  EXPECT_EQ(f.scenario.graphs_finalized, graphs);  // kept, not tried again
}

TEST(CudnnSdpaPlans, ACallPassesItsTensorsByUidTheScalarsByValueAndTheLentWorkspace) {
  FakeFixture f(1 << 20);
  f.scenario.mode_a = {{}};
  const cuda::SdpaSpec s = spec(4, 2, 64, 17, true);
  ASSERT_TRUE(f.attention->prepare(s).is_ok());
  kernels::AttentionShape pass = pass_of(s);
  std::uint16_t q[8], k[8], v[8], o[8], dq[8], dk[8], dv[8], d_o[8];
  float lse[4], delta[4];
  ASSERT_EQ(f.attention->backward(dq, dk, dv, delta, d_o, o, lse, q, k, v, pass), cudaSuccess);
  EXPECT_EQ(f.scenario.stream, FakeFixture::kStream);
  EXPECT_EQ(f.scenario.workspace, static_cast<void*>(f.workspace));
  // Q, K, V, O, stats, dO, dQ, dK, dV, the softmax sum; then the scalars by value: the scale,
  // 1, -inf (both masks select it) and the window's width.
  const std::vector<void*> tensors = {q, k, v, o, lse, d_o, dq, dk, dv, delta};
  ASSERT_GE(f.scenario.uids.size(), tensors.size());
  ASSERT_EQ(f.scenario.uids.size(), f.scenario.pointers.size());
  std::map<float, int> scalars;
  for (std::size_t i = 0; i < f.scenario.uids.size(); ++i) {
    if (i < tensors.size()) {
      EXPECT_EQ(f.scenario.uids[i], static_cast<std::int64_t>(i) + 1);
      EXPECT_EQ(f.scenario.pointers[i], tensors[i]) << "uid " << f.scenario.uids[i];
    } else {
      float value = 0.0f;
      std::memcpy(&value, f.scenario.pointers[i], sizeof(value));
      ++scalars[value];
    }
  }
  EXPECT_EQ(scalars[s.scale], 1);
  EXPECT_EQ(scalars[1.0f], 1);
  EXPECT_EQ(scalars[17.0f], 1);
  EXPECT_EQ(scalars[-std::numeric_limits<float>::infinity()], 1);
  // A shape never prepared: refused, naming it.
  pass.seq_len = 64;
  EXPECT_EQ(f.attention->forward(o, lse, q, k, v, pass), cudaErrorUnknown);
  EXPECT_NE(f.attention->take_error().to_string().find("seq_len 64"), std::string::npos);
}

#else

TEST(CudnnSdpaGraph, EveryNodeFinalizesForEachVariant) {
  GTEST_SKIP() << "built without cuDNN's headers (CUDA off, or cudnn_graph.h not found)";
}

#endif

}  // namespace
}  // namespace strata

// The CUDA backend's fast paths (backend/fast_path.h) on a GPU: with bf16 or fp16 GEMMs the
// tensor-core flash attention passes its start-up check for every head size and the backend's own
// attention ops then run it (their outputs are 16-bit values, widened) within the check's bounds;
// a call cut into passes of batch rows gives the bits of one pass; the test seam turns the path off
// with the fp32 kernels running instead; fp32 GEMMs leave it off. The bias epilogue
// (gemm_bias_epilogue) is on in every GEMM precision, the backend's gemm_bias meets the check's
// bound with it and, turned off by the seam, without it. cuDNN's fused attention
// (cudnn_attention) is listed on or off with why (printed: it depends on the libcudnn found);
// where on, the ops run it within the same bounds, packed documents go to the flash kernels, the
// same call twice gives the same bits, and the seam turns it off with flash still on. The fused
// residual + norm (fused_residual_norm) is on, and the ops' add_layernorm_forward and
// add_rmsnorm_forward give the bits of add followed by the norm; turned off by the seam, the same.
// The activations only GEMMs read kept in 16 bits alone (activations_16bit_alone) are on with
// 16-bit GEMMs and pass their check again through the backend's own ops; so do the Llama family's
// gate and up in 16 bits alone (gate_up_16bit), and each block's attention output in 16 bits alone
// (attention_16bit_alone). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "backend/alone_check.h"
#include "backend/apart_check.h"
#include "backend/attention_alone_check.h"
#include "backend/attention_check.h"
#include "backend/fast_path.h"
#include "backend/gate_up_check.h"
#include "backend/gelu_check.h"
#include "backend/gemm_check.h"
#include "backend/logits_check.h"
#include "backend/norm_check.h"
#include "backend/norm_grad_check.h"
#include "backend/qkv_alone_check.h"
#include "backend/rope_check.h"
#include "kernels/cpu/float16.h"
#include "support/gpu_support.h"
#include "support/residual_norm_support.h"

namespace strata::backend {
namespace {

using cuda::GemmPrecision;

CudaBackendOptions with(GemmPrecision precision) {
  CudaBackendOptions options;
  options.gemm_precision = precision;
  return options;
}

// By value: fast_paths() returns a fresh vector, so a pointer into it would dangle.
std::optional<FastPath> find_path(const std::vector<FastPath>& paths, const std::string& name) {
  for (const FastPath& p : paths)
    if (p.name == name) return p;
  return std::nullopt;
}

// The backend's own attention ops as an AttentionPath (each call waits for the stream).
AttentionPath ops_path(Backend& gpu) {
  AttentionPath path;
  path.forward = [&gpu](float* out, float* lse, const float* q, const float* k, const float* v,
                        const AttentionShape& s) {
    gpu.ops_f32().attention_forward(out, lse, q, k, v, s);
    return gpu.synchronize(StreamKind::kCompute);
  };
  path.backward = [&gpu](float* dq, float* dk, float* dv, const float* dout, const float* out,
                         const float* lse, const float* q, const float* k, const float* v,
                         const AttentionShape& s) {
    gpu.ops_f32().attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s);
    return gpu.synchronize(StreamKind::kCompute);
  };
  return path;
}

// Runs the ops' forward on fp32 inputs that are NOT 16-bit values; returns out.
std::vector<float> forward_out(Backend& gpu, const AttentionShape& shape_in, std::uint64_t seed) {
  AttentionShape s = shape_in;
  const std::int64_t rows = s.batch * s.seq_len;
  const std::vector<float> qkv =
      testing::random_floats(static_cast<std::size_t>(rows * s.q_stride), seed);
  auto dq = gpu.allocate_device(qkv.size() * 4, "test qkv");
  auto dout = gpu.allocate_device(static_cast<std::uint64_t>(rows * s.out_stride) * 4, "test out");
  auto dlse = gpu.allocate_device(static_cast<std::uint64_t>(rows * s.heads) * 4, "test lse");
  EXPECT_TRUE(dq.is_ok() && dout.is_ok() && dlse.is_ok());
  EXPECT_TRUE(gpu.copy_async(StreamKind::kCompute, dq->data(), qkv.data(), qkv.size() * 4).is_ok());
  const float* q = dq->as<float>();
  const std::int64_t hd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
  gpu.ops_f32().attention_forward(dout->as<float>(), dlse->as<float>(), q, q + hd, q + hd + kvd, s);
  std::vector<float> out(static_cast<std::size_t>(rows * s.out_stride));
  EXPECT_TRUE(
      gpu.copy_async(StreamKind::kCompute, out.data(), dout->data(), out.size() * 4).is_ok());
  EXPECT_TRUE(gpu.synchronize(StreamKind::kCompute).is_ok());
  return out;
}

AttentionShape gpt2_like(std::int64_t batch) {
  AttentionShape s;
  s.batch = batch;
  s.seq_len = 256;
  s.heads = 8;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.q_stride = s.kv_stride = (s.heads + 2 * s.kv_heads) * s.head_dim;
  s.out_stride = s.heads * s.head_dim;
  s.scale = 0.125;
  return s;
}

bool all_bf16_values(const std::vector<float>& v) {
  for (float x : v)
    if (kernels::bf16_to_float(kernels::float_to_bf16(x)) != x) return false;
  return true;
}

// cuBLASLt reads a noted weight from its 16-bit copy (the start-up check passed), in bf16 and
// fp16; with fp32 GEMM inputs the path does not apply.
TEST(CudaFastPaths, WeightsInSixteenBitsAreOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kWeights16Name);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  const std::optional<FastPath> path = find_path(fp32.fast_paths(), kWeights16Name);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
}

// GEMMs read activations from the 16-bit companions the kernels wrote beside them (the start-up
// check passed), in bf16 and fp16; with fp32 GEMM inputs the path does not apply.
TEST(CudaFastPaths, ActivationCompanionsAreOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kActivations16Name);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  const std::optional<FastPath> path = find_path(fp32.fast_paths(), kActivations16Name);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
}

// The activations only GEMMs read kept in 16 bits alone (the start-up check passed) with 16-bit
// GEMMs, whose companions they need; the check passes again on the backend's own Ops (with
// cuBLASLt's GELU epilogue on where its check passed: gemm_bias_gelu must leave it for an
// activation kept alone, whose key has nothing behind it; the norms with the residual add fused
// where that path is on), counting 7 writes kept alone for each of its 2 shapes; with fp32 GEMM
// inputs the path does not apply.
TEST(CudaFastPaths, ActivationsKeptAloneAreOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kActivations16AloneName);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    const std::optional<FastPath> gelu = find_path(gpu.fast_paths(), kGemmBiasGeluName);
    std::printf("%s: %s (%s)\n", kGemmBiasGeluName, gelu && gelu->active ? "on" : "off",
                gelu ? gelu->detail.c_str() : "not listed");
    Ops<float>& ops = gpu.ops_f32();
    // Every product reads the activation kept alone from its companion: the backend's own check
    // asked the GEMM engine at start.
    const NarrowAlonePath alone = ops_alone_path(
        ops, [](const float*, std::int64_t) { return true; },
        [&] { return gpu.synchronize(StreamKind::kCompute); });
    const std::int64_t before = path->uses;
    const Status s = check_narrow_alone(gpu, alone);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(find_path(gpu.fast_paths(), kActivations16AloneName)->uses - before, 14);
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  const std::optional<FastPath> path = find_path(fp32.fast_paths(), kActivations16AloneName);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
}

// Each block's attention output kept in 16 bits alone (the start-up check passed) with 16-bit
// GEMMs and the flash attention, whose companion and epilogue it needs; the check passes again on
// the backend's own Ops (cuDNN's attention taking the calls where that path is on, the flash
// kernels otherwise) at head sizes 64 and 128, counting one forward kept alone for each; so does
// its gradient's (attention_grad_16bit: cuBLASLt writing the product's D in 16 bits, within 1 unit
// in the last place), counting two backwards reading it for each; with fp32 GEMM inputs neither
// path applies.
TEST(CudaFastPaths, AttentionOutputsKeptAloneAreOnWithTheFlashAttention) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kAttentionAloneName);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    const AttentionAlonePath attention = ops_attention_alone_path(
        gpu.ops_f32(), [](const float*, std::int64_t) { return true; },
        [&] { return gpu.synchronize(StreamKind::kCompute); });
    const std::int64_t before = path->uses;
    for (const std::int64_t head_dim : {64, 128}) {
      const Status s = check_attention_alone(gpu, attention, head_dim);
      EXPECT_TRUE(s.is_ok()) << head_dim << ": " << s.to_string();
    }
    EXPECT_EQ(find_path(gpu.fast_paths(), kAttentionAloneName)->uses - before, 2);
    // The gradient kept alone too: 2 products kept alone (both layouts) for each head size.
    const std::optional<FastPath> grad = find_path(gpu.fast_paths(), kAttentionGradAloneName);
    ASSERT_TRUE(grad.has_value());
    EXPECT_TRUE(grad->active) << grad->detail;
    for (const std::int64_t head_dim : {64, 128}) {
      const Status s = check_attention_grad_alone(gpu, attention, head_dim);
      EXPECT_TRUE(s.is_ok()) << head_dim << ": " << s.to_string();
    }
    EXPECT_EQ(find_path(gpu.fast_paths(), kAttentionGradAloneName)->uses - grad->uses, 4);
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  for (const char* name : {kAttentionAloneName, kAttentionGradAloneName}) {
    const std::optional<FastPath> path = find_path(fp32.fast_paths(), name);
    ASSERT_TRUE(path.has_value()) << name;
    EXPECT_FALSE(path->active) << name;
    EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
  }
}

// GPT-2's MLP pre-activation in 16 bits (the start-up check passed) with 16-bit GEMMs: the check
// passes again on the backend's own Ops (cuBLASLt's bias epilogue writing the product's D in 16
// bits, within 1 unit in the last place), counting 2 GELU calls for each of its 2 shapes. With fp32
// GEMM inputs it does not apply.
TEST(CudaFastPaths, GeluInputIn16BitsIsOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kGelu16Name);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    const NarrowGeluPath gelu =
        ops_gelu_path(gpu.ops_f32(), [&] { return gpu.synchronize(StreamKind::kCompute); });
    const Status s = check_narrow_gelu(gpu, gelu);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(find_path(gpu.fast_paths(), kGelu16Name)->uses - path->uses, 4);
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  const std::optional<FastPath> path = find_path(fp32.fast_paths(), kGelu16Name);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
}

// GPT-2's MLP with GELU and its gradient back in the product's epilogue with 16-bit outputs
// (cuBLASLt's GELU_AUX_BIAS and DGELU with a 16-bit D and aux): listed with 16-bit GEMMs, on where
// their start-up checks (against the product in double, with the 16-bit type's resolution as room)
// passed on this GPU, off with the reason otherwise; printed either way (whether cuBLASLt's GELU
// is close enough to the tanh form is for this GPU to say, as for the fp32 epilogues). With fp32
// GEMM inputs neither applies. Their uses at the real shapes show in `bench step --json`
// (tools/gpu_checks.sh --bench).
TEST(CudaFastPaths, GeluEpiloguesIn16BitsAreListedWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    for (const char* name : {kGemmBiasGelu16Name, kGemmDgelu16Name}) {
      const std::optional<FastPath> path = find_path(gpu.fast_paths(), name);
      ASSERT_TRUE(path.has_value()) << name;
      std::printf("fast path %s (%s): %s: %s\n", name, cuda::to_string(precision),
                  path->active ? "on" : "off", path->detail.c_str());
      EXPECT_FALSE(path->detail.empty()) << name;
    }
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  for (const char* name : {kGemmBiasGelu16Name, kGemmDgelu16Name}) {
    const std::optional<FastPath> path = find_path(fp32.fast_paths(), name);
    ASSERT_TRUE(path.has_value()) << name;
    EXPECT_FALSE(path->active) << name;
  }
}

// The Llama family's gate and up in 16 bits alone (the start-up check passed) with 16-bit GEMMs,
// whose weights' and activations' paths it needs; the check passes again on the backend's own
// Ops, counting 2 SwiGLU calls for each of its 2 shapes; so does the check of SwiGLU's output
// gradient kept alone (swiglu_grad_16bit: cuBLASLt writing the product's D in 16 bits, within 1
// unit in the last place), counting one backward reading it for each shape. With fp32 GEMM inputs
// neither path applies.
TEST(CudaFastPaths, GateAndUpIn16BitsAreOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kGateUp16Name);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    Ops<float>& ops = gpu.ops_f32();
    const NarrowGateUpPath gate_up =
        ops_gate_up_path(ops, [&] { return gpu.synchronize(StreamKind::kCompute); });
    const std::int64_t before = path->uses;
    const Status s = check_narrow_gate_up(gpu, gate_up);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(find_path(gpu.fast_paths(), kGateUp16Name)->uses - before, 4);
    const std::optional<FastPath> grad = find_path(gpu.fast_paths(), kSwigluGradAloneName);
    ASSERT_TRUE(grad.has_value());
    EXPECT_TRUE(grad->active) << grad->detail;
    const SwigluGradAlonePath swiglu_grad =
        ops_swiglu_grad_path(ops, [&] { return gpu.synchronize(StreamKind::kCompute); });
    const Status g = check_swiglu_grad_alone(gpu, swiglu_grad);
    EXPECT_TRUE(g.is_ok()) << g.to_string();
    EXPECT_EQ(find_path(gpu.fast_paths(), kSwigluGradAloneName)->uses - grad->uses, 2);
    // The gradient of gate and up kept alone: SwiGLU's backward writes it alone once per shape.
    const std::optional<FastPath> alone = find_path(gpu.fast_paths(), kGateUpGradAloneName);
    ASSERT_TRUE(alone.has_value());
    EXPECT_TRUE(alone->active) << alone->detail;
    const GateUpGradAlonePath gate_up_grad = ops_gate_up_grad_path(
        ops, [](const float*, std::int64_t) { return true; },
        [&] { return gpu.synchronize(StreamKind::kCompute); });
    const Status a = check_gate_up_grad_alone(gpu, gate_up_grad);
    EXPECT_TRUE(a.is_ok()) << a.to_string();
    EXPECT_EQ(find_path(gpu.fast_paths(), kGateUpGradAloneName)->uses - alone->uses, 2);
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  for (const char* name : {kGateUp16Name, kSwigluGradAloneName, kGateUpGradAloneName}) {
    const std::optional<FastPath> path = find_path(fp32.fast_paths(), name);
    ASSERT_TRUE(path.has_value()) << name;
    EXPECT_FALSE(path->active) << name;
    EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
  }
}

// The gradient of the blocks' norm outputs kept in 16 bits alone (the start-up check passed) with
// 16-bit GEMMs, whose activations' path it needs; the check passes again on the backend's own Ops
// (cuBLASLt writing the products' D in 16 bits, within 1 unit in the last place), counting 2 norm
// backwards reading it for each layout on each of its 2 shapes; with fp32 GEMM inputs the path
// does not apply.
TEST(CudaFastPaths, NormGradientsKeptAloneAreOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kNormGradAloneName);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    const NormGradAlonePath norm_grad =
        ops_norm_grad_path(gpu.ops_f32(), [&] { return gpu.synchronize(StreamKind::kCompute); });
    const Status s = check_norm_grad_alone(gpu, norm_grad);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(find_path(gpu.fast_paths(), kNormGradAloneName)->uses - path->uses, 8);
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  const std::optional<FastPath> path = find_path(fp32.fast_paths(), kNormGradAloneName);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
}

// The gradient of q, k and v kept in 16 bits alone (the start-up check passed) with 16-bit GEMMs,
// whose activations' path it needs, and RoPE in the attention's staging, whose widening writes it;
// the check passes again on the backend's own Ops at head sizes 64 and 128, counting one backward
// writing it alone for each of its 3 cases (two rotated, one not, with GPT-2's bias sums); so does
// q, k and v's (qkv_16bit), counting a forward and a backward reading them alone for each of its 3
// cases (two with the projection's bias, cuBLASLt's bias epilogue writing a 16-bit D or the
// fallback kernel adding it). With fp32 GEMM inputs neither path applies.
TEST(CudaFastPaths, QkvGradientsKeptAloneAreOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kQkvGradAloneName);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    const QkvAlonePath qkv_grad = ops_qkv_alone_path(
        gpu.ops_f32(), [](const float*, std::int64_t) { return true; },
        [&] { return gpu.synchronize(StreamKind::kCompute); });
    for (const std::int64_t head_dim : {64, 128}) {
      const Status s = check_qkv_grad_alone(gpu, qkv_grad, head_dim);
      EXPECT_TRUE(s.is_ok()) << head_dim << ": " << s.to_string();
    }
    EXPECT_EQ(find_path(gpu.fast_paths(), kQkvGradAloneName)->uses - path->uses, 6);
    // q, k and v kept alone: cuBLASLt writing the product's D in 16 bits (within 1 unit in the last
    // place; with the bias in two cases), then the forward and backward reading them, for each of
    // the 3 cases.
    const std::optional<FastPath> qkv = find_path(gpu.fast_paths(), kQkvAloneName);
    ASSERT_TRUE(qkv.has_value());
    EXPECT_TRUE(qkv->active) << qkv->detail;
    for (const std::int64_t head_dim : {64, 128}) {
      const Status s = check_qkv_alone(gpu, qkv_grad, head_dim);
      EXPECT_TRUE(s.is_ok()) << head_dim << ": " << s.to_string();
    }
    EXPECT_EQ(find_path(gpu.fast_paths(), kQkvAloneName)->uses - qkv->uses, 12);
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  for (const char* name : {kQkvGradAloneName, kQkvAloneName}) {
    const std::optional<FastPath> path = find_path(fp32.fast_paths(), name);
    ASSERT_TRUE(path.has_value()) << name;
    EXPECT_FALSE(path->active) << name;
    EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
  }
}

// The norm weights and biases kept apart (the start-up check passed) with 16-bit GEMMs, whose
// weights' path it needs; the check passes again on the backend's own ops, counting the
// parameters it read from the area apart; with fp32 GEMM inputs the path does not apply.
TEST(CudaFastPaths, ParametersKeptApartAreOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kKeptApartName);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    KeptApartPath apart;
    apart.note = [&](const float* wide, const float* kept, const std::int64_t* begin,
                     const std::int64_t* n, const std::int64_t* at, int count) {
      return gpu.ops_f32().note_kept_apart(wide, kept, begin, n, at, count);
    };
    apart.forget = [&](const float* wide) { gpu.ops_f32().forget_widened(wide); };
    const std::int64_t before = path->uses;
    const Status s = check_kept_apart(gpu, apart);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    // LayerNorm's weight and bias, RMSNorm's weight, the product's bias.
    EXPECT_EQ(find_path(gpu.fast_paths(), kKeptApartName)->uses - before, 4);
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  const std::optional<FastPath> path = find_path(fp32.fast_paths(), kKeptApartName);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
}

// The head's logits in 16 bits: on with bf16 and fp16 GEMM inputs (its check passed at start);
// its check passes again through the backend's own ops, whose cross-entropy counts the rows it
// read in 16 bits (6 rows, twice). Not applicable with fp32 GEMMs.
TEST(CudaFastPaths, LogitsIn16BitsAreOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kLogits16Name);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    Ops<float>& ops = gpu.ops_f32();
    ASSERT_TRUE(ops.logits_in_narrow());
    NarrowLogitsPath logits;
    logits.type = precision == GemmPrecision::kBf16 ? DType::kBF16 : DType::kF16;
    logits.to_narrow = [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                           const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                           void* c, std::int64_t ldc) {
      ops.gemm_to_narrow(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
      return Status::ok();  // errors reach the check's synchronize
    };
    logits.from_narrow = [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                             float alpha, const void* a, std::int64_t lda, const float* b,
                             std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
      ops.gemm_from_narrow(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return Status::ok();
    };
    logits.cross_entropy = [&](bool gradient, void* x, std::int64_t ld, float* losses,
                               const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                               double grad_scale) {
      ops.cross_entropy_narrow(gradient, x, ld, losses, targets, rows, vocab, grad_scale);
      return Status::ok();
    };
    const std::int64_t before = path->uses;
    const Status s = check_narrow_logits(gpu, logits);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(find_path(gpu.fast_paths(), kLogits16Name)->uses - before, 12);
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  const std::optional<FastPath> path = find_path(fp32.fast_paths(), kLogits16Name);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_FALSE(fp32.ops_f32().logits_in_narrow());
  EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
}

// RoPE in the attention's staging: on with 16-bit GEMMs (the flash attention on; its check passed
// at start); its check passes again through the backend's own ops (the rope op, then attention,
// against attention_*_rotated), which count the rotated calls (2 cases, forward and backward), at
// head sizes 64 and 128. cuDNN's attention is refused, so both run the flash kernels (cuDNN's
// backward need not give the same bits twice). Not applicable with fp32 GEMMs (no flash attention).
TEST(CudaFastPaths, RopeInTheAttentionsStagingIsOnWith16BitGemms) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    fail_fast_path_for_test("cudnn");
    auto made = testing::make_gpu_backend(with(precision));
    fail_fast_path_for_test(std::nullopt);
    if (!made.backend) GTEST_SKIP() << "no GPU: " << made.skip_reason;
    Backend& gpu = *made.backend;
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kRopeAttentionName);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << path->detail;
    Ops<float>& ops = gpu.ops_f32();
    RopeAttentionPaths rope;
    rope.rotate = [&](float* x, const RopeShape& shape, const float* cos, const float* sin) {
      ops.rope_forward(x, shape, cos, sin);
      return Status::ok();  // errors reach the check's synchronize
    };
    rope.rotate_back = [&](float* x, const RopeShape& shape, const float* cos, const float* sin) {
      ops.rope_backward(x, shape, cos, sin);
      return Status::ok();
    };
    rope.attention.forward = [&](float* out, float* lse, const float* q, const float* k,
                                 const float* v, const AttentionShape& shape) {
      ops.attention_forward(out, lse, q, k, v, shape);
      return Status::ok();
    };
    rope.attention.backward = [&](float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v, const AttentionShape& shape) {
      ops.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, shape);
      return Status::ok();
    };
    rope.forward_rotated = [&](float* out, float* lse, const float* q, const float* k,
                               const float* v, const AttentionShape& shape,
                               const kernels::QkRotation<float>& r) {
      EXPECT_TRUE(ops.attention_rotates(shape));
      ops.attention_forward_rotated(out, lse, q, k, v, shape, r);
      return Status::ok();
    };
    rope.backward_rotated = [&](float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q, const float* k,
                                const float* v, const AttentionShape& shape,
                                const kernels::QkRotation<float>& r) {
      ops.attention_backward_rotated(dq, dk, dv, dout, out, lse, q, k, v, shape, r);
      return Status::ok();
    };
    for (const std::int64_t head_dim : {64, 128}) {
      const std::int64_t before = find_path(gpu.fast_paths(), kRopeAttentionName)->uses;
      const Status s = check_rope_in_attention(gpu, rope, head_dim);
      EXPECT_TRUE(s.is_ok()) << head_dim << ": " << s.to_string();
      EXPECT_EQ(find_path(gpu.fast_paths(), kRopeAttentionName)->uses - before, 4);
    }
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  const std::optional<FastPath> path = find_path(fp32.fast_paths(), kRopeAttentionName);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_NE(path->detail.find("not applicable"), std::string::npos) << path->detail;
}

TEST(CudaFastPaths, FlashAttentionIsOnWithBf16GemmsForEveryHeadSize) {
  STRATA_GPU_OR_SKIP(gpu, with(GemmPrecision::kBf16));
  const std::optional<FastPath> flash = find_path(gpu.fast_paths(), kFlashAttentionName);
  ASSERT_TRUE(flash.has_value());
  EXPECT_TRUE(flash->active) << flash->detail;
  EXPECT_NE(flash->detail.find("bf16, head sizes 64, 80, 96, 128, 256;"), std::string::npos)
      << flash->detail;
  std::printf("fast path %s: %s\n", flash->name.c_str(), flash->detail.c_str());
}

TEST(CudaFastPaths, TheAttentionOpsRunFlashWithinTheCheckBounds) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const bool bf16 = precision == GemmPrecision::kBf16;
    for (const std::int64_t d : kFlashHeadSizes) {
      const Status s = check_attention_path(gpu, ops_path(gpu), bf16, d);
      EXPECT_TRUE(s.is_ok()) << (bf16 ? "bf16" : "fp16") << " head size " << d << ": "
                             << s.to_string();
    }
    if (bf16) {
      EXPECT_TRUE(all_bf16_values(forward_out(gpu, gpt2_like(2), 5)));
    }
  }
}

TEST(CudaFastPaths, PassesOfBatchRowsGiveTheBitsOfOnePass) {
  // The flash kernels' property: cuDNN's plans for other batch sizes may pick other engines.
  fail_fast_path_for_test("cudnn");
  // A 16-bit workspace of one batch row's backward (659,456 elements at this shape) against the
  // default one that holds the whole batch.
  CudaBackendOptions small = with(GemmPrecision::kBf16);
  small.gemm_workspace_bytes = 1400000;
  STRATA_GPU_OR_SKIP(one_row, small);
  STRATA_GPU_OR_SKIP(whole, with(GemmPrecision::kBf16));
  const AttentionShape s = gpt2_like(4);
  EXPECT_EQ(cuda::plan_flash_io(s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim, true,
                                1400000 / 4096 * 4096 / 2)
                .passes,
            4);
  fail_fast_path_for_test(std::nullopt);
  const std::vector<float> a = forward_out(one_row, s, 9);
  const std::vector<float> b = forward_out(whole, s, 9);
  EXPECT_TRUE(all_bf16_values(a));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(CudaFastPaths, TheTestSeamTurnsFlashOffAndTheFp32KernelsRun) {
  fail_fast_path_for_test("flash");
  auto made = testing::make_gpu_backend(with(GemmPrecision::kBf16));
  fail_fast_path_for_test(std::nullopt);
  if (!made.backend) GTEST_SKIP() << "no GPU: " << made.skip_reason;
  Backend& gpu = *made.backend;
  const std::optional<FastPath> flash = find_path(gpu.fast_paths(), kFlashAttentionName);
  ASSERT_TRUE(flash.has_value());
  EXPECT_FALSE(flash->active);
  EXPECT_NE(flash->detail.find("STRATA_TEST_FAST_PATH_FAIL"), std::string::npos) << flash->detail;
  // fp32 outputs: not all of them bf16 values.
  EXPECT_FALSE(all_bf16_values(forward_out(gpu, gpt2_like(1), 5)));
}

TEST(CudaFastPaths, Fp32GemmsLeaveFlashOff) {
  STRATA_GPU_OR_SKIP(gpu, with(GemmPrecision::kFp32));
  const std::optional<FastPath> flash = find_path(gpu.fast_paths(), kFlashAttentionName);
  ASSERT_TRUE(flash.has_value());
  EXPECT_FALSE(flash->active);
  EXPECT_NE(flash->detail.find("not applicable"), std::string::npos);
  EXPECT_FALSE(all_bf16_values(forward_out(gpu, gpt2_like(1), 5)));
}

// The backend's gemm_bias op as a GemmBiasFn: fused or not inside, C must hold product + bias.
GemmBiasFn ops_gemm_bias(Backend& gpu) {
  return [&gpu](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
                float* c) -> Result<bool> {
    gpu.ops_f32().gemm_bias(ta, tb, m, n, k, a, lda, b, ldb, bias, c);
    STRATA_TRY(gpu.synchronize(StreamKind::kCompute));
    return true;
  };
}

TEST(CudaFastPaths, TheBiasEpilogueIsOnAndTheOpsMeetItsBound) {
  for (const GemmPrecision precision :
       {GemmPrecision::kBf16, GemmPrecision::kFp16, GemmPrecision::kFp32, GemmPrecision::kTf32}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kGemmBiasName);
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(path->active) << cuda::to_string(precision) << ": " << path->detail;
    const Status s = check_gemm_bias(gpu, ops_gemm_bias(gpu), precision == GemmPrecision::kFp16);
    EXPECT_TRUE(s.is_ok()) << cuda::to_string(precision) << ": " << s.to_string();
  }
}

TEST(CudaFastPaths, TheSeamTurnsTheBiasEpilogueOffAndGemmBiasStaysRight) {
  fail_fast_path_for_test("gemm_bias");
  auto made = testing::make_gpu_backend(with(GemmPrecision::kBf16));
  fail_fast_path_for_test(std::nullopt);
  if (!made.backend) GTEST_SKIP() << "no GPU: " << made.skip_reason;
  Backend& gpu = *made.backend;
  const std::optional<FastPath> path = find_path(gpu.fast_paths(), kGemmBiasName);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  EXPECT_TRUE(find_path(gpu.fast_paths(), kFlashAttentionName)->active);
  const Status s = check_gemm_bias(gpu, ops_gemm_bias(gpu), false);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(CudaFastPaths, TheGeluEpilogueIsOnWith16BitGemmsAndTheOpsMeetItsBound) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kGemmBiasGeluName);
    ASSERT_TRUE(path.has_value());
    // On, or off with the reason printed: cuBLASLt's GELU must be the tanh form within half the
    // next GEMM's rounding; the ops must be right either way.
    std::printf("fast path %s (%s): %s: %s\n", path->name.c_str(), cuda::to_string(precision),
                path->active ? "on" : "off", path->detail.c_str());
    const Status s = check_gemm_bias_gelu(
        gpu,
        [&gpu](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
               std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, float* pre,
               float* act) -> Result<bool> {
          gpu.ops_f32().gemm_bias_gelu(ta, tb, m, n, k, a, lda, b, ldb, bias, pre, act);
          STRATA_TRY(gpu.synchronize(StreamKind::kCompute));
          return true;
        },
        precision == GemmPrecision::kFp16);
    EXPECT_TRUE(s.is_ok()) << cuda::to_string(precision) << ": " << s.to_string();
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  EXPECT_FALSE(find_path(fp32.fast_paths(), kGemmBiasGeluName)->active);
}

// The residual add in the product giving each block's output (gemm_residual_epilogue): listed in
// every GEMM precision, printed on or off with the reason, and the ops' gemm_residual (with and
// without a bias) meets the check's bound either way.
TEST(CudaFastPaths, TheResidualEpilogueIsListedAndTheOpsMeetItsBoundEitherWay) {
  for (const GemmPrecision precision :
       {GemmPrecision::kFp32, GemmPrecision::kTf32, GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kGemmResidualName);
    ASSERT_TRUE(path.has_value());
    std::printf("fast path %s (%s): %s: %s\n", path->name.c_str(), cuda::to_string(precision),
                path->active ? "on" : "off", path->detail.c_str());
    const Status s = check_gemm_residual(
        gpu,
        [&gpu](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
               std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
               const float* residual, float* c) -> Result<bool> {
          gpu.ops_f32().gemm_residual(ta, tb, m, n, k, a, lda, b, ldb, bias, residual, c);
          STRATA_TRY(gpu.synchronize(StreamKind::kCompute));
          return true;
        },
        precision == GemmPrecision::kFp16);
    EXPECT_TRUE(s.is_ok()) << cuda::to_string(precision) << ": " << s.to_string();
  }
}

TEST(CudaFastPaths, TheDgeluEpilogueIsListedAndTheOpsMeetItsBoundEitherWay) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const std::optional<FastPath> path = find_path(gpu.fast_paths(), kGemmDgeluName);
    ASSERT_TRUE(path.has_value());
    std::printf("fast path %s (%s): %s: %s\n", path->name.c_str(), cuda::to_string(precision),
                path->active ? "on" : "off", path->detail.c_str());
    const Status s = check_gemm_dgelu(
        gpu,
        [&gpu](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
               std::int64_t lda, const float* b, std::int64_t ldb, const float* pre,
               float* dpre) -> Result<bool> {
          STRATA_ASSIGN_OR_RETURN(
              Buffer scratch,
              gpu.allocate_device(static_cast<std::uint64_t>(m * n) * 4, "test dgelu scratch"));
          gpu.ops_f32().gemm_dgelu(ta, tb, m, n, k, a, lda, b, ldb, pre, scratch.as<float>(), dpre);
          STRATA_TRY(gpu.synchronize(StreamKind::kCompute));
          return true;
        },
        precision == GemmPrecision::kFp16);
    EXPECT_TRUE(s.is_ok()) << cuda::to_string(precision) << ": " << s.to_string();
  }
  STRATA_GPU_OR_SKIP(fp32, with(GemmPrecision::kFp32));
  EXPECT_FALSE(find_path(fp32.fast_paths(), kGemmDgeluName)->active);
}

TEST(CudaFastPaths, CudnnAttentionRunsWithinTheCheckBoundsWhereItIsOn) {
  for (const GemmPrecision precision : {GemmPrecision::kBf16, GemmPrecision::kFp16}) {
    STRATA_GPU_OR_SKIP(gpu, with(precision));
    const bool bf16 = precision == GemmPrecision::kBf16;
    const std::optional<FastPath> cudnn = find_path(gpu.fast_paths(), kCudnnAttentionName);
    ASSERT_TRUE(cudnn.has_value());
    std::printf("fast path %s (%s): %s: %s\n", cudnn->name.c_str(), bf16 ? "bf16" : "fp16",
                cudnn->active ? "on" : "off", cudnn->detail.c_str());
    if (!cudnn->active) continue;
    const std::optional<FastPath> flash = find_path(gpu.fast_paths(), kFlashAttentionName);
    ASSERT_TRUE(flash.has_value() && flash->active);
    const std::int64_t cudnn_before = find_path(gpu.fast_paths(), kCudnnAttentionName)->uses;
    const std::int64_t flash_before = find_path(gpu.fast_paths(), kFlashAttentionName)->uses;
    for (const std::int64_t d : kFlashHeadSizes) {
      const Status s = check_attention_path(gpu, ops_path(gpu), bf16, d);  // with documents
      EXPECT_TRUE(s.is_ok()) << (bf16 ? "bf16" : "fp16") << " head size " << d << ": "
                             << s.to_string();
    }
    // Each head size: the windowed case (and, where cuDNN is on for it, the unpacked GQA one)
    // through cuDNN; the packed documents through flash.
    EXPECT_GT(find_path(gpu.fast_paths(), kCudnnAttentionName)->uses, cudnn_before);
    EXPECT_GE(find_path(gpu.fast_paths(), kFlashAttentionName)->uses - flash_before,
              2 * static_cast<std::int64_t>(std::size(kFlashHeadSizes)));
    // The same call twice: the same bits.
    const std::vector<float> a = forward_out(gpu, gpt2_like(2), 5);
    const std::vector<float> b = forward_out(gpu, gpt2_like(2), 5);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  }
}

TEST(CudaFastPaths, TheSeamTurnsCudnnOffAndFlashStaysOn) {
  fail_fast_path_for_test("cudnn");
  auto made = testing::make_gpu_backend(with(GemmPrecision::kBf16));
  fail_fast_path_for_test(std::nullopt);
  if (!made.backend) GTEST_SKIP() << "no GPU: " << made.skip_reason;
  Backend& gpu = *made.backend;
  const std::optional<FastPath> cudnn = find_path(gpu.fast_paths(), kCudnnAttentionName);
  ASSERT_TRUE(cudnn.has_value());
  EXPECT_FALSE(cudnn->active);
  std::printf("fast path %s with the seam: %s\n", cudnn->name.c_str(), cudnn->detail.c_str());
  EXPECT_TRUE(find_path(gpu.fast_paths(), kFlashAttentionName)->active);
  EXPECT_TRUE(check_attention_path(gpu, ops_path(gpu), true, 64).is_ok());
}

// The ops' fused calls against their own add and norm, bit for bit.
void expect_residual_norm_bits(Backend& gpu) {
  const Status s = check_residual_norm(gpu, testing::ops_residual_norm(gpu, false),
                                       testing::ops_residual_norm(gpu, true));
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(CudaFastPaths, TheFusedResidualNormIsOnAndGivesTheBitsOfAddThenNorm) {
  STRATA_GPU_OR_SKIP(gpu, with(GemmPrecision::kBf16));
  const std::optional<FastPath> path = find_path(gpu.fast_paths(), kResidualNormName);
  ASSERT_TRUE(path.has_value());
  EXPECT_TRUE(path->active) << path->detail;
  const std::int64_t before = find_path(gpu.fast_paths(), kResidualNormName)->uses;
  expect_residual_norm_bits(gpu);
  EXPECT_EQ(find_path(gpu.fast_paths(), kResidualNormName)->uses - before, 4);
}

TEST(CudaFastPaths, TheSeamTurnsTheFusedResidualNormOffAndTheOpsStayRight) {
  fail_fast_path_for_test("residual_norm");
  auto made = testing::make_gpu_backend(with(GemmPrecision::kFp32));
  fail_fast_path_for_test(std::nullopt);
  if (!made.backend) GTEST_SKIP() << "no GPU: " << made.skip_reason;
  Backend& gpu = *made.backend;
  const std::optional<FastPath> path = find_path(gpu.fast_paths(), kResidualNormName);
  ASSERT_TRUE(path.has_value());
  EXPECT_FALSE(path->active);
  expect_residual_norm_bits(gpu);
}

}  // namespace
}  // namespace strata::backend

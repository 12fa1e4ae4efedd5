// Where the configuration stops: each key reaches the settings of the part that acts on it, and
// a rank's NUMA-nearest NVMe paths narrow the plan's swap folders without touching the config.
#include "train/run_settings.h"

#include <gtest/gtest.h>

#include "tests/model/tiny_models.h"

namespace strata::train {
namespace {

// On a GPU the head's logits come in chunks of a 16th of the device budget, between the CPU's
// 32 MiB and 1 GiB; the CPU backend keeps 32 MiB. The plan and the runner read the same options.
TEST(RunSettings, TheLogitsChunkGrowsWithTheDeviceBudgetOnAGpuOnly) {
  constexpr std::uint64_t kMiB = 1ull << 20;
  EXPECT_EQ(gpu_logits_chunk_bytes(0), 1024 * kMiB);  // the GPU's free memory
  EXPECT_EQ(gpu_logits_chunk_bytes(8 * kMiB), 32 * kMiB);
  EXPECT_EQ(gpu_logits_chunk_bytes(4096 * kMiB), 256 * kMiB);
  EXPECT_EQ(gpu_logits_chunk_bytes(80ull << 30), 1024 * kMiB);
  config::Config c;
  c.strata.device_bytes_max = 4096 * kMiB;
  model::ModelShape shape;
  shape.max_seq_len = 1024;
  EXPECT_EQ(runner_options(c, shape, true).logits_chunk_bytes, 32 * kMiB);
  EXPECT_EQ(runner_options(c, shape, false).logits_chunk_bytes, 256 * kMiB);
}

// The activations' 16-bit companions (Ops::pair_narrow) are planned for a GPU whose GEMMs take
// 16-bit inputs, and counted by the runner's memory: 2 bytes per element of each paired buffer.
TEST(RunSettings, ActivationCompanionsArePlannedAndCountedForSixteenBitGemmsOnAGpu) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  const model::ModelShape shape = testing::tiny_gpt2(false);
  EXPECT_FALSE(runner_options(c, shape, false).narrow_companions) << "fp32";
  c.bf16.enabled = true;
  EXPECT_TRUE(runner_options(c, shape, false).narrow_companions);
  EXPECT_FALSE(runner_options(c, shape, true).narrow_companions) << "the CPU backend";
  c.strata.gemm_precision = config::GemmPrecision::kFp32;
  EXPECT_FALSE(runner_options(c, shape, false).narrow_companions) << "fp32 GEMM inputs";
  c.strata.gemm_precision = config::GemmPrecision::kAuto;

  model::RunnerOptions with = runner_options(c, shape, false), without = with;
  without.narrow_companions = false;
  const std::uint64_t more = model::ModelRunner<float>::memory_needed(shape, with).device_bytes -
                             model::ModelRunner<float>::memory_needed(shape, without).device_bytes;
  // Per layer ln1, att, ln2 (N x C each) and act (N x I); dfc (N x I), dqkv (N x 3C), two
  // residual gradients and the final norm (N x C each); the logits chunk (all N rows here).
  const auto n = static_cast<std::uint64_t>(2 * 16),
             cc = static_cast<std::uint64_t>(shape.hidden_size);
  const auto in = static_cast<std::uint64_t>(shape.intermediate_size);
  const auto v = static_cast<std::uint64_t>(shape.vocab_size);
  const auto layers = static_cast<std::uint64_t>(shape.num_layers);
  auto granule = [](std::uint64_t elements) { return (elements * 2 + 255) / 256 * 256; };
  const std::uint64_t want = layers * (3 * granule(n * cc) + granule(n * in)) + granule(n * in) +
                             granule(n * 3 * cc) + 3 * granule(n * cc) + granule(n * v);
  EXPECT_EQ(more, want);
}

// The head's logits in 16 bits alone (RunnerOptions::narrow_logits, which the trainer asks of the
// backend's ops) are counted as such: the fp32 chunk and its companion give way to 2 bytes per
// logit in rows padded to 8 elements. The settings alone leave it off (they cannot know whether the
// backend took the path), and without the companions it counts nothing.
TEST(RunSettings, LogitsIn16BitsAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  const model::ModelShape shape = testing::tiny_gpt2(false);
  const model::RunnerOptions with = runner_options(c, shape, false);
  ASSERT_TRUE(with.narrow_companions);
  EXPECT_FALSE(with.narrow_logits);
  model::RunnerOptions narrow = with;
  narrow.narrow_logits = true;
  auto device = [&](const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  const auto n = static_cast<std::uint64_t>(2 * 16);  // every row in one chunk
  const auto v = static_cast<std::uint64_t>(shape.vocab_size);
  const std::uint64_t ld = (v + 7) / 8 * 8;
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  EXPECT_EQ(device(with) - device(narrow),
            granule(n * v * 4) + granule(n * v * 2) - granule(n * ld * 2));
  model::RunnerOptions plain = with, plain_narrow = with;
  plain.narrow_companions = plain_narrow.narrow_companions = false;
  plain_narrow.narrow_logits = true;
  EXPECT_EQ(device(plain_narrow), device(plain));
  EXPECT_FALSE(model::without_companions(shape, narrow).options.narrow_logits);
}

// The activations only GEMMs read in 16 bits alone (RunnerOptions::narrow_alone, which the trainer
// asks of the backend's ops) are counted as such: each block's fp32 ln1, ln2 and act go, their
// companions stay; with activation checkpointing, the one set of activations' arrays. The settings
// alone leave it off, and without the companions it counts nothing.
TEST(RunSettings, ActivationsIn16BitsAloneAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  for (const model::ModelShape& shape : {testing::tiny_gpt2(false), testing::tiny_llama(true)}) {
    const model::RunnerOptions with = runner_options(c, shape, false);
    ASSERT_TRUE(with.narrow_companions);
    EXPECT_FALSE(with.narrow_alone);
    auto device = [&](const model::RunnerOptions& o) {
      return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
    };
    auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
    const auto n = static_cast<std::uint64_t>(2 * 16);
    const auto act = 2 * granule(n * static_cast<std::uint64_t>(shape.hidden_size) * 4) +
                     granule(n * static_cast<std::uint64_t>(shape.intermediate_size) * 4);
    model::RunnerOptions alone = with;
    alone.narrow_alone = true;
    EXPECT_EQ(device(with) - device(alone), static_cast<std::uint64_t>(shape.num_layers) * act);
    model::RunnerOptions checkpointed = with, checkpointed_alone = alone;
    checkpointed.activation_checkpointing = checkpointed_alone.activation_checkpointing = true;
    EXPECT_EQ(device(checkpointed) - device(checkpointed_alone), act);
    model::RunnerOptions plain = with, plain_alone = alone;
    plain.narrow_companions = plain_alone.narrow_companions = false;
    EXPECT_EQ(device(plain_alone), device(plain));
    EXPECT_FALSE(model::without_companions(shape, alone).options.narrow_alone);
  }
}

// Each block's attention output in 16 bits alone too (RunnerOptions::narrow_attention_alone, which
// the trainer asks of the backend's ops for every layer's shape) is counted as such: its fp32 array
// (N x H*D) is not allocated, in every block or in the one set checkpointing keeps. Only with the
// other activations kept alone, and not without the companions; the settings alone leave it off.
// Its gradient kept alone too (narrow_attention_grad) saves the fp32 scratch array for its
// companion, only with the output kept alone.
TEST(RunSettings, AttentionOutputsIn16BitsAloneAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  for (const model::ModelShape& shape : {testing::tiny_gpt2(false), testing::tiny_llama(true)}) {
    model::RunnerOptions alone = runner_options(c, shape, false);
    ASSERT_TRUE(alone.narrow_companions);
    EXPECT_FALSE(alone.narrow_attention_alone);
    alone.narrow_alone = true;
    auto device = [&](const model::RunnerOptions& o) {
      return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
    };
    auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
    const auto att =
        granule(static_cast<std::uint64_t>(2 * 16 * shape.num_heads * shape.head_dim) * 4);
    model::RunnerOptions attention = alone;
    attention.narrow_attention_alone = true;
    EXPECT_EQ(device(alone) - device(attention),
              static_cast<std::uint64_t>(shape.num_layers) * att);
    model::RunnerOptions checkpointed = alone, checkpointed_attention = attention;
    checkpointed.activation_checkpointing = checkpointed_attention.activation_checkpointing = true;
    EXPECT_EQ(device(checkpointed) - device(checkpointed_attention), att);
    model::RunnerOptions beside = attention;
    beside.narrow_alone = false;  // the pairing alone is the other activations' path
    model::RunnerOptions beside_plain = alone;
    beside_plain.narrow_alone = false;
    EXPECT_EQ(device(beside), device(beside_plain));
    model::RunnerOptions plain = attention;
    plain.narrow_companions = false;
    model::RunnerOptions plain_fp32 = alone;
    plain_fp32.narrow_companions = false;
    EXPECT_EQ(device(plain), device(plain_fp32));
    EXPECT_FALSE(model::without_companions(shape, attention).options.narrow_attention_alone);
    // Its gradient (the backward's one scratch array, N x H*D): the companion in place of the fp32
    // array, only with the output kept alone.
    EXPECT_FALSE(attention.narrow_attention_grad);
    const auto datt_elements =
        static_cast<std::uint64_t>(2 * 16 * shape.num_heads * shape.head_dim);
    model::RunnerOptions gradient = attention;
    gradient.narrow_attention_grad = true;
    EXPECT_EQ(device(attention) - device(gradient),
              granule(datt_elements * 4) - granule(datt_elements * 2));
    model::RunnerOptions gradient_only = alone;
    gradient_only.narrow_attention_grad = true;
    EXPECT_EQ(device(gradient_only), device(alone));
    EXPECT_FALSE(model::without_companions(shape, gradient).options.narrow_attention_grad);
  }
}

// GPT-2's MLP pre-activation in 16 bits (RunnerOptions::narrow_gelu, which the trainer asks of the
// backend's ops) is counted as such: 2 bytes per element of each block's fc where the fp32 fc took
// 4. Not for the Llama family (its fc is [gate | up], narrow_gate_up's), not without the
// companions; the settings alone leave it off.
TEST(RunSettings, GeluInputIn16BitsIsCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  auto device = [](const model::ModelShape& shape, const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const model::ModelShape gpt2 = testing::tiny_gpt2(false);
  const model::RunnerOptions with = runner_options(c, gpt2, false);
  ASSERT_TRUE(with.narrow_companions);
  EXPECT_FALSE(with.narrow_gelu);
  model::RunnerOptions narrow = with;
  narrow.narrow_gelu = true;
  const auto fc =
      static_cast<std::uint64_t>(2 * 16) * static_cast<std::uint64_t>(gpt2.intermediate_size);
  EXPECT_EQ(device(gpt2, with) - device(gpt2, narrow),
            static_cast<std::uint64_t>(gpt2.num_layers) * (granule(fc * 4) - granule(fc * 2)));
  const model::ModelShape llama = testing::tiny_llama(true);
  model::RunnerOptions llama_narrow = runner_options(c, llama, false);
  const std::uint64_t llama_bytes = device(llama, llama_narrow);
  llama_narrow.narrow_gelu = true;
  EXPECT_EQ(device(llama, llama_narrow), llama_bytes);
  model::RunnerOptions plain = with, plain_narrow = narrow;
  plain.narrow_companions = plain_narrow.narrow_companions = false;
  EXPECT_EQ(device(gpt2, plain_narrow), device(gpt2, plain));
  EXPECT_FALSE(model::without_companions(gpt2, narrow).options.narrow_gelu);
}

// The Llama family's gate and up in 16 bits alone (RunnerOptions::narrow_gate_up, which the
// trainer asks of the backend's ops) are counted as such: 2 bytes per element of each block's fc
// where the fp32 fc took 4. Not for GPT-2 (its fc is GELU's pre-activation), not with an MLP bias,
// not without the companions; the settings alone leave it off.
TEST(RunSettings, GateAndUpIn16BitsAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  auto device = [](const model::ModelShape& shape, const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const model::ModelShape llama = testing::tiny_llama(true);
  const model::RunnerOptions with = runner_options(c, llama, false);
  ASSERT_TRUE(with.narrow_companions);
  EXPECT_FALSE(with.narrow_gate_up);
  model::RunnerOptions narrow = with;
  narrow.narrow_gate_up = true;
  const auto fc =
      static_cast<std::uint64_t>(2 * 16) * 2 * static_cast<std::uint64_t>(llama.intermediate_size);
  EXPECT_EQ(device(llama, with) - device(llama, narrow),
            static_cast<std::uint64_t>(llama.num_layers) * (granule(fc * 4) - granule(fc * 2)));
  model::ModelShape biased = llama;
  biased.arch.mlp_bias = true;
  EXPECT_EQ(device(biased, narrow), device(biased, with));
  const model::ModelShape gpt2 = testing::tiny_gpt2(false);
  model::RunnerOptions gpt2_narrow = runner_options(c, gpt2, false);
  const std::uint64_t gpt2_bytes = device(gpt2, gpt2_narrow);
  gpt2_narrow.narrow_gate_up = true;
  EXPECT_EQ(device(gpt2, gpt2_narrow), gpt2_bytes);
  model::RunnerOptions plain = with, plain_narrow = narrow;
  plain.narrow_companions = plain_narrow.narrow_companions = false;
  EXPECT_EQ(device(llama, plain_narrow), device(llama, plain));
  EXPECT_FALSE(model::without_companions(llama, narrow).options.narrow_gate_up);
}

// The gradient of the Llama family's SwiGLU output in 16 bits alone too
// (RunnerOptions::narrow_swiglu_grad, which the trainer asks of the backend's ops) is counted as
// such: the backward's one scratch array (N x I) as its 2-byte companion where the fp32 array took
// 4. Only with gate and up in 16 bits and the activations kept alone, not for GPT-2, not with an
// MLP bias, not without the companions; the settings alone leave it off.
TEST(RunSettings, SwigluGradientsIn16BitsAloneAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  auto device = [](const model::ModelShape& shape, const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const model::ModelShape llama = testing::tiny_llama(true);
  model::RunnerOptions with = runner_options(c, llama, false);
  ASSERT_TRUE(with.narrow_companions);
  EXPECT_FALSE(with.narrow_swiglu_grad);
  with.narrow_gate_up = with.narrow_alone = true;
  model::RunnerOptions narrow = with;
  narrow.narrow_swiglu_grad = true;
  const auto dact = static_cast<std::uint64_t>(2 * 16 * llama.intermediate_size);
  EXPECT_EQ(device(llama, with) - device(llama, narrow), granule(dact * 4) - granule(dact * 2));
  for (bool model::RunnerOptions::*needed :
       {&model::RunnerOptions::narrow_gate_up, &model::RunnerOptions::narrow_alone,
        &model::RunnerOptions::narrow_companions}) {
    model::RunnerOptions without = with, without_narrow = narrow;
    without.*needed = without_narrow.*needed = false;
    EXPECT_EQ(device(llama, without_narrow), device(llama, without));
  }
  model::ModelShape biased = llama;
  biased.arch.mlp_bias = true;
  EXPECT_EQ(device(biased, narrow), device(biased, with));
  const model::ModelShape gpt2 = testing::tiny_gpt2(false);
  EXPECT_EQ(device(gpt2, narrow), device(gpt2, with));
  EXPECT_FALSE(model::without_companions(llama, narrow).options.narrow_swiglu_grad);
}

// The gradient of the blocks' norm outputs in 16 bits alone too (RunnerOptions::narrow_norm_grad,
// which the trainer asks of the backend's ops) is counted as such in both families: the backward's
// one scratch array (N x C) as its 2-byte companion where the fp32 array took 4. Only with the
// activations kept alone, not without the companions; the settings alone leave it off.
TEST(RunSettings, NormGradientsIn16BitsAloneAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  auto device = [](const model::ModelShape& shape, const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  for (const model::ModelShape& shape : {testing::tiny_gpt2(false), testing::tiny_llama(true)}) {
    model::RunnerOptions with = runner_options(c, shape, false);
    ASSERT_TRUE(with.narrow_companions);
    EXPECT_FALSE(with.narrow_norm_grad);
    with.narrow_alone = true;
    model::RunnerOptions narrow = with;
    narrow.narrow_norm_grad = true;
    const auto dln = static_cast<std::uint64_t>(2 * 16 * shape.hidden_size);
    EXPECT_EQ(device(shape, with) - device(shape, narrow), granule(dln * 4) - granule(dln * 2));
    for (bool model::RunnerOptions::*needed :
         {&model::RunnerOptions::narrow_alone, &model::RunnerOptions::narrow_companions}) {
      model::RunnerOptions without = with, without_narrow = narrow;
      without.*needed = without_narrow.*needed = false;
      EXPECT_EQ(device(shape, without_narrow), device(shape, without));
    }
    EXPECT_FALSE(model::without_companions(shape, narrow).options.narrow_norm_grad);
  }
}

// The gradient of the Llama family's gate and up kept in 16 bits alone
// (RunnerOptions::narrow_gate_up_grad) is counted as such: the backward's one scratch array
// (N x 2I) is not allocated beside its companion. Only with gate and up in 16 bits and the
// activations kept alone, not for GPT-2, not without the companions; the settings alone leave it
// off.
TEST(RunSettings, GateUpGradientsIn16BitsAloneAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  auto device = [](const model::ModelShape& shape, const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const model::ModelShape llama = testing::tiny_llama(true);
  model::RunnerOptions with = runner_options(c, llama, false);
  EXPECT_FALSE(with.narrow_gate_up_grad);
  with.narrow_gate_up = with.narrow_alone = true;
  model::RunnerOptions narrow = with;
  narrow.narrow_gate_up_grad = true;
  const auto dfc = static_cast<std::uint64_t>(2 * 16 * 2 * llama.intermediate_size);
  EXPECT_EQ(device(llama, with) - device(llama, narrow), granule(dfc * 4));
  for (bool model::RunnerOptions::*needed :
       {&model::RunnerOptions::narrow_gate_up, &model::RunnerOptions::narrow_alone,
        &model::RunnerOptions::narrow_companions}) {
    model::RunnerOptions without = with, without_narrow = narrow;
    without.*needed = without_narrow.*needed = false;
    EXPECT_EQ(device(llama, without_narrow), device(llama, without));
  }
  const model::ModelShape gpt2 = testing::tiny_gpt2(false);
  EXPECT_EQ(device(gpt2, narrow), device(gpt2, with));
  EXPECT_FALSE(model::without_companions(llama, narrow).options.narrow_gate_up_grad);
}

// GPT-2's GELU gradient kept in 16 bits alone (RunnerOptions::narrow_gelu_grad) is counted as such:
// the backward's one scratch array (N x 4C) is not allocated beside its companion. Only with GELU's
// input in 16 bits and the activations kept alone, not for the Llama family, not without the
// companions; the settings alone leave it off. With the gradient written by the product's epilogue
// the fp32 scratch before it goes too.
TEST(RunSettings, GeluGradientsIn16BitsAloneAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  auto device = [](const model::ModelShape& shape, const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const model::ModelShape gpt2 = testing::tiny_gpt2(false);
  model::RunnerOptions with = runner_options(c, gpt2, false);
  EXPECT_FALSE(with.narrow_gelu_grad);
  with.narrow_gelu = with.narrow_alone = true;
  model::RunnerOptions narrow = with;
  narrow.narrow_gelu_grad = true;
  const auto dfc = static_cast<std::uint64_t>(2 * 16 * gpt2.intermediate_size);
  EXPECT_EQ(device(gpt2, with) - device(gpt2, narrow), granule(dfc * 4));
  for (bool model::RunnerOptions::*needed :
       {&model::RunnerOptions::narrow_gelu, &model::RunnerOptions::narrow_alone,
        &model::RunnerOptions::narrow_companions}) {
    model::RunnerOptions without = with, without_narrow = narrow;
    without.*needed = without_narrow.*needed = false;
    EXPECT_EQ(device(gpt2, without_narrow), device(gpt2, without));
  }
  const model::ModelShape llama = testing::tiny_llama(true);
  EXPECT_EQ(device(llama, narrow), device(llama, with));
  EXPECT_FALSE(model::without_companions(gpt2, narrow).options.narrow_gelu_grad);
  // Its product and GELU's gradient in one call (RunnerOptions::fused_gelu_grad): the fp32 scratch
  // before GELU's gradient (N x 4C) is not allocated either; only on top of narrow_gelu_grad, and
  // never for the Llama family (whose dact is SwiGLU's output gradient).
  model::RunnerOptions fused = narrow;
  fused.fused_gelu_grad = true;
  EXPECT_EQ(device(gpt2, narrow) - device(gpt2, fused), granule(dfc * 4));
  model::RunnerOptions fused_only = with;
  fused_only.fused_gelu_grad = true;
  EXPECT_EQ(device(gpt2, fused_only), device(gpt2, with));
  EXPECT_EQ(device(llama, fused), device(llama, with));
  EXPECT_FALSE(model::without_companions(gpt2, fused).options.fused_gelu_grad);
}

// The gradient of q, k and v kept in 16 bits alone (RunnerOptions::narrow_qkv_grad) is counted as
// such: the backward's one scratch array (N x qkv_width) is not allocated beside its companion.
// Only with the activations kept alone, for GPT-2 and for the Llama family without q/k norms (whose
// backward reads it in fp32) or a qkv bias (whose sums would read its rotated values rounded), not
// without the companions; the settings alone leave it off.
TEST(RunSettings, QkvGradientsIn16BitsAloneAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  auto device = [](const model::ModelShape& shape, const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const model::ModelShape llama = testing::tiny_llama(true);
  model::RunnerOptions with = runner_options(c, llama, false);
  EXPECT_FALSE(with.narrow_qkv_grad);
  with.narrow_alone = true;
  model::RunnerOptions narrow = with;
  narrow.narrow_qkv_grad = true;
  const auto dqkv = static_cast<std::uint64_t>(2 * 16 * model::qkv_width(llama));
  EXPECT_EQ(device(llama, with) - device(llama, narrow), granule(dqkv * 4));
  for (bool model::RunnerOptions::*needed :
       {&model::RunnerOptions::narrow_alone, &model::RunnerOptions::narrow_companions}) {
    model::RunnerOptions without = with, without_narrow = narrow;
    without.*needed = without_narrow.*needed = false;
    EXPECT_EQ(device(llama, without_narrow), device(llama, without));
  }
  model::ModelShape qk_norm = llama;
  qk_norm.arch.qk_norm = true;
  EXPECT_EQ(device(qk_norm, narrow), device(qk_norm, with));
  model::ModelShape qkv_bias = llama;
  qkv_bias.arch.qkv_bias = true;
  EXPECT_EQ(device(qkv_bias, narrow), device(qkv_bias, with));
  const model::ModelShape gpt2 = testing::tiny_gpt2(false);
  const auto gpt2_dqkv = static_cast<std::uint64_t>(2 * 16 * model::qkv_width(gpt2));
  EXPECT_EQ(device(gpt2, with) - device(gpt2, narrow), granule(gpt2_dqkv * 4));
  EXPECT_FALSE(model::without_companions(llama, narrow).options.narrow_qkv_grad);
}

// Each block's q, k and v kept in 16 bits alone (RunnerOptions::narrow_qkv) are counted as such: 2
// bytes per element of each layer's saved projection in place of 4, in both families, with a qkv
// bias too. Only with the activations kept alone, not with q/k norms, not without the companions;
// the settings alone leave it off.
TEST(RunSettings, QkvIn16BitsAloneAreCountedAsSuch) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  auto device = [](const model::ModelShape& shape, const model::RunnerOptions& o) {
    return model::ModelRunner<float>::memory_needed(shape, o).device_bytes;
  };
  const model::ModelShape llama = testing::tiny_llama(true);
  model::RunnerOptions with = runner_options(c, llama, false);
  EXPECT_FALSE(with.narrow_qkv);
  with.narrow_alone = true;
  model::RunnerOptions narrow = with;
  narrow.narrow_qkv = true;
  // Each layer's fp32 array (4 bytes an element) goes; its companion (2) comes: both in 256-byte
  // granules.
  const auto qkv = static_cast<std::uint64_t>(2 * 16 * model::qkv_width(llama));
  auto granule = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const auto saved = [&](const model::ModelShape& shape) {
    const auto elements = static_cast<std::uint64_t>(2 * 16 * model::qkv_width(shape));
    return static_cast<std::uint64_t>(shape.num_layers) *
           (granule(elements * 4) - granule(elements * 2));
  };
  EXPECT_EQ(device(llama, with) - device(llama, narrow), saved(llama));
  EXPECT_EQ(saved(llama),
            static_cast<std::uint64_t>(llama.num_layers) * (granule(qkv * 4) - granule(qkv * 2)));
  for (bool model::RunnerOptions::*needed :
       {&model::RunnerOptions::narrow_alone, &model::RunnerOptions::narrow_companions}) {
    model::RunnerOptions without = with, without_narrow = narrow;
    without.*needed = without_narrow.*needed = false;
    EXPECT_EQ(device(llama, without_narrow), device(llama, without));
  }
  model::ModelShape qk_norm = llama;
  qk_norm.arch.qk_norm = true;
  EXPECT_EQ(device(qk_norm, narrow), device(qk_norm, with));
  model::ModelShape qkv_bias = llama;
  qkv_bias.arch.qkv_bias = true;
  EXPECT_EQ(device(qkv_bias, with) - device(qkv_bias, narrow), saved(qkv_bias));
  const model::ModelShape gpt2 = testing::tiny_gpt2(false);
  EXPECT_EQ(device(gpt2, with) - device(gpt2, narrow), saved(gpt2));
  EXPECT_FALSE(model::without_companions(llama, narrow).options.narrow_qkv);
}

// Where the working set does not fit the device budget with the companions, the estimate goes
// without them (as the trainer does) and says so; where it fits, it keeps them.
TEST(RunSettings, TheEstimateDropsTheCompanionsWhereTheyDoNotFit) {
  config::Config c;
  c.strata.data.seq_len = 16;
  c.train_micro_batch_size_per_gpu = 2;
  c.bf16.enabled = true;
  c.strata.backend = config::Backend::kCuda;  // an estimate for a GPU, on any machine
  offload::EstimateInput in;
  in.shape = testing::tiny_gpt2(false);
  in.params = model::total_params(in.shape);
  model::RunnerOptions with = runner_options(c, in.shape, false), without = with;
  ASSERT_TRUE(with.narrow_companions);
  without.narrow_companions = false;
  const std::uint64_t companions =
      model::ModelRunner<float>::memory_needed(in.shape, with).device_bytes -
      model::ModelRunner<float>::memory_needed(in.shape, without).device_bytes;
  ASSERT_GT(companions, 0u);
  auto mentions = [](const offload::Estimate& e) {
    for (const std::string& line : e.assumptions)
      if (line.find("no 16-bit activation companions") != std::string::npos) return true;
    return false;
  };
  config::Config converting = c;  // fp32 GEMM inputs: no companions planned at all
  converting.strata.gemm_precision = config::GemmPrecision::kFp32;
  in.device_budget_bytes = 1ull << 40;
  const offload::Estimate fits = estimate(c, in);
  EXPECT_FALSE(mentions(fits));
  EXPECT_EQ(
      fits.bytes(offload::Tier::kDevice) - estimate(converting, in).bytes(offload::Tier::kDevice),
      companions);
  in.device_budget_bytes = 4096;  // below any working set
  const offload::Estimate short_of = estimate(c, in);
  EXPECT_TRUE(mentions(short_of));
  EXPECT_EQ(short_of.bytes(offload::Tier::kDevice),
            estimate(converting, in).bytes(offload::Tier::kDevice));
}

TEST(RunSettings, AioConfigMapsOntoTheEngineOptions) {
  config::AioConfig aio;
  aio.block_size = 8 << 20;
  aio.queue_depth = 32;
  aio.intra_op_parallelism = 4;
  aio.single_submit = true;
  aio.overlap_events = false;
  io::EngineOptions o = engine_options(aio);
  EXPECT_EQ(o.block_size_bytes, 8u << 20);
  EXPECT_EQ(o.queue_depth, 32u);
  EXPECT_EQ(o.threads, 4u);
  EXPECT_TRUE(o.single_submit);
  EXPECT_FALSE(o.overlap_events);
}

TEST(RunSettings, ZeroAndStrataKeysReachThePlanSettings) {
  config::Config c;
  c.fp16.enabled = true;
  config::ZeroConfig& z = c.zero_optimization;
  z.stage = 3;
  z.sub_group_size = 12345;
  z.stage3_prefetch_bucket_size = 111;
  z.stage3_max_live_parameters = 222;
  z.stage3_max_reuse_distance = 333;
  z.stage3_param_persistence_threshold = 444;
  z.offload_param.device = config::OffloadDevice::kNvme;
  z.offload_param.nvme_path = {"/a", "/b"};
  z.offload_param.max_in_cpu = 555;
  z.offload_param.buffer_count = 3;
  z.offload_param.buffer_size = 666;
  z.offload_optimizer.device = config::OffloadDevice::kNone;
  z.offload_optimizer.ratio = 0.25;
  c.strata.optimizer_pipeline_depth = 7;
  c.strata.nvme_checksum = false;
  c.strata.nvme_bytes_max = 777;
  c.aio.queue_depth = 17;

  const offload::PlanSettings p = plan_settings(c);
  EXPECT_EQ(p.zero_stage, 3);
  EXPECT_EQ(p.storage, kernels::DType::kF16);
  EXPECT_EQ(p.tile_elements, 12345u);
  EXPECT_EQ(p.prefetch.bucket_elements, 111u);
  EXPECT_EQ(p.prefetch.live_elements_max, 222u);
  EXPECT_EQ(p.prefetch.reuse_distance_max, 333u);
  EXPECT_EQ(p.persistence_threshold_elements, 444u);
  EXPECT_EQ(p.param_tier, offload::Tier::kNvme);
  EXPECT_EQ(p.param_host_elements_max, 555u);
  EXPECT_EQ(p.param_staging_buffers, 3);
  EXPECT_EQ(p.param_staging_elements, 666u);
  // "none" asks for the optimizer state on the device; the plan decides (device_optimizer).
  EXPECT_EQ(p.optim_tier, offload::Tier::kDevice);
  EXPECT_EQ(p.device_optimizer, offload::DeviceOptimizer::kAuto);
  c.strata.device_optimizer = config::DeviceOptimizer::kOff;
  EXPECT_EQ(plan_settings(c).device_optimizer, offload::DeviceOptimizer::kOff);
  EXPECT_EQ(p.optim_nvme_fraction, 0.25);
  EXPECT_EQ(p.pipeline_depth, 7);
  EXPECT_EQ(p.swap.param_dirs, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_TRUE(p.swap.optim_dirs.empty());
  EXPECT_FALSE(p.swap.checksum);
  EXPECT_EQ(p.swap.bytes_max, 777u);
  EXPECT_EQ(p.swap.engine.queue_depth, 17u);
}

TEST(RunSettings, TheNearestNvmePathsNarrowTheSwapFoldersNotTheConfig) {
  config::Config c;
  c.zero_optimization.offload_param.nvme_path = {"/n0", "/n1"};
  c.zero_optimization.offload_optimizer.nvme_path = {"/n0", "/n1", "/n2"};
  std::vector<std::string> notes;
  const offload::PlanSettings p = plan_settings(c, {"/n1", "/n2"}, &notes);
  EXPECT_EQ(p.swap.param_dirs, (std::vector<std::string>{"/n1"}));
  EXPECT_EQ(p.swap.optim_dirs, (std::vector<std::string>{"/n1", "/n2"}));
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("offload_param.nvme_path"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("1 of 2"), std::string::npos) << notes[0];
  EXPECT_EQ(c.zero_optimization.offload_param.nvme_path.size(), 2u);

  // None of a list near this rank, or all of it: the list stays as configured, without a note.
  notes.clear();
  const offload::PlanSettings far = plan_settings(c, {"/elsewhere"}, &notes);
  EXPECT_EQ(far.swap.param_dirs, c.zero_optimization.offload_param.nvme_path);
  const offload::PlanSettings all = plan_settings(c, {"/n0", "/n1", "/n2"}, &notes);
  EXPECT_EQ(all.swap.optim_dirs, c.zero_optimization.offload_optimizer.nvme_path);
  EXPECT_TRUE(notes.empty());
}

TEST(RunSettings, WorldOptionsNameTheDevicesAndEveryNvmePathOnce) {
  config::Config c;
  c.strata.backend = config::Backend::kCuda;
  c.strata.comm_timeout_s = 42;
  c.zero_optimization.offload_param.nvme_path = {"/n0", "/n1"};
  c.zero_optimization.offload_optimizer.nvme_path = {"/n1", "/n2"};
  const comm::WorldOptions w = world_options(c);
  EXPECT_EQ(w.device, comm::Device::kCuda);
  EXPECT_EQ(w.comm.timeout_s, 42);
  EXPECT_EQ(w.nvme_paths, (std::vector<std::string>{"/n0", "/n1", "/n2"}));
}

}  // namespace
}  // namespace strata::train

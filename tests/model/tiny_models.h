// Tiny model shapes for the runner's tests: GPT-2, Llama with grouped KV heads, and two
// Llama-family variants that between them switch on every option of the family (biases, q/k norms,
// head_dim != hidden / heads, sliding windows on some layers, scaled and partial RoPE, Phi-3's
// fused names).
#pragma once

#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "model/model_spec.h"

namespace strata::testing {

inline std::unique_ptr<backend::Backend> make_cpu_test_backend() {
  backend::CpuBackendOptions options;
  options.device_bytes_max = 256ull << 20;
  options.host_bytes_max = 256ull << 20;
  options.threads = 2;
  return std::move(backend::make_cpu_backend(options)).value();
}

inline model::ModelShape tiny_gpt2(bool tied) {
  model::ModelShape s;
  s.family = model::Family::kGpt2;
  s.vocab_size = 11;
  s.max_seq_len = 16;
  s.hidden_size = 12;
  s.num_layers = 2;
  s.num_heads = 3;
  s.num_kv_heads = 3;
  s.head_dim = 4;
  s.intermediate_size = 20;
  s.tie_word_embeddings = tied;
  return s;
}

inline model::ModelShape tiny_llama(bool tied) {
  model::ModelShape s;
  s.family = model::Family::kLlama;
  s.vocab_size = 13;
  s.max_seq_len = 16;
  s.hidden_size = 16;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 4;
  s.intermediate_size = 24;
  s.norm_eps = 1e-6;
  s.rope_theta = 500.0;
  s.tie_word_embeddings = tied;
  return s;
}

// Qwen-like: q/k/v, o and MLP biases, per-head q/k norms, head_dim 6 (not 16 / 4), YaRN over an
// original context of 4, and a sliding window of 3 in layer 1 only.
inline model::ModelShape tiny_qwen_like() {
  model::ModelShape s = tiny_llama(false);
  s.arch.hf_type = "qwen3";
  s.head_dim = s.arch.head_dim = 6;
  s.arch.qkv_bias = s.arch.o_bias = s.arch.mlp_bias = s.arch.qk_norm = true;
  s.attention_window = 3;
  s.arch.sliding_layers = {false, true};
  s.arch.rope.type = config::RopeType::kYarn;
  s.arch.rope.factor = 4.0;
  s.arch.rope.original_max_positions = 4;
  return s;
}

// Phi-3-like: fused qkv_proj / gate_up_proj, half of each head rotated, LongRoPE past an original
// context of 4, a sliding window of 2, tied embeddings.
inline model::ModelShape tiny_phi3_like() {
  model::ModelShape s = tiny_llama(true);
  s.arch.hf_type = "phi3";
  s.arch.rope.type = config::RopeType::kLongRope;
  s.arch.rope.partial_rotary_factor = 0.5;
  s.arch.rope.original_max_positions = 4;
  s.arch.rope.short_factor = {1.0};
  s.arch.rope.long_factor = {2.5};
  s.attention_window = 2;
  return s;
}

}  // namespace strata::testing

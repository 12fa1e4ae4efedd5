// What a Hugging Face config.json says about a Llama-like model beyond its size: the RoPE
// variant, biases, per-head q/k norms, which layers use the sliding window, and the keys Strata
// carries through unread. It rides in config::ModelConfig from model::parse_hf_config to
// model::resolve_shape (src/model/model_spec.h owns reading and writing it); a model described in
// `strata.model` leaves it at its defaults (plain Llama or GPT-2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::config {

// transformers' rope_type values Strata implements. kDynamic (dynamic NTK) equals kDefault for
// every sequence up to max_position_embeddings, the only lengths Strata runs.
enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn, kLongRope };

// rope_parameters (transformers 5) or rope_scaling (4.x), with transformers' defaults. A value
// that config.json leaves out and transformers derives is 0 here (derived where it is used).
struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 0.0;                      // linear, dynamic, llama3, yarn, longrope
  double low_freq_factor = 0.0;             // llama3
  double high_freq_factor = 0.0;            // llama3
  std::int64_t original_max_positions = 0;  // llama3, yarn, longrope; 0 = max_position_embeddings
  double attention_factor = 0.0;            // yarn, longrope; 0 = derived from factor
  double beta_fast = 0.0;                   // yarn; 0 = 32
  double beta_slow = 0.0;                   // yarn; 0 = 1
  double mscale = 0.0;                      // yarn
  double mscale_all_dim = 0.0;              // yarn
  bool truncate = true;                     // yarn
  std::vector<double> short_factor;         // longrope: head_dim/2 rotary frequencies each
  std::vector<double> long_factor;          // longrope
  double partial_rotary_factor = 1.0;       // fraction of head_dim that is rotated
};

struct ModelArch {
  // transformers' model_type: gpt2, llama, mistral, qwen2, qwen3 or phi3; "" = the family's own.
  std::string hf_type;
  RopeScaling rope;
  std::int64_t head_dim = 0;  // 0 = hidden_size / num_heads
  bool qkv_bias = false;      // q/k/v projection biases (Qwen2; Llama's and Qwen3's attention_bias)
  bool o_bias = false;        // o_proj bias (Llama's and Qwen3's attention_bias)
  bool mlp_bias = false;      // gate/up/down biases (Llama's mlp_bias)
  bool qk_norm = false;       // per-head RMSNorm of q and k before RoPE (Qwen3)
  // The token whose embedding row gets no gradient from the input lookup: pad_token_id, which
  // transformers' Llama-family models pass to nn.Embedding as padding_idx; -1 = none. Read from
  // the carried keys, not written on its own.
  std::int64_t padding_idx = -1;
  // Which layers use the sliding window (Qwen2/Qwen3 layer_types); empty = every layer does when
  // the model has a window.
  std::vector<bool> sliding_layers;
  // The config.json keys Strata does not interpret (bos/eos/pad ids, transformers_version, ...),
  // as one JSON object's text ("" = none), written back into every config.json Strata saves.
  std::string extra_config;
  // The dtype the source config.json names (torch_dtype, or transformers 5's dtype); "" = none,
  // and a saved config then names the saved tensors' dtype.
  std::string source_dtype;
  // The directory the model was read from ("" = none): tokenizer files and generation_config.json
  // are copied from it next to every model Strata saves. Not part of config.json.
  std::string source_dir;
};

}  // namespace strata::config

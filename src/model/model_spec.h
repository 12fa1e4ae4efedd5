// A model's shape: GPT-2 or Llama, with every default resolved. Built from the `strata.model`
// config section or from a Hugging Face config.json, and written back as a config.json that
// `transformers` loads (GPT2LMHeadModel / LlamaForCausalLM).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "config/config.h"

namespace strata::model {

using Family = config::ModelFamily;

struct ModelSpec {
  Family family = Family::kGpt2;
  std::int64_t vocab_size = 0;
  std::int64_t max_seq_len = 0;  // GPT-2: the position table's rows
  std::int64_t hidden_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;  // = num_heads without grouped KV (always for GPT-2)
  std::int64_t head_dim = 0;
  std::int64_t intermediate_size = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;  // Llama
  bool tie_word_embeddings = true;

  // Parameters (tied weights counted once).
  std::int64_t parameter_count() const;
  // Multiply-add FLOPs of one token's forward pass in matrix products (2 per multiply-add), with
  // causal attention over `seq_len` counted as actually computed (half the score matrix).
  double forward_flops_per_token(std::int64_t seq_len) const;
};

// "gpt2" or "llama".
const char* family_name(Family family);

// Resolves the `strata.model` fields (0 = the family's default) and checks the shape.
Result<ModelSpec> spec_from_config(const config::ModelConfig& model);

// Reads a Hugging Face config.json (GPT2LMHeadModel or LlamaForCausalLM); errors name the file
// and key. Settings Strata does not implement (rope_scaling, attention biases in Llama, other
// activations) are errors, never silently ignored.
Result<ModelSpec> spec_from_hf_config_file(const std::string& path);
Result<ModelSpec> spec_from_hf_config_text(const std::string& text, const std::string& source);

// The config.json text for `spec`; `torch_dtype` is "float32", "bfloat16" or "float16".
std::string hf_config_json(const ModelSpec& spec, const std::string& torch_dtype);

// Checks divisibility and positivity; errors name the offending field.
Status validate_spec(const ModelSpec& spec);

}  // namespace strata::model

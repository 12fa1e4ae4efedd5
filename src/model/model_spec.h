// A model's shape, resolved: the family's defaults filled in, read from Strata's `strata.model`
// section or from a Hugging Face config.json (GPT2LMHeadModel / LlamaForCausalLM names), and the
// parameter count of every unit (embedding, each block, final norm + head). Estimates, the tier
// plan and the model builders all count parameters here, so they agree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"

namespace strata::model {

using Family = config::ModelFamily;

struct ModelShape {
  config::ModelFamily family = config::ModelFamily::kGpt2;
  std::int64_t vocab_size = 0;
  std::int64_t max_seq_len = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;  // == num_heads without grouped KV
  std::int64_t head_dim = 0;
  std::int64_t intermediate_size = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  std::int64_t attention_window = 0;  // 0 = none; else seq_len may not exceed it (Mistral)
  bool tie_word_embeddings = true;
};

// One unit of the model: the granularity at which parameters move between tiers.
struct UnitSpec {
  std::string name;         // "embedding", "block.0", ..., "head"
  std::int64_t params = 0;  // elements
};

// Fills in the family defaults of `model` (kv heads, intermediate size, head_dim) and checks the
// shape. Errors are kConfig and name the `strata.model.*` key at fault.
Result<ModelShape> resolve_shape(const config::ModelConfig& model);

// Reads a Hugging Face config.json (or a model directory holding one) of model_type gpt2, llama
// or mistral into Strata's model config. Errors name the file and the key at fault.
Result<config::ModelConfig> read_hf_config(const std::string& path);

// The same, from config.json's text (`source` names it in errors); the result's `path` is empty.
Result<config::ModelConfig> parse_hf_config(const std::string& text, const std::string& source);

// The model described by `model`: its own fields, or the config.json its `path` names.
Result<ModelShape> shape_of(const config::ModelConfig& model);

// Llama's default MLP width: 2/3 of 4*hidden, rounded up to a multiple of 256.
std::int64_t llama_intermediate_size(std::int64_t hidden_size);

// The units in execution order with their parameter counts. A tied head owns no parameters:
// it uses the embedding unit's matrix.
std::vector<UnitSpec> units(const ModelShape& shape);

std::int64_t total_params(const ModelShape& shape);

// "gpt2" or "llama".
const char* family_name(Family family);

// FLOPs (2 per multiply-add) of one token's forward pass in matrix products, causal attention
// over `seq_len` counted as computed (half of the score matrix), the head included.
double forward_flops_per_token(const ModelShape& shape, std::int64_t seq_len);

// The config.json text `transformers` reads back as the same model (GPT2LMHeadModel or
// LlamaForCausalLM); `torch_dtype` is "float32", "bfloat16" or "float16".
std::string hf_config_json(const ModelShape& shape, const std::string& torch_dtype);

}  // namespace strata::model

// A model's shape, resolved: the family's defaults filled in, read from Strata's `strata.model`
// section or from a Hugging Face config.json (model_type gpt2, llama, mistral, qwen2, qwen3 or
// phi3; reading and writing config.json is in hf_config.cc), and the parameter count of every unit
// (embedding, each block, final norm + head). Estimates, the tier plan and the model builders all
// count parameters here, so they agree.
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
  std::int64_t head_dim = 0;      // hidden_size / num_heads unless config.json says otherwise
  std::int64_t intermediate_size = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // Sliding-window attention: a query sees itself and the attention_window - 1 tokens before it,
  // in the layers arch.sliding_layers marks (all when empty); 0 = no window.
  std::int64_t attention_window = 0;
  bool tie_word_embeddings = true;
  config::ModelArch arch;  // RoPE variant, biases, q/k norms, carried config keys (Llama family)
};

// Head dimensions RoPE rotates: head_dim * partial_rotary_factor (Phi-3), even.
std::int64_t rotary_dim(const ModelShape& shape);

// The attention window of block `layer` (0 = full causal).
std::int64_t attention_window_of(const ModelShape& shape, int layer);

// transformers' model_type of the shape: arch.hf_type, or the family's own name.
std::string hf_model_type(const ModelShape& shape);

// One unit of the model: the granularity at which parameters move between tiers.
struct UnitSpec {
  std::string name;         // "embedding", "block.0", ..., "head"
  std::int64_t params = 0;  // elements
};

// Fills in the family defaults of `model` (kv heads, intermediate size, head_dim) and checks the
// shape. Errors are kConfig and name the `strata.model.*` key at fault.
Result<ModelShape> resolve_shape(const config::ModelConfig& model);

// How strictly config.json is read. kTrain: every setting Strata cannot run exactly is an error
// naming the key and the value found. kShapeOnly (`strata estimate`): only what the parameter
// count needs must be understood; RoPE variants, activations and attention patterns Strata does
// not implement are accepted.
enum class HfRead { kTrain, kShapeOnly };

// Reads a Hugging Face config.json (or a model directory holding one) of model_type gpt2, llama,
// mistral, qwen2, qwen3 or phi3 into Strata's model config, with transformers' defaults for absent
// keys. Errors name the file and the key at fault. A directory becomes arch.source_dir.
Result<config::ModelConfig> read_hf_config(const std::string& path, HfRead mode = HfRead::kTrain);

// The same, from config.json's text (`source` names it in errors); the result's `path` is empty.
Result<config::ModelConfig> parse_hf_config(const std::string& text, const std::string& source,
                                            HfRead mode = HfRead::kTrain);

// The model described by `model`: its own fields, or the config.json its `path` names (read with
// `mode`).
Result<ModelShape> shape_of(const config::ModelConfig& model, HfRead mode = HfRead::kTrain);

// Llama's default MLP width: 2/3 of 4*hidden, rounded up to a multiple of 256.
std::int64_t llama_intermediate_size(std::int64_t hidden_size);

// The units in execution order with their parameter counts. A tied head owns no parameters:
// it uses the embedding unit's matrix.
std::vector<UnitSpec> units(const ModelShape& shape);

std::int64_t total_params(const ModelShape& shape);

// "gpt2" or "llama" (the block structure; hf_model_type names the Hugging Face class).
const char* family_name(Family family);

// FLOPs (2 per multiply-add) of one token's forward pass in matrix products, causal attention
// over `seq_len` counted as computed (half of the score matrix), the head included.
double forward_flops_per_token(const ModelShape& shape, std::int64_t seq_len);

// The config.json text `transformers` reads back as the same model (GPT2LMHeadModel,
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or Phi3ForCausalLM):
// the keys Strata owns, over arch.extra_config's. torch_dtype is arch.source_dtype, else
// `torch_dtype` ("float32", "bfloat16" or "float16"; "" writes none). Deterministic:
// parse_hf_config of the text gives a shape whose hf_config_json(shape, "") is the same text.
std::string hf_config_json(const ModelShape& shape, const std::string& torch_dtype);

// Whether two shapes are the same model (their config.json texts agree, whatever dtype they name).
bool same_model(const ModelShape& a, const ModelShape& b);

}  // namespace strata::model

// Strata's model -> a Hugging Face config.json (see model_spec.h): the keys Strata owns for each
// model_type over the source's carried keys, RoPE written as rope_theta + rope_scaling (what
// transformers 4.x reads and 5.x converts), the dtype users load the model as.
#include <fmt/format.h>
#include <json/reader.h>
#include <json/value.h>
#include <json/writer.h>

#include <memory>

#include "model/model_spec.h"

namespace strata::model {
namespace {

using config::RopeType;

const char* architecture(const std::string& type) {
  if (type == "gpt2") return "GPT2LMHeadModel";
  if (type == "mistral") return "MistralForCausalLM";
  if (type == "qwen2") return "Qwen2ForCausalLM";
  if (type == "qwen3") return "Qwen3ForCausalLM";
  if (type == "phi3") return "Phi3ForCausalLM";
  return "LlamaForCausalLM";
}

const char* rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
    case RopeType::kLongRope:
      return "longrope";
    case RopeType::kDefault:
      break;
  }
  return "default";
}

Json::Value parse_carried(const std::string& text) {
  Json::Value root;
  Json::CharReaderBuilder builder;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  std::string errors;
  const bool ok = reader->parse(text.data(), text.data() + text.size(), &root, &errors);
  STRATA_ASSERT_MSG(ok && root.isObject(), "arch.extra_config holds a JSON object");
  return root;
}

// rope_scaling's dictionary: the type and the keys it uses (rope_theta and partial_rotary_factor
// stay at the top level, where transformers 4.x looks for them).
Json::Value rope_json(const ModelShape& s) {
  const config::RopeScaling& rope = s.arch.rope;
  Json::Value d(Json::objectValue);
  d["rope_type"] = rope_type_name(rope.type);
  auto put = [&d](const char* key, double v) {
    if (v > 0) d[key] = v;
  };
  put("factor", rope.factor);
  put("low_freq_factor", rope.low_freq_factor);
  put("high_freq_factor", rope.high_freq_factor);
  if (rope.original_max_positions > 0 &&
      (rope.type == RopeType::kLlama3 || rope.type == RopeType::kYarn ||
       rope.type == RopeType::kLongRope)) {
    d["original_max_position_embeddings"] = Json::Int64(rope.original_max_positions);
  }
  put("attention_factor", rope.attention_factor);
  put("beta_fast", rope.beta_fast);
  put("beta_slow", rope.beta_slow);
  put("mscale", rope.mscale);
  put("mscale_all_dim", rope.mscale_all_dim);
  if (!rope.truncate) d["truncate"] = false;
  for (const auto& [key, values] :
       {std::pair<const char*, const std::vector<double>*>{"short_factor", &rope.short_factor},
        {"long_factor", &rope.long_factor}}) {
    if (values->empty()) continue;
    Json::Value list(Json::arrayValue);
    for (double v : *values)
      list.append(v);
    d[key] = list;
  }
  return d;
}

void write_llama_like(const ModelShape& s, const std::string& type, Json::Value& root) {
  const config::ModelArch& a = s.arch;
  root["vocab_size"] = Json::Int64(s.vocab_size);
  root["max_position_embeddings"] = Json::Int64(s.max_seq_len);
  root["hidden_size"] = Json::Int64(s.hidden_size);
  root["intermediate_size"] = Json::Int64(s.intermediate_size);
  root["num_hidden_layers"] = Json::Int64(s.num_layers);
  root["num_attention_heads"] = Json::Int64(s.num_heads);
  root["num_key_value_heads"] = Json::Int64(s.num_kv_heads);
  root["head_dim"] = Json::Int64(s.head_dim);
  root["rms_norm_eps"] = s.norm_eps;
  root["hidden_act"] = "silu";
  // rope_theta + rope_scaling: what transformers 4.x reads, and 5.x turns into rope_parameters.
  root["rope_theta"] = s.rope_theta;
  root["rope_scaling"] = a.rope.type == RopeType::kDefault ? Json::Value() : rope_json(s);
  if (a.rope.partial_rotary_factor != 1.0) {
    root["partial_rotary_factor"] = a.rope.partial_rotary_factor;
  }
  if (type == "llama") {
    root["attention_bias"] = a.qkv_bias;
    root["mlp_bias"] = a.mlp_bias;
  }
  if (type == "qwen3") root["attention_bias"] = a.qkv_bias;
  if (type != "llama") {
    root["sliding_window"] =
        s.attention_window > 0 ? Json::Value(Json::Int64(s.attention_window)) : Json::Value();
  }
  if (type == "qwen2" || type == "qwen3") {
    root["use_sliding_window"] = s.attention_window > 0;
    Json::Value layers(Json::arrayValue);
    for (int l = 0; l < s.num_layers; ++l)
      layers.append(attention_window_of(s, l) > 0 ? "sliding_attention" : "full_attention");
    root["layer_types"] = layers;
  }
  if (type == "phi3") {
    root["original_max_position_embeddings"] =
        Json::Int64(a.rope.original_max_positions > 0 ? a.rope.original_max_positions : 4096);
  }
}

}  // namespace

bool same_model(const ModelShape& a, const ModelShape& b) {
  ModelShape x = a, y = b;
  x.arch.source_dtype = y.arch.source_dtype = "";
  return hf_config_json(x, "") == hf_config_json(y, "");
}

std::string hf_config_json(const ModelShape& s, const std::string& torch_dtype) {
  Json::Value root(Json::objectValue);
  if (!s.arch.extra_config.empty()) root = parse_carried(s.arch.extra_config);
  // Values transformers would otherwise default differently (dropout), unless the source model's
  // config already says.
  auto if_absent = [&root](const char* key, const Json::Value& value) {
    if (!root.isMember(key)) root[key] = value;
  };
  // The source's dtype (what users load the model as), else the saved tensors'.
  const std::string& dtype = s.arch.source_dtype.empty() ? torch_dtype : s.arch.source_dtype;
  if (!dtype.empty()) root["torch_dtype"] = dtype;
  if_absent("use_cache", true);
  if_absent("initializer_range", 0.02);
  const std::string type = hf_model_type(s);
  root["architectures"] = Json::Value(Json::arrayValue);
  root["architectures"].append(architecture(type));
  root["model_type"] = type;
  if (s.family == Family::kGpt2) {
    root["vocab_size"] = Json::Int64(s.vocab_size);
    root["n_positions"] = Json::Int64(s.max_seq_len);
    root["n_ctx"] = Json::Int64(s.max_seq_len);
    root["n_embd"] = Json::Int64(s.hidden_size);
    root["n_layer"] = Json::Int64(s.num_layers);
    root["n_head"] = Json::Int64(s.num_heads);
    root["n_inner"] = Json::Int64(s.intermediate_size);
    root["activation_function"] = "gelu_new";
    root["layer_norm_epsilon"] = s.norm_eps;
    for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"})
      if_absent(key, 0.0);
  } else {
    write_llama_like(s, type, root);
    if_absent("attention_dropout", 0.0);
  }
  root["tie_word_embeddings"] = s.tie_word_embeddings;
  Json::StreamWriterBuilder writer;
  writer["indentation"] = "  ";
  writer["precision"] = 15;
  return Json::writeString(writer, root) + "\n";
}

}  // namespace strata::model

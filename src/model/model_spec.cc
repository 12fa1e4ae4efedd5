// Model shapes from Strata's config or a Hugging Face config.json, and back (see model_spec.h).
#include "model/model_spec.h"

#include <fmt/format.h>
#include <json/json.h>

#include <fstream>
#include <memory>
#include <sstream>

namespace strata::model {
namespace {

// Llama's rule for the MLP width when none is given: 8/3 of the width, rounded up to 256.
std::int64_t llama_intermediate(std::int64_t hidden) {
  const std::int64_t raw = (8 * hidden + 2) / 3;
  return (raw + 255) / 256 * 256;
}

Status config_error(const std::string& source, const std::string& key, const std::string& what) {
  return Status(ErrorCode::kInvalidArgument, fmt::format("{}: {}", key, what), source);
}

// Reads an integer key; `fallback` < 0 means required.
Result<std::int64_t> read_int(const Json::Value& root, const std::string& source, const char* key,
                              std::int64_t fallback = -1) {
  if (!root.isMember(key) || root[key].isNull()) {
    if (fallback >= 0) return fallback;
    return config_error(source, key, "required key is missing");
  }
  const Json::Value& v = root[key];
  if (!v.isIntegral() || v.asInt64() < 0) {
    return config_error(source, key, "expected a non-negative integer");
  }
  return v.asInt64();
}

Result<double> read_real(const Json::Value& root, const std::string& source, const char* key,
                         double fallback) {
  if (!root.isMember(key) || root[key].isNull()) return fallback;
  if (!root[key].isNumeric()) return config_error(source, key, "expected a number");
  return root[key].asDouble();
}

Result<bool> read_bool(const Json::Value& root, const std::string& source, const char* key,
                       bool fallback) {
  if (!root.isMember(key) || root[key].isNull()) return fallback;
  if (!root[key].isBool()) return config_error(source, key, "expected true or false");
  return root[key].asBool();
}

std::string read_string(const Json::Value& root, const char* key) {
  return root.isMember(key) && root[key].isString() ? root[key].asString() : std::string();
}

}  // namespace

const char* family_name(Family family) {
  return family == Family::kGpt2 ? "gpt2" : "llama";
}

std::int64_t ModelSpec::parameter_count() const {
  const std::int64_t c = hidden_size;
  const std::int64_t q = num_heads * head_dim;
  const std::int64_t kv = num_kv_heads * head_dim;
  std::int64_t block = 0;
  std::int64_t total = vocab_size * c;
  if (family == Family::kGpt2) {
    block = 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c +
            (c * intermediate_size + intermediate_size) + (intermediate_size * c + c);
    total += max_seq_len * c + 2 * c;
  } else {
    block = c + c * (q + 2 * kv) + q * c + c + 3 * c * intermediate_size;
    total += c;
  }
  total += num_layers * block;
  if (!tie_word_embeddings) total += vocab_size * c;
  return total;
}

double ModelSpec::forward_flops_per_token(std::int64_t seq_len) const {
  const double c = static_cast<double>(hidden_size);
  const double q = static_cast<double>(num_heads * head_dim);
  const double kv = static_cast<double>(num_kv_heads * head_dim);
  const double inner = static_cast<double>(intermediate_size);
  double block = 0.0;
  if (family == Family::kGpt2) {
    block = c * 3 * c + c * c + 2 * c * inner;
  } else {
    block = c * (q + 2 * kv) + q * c + 3 * c * inner;
  }
  // Scores and weighted values: 2 products of (T x D) per head per token, over on average half
  // of the sequence (causal).
  const double attention = 2.0 * q * static_cast<double>(seq_len) / 2.0;
  const double head = static_cast<double>(vocab_size) * c;
  return 2.0 * (static_cast<double>(num_layers) * (block + attention) + head);
}

Status validate_spec(const ModelSpec& s) {
  auto bad = [](const char* key, const std::string& what) {
    return Status(ErrorCode::kInvalidArgument, fmt::format("{}: {}", key, what), "model");
  };
  if (s.vocab_size < 1) return bad("vocab_size", "must be at least 1");
  if (s.max_seq_len < 1) return bad("max_seq_len", "must be at least 1");
  if (s.hidden_size < 1) return bad("hidden_size", "must be at least 1");
  if (s.num_layers < 1) return bad("num_layers", "must be at least 1");
  if (s.num_heads < 1) return bad("num_heads", "must be at least 1");
  if (s.num_kv_heads < 1 || s.num_heads % s.num_kv_heads != 0) {
    return bad("num_kv_heads",
               fmt::format("{} does not divide num_heads {}", s.num_kv_heads, s.num_heads));
  }
  if (s.head_dim < 1) return bad("head_dim", "must be at least 1");
  if (s.family == Family::kGpt2) {
    if (s.hidden_size % s.num_heads != 0) {
      return bad("num_heads",
                 fmt::format("{} heads do not divide hidden_size {}", s.num_heads, s.hidden_size));
    }
    if (s.num_kv_heads != s.num_heads) {
      return bad("num_kv_heads", "GPT-2 has no grouped KV heads; leave it 0");
    }
  } else if (s.head_dim % 2 != 0) {
    return bad("head_dim",
               fmt::format("{} is odd; rotary embeddings need an even head_dim", s.head_dim));
  }
  if (s.intermediate_size < 1) return bad("intermediate_size", "must be at least 1");
  if (!(s.norm_eps > 0.0)) return bad("norm_eps", "must be positive");
  if (!(s.rope_theta > 0.0)) return bad("rope_theta", "must be positive");
  if (s.vocab_size > (std::int64_t{1} << 31) - 1) return bad("vocab_size", "must fit in int32");
  return Status::ok();
}

Result<ModelSpec> spec_from_config(const config::ModelConfig& m) {
  ModelSpec s;
  s.family = m.family;
  s.vocab_size = m.vocab_size;
  s.max_seq_len = m.max_seq_len;
  s.hidden_size = m.hidden_size;
  s.num_layers = m.num_layers;
  s.num_heads = m.num_heads;
  s.num_kv_heads = m.num_kv_heads == 0 ? m.num_heads : m.num_kv_heads;
  s.head_dim = m.num_heads > 0 ? m.hidden_size / m.num_heads : 0;
  s.intermediate_size = m.intermediate_size;
  if (s.intermediate_size == 0) {
    s.intermediate_size =
        m.family == Family::kGpt2 ? 4 * m.hidden_size : llama_intermediate(m.hidden_size);
  }
  s.norm_eps = m.norm_eps;
  s.rope_theta = m.rope_theta;
  s.tie_word_embeddings = m.tie_word_embeddings;
  if (m.family == Family::kLlama && m.num_heads > 0 && m.hidden_size % m.num_heads != 0) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("num_heads: {} heads do not divide hidden_size {}", m.num_heads, m.hidden_size),
        "strata.model");
  }
  Status valid = validate_spec(s);
  if (!valid.is_ok()) return valid.with_context("strata.model");
  return s;
}

Result<ModelSpec> spec_from_hf_config_text(const std::string& text, const std::string& source) {
  Json::CharReaderBuilder builder;
  builder["rejectDupKeys"] = true;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  Json::Value root;
  std::string errors;
  if (!reader->parse(text.data(), text.data() + text.size(), &root, &errors) || !root.isObject()) {
    return Status(ErrorCode::kInvalidArgument, "not a JSON object: " + errors, source);
  }
  const std::string type = read_string(root, "model_type");
  ModelSpec s;
  if (type == "gpt2") {
    s.family = Family::kGpt2;
    STRATA_ASSIGN_OR_RETURN(s.vocab_size, read_int(root, source, "vocab_size"));
    STRATA_ASSIGN_OR_RETURN(std::int64_t n_ctx, read_int(root, source, "n_ctx", 0));
    STRATA_ASSIGN_OR_RETURN(s.max_seq_len, read_int(root, source, "n_positions", n_ctx));
    STRATA_ASSIGN_OR_RETURN(s.hidden_size, read_int(root, source, "n_embd"));
    STRATA_ASSIGN_OR_RETURN(s.num_layers, read_int(root, source, "n_layer"));
    STRATA_ASSIGN_OR_RETURN(s.num_heads, read_int(root, source, "n_head"));
    STRATA_ASSIGN_OR_RETURN(s.intermediate_size,
                            read_int(root, source, "n_inner", 4 * s.hidden_size));
    STRATA_ASSIGN_OR_RETURN(s.norm_eps, read_real(root, source, "layer_norm_epsilon", 1e-5));
    STRATA_ASSIGN_OR_RETURN(s.tie_word_embeddings,
                            read_bool(root, source, "tie_word_embeddings", true));
    s.num_kv_heads = s.num_heads;
    s.head_dim = s.num_heads > 0 ? s.hidden_size / s.num_heads : 0;
    const std::string act = read_string(root, "activation_function");
    if (!act.empty() && act != "gelu_new" && act != "gelu_pytorch_tanh") {
      return config_error(source, "activation_function",
                          "'" + act + "' is not supported; valid: gelu_new, gelu_pytorch_tanh");
    }
    STRATA_ASSIGN_OR_RETURN(bool scale, read_bool(root, source, "scale_attn_weights", true));
    STRATA_ASSIGN_OR_RETURN(bool by_layer,
                            read_bool(root, source, "scale_attn_by_inverse_layer_idx", false));
    if (!scale || by_layer) {
      return config_error(source, "scale_attn_weights",
                          "only the standard 1/sqrt(head_dim) attention scaling is supported");
    }
  } else if (type == "llama") {
    s.family = Family::kLlama;
    STRATA_ASSIGN_OR_RETURN(s.vocab_size, read_int(root, source, "vocab_size"));
    STRATA_ASSIGN_OR_RETURN(s.max_seq_len, read_int(root, source, "max_position_embeddings"));
    STRATA_ASSIGN_OR_RETURN(s.hidden_size, read_int(root, source, "hidden_size"));
    STRATA_ASSIGN_OR_RETURN(s.num_layers, read_int(root, source, "num_hidden_layers"));
    STRATA_ASSIGN_OR_RETURN(s.num_heads, read_int(root, source, "num_attention_heads"));
    STRATA_ASSIGN_OR_RETURN(s.num_kv_heads,
                            read_int(root, source, "num_key_value_heads", s.num_heads));
    STRATA_ASSIGN_OR_RETURN(
        s.head_dim,
        read_int(root, source, "head_dim", s.num_heads > 0 ? s.hidden_size / s.num_heads : 0));
    STRATA_ASSIGN_OR_RETURN(s.intermediate_size, read_int(root, source, "intermediate_size"));
    STRATA_ASSIGN_OR_RETURN(s.norm_eps, read_real(root, source, "rms_norm_eps", 1e-6));
    STRATA_ASSIGN_OR_RETURN(s.rope_theta, read_real(root, source, "rope_theta", 10000.0));
    STRATA_ASSIGN_OR_RETURN(s.tie_word_embeddings,
                            read_bool(root, source, "tie_word_embeddings", false));
    const std::string act = read_string(root, "hidden_act");
    if (!act.empty() && act != "silu") {
      return config_error(source, "hidden_act", "'" + act + "' is not supported; valid: silu");
    }
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      STRATA_ASSIGN_OR_RETURN(bool on, read_bool(root, source, key, false));
      if (on) return config_error(source, key, "biases in Llama layers are not supported");
    }
    if (root.isMember("rope_scaling") && !root["rope_scaling"].isNull()) {
      return config_error(source, "rope_scaling", "RoPE scaling is not supported; set it to null");
    }
  } else {
    return config_error(source, "model_type",
                        "'" + type + "' is not supported; valid: gpt2, llama");
  }
  Status valid = validate_spec(s);
  if (!valid.is_ok()) return valid.with_context(source);
  return s;
}

Result<ModelSpec> spec_from_hf_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(ErrorCode::kNotFound, "cannot open the model's config.json", path);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return spec_from_hf_config_text(text.str(), path);
}

std::string hf_config_json(const ModelSpec& s, const std::string& torch_dtype) {
  Json::Value root(Json::objectValue);
  if (s.family == Family::kGpt2) {
    root["architectures"].append("GPT2LMHeadModel");
    root["model_type"] = "gpt2";
    root["vocab_size"] = Json::Int64(s.vocab_size);
    root["n_positions"] = Json::Int64(s.max_seq_len);
    root["n_ctx"] = Json::Int64(s.max_seq_len);
    root["n_embd"] = Json::Int64(s.hidden_size);
    root["n_layer"] = Json::Int64(s.num_layers);
    root["n_head"] = Json::Int64(s.num_heads);
    root["n_inner"] = Json::Int64(s.intermediate_size);
    root["activation_function"] = "gelu_new";
    root["layer_norm_epsilon"] = s.norm_eps;
    root["resid_pdrop"] = 0.0;
    root["embd_pdrop"] = 0.0;
    root["attn_pdrop"] = 0.0;
    root["initializer_range"] = 0.02;
  } else {
    root["architectures"].append("LlamaForCausalLM");
    root["model_type"] = "llama";
    root["vocab_size"] = Json::Int64(s.vocab_size);
    root["max_position_embeddings"] = Json::Int64(s.max_seq_len);
    root["hidden_size"] = Json::Int64(s.hidden_size);
    root["intermediate_size"] = Json::Int64(s.intermediate_size);
    root["num_hidden_layers"] = Json::Int64(s.num_layers);
    root["num_attention_heads"] = Json::Int64(s.num_heads);
    root["num_key_value_heads"] = Json::Int64(s.num_kv_heads);
    root["head_dim"] = Json::Int64(s.head_dim);
    root["rms_norm_eps"] = s.norm_eps;
    root["rope_theta"] = s.rope_theta;
    root["rope_scaling"] = Json::Value();
    root["hidden_act"] = "silu";
    root["attention_bias"] = false;
    root["mlp_bias"] = false;
    root["attention_dropout"] = 0.0;
    root["initializer_range"] = 0.02;
  }
  root["tie_word_embeddings"] = s.tie_word_embeddings;
  root["torch_dtype"] = torch_dtype;
  root["use_cache"] = true;
  Json::StreamWriterBuilder writer;
  writer["indentation"] = "  ";
  return Json::writeString(writer, root) + "\n";
}

}  // namespace strata::model

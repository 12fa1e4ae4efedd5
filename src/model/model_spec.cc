#include "model/model_spec.h"

#include <json/reader.h>
#include <json/value.h>
#include <json/writer.h>
#include <sys/stat.h>

#include <exception>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/bounded_read.h"
#include "model/shape_limits.h"

namespace strata::model {
namespace {

constexpr const char* kFamilies = "gpt2, llama, mistral";
constexpr std::uint64_t kHfConfigBytesMax = std::uint64_t{16} << 20;

// Reads typed keys of one HF config.json, remembering the first problem.
class HfReader {
 public:
  HfReader(const Json::Value& root, std::string file) : root_(root), file_(std::move(file)) {}

  // A positive integer; `fallbacks` are older names tried in order when `key` is absent.
  std::int64_t integer(const char* key, std::int64_t if_absent,
                       std::initializer_list<const char*> fallbacks = {}) {
    const Json::Value* v = find(key, fallbacks);
    if (v == nullptr || v->isNull()) {
      if (if_absent < 0) fail(key, "is required");
      return if_absent;
    }
    if (!v->isIntegral() || v->asInt64() <= 0) {
      fail(key, "must be a positive integer, got " + v->toStyledString());
      return 1;
    }
    return v->asInt64();
  }

  double real(const char* key, double if_absent) {
    const Json::Value* v = find(key, {});
    if (v == nullptr || v->isNull()) return if_absent;
    if (!v->isNumeric() || v->asDouble() <= 0) {
      fail(key, "must be a positive number");
      return if_absent;
    }
    return v->asDouble();
  }

  bool boolean(const char* key, bool if_absent) {
    const Json::Value* v = find(key, {});
    if (v == nullptr || v->isNull()) return if_absent;
    if (!v->isBool()) {
      fail(key, "must be true or false");
      return if_absent;
    }
    return v->asBool();
  }

  // A key Strata cannot honour unless it has the given neutral value.
  void require_absent_or(const char* key, const Json::Value& neutral, const std::string& why) {
    const Json::Value* v = find(key, {});
    if (v != nullptr && !v->isNull() && *v != neutral) fail(key, why);
  }

  void fail(const std::string& key, const std::string& message) {
    if (status_.is_ok()) status_ = Status(ErrorCode::kConfig, key + " " + message, file_);
  }

  const Status& status() const { return status_; }

 private:
  const Json::Value* find(const char* key, std::initializer_list<const char*> fallbacks) const {
    if (root_.isMember(key)) return &root_[key];
    for (const char* old : fallbacks) {
      if (root_.isMember(old)) return &root_[old];
    }
    return nullptr;
  }

  const Json::Value& root_;
  std::string file_;
  Status status_;
};

Status shape_error(const std::string& key, const std::string& message) {
  return Status(ErrorCode::kConfig, message, "strata.model." + key);
}

}  // namespace

std::int64_t llama_intermediate_size(std::int64_t hidden_size) {
  const std::int64_t two_thirds = 2 * 4 * hidden_size / 3;
  return (two_thirds + 255) / 256 * 256;
}

Result<ModelShape> resolve_shape(const config::ModelConfig& m) {
  for (auto [key, value] : {std::pair<const char*, std::int64_t>{"vocab_size", m.vocab_size},
                            {"max_seq_len", m.max_seq_len},
                            {"hidden_size", m.hidden_size},
                            {"num_layers", m.num_layers},
                            {"num_heads", m.num_heads}}) {
    if (value <= 0) return shape_error(key, fmt::format("must be positive, got {}", value));
  }
  STRATA_TRY(check_model_dims(m));
  ModelShape s;
  s.family = m.family;
  s.vocab_size = m.vocab_size;
  s.max_seq_len = m.max_seq_len;
  s.hidden_size = m.hidden_size;
  s.num_layers = m.num_layers;
  s.num_heads = m.num_heads;
  s.num_kv_heads = m.num_kv_heads > 0 ? m.num_kv_heads : m.num_heads;
  s.norm_eps = m.norm_eps;
  s.rope_theta = m.rope_theta;
  s.attention_window = m.attention_window;
  s.tie_word_embeddings = m.tie_word_embeddings;
  if (m.hidden_size % m.num_heads != 0) {
    return shape_error("num_heads", fmt::format("{} heads do not divide hidden_size {}",
                                                m.num_heads, m.hidden_size));
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return shape_error("num_kv_heads", fmt::format("{} KV heads do not divide num_heads {}",
                                                   s.num_kv_heads, s.num_heads));
  }
  if (s.family == config::ModelFamily::kGpt2 && s.num_kv_heads != s.num_heads) {
    return shape_error("num_kv_heads", "GPT-2 has no grouped KV heads; leave it 0");
  }
  s.head_dim = m.hidden_size / m.num_heads;
  if (s.family == config::ModelFamily::kLlama && s.head_dim % 2 != 0) {
    return shape_error("num_heads", fmt::format("head size {} is odd; rotary embeddings need an "
                                                "even head size",
                                                s.head_dim));
  }
  if (m.intermediate_size > 0) {
    s.intermediate_size = m.intermediate_size;
  } else {
    s.intermediate_size = s.family == config::ModelFamily::kGpt2
                              ? 4 * m.hidden_size
                              : llama_intermediate_size(m.hidden_size);
  }
  STRATA_TRY(check_shape_limits(s));
  return s;
}

Result<config::ModelConfig> read_hf_config(const std::string& path) {
  std::string file = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file = path + "/config.json";
  Result<std::string> text = read_regular_file(file, kHfConfigBytesMax, "the model config");
  if (!text.is_ok()) {
    return Status(
        ErrorCode::kConfig,
        text.status().message() + " (give a Hugging Face model directory or its config.json)",
        file);
  }
  STRATA_ASSIGN_OR_RETURN(config::ModelConfig m, parse_hf_config(*text, file));
  m.path = path;
  return m;
}

namespace {

Result<config::ModelConfig> parse_hf_json(const Json::Value& root, const std::string& file) {
  if (!root.isObject()) return Status(ErrorCode::kConfig, "expected a JSON object", file);

  const std::string type = root.get("model_type", "").asString();
  HfReader r(root, file);
  config::ModelConfig m;
  if (type == "gpt2") {
    m.family = config::ModelFamily::kGpt2;
    m.vocab_size = r.integer("vocab_size", 50257);
    m.max_seq_len = r.integer("n_positions", 1024, {"n_ctx"});
    m.hidden_size = r.integer("n_embd", 768);
    m.num_layers = r.integer("n_layer", 12);
    m.num_heads = r.integer("n_head", 12);
    m.intermediate_size = r.integer("n_inner", 0);
    m.norm_eps = r.real("layer_norm_epsilon", 1e-5);
    m.tie_word_embeddings = r.boolean("tie_word_embeddings", true);
    r.require_absent_or("activation_function", "gelu_new",
                        "is not supported: Strata's GPT-2 uses the tanh GELU (\"gelu_new\")");
  } else if (type == "llama" || type == "mistral") {
    m.family = config::ModelFamily::kLlama;
    m.vocab_size = r.integer("vocab_size", 32000);
    m.max_seq_len = r.integer("max_position_embeddings", 2048);
    m.hidden_size = r.integer("hidden_size", 4096);
    m.num_layers = r.integer("num_hidden_layers", 32);
    m.num_heads = r.integer("num_attention_heads", 32);
    m.num_kv_heads = r.integer("num_key_value_heads", 0);
    m.intermediate_size = r.integer("intermediate_size", 11008);
    m.norm_eps = r.real("rms_norm_eps", 1e-6);
    m.rope_theta = r.real("rope_theta", 10000.0);
    m.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    r.require_absent_or("hidden_act", "silu", "is not supported: Strata's Llama uses SiLU");
    r.require_absent_or("rope_scaling", Json::Value(),
                        "is not supported: Strata implements plain RoPE (rope_scaling null)");
    // transformers 5 writes rope_parameters {rope_theta, rope_type} instead of rope_theta.
    if (root.isMember("rope_parameters") && !root["rope_parameters"].isNull()) {
      const Json::Value& rope = root["rope_parameters"];
      if (!rope.isObject()) {
        r.fail("rope_parameters", "must be an object");
      } else {
        HfReader rr(rope, file);
        m.rope_theta = rr.real("rope_theta", m.rope_theta);
        rr.require_absent_or("rope_type", "default",
                             "is not supported: Strata implements plain RoPE (rope_type "
                             "\"default\")");
        if (!rr.status().is_ok()) {
          r.fail("rope_parameters." + rr.status().message(), "");
        }
      }
    }
    if (root.isMember("sliding_window") && !root["sliding_window"].isNull()) {
      const Json::Value& w = root["sliding_window"];
      if (!w.isIntegral() || w.asInt64() < 1) {
        r.fail("sliding_window", "must be a positive integer or null");
      } else {
        m.attention_window = w.asInt64();
      }
    }
    r.require_absent_or("attention_bias", false, "is not supported: Llama without biases only");
    r.require_absent_or("mlp_bias", false, "is not supported: Llama without biases only");
    if (root.isMember("head_dim") && !root["head_dim"].isNull() && root["head_dim"].isIntegral() &&
        root["head_dim"].asInt64() * m.num_heads != m.hidden_size) {
      r.fail("head_dim", "must equal hidden_size / num_attention_heads in Strata");
    }
  } else {
    return Status(ErrorCode::kConfig,
                  fmt::format("model_type '{}' is not supported; valid: {}", type, kFamilies),
                  file);
  }
  if (!r.status().is_ok()) return r.status();
  return m;
}

}  // namespace

Result<config::ModelConfig> parse_hf_config(const std::string& text, const std::string& file) {
  JsonLimits limits;
  limits.bytes_max = kHfConfigBytesMax;
  limits.allow_comments = true;
  Result<Json::Value> root = parse_json_bounded(text, file, limits);
  if (!root.is_ok()) return Status(ErrorCode::kConfig, root.status().message(), file);
  try {
    return parse_hf_json(*root, file);
  } catch (const std::exception& e) {
    // A value of a type the reader did not expect (jsoncpp throws): named, never escaping.
    return Status(ErrorCode::kConfig, fmt::format("a value has the wrong type: {}", e.what()),
                  file);
  }
}

Result<ModelShape> shape_of(const config::ModelConfig& model) {
  if (model.path.empty()) return resolve_shape(model);
  STRATA_ASSIGN_OR_RETURN(config::ModelConfig from_file, read_hf_config(model.path));
  from_file.activation_checkpointing = model.activation_checkpointing;
  from_file.activation_offload = model.activation_offload;
  return resolve_shape(from_file);
}

std::vector<UnitSpec> units(const ModelShape& s) {
  const std::int64_t h = s.hidden_size;
  const std::int64_t v = s.vocab_size;
  const std::int64_t i = s.intermediate_size;
  const std::int64_t q = s.num_heads * s.head_dim;
  const std::int64_t kv = s.num_kv_heads * s.head_dim;
  std::vector<UnitSpec> out;
  std::int64_t embedding = v * h;
  std::int64_t block = 0;
  std::int64_t final_norm = 0;
  if (s.family == config::ModelFamily::kGpt2) {
    embedding += s.max_seq_len * h;  // wte + wpe
    block = 2 * h                    // ln_1
            + h * 3 * h + 3 * h      // attn.c_attn
            + h * h + h              // attn.c_proj
            + 2 * h                  // ln_2
            + h * i + i              // mlp.c_fc
            + i * h + h;             // mlp.c_proj
    final_norm = 2 * h;              // ln_f
  } else {
    block = h                     // input_layernorm
            + h * q + 2 * h * kv  // q_proj, k_proj, v_proj
            + q * h               // o_proj
            + h                   // post_attention_layernorm
            + 3 * h * i;          // gate_proj, up_proj, down_proj
    final_norm = h;               // norm
  }
  out.push_back({"embedding", embedding});
  for (std::int64_t l = 0; l < s.num_layers; ++l)
    out.push_back({fmt::format("block.{}", l), block});
  out.push_back({"head", final_norm + (s.tie_word_embeddings ? 0 : v * h)});
  return out;
}

std::int64_t total_params(const ModelShape& shape) {
  std::int64_t total = 0;
  for (const UnitSpec& u : units(shape))
    total += u.params;
  return total;
}

const char* family_name(Family family) {
  return family == Family::kGpt2 ? "gpt2" : "llama";
}

double forward_flops_per_token(const ModelShape& s, std::int64_t seq_len) {
  const double c = static_cast<double>(s.hidden_size);
  const double q = static_cast<double>(s.num_heads * s.head_dim);
  const double kv = static_cast<double>(s.num_kv_heads * s.head_dim);
  const double inner = static_cast<double>(s.intermediate_size);
  double block = 0.0;
  if (s.family == Family::kGpt2) {
    block = c * 3 * c + c * c + 2 * c * inner;
  } else {
    block = c * (q + 2 * kv) + q * c + 3 * c * inner;
  }
  // Scores and weighted values: 2 products of (T x D) per head per token, over on average half
  // of the sequence (causal).
  const double attention = 2.0 * q * static_cast<double>(seq_len) / 2.0;
  const double head = static_cast<double>(s.vocab_size) * c;
  return 2.0 * (static_cast<double>(s.num_layers) * (block + attention) + head);
}

std::string hf_config_json(const ModelShape& s, const std::string& torch_dtype) {
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
  writer["precision"] = 15;
  return Json::writeString(writer, root) + "\n";
}

}  // namespace strata::model

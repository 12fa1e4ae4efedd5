// A Hugging Face config.json -> Strata's model config (see model_spec.h; writing it back is in
// hf_config_write.cc): transformers' defaults per model_type, its two spellings of the RoPE
// settings (rope_scaling + rope_theta in 4.x, rope_parameters in 5.x), named errors for what Strata
// does not implement, and the keys it carries through unread.
#include <fmt/format.h>
#include <json/reader.h>
#include <json/value.h>
#include <json/writer.h>
#include <sys/stat.h>

#include <exception>
#include <filesystem>
#include <set>

#include "common/bounded_read.h"
#include "model/model_spec.h"

namespace strata::model {
namespace {

using config::RopeType;

constexpr const char* kTypes = "gpt2, llama, mistral, qwen2, qwen3, phi3";
constexpr const char* kRopeTypes = "default, linear, dynamic, llama3, yarn, longrope";

// transformers' defaults for a model_type's absent keys (its *Config class attributes).
struct LlamaDefaults {
  std::int64_t vocab, max_positions, hidden, inner, layers, heads, kv_heads, head_dim;
  double eps;
};

bool llama_like(const std::string& type, LlamaDefaults* d) {
  if (type == "llama") {
    *d = {32000, 2048, 4096, 11008, 32, 32, 0, 0, 1e-6};
  } else if (type == "mistral") {
    *d = {32000, 131072, 4096, 14336, 32, 32, 8, 0, 1e-6};
  } else if (type == "qwen2") {
    *d = {151936, 32768, 4096, 22016, 32, 32, 32, 0, 1e-6};
  } else if (type == "qwen3") {
    *d = {151936, 32768, 4096, 22016, 32, 32, 32, 128, 1e-6};
  } else if (type == "phi3") {
    *d = {32064, 4096, 3072, 8192, 32, 32, 0, 0, 1e-5};
  } else {
    return false;
  }
  return true;
}

// The keys hf_config_json writes for a model_type (everything else is carried through).
std::set<std::string> owned_keys(const std::string& type) {
  if (type == "gpt2") {
    return {"architectures",
            "model_type",
            "vocab_size",
            "n_positions",
            "n_ctx",
            "n_embd",
            "n_layer",
            "n_head",
            "n_inner",
            "activation_function",
            "layer_norm_epsilon",
            "tie_word_embeddings",
            "torch_dtype",
            "dtype"};
  }
  std::set<std::string> keys = {"architectures",
                                "model_type",
                                "vocab_size",
                                "max_position_embeddings",
                                "hidden_size",
                                "intermediate_size",
                                "num_hidden_layers",
                                "num_attention_heads",
                                "num_key_value_heads",
                                "head_dim",
                                "rms_norm_eps",
                                "hidden_act",
                                "tie_word_embeddings",
                                "rope_theta",
                                "rope_scaling",
                                "rope_parameters",
                                "partial_rotary_factor",
                                "torch_dtype",
                                "dtype"};
  if (type == "llama") keys.insert({"attention_bias", "mlp_bias"});
  if (type == "qwen3") keys.insert("attention_bias");
  if (type != "llama") keys.insert("sliding_window");
  if (type == "qwen2" || type == "qwen3") keys.insert({"use_sliding_window", "layer_types"});
  if (type == "phi3") keys.insert("original_max_position_embeddings");
  return keys;
}

// Reads typed keys of one JSON object, remembering the first problem. `prefix` names the object
// in messages ("rope_parameters.").
class HfReader {
 public:
  HfReader(const Json::Value& root, std::string file, std::string prefix = "")
      : root_(root), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool present(const char* key) const { return root_.isMember(key); }
  bool has(const char* key) const { return root_.isMember(key) && !root_[key].isNull(); }
  const Json::Value& at(const char* key) const { return root_[key]; }

  // A positive integer; `fallbacks` are older names tried in order when `key` is absent; absent
  // or null gives if_absent (a negative if_absent makes the key required).
  std::int64_t integer(const char* key, std::int64_t if_absent,
                       std::initializer_list<const char*> fallbacks = {}) {
    const Json::Value* v = find(key, fallbacks);
    if (v == nullptr || v->isNull()) {
      if (if_absent < 0) fail(key, "is required");
      return if_absent;
    }
    if (!v->isIntegral() || v->asInt64() <= 0) {
      fail(key, "must be a positive integer, got " + compact(*v));
      return 1;
    }
    return v->asInt64();
  }

  double real(const char* key, double if_absent) {
    const Json::Value* v = find(key, {});
    if (v == nullptr || v->isNull()) return if_absent;
    if (!v->isNumeric() || !(v->asDouble() > 0)) {
      fail(key, "must be a positive number, got " + compact(*v));
      return if_absent;
    }
    return v->asDouble();
  }

  bool boolean(const char* key, bool if_absent) {
    const Json::Value* v = find(key, {});
    if (v == nullptr || v->isNull()) return if_absent;
    if (!v->isBool()) {
      fail(key, "must be true or false, got " + compact(*v));
      return if_absent;
    }
    return v->asBool();
  }

  std::string string(const char* key, const std::string& if_absent) {
    const Json::Value* v = find(key, {});
    if (v == nullptr || v->isNull()) return if_absent;
    if (!v->isString()) {
      fail(key, "must be a string, got " + compact(*v));
      return if_absent;
    }
    return v->asString();
  }

  std::vector<double> numbers(const char* key) {
    std::vector<double> out;
    const Json::Value* v = find(key, {});
    if (v == nullptr || v->isNull()) {
      fail(key, "is required");
      return out;
    }
    if (!v->isArray()) {
      fail(key, "must be a list of numbers, got " + compact(*v));
      return out;
    }
    for (const Json::Value& x : *v) {
      if (!x.isNumeric()) {
        fail(key, "must be a list of numbers, got " + compact(*v));
        return {};
      }
      out.push_back(x.asDouble());
    }
    return out;
  }

  void fail(const std::string& key, const std::string& message) {
    if (status_.is_ok()) status_ = Status(ErrorCode::kConfig, prefix_ + key + " " + message, file_);
  }

  // Takes over another reader's first problem (a nested object's).
  void adopt(const Status& s) {
    if (status_.is_ok() && !s.is_ok()) status_ = s;
  }

  const Status& status() const { return status_; }

  static std::string compact(const Json::Value& v) {
    Json::StreamWriterBuilder w;
    w["indentation"] = "";
    return Json::writeString(w, v);
  }

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
  std::string prefix_;
  Status status_;
};

// An unsupported setting: an error naming the value found, unless only the shape matters.
void unsupported(HfReader& r, HfRead mode, const std::string& key, const std::string& message) {
  if (mode == HfRead::kTrain) r.fail(key, message);
}

void read_gpt2(HfReader& r, HfRead mode, config::ModelConfig& m) {
  m.family = config::ModelFamily::kGpt2;
  m.vocab_size = r.integer("vocab_size", 50257);
  m.max_seq_len = r.integer("n_positions", 1024, {"n_ctx"});
  m.hidden_size = r.integer("n_embd", 768);
  m.num_layers = r.integer("n_layer", 12);
  m.num_heads = r.integer("n_head", 12);
  m.intermediate_size = r.integer("n_inner", 0);
  m.norm_eps = r.real("layer_norm_epsilon", 1e-5);
  m.tie_word_embeddings = r.boolean("tie_word_embeddings", true);
  const std::string act = r.string("activation_function", "gelu_new");
  if (act != "gelu_new") {
    unsupported(r, mode, "activation_function",
                "is '" + act + "'; Strata's GPT-2 uses the tanh GELU (\"gelu_new\")");
  }
}

// rope_scaling (4.x, wins when not null) or rope_parameters (5.x), with rope_theta and
// partial_rotary_factor from the dictionary or the top level, as transformers standardises them.
void read_rope(HfReader& r, const Json::Value& root, const std::string& type, HfRead mode,
               const std::string& file, config::ModelConfig& m) {
  config::RopeScaling& rope = m.arch.rope;
  const char* key = r.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  double theta = r.real("rope_theta", 10000.0);
  double partial = r.real("partial_rotary_factor", 1.0);
  // Phi3Config always has original_max_position_embeddings (4096 by default) at the top level,
  // and transformers prefers it to the dictionary's.
  if (type == "phi3")
    rope.original_max_positions = r.integer("original_max_position_embeddings", 4096);
  if (!r.has(key)) {
    m.rope_theta = theta;
    rope.partial_rotary_factor = partial;
  } else if (!r.at(key).isObject()) {
    r.fail(key, "must be an object, got " + HfReader::compact(r.at(key)));
    return;
  } else {
    HfReader d(root[key], file, std::string(key) + ".");
    m.rope_theta = d.real("rope_theta", theta);
    rope.partial_rotary_factor = d.real("partial_rotary_factor", partial);
    std::string name = d.string("rope_type", d.string("type", "default"));
    if (type == "phi3" && (name == "su" || name == "yarn")) name = "longrope";  // Phi3Config's rule
    const std::int64_t original =
        type == "phi3" ? rope.original_max_positions
                       : d.integer("original_max_position_embeddings", m.max_seq_len);
    if (name == "default") {
      rope.type = RopeType::kDefault;
    } else if (name == "linear" || name == "dynamic") {
      rope.type = name == "linear" ? RopeType::kLinear : RopeType::kDynamic;
      rope.factor = d.real("factor", -1.0);
      if (rope.factor <= 0) d.fail("factor", "is required for rope_type " + name);
    } else if (name == "llama3") {
      rope.type = RopeType::kLlama3;
      rope.factor = d.real("factor", -1.0);
      rope.low_freq_factor = d.real("low_freq_factor", -1.0);
      rope.high_freq_factor = d.real("high_freq_factor", -1.0);
      rope.original_max_positions = original;
      if (rope.factor <= 0 || rope.low_freq_factor <= 0 || rope.high_freq_factor <= 0) {
        d.fail("factor", "low_freq_factor and high_freq_factor are required for rope_type llama3");
      } else if (rope.high_freq_factor <= rope.low_freq_factor) {
        d.fail("high_freq_factor", fmt::format("{} must exceed low_freq_factor {}",
                                               rope.high_freq_factor, rope.low_freq_factor));
      }
    } else if (name == "yarn") {
      rope.type = RopeType::kYarn;
      rope.factor = d.real("factor", 0.0);
      rope.original_max_positions = original;
      rope.attention_factor = d.real("attention_factor", 0.0);
      rope.beta_fast = d.real("beta_fast", 0.0);
      rope.beta_slow = d.real("beta_slow", 0.0);
      rope.mscale = d.real("mscale", 0.0);
      rope.mscale_all_dim = d.real("mscale_all_dim", 0.0);
      rope.truncate = d.boolean("truncate", true);
    } else if (name == "longrope") {
      rope.type = RopeType::kLongRope;
      rope.factor = d.real("factor", 0.0);
      rope.original_max_positions = original;
      rope.attention_factor = d.real("attention_factor", 0.0);
      rope.short_factor = d.numbers("short_factor");
      rope.long_factor = d.numbers("long_factor");
    } else {
      unsupported(d, mode, "rope_type",
                  "is '" + name + "'; Strata implements the rope_type values " + kRopeTypes);
    }
    if (type == "phi3" && rope.type != RopeType::kDefault && rope.type != RopeType::kLongRope) {
      unsupported(d, mode, "rope_type",
                  "is '" + name + "'; Phi-3 models use \"default\" or \"longrope\"");
    }
    r.adopt(d.status());
  }
  if (rope.partial_rotary_factor > 1.0) {
    r.fail("partial_rotary_factor",
           fmt::format("is {}; valid: (0, 1]", rope.partial_rotary_factor));
  } else if (rope.partial_rotary_factor != 1.0 && type != "phi3") {
    unsupported(r, mode, "partial_rotary_factor",
                fmt::format("is {}; {} models rotate whole heads (1.0); Strata rotates part of "
                            "each head only for phi3",
                            rope.partial_rotary_factor, type));
  }
}

// Which layers use `sliding_window`: every layer (Mistral, Phi-3), or for Qwen2/Qwen3 only when
// use_sliding_window is set, the layers layer_types names (else those from max_window_layers on).
void read_window(HfReader& r, const std::string& type, HfRead mode, config::ModelConfig& m) {
  if (type == "llama") return;  // LlamaConfig has no sliding window; the key is carried through
  std::int64_t window = 0;
  if (r.has("sliding_window")) {
    window = r.integer("sliding_window", 0);
  } else if (!r.present("sliding_window") && type != "phi3") {
    window = 4096;  // absent, not null: MistralConfig's and the Qwen configs' default
  }
  if (type == "qwen2" || type == "qwen3") {
    if (!r.boolean("use_sliding_window", false)) window = 0;
    std::vector<bool> sliding;
    if (r.has("layer_types")) {
      const Json::Value& list = r.at("layer_types");
      if (!list.isArray() || static_cast<std::int64_t>(list.size()) != m.num_layers) {
        r.fail("layer_types",
               fmt::format("must list num_hidden_layers ({}) layer types", m.num_layers));
        return;
      }
      for (const Json::Value& t : list) {
        const std::string name = t.isString() ? t.asString() : HfReader::compact(t);
        if (name != "full_attention" && name != "sliding_attention") {
          unsupported(r, mode, "layer_types",
                      "holds '" + name + "'; valid: full_attention, sliding_attention");
        }
        sliding.push_back(name == "sliding_attention");
      }
    } else {
      const std::int64_t first = r.integer("max_window_layers", 28);
      for (std::int64_t l = 0; l < m.num_layers; ++l)
        sliding.push_back(l >= first);
    }
    bool any = false, all = true;
    for (bool s : sliding) {
      any = any || s;
      all = all && s;
    }
    if (!any) window = 0;
    if (window > 0 && !all) m.arch.sliding_layers = sliding;
  }
  m.attention_window = window;
}

void read_llama_like(HfReader& r, const Json::Value& root, const std::string& type,
                     const LlamaDefaults& d, HfRead mode, const std::string& file,
                     config::ModelConfig& m) {
  m.family = config::ModelFamily::kLlama;
  m.arch.hf_type = type;
  m.vocab_size = r.integer("vocab_size", d.vocab);
  m.max_seq_len = r.integer("max_position_embeddings", d.max_positions);
  m.hidden_size = r.integer("hidden_size", d.hidden);
  m.num_layers = r.integer("num_hidden_layers", d.layers);
  m.num_heads = r.integer("num_attention_heads", d.heads);
  m.num_kv_heads = r.integer("num_key_value_heads", d.kv_heads);
  m.intermediate_size = r.integer("intermediate_size", d.inner);
  m.arch.head_dim = r.integer("head_dim", d.head_dim);
  m.norm_eps = r.real("rms_norm_eps", d.eps);
  m.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") {
    unsupported(r, mode, "hidden_act", "is '" + act + "'; Strata's Llama family uses SiLU");
  }
  if (type == "llama" || type == "qwen3") {
    m.arch.qkv_bias = m.arch.o_bias = r.boolean("attention_bias", false);
  }
  if (type == "llama") m.arch.mlp_bias = r.boolean("mlp_bias", false);
  if (type == "qwen2") m.arch.qkv_bias = true;
  if (type == "qwen3") m.arch.qk_norm = true;
  // nn.Embedding(vocab, hidden, padding_idx=pad_token_id): that row learns nothing from inputs.
  if (r.has("pad_token_id") && r.at("pad_token_id").isIntegral()) {
    const std::int64_t pad = r.at("pad_token_id").asInt64();
    if (pad < 0 || pad >= m.vocab_size) {
      unsupported(r, mode, "pad_token_id",
                  fmt::format("is {}, outside the vocabulary [0, {}) (transformers refuses it as "
                              "the embedding's padding_idx)",
                              pad, m.vocab_size));
    } else {
      m.arch.padding_idx = pad;
    }
  }
  read_rope(r, root, type, mode, file, m);
  read_window(r, type, mode, m);
}

// The config.json keys Strata does not interpret, as compact JSON ("" when none).
std::string carried_keys(const Json::Value& root, const std::string& type) {
  const std::set<std::string> owned = owned_keys(type);
  Json::Value extra(Json::objectValue);
  for (const std::string& key : root.getMemberNames()) {
    if (owned.count(key) == 0) extra[key] = root[key];
  }
  if (extra.empty()) return "";
  Json::StreamWriterBuilder w;
  w["indentation"] = "";
  w["precision"] = 17;
  // Comments in the source (config.json may carry // comments) are not carried: jsoncpp writes
  // them back where they do not always parse again.
  w["commentStyle"] = "None";
  return Json::writeString(w, extra);
}

// config.json is a few KiB; anything near this is not one.
constexpr std::uint64_t kHfConfigBytesMax = std::uint64_t{16} << 20;

Result<Json::Value> parse_object(const std::string& text, const std::string& file) {
  JsonLimits limits;
  limits.bytes_max = kHfConfigBytesMax;
  limits.allow_comments = true;
  Result<Json::Value> root = parse_json_bounded(text, file, limits);
  if (!root.is_ok()) return Status(ErrorCode::kConfig, root.status().message(), file);
  if (!root->isObject()) return Status(ErrorCode::kConfig, "expected a JSON object", file);
  return root;
}

}  // namespace

Result<config::ModelConfig> read_hf_config(const std::string& path, HfRead mode) {
  std::string file = path;
  std::string dir;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    file = path + "/config.json";
    dir = path;
  } else {
    const std::size_t slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  Result<std::string> text = read_regular_file(file, kHfConfigBytesMax, "the model config");
  if (!text.is_ok()) {
    return Status(
        ErrorCode::kConfig,
        text.status().message() + " (give a Hugging Face model directory or its config.json)",
        file);
  }
  STRATA_ASSIGN_OR_RETURN(config::ModelConfig m, parse_hf_config(*text, file, mode));
  m.path = path;
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
  m.arch.source_dir = ec ? dir : absolute.lexically_normal().string();
  return m;
}

namespace {

Result<config::ModelConfig> parse_hf_json(const std::string& text, const std::string& file,
                                          HfRead mode) {
  STRATA_ASSIGN_OR_RETURN(const Json::Value root, parse_object(text, file));
  const std::string type = root.get("model_type", "").asString();
  HfReader r(root, file);
  config::ModelConfig m;
  LlamaDefaults defaults{};
  if (type == "gpt2") {
    read_gpt2(r, mode, m);
    m.arch.hf_type = "gpt2";
  } else if (llama_like(type, &defaults)) {
    read_llama_like(r, root, type, defaults, mode, file, m);
  } else {
    return Status(ErrorCode::kConfig,
                  fmt::format("model_type '{}' is not supported; valid: {}", type, kTypes), file);
  }
  m.arch.source_dtype = r.string("torch_dtype", r.string("dtype", ""));
  if (!r.status().is_ok()) return r.status();
  if (mode == HfRead::kShapeOnly) {
    // The parameter count does not depend on the RoPE variant: keep only what sizes its tables.
    const double partial = m.arch.rope.partial_rotary_factor;
    m.arch.rope = config::RopeScaling{};
    m.arch.rope.partial_rotary_factor = partial;
  }
  m.arch.extra_config = carried_keys(root, type);
  return m;
}

}  // namespace

Result<config::ModelConfig> parse_hf_config(const std::string& text, const std::string& file,
                                            HfRead mode) {
  try {
    return parse_hf_json(text, file, mode);
  } catch (const std::exception& e) {
    // A value of a type the reader did not expect (jsoncpp throws): named, never escaping.
    return Status(ErrorCode::kConfig, fmt::format("a value has the wrong type: {}", e.what()),
                  file);
  }
}

}  // namespace strata::model

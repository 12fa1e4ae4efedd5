#include "model/model_spec.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/shape_limits.h"

namespace strata::model {
namespace {

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
  s.arch = m.arch;
  const config::ModelArch& a = m.arch;
  if (a.head_dim > 0) {
    s.head_dim = a.head_dim;
  } else if (m.hidden_size % m.num_heads != 0) {
    return shape_error("num_heads", fmt::format("{} heads do not divide hidden_size {}",
                                                m.num_heads, m.hidden_size));
  } else {
    s.head_dim = m.hidden_size / m.num_heads;
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return shape_error("num_kv_heads", fmt::format("{} KV heads do not divide num_heads {}",
                                                   s.num_kv_heads, s.num_heads));
  }
  if (s.family == config::ModelFamily::kGpt2) {
    if (s.num_kv_heads != s.num_heads) {
      return shape_error("num_kv_heads", "GPT-2 has no grouped KV heads; leave it 0");
    }
    if (s.head_dim * s.num_heads != s.hidden_size || a.qkv_bias || a.o_bias || a.mlp_bias ||
        a.qk_norm || s.attention_window != 0 || a.rope.type != config::RopeType::kDefault) {
      return shape_error("family", "GPT-2 has none of the Llama family's options");
    }
  } else {
    const std::int64_t rotary = rotary_dim(s);
    if (rotary < 2 || rotary > s.head_dim) {
      return shape_error("num_heads", fmt::format("rotary embeddings need an even number of "
                                                  "rotated dimensions in [2, head size {}]; "
                                                  "head size x partial_rotary_factor gives {}",
                                                  s.head_dim, rotary));
    }
    if (s.head_dim % 2 != 0) {
      return shape_error("num_heads", fmt::format("head size {} is odd; rotary embeddings need an "
                                                  "even head size",
                                                  s.head_dim));
    }
    if (a.rope.type == config::RopeType::kLongRope) {
      for (const auto* factors : {&a.rope.short_factor, &a.rope.long_factor}) {
        if (static_cast<std::int64_t>(factors->size()) != rotary / 2) {
          return shape_error(
              "rope_parameters",
              fmt::format("longrope's short_factor and long_factor need {} values each (rotated "
                          "dimensions / 2), got {}",
                          rotary / 2, factors->size()));
        }
      }
    }
  }
  if (s.attention_window < 0) {
    return shape_error("sliding_window",
                       fmt::format("must be positive, got {}", s.attention_window));
  }
  if (!a.sliding_layers.empty() &&
      static_cast<std::int64_t>(a.sliding_layers.size()) != s.num_layers) {
    return shape_error("layer_types", fmt::format("names {} layers; the model has {}",
                                                  a.sliding_layers.size(), s.num_layers));
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

std::int64_t rotary_dim(const ModelShape& s) {
  // transformers: int(head_dim * partial_rotary_factor), rounded up to even by arange(0, dim, 2).
  const auto dim = static_cast<std::int64_t>(static_cast<double>(s.head_dim) *
                                             s.arch.rope.partial_rotary_factor);
  return (dim + 1) / 2 * 2;
}

std::int64_t attention_window_of(const ModelShape& s, int layer) {
  if (s.attention_window <= 0) return 0;
  if (s.arch.sliding_layers.empty()) return s.attention_window;
  return s.arch.sliding_layers[static_cast<std::size_t>(layer)] ? s.attention_window : 0;
}

std::string hf_model_type(const ModelShape& s) {
  if (!s.arch.hf_type.empty()) return s.arch.hf_type;
  return family_name(s.family);
}

Result<ModelShape> shape_of(const config::ModelConfig& model, HfRead mode) {
  if (model.path.empty()) return resolve_shape(model);
  STRATA_ASSIGN_OR_RETURN(config::ModelConfig from_file, read_hf_config(model.path, mode));
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
    const config::ModelArch& a = s.arch;
    block = h                                // input_layernorm
            + h * q + 2 * h * kv             // q_proj, k_proj, v_proj (Phi-3: qkv_proj)
            + q * h                          // o_proj
            + h                              // post_attention_layernorm
            + 3 * h * i                      // gate_proj, up_proj, down_proj (Phi-3: gate_up_proj)
            + (a.qkv_bias ? q + 2 * kv : 0)  // q/k/v biases
            + (a.o_bias ? h : 0)             // o_proj bias
            + (a.mlp_bias ? 2 * i + h : 0)   // gate/up/down biases
            + (a.qk_norm ? 2 * s.head_dim : 0);  // q_norm, k_norm
    final_norm = h;                              // norm
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
  // Scores and weighted values: 2 products of (T x D) per head per token, over the keys a query
  // sees: on average half of the sequence (causal), fewer under a sliding window.
  double attention = 0.0;
  const double t = static_cast<double>(seq_len);
  for (int l = 0; l < s.num_layers; ++l) {
    const std::int64_t window = attention_window_of(s, l);
    double keys = t / 2.0;
    if (window > 0 && window < seq_len) {
      const double w = static_cast<double>(window);
      keys = (w * (w + 1.0) / 2.0 + (t - w) * w) / t;
    }
    attention += 2.0 * q * keys;
  }
  const double head = static_cast<double>(s.vocab_size) * c;
  return 2.0 * (static_cast<double>(s.num_layers) * block + attention + head);
}

}  // namespace strata::model

// Model shape bounds (see shape_limits.h).
#include "model/shape_limits.h"

#include <fmt/format.h>

#include <cmath>

namespace strata::model {
namespace {

Status out_of_range(const char* key, const char* hf_names, double value, std::int64_t hi) {
  return Status(ErrorCode::kConfig,
                fmt::format("is {} (config.json: {}); valid: 1 to {}", value, hf_names, hi),
                fmt::format("strata.model.{}", key));
}

}  // namespace

Status check_model_dims(const config::ModelConfig& m) {
  struct Dim {
    const char* key;
    const char* hf_names;
    std::int64_t value;
    std::int64_t lo;
    std::int64_t hi;
  };
  const Dim dims[] = {
      {"num_layers", "n_layer, num_hidden_layers", m.num_layers, 1, kLayersMax},
      {"hidden_size", "n_embd, hidden_size", m.hidden_size, 1, kHiddenMax},
      {"vocab_size", "vocab_size", m.vocab_size, 1, kVocabMax},
      {"max_seq_len", "n_positions, max_position_embeddings", m.max_seq_len, 1, kSeqLenMax},
      {"intermediate_size", "n_inner, intermediate_size", m.intermediate_size, 0, kIntermediateMax},
      {"num_heads", "n_head, num_attention_heads", m.num_heads, 1, kHiddenMax},
      {"num_kv_heads", "num_key_value_heads", m.num_kv_heads, 0, kHiddenMax},
  };
  for (const Dim& d : dims) {
    if (d.value < d.lo || d.value > d.hi) {
      return Status(
          ErrorCode::kConfig,
          fmt::format("is {} (config.json: {}); valid: {} to {}", d.value, d.hf_names, d.lo, d.hi),
          fmt::format("strata.model.{}", d.key));
    }
  }
  if (m.attention_window < 0 || m.attention_window > kSeqLenMax) {
    return Status(ErrorCode::kConfig,
                  fmt::format("is {} (config.json: sliding_window); valid: 0 to {}",
                              m.attention_window, kSeqLenMax),
                  "strata.model.attention_window");
  }
  return Status::ok();
}

Status check_shape_limits(const ModelShape& s) {
  struct Dim {
    const char* key;
    const char* hf_names;
    std::int64_t value;
    std::int64_t hi;
  };
  const Dim dims[] = {
      {"num_layers", "n_layer, num_hidden_layers", s.num_layers, kLayersMax},
      {"hidden_size", "n_embd, hidden_size", s.hidden_size, kHiddenMax},
      {"vocab_size", "vocab_size", s.vocab_size, kVocabMax},
      {"max_seq_len", "n_positions, max_position_embeddings", s.max_seq_len, kSeqLenMax},
      {"intermediate_size", "n_inner, intermediate_size", s.intermediate_size, kIntermediateMax},
      {"num_heads", "n_head, num_attention_heads", s.num_heads, s.hidden_size},
      {"num_kv_heads", "num_key_value_heads", s.num_kv_heads, s.num_heads},
  };
  for (const Dim& d : dims) {
    if (d.value < 1 || d.value > d.hi) {
      return out_of_range(d.key, d.hf_names, static_cast<double>(d.value), d.hi);
    }
  }
  if (!std::isfinite(s.norm_eps) || !std::isfinite(s.rope_theta)) {
    return Status(
        ErrorCode::kConfig,
        fmt::format("norm_eps {} and rope_theta {} must be finite", s.norm_eps, s.rope_theta),
        "strata.model");
  }
  // The dimensions are bounded above, so every unit's count fits int64; their sum may not.
  double total = 0.0;
  for (const UnitSpec& unit : units(s)) {
    if (unit.params > kUnitParamsMax) {
      return Status(ErrorCode::kConfig,
                    fmt::format("unit '{}' would have {} parameters; at most {} per unit",
                                unit.name, unit.params, kUnitParamsMax),
                    "strata.model");
    }
    total += static_cast<double>(unit.params);
  }
  if (total > static_cast<double>(kTotalParamsMax)) {
    return Status(ErrorCode::kConfig,
                  fmt::format("the model would have {:.3g} parameters; at most {:.3g}", total,
                              static_cast<double>(kTotalParamsMax)),
                  "strata.model");
  }
  return Status::ok();
}

}  // namespace strata::model

// Unit layouts with Hugging Face names and shapes (see layout.h).
#include "model/layout.h"

#include <fmt/format.h>

#include "common/assert.h"
#include "common/units.h"

namespace strata::model {
namespace {

class UnitBuilder {
 public:
  UnitBuilder(UnitKind kind, int index, int layer, std::string name) {
    unit_.kind = kind;
    unit_.index = index;
    unit_.layer = layer;
    unit_.name = std::move(name);
  }
  int count() const { return static_cast<int>(unit_.tensors.size()); }
  // Adds a tensor; `fused` keeps it back to back with the previous one.
  UnitBuilder& add(std::string name, std::vector<std::int64_t> shape, bool fused = false) {
    std::int64_t numel = 1;
    for (std::int64_t d : shape)
      numel *= d;
    const std::int64_t offset =
        fused ? cursor_
              : static_cast<std::int64_t>(
                    align_up(static_cast<std::uint64_t>(cursor_), kTensorAlignElements));
    unit_.tensors.push_back({std::move(name), std::move(shape), offset, numel});
    cursor_ = offset + numel;
    return *this;
  }
  UnitLayout finish() {
    unit_.numel = cursor_;
    unit_.padded_numel = static_cast<std::int64_t>(
        align_up(static_cast<std::uint64_t>(std::max<std::int64_t>(cursor_, 1)), kUnitPadElements));
    return std::move(unit_);
  }

 private:
  UnitLayout unit_;
  std::int64_t cursor_ = 0;
};

// A Llama-family block's tensors in layout order (prefix "model.layers.l."), noting where each
// sits.
LlamaBlockSlots add_llama_block(UnitBuilder& u, const std::string& p, const ModelShape& s) {
  const config::ModelArch& a = s.arch;
  const bool phi3 = a.hf_type == "phi3";
  const std::int64_t c = s.hidden_size, inner = s.intermediate_size;
  const std::int64_t q = s.num_heads * s.head_dim, kv = s.num_kv_heads * s.head_dim;
  LlamaBlockSlots slots;
  slots.in_norm = u.count();
  u.add(p + "input_layernorm.weight", {c});
  slots.qkv_w = u.count();
  if (phi3) {
    u.add(p + "self_attn.qkv_proj.weight", {q + 2 * kv, c});
  } else {
    u.add(p + "self_attn.q_proj.weight", {q, c})
        .add(p + "self_attn.k_proj.weight", {kv, c}, true)
        .add(p + "self_attn.v_proj.weight", {kv, c}, true);
  }
  if (a.qkv_bias) {
    slots.qkv_b = u.count();
    u.add(p + "self_attn.q_proj.bias", {q})
        .add(p + "self_attn.k_proj.bias", {kv}, true)
        .add(p + "self_attn.v_proj.bias", {kv}, true);
  }
  if (a.qk_norm) {
    slots.q_norm = u.count();
    u.add(p + "self_attn.q_norm.weight", {s.head_dim});
    slots.k_norm = u.count();
    u.add(p + "self_attn.k_norm.weight", {s.head_dim});
  }
  slots.o_w = u.count();
  u.add(p + "self_attn.o_proj.weight", {c, q});
  if (a.o_bias) {
    slots.o_b = u.count();
    u.add(p + "self_attn.o_proj.bias", {c});
  }
  slots.post_norm = u.count();
  u.add(p + "post_attention_layernorm.weight", {c});
  slots.gate_up_w = u.count();
  if (phi3) {
    u.add(p + "mlp.gate_up_proj.weight", {2 * inner, c});
  } else {
    u.add(p + "mlp.gate_proj.weight", {inner, c}).add(p + "mlp.up_proj.weight", {inner, c}, true);
  }
  if (a.mlp_bias) {
    slots.gate_up_b = u.count();
    u.add(p + "mlp.gate_proj.bias", {inner}).add(p + "mlp.up_proj.bias", {inner}, true);
  }
  slots.down_w = u.count();
  u.add(p + "mlp.down_proj.weight", {c, inner});
  if (a.mlp_bias) {
    slots.down_b = u.count();
    u.add(p + "mlp.down_proj.bias", {c});
  }
  return slots;
}

}  // namespace

LlamaBlockSlots llama_block_slots(const ModelShape& spec) {
  UnitBuilder scratch(UnitKind::kBlock, 1, 0, "block.0");
  return add_llama_block(scratch, "", spec);
}

std::int64_t ModelLayout::padded_numel() const {
  std::int64_t total = 0;
  for (const UnitLayout& u : units)
    total += u.padded_numel;
  return total;
}

ModelLayout build_layout(const ModelShape& s, int shards) {
  STRATA_ASSERT(shards >= 1);
  ModelLayout layout;
  layout.tied = s.tie_word_embeddings;
  const std::int64_t c = s.hidden_size, v = s.vocab_size, inner = s.intermediate_size;
  const int head_index = static_cast<int>(s.num_layers) + 1;
  if (s.family == Family::kGpt2) {
    layout.units.push_back(UnitBuilder(UnitKind::kEmbedding, 0, -1, "embedding")
                               .add("transformer.wte.weight", {v, c})
                               .add("transformer.wpe.weight", {s.max_seq_len, c})
                               .finish());
    for (int l = 0; l < s.num_layers; ++l) {
      const std::string p = fmt::format("transformer.h.{}.", l);
      layout.units.push_back(UnitBuilder(UnitKind::kBlock, l + 1, l, fmt::format("block.{}", l))
                                 .add(p + "ln_1.weight", {c})
                                 .add(p + "ln_1.bias", {c})
                                 .add(p + "attn.c_attn.weight", {c, 3 * c})
                                 .add(p + "attn.c_attn.bias", {3 * c})
                                 .add(p + "attn.c_proj.weight", {c, c})
                                 .add(p + "attn.c_proj.bias", {c})
                                 .add(p + "ln_2.weight", {c})
                                 .add(p + "ln_2.bias", {c})
                                 .add(p + "mlp.c_fc.weight", {c, inner})
                                 .add(p + "mlp.c_fc.bias", {inner})
                                 .add(p + "mlp.c_proj.weight", {inner, c})
                                 .add(p + "mlp.c_proj.bias", {c})
                                 .finish());
    }
    UnitBuilder head(UnitKind::kHead, head_index, -1, "head");
    head.add("transformer.ln_f.weight", {c}).add("transformer.ln_f.bias", {c});
    if (!s.tie_word_embeddings) head.add("lm_head.weight", {v, c});
    layout.units.push_back(head.finish());
  } else {
    layout.units.push_back(UnitBuilder(UnitKind::kEmbedding, 0, -1, "embedding")
                               .add("model.embed_tokens.weight", {v, c})
                               .finish());
    for (int l = 0; l < s.num_layers; ++l) {
      UnitBuilder block(UnitKind::kBlock, l + 1, l, fmt::format("block.{}", l));
      add_llama_block(block, fmt::format("model.layers.{}.", l), s);
      layout.units.push_back(block.finish());
    }
    UnitBuilder head(UnitKind::kHead, head_index, -1, "head");
    head.add("model.norm.weight", {c});
    if (!s.tie_word_embeddings) head.add("lm_head.weight", {v, c});
    layout.units.push_back(head.finish());
  }
  if (shards > 1) {
    const auto pad =
        static_cast<std::uint64_t>(kUnitPadElements) * static_cast<std::uint64_t>(shards);
    for (UnitLayout& u : layout.units) {
      u.padded_numel = static_cast<std::int64_t>(
          align_up(static_cast<std::uint64_t>(std::max<std::int64_t>(u.numel, 1)), pad));
    }
  }
  return layout;
}

}  // namespace strata::model

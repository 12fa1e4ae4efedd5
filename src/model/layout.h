// How a model is cut into units and where each tensor lives inside its unit's flat buffer.
//
// Units, in order of use: 0 = embedding, 1..L = transformer blocks, L+1 = final norm + head.
// Each unit's parameters are one flat buffer: tensors one after another (each starting at a
// multiple of 64 elements, except the members of a fused group: Llama's q/k/v projections and
// gate/up projections (and their biases) sit back to back so one GEMM computes them together,
// which is also exactly Phi-3's fused qkv_proj / gate_up_proj tensors), padded to a multiple of
// 2048 elements so the buffer is a whole number of 4 KiB pages in fp32, bf16 and fp16 alike.
// A unit's gradient uses exactly the same layout.
//
// Tied embeddings: when tie_word_embeddings is set, the head unit holds only the final norm; it
// BORROWS the embedding unit's token table (tensor 0 of unit 0) for the logits and accumulates
// the logits' weight gradient into the embedding unit's gradient. So the tied weight exists once,
// in one unit, with one optimizer state, and the head's use of it is an explicit second use of
// unit 0 (the prefetch order is: 0, 1..L, L+1 + 0, then backward L..1, 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_spec.h"

namespace strata::model {

enum class UnitKind { kEmbedding, kBlock, kHead };

inline constexpr std::int64_t kTensorAlignElements = 64;
inline constexpr std::int64_t kUnitPadElements = 2048;

struct TensorSlot {
  std::string name;                 // Hugging Face name, e.g. "transformer.h.3.attn.c_attn.weight"
  std::vector<std::int64_t> shape;  // as Hugging Face stores it
  std::int64_t offset = 0;          // elements from the unit's start
  std::int64_t numel = 0;
};

struct UnitLayout {
  UnitKind kind = UnitKind::kBlock;
  int index = 0;     // unit number
  int layer = -1;    // block number for blocks, else -1
  std::string name;  // "embedding", "block.3", "head"
  std::vector<TensorSlot> tensors;
  std::int64_t numel = 0;         // elements up to the end of the last tensor
  std::int64_t padded_numel = 0;  // numel rounded up to kUnitPadElements
};

struct ModelLayout {
  std::vector<UnitLayout> units;
  bool tied = false;  // the head borrows unit 0's tensor 0
  int embedding_unit() const { return 0; }
  int head_unit() const { return static_cast<int>(units.size()) - 1; }
  int block_unit(int layer) const { return 1 + layer; }
  // Total padded elements over all units.
  std::int64_t padded_numel() const;
};

// Indices of each unit's tensors, in layout order.
namespace gpt2 {
enum EmbeddingTensor { kWte = 0, kWpe = 1 };
enum BlockTensor {
  kLn1W = 0,
  kLn1B,
  kAttnW,
  kAttnB,
  kProjW,
  kProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB
};
enum HeadTensor { kLnfW = 0, kLnfB = 1, kLmHead = 2 };  // kLmHead only when untied
}  // namespace gpt2
namespace llama {
enum EmbeddingTensor { kEmbed = 0 };
enum HeadTensor { kNorm = 0, kLmHead = 1 };  // kLmHead only when untied
}  // namespace llama

// Where a Llama-family block's tensors sit in its unit: indices into UnitLayout::tensors, -1 when
// the model has no such tensor. A fused group is named by its first member (q_proj, or Phi-3's
// qkv_proj; gate_proj, or Phi-3's gate_up_proj), the rest follow back to back.
struct LlamaBlockSlots {
  int in_norm = -1;  // input_layernorm (C)
  int qkv_w = -1;    // q/k/v projections ((H+2KV)D, C)
  int qkv_b = -1;    // their biases ((H+2KV)D)
  int q_norm = -1;   // per-head norm weights (D) each
  int k_norm = -1;
  int o_w = -1;        // o_proj (C, HD)
  int o_b = -1;        // (C)
  int post_norm = -1;  // post_attention_layernorm (C)
  int gate_up_w = -1;  // gate/up projections (2I, C)
  int gate_up_b = -1;  // (2I)
  int down_w = -1;     // down_proj (C, I)
  int down_b = -1;     // (C)
};
LlamaBlockSlots llama_block_slots(const ModelShape& spec);

// `shards` > 1 (ZeRO across that many ranks) pads every unit to a multiple of shards x
// kUnitPadElements instead, so each rank's shard is an equal, whole number of pages.
ModelLayout build_layout(const ModelShape& spec, int shards = 1);

}  // namespace strata::model

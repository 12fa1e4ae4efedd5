// How a model is cut into units and where each tensor lives inside its unit's flat buffer.
//
// Units, in order of use: 0 = embedding, 1..L = transformer blocks, L+1 = final norm + head.
// Each unit's parameters are one flat buffer: tensors one after another (each starting at a
// multiple of 64 elements, except the members of a fused group: Llama's q/k/v projections and
// gate/up projections sit back to back so one GEMM computes them together), padded to a multiple
// of 2048 elements so the buffer is a whole number of 4 KiB pages in fp32, bf16 and fp16 alike.
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
enum BlockTensor { kInNorm = 0, kQ, kK, kV, kO, kPostNorm, kGate, kUp, kDown };
enum HeadTensor { kNorm = 0, kLmHead = 1 };  // kLmHead only when untied
}  // namespace llama

// `shards` > 1 (ZeRO across that many ranks) pads every unit to a multiple of shards x
// kUnitPadElements instead, so each rank's shard is an equal, whole number of pages.
ModelLayout build_layout(const ModelShape& spec, int shards = 1);

}  // namespace strata::model

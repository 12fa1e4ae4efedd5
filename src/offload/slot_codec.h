// The optimizer state's slots as stored (TierPlan::state, kernels/cpu/state_codec.h): a slot is
// its shard's tiles one after the other, each at TierPlan::tile_offset and TierPlan::tile_bytes
// long, the same image in host memory, in a pipeline stage and on NVMe. A tile of a kind stored
// as fp32 or bf16 is its values; an 8-bit moment's tile is its n codes, then n / block fp32
// absmax values, then padding to 4 KiB.
// Whole-slot conversion to and from fp32 is for initialisation, checkpoints and views; the
// optimizer step itself hands the stored tiles to the Adam kernel, which decodes and re-encodes
// them in its pass.
#pragma once

#include <cstdint>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/state_codec.h"
#include "offload/plan.h"

namespace strata::offload {

// Tile arrays inside a stored tile of n elements starting at `tile`.
struct StoredTile {
  void* values = nullptr;   // fp32 / bf16 values, or 8-bit codes
  float* absmax = nullptr;  // 8-bit moments: n / block scales; else null
};
StoredTile stored_tile(const TierPlan& plan, SlotKind kind, void* tile, std::int64_t n);

// Whether `kind` is stored as plain fp32 (the image is the fp32 shard itself).
bool stored_as_fp32(const TierPlan& plan, SlotKind kind);
// The element type of a master or gradient slot (kF32 / kBF16).
kernels::DType stored_dtype(const TierPlan& plan, SlotKind kind);

// Unit u's slot image `stored` (TierPlan::shard_bytes) to fp32 `dst` (shard_numel elements).
void decode_slot(const TierPlan& plan, SlotKind kind, int unit, const void* stored, float* dst);
// fp32 `src` to the slot image `stored`: bf16 rounds to nearest even, 8-bit moments are coded
// per block as the Adam kernel codes them; padding is zeroed.
void encode_slot(const TierPlan& plan, SlotKind kind, int unit, const float* src, void* stored);

// Bytes of one stored value of `kind` (4 or 2; 1 for an 8-bit code).
std::uint64_t value_bytes(const TierPlan& plan, SlotKind kind);
// Whether `kind` carries per-block absmax values (8-bit moments).
bool has_absmax(const TierPlan& plan, SlotKind kind);
// Unit u's slot image from its values (shard_numel x value_bytes, contiguous) and, for 8-bit
// moments, its absmax (shard_numel / block, contiguous): what a checkpoint holds. Padding is
// zeroed.
void pack_slot(const TierPlan& plan, SlotKind kind, int unit, const void* values,
               const float* absmax, void* stored);

}  // namespace strata::offload

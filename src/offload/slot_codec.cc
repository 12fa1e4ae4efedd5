// The optimizer state's slots as stored (see slot_codec.h).
#include "offload/slot_codec.h"

#include <cstring>

#include "common/assert.h"

namespace strata::offload {
namespace {

kernels::Moment moment_of(SlotKind kind) {
  return kind == SlotKind::kExpAvg ? kernels::Moment::kExpAvg : kernels::Moment::kExpAvgSq;
}

bool is_moment(SlotKind kind) {
  return kind == SlotKind::kExpAvg || kind == SlotKind::kExpAvgSq;
}

}  // namespace

StoredTile stored_tile(const TierPlan& plan, SlotKind kind, void* tile, std::int64_t n) {
  StoredTile t;
  t.values = tile;
  if (is_moment(kind) && plan.state.moments == kernels::MomentFormat::kQ8) {
    t.absmax = reinterpret_cast<float*>(
        static_cast<char*>(tile) +
        kernels::moment_bytes(plan.state.moments, static_cast<std::uint64_t>(n)));
  }
  return t;
}

bool stored_as_fp32(const TierPlan& plan, SlotKind kind) {
  STRATA_ASSERT(kind != SlotKind::kParam);
  if (is_moment(kind)) return plan.state.moments == kernels::MomentFormat::kF32;
  return stored_dtype(plan, kind) == kernels::DType::kF32;
}

kernels::DType stored_dtype(const TierPlan& plan, SlotKind kind) {
  switch (kind) {
    case SlotKind::kMaster:
      return plan.state.master;
    case SlotKind::kGrad:
      return plan.state.grad;
    default:
      STRATA_ASSERT_MSG(false, "stored_dtype of a moment or of parameters");
      return kernels::DType::kF32;
  }
}

void decode_slot(const TierPlan& plan, SlotKind kind, int unit, const void* stored, float* dst) {
  const std::int64_t tiles = plan.units[static_cast<std::size_t>(unit)].tiles;
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::int64_t n = plan.tile_numel(unit, t);
    float* out = dst + plan.tile_begin(unit, t);
    auto* at =
        const_cast<char*>(static_cast<const char*>(stored)) + plan.tile_offset(kind, unit, t);
    if (is_moment(kind)) {
      const StoredTile s = stored_tile(plan, kind, at, n);
      kernels::decode_moment(plan.state.moments, moment_of(kind), s.values, s.absmax,
                             static_cast<std::size_t>(plan.state.block), out,
                             static_cast<std::size_t>(n));
    } else {
      kernels::decode_values(stored_dtype(plan, kind), at, out, static_cast<std::size_t>(n));
    }
  }
}

void encode_slot(const TierPlan& plan, SlotKind kind, int unit, const float* src, void* stored) {
  const std::int64_t tiles = plan.units[static_cast<std::size_t>(unit)].tiles;
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::int64_t n = plan.tile_numel(unit, t);
    const float* in = src + plan.tile_begin(unit, t);
    char* at = static_cast<char*>(stored) + plan.tile_offset(kind, unit, t);
    const std::uint64_t used = plan.slot_bytes(kind, n);
    if (is_moment(kind)) {
      const StoredTile s = stored_tile(plan, kind, at, n);
      kernels::encode_moment(plan.state.moments, moment_of(kind), in, s.values, s.absmax,
                             static_cast<std::size_t>(plan.state.block),
                             static_cast<std::size_t>(n));
    } else {
      kernels::encode_values(stored_dtype(plan, kind), in, at, static_cast<std::size_t>(n));
    }
    const std::uint64_t padded = plan.tile_bytes(kind, unit, t);
    if (padded > used) std::memset(at + used, 0, padded - used);
  }
}

std::uint64_t value_bytes(const TierPlan& plan, SlotKind kind) {
  if (is_moment(kind)) return kernels::moment_bytes(plan.state.moments, 1);
  return kernels::dtype_bytes(stored_dtype(plan, kind));
}

bool has_absmax(const TierPlan& plan, SlotKind kind) {
  return is_moment(kind) && plan.state.moments == kernels::MomentFormat::kQ8;
}

void pack_slot(const TierPlan& plan, SlotKind kind, int unit, const void* values,
               const float* absmax, void* stored) {
  const std::int64_t tiles = plan.units[static_cast<std::size_t>(unit)].tiles;
  const std::uint64_t vb = value_bytes(plan, kind);
  const auto block = static_cast<std::uint64_t>(plan.state.block);
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::int64_t n = plan.tile_numel(unit, t);
    const auto begin = static_cast<std::uint64_t>(plan.tile_begin(unit, t));
    char* at = static_cast<char*>(stored) + plan.tile_offset(kind, unit, t);
    const StoredTile s = stored_tile(plan, kind, at, n);
    std::memcpy(s.values, static_cast<const char*>(values) + begin * vb,
                static_cast<std::size_t>(n) * vb);
    if (s.absmax != nullptr) {
      std::memcpy(s.absmax, absmax + begin / block,
                  static_cast<std::size_t>(static_cast<std::uint64_t>(n) / block) * 4);
    }
    const std::uint64_t used = plan.slot_bytes(kind, n);
    const std::uint64_t padded = plan.tile_bytes(kind, unit, t);
    if (padded > used) std::memset(at + used, 0, padded - used);
  }
}

}  // namespace strata::offload

// A unit's optimizer state as fp32 (see unit_state.h).
#include "offload/unit_state.h"

#include <cstring>

#include "offload/slot_codec.h"

namespace strata::offload {

Result<const float*> read_unit_state(TierManager& tiers, SlotKind kind, int unit) {
  const TierPlan& plan = tiers.plan();
  const bool host = home_of(plan, unit, kind) == Tier::kHost;
  if (stored_as_fp32(plan, kind)) {
    if (host) return static_cast<const float*>(tiers.host_state(unit, kind));
    STRATA_TRY(tiers.read_slot(kind, unit, tiers.unit_scratch()));
    return static_cast<const float*>(tiers.unit_scratch());
  }
  // Compressed: decoded from the host home itself, or from a copy in the state scratch.
  void* stored = host ? tiers.host_slot(unit, kind) : tiers.raw_scratch();
  if (!host) STRATA_TRY(tiers.read_slot(kind, unit, stored));
  decode_slot(plan, kind, unit, stored, tiers.unit_scratch());
  return static_cast<const float*>(tiers.unit_scratch());
}

Status write_unit_state(TierManager& tiers, SlotKind kind, int unit, const float* src) {
  const TierPlan& plan = tiers.plan();
  const bool host = home_of(plan, unit, kind) == Tier::kHost;
  if (!stored_as_fp32(plan, kind)) {
    // Encoded straight into a host home, else into the state scratch and written from there.
    void* stored = host ? tiers.host_slot(unit, kind) : tiers.raw_scratch();
    encode_slot(plan, kind, unit, src, stored);
    return host ? Status::ok() : tiers.write_slot(kind, unit, stored);
  }
  if (home_of(plan, unit, kind) == Tier::kNvme && src != tiers.unit_scratch()) {
    // A swap-file write needs a 4 KiB-aligned source (write_slot): the unit scratch is one.
    const std::uint64_t bytes =
        static_cast<std::uint64_t>(plan.units[static_cast<std::size_t>(unit)].shard_numel) * 4;
    std::memcpy(tiers.unit_scratch(), src, static_cast<std::size_t>(bytes));
    src = tiers.unit_scratch();
  }
  return tiers.write_slot(kind, unit, src);
}

}  // namespace strata::offload

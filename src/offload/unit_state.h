// A unit's optimizer state (master, moments, gradient; never the parameters) as fp32, moved
// between its home and the unit scratch and decoded or encoded on the way as the plan stores it
// (slot_codec.h): the one implementation behind OffloadStore::view / store and the Python
// binding's load_state / store_state. Initialisation, checkpoints and views use it; the
// optimizer step hands the stored tiles to the Adam kernel instead.
#pragma once

#include "common/status.h"
#include "offload/plan.h"
#include "offload/tier_manager.h"

namespace strata::offload {

// Unit u's fp32 `kind` shard: the host home itself when it is stored there as fp32, else the
// unit scratch, read from the swap file and decoded as needed (valid until the scratch is reused).
Result<const float*> read_unit_state(TierManager& tiers, SlotKind kind, int unit);

// Stores unit u's fp32 `kind` shard from `src` (any memory, the unit scratch included) into its
// home, encoded as the plan stores it (through the state scratch when the home is a swap file).
Status write_unit_state(TierManager& tiers, SlotKind kind, int unit, const float* src);

}  // namespace strata::offload

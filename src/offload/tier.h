// The words every part of the offload engine shares: the three tiers state can live in, and the
// five kinds of state (slots) each unit's shard holds.
#pragma once

#include <cstdint>

namespace strata::offload {

// Where a byte lives: the accelerator's memory, pinned host memory, or a swap file on NVMe.
enum class Tier : std::uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
inline constexpr int kTierCount = 3;

// "device", "host", "nvme".
const char* to_string(Tier tier);

// The state of one unit's shard, one slot per kind:
//   param       the parameters in the storage type (fp32, bf16 or fp16);
//   master, exp_avg, exp_avg_sq, grad   fp32: the master weights, Adam's two moments and the
//               accumulated gradient (the optimizer state, homed together).
enum class SlotKind : std::uint8_t { kParam = 0, kMaster, kExpAvg, kExpAvgSq, kGrad };
inline constexpr int kSlotKinds = 5;

// "param", "master", "exp_avg", "exp_avg_sq", "grad" (also the swap files' kind names and the
// suffixes of checkpoint tensors).
const char* to_string(SlotKind kind);

}  // namespace strata::offload

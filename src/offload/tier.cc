// Names of the tiers and slot kinds (see tier.h).
#include "offload/tier.h"

namespace strata::offload {

const char* to_string(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "unknown";
}

const char* to_string(SlotKind kind) {
  switch (kind) {
    case SlotKind::kParam:
      return "param";
    case SlotKind::kMaster:
      return "master";
    case SlotKind::kExpAvg:
      return "exp_avg";
    case SlotKind::kExpAvgSq:
      return "exp_avg_sq";
    case SlotKind::kGrad:
      return "grad";
  }
  return "unknown";
}

}  // namespace strata::offload

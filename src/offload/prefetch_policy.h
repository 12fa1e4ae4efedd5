// The prefetch policy: what to fetch ahead, what to evict, what to keep cached, decided from the
// recorded order of uses (UseOrder) and the plan's limits (PrefetchLimits, DeepSpeed's stage3_*
// settings). It decides only; FrameFetcher (frame_fetcher.h) carries the decisions out.
//   prefetch      after the first pass has recorded the order, walks the planned uses from the
//                 cursor and starts the framed units not on the device yet, in order, while
//                   - the units fetched ahead and not yet used total at most bucket_elements,
//                   - the units on the device (in use, cached, in flight) total at most
//                     live_elements_max,
//                 and stops at the first that cannot start (no frame or staging buffer);
//   pick_victim   the cached unit used farthest in the future goes first (never again this pass
//                 is farthest); a prefetch only evicts units needed after the one it fetches;
//   keep_cached   a released unit stays in its frame when its next planned use is within
//                 reuse_distance_max elements of parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "offload/plan.h"
#include "offload/use_order.h"

namespace strata::offload {

class FrameFetcher;

class PrefetchPolicy {
 public:
  explicit PrefetchPolicy(const TierPlan& plan);

  // The order of uses (passes begin and end here; acquire records each use).
  UseOrder& order() { return order_; }
  const UseOrder& order() const { return order_; }
  // The next planned use of `unit` from the cursor, or -1 (nothing recorded yet, or none).
  int next_use(int unit) const;

  // Starts what the limits allow (see the header comment): `start(unit)` fetches or hands off one
  // unit and returns false when it cannot. `prefetched` counts the fetches started.
  Status prefetch(const FrameFetcher& fetcher, const std::function<Result<bool>(int)>& start,
                  std::uint64_t* prefetched) const;
  // Of the frames of one class, `holders[i]` the unit in frame i that may be evicted (-1: not a
  // candidate), the frame whose unit goes to make room for `for_unit`; -1 when none may.
  int pick_victim(const std::vector<int>& holders, int for_unit, bool demand) const;
  // Whether `unit`, just released by its last user, stays cached.
  bool keep_cached(int unit) const;

 private:
  const TierPlan& plan_;
  const PrefetchLimits& limits_;
  UseOrder order_;
};

}  // namespace strata::offload

// The prefetch policy (see prefetch_policy.h).
#include "offload/prefetch_policy.h"

#include <limits>

#include "offload/frame_fetcher.h"

namespace strata::offload {
namespace {

// Uses a pass may record (UseOrder's fixed room): a training pass uses each unit at most twice
// (forward, then backward) and the tied embedding once more for the head, about 2 x units; twice
// that, plus a few, leaves room for a pass that diverges and is recorded whole.
constexpr int kUsesPerUnitMax = 4;
constexpr int kUsesSpare = 16;

constexpr int kNever = std::numeric_limits<int>::max();

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

}  // namespace

PrefetchPolicy::PrefetchPolicy(const TierPlan& plan)
    : plan_(plan),
      limits_(plan.prefetch),
      order_(static_cast<int>(plan.units.size()),
             kUsesPerUnitMax * static_cast<int>(plan.units.size()) + kUsesSpare) {}

int PrefetchPolicy::next_use(int unit) const {
  if (!order_.planned()) return -1;
  return order_.next_use(unit, order_.cursor());
}

Status PrefetchPolicy::prefetch(const FrameFetcher& fetcher,
                                const std::function<Result<bool>(int)>& start,
                                std::uint64_t* prefetched) const {
  if (!order_.planned() || limits_.bucket_elements == 0) return Status::ok();
  std::uint64_t ahead = 0, live = fetcher.live_elements();
  const std::uint64_t bucket = limits_.bucket_elements;
  for (int pos = order_.cursor(); pos < order_.size(); ++pos) {
    const int v = order_.at(pos);
    const UnitPlan& up = plan_.units[static_cast<std::size_t>(v)];
    if (!up.framed) continue;
    if (order_.next_use(v, order_.cursor()) != pos) continue;  // counted at its first use
    if (fetcher.users(v) > 0) continue;
    if (ahead + u64(up.padded_numel) > bucket) break;
    ahead += u64(up.padded_numel);
    if (fetcher.stage(v) != FrameFetcher::Stage::kAbsent) continue;
    if (live + u64(up.padded_numel) > limits_.live_elements_max) break;
    STRATA_ASSIGN_OR_RETURN(const bool started, start(v));
    if (!started) break;
    live += u64(up.padded_numel);
    ++*prefetched;
  }
  return Status::ok();
}

int PrefetchPolicy::pick_victim(const std::vector<int>& holders, int for_unit, bool demand) const {
  const int mine = demand ? -1 : (next_use(for_unit) < 0 ? kNever : next_use(for_unit));
  int best = -1, best_next = -1;
  for (std::size_t i = 0; i < holders.size(); ++i) {
    const int w = holders[i];
    if (w < 0) continue;
    int next = next_use(w);
    if (next < 0) next = kNever;
    if (!demand && next <= mine) continue;
    if (next > best_next) {
      best = static_cast<int>(i);
      best_next = next;
    }
  }
  return best;
}

bool PrefetchPolicy::keep_cached(int unit) const {
  const int next = next_use(unit);
  if (next < 0) return false;
  std::uint64_t distance = 0;
  for (int pos = order_.cursor(); pos < next; ++pos) {
    distance += u64(plan_.units[static_cast<std::size_t>(order_.at(pos))].padded_numel);
    if (distance > limits_.reuse_distance_max) return false;
  }
  return true;
}

}  // namespace strata::offload

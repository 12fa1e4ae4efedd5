// The order in which the runner uses units' parameters, keyed by unit id. The first pass of each
// kind (a training step, an evaluation) records it; later passes follow it with a cursor, which
// is what lets the prefetcher run ahead. A use that does not match the next expected one is a
// divergence: the cursor jumps to the unit's next planned use if there is one (the prefetcher
// then only lost the units it skipped), and at the end of a diverged pass the observed order
// replaces the plan. Nothing here can produce a wrong result: a unit the plan did not foresee is
// simply fetched on demand.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::offload {

enum class Pass : std::uint8_t { kTrain = 0, kEval = 1 };
inline constexpr int kPassKinds = 2;

class UseOrder {
 public:
  // Room for `uses_max` uses per pass (fixed; more uses than that are followed on demand only).
  UseOrder(int units, int uses_max);

  // Starts a pass of `kind`.
  void begin(Pass kind);
  // A use of `unit`; returns false on a divergence from the recorded plan.
  bool use(int unit);
  // Ends the pass: the first pass of a kind, or a diverged one, becomes the plan.
  void end();

  // Whether the current pass follows a recorded plan (false while recording the first one).
  bool planned() const { return planned_[static_cast<int>(kind_)]; }
  // Position in the plan of the next expected use.
  int cursor() const { return cursor_; }
  int size() const;
  int at(int position) const;
  // Position of the first use of `unit` at or after `from`, or -1.
  int next_use(int unit, int from) const;
  std::uint64_t divergences() const { return divergences_; }

 private:
  const std::vector<int>& plan() const { return plans_[static_cast<int>(kind_)]; }

  int units_;
  int uses_max_;
  Pass kind_ = Pass::kTrain;
  std::vector<int> plans_[kPassKinds];
  bool planned_[kPassKinds] = {false, false};
  std::vector<int> observed_;  // this pass, capacity uses_max
  bool diverged_ = false;
  int cursor_ = 0;
  std::uint64_t divergences_ = 0;
};

}  // namespace strata::offload

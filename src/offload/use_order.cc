// The recorded order of unit uses (see use_order.h).
#include "offload/use_order.h"

#include "common/assert.h"

namespace strata::offload {

UseOrder::UseOrder(int units, int uses_max) : units_(units), uses_max_(uses_max) {
  STRATA_ASSERT(units > 0 && uses_max > 0);
  for (auto& plan : plans_)
    plan.reserve(static_cast<std::size_t>(uses_max));
  observed_.reserve(static_cast<std::size_t>(uses_max));
}

void UseOrder::begin(Pass kind) {
  kind_ = kind;
  observed_.clear();
  diverged_ = false;
  cursor_ = 0;
}

bool UseOrder::use(int unit) {
  STRATA_ASSERT(unit >= 0 && unit < units_);
  if (static_cast<int>(observed_.size()) < uses_max_) observed_.push_back(unit);
  if (!planned()) return true;
  const std::vector<int>& p = plan();
  if (cursor_ < static_cast<int>(p.size()) && p[static_cast<std::size_t>(cursor_)] == unit) {
    ++cursor_;
    return true;
  }
  ++divergences_;
  diverged_ = true;
  const int next = next_use(unit, cursor_);
  if (next >= 0) cursor_ = next + 1;
  return false;
}

void UseOrder::end() {
  const int k = static_cast<int>(kind_);
  if (!planned_[k] || diverged_ ||
      static_cast<int>(observed_.size()) != static_cast<int>(plans_[k].size())) {
    plans_[k].assign(observed_.begin(), observed_.end());
    planned_[k] = true;
  }
  observed_.clear();
  cursor_ = 0;
}

int UseOrder::size() const {
  return static_cast<int>(plan().size());
}

int UseOrder::at(int position) const {
  STRATA_ASSERT(position >= 0 && position < size());
  return plan()[static_cast<std::size_t>(position)];
}

int UseOrder::next_use(int unit, int from) const {
  const std::vector<int>& p = plan();
  for (int i = from < 0 ? 0 : from; i < static_cast<int>(p.size()); ++i) {
    if (p[static_cast<std::size_t>(i)] == unit) return i;
  }
  return -1;
}

}  // namespace strata::offload

// The prefetch scheduler (see param_scheduler.h).
#include "offload/param_scheduler.h"

#include <fmt/format.h>

namespace strata::offload {
namespace {

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

// Stage 3 on several ranks: the unit's frame is whole only after an all-gather (sharding.h).
bool gathered(const TierPlan& plan, int unit) {
  const UnitPlan& up = plan.units[static_cast<std::size_t>(unit)];
  return up.framed && up.param_numel < up.padded_numel;
}

}  // namespace

ParamScheduler::ParamScheduler(TierManager& tiers, UpdateGate* gate, Sharding* sharding)
    : tiers_(tiers), gate_(gate), sharding_(sharding), plan_(tiers.plan()), policy_(tiers.plan()) {}

Result<std::unique_ptr<ParamScheduler>> ParamScheduler::create(TierManager& tiers, UpdateGate* gate,
                                                               Sharding* sharding) {
  std::unique_ptr<ParamScheduler> s(new ParamScheduler(tiers, gate, sharding));
  STRATA_ASSIGN_OR_RETURN(s->fetcher_, FrameFetcher::create(tiers, gate, &s->stats_));
  s->gathers_.resize(tiers.plan().units.size());
  return s;
}

void ParamScheduler::add_wait(std::chrono::steady_clock::time_point start) {
  stats_.wait_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

bool ParamScheduler::resident(int unit) const {
  return !plan_.units[static_cast<std::size_t>(unit)].framed ||
         fetcher_->stage(unit) == FrameFetcher::Stage::kResident;
}

Status ParamScheduler::finish_gather(int unit) {
  Gather& g = gathers_[static_cast<std::size_t>(unit)];
  STRATA_ASSERT(g.in_flight);
  g.in_flight = false;
  fetcher_->unhold(unit);  // the hold gather_ahead() took
  return sharding_->wait(g.handle, "gathering the parameters", unit);
}

Status ParamScheduler::wait_for_update(int unit) {
  if (gate_ == nullptr || gate_->params_ready(unit)) return Status::ok();
  const auto start = std::chrono::steady_clock::now();
  Trace* trace = tiers_.trace();
  const std::uint64_t begin_us = trace ? trace->now_us() : 0;
  Status s = gate_->wait_for_params(unit);
  add_wait(start);
  if (trace)
    trace->add(TraceLane::kComputeWait, "wait for update", begin_us, trace->now_us(), unit);
  return s;
}

Status ParamScheduler::gather_ahead() {
  // The unit planned next: its shard is brought in now (usually prefetched already) and its
  // all-gather runs while the current unit computes. Which unit that is, and whether a frame can
  // take it (a frame of its size that no acquire or hold is using), depend only on the order of
  // acquires and releases, which every rank shares, so every rank issues the same collectives in
  // the same order. Timing decides only how long the local fetch takes.
  const UseOrder& order = policy_.order();
  if (plan_.world == 1 || !order.planned() || order.cursor() >= order.size()) return Status::ok();
  const int v = order.at(order.cursor());
  if (!gathered(plan_, v)) return Status::ok();
  STRATA_ASSERT_MSG(sharding_ != nullptr, "stage 3 on several ranks needs their Sharding");
  Gather& g = gathers_[static_cast<std::size_t>(v)];
  if (g.in_flight || fetcher_->users(v) > 0) return Status::ok();  // gathered at its acquire
  if (!fetcher_->frame_available(v)) return Status::ok();
  STRATA_TRY(wait_for_update(v));
  const auto start = std::chrono::steady_clock::now();
  if (fetcher_->stage(v) == FrameFetcher::Stage::kAbsent) {
    STRATA_ASSIGN_OR_RETURN(bool started, fetcher_->start_fetch(v, true, policy_));
    STRATA_ASSERT(started);
  }
  STRATA_TRY(fetcher_->advance(v, true));
  add_wait(start);
  STRATA_ASSIGN_OR_RETURN(g.handle, sharding_->start_gather(v, fetcher_->frame_data(v)));
  g.in_flight = true;
  fetcher_->hold(v);  // held: not evicted while the gather writes its frame
  ++stats_.gathers;
  ++stats_.gathers_ahead;
  return Status::ok();
}

Status ParamScheduler::gather(int unit) {
  if (!gathered(plan_, unit)) return Status::ok();
  STRATA_ASSERT_MSG(sharding_ != nullptr, "stage 3 on several ranks needs their Sharding");
  if (gathers_[static_cast<std::size_t>(unit)].in_flight) {
    const auto start = std::chrono::steady_clock::now();
    Status s = finish_gather(unit);
    add_wait(start);
    return s;
  }
  // Every rank acquires the same units in the same order, so issuing here keeps the ranks'
  // collectives in step; whether a unit was cached depends on timing, so it is gathered anyway.
  Trace* trace = tiers_.trace();
  const std::uint64_t begin_us = trace ? trace->now_us() : 0;
  const auto start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(comm::Handle h,
                          sharding_->start_gather(unit, fetcher_->frame_data(unit)));
  STRATA_TRY(sharding_->wait(h, "gathering the parameters", unit));
  stats_.gathers += 1;
  add_wait(start);
  if (trace) {
    const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
    trace->add(TraceLane::kComputeWait, "all-gather", begin_us, trace->now_us(), unit,
               u64(up.padded_numel) * plan_.storage_bytes);
  }
  return Status::ok();
}

void ParamScheduler::begin_pass(Pass kind) {
  policy_.order().begin(kind);
  // Nothing here can report: a failure is kept and returned by the next acquire, poll or drain.
  if (fetcher_->first_error().is_ok()) {
    fetcher_->note(policy_.prefetch(
        *fetcher_, [this](int v) { return start_prefetch(v); }, &stats_.prefetches));
  }
}

void ParamScheduler::end_pass() {
  // A gather started ahead for a use that did not come (the pass diverged): finish it and drop its
  // hold, at the same point on every rank. A failure is kept (first_error()).
  for (std::size_t u = 0; u < gathers_.size(); ++u) {
    if (gathers_[u].in_flight) fetcher_->note(finish_gather(static_cast<int>(u)));
  }
  policy_.order().end();
}

Result<bool> ParamScheduler::start_prefetch(int unit) {
  if (gate_ != nullptr && !gate_->params_ready(unit)) {
    // Its update is pending: have the optimizer write it into a frame, where it can.
    if (!fetcher_->direct() ||
        plan_.units[static_cast<std::size_t>(unit)].param_home != Tier::kNvme)
      return false;
    return fetcher_->start_handoff(unit, policy_);
  }
  return fetcher_->start_fetch(unit, false, policy_);
}

Status ParamScheduler::poll() {
  STRATA_TRY(fetcher_->poll());
  return policy_.prefetch(
      *fetcher_, [this](int v) { return start_prefetch(v); }, &stats_.prefetches);
}

Result<const void*> ParamScheduler::acquire(int unit) {
  STRATA_TRY(fetcher_->first_error());
  policy_.order().use(unit);
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (!up.framed) return static_cast<const void*>(tiers_.device_param(unit));
  if (fetcher_->stage(unit) == FrameFetcher::Stage::kResident) {
    ++stats_.hits;
  } else {
    const auto start = std::chrono::steady_clock::now();
    Trace* trace = tiers_.trace();
    const std::uint64_t begin_us = trace ? trace->now_us() : 0;
    if (fetcher_->stage(unit) == FrameFetcher::Stage::kAbsent) {
      ++stats_.demand_fetches;
      STRATA_ASSIGN_OR_RETURN(bool started, fetcher_->start_fetch(unit, true, policy_));
      STRATA_ASSERT(started);
    } else {
      ++stats_.late;
    }
    STRATA_TRY(fetcher_->advance(unit, true));
    add_wait(start);
    if (trace)
      trace->add(TraceLane::kComputeWait, "wait for parameters", begin_us, trace->now_us(), unit);
  }
  fetcher_->hold(unit);
  STRATA_TRY(gather(unit));
  STRATA_TRY(gather_ahead());
  return static_cast<const void*>(fetcher_->frame_data(unit));
}

void ParamScheduler::release(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (!up.framed) return;
  if (fetcher_->unhold(unit) > 0) return;
  // The kernels that read the frame are queued by now: whoever writes it next waits for them.
  fetcher_->note(fetcher_->released(unit));
  if (up.persistent) return;
  // Keep it cached if it comes back soon; else give the frame up now.
  if (!policy_.keep_cached(unit)) fetcher_->evict(unit);
}

}  // namespace strata::offload

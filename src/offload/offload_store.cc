// All training state behind the UnitStore seam (see offload_store.h).
#include "offload/offload_store.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <limits>

#include "common/clock.h"
#include "common/fault_points.h"
#include "offload/slot_codec.h"
#include "offload/unit_state.h"

namespace strata::offload {

OffloadStore::OffloadStore(TierManager& tiers, OptimizerPipeline& pipeline, Sharding& sharding)
    : tiers_(tiers), pipeline_(pipeline), sharding_(sharding) {}

Status OffloadStore::guard(Status s) {
  if (!failure_.is_ok()) return failure_;
  if (!s.is_ok()) {
    failure_ = Status(s.code(),
                      s.message() +
                          " (training state is inconsistent from here on: resume from "
                          "the last checkpoint)",
                      s.context());
  }
  return s;
}

Result<std::unique_ptr<OffloadStore>> OffloadStore::create(TierManager& tiers,
                                                           OptimizerPipeline& pipeline,
                                                           Sharding& sharding) {
  std::unique_ptr<OffloadStore> s(new OffloadStore(tiers, pipeline, sharding));
  STRATA_ASSIGN_OR_RETURN(s->grads_, GradPath::create(tiers, &sharding));
  STRATA_ASSIGN_OR_RETURN(s->scheduler_, ParamScheduler::create(tiers, &pipeline, &sharding));
  s->progress_ = std::make_unique<Progress>(pipeline, *s->grads_, *s->scheduler_);
  const TierPlan& p = tiers.plan();
  s->regather_.assign(p.units.size(), 0);
  const model::ModelLayout& layout = tiers.layout();
  s->ranges_.reserve(layout.units.size());
  for (const model::UnitLayout& unit : layout.units)
    s->ranges_.push_back(unit_ranges(unit));
  s->apart_current_.assign(layout.units.size(), 0);
  s->compute_.resize(p.classes.size());
  for (std::size_t k = 0; k < p.classes.size(); ++k) {
    for (int i = 0; i < p.classes[k].compute_slots; ++i)
      s->compute_[k].push_back(ComputeSlot{tiers.compute_slot(static_cast<int>(k), i)});
  }
  return s;
}

float* OffloadStore::fill_buffer(SlotKind kind, int unit) {
  if (home_of(tiers_.plan(), unit, kind) == Tier::kHost && stored_as_fp32(tiers_.plan(), kind))
    return tiers_.host_state(unit, kind);
  return tiers_.unit_scratch();
}

Status OffloadStore::store(SlotKind kind, int unit, const float* src) {
  if (!failure_.is_ok()) return failure_;
  apart_current_[static_cast<std::size_t>(unit)] = 0;  // the parameters may change
  return guard(write_unit_state(tiers_, kind, unit, src));
}

Result<const void*> OffloadStore::view_stored(SlotKind kind, int unit) {
  if (home_of(tiers_.plan(), unit, kind) == Tier::kHost)
    return static_cast<const void*>(tiers_.host_slot(unit, kind));
  if (!failure_.is_ok()) return failure_;
  void* scratch = stored_as_fp32(tiers_.plan(), kind) ? static_cast<void*>(tiers_.unit_scratch())
                                                      : tiers_.raw_scratch();
  STRATA_TRY(guard(tiers_.read_slot(kind, unit, scratch)));
  return static_cast<const void*>(scratch);
}

Status OffloadStore::store_stored(SlotKind kind, int unit, const void* stored) {
  if (!failure_.is_ok()) return failure_;
  apart_current_[static_cast<std::size_t>(unit)] = 0;
  const UnitPlan& up = tiers_.plan().units[static_cast<std::size_t>(unit)];
  if (up.optim_home == Tier::kNvme) {
    void* scratch = stored_as_fp32(tiers_.plan(), kind) ? static_cast<void*>(tiers_.unit_scratch())
                                                        : tiers_.raw_scratch();
    if (stored != scratch) {
      std::memcpy(scratch, stored, static_cast<std::size_t>(tiers_.plan().shard_bytes(kind, unit)));
    }
    stored = scratch;
  }
  return guard(tiers_.write_slot(kind, unit, stored));
}

Result<const float*> OffloadStore::view(SlotKind kind, int unit) {
  // A host home is read as it is; after a failure nothing is read from another (failure()).
  if (home_of(tiers_.plan(), unit, kind) != Tier::kHost && !failure_.is_ok()) return failure_;
  Result<const float*> state = read_unit_state(tiers_, kind, unit);
  if (!state.is_ok()) return guard(state.status());
  return state;
}

Status OffloadStore::refresh(bool zero_moments) {
  STRATA_TRY(finish_optimizer());
  STRATA_TRY(scheduler_->drain());
  // Kernels still queued may read the parameters about to be rewritten in every home.
  STRATA_TRY(guard(tiers_.backend().synchronize(backend::StreamKind::kCompute)));
  const TierPlan& p = tiers_.plan();
  for (int u = 0; u < units(); ++u) {
    const UnitPlan& up = p.units[static_cast<std::size_t>(u)];
    if (zero_moments) {
      for (SlotKind kind : {SlotKind::kExpAvg, SlotKind::kExpAvgSq}) {
        float* buffer = fill_buffer(kind, u);
        std::memset(buffer, 0, static_cast<std::size_t>(up.shard_numel) * 4);
        STRATA_TRY(store(kind, u, buffer));
      }
    }
    STRATA_TRY(tiers_.refresh_params(u));
    scheduler_->invalidate(u);
    apart_current_[static_cast<std::size_t>(u)] = 0;
    regather_[static_cast<std::size_t>(u)] = sharding_.regathers_params(u);
  }
  for (auto& pool : compute_) {
    for (ComputeSlot& slot : pool)
      slot.unit = -1;
  }
  return Status::ok();
}

void OffloadStore::begin_micro_batch(bool first, bool last, std::int64_t sequence) {
  last_micro_batch_ = last;
  preloaded_ = false;
  grads_->begin_micro_batch(first, last, sequence);
  scheduler_->begin_pass(Pass::kTrain);
}

Status OffloadStore::end_micro_batch() {
  scheduler_->end_pass();
  return guard(progress_->poll());
}

Status OffloadStore::finish_backward() {
  STRATA_TRY(guard(grads_->drain()));
  return guard(scheduler_->drain());
}

Status OffloadStore::start_optimizer(const PipelineStep& step, bool wait) {
  STRATA_TRY(guard(scheduler_->drain()));
  // Every parameter is about to change: device copies are stale from here on, and the
  // prefetcher waits for each unit's update (the update gate, params_ready).
  for (int u = 0; u < units(); ++u) {
    scheduler_->invalidate(u);
    regather_[static_cast<std::size_t>(u)] = sharding_.regathers_params(u);
    apart_current_[static_cast<std::size_t>(u)] = 0;
  }
  for (auto& pool : compute_) {
    for (ComputeSlot& slot : pool) {
      STRATA_ASSERT(slot.users == 0);
      slot.unit = -1;
    }
  }
  STRATA_TRY(guard(pipeline_.start(step)));
  return wait ? finish_optimizer() : Status::ok();
}

Status OffloadStore::skip_optimizer() {
  return guard(pipeline_.cancel_preload());
}

Status OffloadStore::finish_optimizer() {
  const auto start = std::chrono::steady_clock::now();
  Status s = pipeline_.finish();
  counters_.compute_wait_ms += ms_since(start);
  return guard(s);
}

void OffloadStore::begin_eval_batch() {
  scheduler_->begin_pass(Pass::kEval);
}

void OffloadStore::end_eval_batch() {
  scheduler_->end_pass();
}

Status OffloadStore::wait_for_update(int unit, bool whole) {
  if (whole ? pipeline_.unit_done(unit) : pipeline_.params_ready(unit)) return Status::ok();
  const auto start = std::chrono::steady_clock::now();
  Trace* trace = tiers_.trace();
  const std::uint64_t begin_us = trace ? trace->now_us() : 0;
  // Waiting for the parameters also lets the next tiles move (their Adam runs now, their writes
  // during this unit's compute).
  Status s = whole ? pipeline_.wait_unit(unit) : pipeline_.wait_for_params(unit);
  if (s.is_ok()) s = progress_->poll_updates();
  counters_.compute_wait_ms += ms_since(start);
  if (trace) {
    trace->add(TraceLane::kComputeWait, "wait for update", begin_us, trace->now_us(), unit);
  }
  return guard(s);
}

Status OffloadStore::regather(int unit) {
  // ZeRO 1 and 2: this rank updated its shard of the unit's device parameters; the rest comes
  // from the other ranks, in place. Every rank does this at its first acquire of the unit after
  // an update, in the same order, so the collectives stay in step.
  const auto start = std::chrono::steady_clock::now();
  Status s = sharding_.regather_params(unit);
  counters_.compute_wait_ms += ms_since(start);
  regather_[static_cast<std::size_t>(unit)] = 0;
  return guard(s);
}

Status OffloadStore::gather_masters(int unit, float* whole) {
  STRATA_TRY(finish_optimizer());
  STRATA_ASSIGN_OR_RETURN(const float* shard, view(SlotKind::kMaster, unit));
  return guard(sharding_.gather_unit(unit, shard, whole));
}

OffloadStore::~OffloadStore() {
  for (const std::vector<ComputeSlot>& pool : compute_) {
    for (const ComputeSlot& slot : pool)
      tiers_.backend().ops_f32().forget_widened(static_cast<const float*>(slot.data));
  }
}

Result<const float*> OffloadStore::acquire_params(int unit) {
  // A unit whose frame holds its new parameters already (handed off by the optimizer) needs no
  // wait: their write home may still be in flight, and fetches from the home wait for it
  // through the update gate.
  if (!scheduler_->holds_update(unit)) STRATA_TRY(wait_for_update(unit, false));
  if (regather_[static_cast<std::size_t>(unit)]) STRATA_TRY(regather(unit));
  const double before = scheduler_->stats().wait_ms;
  Result<const void*> fetched = scheduler_->acquire(unit);
  if (!fetched.is_ok()) return guard(fetched.status());
  STRATA_TRY(guard(progress_->poll()));
  const void* stored = *fetched;
  counters_.compute_wait_ms += scheduler_->stats().wait_ms - before;
  const TierPlan& p = tiers_.plan();
  if (p.storage == kernels::DType::kF32) return static_cast<const float*>(stored);
  const UnitPlan& up = p.units[static_cast<std::size_t>(unit)];
  std::vector<ComputeSlot>& pool = compute_[static_cast<std::size_t>(up.size_class)];
  // The fp32 copy and the 16-bit parameters it came from stay as they are until the unit is
  // released: the backend may read GEMM operands from the 16-bit ones (Ops::note_widened).
  for (ComputeSlot& slot : pool) {
    if (slot.unit == unit) {
      ++slot.users;
      widen(slot, unit, stored, true);
      return static_cast<const float*>(slot.data);
    }
  }
  for (ComputeSlot& slot : pool) {
    if (slot.users == 0) {
      slot.unit = unit;
      slot.users = 1;
      widen(slot, unit, stored, false);
      return static_cast<const float*>(slot.data);
    }
  }
  scheduler_->release(unit);
  return Status(
      ErrorCode::kInternal,
      fmt::format("unit {} needs an fp32 parameter copy but all {} of its size are in use",
                  layout().units[static_cast<std::size_t>(unit)].name, pool.size()));
}

void OffloadStore::widen(ComputeSlot& slot, int unit, const void* stored, bool again) {
  const TierPlan& p = tiers_.plan();
  const auto u = static_cast<std::size_t>(unit);
  const std::int64_t n = p.units[u].padded_numel;
  const UnitRanges& r = ranges_[u];
  backend::Ops<float>& ops = tiers_.backend().ops_f32();
  const auto count = static_cast<int>(r.n.size());
  if (again && slot.holds == Holds::kAll) {
    ops.note_widened(slot.data, stored, p.storage, n);
    return;
  }
  if (r.weights_n.empty() || !ops.note_widened_weights_only(slot.data, stored, p.storage, n)) {
    ops.cast_from(slot.data, stored, p.storage, n);
    slot.holds = Holds::kAll;
    ops.note_widened(slot.data, stored, p.storage, n);
    return;
  }
  // The GEMMs read the weights from `stored`. The other tensors are read from their area apart,
  // widened there once per change of the parameters, or else widened into the copy.
  float* apart = tiers_.kept_apart(unit);
  if (apart != nullptr &&
      ops.note_kept_apart(slot.data, apart, r.begin.data(), r.n.data(), r.at.data(), count)) {
    if (!apart_current_[u]) {
      ops.cast_from_ranges(apart, stored, p.storage, r.begin.data(), r.n.data(), count,
                           r.at.data());
      apart_current_[u] = 1;
    }
    if (again) return;
    slot.holds = Holds::kNothing;
  } else {
    if (again && slot.holds == Holds::kOthers) return;
    ops.cast_from_ranges(slot.data, stored, p.storage, r.begin.data(), r.n.data(), count,
                         r.begin.data());
    slot.holds = Holds::kOthers;
  }
  if (poison_weights_for_test()) {
    // Whatever the copy does not hold: NaN.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (slot.holds == Holds::kNothing) {
      ops.scale(slot.data, n, nan);
    } else {
      for (std::size_t i = 0; i < r.weights_n.size(); ++i)
        ops.scale(slot.data + r.weights_begin[i], r.weights_n[i], nan);
    }
  }
}

void OffloadStore::release_params(int unit) {
  const TierPlan& p = tiers_.plan();
  if (p.storage != kernels::DType::kF32) {
    bool found = false;
    for (ComputeSlot& slot :
         compute_[static_cast<std::size_t>(p.units[static_cast<std::size_t>(unit)].size_class)]) {
      if (slot.unit == unit && slot.users > 0) {
        if (--slot.users == 0)
          tiers_.backend().ops_f32().forget_widened(static_cast<const float*>(slot.data));
        found = true;
        break;
      }
    }
    STRATA_ASSERT_MSG(found, "release_params of a unit that was not acquired");
  }
  scheduler_->release(unit);
}

Result<float*> OffloadStore::acquire_grads(int unit) {
  STRATA_TRY(wait_for_update(unit, true));
  if (last_micro_batch_ && !preloaded_) {
    // The backward of the step's last micro-batch has begun: read the first optimizer tiles'
    // state ahead (the step itself must wait for the global norm).
    preloaded_ = true;
    STRATA_TRY(finish_optimizer());
    STRATA_TRY(guard(pipeline_.preload()));
  }
  const double before = grads_->wait_ms();
  Result<float*> r = grads_->acquire(unit);
  counters_.compute_wait_ms += grads_->wait_ms() - before;
  if (!r.is_ok()) return guard(r.status());
  STRATA_TRY(guard(progress_->poll()));
  return r;
}

Status OffloadStore::grads_ready(int unit) {
  const double before = grads_->wait_ms();
  Status s = grads_->ready(unit);
  counters_.compute_wait_ms += grads_->wait_ms() - before;
  STRATA_TRY(guard(s));
  return guard(progress_->poll());
}

}  // namespace strata::offload

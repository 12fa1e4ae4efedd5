// The three-deep optimizer pipeline (see optimizer_pipeline.h).
#include "optim/optimizer_pipeline.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

namespace strata::optim {
namespace {

using tier::SlotKind;
using tier::Tier;

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

constexpr SlotKind kStateKinds[4] = {SlotKind::kMaster, SlotKind::kExpAvg, SlotKind::kExpAvgSq,
                                     SlotKind::kGrad};

}  // namespace

OptimizerPipeline::OptimizerPipeline(tier::TierManager& tiers, AdamOptimizer& adam)
    : tiers_(tiers), backend_(tiers.backend()), plan_(tiers.plan()), adam_(adam) {}

OptimizerPipeline::~OptimizerPipeline() {
  if (active_) {
    (void)finish();
  } else {
    (void)cancel_preload();
  }
  for (Slot& s : slots_) {
    if (s.copied.valid()) backend_.destroy_event(s.copied);
  }
}

Result<std::unique_ptr<OptimizerPipeline>> OptimizerPipeline::create(tier::TierManager& tiers,
                                                                     AdamOptimizer& adam) {
  std::unique_ptr<OptimizerPipeline> p(new OptimizerPipeline(tiers, adam));
  const tier::TierPlan& plan = tiers.plan();
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    for (std::int64_t t = 0; t < plan.units[u].tiles; ++t)
      p->tiles_.push_back(Tile{static_cast<int>(u), t});
  }
  p->params_tiles_.assign(plan.units.size(), 0);
  p->done_tiles_.assign(plan.units.size(), 0);
  p->depth_ = plan.pipeline_depth;
  p->slots_.resize(static_cast<std::size_t>(plan.pipeline_depth));
  for (Slot& s : p->slots_) {
    STRATA_ASSIGN_OR_RETURN(s.copied, tiers.backend().create_event());
  }
  return p;
}

float* OptimizerPipeline::stage(int slot, int array) const {
  return reinterpret_cast<float*>(tiers_.pipeline_area() + plan_.pipeline_offset(slot, array));
}

bool OptimizerPipeline::nvme_state(std::int64_t tile) const {
  const Tile& t = tiles_[static_cast<std::size_t>(tile)];
  return plan_.units[static_cast<std::size_t>(t.unit)].optim_home == Tier::kNvme;
}

bool OptimizerPipeline::params_ready(int unit) const {
  return !active_ || params_tiles_[static_cast<std::size_t>(unit)] ==
                         plan_.units[static_cast<std::size_t>(unit)].tiles;
}

bool OptimizerPipeline::unit_done(int unit) const {
  return !active_ || done_tiles_[static_cast<std::size_t>(unit)] ==
                         plan_.units[static_cast<std::size_t>(unit)].tiles;
}

Status OptimizerPipeline::issue_read(Slot& slot, int array) {
  const Tile& t = tiles_[static_cast<std::size_t>(slot.tile)];
  const int s = static_cast<int>(&slot - slots_.data());
  STRATA_ASSIGN_OR_RETURN(slot.reads[array],
                          tiers_.read_tile(kStateKinds[array], t.unit, t.index, stage(s, array),
                                           io::Priority::kPrefetch));
  slot.read_issued[array] = true;
  slot.read_done[array] = false;
  return Status::ok();
}

Status OptimizerPipeline::issue_reads(Slot& slot, std::int64_t tile, bool with_grad) {
  STRATA_ASSERT(slot.state == SlotState::kFree);
  slot.tile = tile;
  slot.state = SlotState::kReading;
  for (int a = 0; a < 4; ++a)
    slot.read_issued[a] = slot.read_done[a] = false;
  Trace* trace = tiers_.trace();
  slot.read_begin_us = trace ? trace->now_us() : 0;
  if (!nvme_state(tile)) return Status::ok();
  for (int a = 0; a < (with_grad ? 4 : 3); ++a)
    STRATA_TRY(issue_read(slot, a));
  return Status::ok();
}

Status OptimizerPipeline::poll_reads(Slot& slot, bool block, bool* done) {
  *done = false;
  Status first;
  for (int a = 0; a < 4; ++a) {
    if (!slot.read_issued[a] || slot.read_done[a]) continue;
    std::optional<Status> r =
        (block || !first.is_ok())
            ? std::optional<Status>(tiers_.wait(kStateKinds[a], slot.reads[a]))
            : tiers_.poll(kStateKinds[a], slot.reads[a]);
    if (!r.has_value()) continue;
    slot.read_done[a] = true;
    if (!r->is_ok() && first.is_ok()) {
      first = *r;
      a = -1;  // wait for the tile's other reads before reporting
    }
  }
  if (!first.is_ok()) {
    const Tile& t = tiles_[static_cast<std::size_t>(slot.tile)];
    return first.with_context(
        fmt::format("optimizer step, {} tile {}",
                    tiers_.layout().units[static_cast<std::size_t>(t.unit)].name, t.index));
  }
  for (int a = 0; a < 4; ++a) {
    if (slot.read_issued[a] && !slot.read_done[a]) return Status::ok();
  }
  *done = true;
  return Status::ok();
}

Status OptimizerPipeline::compute(Slot& slot) {
  const int s = static_cast<int>(&slot - slots_.data());
  const Tile& t = tiles_[static_cast<std::size_t>(slot.tile)];
  const tier::UnitPlan& up = plan_.units[static_cast<std::size_t>(t.unit)];
  const std::int64_t begin = plan_.tile_begin(t.unit, t.index);
  const std::int64_t n = plan_.tile_numel(t.unit, t.index);
  const std::uint64_t c = plan_.storage_bytes;
  const bool nvme = up.optim_home == Tier::kNvme;
  Trace* trace = tiers_.trace();
  if (trace && nvme) {
    trace->add(TraceLane::kNvmeRead, "optimizer read", slot.read_begin_us, trace->now_us(), t.unit,
               u64(n) * 16);
  }
  float* arrays[4];
  for (int a = 0; a < 4; ++a)
    arrays[a] = nvme ? stage(s, a) : tiers_.host_state(t.unit, kStateKinds[a]) + begin;
  void* param_out = up.param_home == Tier::kHost
                        ? static_cast<char*>(tiers_.host_param(t.unit)) + u64(begin) * c
                        : static_cast<void*>(stage(s, 4));
  {
    TraceScope scope(trace, TraceLane::kAdam, "adam", t.unit, u64(n) * 4);
    const auto start = std::chrono::steady_clock::now();
    if (!skip_adam_) {
      AdamUpdate update;
      update.master = arrays[0];
      update.exp_avg = arrays[1];
      update.exp_avg_sq = arrays[2];
      update.grad = arrays[3];
      update.n = n;
      update.lr = step_.lr;
      update.grad_multiplier = step_.grad_multiplier;
      update.step = step_.step;
      update.copy_out = plan_.storage == kernels::DType::kF32 ? nullptr : param_out;
      update.copy_dtype = plan_.storage;
      adam_.update(update);
      if (plan_.storage == kernels::DType::kF32) std::memcpy(param_out, arrays[0], u64(n) * 4);
    }
    times_.adam_ms += ms_since(start);
  }
  // The new parameters to their home first (the next forward waits for them), then the state.
  slot.state = SlotState::kWriting;
  slot.write_begin_us = trace ? trace->now_us() : 0;
  slot.write_count = 0;
  slot.param_delivered = true;
  slot.param_write = false;
  if (up.param_home == Tier::kNvme) {
    STRATA_ASSIGN_OR_RETURN(slot.param_handle, tiers_.write_tile(SlotKind::kParam, t.unit, t.index,
                                                                 param_out, io::Priority::kDemand));
    slot.param_delivered = false;
    slot.param_write = true;
  } else if (up.param_home == Tier::kDevice) {
    STRATA_TRY(backend_.copy_async(backend::StreamKind::kHostToDevice,
                                   static_cast<char*>(tiers_.device_param(t.unit)) + u64(begin) * c,
                                   param_out, u64(n) * c));
    STRATA_TRY(backend_.record(slot.copied, backend::StreamKind::kHostToDevice));
    slot.param_delivered = false;
  }
  if (slot.param_delivered) param_delivered(t);
  if (nvme) {
    for (int a = 0; a < 3; ++a) {
      STRATA_ASSIGN_OR_RETURN(
          slot.writes[a],
          tiers_.write_tile(kStateKinds[a], t.unit, t.index, arrays[a], io::Priority::kPrefetch));
      slot.write_done[a] = false;
      slot.write_count = a + 1;
    }
  }
  return Status::ok();
}

void OptimizerPipeline::param_delivered(const Tile& tile) {
  ++params_tiles_[static_cast<std::size_t>(tile.unit)];
}

Status OptimizerPipeline::reap(Slot& slot, bool block_param, bool block_all, bool* freed) {
  *freed = false;
  const Tile& t = tiles_[static_cast<std::size_t>(slot.tile)];
  Status first;
  if (!slot.param_delivered) {
    const bool block = block_param || block_all;
    if (slot.param_write) {
      std::optional<Status> r =
          block ? std::optional<Status>(tiers_.wait(SlotKind::kParam, slot.param_handle))
                : tiers_.poll(SlotKind::kParam, slot.param_handle);
      if (r.has_value()) {
        slot.param_delivered = true;
        first = *r;
      }
    } else if (block) {
      first = backend_.synchronize(slot.copied);
      slot.param_delivered = true;
    } else if (backend_.query(slot.copied)) {
      slot.param_delivered = true;
    }
    if (slot.param_delivered && first.is_ok()) param_delivered(t);
  }
  for (int w = 0; w < slot.write_count; ++w) {
    if (slot.write_done[w]) continue;
    std::optional<Status> r =
        (block_all || !first.is_ok())
            ? std::optional<Status>(tiers_.wait(kStateKinds[w], slot.writes[w]))
            : tiers_.poll(kStateKinds[w], slot.writes[w]);
    if (!r.has_value()) continue;
    slot.write_done[w] = true;
    if (!r->is_ok() && first.is_ok()) first = *r;
  }
  if (!first.is_ok()) {
    // Let nothing of this tile stay in flight, then report.
    if (!slot.param_delivered && slot.param_write) {
      (void)tiers_.wait(SlotKind::kParam, slot.param_handle);
    }
    slot.param_delivered = true;
    for (int w = 0; w < slot.write_count; ++w) {
      if (!slot.write_done[w]) (void)tiers_.wait(kStateKinds[w], slot.writes[w]);
      slot.write_done[w] = true;
    }
    return first.with_context(
        fmt::format("optimizer step, {} tile {}",
                    tiers_.layout().units[static_cast<std::size_t>(t.unit)].name, t.index));
  }
  if (!slot.param_delivered) return Status::ok();
  for (int w = 0; w < slot.write_count; ++w) {
    if (!slot.write_done[w]) return Status::ok();
  }
  Trace* trace = tiers_.trace();
  if (trace && slot.write_count > 0) {
    trace->add(TraceLane::kNvmeWrite, "optimizer write", slot.write_begin_us, trace->now_us(),
               t.unit, u64(plan_.tile_numel(t.unit, t.index)) * 12);
  }
  slot.state = SlotState::kFree;
  *freed = true;
  ++done_;
  ++done_tiles_[static_cast<std::size_t>(t.unit)];
  if (done_ == static_cast<std::int64_t>(tiles_.size())) active_ = false;
  return Status::ok();
}

bool OptimizerPipeline::reached(Target target, int unit) const {
  switch (target) {
    case Target::kNone:
      return !active_;
    case Target::kParams:
      return params_ready(unit);
    case Target::kDone:
      return unit_done(unit);
    case Target::kAll:
      return !active_;
  }
  return true;
}

Status OptimizerPipeline::step(bool block, Target target, int unit) {
  const auto ntiles = static_cast<std::int64_t>(tiles_.size());
  while (!reached(target, unit)) {
    bool progress = false;
    // 1. Deliveries and writes that finished.
    for (Slot& slot : slots_) {
      if (slot.state != SlotState::kWriting) continue;
      const bool delivered = slot.param_delivered;
      bool freed = false;
      STRATA_TRY(reap(slot, false, false, &freed));
      progress = progress || freed || delivered != slot.param_delivered;
    }
    if (reached(target, unit)) break;
    // 2. Reads into free stages, up to `depth` tiles ahead.
    while (next_read_ < ntiles && slot_of(next_read_).state == SlotState::kFree) {
      STRATA_TRY(issue_reads(slot_of(next_read_), next_read_, true));
      ++next_read_;
      progress = true;
    }
    // 3. Adam on the next tile whose reads are done.
    if (next_compute_ < next_read_) {
      Slot& slot = slot_of(next_compute_);
      bool done = false;
      STRATA_TRY(poll_reads(slot, false, &done));
      if (done) {
        STRATA_TRY(compute(slot));
        ++next_compute_;
        progress = true;
      }
    }
    if (progress) continue;
    if (!block) break;
    // Nothing moved: block on what the target waits for first.
    const auto start = std::chrono::steady_clock::now();
    Slot* oldest = nullptr;       // the oldest tile still writing
    Slot* undelivered = nullptr;  // the oldest whose parameters are not home yet
    for (Slot& slot : slots_) {
      if (slot.state != SlotState::kWriting) continue;
      if (oldest == nullptr || slot.tile < oldest->tile) oldest = &slot;
      if (!slot.param_delivered && (undelivered == nullptr || slot.tile < undelivered->tile)) {
        undelivered = &slot;
      }
    }
    if (target == Target::kParams && undelivered != nullptr &&
        tiles_[static_cast<std::size_t>(undelivered->tile)].unit <= unit) {
      bool freed = false;
      STRATA_TRY(reap(*undelivered, true, false, &freed));
    } else if (next_compute_ < next_read_) {
      bool done = false;
      STRATA_TRY(poll_reads(slot_of(next_compute_), true, &done));
    } else if (oldest != nullptr) {
      bool freed = false;
      STRATA_TRY(reap(*oldest, true, true, &freed));
    } else {
      STRATA_ASSERT_MSG(false, "optimizer pipeline: nothing in flight but the step is not done");
    }
    times_.wait_ms += ms_since(start);
  }
  return Status::ok();
}

void OptimizerPipeline::abort() {
  for (Slot& slot : slots_) {
    for (int a = 0; a < 4; ++a) {
      if (slot.read_issued[a] && !slot.read_done[a])
        (void)tiers_.wait(kStateKinds[a], slot.reads[a]);
      slot.read_issued[a] = slot.read_done[a] = false;
    }
    if (slot.state == SlotState::kWriting) {
      if (!slot.param_delivered) {
        if (slot.param_write) {
          (void)tiers_.wait(SlotKind::kParam, slot.param_handle);
        } else {
          (void)backend_.synchronize(slot.copied);
        }
      }
      for (int w = 0; w < slot.write_count; ++w) {
        if (!slot.write_done[w]) (void)tiers_.wait(kStateKinds[w], slot.writes[w]);
      }
    }
    slot.param_delivered = true;
    slot.write_count = 0;
    slot.state = SlotState::kFree;
  }
  active_ = false;
  failed_ = true;
  preloaded_ = 0;
}

Status OptimizerPipeline::run(bool block, Target target, int unit) {
  Status s = step(block, target, unit);
  if (!s.is_ok()) abort();
  return s;
}

Status OptimizerPipeline::preload() {
  if (active_ || preloaded_ > 0 || failed_) return Status::ok();
  const auto ntiles = static_cast<std::int64_t>(tiles_.size());
  for (std::int64_t t = 0; t < std::min(depth_, ntiles) && nvme_state(t); ++t) {
    Status s = issue_reads(slot_of(t), t, false);
    ++preloaded_;
    if (!s.is_ok()) {
      (void)cancel_preload();
      failed_ = true;
      return s;
    }
  }
  return Status::ok();
}

Status OptimizerPipeline::cancel_preload() {
  Status first;
  for (std::int64_t t = 0; t < preloaded_; ++t) {
    Slot& slot = slot_of(t);
    for (int a = 0; a < 4; ++a) {
      if (!slot.read_issued[a] || slot.read_done[a]) continue;
      Status s = tiers_.wait(kStateKinds[a], slot.reads[a]);
      if (!s.is_ok() && first.is_ok()) first = s;
      slot.read_done[a] = true;
    }
    slot.state = SlotState::kFree;
  }
  preloaded_ = 0;
  return first;
}

Status OptimizerPipeline::start(const PipelineStep& step) {
  STRATA_ASSERT_MSG(!active_, "optimizer step started while the previous one runs");
  if (failed_) return Status(ErrorCode::kIo, "an earlier optimizer step failed");
  step_ = step;
  active_ = true;
  next_compute_ = done_ = 0;
  std::fill(params_tiles_.begin(), params_tiles_.end(), 0);
  std::fill(done_tiles_.begin(), done_tiles_.end(), 0);
  // Preloaded tiles only miss their gradient (final now).
  next_read_ = preloaded_;
  preloaded_ = 0;
  for (std::int64_t t = 0; t < next_read_; ++t) {
    Status s = issue_read(slot_of(t), 3);
    if (!s.is_ok()) {
      abort();
      return s;
    }
  }
  return pump();
}

Status OptimizerPipeline::pump() {
  if (!active_) return Status::ok();
  return run(false, Target::kNone, -1);
}

Status OptimizerPipeline::wait_params(int unit) {
  if (params_ready(unit)) return Status::ok();
  return run(true, Target::kParams, unit);
}

Status OptimizerPipeline::wait_unit(int unit) {
  if (unit_done(unit)) return Status::ok();
  return run(true, Target::kDone, unit);
}

Status OptimizerPipeline::finish() {
  if (!active_) return Status::ok();
  return run(true, Target::kAll, -1);
}

}  // namespace strata::optim

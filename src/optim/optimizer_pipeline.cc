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
  (void)finish();
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
    p->last_tile_of_unit_.push_back(static_cast<std::int64_t>(p->tiles_.size()) - 1);
  }
  p->done_tiles_.assign(plan.units.size(), 0);
  p->unit_done_.assign(plan.units.size(), 1);
  p->slots_.resize(static_cast<std::size_t>(plan.pipeline_depth));
  for (Slot& s : p->slots_) {
    STRATA_ASSIGN_OR_RETURN(s.copied, tiers.backend().create_event());
  }
  return p;
}

float* OptimizerPipeline::stage(int slot, int array) const {
  return reinterpret_cast<float*>(tiers_.pipeline_area() + plan_.pipeline_offset(slot, array));
}

void OptimizerPipeline::start(const PipelineStep& step) {
  STRATA_ASSERT_MSG(!active_, "optimizer step started while the previous one runs");
  step_ = step;
  active_ = true;
  next_read_ = next_compute_ = done_ = 0;
  next_done_unit_ = 0;
  std::fill(done_tiles_.begin(), done_tiles_.end(), 0);
  std::fill(unit_done_.begin(), unit_done_.end(), 0);
  Trace* trace = tiers_.trace();
  start_us_ = trace ? static_cast<std::int64_t>(trace->now_us()) : 0;
}

bool OptimizerPipeline::unit_done(int unit) const {
  return !active_ || unit_done_[static_cast<std::size_t>(unit)] != 0;
}

Status OptimizerPipeline::issue_reads(Slot& slot, std::int64_t tile) {
  const Tile& t = tiles_[static_cast<std::size_t>(tile)];
  const tier::UnitPlan& up = plan_.units[static_cast<std::size_t>(t.unit)];
  slot.tile = tile;
  slot.read_count = 0;
  slot.write_count = 0;
  slot.copy_pending = false;
  slot.state = SlotState::kReading;
  Trace* trace = tiers_.trace();
  slot.read_begin_us = trace ? trace->now_us() : 0;
  if (up.optim_home != Tier::kNvme) return Status::ok();
  const int s = static_cast<int>(&slot - slots_.data());
  for (int a = 0; a < 4; ++a) {
    auto h =
        tiers_.read_tile(kStateKinds[a], t.unit, t.index, stage(s, a), io::Priority::kPrefetch);
    if (!h.is_ok()) {
      for (int r = 0; r < slot.read_count; ++r)
        (void)tiers_.wait(kStateKinds[r], slot.reads[r]);
      slot.read_count = 0;
      slot.state = SlotState::kFree;
      return h.status();
    }
    slot.read_done[slot.read_count] = 0;
    slot.reads[slot.read_count++] = *h;
  }
  return Status::ok();
}

Status OptimizerPipeline::wait_reads(Slot& slot, bool block, bool* done) {
  *done = false;
  Status first;
  for (int a = 0; a < slot.read_count; ++a) {
    if (slot.read_done[a]) continue;
    std::optional<Status> r;
    if (block || !first.is_ok()) {
      r = tiers_.wait(kStateKinds[a], slot.reads[a]);
    } else {
      r = tiers_.poll(kStateKinds[a], slot.reads[a]);
    }
    if (!r.has_value()) continue;
    slot.read_done[a] = 1;
    if (!r->is_ok() && first.is_ok()) {
      first = *r;
      a = -1;  // wait for the tile's other reads before reporting
    }
  }
  for (int a = 0; a < slot.read_count; ++a) {
    if (!slot.read_done[a]) return Status::ok();
  }
  if (!first.is_ok()) {
    slot.read_count = 0;
    slot.state = SlotState::kFree;
    const Tile& t = tiles_[static_cast<std::size_t>(slot.tile)];
    return first.with_context(
        fmt::format("optimizer step, {} tile {}",
                    tiers_.layout().units[static_cast<std::size_t>(t.unit)].name, t.index));
  }
  *done = true;
  return Status::ok();
}

void OptimizerPipeline::abort() {
  for (Slot& slot : slots_) {
    if (slot.state == SlotState::kReading) {
      for (int a = 0; a < slot.read_count; ++a) {
        if (!slot.read_done[a]) (void)tiers_.wait(kStateKinds[a], slot.reads[a]);
      }
    } else if (slot.state == SlotState::kWriting) {
      for (int w = 0; w < slot.write_count; ++w)
        (void)tiers_.wait(slot.write_kinds[w], slot.writes[w]);
      if (slot.copy_pending) (void)backend_.synchronize(slot.copied);
    }
    slot.read_count = slot.write_count = 0;
    slot.copy_pending = false;
    slot.state = SlotState::kFree;
  }
  active_ = false;
  failed_ = true;
}

Status OptimizerPipeline::compute(Slot& slot) {
  const int s = static_cast<int>(&slot - slots_.data());
  const Tile& t = tiles_[static_cast<std::size_t>(slot.tile)];
  const tier::UnitPlan& up = plan_.units[static_cast<std::size_t>(t.unit)];
  const std::int64_t begin = plan_.tile_begin(t.unit, t.index);
  const std::int64_t n = plan_.tile_numel(t.unit, t.index);
  const std::uint64_t c = plan_.storage_bytes;
  Trace* trace = tiers_.trace();
  if (trace && up.optim_home == Tier::kNvme) {
    trace->add(TraceLane::kNvmeRead, "optimizer read", slot.read_begin_us, trace->now_us(), t.unit,
               u64(n) * 16);
  }
  float* arrays[4];
  for (int a = 0; a < 4; ++a) {
    arrays[a] = up.optim_home == Tier::kNvme ? stage(s, a)
                                             : tiers_.host_state(t.unit, kStateKinds[a]) + begin;
  }
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
  // Writes: the state back to NVMe, the parameters to their home.
  slot.write_count = 0;
  slot.write_begin_us = trace ? trace->now_us() : 0;
  slot.state = SlotState::kWriting;
  auto fail = [&](const Status& st) {
    for (int w = 0; w < slot.write_count; ++w)
      (void)tiers_.wait(slot.write_kinds[w], slot.writes[w]);
    slot.write_count = 0;
    slot.state = SlotState::kFree;
    return st;
  };
  if (up.optim_home == Tier::kNvme) {
    for (int a = 0; a < 3; ++a) {
      auto h =
          tiers_.write_tile(kStateKinds[a], t.unit, t.index, arrays[a], io::Priority::kPrefetch);
      if (!h.is_ok()) return fail(h.status());
      slot.write_kinds[slot.write_count] = kStateKinds[a];
      slot.writes[slot.write_count++] = *h;
    }
  }
  if (up.param_home == Tier::kNvme) {
    auto h =
        tiers_.write_tile(SlotKind::kParam, t.unit, t.index, param_out, io::Priority::kPrefetch);
    if (!h.is_ok()) return fail(h.status());
    slot.write_kinds[slot.write_count] = SlotKind::kParam;
    slot.writes[slot.write_count++] = *h;
  } else if (up.param_home == Tier::kDevice) {
    STRATA_TRY(backend_.copy_async(backend::StreamKind::kHostToDevice,
                                   static_cast<char*>(tiers_.device_param(t.unit)) + u64(begin) * c,
                                   param_out, u64(n) * c));
    STRATA_TRY(backend_.record(slot.copied, backend::StreamKind::kHostToDevice));
    slot.copy_pending = true;
  }
  return Status::ok();
}

Status OptimizerPipeline::reap_writes(Slot& slot, bool block, bool* done) {
  *done = false;
  Status first;
  while (slot.write_count > 0) {
    const int w = slot.write_count - 1;
    std::optional<Status> r;
    if (block) {
      r = tiers_.wait(slot.write_kinds[w], slot.writes[w]);
    } else {
      r = tiers_.poll(slot.write_kinds[w], slot.writes[w]);
    }
    if (!r.has_value()) return Status::ok();
    --slot.write_count;
    if (!r->is_ok() && first.is_ok()) first = *r;
    if (!first.is_ok()) {
      while (slot.write_count > 0) {
        --slot.write_count;
        (void)tiers_.wait(slot.write_kinds[slot.write_count], slot.writes[slot.write_count]);
      }
    }
  }
  if (slot.copy_pending) {
    if (block) {
      STRATA_TRY(backend_.synchronize(slot.copied));
    } else if (!backend_.query(slot.copied)) {
      return Status::ok();
    }
    slot.copy_pending = false;
  }
  const Tile& t = tiles_[static_cast<std::size_t>(slot.tile)];
  Trace* trace = tiers_.trace();
  if (trace && plan_.units[static_cast<std::size_t>(t.unit)].optim_home == Tier::kNvme) {
    trace->add(TraceLane::kNvmeWrite, "optimizer write", slot.write_begin_us, trace->now_us(),
               t.unit, u64(plan_.tile_numel(t.unit, t.index)) * 12);
  }
  slot.state = SlotState::kFree;
  *done = true;
  if (!first.is_ok()) {
    return first.with_context(
        fmt::format("optimizer step, {} tile {}",
                    tiers_.layout().units[static_cast<std::size_t>(t.unit)].name, t.index));
  }
  ++done_;
  ++done_tiles_[static_cast<std::size_t>(t.unit)];
  while (next_done_unit_ < static_cast<int>(done_tiles_.size()) &&
         done_tiles_[static_cast<std::size_t>(next_done_unit_)] ==
             plan_.units[static_cast<std::size_t>(next_done_unit_)].tiles) {
    unit_done_[static_cast<std::size_t>(next_done_unit_)] = 1;
    if (on_unit_done_) on_unit_done_(next_done_unit_);
    ++next_done_unit_;
  }
  if (done_ == static_cast<std::int64_t>(tiles_.size())) {
    active_ = false;
    if (trace) {
      times_.active_ms +=
          static_cast<double>(static_cast<std::int64_t>(trace->now_us()) - start_us_) / 1e3;
    }
  }
  return Status::ok();
}

Status OptimizerPipeline::step(bool block, int until_unit) {
  const auto ntiles = static_cast<std::int64_t>(tiles_.size());
  const auto depth = static_cast<std::int64_t>(slots_.size());
  auto reached = [&] {
    if (!active_) return true;
    return until_unit >= 0 && unit_done_[static_cast<std::size_t>(until_unit)] != 0;
  };
  while (!reached()) {
    bool progress = false;
    // 1. Writes finished, oldest first.
    for (std::int64_t i = done_; i < next_compute_; ++i) {
      Slot& slot = slots_[static_cast<std::size_t>(i % depth)];
      if (slot.state != SlotState::kWriting || slot.tile != i) break;
      bool done = false;
      STRATA_TRY(reap_writes(slot, false, &done));
      if (!done) break;
      progress = true;
    }
    if (reached()) break;
    // 2. Reads into free stages, up to `depth` tiles ahead.
    while (next_read_ < ntiles &&
           slots_[static_cast<std::size_t>(next_read_ % depth)].state == SlotState::kFree) {
      STRATA_TRY(issue_reads(slots_[static_cast<std::size_t>(next_read_ % depth)], next_read_));
      ++next_read_;
      progress = true;
    }
    // 3. Adam on the next tile whose reads are done.
    if (next_compute_ < next_read_) {
      Slot& slot = slots_[static_cast<std::size_t>(next_compute_ % depth)];
      bool done = false;
      STRATA_TRY(wait_reads(slot, false, &done));
      if (done) {
        STRATA_TRY(compute(slot));
        ++next_compute_;
        progress = true;
      }
    }
    if (progress) continue;
    if (!block) break;
    // Nothing moved: block on the oldest outstanding thing.
    const auto start = std::chrono::steady_clock::now();
    if (next_compute_ < next_read_ &&
        slots_[static_cast<std::size_t>(next_compute_ % depth)].state == SlotState::kReading) {
      bool done = false;
      STRATA_TRY(wait_reads(slots_[static_cast<std::size_t>(next_compute_ % depth)], true, &done));
    } else if (done_ < next_compute_) {
      bool done = false;
      STRATA_TRY(reap_writes(slots_[static_cast<std::size_t>(done_ % depth)], true, &done));
    }
    times_.wait_ms += ms_since(start);
  }
  return Status::ok();
}

Status OptimizerPipeline::run(bool block, int until_unit) {
  Status s = step(block, until_unit);
  if (!s.is_ok()) abort();
  return s;
}

Status OptimizerPipeline::pump() {
  if (!active_) return Status::ok();
  return run(false, -1);
}

Status OptimizerPipeline::wait_unit(int unit) {
  if (!active_ || unit_done_[static_cast<std::size_t>(unit)]) return Status::ok();
  return run(true, unit);
}

Status OptimizerPipeline::finish() {
  if (!active_) return Status::ok();
  return run(true, -1);
}

}  // namespace strata::optim

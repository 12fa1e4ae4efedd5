// The optimizer pipeline (see optimizer_pipeline.h).
#include "offload/optimizer_pipeline.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "common/clock.h"
#include "common/thread_priority.h"
#include "kernels/cpu/state_codec.h"
#include "offload/slot_codec.h"

namespace strata::offload {
namespace {

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

// How long the worker waits before it looks again at several reads and writes in flight.
constexpr auto kIoPoll = std::chrono::microseconds(100);

}  // namespace

OptimizerPipeline::OptimizerPipeline(TierManager& tiers, CpuAdam& adam)
    : tiers_(tiers), backend_(tiers.backend()), plan_(tiers.plan()), adam_(adam) {}

OptimizerPipeline::~OptimizerPipeline() {
  if (active_.load()) {
    (void)finish();
  } else {
    (void)cancel_preload();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (Slot& s : slots_) {
    if (s.copied.valid()) backend_.destroy_event(s.copied);
  }
  if (step_started_.valid()) backend_.destroy_event(step_started_);
  if (device_done_.valid()) {
    (void)backend_.synchronize(device_done_);  // kernels still queued write the device state
    backend_.destroy_event(device_done_);
  }
}

Result<std::unique_ptr<OptimizerPipeline>> OptimizerPipeline::create(TierManager& tiers,
                                                                     CpuAdam& adam) {
  std::unique_ptr<OptimizerPipeline> p(new OptimizerPipeline(tiers, adam));
  const TierPlan& plan = tiers.plan();
  for (std::size_t u = 0; u < plan.units.size(); ++u) {
    if (plan.units[u].optim_home == Tier::kDevice) {
      p->device_units_.push_back(static_cast<int>(u));
      continue;
    }
    for (std::int64_t t = 0; t < plan.units[u].tiles; ++t)
      p->all_tiles_.push_back(Tile{static_cast<int>(u), t});
  }
  p->tiles_ = p->all_tiles_;
  p->params_tiles_ = std::vector<std::atomic<std::int64_t>>(plan.units.size());
  p->done_tiles_ = std::vector<std::atomic<std::int64_t>>(plan.units.size());
  p->hand_ = std::vector<std::atomic<int>>(plan.units.size());
  p->hand_destination_ = std::vector<std::atomic<char*>>(plan.units.size());
  p->hand_tiles_ = std::vector<std::atomic<std::int64_t>>(plan.units.size());
  p->depth_ = plan.pipeline_depth;
  p->slots_ = std::vector<Slot>(static_cast<std::size_t>(plan.pipeline_depth));
  for (Slot& s : p->slots_) {
    STRATA_ASSIGN_OR_RETURN(s.copied, tiers.backend().create_event());
  }
  STRATA_ASSIGN_OR_RETURN(p->step_started_, tiers.backend().create_event());
  STRATA_ASSIGN_OR_RETURN(p->device_done_, tiers.backend().create_event());
  ServiceThreadPriority service;  // above busy compute threads under chrt
  p->worker_ = std::thread([raw = p.get()] { raw->worker_main(); });
  return p;
}

char* OptimizerPipeline::stage(int slot, int array) const {
  return tiers_.pipeline_area() + plan_.pipeline_offset(slot, array);
}

bool OptimizerPipeline::nvme_state(std::int64_t tile) const {
  const Tile& t = tiles_[static_cast<std::size_t>(tile)];
  return plan_.units[static_cast<std::size_t>(t.unit)].optim_home == Tier::kNvme;
}

bool OptimizerPipeline::device_unit(int unit) const {
  return plan_.units[static_cast<std::size_t>(unit)].optim_home == Tier::kDevice;
}

bool OptimizerPipeline::device_pending() const {
  return !device_units_.empty() && !backend_.query(device_done_);
}

bool OptimizerPipeline::params_ready(int unit) const {
  if (device_unit(unit)) return backend_.query(device_done_);
  return !active_.load() || params_tiles_[static_cast<std::size_t>(unit)].load() ==
                                plan_.units[static_cast<std::size_t>(unit)].tiles;
}

bool OptimizerPipeline::offer_frame(int unit, void* destination) {
  const auto u = static_cast<std::size_t>(unit);
  if (!active_.load() || plan_.units[u].param_home != Tier::kNvme) return false;
  hand_destination_[u].store(static_cast<char*>(destination));
  int expected = kHandNone;
  return hand_[u].compare_exchange_strong(expected, kHandOffered);
}

bool OptimizerPipeline::handed_off(int unit) const {
  const auto u = static_cast<std::size_t>(unit);
  return hand_[u].load() == kHandTaken && hand_tiles_[u].load() == plan_.units[u].tiles;
}

bool OptimizerPipeline::unit_done(int unit) const {
  if (device_unit(unit)) return backend_.query(device_done_);
  return !active_.load() || done_tiles_[static_cast<std::size_t>(unit)].load() ==
                                plan_.units[static_cast<std::size_t>(unit)].tiles;
}

PipelineTimes OptimizerPipeline::times() const {
  return times_;
}

// ---- reads, Adam and writes (the worker, or the trainer's thread while the worker is idle) ---

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
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(t.unit)];
  const std::int64_t begin = plan_.tile_begin(t.unit, t.index);
  const std::int64_t n = plan_.tile_numel(t.unit, t.index);
  const std::uint64_t c = plan_.storage_bytes;
  const bool nvme = up.optim_home == Tier::kNvme;
  Trace* trace = tiers_.trace();
  if (trace && nvme) {
    trace->add(TraceLane::kNvmeRead, "optimizer read", slot.read_begin_us, trace->now_us(), t.unit,
               tiers_.tile_bytes(SlotKind::kMaster, t.unit, t.index) +
                   tiers_.tile_bytes(SlotKind::kExpAvg, t.unit, t.index) * 2 +
                   tiers_.tile_bytes(SlotKind::kGrad, t.unit, t.index));
  }
  // The tile's four arrays as stored (slot_codec.h): in its host home, or in the stage its
  // NVMe reads filled.
  char* arrays[4];
  for (int a = 0; a < 4; ++a) {
    arrays[a] = nvme ? stage(s, a)
                     : static_cast<char*>(tiers_.host_slot(t.unit, kStateKinds[a])) +
                           plan_.tile_offset(kStateKinds[a], t.unit, t.index);
  }
  void* param_out = up.param_home == Tier::kHost ? static_cast<char*>(tiers_.host_param(t.unit)) +
                                                       u64(up.param_shard_offset() + begin) * c
                                                 : static_cast<void*>(stage(s, 4));
  {
    TraceScope scope(trace, TraceLane::kAdam, "adam", t.unit, u64(n) * 4);
    const auto start = std::chrono::steady_clock::now();
    if (!skip_adam_) {
      const StateFormat& f = plan_.state;
      const StoredTile m = stored_tile(plan_, SlotKind::kExpAvg, arrays[1], n);
      const StoredTile v = stored_tile(plan_, SlotKind::kExpAvgSq, arrays[2], n);
      kernels::AdamTile tile;
      tile.master = arrays[0];
      tile.master_dtype = f.master;
      tile.exp_avg = m.values;
      tile.exp_avg_sq = v.values;
      tile.moments = f.moments;
      tile.exp_avg_absmax = m.absmax;
      tile.exp_avg_sq_absmax = v.absmax;
      tile.block = static_cast<std::size_t>(f.block);
      // Keyed by (seed, step, the unit's rounding id) and each element's index in the unit: the
      // same bits whatever the tiling, the ranks' shards and the units a process holds.
      tile.rounding_key = kernels::rounding_key(plan_.rounding_seed, step_.step, up.rounding_id);
      tile.rounding_offset = static_cast<std::uint32_t>(up.shard_begin + begin);
      tile.grad = arrays[3];
      tile.grad_dtype = f.grad;
      tile.n = static_cast<std::size_t>(n);
      // A copy of the stored master (rounded to the storage type), made while it is in cache;
      // none when the master is the parameters' home.
      tile.copy_out = param_out == arrays[0] ? nullptr : param_out;
      tile.copy_dtype = plan_.storage;
      adam_.update(params_, fusion_, tile);
    }
    times_.adam_ms += ms_since(start);
  }
  // A frame offered for the unit's parameters gets them now (offer_frame()); the first tile
  // decides, so a unit is copied whole or not at all.
  std::atomic<int>& hand = hand_[static_cast<std::size_t>(t.unit)];
  if (t.index == 0) {
    int expected = kHandNone;
    if (!hand.compare_exchange_strong(expected, kHandLate)) hand.store(kHandTaken);
  }
  if (hand.load() == kHandTaken) {
    char* destination = hand_destination_[static_cast<std::size_t>(t.unit)].load();
    std::memcpy(destination + u64(begin) * c, param_out, u64(n) * c);
    hand_tiles_[static_cast<std::size_t>(t.unit)].fetch_add(1);
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
    slot.copy_dst =
        static_cast<char*>(tiers_.device_param(t.unit)) + u64(up.param_shard_offset() + begin) * c;
    slot.copy_src = param_out;
    slot.copy_bytes = u64(n) * c;
    slot.param_delivered = false;
    slot.delivery.store(static_cast<int>(Delivery::kRequested));
  }
  if (slot.param_delivered) ++params_tiles_[static_cast<std::size_t>(t.unit)];
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

Status OptimizerPipeline::reap(Slot& slot, bool block, bool* freed) {
  *freed = false;
  const Tile& t = tiles_[static_cast<std::size_t>(slot.tile)];
  Status first;
  if (!slot.param_delivered) {
    if (slot.param_write) {
      std::optional<Status> r =
          block ? std::optional<Status>(tiers_.wait(SlotKind::kParam, slot.param_handle))
                : tiers_.poll(SlotKind::kParam, slot.param_handle);
      if (r.has_value()) {
        slot.param_delivered = true;
        first = *r;
      }
    } else if (slot.delivery.load() == static_cast<int>(Delivery::kDone)) {
      slot.delivery.store(static_cast<int>(Delivery::kNone));
      slot.param_delivered = true;
    }
    if (slot.param_delivered && first.is_ok()) {
      ++params_tiles_[static_cast<std::size_t>(t.unit)];
      cv_.notify_all();
    }
  }
  for (int w = 0; w < slot.write_count; ++w) {
    if (slot.write_done[w]) continue;
    std::optional<Status> r =
        (block || !first.is_ok())
            ? std::optional<Status>(tiers_.wait(kStateKinds[w], slot.writes[w]))
            : tiers_.poll(kStateKinds[w], slot.writes[w]);
    if (!r.has_value()) continue;
    slot.write_done[w] = true;
    if (!r->is_ok() && first.is_ok()) first = *r;
  }
  if (!first.is_ok()) {
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
               t.unit,
               tiers_.tile_bytes(SlotKind::kMaster, t.unit, t.index) +
                   tiers_.tile_bytes(SlotKind::kExpAvg, t.unit, t.index) * 2);
  }
  slot.state = SlotState::kFree;
  *freed = true;
  ++done_;
  ++done_tiles_[static_cast<std::size_t>(t.unit)];
  cv_.notify_all();
  return Status::ok();
}

// Waits for everything of the step still in flight (after an error).
void OptimizerPipeline::abort_io() {
  for (Slot& slot : slots_) {
    for (int a = 0; a < 4; ++a) {
      if (slot.read_issued[a] && !slot.read_done[a]) {
        (void)tiers_.wait(kStateKinds[a], slot.reads[a]);
      }
      slot.read_issued[a] = slot.read_done[a] = false;
    }
    if (slot.state == SlotState::kWriting) {
      if (!slot.param_delivered && slot.param_write) {
        (void)tiers_.wait(SlotKind::kParam, slot.param_handle);
      }
      for (int w = 0; w < slot.write_count; ++w) {
        if (!slot.write_done[w]) (void)tiers_.wait(kStateKinds[w], slot.writes[w]);
      }
    }
    slot.param_delivered = true;
    slot.write_count = 0;
    slot.state = SlotState::kFree;
  }
}

Status OptimizerPipeline::run_step() {
  const auto ntiles = static_cast<std::int64_t>(tiles_.size());
  while (done_ < ntiles) {
    bool progress = false;
    // 1. Deliveries and writes that finished.
    for (Slot& slot : slots_) {
      if (slot.state != SlotState::kWriting) continue;
      const bool delivered = slot.param_delivered;
      bool freed = false;
      STRATA_TRY(reap(slot, false, &freed));
      progress = progress || freed || delivered != slot.param_delivered;
    }
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
    // Nothing moved. With one thing in flight, block on it. With several (the next tile's
    // reads and earlier tiles' writes), any of them may finish first, and each matters at once:
    // a finished parameter write is a milestone the next forward waits for, a freed stage lets
    // the next read start. So look again shortly instead of blocking on one of them.
    const auto start = std::chrono::steady_clock::now();
    Slot* oldest = nullptr;
    int writing = 0;
    for (Slot& slot : slots_) {
      if (slot.state != SlotState::kWriting) continue;
      ++writing;
      if (oldest == nullptr || slot.tile < oldest->tile) oldest = &slot;
    }
    const bool reading = next_compute_ < next_read_;
    STRATA_ASSERT_MSG(reading || writing > 0,
                      "optimizer pipeline: nothing in flight but the step is not done");
    if (reading && writing == 0) {
      bool done = false;
      STRATA_TRY(poll_reads(slot_of(next_compute_), true, &done));
    } else if (!reading && writing == 1 && (oldest->param_delivered || oldest->param_write)) {
      bool freed = false;
      STRATA_TRY(reap(*oldest, true, &freed));
    } else {
      // Several operations in flight, or a device copy the trainer's thread has yet to make
      // (its completion notifies cv_).
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kIoPoll);
    }
    times_.wait_ms += ms_since(start);
  }
  return Status::ok();
}

void OptimizerPipeline::worker_main() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return run_requested_ || stop_; });
      if (stop_ && !run_requested_) return;
      run_requested_ = false;
    }
    Status s = run_step();
    if (!s.is_ok()) abort_io();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.is_ok()) {
        error_ = s;
        failed_.store(true);
      }
      active_.store(false);
    }
    cv_.notify_all();
  }
}

}  // namespace strata::offload

// The prefetch scheduler (see param_scheduler.h).
#include "offload/param_scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "common/fault_points.h"
#include "common/log.h"

namespace strata::offload {
namespace {

constexpr int kReadsInFlightMax = 64;  // NVMe tile reads the prefetcher keeps in flight

// Uses a pass may record (UseOrder's fixed room): a training pass uses each unit at most twice
// (forward, then backward) and the tied embedding once more for the head, about 2 x units; twice
// that, plus a few, leaves room for a pass that diverges and is recorded whole.
constexpr int kUsesPerUnitMax = 4;
constexpr int kUsesSpare = 16;

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

}  // namespace

comm::DataType comm_type(kernels::DType type) {
  switch (type) {
    case kernels::DType::kBF16:
      return comm::DataType::kBF16;
    case kernels::DType::kF16:
      return comm::DataType::kF16;
    default:
      return comm::DataType::kF32;
  }
}

ParamScheduler::ParamScheduler(TierManager& tiers, UpdateGate* gate, comm::Comm* comm)
    : tiers_(tiers),
      gate_(gate),
      comm_(comm),
      backend_(tiers.backend()),
      plan_(tiers.plan()),
      limits_(tiers.plan().prefetch),
      direct_(tiers.backend().device_memory_is_host()),
      order_(tiers.units(), kUsesPerUnitMax * tiers.units() + kUsesSpare) {}

ParamScheduler::~ParamScheduler() {
  // Whatever is in flight completes or is abandoned: drain() always ends. A failure reported
  // before is not repeated.
  const bool reported = !first_error_.is_ok();
  Status drained = drain();
  if (!drained.is_ok() && !reported) {
    STRATA_LOG_WARN("parameter fetches at teardown: {}", drained.to_string());
  }
  for (UnitState& s : states_) {
    if (s.copied.valid()) backend_.destroy_event(s.copied);
    if (s.released.valid()) backend_.destroy_event(s.released);
  }
  for (auto& pool : frames_) {
    for (Frame& f : pool) {
      if (f.released.valid()) backend_.destroy_event(f.released);
    }
  }
}

Result<std::unique_ptr<ParamScheduler>> ParamScheduler::create(TierManager& tiers, UpdateGate* gate,
                                                               comm::Comm* comm) {
  const TierPlan& p = tiers.plan();
  // A plan for several ranks without their Comm holds that rank's state (checkpoint tools and
  // tests) but cannot train: the collectives below assert one.
  STRATA_ASSERT(comm == nullptr || comm->world_size() == p.world);
  std::unique_ptr<ParamScheduler> s(new ParamScheduler(tiers, gate, comm));
  s->states_.resize(p.units.size());
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    if (!p.units[u].framed) continue;
    UnitState& st = s->states_[u];
    STRATA_ASSIGN_OR_RETURN(st.copied, tiers.backend().create_event());
    if (p.units[u].persistent) {
      STRATA_ASSIGN_OR_RETURN(st.released, tiers.backend().create_event());
    }
    if (p.units[u].param_home == Tier::kNvme) {
      st.reads.resize(static_cast<std::size_t>(p.units[u].tiles));
      st.read_done.resize(static_cast<std::size_t>(p.units[u].tiles), 0);
    }
  }
  s->frames_.resize(p.classes.size());
  for (std::size_t k = 0; k < p.classes.size(); ++k) {
    for (int i = 0; i < p.classes[k].param_frames; ++i) {
      Frame f{tiers.param_frame(static_cast<int>(k), i), -1, {}};
      STRATA_ASSIGN_OR_RETURN(f.released, tiers.backend().create_event());
      s->frames_[k].push_back(f);
    }
  }
  s->staging_busy_.assign(static_cast<std::size_t>(p.param_staging_buffers), 0);
  s->in_flight_.reserve(p.units.size());
  return s;
}

std::int64_t ParamScheduler::numel(int unit) const {
  return plan_.units[static_cast<std::size_t>(unit)].padded_numel;
}

void* ParamScheduler::frame_data(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (up.persistent) return tiers_.persistent_frame(unit);
  const UnitState& st = state(unit);
  STRATA_ASSERT(st.frame >= 0);
  return frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(st.frame)].data;
}

void* ParamScheduler::shard_data(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  const std::uint64_t at = up.param_numel < up.padded_numel ? u64(up.shard_begin) : 0;
  return static_cast<char*>(frame_data(unit)) + at * plan_.storage_bytes;
}

backend::Event ParamScheduler::frame_released(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  const UnitState& st = state(unit);
  if (up.persistent) return st.released;
  STRATA_ASSERT(st.frame >= 0);
  return frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(st.frame)]
      .released;
}

Status ParamScheduler::wait_frame_free(int unit, bool copy) {
  // The frame's previous unit was released after its last kernels were queued, and a prefetch may
  // take the frame at once: on a GPU those kernels can still be reading it.
  if (planted_race("param.frame_free")) return Status::ok();
  const backend::Event released = frame_released(unit);
  if (copy) return backend_.wait(backend::StreamKind::kHostToDevice, released);
  return backend_.synchronize(released);
}

bool ParamScheduler::sharded(int unit) const {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  return up.framed && up.param_numel < up.padded_numel;
}

Status ParamScheduler::finish_gather(int unit) {
  UnitState& st = state(unit);
  STRATA_ASSERT(st.gathering);
  st.gathering = false;
  --st.users;  // the hold gather_ahead() took
  return comm_->wait(st.gather).with_context(
      fmt::format("gathering the parameters of {}",
                  tiers_.layout().units[static_cast<std::size_t>(unit)].name));
}

Status ParamScheduler::wait_for_update(int unit) {
  if (gate_ == nullptr || gate_->params_ready(unit)) return Status::ok();
  const auto start = std::chrono::steady_clock::now();
  Trace* trace = tiers_.trace();
  const std::uint64_t begin_us = trace ? trace->now_us() : 0;
  Status s = gate_->wait_for_params(unit);
  stats_.wait_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
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
  if (plan_.world == 1 || !order_.planned() || order_.cursor() >= order_.size())
    return Status::ok();
  const int v = order_.at(order_.cursor());
  if (!sharded(v)) return Status::ok();
  UnitState& st = state(v);
  if (st.gathering || st.users > 0) return Status::ok();  // gathered at its acquire instead
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(v)];
  if (!up.persistent) {
    bool free_frame = false;
    for (const Frame& f : frames_[static_cast<std::size_t>(up.size_class)])
      free_frame = free_frame || f.unit < 0 || state(f.unit).users == 0;
    if (!free_frame) return Status::ok();
  }
  STRATA_TRY(wait_for_update(v));
  const auto start = std::chrono::steady_clock::now();
  if (st.stage == Stage::kAbsent) {
    STRATA_ASSIGN_OR_RETURN(bool started, start_fetch(v, true));
    STRATA_ASSERT(started);
  }
  STRATA_TRY(advance(v, true));
  stats_.wait_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  STRATA_ASSIGN_OR_RETURN(st.gather,
                          comm_->all_gather(shard_data(v), frame_data(v), u64(up.shard_numel),
                                            comm_type(plan_.storage)));
  st.gathering = true;
  ++st.users;  // held: not evicted while the gather writes its frame
  ++stats_.gathers;
  ++stats_.gathers_ahead;
  return Status::ok();
}

Status ParamScheduler::gather(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (!sharded(unit)) return Status::ok();
  STRATA_ASSERT_MSG(comm_ != nullptr, "stage 3 on several ranks needs their Comm");
  if (state(unit).gathering) {
    const auto start = std::chrono::steady_clock::now();
    Status s = finish_gather(unit);
    stats_.wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return s;
  }
  // Every rank acquires the same units in the same order, so issuing here keeps the ranks'
  // collectives in step; whether a unit was cached depends on timing, so it is gathered anyway.
  Trace* trace = tiers_.trace();
  const std::uint64_t begin_us = trace ? trace->now_us() : 0;
  const auto start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(comm::Handle h,
                          comm_->all_gather(shard_data(unit), frame_data(unit), u64(up.shard_numel),
                                            comm_type(plan_.storage)));
  STRATA_TRY(comm_->wait(h).with_context(
      fmt::format("gathering the parameters of {}",
                  tiers_.layout().units[static_cast<std::size_t>(unit)].name)));
  stats_.gathers += 1;
  stats_.wait_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (trace) {
    trace->add(TraceLane::kComputeWait, "all-gather", begin_us, trace->now_us(), unit,
               u64(up.padded_numel) * plan_.storage_bytes);
  }
  return Status::ok();
}

bool ParamScheduler::holds_update(int unit) const {
  const UnitState& st = states_[static_cast<std::size_t>(unit)];
  if (!plan_.units[static_cast<std::size_t>(unit)].framed) return false;
  if (st.stage == Stage::kHandoff) return gate_->handed_off(unit);
  return st.stage == Stage::kResident && st.handed;
}

bool ParamScheduler::resident(int unit) const {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  return !up.framed || states_[static_cast<std::size_t>(unit)].stage == Stage::kResident;
}

int ParamScheduler::next_use(int unit) const {
  if (!order_.planned()) return -1;
  return order_.next_use(unit, order_.cursor());
}

void ParamScheduler::note(const Status& s) {
  if (!s.is_ok() && first_error_.is_ok()) first_error_ = s;
}

void ParamScheduler::begin_pass(Pass kind) {
  order_.begin(kind);
  // Nothing here can report: a failure is kept and returned by the next acquire, pump or drain.
  if (first_error_.is_ok()) note(prefetch());
}

void ParamScheduler::end_pass() {
  // A gather started ahead for a use that did not come (the pass diverged): finish it and drop its
  // hold, at the same point on every rank. A failure is kept (first_error()).
  for (std::size_t u = 0; u < states_.size(); ++u) {
    if (states_[u].gathering) note(finish_gather(static_cast<int>(u)));
  }
  order_.end();
}

void ParamScheduler::evict(int unit) {
  UnitState& st = state(unit);
  STRATA_ASSERT(st.users == 0 && (st.stage == Stage::kResident || st.stage == Stage::kAbsent));
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (st.frame >= 0) {
    frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(st.frame)].unit = -1;
    st.frame = -1;
    ++stats_.evictions;
  }
  st.stage = Stage::kAbsent;
  st.handed = false;
}

void ParamScheduler::invalidate(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (!up.framed) return;
  UnitState& st = state(unit);
  STRATA_ASSERT_MSG(st.users == 0 && st.stage != Stage::kReading && st.stage != Stage::kCopying &&
                        st.stage != Stage::kHandoff,
                    "invalidate of a unit in use or in flight");
  if (up.persistent) {
    st.stage = Stage::kAbsent;
    st.handed = false;
    return;
  }
  evict(unit);
}

Result<int> ParamScheduler::find_frame(int unit, bool demand) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  std::vector<Frame>& pool = frames_[static_cast<std::size_t>(up.size_class)];
  for (std::size_t i = 0; i < pool.size(); ++i) {
    if (pool[i].unit < 0) return static_cast<int>(i);
  }
  // Evict the cached unit used farthest in the future (never used again this pass = farthest);
  // a prefetch only evicts units needed after the one it fetches.
  constexpr int kNever = std::numeric_limits<int>::max();
  const int mine = demand ? -1 : (next_use(unit) < 0 ? kNever : next_use(unit));
  for (int attempt = 0; attempt < 2; ++attempt) {
    int best = -1, best_next = -1;
    for (std::size_t i = 0; i < pool.size(); ++i) {
      const int w = pool[i].unit;
      const UnitState& ws = state(w);
      if (ws.users > 0) continue;
      const bool settled = ws.stage == Stage::kResident;
      if (!settled && (attempt == 0 || !demand)) continue;
      int next = next_use(w);
      if (next < 0) next = kNever;
      if (!demand && next <= mine) continue;
      if (next > best_next) {
        best = static_cast<int>(i);
        best_next = next;
      }
    }
    if (best >= 0) {
      const int w = pool[static_cast<std::size_t>(best)].unit;
      if (state(w).stage != Stage::kResident) STRATA_TRY(advance(w, true));
      evict(w);
      return best;
    }
    if (!demand) return -1;
  }
  return Status(
      ErrorCode::kInternal,
      fmt::format("no parameter frame for unit {}: all {} frames of its size are in use",
                  tiers_.layout().units[static_cast<std::size_t>(unit)].name, pool.size()));
}

Result<int> ParamScheduler::find_staging(bool demand) {
  for (;;) {
    for (std::size_t i = 0; i < staging_busy_.size(); ++i) {
      if (!staging_busy_[i]) return static_cast<int>(i);
    }
    if (!demand) return -1;
    // Finish the oldest fetch that holds a staging buffer.
    int oldest = -1;
    for (int u : in_flight_) {
      if (state(u).staging >= 0) {
        oldest = u;
        break;
      }
    }
    if (oldest < 0) return Status(ErrorCode::kInternal, "no parameter staging buffer is free");
    STRATA_TRY(advance(oldest, true));
  }
}

Result<bool> ParamScheduler::start_fetch(int unit, bool demand) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  UnitState& st = state(unit);
  STRATA_ASSERT(up.framed && st.stage == Stage::kAbsent);
  int staging = -1;
  if (up.param_home == Tier::kNvme && !direct_) {
    STRATA_ASSIGN_OR_RETURN(staging, find_staging(demand));
    if (staging < 0) return false;
  }
  if (!up.persistent) {
    STRATA_ASSIGN_OR_RETURN(int frame, find_frame(unit, demand));
    if (frame < 0) return false;
    st.frame = frame;
    frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(frame)].unit = unit;
  }
  Trace* trace = tiers_.trace();
  st.begin_us = trace ? trace->now_us() : 0;
  in_flight_.push_back(unit);
  if (up.param_home != Tier::kNvme) {
    // From the host home, or (stage 3 on several ranks) from the shard's device home.
    const std::uint64_t bytes = u64(up.param_numel) * plan_.storage_bytes;
    const void* src = up.param_home == Tier::kHost
                          ? tiers_.host_param(unit)
                          : static_cast<const void*>(tiers_.device_param(unit));
    STRATA_TRY(wait_frame_free(unit, true));
    STRATA_TRY(
        backend_.copy_async(backend::StreamKind::kHostToDevice, shard_data(unit), src, bytes));
    STRATA_TRY(backend_.record(st.copied, backend::StreamKind::kHostToDevice));
    stats_.bytes_to_device += bytes;
    st.stage = Stage::kCopying;
  } else {
    if (staging >= 0) staging_busy_[static_cast<std::size_t>(staging)] = 1;
    st.staging = staging;
    st.next_tile = 0;
    st.done_tiles = 0;
    std::fill(st.read_done.begin(), st.read_done.end(), 0);
    st.stage = Stage::kReading;
    // Reads straight into the frame are writes by the I/O engine, ordered by the host.
    if (staging < 0) STRATA_TRY(wait_frame_free(unit, false));
    STRATA_TRY(issue_reads(unit, demand));
  }
  return true;
}

Result<bool> ParamScheduler::start_handoff(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  UnitState& st = state(unit);
  int frame = -1;
  if (!up.persistent) {
    STRATA_ASSIGN_OR_RETURN(frame, find_frame(unit, false));
    if (frame < 0) return false;
    st.frame = frame;
    frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(frame)].unit = unit;
  }
  // The optimizer's worker writes the frame from the host as soon as the offer is taken.
  if (Status free = wait_frame_free(unit, false); !free.is_ok()) {
    if (frame >= 0) {
      frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(frame)].unit = -1;
      st.frame = -1;
    }
    return free;
  }
  if (!gate_->offer_frame(unit, shard_data(unit))) {
    if (frame >= 0) {
      frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(frame)].unit = -1;
      st.frame = -1;
    }
    return false;
  }
  Trace* trace = tiers_.trace();
  st.begin_us = trace ? trace->now_us() : 0;
  st.stage = Stage::kHandoff;
  in_flight_.push_back(unit);
  ++stats_.handoffs;
  return true;
}

Status ParamScheduler::issue_reads(int unit, bool demand) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  UnitState& st = state(unit);
  // Into the staging buffer, or straight into the frame when device memory is host memory.
  auto* staging =
      static_cast<char*>(st.staging >= 0 ? tiers_.param_staging(st.staging) : shard_data(unit));
  while (st.next_tile < up.tiles && (reads_in_flight_ < kReadsInFlightMax || demand)) {
    const std::int64_t t = st.next_tile;
    STRATA_ASSIGN_OR_RETURN(
        st.reads[static_cast<std::size_t>(t)],
        tiers_.read_tile(SlotKind::kParam, unit, t,
                         staging + u64(plan_.tile_begin(unit, t)) * plan_.storage_bytes,
                         demand ? io::Priority::kDemand : io::Priority::kPrefetch));
    ++st.next_tile;
    ++reads_in_flight_;
  }
  return Status::ok();
}

Status ParamScheduler::advance(int unit, bool block) {
  Status s = move_fetch(unit, block);
  if (!s.is_ok()) {
    const Stage stage = state(unit).stage;
    if (stage == Stage::kReading || stage == Stage::kCopying || stage == Stage::kHandoff) {
      abandon(unit);
    }
    note(s);
  }
  return s;
}

void ParamScheduler::abandon(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  UnitState& st = state(unit);
  STRATA_ASSERT(st.stage == Stage::kReading || st.stage == Stage::kCopying ||
                st.stage == Stage::kHandoff);
  if (st.stage == Stage::kReading) {
    // Leave nothing in flight behind: the reads write into the staging buffer or frame.
    for (std::int64_t t = 0; t < st.next_tile; ++t) {
      if (st.read_done[static_cast<std::size_t>(t)]) continue;
      Status read = tiers_.wait(SlotKind::kParam, st.reads[static_cast<std::size_t>(t)]);
      if (!read.is_ok()) STRATA_LOG_DEBUG("abandoned parameter read: {}", read.to_string());
      st.read_done[static_cast<std::size_t>(t)] = 1;
      ++st.done_tiles;
      --reads_in_flight_;
    }
  } else if (st.stage == Stage::kCopying) {
    Status copied = backend_.synchronize(st.copied);
    if (!copied.is_ok()) STRATA_LOG_DEBUG("abandoned parameter copy: {}", copied.to_string());
  }
  if (st.staging >= 0) {
    staging_busy_[static_cast<std::size_t>(st.staging)] = 0;
    st.staging = -1;
  }
  if (st.frame >= 0) {
    frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(st.frame)].unit = -1;
    st.frame = -1;
  }
  st.stage = Stage::kAbsent;
  st.handed = false;
  auto it = std::find(in_flight_.begin(), in_flight_.end(), unit);
  if (it != in_flight_.end()) in_flight_.erase(it);
}

// Moves one fetch along: reads done -> host->device copy -> resident. With `block`, until it is
// resident.
Status ParamScheduler::move_fetch(int unit, bool block) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  UnitState& st = state(unit);
  Trace* trace = tiers_.trace();
  if (st.stage == Stage::kHandoff) {
    if (!gate_->handed_off(unit)) {
      if (!block) return Status::ok();
      // The update is done when its parameters are home: so is the copy into the frame.
      STRATA_TRY(gate_->wait_for_params(unit));
      STRATA_ASSERT_MSG(gate_->handed_off(unit), "an accepted hand-off was not made");
    }
    if (trace) {
      trace->add(TraceLane::kHostToDevice, "param hand-off", st.begin_us, trace->now_us(), unit,
                 u64(up.param_numel) * plan_.storage_bytes);
    }
    st.handed = true;
    return complete(unit);
  }
  while (st.stage == Stage::kReading) {
    for (std::int64_t t = 0; t < st.next_tile; ++t) {
      if (st.read_done[static_cast<std::size_t>(t)]) continue;
      std::optional<Status> done;
      if (block) {
        done = tiers_.wait(SlotKind::kParam, st.reads[static_cast<std::size_t>(t)]);
      } else {
        done = tiers_.poll(SlotKind::kParam, st.reads[static_cast<std::size_t>(t)]);
      }
      if (!done.has_value()) continue;
      st.read_done[static_cast<std::size_t>(t)] = 1;
      ++st.done_tiles;
      --reads_in_flight_;
      if (!done->is_ok()) {
        // advance() abandons the fetch: its other reads are waited for there.
        return done->with_context(
            fmt::format("reading the parameters of {}",
                        tiers_.layout().units[static_cast<std::size_t>(unit)].name));
      }
    }
    if (st.next_tile < up.tiles) STRATA_TRY(issue_reads(unit, block));
    if (st.done_tiles < up.tiles) {
      if (!block) return Status::ok();
      continue;
    }
    if (trace) {
      trace->add(TraceLane::kNvmeRead, "param read", st.begin_us, trace->now_us(), unit,
                 u64(up.shard_numel) * plan_.storage_bytes);
    }
    if (st.staging < 0) return complete(unit);  // read straight into the frame
    const std::uint64_t bytes = u64(up.param_numel) * plan_.storage_bytes;
    st.begin_us = trace ? trace->now_us() : 0;
    STRATA_TRY(wait_frame_free(unit, true));
    STRATA_TRY(backend_.copy_async(backend::StreamKind::kHostToDevice, shard_data(unit),
                                   tiers_.param_staging(st.staging), bytes));
    STRATA_TRY(backend_.record(st.copied, backend::StreamKind::kHostToDevice));
    stats_.bytes_to_device += bytes;
    st.stage = Stage::kCopying;
  }
  if (st.stage == Stage::kCopying) {
    if (block) {
      STRATA_TRY(backend_.synchronize(st.copied));
    } else if (!backend_.query(st.copied)) {
      return Status::ok();
    }
    if (trace) {
      trace->add(TraceLane::kHostToDevice, "param to device", st.begin_us, trace->now_us(), unit,
                 u64(up.shard_numel) * plan_.storage_bytes);
    }
    STRATA_TRY(complete(unit));
  }
  return Status::ok();
}

Status ParamScheduler::complete(int unit) {
  UnitState& st = state(unit);
  if (st.staging >= 0) {
    staging_busy_[static_cast<std::size_t>(st.staging)] = 0;
    st.staging = -1;
  }
  st.stage = Stage::kResident;
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), unit));
  return Status::ok();
}

Status ParamScheduler::pump() {
  STRATA_TRY(first_error_);
  for (std::size_t i = 0; i < in_flight_.size();) {
    const int u = in_flight_[i];
    STRATA_TRY(advance(u, false));
    if (i < in_flight_.size() && in_flight_[i] == u) ++i;
  }
  return prefetch();
}

Status ParamScheduler::drain() {
  // advance(.., true) ends each fetch: resident, or failed and abandoned. Either way the unit
  // leaves in_flight_, so this loop ends after any error.
  while (!in_flight_.empty()) {
    const int unit = in_flight_.front();
    Status s = advance(unit, true);
    STRATA_ASSERT_MSG(s.is_ok() || in_flight_.empty() || in_flight_.front() != unit,
                      "a failed fetch stayed in flight");
  }
  return first_error_;
}

Status ParamScheduler::prefetch() {
  if (!order_.planned() || limits_.bucket_elements == 0) return Status::ok();
  std::uint64_t ahead = 0, live = 0;
  for (std::size_t u = 0; u < states_.size(); ++u) {
    if (states_[u].stage != Stage::kAbsent) live += u64(numel(static_cast<int>(u)));
  }
  const std::uint64_t bucket = limits_.bucket_elements;
  for (int pos = order_.cursor(); pos < order_.size(); ++pos) {
    const int v = order_.at(pos);
    const UnitPlan& up = plan_.units[static_cast<std::size_t>(v)];
    if (!up.framed) continue;
    if (order_.next_use(v, order_.cursor()) != pos) continue;  // counted at its first use
    UnitState& st = state(v);
    if (st.users > 0) continue;
    if (ahead + u64(up.padded_numel) > bucket) break;
    ahead += u64(up.padded_numel);
    if (st.stage != Stage::kAbsent) continue;
    if (live + u64(up.padded_numel) > limits_.live_elements_max) break;
    bool started = false;
    if (gate_ != nullptr && !gate_->params_ready(v)) {
      // Its update is pending: have the optimizer write it into a frame, where it can.
      if (!direct_ || up.param_home != Tier::kNvme) break;
      STRATA_ASSIGN_OR_RETURN(started, start_handoff(v));
    } else {
      STRATA_ASSIGN_OR_RETURN(started, start_fetch(v, false));
    }
    if (!started) break;
    live += u64(up.padded_numel);
    ++stats_.prefetches;
  }
  return Status::ok();
}

Result<const void*> ParamScheduler::acquire(int unit) {
  STRATA_TRY(first_error_);
  order_.use(unit);
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (!up.framed) return static_cast<const void*>(tiers_.device_param(unit));
  UnitState& st = state(unit);
  if (st.stage == Stage::kResident) {
    ++stats_.hits;
  } else {
    const auto start = std::chrono::steady_clock::now();
    Trace* trace = tiers_.trace();
    const std::uint64_t begin_us = trace ? trace->now_us() : 0;
    if (st.stage == Stage::kAbsent) {
      ++stats_.demand_fetches;
      STRATA_ASSIGN_OR_RETURN(bool started, start_fetch(unit, true));
      STRATA_ASSERT(started);
    } else {
      ++stats_.late;
    }
    STRATA_TRY(advance(unit, true));
    stats_.wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (trace)
      trace->add(TraceLane::kComputeWait, "wait for parameters", begin_us, trace->now_us(), unit);
  }
  ++st.users;
  STRATA_TRY(gather(unit));
  STRATA_TRY(gather_ahead());
  STRATA_TRY(pump());
  return static_cast<const void*>(frame_data(unit));
}

void ParamScheduler::release(int unit) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (!up.framed) return;
  UnitState& st = state(unit);
  STRATA_ASSERT_MSG(st.users > 0, "release of a unit that was not acquired");
  if (--st.users > 0) return;
  // The kernels that read the frame are queued by now: whoever writes it next waits for them.
  note(backend_.record(frame_released(unit), backend::StreamKind::kCompute));
  if (up.persistent) return;
  // Keep it cached if it comes back soon; else give the frame up now.
  const int next = next_use(unit);
  bool keep = next >= 0;
  if (keep) {
    std::uint64_t distance = 0;
    for (int pos = order_.cursor(); pos < next && keep; ++pos) {
      distance += u64(numel(order_.at(pos)));
      keep = distance <= limits_.reuse_distance_max;
    }
  }
  if (!keep) evict(unit);
}

}  // namespace strata::offload

// The mechanics of fetching parameters into device frames (see frame_fetcher.h).
#include "offload/frame_fetcher.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/fault_points.h"
#include "common/log.h"
#include "offload/prefetch_policy.h"

namespace strata::offload {
namespace {

constexpr int kReadsInFlightMax = 64;  // NVMe tile reads the fetcher keeps in flight

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

}  // namespace

FrameFetcher::FrameFetcher(TierManager& tiers, UpdateGate* gate, SchedulerStats* stats)
    : tiers_(tiers),
      gate_(gate),
      stats_(stats),
      backend_(tiers.backend()),
      plan_(tiers.plan()),
      direct_(tiers.backend().device_memory_is_host()) {}

FrameFetcher::~FrameFetcher() {
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

Result<std::unique_ptr<FrameFetcher>> FrameFetcher::create(TierManager& tiers, UpdateGate* gate,
                                                           SchedulerStats* stats) {
  const TierPlan& p = tiers.plan();
  std::unique_ptr<FrameFetcher> f(new FrameFetcher(tiers, gate, stats));
  backend::Backend& b = tiers.backend();
  f->states_.resize(p.units.size());
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    if (!p.units[u].framed) continue;
    UnitState& st = f->states_[u];
    STRATA_ASSIGN_OR_RETURN(st.copied, b.create_event());
    if (p.units[u].persistent) {
      STRATA_ASSIGN_OR_RETURN(st.released, b.create_event());
    }
    if (p.units[u].param_home == Tier::kNvme) {
      st.reads.resize(static_cast<std::size_t>(p.units[u].tiles));
      st.read_done.resize(static_cast<std::size_t>(p.units[u].tiles), 0);
    }
  }
  f->frames_.resize(p.classes.size());
  for (std::size_t k = 0; k < p.classes.size(); ++k) {
    for (int i = 0; i < p.classes[k].param_frames; ++i) {
      Frame frame{tiers.param_frame(static_cast<int>(k), i), -1, {}};
      STRATA_ASSIGN_OR_RETURN(frame.released, b.create_event());
      f->frames_[k].push_back(frame);
    }
  }
  f->staging_busy_.assign(static_cast<std::size_t>(p.param_staging_buffers), 0);
  f->in_flight_.reserve(p.units.size());
  return f;
}

int FrameFetcher::unhold(int unit) {
  UnitState& st = state(unit);
  STRATA_ASSERT_MSG(st.users > 0, "release of a unit that was not acquired");
  return --st.users;
}

bool FrameFetcher::holds_update(int unit) const {
  if (!plan_.units[static_cast<std::size_t>(unit)].framed) return false;
  const UnitState& st = state(unit);
  if (st.stage == Stage::kHandoff) return gate_->handed_off(unit);
  return st.stage == Stage::kResident && st.handed;
}

void* FrameFetcher::frame_data(int unit) const {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (up.persistent) return tiers_.persistent_frame(unit);
  const UnitState& st = state(unit);
  STRATA_ASSERT(st.frame >= 0);
  return frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(st.frame)].data;
}

void* FrameFetcher::shard_data(int unit) const {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  const std::uint64_t at = up.param_numel < up.padded_numel ? u64(up.shard_begin) : 0;
  return static_cast<char*>(frame_data(unit)) + at * plan_.storage_bytes;
}

std::uint64_t FrameFetcher::live_elements() const {
  std::uint64_t live = 0;
  for (std::size_t u = 0; u < states_.size(); ++u) {
    if (states_[u].stage != Stage::kAbsent) live += u64(plan_.units[u].padded_numel);
  }
  return live;
}

bool FrameFetcher::frame_available(int unit) const {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (up.persistent) return true;
  for (const Frame& f : frames_[static_cast<std::size_t>(up.size_class)]) {
    if (f.unit < 0 || state(f.unit).users == 0) return true;
  }
  return false;
}

backend::Event FrameFetcher::frame_released(int unit) const {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  const UnitState& st = state(unit);
  if (up.persistent) return st.released;
  STRATA_ASSERT(st.frame >= 0);
  return frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(st.frame)]
      .released;
}

Status FrameFetcher::wait_frame_free(int unit, bool copy) {
  // The frame's previous unit was released once its last kernels were queued, and a prefetch
  // may take the frame at once: on a GPU those kernels can still be reading it.
  if (planted_race("param.frame_free")) return Status::ok();
  const backend::Event released = frame_released(unit);
  if (copy) return backend_.wait(backend::StreamKind::kHostToDevice, released);
  return backend_.synchronize(released);
}

Status FrameFetcher::released(int unit) {
  return backend_.record(frame_released(unit), backend::StreamKind::kCompute);
}

void FrameFetcher::note(const Status& s) {
  if (!s.is_ok() && first_error_.is_ok()) first_error_ = s;
}

void FrameFetcher::evict(int unit) {
  UnitState& st = state(unit);
  STRATA_ASSERT(st.users == 0 && (st.stage == Stage::kResident || st.stage == Stage::kAbsent));
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (st.frame >= 0) {
    frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(st.frame)].unit = -1;
    st.frame = -1;
    ++stats_->evictions;
  }
  st.stage = Stage::kAbsent;
  st.handed = false;
}

void FrameFetcher::invalidate(int unit) {
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

Result<int> FrameFetcher::find_frame(int unit, bool demand, const PrefetchPolicy& policy) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  std::vector<Frame>& pool = frames_[static_cast<std::size_t>(up.size_class)];
  for (std::size_t i = 0; i < pool.size(); ++i) {
    if (pool[i].unit < 0) return static_cast<int>(i);
  }
  // A cached unit goes; the policy picks which. A prefetch only takes settled (resident) units;
  // a demand fetch may also finish a fetch in flight and take its frame.
  std::vector<int> candidates(pool.size(), -1);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (std::size_t i = 0; i < pool.size(); ++i) {
      const int w = pool[i].unit;
      const UnitState& ws = state(w);
      const bool settled = ws.stage == Stage::kResident;
      candidates[i] = ws.users > 0 || (!settled && (attempt == 0 || !demand)) ? -1 : w;
    }
    const int best = policy.pick_victim(candidates, unit, demand);
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

Result<int> FrameFetcher::find_staging(bool demand) {
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

Result<bool> FrameFetcher::start_fetch(int unit, bool demand, const PrefetchPolicy& policy) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  UnitState& st = state(unit);
  STRATA_ASSERT(up.framed && st.stage == Stage::kAbsent);
  int staging = -1;
  if (up.param_home == Tier::kNvme && !direct_) {
    STRATA_ASSIGN_OR_RETURN(staging, find_staging(demand));
    if (staging < 0) return false;
  }
  if (!up.persistent) {
    STRATA_ASSIGN_OR_RETURN(int frame, find_frame(unit, demand, policy));
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
    stats_->bytes_to_device += bytes;
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

Result<bool> FrameFetcher::start_handoff(int unit, const PrefetchPolicy& policy) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  UnitState& st = state(unit);
  int frame = -1;
  if (!up.persistent) {
    STRATA_ASSIGN_OR_RETURN(frame, find_frame(unit, false, policy));
    if (frame < 0) return false;
    st.frame = frame;
    frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(frame)].unit = unit;
  }
  auto give_back = [&] {
    if (frame >= 0) {
      frames_[static_cast<std::size_t>(up.size_class)][static_cast<std::size_t>(frame)].unit = -1;
      st.frame = -1;
    }
  };
  // The optimizer's worker writes the frame from the host as soon as the offer is taken.
  if (Status free = wait_frame_free(unit, false); !free.is_ok()) {
    give_back();
    return free;
  }
  if (!gate_->offer_frame(unit, shard_data(unit))) {
    give_back();
    return false;
  }
  Trace* trace = tiers_.trace();
  st.begin_us = trace ? trace->now_us() : 0;
  st.stage = Stage::kHandoff;
  in_flight_.push_back(unit);
  ++stats_->handoffs;
  return true;
}

Status FrameFetcher::issue_reads(int unit, bool demand) {
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

Status FrameFetcher::advance(int unit, bool block) {
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

void FrameFetcher::abandon(int unit) {
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

Status FrameFetcher::move_fetch(int unit, bool block) {
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
    stats_->bytes_to_device += bytes;
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

Status FrameFetcher::complete(int unit) {
  UnitState& st = state(unit);
  if (st.staging >= 0) {
    staging_busy_[static_cast<std::size_t>(st.staging)] = 0;
    st.staging = -1;
  }
  st.stage = Stage::kResident;
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), unit));
  return Status::ok();
}

Status FrameFetcher::poll() {
  STRATA_TRY(first_error_);
  for (std::size_t i = 0; i < in_flight_.size();) {
    const int u = in_flight_[i];
    STRATA_TRY(advance(u, false));
    if (i < in_flight_.size() && in_flight_[i] == u) ++i;
  }
  return Status::ok();
}

Status FrameFetcher::drain() {
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

}  // namespace strata::offload

// The optimizer pipeline on the trainer's thread (see optimizer_pipeline.h): starting a step
// (whole, or some units'), the preload ahead of it, the device units' AdamW, the host->device
// copies the worker asks for, and the waits. The worker's side (reads, Adam, writes) is in
// optimizer_pipeline.cc.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "offload/optimizer_pipeline.h"

namespace strata::offload {
namespace {

// How long a wait sleeps between looks at the device copies the worker handed over (this thread
// issues and completes those when it comes by).
constexpr auto kDeliveryPoll = std::chrono::microseconds(200);

}  // namespace

void OptimizerPipeline::whole_step_tiles() {
  STRATA_ASSERT(!active_.load() && preloaded_ == 0);
  if (!partial_) return;
  tiles_ = all_tiles_;
  partial_ = false;
}

Status OptimizerPipeline::preload() {
  if (active_.load() || preloaded_ > 0 || failed_.load()) return Status::ok();
  whole_step_tiles();
  const auto ntiles = static_cast<std::int64_t>(tiles_.size());
  for (std::int64_t t = 0; t < std::min(depth_, ntiles) && nvme_state(t); ++t) {
    Status s = issue_reads(slot_of(t), t, false);
    ++preloaded_;
    if (!s.is_ok()) {
      (void)cancel_preload();
      failed_.store(true);
      return s;
    }
  }
  return Status::ok();
}

Status OptimizerPipeline::cancel_preload() {
  STRATA_ASSERT(!active_.load());
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
  STRATA_ASSERT_MSG(!active_.load(), "optimizer step started while the previous one runs");
  if (preloaded_ == 0) whole_step_tiles();  // a preload already made tiles_ the whole step's
  return begin_step(step, nullptr);
}

Status OptimizerPipeline::start(const PipelineStep& step, const std::vector<int>& units) {
  STRATA_ASSERT_MSG(!active_.load(), "optimizer step started while the previous one runs");
  std::vector<char> listed(plan_.units.size(), 0);
  for (int u : units) {
    if (u < 0 || static_cast<std::size_t>(u) >= plan_.units.size()) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("unit {} is not a unit; valid: 0 to {}", u,
                                static_cast<int>(plan_.units.size()) - 1),
                    "units");
    }
    if (device_unit(u)) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("unit {} has its optimizer state on the device, which a partial "
                                "step does not run; valid: host- or NVMe-homed units",
                                u),
                    "units");
    }
    if (listed[static_cast<std::size_t>(u)] != 0) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("unit {} is listed twice; valid: each unit once per step", u),
                    "units");
    }
    listed[static_cast<std::size_t>(u)] = 1;
  }
  if (preloaded_ > 0) STRATA_TRY(cancel_preload());
  tiles_.clear();
  for (int u : units) {
    for (std::int64_t t = 0; t < plan_.units[static_cast<std::size_t>(u)].tiles; ++t)
      tiles_.push_back(Tile{u, t});
  }
  partial_ = true;
  return begin_step(step, &listed);
}

Status OptimizerPipeline::begin_step(const PipelineStep& step, const std::vector<char>* listed) {
  if (failed_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  STRATA_TRY(backend_.record(step_started_, backend::StreamKind::kCompute));
  step_ = step;
  params_ = optim::adam_params(adam_.settings(), step.lr, step.step);
  fusion_ = optim::adam_fusion(step.grad_multiplier);
  if (listed == nullptr) STRATA_TRY(run_device_tiles());
  next_compute_ = done_ = 0;
  for (std::size_t u = 0; u < plan_.units.size(); ++u) {
    // Units a partial step leaves out are as ready as between steps.
    const bool left_out =
        listed != nullptr && (*listed)[u] == 0 && !device_unit(static_cast<int>(u));
    params_tiles_[u].store(left_out ? plan_.units[u].tiles : 0);
    done_tiles_[u].store(left_out ? plan_.units[u].tiles : 0);
  }
  for (std::size_t u = 0; u < hand_.size(); ++u) {
    hand_[u].store(kHandNone);
    hand_destination_[u].store(nullptr);
    hand_tiles_[u].store(0);
  }
  // Preloaded tiles only miss their gradient (final now).
  next_read_ = preloaded_;
  preloaded_ = 0;
  for (std::int64_t t = 0; t < next_read_; ++t) {
    Status s = issue_read(slot_of(t), 3);
    if (!s.is_ok()) {
      abort_io();
      failed_.store(true);
      std::lock_guard<std::mutex> lock(mu_);
      error_ = s;
      return s;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_.store(true);
    run_requested_ = true;
  }
  cv_.notify_all();
  return Status::ok();
}

Status OptimizerPipeline::deliver() {
  for (Slot& slot : slots_) {
    const int d = slot.delivery.load();
    if (d == static_cast<int>(Delivery::kRequested)) {
      STRATA_TRY(backend_.wait(backend::StreamKind::kHostToDevice, step_started_));
      STRATA_TRY(backend_.copy_async(backend::StreamKind::kHostToDevice, slot.copy_dst,
                                     slot.copy_src, slot.copy_bytes));
      STRATA_TRY(backend_.record(slot.copied, backend::StreamKind::kHostToDevice));
      slot.delivery.store(static_cast<int>(Delivery::kIssued));
    } else if (d == static_cast<int>(Delivery::kIssued) && backend_.query(slot.copied)) {
      slot.delivery.store(static_cast<int>(Delivery::kDone));
      cv_.notify_all();
    }
  }
  return Status::ok();
}

template <typename Ready>
Status OptimizerPipeline::wait_until(Ready ready) {
  for (;;) {
    STRATA_TRY(deliver());
    std::unique_lock<std::mutex> lock(mu_);
    if (!error_.is_ok()) return error_;
    if (ready()) return Status::ok();
    // Woken by the worker's milestones; the timeout keeps device copies moving.
    cv_.wait_for(lock, kDeliveryPoll);
  }
}

Status OptimizerPipeline::pump() {
  STRATA_TRY(deliver());
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Status OptimizerPipeline::wait_for_params(int unit) {
  return wait_until([&] { return params_ready(unit); });
}

Status OptimizerPipeline::wait_unit(int unit) {
  return wait_until([&] { return unit_done(unit); });
}

Status OptimizerPipeline::finish() {
  return wait_until([&] { return !active_.load() && !device_pending(); });
}

Status OptimizerPipeline::run_device_tiles() {
  if (device_units_.empty()) return Status::ok();
  backend::OptimizerOps& ops = backend_.optimizer_ops();
  const std::uint64_t c = plan_.storage_bytes;
  const auto start = std::chrono::steady_clock::now();
  TraceScope scope(tiers_.trace(), TraceLane::kAdam, "adam (device)");
  for (int u : device_units_) {
    const UnitPlan& up = plan_.units[static_cast<std::size_t>(u)];
    for (std::int64_t t = 0; t < up.tiles && !skip_adam_; ++t) {
      const std::int64_t begin = plan_.tile_begin(u, t), n = plan_.tile_numel(u, t);
      kernels::AdamTile tile;
      tile.master = tiers_.device_state(u, SlotKind::kMaster) + begin;
      tile.exp_avg = tiers_.device_state(u, SlotKind::kExpAvg) + begin;
      tile.exp_avg_sq = tiers_.device_state(u, SlotKind::kExpAvgSq) + begin;
      tile.grad = tiers_.device_state(u, SlotKind::kGrad) + begin;
      tile.grad_dtype = kernels::DType::kF32;
      tile.n = static_cast<std::size_t>(n);
      char* params_at = static_cast<char*>(tiers_.device_param(u)) +
                        static_cast<std::uint64_t>(up.param_shard_offset() + begin) * c;
      // 16-bit parameters are the copy-out; fp32 ones are the master itself, or (a shard of a
      // whole unit, ZeRO 1/2) a copy of it.
      const bool copy_fp32 = plan_.storage == kernels::DType::kF32 && !up.params_in_master;
      if (plan_.storage != kernels::DType::kF32) {
        tile.copy_out = params_at;
        tile.copy_dtype = plan_.storage;
      }
      // check_finite is off, so the result says nothing beyond success.
      if (Result<kernels::AdamResult> r = ops.adam_step(params_, fusion_, tile); !r.is_ok())
        return r.status();
      if (copy_fp32) {
        backend_.ops_f32().copy(reinterpret_cast<float*>(params_at),
                                static_cast<float*>(tile.master), n);
      }
    }
  }
  times_.adam_ms += ms_since(start);
  return backend_.record(device_done_, backend::StreamKind::kCompute);
}

}  // namespace strata::offload

// The step's time and memory breakdown (see breakdown.h).
#include "train/breakdown.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/units.h"

namespace strata::train {

std::int64_t print_interval(const config::Config& config) {
  if (config.strata.print_every_steps > 0) return config.strata.print_every_steps;
  return std::clamp<std::int64_t>(config.strata.train_steps / 20, 1, 100);
}

// Forwards to the real store; the first gradient request of a micro-batch ends its forward pass
// (the runner asks for gradients only in backward). On the CUDA backend these are the times the
// host issued the work, which the runner's waits for parameters keep close to the device's.
class StepBreakdown::TimedStore : public model::UnitStore<float> {
 public:
  model::UnitStore<float>* inner = nullptr;
  bool in_backward = false;
  Clock::time_point backward_start{};

  Result<const float*> acquire_params(int unit) override { return inner->acquire_params(unit); }
  void release_params(int unit) override { inner->release_params(unit); }
  Result<float*> acquire_grads(int unit) override {
    if (!in_backward) {
      in_backward = true;
      backward_start = Clock::now();
    }
    return inner->acquire_grads(unit);
  }
  Status grads_ready(int unit) override { return inner->grads_ready(unit); }
};

StepBreakdown::StepBreakdown(const config::Config& config)
    : wall_clock_(config.wall_clock_breakdown),
      memory_(config.memory_breakdown),
      store_(std::make_unique<TimedStore>()) {}

StepBreakdown::~StepBreakdown() = default;

model::UnitStore<float>& StepBreakdown::timed_store(model::UnitStore<float>& inner) {
  store_->inner = &inner;
  return *store_;
}

void StepBreakdown::begin_micro_batch() {
  store_->in_backward = false;
  micro_start_ = Clock::now();
}

void StepBreakdown::end_micro_batch() {
  const Clock::time_point end = Clock::now();
  const Clock::time_point split = store_->in_backward ? store_->backward_start : end;
  forward_ms_ += std::chrono::duration<double, std::milli>(split - micro_start_).count();
  backward_ms_ += std::chrono::duration<double, std::milli>(end - split).count();
}

std::vector<std::string> StepBreakdown::end_step(std::int64_t step, double step_ms,
                                                 double compute_wait_ms,
                                                 offload::OffloadStore& state,
                                                 Json::Value* metrics) {
  std::vector<std::string> lines;
  const offload::IoCounters io = state.tiers().io_counters();
  std::uint64_t read = 0, written = 0;
  for (int k = 0; k < offload::kSlotKinds; ++k) {
    read += io.read_bytes[k];
    written += io.write_bytes[k];
  }
  const std::uint64_t to_device = state.scheduler().stats().bytes_to_device;
  const std::uint64_t step_read = read - read_bytes_, step_written = written - write_bytes_;
  const std::uint64_t step_to_device = to_device - to_device_bytes_;
  read_bytes_ = read;
  write_bytes_ = written;
  to_device_bytes_ = to_device;
  const double rest_ms = std::max(0.0, step_ms - forward_ms_ - backward_ms_);
  if (wall_clock_) {
    if (metrics != nullptr) {
      (*metrics)["forward_ms"] = forward_ms_;
      (*metrics)["backward_ms"] = backward_ms_;
      (*metrics)["optimizer_ms"] = rest_ms;
      (*metrics)["nvme_read_bytes"] = Json::UInt64(step_read);
      (*metrics)["nvme_write_bytes"] = Json::UInt64(step_written);
      (*metrics)["to_device_bytes"] = Json::UInt64(step_to_device);
    }
    lines.push_back(fmt::format(
        "step {} time: forward {:.1f} ms, backward {:.1f} ms, optimizer and the rest {:.1f} ms "
        "(step {:.1f} ms; compute waited {:.1f} ms for data); I/O: nvme read {}, nvme write {}, "
        "host->device {}",
        step, forward_ms_, backward_ms_, rest_ms, step_ms, compute_wait_ms, format_bytes(step_read),
        format_bytes(step_written), format_bytes(step_to_device)));
  }
  if (memory_) {
    const offload::TierUsage u = state.tiers().usage();
    auto tier = [&](int t, const char* name) {
      return fmt::format("{} {} in use, peak {}{}", name, format_bytes(u.bytes_in_use[t]),
                         format_bytes(u.bytes_peak[t]),
                         u.bytes_max[t] > 0 ? " of " + format_bytes(u.bytes_max[t]) : "");
    };
    lines.push_back(fmt::format("step {} memory: {}; {}; {}", step, tier(0, "device"),
                                tier(1, "host"), tier(2, "nvme")));
  }
  forward_ms_ = 0.0;
  backward_ms_ = 0.0;
  return lines;
}

}  // namespace strata::train

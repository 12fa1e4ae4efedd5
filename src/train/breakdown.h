// DeepSpeed's wall_clock_breakdown and memory_breakdown for Strata's step: where each step's
// time went (forward, backward, the optimizer and the rest, the time compute waited for data)
// and what moved (NVMe reads and writes, host->device copies), and the tiers' bytes. The trainer
// runs each micro-batch through timed_store() and calls end_step() once a step; the lines are
// printed with the progress lines (every print_interval() steps).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <json/json.h>

#include "config/config.h"
#include "model/runner.h"
#include "offload/offload_store.h"

namespace strata::train {

// Steps between progress lines: strata.print_every_steps, or about 20 lines per run (at least
// one line every 100 steps) when it is 0.
std::int64_t print_interval(const config::Config& config);

class StepBreakdown {
 public:
  explicit StepBreakdown(const config::Config& config);
  ~StepBreakdown();

  // The store a micro-batch runs through: forwards every call to `inner` and notes when the
  // backward pass starts (the runner's first gradient request). Call begin_micro_batch() right
  // before the runner's train_step and end_micro_batch() right after it.
  model::UnitStore<float>& timed_store(model::UnitStore<float>& inner);
  void begin_micro_batch();
  void end_micro_batch();

  // Closes the step: `step_ms` and `compute_wait_ms` from the step's report. Adds the step's
  // times to `metrics` (a metrics.jsonl line) and returns the lines to print (empty unless
  // wall_clock_breakdown or memory_breakdown is on).
  std::vector<std::string> end_step(std::int64_t step, double step_ms, double compute_wait_ms,
                                    offload::OffloadStore& state, Json::Value* metrics);

 private:
  class TimedStore;
  using Clock = std::chrono::steady_clock;

  bool wall_clock_;
  bool memory_;
  std::unique_ptr<TimedStore> store_;
  Clock::time_point micro_start_{};
  double forward_ms_ = 0.0;
  double backward_ms_ = 0.0;
  std::uint64_t read_bytes_ = 0;  // the counters at the end of the previous step
  std::uint64_t write_bytes_ = 0;
  std::uint64_t to_device_bytes_ = 0;
};

}  // namespace strata::train

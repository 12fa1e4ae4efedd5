// Learning-rate schedules with DeepSpeed's exact formulas (deepspeed/runtime/lr_schedules.py) and
// its stepping convention: the schedule starts at last_batch_iteration = -1, the lr of an
// optimizer step is the schedule's value at the current last_batch_iteration, and only an applied
// step (not one skipped for overflow) advances it. So the first step runs at iteration -1:
// WarmupLR and WarmupDecayLR give warmup_min_lr there, WarmupCosineLR gives 0.
//   WarmupLR       lr = min + (max - min) * gamma, gamma = log(i + 1) / log(W) (log warm-up) or
//                  i / W (linear) for i < W, else 1; W = max(2, warmup_num_steps).
//   WarmupDecayLR  as WarmupLR during warm-up, then gamma = max(0, (N - i) / max(1, N - W)).
//   WarmupCosineLR lr = optimizer.lr * ratio; ratio = r0 + (1 - r0) * warm-up gamma for i < W,
//                  then max(0, c + (1 - c) * (1 + cos(pi * min(1, (i - W + 1) / max(1, N - W)))) /
//                  2) with r0 = warmup_min_ratio, c = cos_min_ratio.
//   none           lr = optimizer.lr.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace strata::optim {

class LrSchedule {
 public:
  explicit LrSchedule(const config::Config& config);

  // The lr for the next optimizer step.
  double lr() const { return lr_at(last_batch_iteration_); }
  // The schedule's value at iteration i (i >= -1).
  double lr_at(std::int64_t i) const;
  // Advances after an applied optimizer step.
  void step() { ++last_batch_iteration_; }

  std::int64_t last_batch_iteration() const { return last_batch_iteration_; }
  void restore(std::int64_t last_batch_iteration) { last_batch_iteration_ = last_batch_iteration; }

 private:
  double warmup_gamma(std::int64_t i) const;

  config::SchedulerType type_;
  config::SchedulerParams p_;
  double base_lr_;
  std::int64_t warmup_steps_;
  std::int64_t last_batch_iteration_ = -1;
};

}  // namespace strata::optim

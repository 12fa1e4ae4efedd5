// DeepSpeed's learning-rate schedules (see lr_schedule.h).
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace strata::optim {

LrSchedule::LrSchedule(const config::Config& config)
    : type_(config.scheduler.type),
      p_(config.scheduler.params),
      base_lr_(config.optimizer.params.lr),
      warmup_steps_(std::max<std::int64_t>(2, config.scheduler.params.warmup_num_steps)) {}

double LrSchedule::warmup_gamma(std::int64_t i) const {
  if (p_.warmup_type == config::WarmupType::kLog) {
    return std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(warmup_steps_));
  }
  return static_cast<double>(i) / static_cast<double>(warmup_steps_);
}

double LrSchedule::lr_at(std::int64_t i) const {
  switch (type_) {
    case config::SchedulerType::kNone:
      return base_lr_;
    case config::SchedulerType::kWarmupLR:
    case config::SchedulerType::kWarmupDecayLR: {
      if (i < 0) return p_.warmup_min_lr;
      double gamma = 1.0;
      if (i < warmup_steps_) {
        gamma = warmup_gamma(i);
      } else if (type_ == config::SchedulerType::kWarmupDecayLR) {
        gamma = std::max(
            0.0, static_cast<double>(p_.total_num_steps - i) /
                     std::max(1.0, static_cast<double>(p_.total_num_steps - warmup_steps_)));
      }
      return p_.warmup_min_lr + (p_.warmup_max_lr - p_.warmup_min_lr) * gamma;
    }
    case config::SchedulerType::kWarmupCosineLR: {
      if (i < 0) return 0.0;
      double ratio = 0.0;
      if (i < warmup_steps_) {
        ratio = p_.warmup_min_ratio + warmup_gamma(i) * (1.0 - p_.warmup_min_ratio);
      } else {
        const double real_last = static_cast<double>(i - warmup_steps_ + 1);
        const double real_total =
            std::max(1.0, static_cast<double>(p_.total_num_steps - warmup_steps_));
        const double progress = std::min(1.0, real_last / real_total);
        const double cosine = (1.0 + std::cos(M_PI * progress)) / 2.0;
        ratio = std::max(0.0, p_.cos_min_ratio + (1.0 - p_.cos_min_ratio) * cosine);
      }
      return base_lr_ * ratio;
    }
  }
  return base_lr_;
}

}  // namespace strata::optim

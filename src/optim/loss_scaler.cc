// DeepSpeed-compatible loss scaling and gradient clipping (see loss_scaler.h).
#include "optim/loss_scaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace strata::optim {

LossScaler::LossScaler(const config::Config& config) {
  if (!config.fp16.enabled) return;
  if (config.fp16.loss_scale > 0.0) {
    state_.scale = config.fp16.loss_scale;
    return;
  }
  dynamic_ = true;
  state_.scale = std::ldexp(1.0, static_cast<int>(config.fp16.initial_scale_power));
  min_scale_ = config.fp16.min_loss_scale;
  window_ = config.fp16.loss_scale_window;
  delayed_shift_ = config.fp16.hysteresis;
  consecutive_hysteresis_ = config.fp16.consecutive_hysteresis;
  state_.hysteresis = delayed_shift_;
}

Status LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++state_.iteration;
    return Status::ok();
  }
  if (overflow) {
    if (delayed_shift_ == 1 || state_.hysteresis == 1) {
      if (state_.scale == min_scale_) {
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("the gradients overflow although the loss scale is already at "
                                  "its minimum ({}); the run diverged (lower the learning rate, "
                                  "or use bf16)",
                                  min_scale_),
                      "fp16.min_loss_scale");
      }
      state_.scale = std::max(state_.scale / 2.0, min_scale_);
    } else {
      --state_.hysteresis;
    }
    state_.last_overflow_iteration = state_.iteration;
  } else {
    if (consecutive_hysteresis_) state_.hysteresis = delayed_shift_;
    const std::int64_t stable = state_.iteration - state_.last_overflow_iteration - 1;
    if (stable > 0 && stable % window_ == 0) {
      if (!consecutive_hysteresis_) state_.hysteresis = delayed_shift_;
      state_.scale *= 2.0;
    }
  }
  ++state_.iteration;
  return Status::ok();
}

double gradient_multiplier(double scaled_norm, double loss_scale, double clip) {
  double combined = loss_scale;
  if (clip > 0.0) {
    const double factor = (scaled_norm / loss_scale + 1e-6) / clip;
    if (factor > 1.0) combined = factor * loss_scale;
  }
  return 1.0 / combined;
}

}  // namespace strata::optim

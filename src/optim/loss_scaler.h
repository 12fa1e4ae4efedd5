// Loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py):
//   - fp16 with fp16.loss_scale = 0: dynamic. The scale starts at 2^initial_scale_power. An
//     overflow (inf/NaN gradient) skips the step; with hysteresis left (delayed_shift > 1 and
//     cur_hysteresis > 1) it only uses up one unit of hysteresis, otherwise the scale halves (not
//     below min_loss_scale; an overflow AT the minimum is an error, as in DeepSpeed). After
//     loss_scale_window clean iterations since the last overflow the scale doubles (and the
//     hysteresis refills unless consecutive_hysteresis, which refills it on every clean step);
//   - fp16 with loss_scale > 0: a static scale;
//   - bf16 and fp32: scale 1.
// Strata skips a step whose gradients are not finite in every mode (DeepSpeed's bf16 path would
// apply it); the scale only moves in dynamic mode.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "config/config.h"

namespace strata::optim {

struct LossScalerState {
  double scale = 1.0;
  std::int64_t iteration = 0;  // DeepSpeed's cur_iter
  std::int64_t last_overflow_iteration = -1;
  std::int64_t hysteresis = 1;  // DeepSpeed's cur_hysteresis
};

class LossScaler {
 public:
  explicit LossScaler(const config::Config& config);

  double scale() const { return state_.scale; }
  bool dynamic() const { return dynamic_; }
  // Records one step's outcome. kInvalidArgument (training must stop) when a dynamic scale
  // overflows at its minimum.
  Status update(bool overflow);

  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& state) { state_ = state; }

 private:
  bool dynamic_ = false;
  double min_scale_ = 1.0;
  std::int64_t window_ = 1000;
  std::int64_t delayed_shift_ = 1;
  bool consecutive_hysteresis_ = false;
  LossScalerState state_;
};

// The factor that turns the accumulated (loss-scaled) gradients into the update's gradients:
// 1 / combined_scale, where combined_scale = loss_scale, times the clipping factor
// ((norm / loss_scale + 1e-6) / clip) when clipping is on and that factor exceeds 1 (DeepSpeed's
// unscale_and_clip_grads). `scaled_norm` is the global L2 norm of the scaled gradients.
double gradient_multiplier(double scaled_norm, double loss_scale, double clip);

}  // namespace strata::optim

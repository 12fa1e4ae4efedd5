// The optimizer driver's view of Adam/AdamW: one call updates one flat buffer (a unit, or a tile
// of one) of master weights and moments (fp32, or as strata.optimizer_state stores them) from an
// fp32 or bf16 gradient, with the gradient multiplier
// (unscale and clip combined, optim/loss_scaler.h) and the copy-out of the new weights in the
// parameters' storage type fused into the same pass. It wraps the CPU Adam kernel
// (kernels/cpu/adam.h) and its executor, so the rest of the trainer does not depend on the
// kernel's API.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "config/config.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/state_codec.h"

namespace strata::optim {

struct AdamUpdate {
  // The tile's state as stored (kernels/cpu/adam.h AdamTile): fp32 by default; a bf16 master,
  // bf16 or 8-bit moments (with their per-block absmax) when strata.optimizer_state asks.
  void* master = nullptr;
  kernels::DType master_dtype = kernels::DType::kF32;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  kernels::MomentFormat moments = kernels::MomentFormat::kF32;
  float* exp_avg_absmax = nullptr;
  float* exp_avg_sq_absmax = nullptr;
  std::int64_t block = 2048;
  std::uint32_t rounding_key = 0;     // the unit's stochastic rounding (kernels/cpu/state_codec.h)
  std::uint32_t rounding_offset = 0;  // the tile's first element's index in its unit
  const void* grad = nullptr;
  kernels::DType grad_dtype = kernels::DType::kF32;
  std::int64_t n = 0;
  double lr = 0.0;
  double grad_multiplier = 1.0;  // 1 / combined loss scale (and clip)
  std::int64_t step = 1;         // optimizer steps taken including this one
  void* copy_out = nullptr;      // bf16/fp16 copy of the new weights, or null
  kernels::DType copy_dtype = kernels::DType::kBF16;
};

// Adam's hyperparameters as plain values (the offload engine takes these, not the config).
struct AdamSettings {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adamw = true;  // decoupled weight decay (AdamW, or DeepSpeed's adam_w_mode)
  bool bias_correction = true;
};

// The settings an optimizer section asks for.
AdamSettings adam_settings(const config::OptimizerConfig& optimizer);

// The Adam kernel's arguments for one step (CPU Adam and the device's OptimizerOps take the same,
// so both perform the same fp32 operations): `lr` and Adam's `step` t, the gradient multiplier
// (1 / combined scale) fused into the pass, the finite check off (the trainer checked the norm).
kernels::AdamParams adam_params(const AdamSettings& settings, double lr, std::int64_t step);
kernels::AdamFusion adam_fusion(double grad_multiplier);

class AdamOptimizer {
 public:
  // Adam or AdamW per `settings`, on `threads` threads (0 = all).
  static Result<std::unique_ptr<AdamOptimizer>> create(const AdamSettings& settings, int threads);
  virtual ~AdamOptimizer() = default;
  // "AdamW (avx2, 2 threads)".
  virtual std::string description() const = 0;
  // The hyperparameters it was made with (a device-side Adam uses the same).
  virtual const AdamSettings& settings() const = 0;
  // Updates master, exp_avg, exp_avg_sq in place and writes copy_out when given.
  virtual void update(const AdamUpdate& update) = 0;
};

}  // namespace strata::optim

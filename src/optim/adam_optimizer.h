// The optimizer driver's view of Adam/AdamW: one call updates one flat buffer (a unit, or a tile
// of one) of fp32 master weights and moments from an fp32 gradient, with the gradient multiplier
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
#include "kernels/cpu/dtype.h"

namespace strata::optim {

struct AdamUpdate {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const float* grad = nullptr;
  std::int64_t n = 0;
  double lr = 0.0;
  double grad_multiplier = 1.0;  // 1 / combined loss scale (and clip)
  std::int64_t step = 1;         // optimizer steps taken including this one
  void* copy_out = nullptr;      // bf16/fp16 copy of the new weights, or null
  kernels::DType copy_dtype = kernels::DType::kBF16;
};

class AdamOptimizer {
 public:
  // Adam or AdamW per `optimizer` (DeepSpeed's adam_w_mode), on `threads` threads (0 = all).
  static Result<std::unique_ptr<AdamOptimizer>> create(const config::OptimizerConfig& optimizer,
                                                       int threads);
  virtual ~AdamOptimizer() = default;
  // "AdamW (avx2, 2 threads)".
  virtual std::string description() const = 0;
  // Updates master, exp_avg, exp_avg_sq in place and writes copy_out when given.
  virtual void update(const AdamUpdate& update) = 0;
};

}  // namespace strata::optim

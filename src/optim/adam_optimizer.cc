// AdamOptimizer over the CPU Adam kernel (see adam_optimizer.h).
#include "optim/adam_optimizer.h"

#include <fmt/format.h>

#include "kernels/cpu/adam.h"
#include "runtime/cpu_executor.h"

namespace strata::optim {
namespace {

class CpuAdamOptimizer final : public AdamOptimizer {
 public:
  CpuAdamOptimizer(kernels::AdamKernel kernel, std::unique_ptr<runtime::CpuExecutor> executor,
                   const AdamSettings& settings)
      : kernel_(kernel), executor_(std::move(executor)), settings_(settings) {}

  std::string description() const override {
    return fmt::format("{} ({}, {} threads)", settings_.adamw ? "AdamW" : "Adam",
                       sys::to_string(kernel_.simd()), executor_->threads());
  }

  const AdamSettings& settings() const override { return settings_; }

  void update(const AdamUpdate& u) override {
    const kernels::AdamParams params = adam_params(settings_, u.lr, u.step);
    const kernels::AdamFusion fusion = adam_fusion(u.grad_multiplier);
    kernels::AdamTile tile;
    tile.master = u.master;
    tile.master_dtype = u.master_dtype;
    tile.exp_avg = u.exp_avg;
    tile.exp_avg_sq = u.exp_avg_sq;
    tile.moments = u.moments;
    tile.exp_avg_absmax = u.exp_avg_absmax;
    tile.exp_avg_sq_absmax = u.exp_avg_sq_absmax;
    tile.block = static_cast<std::size_t>(u.block);
    tile.rounding_key = u.rounding_key;
    tile.rounding_offset = u.rounding_offset;
    tile.grad = u.grad;
    tile.grad_dtype = u.grad_dtype;
    tile.copy_out = u.copy_out;
    tile.copy_dtype = u.copy_dtype;
    tile.n = static_cast<std::size_t>(u.n);
    kernel_.step(params, fusion, tile, executor_.get());
  }

 private:
  kernels::AdamKernel kernel_;
  std::unique_ptr<runtime::CpuExecutor> executor_;
  AdamSettings settings_;
};

}  // namespace

AdamSettings adam_settings(const config::OptimizerConfig& optimizer) {
  AdamSettings s;
  s.beta1 = optimizer.params.betas[0];
  s.beta2 = optimizer.params.betas[1];
  s.eps = optimizer.params.eps;
  s.weight_decay = optimizer.params.weight_decay;
  s.adamw = optimizer.decoupled_weight_decay();
  s.bias_correction = optimizer.params.bias_correction;
  return s;
}

kernels::AdamParams adam_params(const AdamSettings& settings, double lr, std::int64_t step) {
  kernels::AdamParams params;
  params.lr = static_cast<float>(lr);
  params.beta1 = static_cast<float>(settings.beta1);
  params.beta2 = static_cast<float>(settings.beta2);
  params.eps = static_cast<float>(settings.eps);
  params.weight_decay = static_cast<float>(settings.weight_decay);
  params.adamw_mode = settings.adamw;
  params.bias_correction = settings.bias_correction;
  params.step = step;
  return params;
}

kernels::AdamFusion adam_fusion(double grad_multiplier) {
  kernels::AdamFusion fusion;
  fusion.grad_scale_inv = static_cast<float>(grad_multiplier);
  fusion.clip_coef = 1.0f;
  fusion.check_finite = false;  // the trainer checked the global norm first
  return fusion;
}

Result<std::unique_ptr<AdamOptimizer>> AdamOptimizer::create(const AdamSettings& settings,
                                                             int threads) {
  STRATA_ASSIGN_OR_RETURN(kernels::AdamKernel kernel, kernels::AdamKernel::create());
  runtime::CpuExecutor::Options options;
  options.threads = threads;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<runtime::CpuExecutor> executor,
                          runtime::CpuExecutor::create(options));
  return std::unique_ptr<AdamOptimizer>(
      new CpuAdamOptimizer(kernel, std::move(executor), settings));
}

}  // namespace strata::optim

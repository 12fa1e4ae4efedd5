// AdamOptimizer over the CPU Adam kernel (see adam_optimizer.h).
#include "optim/adam_optimizer.h"

#include <fmt/format.h>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/cpu_executor.h"

namespace strata::optim {
namespace {

class CpuAdamOptimizer final : public AdamOptimizer {
 public:
  CpuAdamOptimizer(kernels::AdamKernel kernel, std::unique_ptr<kernels::CpuExecutor> executor,
                   const config::OptimizerConfig& config)
      : kernel_(kernel), executor_(std::move(executor)), config_(config) {}

  std::string description() const override {
    return fmt::format("{} ({}, {} threads)", config_.decoupled_weight_decay() ? "AdamW" : "Adam",
                       kernels::to_string(kernel_.simd()), executor_->threads());
  }

  void update(const AdamUpdate& u) override {
    kernels::AdamParams params;
    params.lr = static_cast<float>(u.lr);
    params.beta1 = static_cast<float>(config_.params.betas[0]);
    params.beta2 = static_cast<float>(config_.params.betas[1]);
    params.eps = static_cast<float>(config_.params.eps);
    params.weight_decay = static_cast<float>(config_.params.weight_decay);
    params.adamw_mode = config_.decoupled_weight_decay();
    params.bias_correction = config_.params.bias_correction;
    params.step = u.step;
    kernels::AdamFusion fusion;
    fusion.grad_scale_inv = static_cast<float>(u.grad_multiplier);
    fusion.clip_coef = 1.0f;
    fusion.check_finite = false;  // the trainer checked the global norm first
    kernels::AdamTile tile;
    tile.master = u.master;
    tile.exp_avg = u.exp_avg;
    tile.exp_avg_sq = u.exp_avg_sq;
    tile.grad = u.grad;
    tile.grad_dtype = kernels::DType::kF32;
    tile.copy_out = u.copy_out;
    tile.copy_dtype = u.copy_dtype;
    tile.n = static_cast<std::size_t>(u.n);
    kernel_.step(params, fusion, tile, executor_.get());
  }

 private:
  kernels::AdamKernel kernel_;
  std::unique_ptr<kernels::CpuExecutor> executor_;
  config::OptimizerConfig config_;
};

}  // namespace

Result<std::unique_ptr<AdamOptimizer>> AdamOptimizer::create(
    const config::OptimizerConfig& optimizer, int threads) {
  STRATA_ASSIGN_OR_RETURN(kernels::AdamKernel kernel, kernels::AdamKernel::create());
  kernels::CpuExecutor::Options options;
  options.threads = threads;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<kernels::CpuExecutor> executor,
                          kernels::CpuExecutor::create(options));
  return std::unique_ptr<AdamOptimizer>(
      new CpuAdamOptimizer(kernel, std::move(executor), optimizer));
}

}  // namespace strata::optim

// The configuration turned into the settings of the parts below the trainer (see run_settings.h).
#include "train/run_settings.h"

#include <fmt/format.h>

#include <algorithm>

#include "sys/gpu.h"

namespace strata::train {
namespace {

constexpr const char* kParamPathKey = "zero_optimization.offload_param.nvme_path";
constexpr const char* kOptimPathKey = "zero_optimization.offload_optimizer.nvme_path";

// The paths of `configured` that are in `nearest`, when that keeps some and drops some; else
// `configured` as it is.
std::vector<std::string> narrowed(const std::vector<std::string>& configured,
                                  const std::vector<std::string>& nearest, const char* key,
                                  std::vector<std::string>* notes) {
  std::vector<std::string> kept;
  for (const std::string& path : configured) {
    if (std::find(nearest.begin(), nearest.end(), path) != nearest.end()) kept.push_back(path);
  }
  if (kept.empty() || kept.size() == configured.size()) return configured;
  if (notes != nullptr) {
    notes->push_back(fmt::format("{}: this rank uses the {} of {} paths on its NUMA node", key,
                                 kept.size(), configured.size()));
  }
  return kept;
}

// Adam's hyperparameters as the optimizer section gives them.
optim::AdamSettings adam_settings(const config::OptimizerConfig& optimizer) {
  optim::AdamSettings s;
  s.beta1 = optimizer.params.betas[0];
  s.beta2 = optimizer.params.betas[1];
  s.eps = optimizer.params.eps;
  s.weight_decay = optimizer.params.weight_decay;
  s.adamw = optimizer.decoupled_weight_decay();
  s.bias_correction = optimizer.params.bias_correction;
  return s;
}

}  // namespace

offload::Tier home_tier(config::OffloadDevice device) {
  switch (device) {
    case config::OffloadDevice::kNone:
      return offload::Tier::kDevice;
    case config::OffloadDevice::kCpu:
      return offload::Tier::kHost;
    case config::OffloadDevice::kNvme:
      return offload::Tier::kNvme;
  }
  return offload::Tier::kDevice;
}

kernels::DType storage_of(const config::Config& config) {
  switch (config.precision()) {
    case config::Precision::kBf16:
      return kernels::DType::kBF16;
    case config::Precision::kFp16:
      return kernels::DType::kF16;
    case config::Precision::kFp32:
      break;
  }
  return kernels::DType::kF32;
}

io::EngineOptions engine_options(const config::AioConfig& aio) {
  io::EngineOptions options;
  options.block_size_bytes = aio.block_size;
  options.queue_depth = static_cast<std::uint32_t>(aio.queue_depth);
  options.threads = static_cast<std::uint32_t>(aio.intra_op_parallelism);
  options.single_submit = aio.single_submit;
  options.overlap_events = aio.overlap_events;
  return options;
}

offload::PlanSettings plan_settings(const config::Config& config) {
  return plan_settings(config, {}, nullptr);
}

offload::PlanSettings plan_settings(const config::Config& config,
                                    const std::vector<std::string>& nearest,
                                    std::vector<std::string>* notes) {
  const config::ZeroConfig& z = config.zero_optimization;
  const config::StrataConfig& s = config.strata;
  offload::PlanSettings p;
  p.zero_stage = static_cast<int>(z.stage);
  p.storage = storage_of(config);
  p.param_tier = home_tier(z.offload_param.device);
  p.param_host_elements_max = z.offload_param.max_in_cpu;
  p.param_staging_buffers = static_cast<int>(z.offload_param.buffer_count);
  p.param_staging_elements = z.offload_param.buffer_size;
  // "none" asks for the state on the device, where Adam then runs (the plan decides whether it
  // goes there: strata.device_optimizer, and whether it fits).
  p.optim_tier = home_tier(z.offload_optimizer.device);
  switch (s.device_optimizer) {
    case config::DeviceOptimizer::kAuto:
      p.device_optimizer = offload::DeviceOptimizer::kAuto;
      break;
    case config::DeviceOptimizer::kOn:
      p.device_optimizer = offload::DeviceOptimizer::kOn;
      break;
    case config::DeviceOptimizer::kOff:
      p.device_optimizer = offload::DeviceOptimizer::kOff;
      break;
  }
  p.optim_nvme_fraction = z.offload_optimizer.ratio;
  p.state = s.optimizer_state;  // one StateFormat from the config to the kernels
  p.rounding_seed = s.seed;
  p.tile_elements = z.sub_group_size;
  p.persistence_threshold_elements = z.stage3_param_persistence_threshold;
  p.pipeline_depth = static_cast<int>(s.optimizer_pipeline_depth);
  p.prefetch.bucket_elements = z.stage3_prefetch_bucket_size;
  p.prefetch.live_elements_max = z.stage3_max_live_parameters;
  p.prefetch.reuse_distance_max = z.stage3_max_reuse_distance;
  p.swap.param_dirs = narrowed(z.offload_param.nvme_path, nearest, kParamPathKey, notes);
  p.swap.optim_dirs = narrowed(z.offload_optimizer.nvme_path, nearest, kOptimPathKey, notes);
  p.swap.checksum = s.nvme_checksum;
  p.swap.bytes_max = s.nvme_bytes_max;
  p.swap.engine = engine_options(config.aio);
  return p;
}

offload::EngineSpec engine_spec(const config::Config& config) {
  offload::EngineSpec spec;
  spec.settings = plan_settings(config);
  spec.device_budget_bytes = config.strata.device_bytes_max;
  spec.adam = adam_settings(config.optimizer);
  spec.adam_threads = static_cast<int>(config.strata.optimizer_threads);
  return spec;
}

int layout_shards(const config::Config& config) {
  return offload::layout_shards(static_cast<int>(config.zero_optimization.stage),
                                static_cast<int>(std::max<std::int64_t>(config.world_size, 1)));
}

std::uint64_t gpu_logits_chunk_bytes(std::uint64_t device_bytes_max) {
  constexpr std::uint64_t kMin = model::RunnerOptions{}.logits_chunk_bytes;
  constexpr std::uint64_t kMax = std::uint64_t{1} << 30;
  const std::uint64_t budget = device_bytes_max == 0 ? std::uint64_t{16} << 30 : device_bytes_max;
  return std::clamp<std::uint64_t>(budget / 16, kMin, kMax);
}

model::RunnerOptions runner_options(const config::Config& config, const model::ModelShape& shape,
                                    bool device_is_host) {
  const config::ModelConfig& m = config.strata.model;
  model::RunnerOptions r;
  r.batch =
      static_cast<std::int64_t>(std::max<std::uint64_t>(config.train_micro_batch_size_per_gpu, 1));
  r.seq_len = std::min<std::int64_t>(config.strata.data.seq_len, shape.max_seq_len);
  r.activation_checkpointing = m.activation_checkpointing;
  r.activation_offload = m.activation_offload && m.activation_checkpointing;
  if (!device_is_host) {
    r.logits_chunk_bytes = gpu_logits_chunk_bytes(config.strata.device_bytes_max);
    // 16-bit GEMM inputs read the activations' 16-bit companions (the CUDA backend's
    // gemm_activations_16bit): the estimate counts them.
    r.narrow_companions = cuda::converts_operands(
        backend::resolve_gemm_precision(config.strata.gemm_precision, config.precision()));
  }
  return r;
}

comm::WorldOptions world_options(const config::Config& config) {
  comm::WorldOptions options;
  switch (config.strata.backend) {
    case config::Backend::kAuto:
      options.device = comm::Device::kAuto;
      break;
    case config::Backend::kCpu:
      options.device = comm::Device::kCpu;
      break;
    case config::Backend::kCuda:
      options.device = comm::Device::kCuda;
      break;
  }
  options.comm.timeout_s = config.strata.comm_timeout_s;
  const config::ZeroConfig& zero = config.zero_optimization;
  for (const auto* paths : {&zero.offload_param.nvme_path, &zero.offload_optimizer.nvme_path}) {
    for (const std::string& path : *paths) {
      if (std::find(options.nvme_paths.begin(), options.nvme_paths.end(), path) ==
          options.nvme_paths.end()) {
        options.nvme_paths.push_back(path);
      }
    }
  }
  return options;
}

backend::BackendRequest backend_request(const config::Config& config) {
  const config::StrataConfig& s = config.strata;
  backend::BackendRequest request;
  request.kind = s.backend;
  request.device_bytes_max = s.device_bytes_max;
  request.host_bytes_max = s.host_bytes_max;
  request.cpu_threads = static_cast<int>(s.cpu_threads);
  request.gemm_precision = s.gemm_precision;
  request.precision = config.precision();
  return request;
}

offload::Estimate estimate(const config::Config& config, const offload::EstimateInput& input) {
  offload::EstimateInput in = input;
  // The estimate is for the backend the run would get here: "auto" without a GPU is the CPU's.
  const config::Backend b = config.strata.backend;
  in.device_is_host =
      b == config::Backend::kCpu || (b == config::Backend::kAuto && sys::probe_cuda().gpus.empty());
  return offload::estimate(plan_settings(config),
                           static_cast<int>(std::max<std::int64_t>(config.world_size, 1)),
                           runner_options(config, input.shape, in.device_is_host), in);
}

}  // namespace strata::train

// Where the configuration stops: the one place that turns a training config into the plain
// settings of the parts below the trainer, which never read the config themselves.
//
//   config                                   settings                       read by
//   zero_optimization, strata.*_pipeline_*,  offload::PlanSettings          the tier plan, and from
//   nvme_*, aio                                (with PrefetchLimits and       it the tier manager,
//                                               SwapSettings)                 scheduler, pipeline
//   the above, optimizer, optimizer_threads, offload::EngineSpec            offload::Engine::create
//   device_bytes_max
//   aio                                      io::EngineOptions              the swap files' engine
//   strata.backend, comm_timeout_s, nvme_path comm::WorldOptions            join_world
//   strata.backend, budgets, gemm_precision  backend::BackendRequest        make_backend
//   micro-batch, seq_len, activations        model::RunnerOptions           the model runner
//
// A run's own facts that are not in the config enter here too, as arguments: the NVMe folders
// nearest to this rank (comm's binding) replace the configured lists in the plan's settings, the
// config itself is left as the user wrote it.
#pragma once

#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "comm/world.h"
#include "config/config.h"
#include "io/engine.h"
#include "model/model_spec.h"
#include "model/runner.h"
#include "offload/engine.h"
#include "offload/estimate.h"
#include "offload/plan.h"

namespace strata::train {

// The tier that `offload_*.device` names: none keeps the state on the device.
offload::Tier home_tier(config::OffloadDevice device);

// The parameters' storage type for the config's precision (bf16, fp16 or fp32).
kernels::DType storage_of(const config::Config& config);

// The engine options that a DeepSpeed-style `aio` section asks for.
io::EngineOptions engine_options(const config::AioConfig& aio);

// The plan's settings from the config, with the swap folders as configured.
offload::PlanSettings plan_settings(const config::Config& config);

// The same, with this rank's choice of swap folders: of each configured nvme_path list, the
// paths in `nearest` (the binding's NUMA-near ones), when that keeps at least one and drops some.
// `notes` gets one line per list narrowed this way.
offload::PlanSettings plan_settings(const config::Config& config,
                                    const std::vector<std::string>& nearest,
                                    std::vector<std::string>* notes);

// What the offload engine is built from, as far as the config says: the plan's settings (with
// the swap folders as configured), Adam's hyperparameters and threads (strata.optimizer_threads),
// and the device budget the user set (0: "auto", resolved by the engine from the backend). The
// caller adds the backend, the units, the ranks and the runner's bytes.
offload::EngineSpec engine_spec(const config::Config& config);

// How many equal shards the model layout is cut into for this config (offload::layout_shards).
int layout_shards(const config::Config& config);

// The runner a config asks for on `shape`: the micro-batch, the sequence (at most the model's
// max_seq_len) and the activation checkpointing choices.
// `device_is_host`: the backend's device memory is host memory (the CPU backend). On a GPU the
// head computes its logits in larger chunks (gpu_logits_chunk_bytes).
model::RunnerOptions runner_options(const config::Config& config, const model::ModelShape& shape,
                                    bool device_is_host);

// The head's logits chunk on a GPU: a 16th of the device budget (strata.device_bytes_max; 0, the
// GPU's free memory, counts as 16 GiB), at least the 32 MiB of the CPU backend and at most 1 GiB.
// Every chunk converts the head's weight to 16 bits again and runs three thin GEMMs, so at 32 MiB
// (166 rows of GPT-2's 50257-word vocabulary) the head was half of a GPT-2 step on an H200.
std::uint64_t gpu_logits_chunk_bytes(std::uint64_t device_bytes_max);

// The options to join the run's world with: strata.backend, strata.comm_timeout_s, and every
// configured nvme_path (for the binding's choice of the nearest).
comm::WorldOptions world_options(const config::Config& config);

// The backend a config asks for: strata.backend, the budgets, cpu_threads, gemm_precision.
backend::BackendRequest backend_request(const config::Config& config);

// `strata estimate` for a config: the plan's settings, world size and runner from `config`, for
// the backend the run would get on this machine (strata.backend; "auto" asks for a GPU here).
offload::Estimate estimate(const config::Config& config, const offload::EstimateInput& input);

}  // namespace strata::train

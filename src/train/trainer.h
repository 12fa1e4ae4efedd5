// The trainer (`strata train`) on one rank: the tier plan (offload/plan.h) decides where every byte
// of state lives — device, pinned host or NVMe, as offload_param / offload_optimizer say — and
// OffloadStore (offload/offload_store.h) moves it. A step runs gradient_accumulation_steps
// micro-batches through the ModelRunner (parameters prefetched ahead of use, gradients leaving the
// device once per unit into fp32 accumulators in their home), computes the global gradient norm,
// skips the step when it is not finite (fp16 loss scaling backs off), else starts the optimizer
// pipeline (CPU Adam over tiles, new parameters straight to their home), which the next step's
// forward overlaps. Evaluation, checkpoints (offloaded state included), metrics, the trace and the
// final Hugging Face directory follow strata.* settings (docs/trainer.md, docs/tiers.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_factory.h"
#include "checkpoint/checkpoint.h"
#include "comm/world.h"
#include "common/dir_lock.h"
#include "common/trace.h"
#include "config/config.h"
#include "data/dataset.h"
#include "model/layout.h"
#include "model/runner.h"
#include "offload/engine.h"
#include "offload/offload_store.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "train/breakdown.h"
#include "train/metrics.h"

namespace strata::train {

struct StepReport {
  std::int64_t step = 0;         // 1-based
  double loss = 0.0;             // mean token loss over the step's micro-batches
  double lr = 0.0;               // the lr the step used (0 when skipped)
  double grad_norm = 0.0;        // global L2 norm of the unscaled gradient, before clipping
  double loss_scale = 1.0;       // the scale the step ran with
  bool skipped = false;          // gradient not finite: no update
  std::int64_t tokens = 0;       // tokens in the step
  std::int64_t loss_tokens = 0;  // of those, targets the loss counts (a mask leaves some out)
  double step_ms = 0.0;
  double compute_ms = 0.0;       // forward, backward and the gradients' trip home
  double optimizer_ms = 0.0;     // the rest: norm, and the optimizer unless it overlaps
  double compute_wait_ms = 0.0;  // compute blocked on parameters, updates or gradient buffers
  bool stop = false;  // some rank was asked to stop (SIGINT/SIGTERM): every rank ends after it
};

struct TrainerOptions {
  bool progress_tty = false;              // draw a progress bar (stderr is a terminal)
  bool quiet = false;                     // no start-up lines or progress on stderr
  offload::EngineFactory engine_factory;  // the NVMe I/O engine (tests: the fault twin)
  // Makes the backend (null: backend::make_backend; tests: the CUDA backend under the emulator).
  std::function<Result<backend::MadeBackend>(const backend::BackendRequest&)> backend_factory;
};

class Trainer {
 public:
  // Builds the backend, model (random init, or strata.model.path), data, optimizer state, and
  // resumes from strata.resume_from when set. Errors name the key or file at fault.
  static Result<std::unique_ptr<Trainer>> create(const config::Config& config,
                                                 const TrainerOptions& options);
  ~Trainer();

  // Trains to strata.train_steps: steps, evaluations, checkpoints, metrics, the final model. When
  // a stop is requested (stop_signal.h) it ends after the step in flight instead, with a
  // checkpoint and without a final model; stopped() then says so. A run whose steps are all
  // skipped (non-finite gradients) kSkippedInARowMax times in a row where no loss scale can help
  // stops with an error, as does a non-finite master at a checkpoint or the final model.
  Status run();
  // The signal that stopped run() early (SIGINT, SIGTERM; -1 when another rank's), or 0.
  int stopped() const { return stopped_; }
  // The newest checkpoint this run wrote ("" when none).
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  // One optimizer step.
  Result<StepReport> train_step();
  // Mean token loss over `batches` validation micro-batches.
  Result<double> evaluate(std::int64_t batches);
  // Writes a checkpoint under the checkpoint directory; returns its path.
  Result<std::string> save_checkpoint();
  // Writes config.json + model.safetensors (fp32 masters) to `dir`.
  Status save_model(const std::string& dir);
  // Waits for the optimizer step in flight (it overlaps the next step's forward otherwise).
  Status finish_step();

  const model::ModelShape& shape() const { return shape_; }
  const model::ModelLayout& layout() const { return layout_; }
  const checkpoint::TrainerCounters& counters() const { return counters_; }
  offload::OffloadStore& state() { return *state_; }
  offload::CpuAdam& adam() { return engine_->adam(); }
  offload::Engine& engine() { return *engine_; }
  backend::Backend& backend() { return *backend_; }
  std::optional<double> entropy_floor() const { return dataset_->entropy_floor(); }
  // This process's rank and the number of data-parallel ranks (comm/world.h).
  int rank() const { return world_.comm ? world_.comm->rank() : 0; }
  int world_size() const { return world_.comm ? world_.comm->world_size() : 1; }
  // The JSON summary line `run` writes at the end.
  Json::Value summary() const;

 private:
  Trainer(const config::Config& config, const TrainerOptions& options);
  Status setup();
  void note(const std::string& message);
  Json::Value memory_json() const;
  Status initialise_weights();
  // This rank's next micro-batch into `mine` (see trainer.cc: the ranks take turns); adds the
  // targets that count on every rank to `counted` and clears `plain` unless all are plain.
  Status next_micro_batch(data::Batch& mine, std::int64_t& counted, bool& plain);

  std::vector<DirLock> locks_;  // first, so released last: held while anything may be written
  config::Config config_;
  TrainerOptions options_;
  comm::World world_;  // before everything that uses its Comm
  std::unique_ptr<backend::Backend> backend_;
  model::ModelShape shape_;
  model::ModelLayout layout_;
  kernels::DType storage_ = kernels::DType::kF32;
  std::unique_ptr<data::Dataset> dataset_;
  std::unique_ptr<Trace> trace_;
  std::unique_ptr<offload::Engine> engine_;
  offload::OffloadStore* state_ = nullptr;  // engine_->store()
  std::unique_ptr<model::ModelRunner<float>> runner_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  checkpoint::TrainerCounters counters_;
  std::vector<data::Batch> step_batches_;  // this rank's micro-batches of one step
  data::Batch other_batch_;                // other ranks' micro-batches (read, not trained)
  data::Batch eval_batch_;
  MetricsLog metrics_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<StepBreakdown> breakdown_;  // wall_clock_breakdown, memory_breakdown
  double elapsed_s_ = 0.0;
  std::optional<double> last_eval_loss_;
  bool resumed_ = false;
  int stopped_ = 0;
  std::string last_checkpoint_;
};

// Steps skipped in a row (non-finite gradients) after which a run without dynamic loss scaling
// stops: no scale can make such gradients finite (docs/reliability.md).
inline constexpr std::int64_t kSkippedInARowMax = 5;

// "fp32", "bf16" or "fp16" for the config's precision.
const char* precision_name(const config::Config& config);

}  // namespace strata::train

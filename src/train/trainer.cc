// The trainer (see trainer.h).
#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "backend/backend_factory.h"
#include "checkpoint/root.h"
#include "common/fault_points.h"
#include "common/units.h"
#include "model/hf_io.h"
#include "model/init.h"
#include "offload/plan.h"
#include "train/run_directories.h"
#include "train/run_settings.h"
#include "train/stop_signal.h"

namespace strata::train {
namespace fs = std::filesystem;
namespace {

constexpr std::size_t kRecentLosses = 10;  // the summary's final_loss averages these steps

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

const char* precision_name(const config::Config& config) {
  return config::to_string(config.precision());
}

Trainer::Trainer(const config::Config& config, const TrainerOptions& options)
    : config_(config), options_(options), breakdown_(std::make_unique<StepBreakdown>(config)) {}

Trainer::~Trainer() = default;

void Trainer::note(const std::string& message) {
  if (options_.quiet || rank() != 0) return;
  if (progress_) {
    progress_->note(message);
  } else {
    std::fprintf(stderr, "strata: %s\n", message.c_str());
  }
}

Result<std::unique_ptr<Trainer>> Trainer::create(const config::Config& config,
                                                 const TrainerOptions& options) {
  std::unique_ptr<Trainer> trainer(new Trainer(config, options));
  STRATA_TRY(trainer->setup());
  return trainer;
}

Status Trainer::setup() {
  const config::StrataConfig& s = config_.strata;
  // Join the data-parallel world first: it binds this rank to its cores and GPU.
  comm::WorldOptions world_options = train::world_options(config_);
  world_options.bind = config_.world_size > 1;
  STRATA_ASSIGN_OR_RETURN(world_, comm::join_world(world_options));
  if (world_.comm->world_size() != config_.world_size) {
    return Status(ErrorCode::kConfig,
                  fmt::format("the config was resolved for {} ranks but the launcher started {}",
                              config_.world_size, world_.comm->world_size()),
                  "launcher environment");
  }
  // Before anything is written: the run's folders, the locks that keep every other process out
  // of them while this run lives, and never over another run's checkpoints.
  STRATA_TRY(prepare_run_directories(config_));
  test_barrier("run.lock.before");
  STRATA_ASSIGN_OR_RETURN(locks_, lock_run_directories(config_, rank()));
  test_barrier("run.lock.held");
  std::vector<std::string> removed;
  STRATA_TRY(claim_output_dir(config_, rank() == 0, &removed));
  for (const std::string& path : removed)
    note("overwrite_output_dir: removed the old run's " + path);
  // The plan's settings; on several ranks each swaps to the NVMe paths nearest to it
  // (binding.h), when the machine says which.
  std::vector<std::string> path_notes;
  offload::PlanSettings settings = plan_settings(
      config_, world_size() > 1 ? world_.binding.nvme_paths : std::vector<std::string>{},
      &path_notes);
  for (const std::string& line : path_notes)
    note(line);
  STRATA_ASSIGN_OR_RETURN(shape_, model::shape_of(s.model));
  backend::BackendRequest request = backend_request(config_);
  request.attention_head_sizes = {shape_.head_dim};
  STRATA_ASSIGN_OR_RETURN(backend::MadeBackend made, options_.backend_factory
                                                         ? options_.backend_factory(request)
                                                         : backend::make_backend(request));
  backend_ = std::move(made.backend);
  if (!made.note.empty()) note(made.note);

  // From ZeRO stage 1, each rank owns an equal shard of every unit.
  layout_ = model::build_layout(shape_, offload::layout_shards(settings.zero_stage, world_size()));
  storage_ = settings.storage;
  if (s.data.seq_len > shape_.max_seq_len) {
    return Status(ErrorCode::kConfig,
                  fmt::format("{} is longer than the model's max_seq_len ({})", s.data.seq_len,
                              shape_.max_seq_len),
                  "strata.data.seq_len");
  }
  if (s.data.source == config::DataSource::kText && !s.model.path.empty() &&
      fs::exists(fs::path(s.model.path) / "tokenizer.json")) {
    return Status(ErrorCode::kConfig,
                  fmt::format("\"text\" feeds each byte of {} as a token id, but the model in {} "
                              "has its own tokenizer (tokenizer.json): tokenize the text first "
                              "with tools/prepare_data.py --model {} --input {} --output DIR, "
                              "then train on source \"tokens\" with path DIR/train.bin",
                              s.data.path, s.model.path, s.model.path, s.data.path),
                  "strata.data.source");
  }
  STRATA_ASSIGN_OR_RETURN(dataset_, data::make_dataset(s.data, shape_.vocab_size, s.seed));

  const auto batch = static_cast<std::int64_t>(config_.train_micro_batch_size_per_gpu);
  constexpr std::int64_t kMicroBatchTokensMax = std::int64_t{1} << 31;
  if (batch < 1 || batch > kMicroBatchTokensMax / s.data.seq_len) {
    return Status(ErrorCode::kConfig,
                  fmt::format("{} samples of {} tokens exceed the {} tokens one micro-batch may "
                              "hold; valid: at most {}",
                              batch, s.data.seq_len, kMicroBatchTokensMax,
                              kMicroBatchTokensMax / s.data.seq_len),
                  "train_micro_batch_size_per_gpu");
  }
  // Where every byte lives, and the engine that moves it (offload/engine.h: the plan is checked
  // against the budgets before anything is allocated).
  model::RunnerOptions runner = runner_options(config_, shape_, backend_->device_memory_is_host());
  // The head's logits in 16 bits alone where the backend's ops took that fast path at start.
  runner.narrow_logits = runner.narrow_companions && backend_->ops_f32().logits_in_narrow();
  // The activations only GEMMs read in 16 bits alone likewise (activations_16bit_alone).
  runner.narrow_alone = runner.narrow_companions && backend_->ops_f32().keeps_narrow_alone();
  // The Llama family's gate and up projections in 16 bits alone likewise (gate_up_16bit).
  runner.narrow_gate_up = runner.narrow_companions && backend_->ops_f32().keeps_gate_up_narrow();
  // GPT-2's MLP pre-activation in 16 bits likewise (gelu_16bit).
  runner.narrow_gelu = runner.narrow_companions && backend_->ops_f32().keeps_gelu_narrow();
  // GELU's gradient kept in its companion alone likewise (gelu_grad_16bit_alone).
  runner.narrow_gelu_grad =
      runner.narrow_gelu && runner.narrow_alone && backend_->ops_f32().keeps_gelu_grad_alone();
  // Its product and GELU's gradient in one call, without the fp32 scratch
  // (gemm_dgelu_epilogue_16bit).
  runner.fused_gelu_grad = runner.narrow_gelu_grad && backend_->ops_f32().fuses_gelu_grad();
  // Each block's attention output in 16 bits alone too, where every layer's shape takes it
  // (attention_16bit_alone).
  runner.narrow_attention_alone =
      runner.narrow_alone &&
      model::keeps_attention_alone(backend_->ops_f32(), shape_, runner.batch, runner.seq_len);
  // Its gradient likewise (attention_grad_16bit).
  runner.narrow_attention_grad =
      runner.narrow_attention_alone &&
      model::keeps_attention_alone(backend_->ops_f32(), shape_, runner.batch, runner.seq_len, true);
  // The gradient of SwiGLU's output likewise (swiglu_grad_16bit), on gate and up in 16 bits.
  runner.narrow_swiglu_grad =
      runner.narrow_gate_up && runner.narrow_alone && backend_->ops_f32().keeps_swiglu_grad_alone();
  // The gradient of the blocks' norm outputs likewise (norm_grad_16bit).
  runner.narrow_norm_grad = runner.narrow_alone && backend_->ops_f32().keeps_norm_grad_alone();
  // The gradient of gate and up kept in its companion alone likewise (gate_up_grad_16bit_alone).
  runner.narrow_gate_up_grad = runner.narrow_gate_up && runner.narrow_alone &&
                               backend_->ops_f32().keeps_gate_up_grad_alone();
  // The gradient of q, k and v kept in its companion alone, where every layer's attention rotates q
  // and k and only the products read it (qkv_grad_16bit_alone).
  runner.narrow_qkv_grad =
      runner.narrow_alone &&
      model::keeps_qkv_alone(backend_->ops_f32(), shape_, runner.batch, runner.seq_len, true);
  // Each block's q, k and v in 16 bits alone likewise (qkv_16bit).
  runner.narrow_qkv = runner.narrow_alone && model::keeps_qkv_alone(backend_->ops_f32(), shape_,
                                                                    runner.batch, runner.seq_len);
  model::RunnerMemory activations = model::ModelRunner<float>::memory_needed(shape_, runner);
  if (!s.trace_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(
        trace_,
        Trace::open(rank() == 0 ? s.trace_file : fmt::format("{}.rank{}", s.trace_file, rank())));
  }
  offload::EngineSpec spec = engine_spec(config_);
  spec.backend = backend_.get();
  spec.layout = &layout_;
  spec.settings = std::move(settings);
  spec.rank = rank();
  spec.world = world_size();
  spec.comm = world_.comm.get();
  spec.activation_device_bytes = activations.device_bytes;
  spec.activation_host_bytes = activations.host_bytes;
  spec.tier_options.engine_factory = options_.engine_factory;
  spec.tier_options.trace = trace_.get();
  Result<std::unique_ptr<offload::Engine>> engine = offload::Engine::create(spec);
  if (!engine.is_ok() && engine.status().code() == ErrorCode::kOutOfMemory &&
      engine.status().context() == "strata.device_bytes_max" && runner.narrow_companions) {
    // The activations' 16-bit companions are a speed-up, not a need: where the working set does
    // not fit the device budget with them, the run goes without (the GEMMs convert instead).
    const model::WithoutCompanions without = model::without_companions(shape_, runner);
    note(without.note);
    runner = without.options;
    activations = without.memory;
    spec.activation_device_bytes = activations.device_bytes;
    spec.activation_host_bytes = activations.host_bytes;
    engine = offload::Engine::create(spec);
  }
  if (!engine.is_ok()) return engine.status();
  engine_ = std::move(*engine);
  state_ = &engine_->store();
  STRATA_ASSIGN_OR_RETURN(runner_,
                          model::ModelRunner<float>::create(*backend_, shape_, layout_, runner));
  if (!runner_->companions_dropped().empty()) {
    note(fmt::format("no 16-bit activation companions ({}); the GEMMs convert their activations",
                     runner_->companions_dropped()));
  }
  scaler_ = std::make_unique<optim::LossScaler>(config_);
  schedule_ = std::make_unique<optim::LrSchedule>(config_);
  step_batches_.resize(config_.gradient_accumulation_steps);
  for (data::Batch& b : step_batches_)
    b.resize(batch, s.data.seq_len);
  if (world_size() > 1) other_batch_.resize(batch, s.data.seq_len);
  eval_batch_.resize(batch, s.data.seq_len);
  STRATA_TRY(initialise_weights());
  counters_.scaler = scaler_->state();

  std::error_code ec;
  fs::create_directories(s.output_dir, ec);
  if (ec) {
    return Status(ErrorCode::kIo, "cannot create the output directory: " + ec.message(),
                  s.output_dir);
  }
  if (rank() == 0) {
    STRATA_TRY(metrics_.open(s.output_dir + "/metrics.jsonl", resumed_ ? counters_.step : -1));
  }

  if (world_size() > 1) {
    note(fmt::format("{} ranks, ZeRO stage {}: {}", world_size(), config_.zero_optimization.stage,
                     world_.comm->description()));
  }
  note(backend_->description());
  for (const backend::FastPath& path : backend_->fast_paths()) {
    note(path.active ? fmt::format("fast path {}: on ({})", path.name, path.detail)
                     : fmt::format("fast path {}: off: {}; instead: {}", path.name, path.detail,
                                   path.replaces));
  }
  note(
      fmt::format("model: {} with {} parameters in {} units ({} layers, hidden {}, {} heads, {} "
                  "KV heads, {} embeddings), {} parameters, activation checkpointing {}{}",
                  model::hf_model_type(shape_), model::total_params(shape_), layout_.units.size(),
                  shape_.num_layers, shape_.hidden_size, shape_.num_heads, shape_.num_kv_heads,
                  shape_.tie_word_embeddings ? "tied" : "untied", precision_name(config_),
                  s.model.activation_checkpointing ? "on" : "off",
                  s.model.activation_offload ? " (checkpoints on the host)" : ""));
  note(fmt::format("data: {}", dataset_->describe()));
  for (const std::string& line : dataset_->warnings())
    note("warning: " + line);
  note(fmt::format("optimizer: {}; micro-batch {} x {} tokens, {} accumulation steps; seed {}",
                   engine_->optimizer_description(), batch, s.data.seq_len,
                   config_.gradient_accumulation_steps, s.seed));
  for (const std::string& line :
       offload::describe_plan(state_->tiers().plan(), state_->tiers().swap_dirs()))
    note(line);
  const offload::TierUsage usage = state_->tiers().usage();
  note(fmt::format("memory: device {} of {} (activations {}), host {} of {}, nvme {}",
                   format_bytes(usage.bytes_in_use[0]), format_bytes(usage.bytes_max[0]),
                   format_bytes(runner_->device_bytes()), format_bytes(usage.bytes_in_use[1]),
                   format_bytes(usage.bytes_max[1]), format_bytes(usage.bytes_in_use[2])));
  if (trace_) note(fmt::format("trace: {}", trace_->path()));
  return Status::ok();
}

Status Trainer::initialise_weights() {
  const config::StrataConfig& s = config_.strata;
  const offload::SlotKind master = offload::SlotKind::kMaster;
  if (!s.resume_from.empty()) {
    STRATA_ASSIGN_OR_RETURN(std::string dir, checkpoint::find_checkpoint(s.resume_from));
    // Another run's root stays locked while it is read (its rotation could remove it).
    STRATA_ASSIGN_OR_RETURN(const DirLock reading, lock_resume_root(config_, dir, rank()));
    STRATA_ASSIGN_OR_RETURN(counters_, checkpoint::read_checkpoint(
                                           dir, *state_, shape_, precision_name(config_), s.seed));
    STRATA_TRY(check_resumable(counters_, config_, dir));
    const std::string newer =
        checkpoint::newer_checkpoints_note(checkpoint_root(config_), counters_.step);
    if (!newer.empty()) note(newer);
    scaler_->restore(counters_.scaler);
    schedule_->restore(counters_.scheduler_iteration);
    STRATA_TRY(dataset_->seek(counters_.data));
    resumed_ = true;
    last_checkpoint_ = dir;
    note(fmt::format("resumed from {} at step {}", dir, counters_.step));
    return state_->refresh(false);
  }
  // Whole units are built and this rank keeps its shard: in place when the shard is the unit,
  // else through one unit of scratch.
  const offload::TierPlan& plan = state_->tiers().plan();
  std::vector<float> whole;
  if (plan.world > 1 && config_.zero_optimization.stage >= 1)
    whole.resize(static_cast<std::size_t>(plan.largest_unit));
  auto unit_buffer = [&](int u) {
    return whole.empty() ? state_->fill_buffer(master, u) : whole.data();
  };
  auto keep_shard = [&](int u) {
    if (whole.empty()) return state_->store(master, u, state_->fill_buffer(master, u));
    return state_->store(master, u,
                         whole.data() + plan.units[static_cast<std::size_t>(u)].shard_begin);
  };
  if (!s.model.path.empty() && model::has_hf_weights(s.model.path)) {
    STRATA_TRY(model::load_hf_weights(s.model.path, layout_, unit_buffer, keep_shard));
    note(fmt::format("loaded weights from {}", s.model.path));
  } else {
    for (int u = 0; u < state_->units(); ++u) {
      model::init_unit(shape_, layout_.units[static_cast<std::size_t>(u)], s.seed, unit_buffer(u));
      STRATA_TRY(keep_shard(u));
    }
  }
  return state_->refresh(true);
}

Result<StepReport> Trainer::train_step() {
  const auto start = std::chrono::steady_clock::now();
  const auto batch = static_cast<std::int64_t>(config_.train_micro_batch_size_per_gpu);
  const auto accumulation = static_cast<std::int64_t>(config_.gradient_accumulation_steps);
  const std::int64_t seq = config_.strata.data.seq_len;
  const std::int64_t tokens = batch * seq * accumulation * world_size();  // over all ranks
  StepReport report;
  report.loss_scale = scaler_->scale();
  const double wait_before = state_->counters().compute_wait_ms;

  // The step's micro-batches first (every rank reads all ranks'), so that the gradient can be the
  // mean over the targets that count in the whole step, however a mask spreads them. Without a
  // mask they are all `tokens`, and the arithmetic is what it was before masks.
  std::int64_t counted = 0;
  bool plain = true;
  for (data::Batch& b : step_batches_)
    STRATA_TRY(next_micro_batch(b, counted, plain));
  const double grad_scale =
      report.loss_scale / static_cast<double>(std::max<std::int64_t>(counted, 1));

  double loss_sum = 0.0;
  for (std::int64_t m = 0; m < accumulation; ++m) {
    const data::Batch& b = step_batches_[static_cast<std::size_t>(m)];
    STRATA_TRY(data::feed_batch(*runner_, b));
    state_->begin_micro_batch(m == 0, m == accumulation - 1, counters_.step * accumulation + m);
    double loss = 0.0;
    {
      TraceScope scope(trace_.get(), TraceLane::kCompute, "forward + backward");
      breakdown_->begin_micro_batch();
      STRATA_ASSIGN_OR_RETURN(loss,
                              runner_->train_step(breakdown_->timed_store(*state_), grad_scale));
      breakdown_->end_micro_batch();
    }
    loss_sum += plain ? loss : loss * static_cast<double>(b.counted);
    STRATA_TRY(state_->end_micro_batch());
  }
  STRATA_TRY(state_->finish_backward());
  // The step's loss is the mean over every rank's micro-batches; with ZeRO >= 1 each rank holds
  // the sum of squares of its shard of the gradient, and the norm is over all of them. Whether
  // any rank was asked to stop rides along, so that every rank stops after the same step.
  double sums[3] = {loss_sum, stop_requested() != 0 ? 1.0 : 0.0, state_->grad_sum_squares()};
  if (world_size() > 1)
    STRATA_TRY(
        state_->sharding().sum_over_ranks(sums, config_.zero_optimization.stage >= 1 ? 3 : 2));
  report.loss = plain ? sums[0] / static_cast<double>(accumulation * world_size())
                      : sums[0] / static_cast<double>(std::max<std::int64_t>(counted, 1));
  report.loss_tokens = counted;
  report.stop = sums[1] > 0.0;
  report.compute_ms = seconds_since(start) * 1e3;
  const double scaled_norm = std::sqrt(sums[2]);
  if (!std::isfinite(scaled_norm)) {
    report.skipped = true;
    report.grad_norm = scaled_norm;
    ++counters_.skipped_steps;
    STRATA_TRY(state_->skip_optimizer());
    STRATA_TRY(scaler_->update(true).with_context(fmt::format("step {}", counters_.step + 1)));
  } else {
    const double multiplier =
        optim::gradient_multiplier(scaled_norm, report.loss_scale, config_.gradient_clipping);
    report.lr = schedule_->lr();
    report.grad_norm = scaled_norm / report.loss_scale;
    ++counters_.adam_step;
    offload::PipelineStep step;
    step.lr = report.lr;
    step.grad_multiplier = multiplier;
    step.step = counters_.adam_step;
    STRATA_TRY(state_->start_optimizer(step, !config_.strata.overlap_optimizer));
    STRATA_TRY(scaler_->update(false));
    schedule_->step();
  }
  ++counters_.step;
  counters_.tokens_seen += tokens;
  counters_.scaler = scaler_->state();
  counters_.scheduler_iteration = schedule_->last_batch_iteration();
  counters_.data = dataset_->position();
  counters_.recent_losses.push_back(report.loss);
  if (counters_.recent_losses.size() > kRecentLosses) {
    counters_.recent_losses.erase(counters_.recent_losses.begin());
  }
  report.step = counters_.step;
  report.tokens = tokens;
  report.step_ms = seconds_since(start) * 1e3;
  report.optimizer_ms = report.step_ms - report.compute_ms;
  report.compute_wait_ms = state_->counters().compute_wait_ms - wait_before;
  if (trace_) STRATA_TRY(trace_->flush());
  return report;
}

Status Trainer::next_micro_batch(data::Batch& mine, std::int64_t& counted, bool& plain) {
  // The ranks take turns through one stream of micro-batches: at step s, micro-batch m, rank r
  // trains on micro-batch (s * accumulation + m) * world + r, so W ranks x b equals one rank
  // accumulating W micro-batches of b, and the data position is the same on every rank.
  for (int r = 0; r < world_size(); ++r) {
    data::Batch& b = r == rank() ? mine : other_batch_;
    STRATA_TRY(dataset_->next_train(b));
    counted += b.counted;
    plain = plain && b.plain();
  }
  return Status::ok();
}

Status Trainer::finish_step() {
  return state_->finish_optimizer();
}

Result<double> Trainer::evaluate(std::int64_t batches) {
  // Without a mask every batch counts all its targets and the mean of the batch means is the
  // mean; with one, each batch weighs by the targets it counts.
  double total = 0.0, weighted = 0.0;
  std::int64_t counted = 0;
  bool plain = true;
  for (std::int64_t i = 0; i < batches; ++i) {
    STRATA_TRY(dataset_->val_batch(i, eval_batch_));
    STRATA_TRY(data::feed_batch(*runner_, eval_batch_));
    state_->begin_eval_batch();
    STRATA_ASSIGN_OR_RETURN(double loss, runner_->evaluate(*state_));
    state_->end_eval_batch();
    total += loss;
    weighted += loss * static_cast<double>(eval_batch_.counted);
    counted += eval_batch_.counted;
    plain = plain && eval_batch_.plain();
  }
  if (!plain) return weighted / static_cast<double>(std::max<std::int64_t>(counted, 1));
  return total / static_cast<double>(std::max<std::int64_t>(batches, 1));
}

Result<std::string> Trainer::save_checkpoint() {
  // Each rank writes its shard; rank 0 commits once every rank's file is complete.
  checkpoint::CheckpointOptions options;
  options.zero_stage = static_cast<int>(config_.zero_optimization.stage);
  options.keep_last = static_cast<int>(config_.strata.checkpoint_keep_last);
  Result<std::string> dir = checkpoint::write_checkpoint(
      checkpoint_root(config_), counters_, *state_, shape_, precision_name(config_),
      config_.strata.seed, options, *world_.comm);
  if (!dir.is_ok()) {
    // Say what is left: the run stops, and the user resumes from the last good checkpoint.
    const Status& s = dir.status();
    return Status(
        s.code(),
        fmt::format("{} (the checkpoint of step {} is not written; {})", s.message(),
                    counters_.step,
                    last_checkpoint_.empty() ? "this run has no earlier one"
                                             : "the last complete one is " + last_checkpoint_),
        s.context());
  }
  last_checkpoint_ = *dir;
  return last_checkpoint_;
}

Status Trainer::save_model(const std::string& dir) {
  STRATA_TRY(state_->finish_optimizer());
  // stage3_gather_16bit_weights_on_model_save: the training's 16-bit type, as DeepSpeed's
  // save_16bit_model writes it; else the fp32 master weights.
  const kernels::DType saved_dtype =
      config_.zero_optimization.stage3_gather_16bit_weights_on_model_save ? storage_
                                                                          : kernels::DType::kF32;
  // A diverged model is not published as a result.
  auto check = [&](int u, const float* data) {
    return checkpoint::check_final_masters(layout_.units[static_cast<std::size_t>(u)], data, dir);
  };
  const offload::TierPlan& plan = state_->tiers().plan();
  if (plan.world > 1 && config_.zero_optimization.stage >= 1) {
    // Each rank holds a shard of every master: the units are gathered one at a time, in unit
    // order on every rank (save_hf_model asks for them in that order), and rank 0 writes.
    std::vector<float> whole(static_cast<std::size_t>(plan.largest_unit));
    auto gather = [&](int u) { return state_->gather_masters(u, whole.data()); };
    if (rank() != 0) {
      for (int u = 0; u < state_->units(); ++u)
        STRATA_TRY(gather(u));
      return Status::ok();
    }
    int gathered = -1;
    return model::save_hf_model(
        dir, shape_, layout_,
        [&](int u) -> Result<const float*> {
          while (gathered < u)
            STRATA_TRY(gather(++gathered));
          STRATA_TRY(check(u, whole.data()));
          return static_cast<const float*>(whole.data());
        },
        saved_dtype);
  }
  if (rank() != 0) return Status::ok();  // stage 0: every rank holds the same whole units
  int cached = -1;
  const float* data = nullptr;
  return model::save_hf_model(
      dir, shape_, layout_,
      [&](int u) -> Result<const float*> {
        if (u != cached) {
          STRATA_ASSIGN_OR_RETURN(data, state_->view(offload::SlotKind::kMaster, u));
          STRATA_TRY(check(u, data));
          cached = u;
        }
        return data;
      },
      saved_dtype);
}

Status Trainer::run() {
  const config::StrataConfig& s = config_.strata;
  const auto start = std::chrono::steady_clock::now();
  if (!options_.quiet) {
    progress_ =
        std::make_unique<Progress>(s.train_steps, options_.progress_tty, print_interval(config_));
  }
  bool checkpointed = false;
  std::int64_t skipped_in_a_row = 0;
  while (counters_.step < s.train_steps) {
    STRATA_ASSIGN_OR_RETURN(StepReport r, train_step());
    checkpointed = false;
    skipped_in_a_row = r.skipped ? skipped_in_a_row + 1 : 0;
    const double tokens_per_s =
        r.step_ms > 0 ? static_cast<double>(r.tokens) / (r.step_ms / 1e3) : 0.0;
    Json::Value breakdown_metrics(Json::objectValue);
    const std::vector<std::string> breakdown =
        breakdown_->end_step(r.step, r.step_ms, r.compute_wait_ms, *state_, &breakdown_metrics);
    if (r.step % s.log_every_steps == 0 || r.step == s.train_steps) {
      Json::Value line = memory_json();
      for (const std::string& key : breakdown_metrics.getMemberNames())
        line[key] = breakdown_metrics[key];
      line["step"] = Json::Int64(r.step);
      line["loss"] = r.loss;
      line["lr"] = r.lr;
      line["grad_norm"] = r.skipped ? Json::Value() : Json::Value(r.grad_norm);
      line["loss_scale"] = r.loss_scale;
      line["skipped"] = r.skipped;
      line["tokens"] = Json::Int64(r.tokens);
      if (r.loss_tokens != r.tokens) line["loss_tokens"] = Json::Int64(r.loss_tokens);
      line["tokens_per_s"] = tokens_per_s;
      line["step_ms"] = r.step_ms;
      line["compute_wait_ms"] = r.compute_wait_ms;
      if (rank() == 0) STRATA_TRY(metrics_.write(line));
    }
    if (progress_ && rank() == 0) {
      const offload::TierUsage u = state_->tiers().usage();
      progress_->step(r.step, r.loss, r.lr, tokens_per_s, r.skipped,
                      fmt::format("wait {:.0f} ms  peak device {} host {} nvme {}",
                                  r.compute_wait_ms, format_bytes(u.bytes_peak[0]),
                                  format_bytes(u.bytes_peak[1]), format_bytes(u.bytes_peak[2])));
      if (r.step % print_interval(config_) == 0 || r.step == s.train_steps) {
        for (const std::string& text : breakdown)
          progress_->note(text);
      }
    }
    if (skipped_in_a_row >= kSkippedInARowMax && !scaler_->dynamic()) {
      return Status(
          ErrorCode::kInvalidArgument,
          fmt::format("steps {} to {} were all skipped: their gradients are not finite, "
                      "and in {} no loss scale can change that (a non-finite weight, or "
                      "a diverged run); no checkpoint or final model is written from "
                      "this state{}",
                      r.step - skipped_in_a_row + 1, r.step, precision_name(config_),
                      last_checkpoint_.empty() ? "" : "; the last one is " + last_checkpoint_),
          fmt::format("step {}", r.step));
    }
    const bool last = r.step == s.train_steps;
    if ((s.eval_every_steps > 0 && r.step % s.eval_every_steps == 0) || last) {
      STRATA_ASSIGN_OR_RETURN(double eval_loss, evaluate(s.eval_batches));
      last_eval_loss_ = eval_loss;
      Json::Value line(Json::objectValue);
      line["step"] = Json::Int64(r.step);
      line["eval_loss"] = eval_loss;
      if (rank() == 0) STRATA_TRY(metrics_.write(line));
      note(fmt::format("step {}: eval loss {:.4f}", r.step, eval_loss));
    }
    if ((s.checkpoint_every_steps > 0 && r.step % s.checkpoint_every_steps == 0) || last) {
      STRATA_ASSIGN_OR_RETURN(std::string dir, save_checkpoint());
      checkpointed = true;
      note(fmt::format("checkpoint: {}", dir));
    }
    if (r.stop && !last) {
      // Asked to stop (here or on another rank): keep what was trained, then end.
      if (!checkpointed) {
        STRATA_ASSIGN_OR_RETURN(std::string dir, save_checkpoint());
        note(fmt::format("checkpoint: {}", dir));
      }
      stopped_ = stop_requested() != 0 ? stop_requested() : -1;
      STRATA_TRY(finish_step());
      if (progress_) progress_->finish();
      elapsed_s_ = seconds_since(start);
      if (trace_) STRATA_TRY(trace_->close());
      STRATA_TRY(world_.comm->wait_all());
      return rank() == 0 ? metrics_.write(summary()) : Status::ok();
    }
  }
  if (!checkpointed && counters_.step > 0 && !resumed_) {
    STRATA_ASSIGN_OR_RETURN(std::string dir, save_checkpoint());
    note(fmt::format("checkpoint: {}", dir));
  }
  STRATA_TRY(finish_step());
  if (progress_) progress_->finish();
  STRATA_TRY(save_model(s.output_dir + "/final"));
  elapsed_s_ = seconds_since(start);
  note(fmt::format("final model: {}/final", s.output_dir));
  const offload::TierUsage u = state_->tiers().usage();
  note(fmt::format(
      "where the bytes lived (peaks): device {} of {}, host {} of {}, nvme {}{}",
      format_bytes(u.bytes_peak[0]), format_bytes(u.bytes_max[0]), format_bytes(u.bytes_peak[1]),
      format_bytes(u.bytes_max[1]), format_bytes(u.bytes_peak[2]),
      state_->tiers().swap_dirs().empty() ? "" : " (" + state_->tiers().swap_dirs()[0] + ")"));
  if (trace_) STRATA_TRY(trace_->close());
  STRATA_TRY(world_.comm->wait_all());
  return rank() == 0 ? metrics_.write(summary()) : Status::ok();
}

}  // namespace strata::train

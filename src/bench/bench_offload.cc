// `strata bench offload --model MODEL.json --path DIR`: what offloading to NVMe costs, measured
// in one run on one machine (docs/benchmarks.md, "Offload"):
//   1. the in-memory step (parameters on the device, optimizer state in host memory);
//   2. the same step with parameters and optimizer state on NVMe, its compute wait, and the NVMe
//      bytes it moved, replayed alone ("the step's I/O alone");
//      step_ratio = NVMe step / max(in-memory step, the step's I/O alone);
//   3. the optimizer step with master, moments and gradients on NVMe, against the same reads and
//      writes alone and the Adam arithmetic alone;
//      optimizer_ratio = optimizer step / max(I/O alone, Adam alone).
// Medians of the measured steps / repeats. `--skip-memory` (a model that does not fit in memory)
// and `--skip-optimizer` leave parts out.
#include <json/json.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "bench/bench.h"
#include "bench/offload_parts.h"
#include "config/config.h"
#include "model/model_spec.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace strata::bench {
namespace {

struct BenchOffloadOptions : TrainingOptions {
  BenchOffloadOptions() { precision = "bf16"; }
  std::string path;  // the swap files' directory
  int repeat = 3;
  int in_flight = 8;
  int optimizer_threads = 0;
  int pipeline_depth = 5;
  std::uint64_t sub_group_size = 0;
  double lr = 1e-4;
  std::int64_t data_vocab = 0;
  std::int64_t data_branching = 4;
  std::string host_bytes;
  std::string optimizer_state;  // a JSON object for strata.optimizer_state ("" = fp32 state)
  bool activation_offload = false;
  bool skip_memory = false;
  bool skip_optimizer = false;
};

// A config for `o` with parameters and optimizer state on `param` / `optimizer`.
Result<config::Config> make_config(const BenchOffloadOptions& o, const BenchModel& model,
                                   const std::string& out_dir, const char* param,
                                   const char* optimizer) {
  const model::ModelShape& shape = model.shape;
  STRATA_ASSIGN_OR_RETURN(std::string precision, precision_keys(o.precision));
  const std::string text = fmt::format(
      R"({{{} "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
          "gradient_clipping": 1.0, "optimizer": {{"type": "AdamW", "params": {{"lr": {}}}}},
          "zero_optimization": {{"stage": 3{},
            "offload_param": {{"device": "{}", "nvme_path": "{}", "max_in_cpu": 0}},
            "offload_optimizer": {{"device": "{}", "nvme_path": "{}"}}}},
          "strata": {{"output_dir": "{}", "train_steps": {}, "cpu_threads": {},
                      "optimizer_threads": {}, "optimizer_pipeline_depth": {},
                      "device_bytes_max": "{}"{}{},
                      "data": {{"source": "synthetic", "seq_len": {},
                                "synthetic_vocab_size": {}, "synthetic_branching": {}}}}}}})",
      precision, o.batch, o.lr,
      o.sub_group_size > 0 ? fmt::format(R"(, "sub_group_size": {})", o.sub_group_size) : "", param,
      o.path, optimizer, o.path, out_dir, o.steps + o.warmup + 1, o.threads, o.optimizer_threads,
      o.pipeline_depth, o.device_bytes,
      o.host_bytes.empty() ? "" : fmt::format(R"(, "host_bytes_max": "{}")", o.host_bytes),
      o.optimizer_state.empty() ? "" : fmt::format(R"(, "optimizer_state": {})", o.optimizer_state),
      o.seq_len,
      o.data_vocab > 0 ? std::min(o.data_vocab, shape.vocab_size)
                       : std::min<std::int64_t>(shape.vocab_size, 1 << 20),
      std::min(o.data_branching, o.data_vocab > 0 ? o.data_vocab : shape.vocab_size));
  STRATA_ASSIGN_OR_RETURN(config::Loaded loaded,
                          config::load_config_text(text, "bench offload", {}));
  config::Config config = loaded.config;
  use_model(&config, model, o.checkpointing, o.activation_offload);
  return config;
}

struct StepRun {
  std::vector<double> step_ms, wait_ms, losses, adam_ms;
  IoVolume io;  // per measured step
  offload::TierUsage usage;
  double io_ms = 0.0;  // the step's I/O replayed alone (median of repeats)
};

Result<StepRun> run_steps(const config::Config& config, const BenchOffloadOptions& o, bool replay) {
  train::TrainerOptions options;
  options.quiet = true;
  STRATA_ASSIGN_OR_RETURN(auto trainer, train::Trainer::create(config, options));
  StepRun run;
  offload::TierManager& tiers = trainer->state().tiers();
  offload::IoCounters before;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) before = tiers.io_counters();
    const double adam_before = trainer->state().pipeline().times().adam_ms;
    STRATA_ASSIGN_OR_RETURN(train::StepReport r, trainer->train_step());
    if (s < o.warmup) continue;
    run.step_ms.push_back(r.step_ms);
    run.wait_ms.push_back(r.compute_wait_ms);
    run.losses.push_back(r.loss);
    run.adam_ms.push_back(trainer->state().pipeline().times().adam_ms - adam_before);
  }
  STRATA_TRY(trainer->finish_step());
  run.io = io_since(before, tiers.io_counters());
  for (int k = 0; k < offload::kSlotKinds; ++k) {
    run.io.read_bytes[k] /= static_cast<std::uint64_t>(o.steps);
    run.io.write_bytes[k] /= static_cast<std::uint64_t>(o.steps);
  }
  run.usage = tiers.usage();
  if (replay && run.io.reads() + run.io.writes() > 0) {
    std::vector<double> times;
    for (int r = 0; r < o.repeat; ++r) {
      STRATA_ASSIGN_OR_RETURN(double ms, replay_io(tiers, run.io, o.in_flight));
      times.push_back(ms);
    }
    run.io_ms = median(times);
  }
  return run;
}

struct OptimizerRun {
  std::vector<double> full_ms, io_ms, raw_io_ms, adam_ms;
  IoVolume io;
  std::string adam;  // the optimizer's description (kernel, threads)
};

Result<OptimizerRun> run_optimizer(const config::Config& config, const BenchOffloadOptions& o) {
  train::TrainerOptions options;
  options.quiet = true;
  STRATA_ASSIGN_OR_RETURN(auto trainer, train::Trainer::create(config, options));
  STRATA_TRY(trainer->train_step().status());  // gradients in place
  STRATA_TRY(trainer->finish_step());
  offload::OffloadStore& state = trainer->state();
  offload::TierManager& tiers = state.tiers();
  offload::PipelineStep step;
  step.lr = o.lr;
  step.step = 2;
  OptimizerRun run;
  run.adam = trainer->adam().description();
  for (int r = 0; r < o.repeat; ++r) {
    for (bool skip : {false, true}) {
      state.pipeline().set_skip_adam(skip);
      const offload::IoCounters before = tiers.io_counters();
      const auto start = std::chrono::steady_clock::now();
      STRATA_TRY(state.start_optimizer(step, true));
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      (skip ? run.io_ms : run.full_ms).push_back(ms);
      run.io = io_since(before, tiers.io_counters());
    }
    state.pipeline().set_skip_adam(false);
    STRATA_ASSIGN_OR_RETURN(double raw, replay_io(tiers, run.io, o.in_flight));
    run.raw_io_ms.push_back(raw);
    STRATA_ASSIGN_OR_RETURN(double adam, adam_alone_ms(tiers, trainer->adam(), step));
    run.adam_ms.push_back(adam);
  }
  return run;
}

Result<Json::Value> bench(const BenchOffloadOptions& o) {
  STRATA_ASSIGN_OR_RETURN(BenchModel model, load_model(o));
  const model::ModelShape& shape = model.shape;
  if (!std::filesystem::is_directory(o.path)) {
    return Status(ErrorCode::kUsage, "not a directory: give one on the NVMe drive", "--path");
  }
  Json::Value state(Json::objectValue);
  if (!o.optimizer_state.empty()) {  // an object, so that it cannot reach past its key
    Json::CharReaderBuilder builder;
    std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
    std::string errors;
    const std::string& text = o.optimizer_state;
    if (!reader->parse(text.data(), text.data() + text.size(), &state, &errors) ||
        !state.isObject()) {
      return Status(ErrorCode::kUsage,
                    "'" + text +
                        "' is not a JSON object; valid: e.g. {\"moments\": \"8bit\", "
                        "\"master\": \"bf16\", \"gradients\": \"bf16\"}",
                    "--optimizer-state");
    }
  }
  const std::string out_dir =
      (std::filesystem::temp_directory_path() / fmt::format("strata-bench-offload-{}", ::getpid()))
          .string();
  Json::Value j(Json::objectValue);
  j["model"] = model::family_name(shape.family);
  j["parameters"] = Json::Int64(model::total_params(shape));
  j["layers"] = Json::Int64(shape.num_layers);
  j["hidden_size"] = Json::Int64(shape.hidden_size);
  j["batch"] = Json::Int64(o.batch);
  j["seq_len"] = Json::Int64(o.seq_len);
  j["precision"] = o.precision;
  j["lr"] = o.lr;
  j["data_vocab"] = Json::Int64(o.data_vocab);
  j["data_branching"] = Json::Int64(o.data_branching);
  j["steps"] = o.steps;
  j["repeat"] = o.repeat;
  j["optimizer_state"] = state;

  double memory_step = 0.0;
  if (!o.skip_memory) {
    STRATA_ASSIGN_OR_RETURN(config::Config c, make_config(o, model, out_dir, "none", "none"));
    STRATA_ASSIGN_OR_RETURN(StepRun memory, run_steps(c, o, false));
    memory_step = median(memory.step_ms);
    j["memory_step_ms"] = json_array(memory.step_ms);
    j["memory_step_ms_median"] = memory_step;
    j["memory_losses"] = json_array(memory.losses);
  }
  {
    STRATA_ASSIGN_OR_RETURN(config::Config c, make_config(o, model, out_dir, "nvme", "nvme"));
    STRATA_ASSIGN_OR_RETURN(StepRun nvme, run_steps(c, o, true));
    const double step = median(nvme.step_ms);
    double wait_sum = 0.0, step_sum = 0.0;
    for (std::size_t i = 0; i < nvme.step_ms.size(); ++i) {
      wait_sum += nvme.wait_ms[i];
      step_sum += nvme.step_ms[i];
    }
    j["nvme_step_ms"] = json_array(nvme.step_ms);
    j["nvme_step_ms_median"] = step;
    j["nvme_losses"] = json_array(nvme.losses);
    j["compute_wait_ms"] = json_array(nvme.wait_ms);
    j["compute_wait_fraction"] = step_sum > 0 ? wait_sum / step_sum : 0.0;
    j["adam_ms_median"] = median(nvme.adam_ms);
    j["step_read_bytes"] = Json::UInt64(nvme.io.reads());
    j["step_write_bytes"] = Json::UInt64(nvme.io.writes());
    j["step_read_gbps"] = static_cast<double>(nvme.io.reads()) / (step / 1e3) / 1e9;
    j["step_write_gbps"] = static_cast<double>(nvme.io.writes()) / (step / 1e3) / 1e9;
    j["step_io_alone_ms"] = nvme.io_ms;
    j["step_io_alone_read_gbps"] = static_cast<double>(nvme.io.reads()) / nvme.io_ms * 1e3 / 1e9;
    j["step_io_alone_write_gbps"] = static_cast<double>(nvme.io.writes()) / nvme.io_ms * 1e3 / 1e9;
    j["device_bytes_peak"] = Json::UInt64(nvme.usage.bytes_peak[0]);
    j["host_bytes_peak"] = Json::UInt64(nvme.usage.bytes_peak[1]);
    j["nvme_bytes_peak"] = Json::UInt64(nvme.usage.bytes_peak[2]);
    if (!o.skip_memory) j["step_ratio"] = step / std::max(memory_step, nvme.io_ms);
  }
  if (!o.skip_optimizer) {
    STRATA_ASSIGN_OR_RETURN(config::Config c, make_config(o, model, out_dir, "none", "nvme"));
    STRATA_ASSIGN_OR_RETURN(OptimizerRun opt, run_optimizer(c, o));
    const double full = median(opt.full_ms), io = median(opt.io_ms);
    const double raw = median(opt.raw_io_ms), adam = median(opt.adam_ms);
    j["optimizer_ms"] = json_array(opt.full_ms);
    j["optimizer_ms_median"] = full;
    j["optimizer_io_pipeline_ms_median"] = io;
    j["optimizer_io_replay_ms_median"] = raw;
    j["optimizer_io_alone_ms"] = std::min(io, raw);
    j["optimizer"] = opt.adam;
    j["optimizer_pipeline_depth"] = o.pipeline_depth;
    j["optimizer_adam_alone_ms"] = adam;
    j["optimizer_read_bytes"] = Json::UInt64(opt.io.reads());
    j["optimizer_write_bytes"] = Json::UInt64(opt.io.writes());
    j["optimizer_ratio"] = full / std::max(std::min(io, raw), adam);
  }
  std::error_code ec;
  std::filesystem::remove_all(out_dir, ec);
  return j;
}

int run_bench_offload(const BenchOffloadOptions& o) {
  auto result = bench(o);
  if (!result.is_ok()) return cli::report_error(result.status());
  const Json::Value& j = *result;
  if (o.json) {
    print_json_line(j);
    return 0;
  }
  std::printf("model         %s, %.1fM parameters; batch %lld x %lld tokens, %s\n",
              j["model"].asCString(), j["parameters"].asDouble() / 1e6,
              static_cast<long long>(j["batch"].asInt64()),
              static_cast<long long>(j["seq_len"].asInt64()), j["precision"].asCString());
  if (j.isMember("memory_step_ms_median")) {
    std::printf("in memory     step %.0f ms (median of %d)\n",
                j["memory_step_ms_median"].asDouble(), j["steps"].asInt());
  }
  std::printf(
      "nvme          step %.0f ms, compute waited %.1f%% of it; moved %.2f GB read + %.2f GB "
      "written per step (%.2f / %.2f GB/s)\n",
      j["nvme_step_ms_median"].asDouble(), 100 * j["compute_wait_fraction"].asDouble(),
      j["step_read_bytes"].asDouble() / 1e9, j["step_write_bytes"].asDouble() / 1e9,
      j["step_read_gbps"].asDouble(), j["step_write_gbps"].asDouble());
  std::printf("              the same I/O alone %.0f ms; Adam %.0f ms per step\n",
              j["step_io_alone_ms"].asDouble(), j["adam_ms_median"].asDouble());
  if (j.isMember("step_ratio")) {
    std::printf("step_ratio    %.3f (nvme step / max(in-memory step, its I/O alone))\n",
                j["step_ratio"].asDouble());
  }
  if (j.isMember("optimizer_ratio")) {
    std::printf(
        "optimizer     %.0f ms; I/O alone %.0f ms (pipeline %.0f, replay %.0f); Adam alone %.0f "
        "ms\n",
        j["optimizer_ms_median"].asDouble(), j["optimizer_io_alone_ms"].asDouble(),
        j["optimizer_io_pipeline_ms_median"].asDouble(),
        j["optimizer_io_replay_ms_median"].asDouble(), j["optimizer_adam_alone_ms"].asDouble());
    std::printf("optimizer_ratio %.3f (optimizer step / max(I/O alone, Adam alone))\n",
                j["optimizer_ratio"].asDouble());
  }
  return 0;
}

}  // namespace

void register_offload(CLI::App* bench, cli::Registry& registry) {
  auto o = std::make_shared<BenchOffloadOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "offload",
      "What offloading parameters and optimizer state to NVMe costs: the offloaded step against "
      "the in-memory step and its own I/O alone, the optimizer step against its I/O and Adam "
      "alone");
  add_training_options(cmd, o.get(), "Device budget");
  cmd->add_option("--path", o->path, "A directory on the NVMe drive for the swap files")
      ->required();
  cmd->add_option("--repeat", o->repeat, "Repeats of the I/O replays and optimizer steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--in-flight", o->in_flight, "Tile operations in flight in the I/O replays")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--optimizer-threads", o->optimizer_threads,
                  "CPU Adam threads (strata.optimizer_threads; 0 = automatic)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--pipeline-depth", o->pipeline_depth,
                  "Optimizer tiles in flight (strata.optimizer_pipeline_depth)")
      ->capture_default_str()
      ->check(CLI::Range(3, 16));
  cmd->add_option("--sub-group-size", o->sub_group_size,
                  "Optimizer tile in elements (0 = the config default)");
  cmd->add_option("--lr", o->lr, "AdamW learning rate (constant)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--data-vocab", o->data_vocab,
                  "Tokens the synthetic source uses (0 = the model's vocabulary, at most 2^20)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--data-branching", o->data_branching,
                  "Successors per token of the synthetic source (at most --data-vocab)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--host-bytes", o->host_bytes, "Host budget (default: 80% of free memory)");
  cmd->add_option("--optimizer-state", o->optimizer_state,
                  "strata.optimizer_state as a JSON object, e.g. '{\"moments\": \"8bit\"}' "
                  "(default: fp32 master, moments and gradients)");
  cmd->add_flag("--activation-offload", o->activation_offload,
                "Activation checkpoints in host memory (implies --checkpointing)");
  cmd->add_flag("--skip-memory", o->skip_memory,
                "No in-memory baseline (for a model that does not fit in memory)");
  cmd->add_flag("--skip-optimizer", o->skip_optimizer, "No separate optimizer measurement");
  registry.add(cmd, [o] { return run_bench_offload(*o); });
}

}  // namespace strata::bench

// `strata bench step --model MODEL.json`: the in-memory trainer's speed on a model shape (a
// Hugging Face config.json, or a Strata config whose strata.model it uses): tokens/s and achieved
// GFLOP/s of full training steps (forward, backward, gradient transfer, Adam, parameter upload),
// and in the same run the machine's GEMM peak (sgemm on square problems up to the largest size,
// through the same oneTBB-tiled OpenBLAS path; on the CUDA backend, the backend's own GEMM in the
// run's GEMM precision), so MFU = achieved / peak is a ratio measured on one machine at one time.
// See docs/benchmarks.md ("Training step").
#include <json/json.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "bench/bench.h"
#include "config/config.h"
#include "kernels/cpu/gemm.h"
#include "model/model_spec.h"
#include "model/step_time.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace strata::bench {
namespace {

struct BenchStepOptions : TrainingOptions {
  std::string peak_sizes = "1024,2048,4096";
  int peak_repeats = 5;
  std::string backend = "auto";
  bool predict = false;
  std::string card = "h100";
  double reference_tokens_per_s = 0.0;
  model::Fractions fractions;
};

// GFLOP/s of sgemm n x n x n (median of `repeats`, after one warm-up) on `threads` threads:
// through kernels::gemm in a oneTBB arena of that size, or as one call with OpenBLAS's own threads.
double gemm_gflops(std::int64_t n, int repeats, bool openblas_threads, int threads) {
  tbb::task_arena arena(threads);
  std::vector<float> a(static_cast<std::size_t>(n * n)), b(a.size()), c(a.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = dist(rng);
    b[i] = dist(rng);
  }
  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (openblas_threads) {
      kernels::gemm_openblas_threads(threads, n, n, n, a.data(), b.data(), c.data());
    } else {
      kernels::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                           n);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) seconds.push_back(s);
  }
  return 2.0 * static_cast<double>(n) * n * n / median(seconds) / 1e9;
}

// GFLOP/s of the backend's own GEMM, n x n x n on device memory (median of `repeats` after one
// warm-up; each timed call waits for the compute stream).
Result<double> device_gemm_gflops(backend::Backend& backend, std::int64_t n, int repeats) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(n * n) * sizeof(float);
  STRATA_ASSIGN_OR_RETURN(backend::Buffer a, backend.allocate_device(bytes, "GEMM peak A"));
  STRATA_ASSIGN_OR_RETURN(backend::Buffer b, backend.allocate_device(bytes, "GEMM peak B"));
  STRATA_ASSIGN_OR_RETURN(backend::Buffer c, backend.allocate_device(bytes, "GEMM peak C"));
  std::vector<float> host(static_cast<std::size_t>(n * n));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : host)
    v = dist(rng);
  STRATA_TRY(backend.copy_async(backend::StreamKind::kCompute, a.data(), host.data(), bytes));
  STRATA_TRY(backend.copy_async(backend::StreamKind::kCompute, b.data(), host.data(), bytes));
  backend::Ops<float>& ops = backend.ops_f32();
  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ops.gemm(false, false, n, n, n, 1.0f, a.as<float>(), n, b.as<float>(), n, 0.0f, c.as<float>(),
             n);
    STRATA_TRY(backend.synchronize(backend::StreamKind::kCompute));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) seconds.push_back(s);
  }
  return 2.0 * static_cast<double>(n) * n * n / median(seconds) / 1e9;
}

Result<Json::Value> bench(const BenchStepOptions& o) {
  STRATA_ASSIGN_OR_RETURN(BenchModel model, load_model(o));
  const model::ModelShape& shape = model.shape;
  const std::string out_dir =
      (std::filesystem::temp_directory_path() / fmt::format("strata-bench-step-{}", ::getpid()))
          .string();
  STRATA_ASSIGN_OR_RETURN(std::string precision, precision_keys(o.precision));
  const std::string text = fmt::format(
      R"({{{} "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
          "gradient_clipping": 1.0, "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4}}}},
          "strata": {{"output_dir": "{}", "train_steps": {}, "cpu_threads": {},
                      "device_bytes_max": "{}", "backend": "{}",
                      "data": {{"source": "synthetic", "seq_len": {},
                                "synthetic_vocab_size": {}, "synthetic_branching": 4}}}}}})",
      precision, o.batch, out_dir, o.steps + o.warmup, o.threads, o.device_bytes, o.backend,
      o.seq_len, std::min<std::int64_t>(shape.vocab_size, 1 << 20));
  STRATA_ASSIGN_OR_RETURN(config::Loaded loaded, config::load_config_text(text, "bench step", {}));
  config::Config config = loaded.config;
  use_model(&config, model, o.checkpointing, false);

  train::TrainerOptions trainer_options;
  trainer_options.quiet = true;
  std::vector<double> step_ms, compute_ms, optimizer_ms;
  std::int64_t threads = 0;
  std::string backend_name;
  std::string backend_description;
  Json::Value fast_paths(Json::arrayValue);
  std::vector<std::int64_t> peak_sizes;
  {
    std::stringstream list(o.peak_sizes);
    std::string item;
    while (std::getline(list, item, ',')) {
      const std::int64_t n = std::stoll(item);
      if (n < 1) return Status(ErrorCode::kUsage, "sizes must be positive", "--peak-sizes");
      peak_sizes.push_back(n);
    }
  }
  // The CUDA backend's GEMM peak is measured while its trainer is alive (same device, same
  // GEMM precision); the CPU's after, when its threads are free.
  Json::Value device_sizes(Json::objectValue);
  {
    STRATA_ASSIGN_OR_RETURN(auto trainer, train::Trainer::create(config, trainer_options));
    threads = trainer->backend().compute_threads();
    backend_name = trainer->backend().name();
    backend_description = trainer->backend().description();
    fast_paths = backend::fast_paths_json(trainer->backend().fast_paths());
    for (int s = 0; s < o.warmup + o.steps; ++s) {
      STRATA_ASSIGN_OR_RETURN(train::StepReport r, trainer->train_step());
      if (s < o.warmup) continue;
      step_ms.push_back(r.step_ms);
      compute_ms.push_back(r.compute_ms);
      optimizer_ms.push_back(r.optimizer_ms);
    }
    if (backend_name != "cpu") {
      for (std::int64_t n : peak_sizes) {
        STRATA_ASSIGN_OR_RETURN(double g,
                                device_gemm_gflops(trainer->backend(), n, o.peak_repeats));
        device_sizes[std::to_string(n)] = g;
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(out_dir, ec);

  Json::Value j(Json::objectValue);
  j["backend"] = backend_name;
  j["backend_description"] = backend_description;
  j["fast_paths"] = fast_paths;
  j["model"] = model::family_name(shape.family);
  j["parameters"] = Json::Int64(model::total_params(shape));
  j["layers"] = Json::Int64(shape.num_layers);
  j["hidden_size"] = Json::Int64(shape.hidden_size);
  j["batch"] = Json::Int64(o.batch);
  j["seq_len"] = Json::Int64(o.seq_len);
  j["precision"] = o.precision;
  j["activation_checkpointing"] = o.checkpointing;
  j["threads"] = Json::Int64(threads);
  j["steps"] = o.steps;
  Json::Value steps(Json::arrayValue);
  for (double v : step_ms)
    steps.append(v);
  j["step_ms"] = steps;
  const double step = median(step_ms);
  j["step_ms_median"] = step;
  j["compute_ms_median"] = median(compute_ms);
  j["optimizer_ms_median"] = median(optimizer_ms);
  const double tokens = static_cast<double>(o.batch * o.seq_len);
  j["tokens_per_s"] = tokens / (step / 1e3);
  // Training counts 3 passes of the forward's matrix FLOPs (forward, and backward's two).
  const double flops = 3.0 * model::forward_flops_per_token(shape, o.seq_len) * tokens;
  j["model_flops_per_step"] = flops;
  j["achieved_gflops"] = flops / (step / 1e3) / 1e9;

  Json::Value sizes(Json::objectValue);
  double peak = 0.0;
  std::int64_t largest = 0;
  for (std::int64_t n : peak_sizes) {
    const double g = backend_name != "cpu"
                         ? device_sizes[std::to_string(n)].asDouble()
                         : gemm_gflops(n, o.peak_repeats, false, static_cast<int>(threads));
    sizes[std::to_string(n)] = g;
    if (n >= largest) {
      largest = n;
      peak = g;
    }
  }
  j["gemm_gflops"] = sizes;
  j["gemm_peak_n"] = Json::Int64(largest);
  j["gemm_peak_gflops"] = peak;
  if (backend_name == "cpu") {
    j["openblas_threads_gflops"] =
        gemm_gflops(largest, o.peak_repeats, true, static_cast<int>(threads));
  }
  j["mfu"] = (flops / (step / 1e3) / 1e9) / peak;
  j["blas"] = backend_name == "cpu" ? kernels::blas_description() : backend_description;
  return j;
}

// `--predict`: the model of the step's time on a GPU (model/step_time.h), nothing run.
Result<Json::Value> predict(const BenchStepOptions& o) {
  const model::Card* card = model::find_card(o.card);
  if (card == nullptr) {
    return Status(ErrorCode::kUsage,
                  fmt::format("unknown card '{}'; valid: {}", o.card, model::card_names()),
                  "--card");
  }
  STRATA_ASSIGN_OR_RETURN(BenchModel model, load_model(o));
  const model::StepPrediction p =
      model::predict_step(model.shape, o.batch, o.seq_len, *card, o.fractions);
  Json::Value j(Json::objectValue);
  j["model"] = model::family_name(model.shape.family);
  j["parameters"] = Json::Int64(model::total_params(model.shape));
  j["batch"] = Json::Int64(o.batch);
  j["seq_len"] = Json::Int64(o.seq_len);
  j["card"] = card->name;
  j["card_bf16_tflops"] = card->bf16_flops / 1e12;
  j["card_hbm_tb_s"] = card->hbm_bytes_s / 1e12;
  Json::Value families(Json::arrayValue);
  for (const model::FamilyTime& f : p.families) {
    Json::Value row(Json::objectValue);
    row["family"] = f.family;
    row["flops"] = f.flops;
    row["bytes"] = f.bytes;
    row["bound"] = f.compute_bound ? "compute" : "memory";
    row["fraction_of_peak"] = f.fraction;
    row["ms"] = f.ms;
    row["counted"] = f.what;
    families.append(row);
  }
  j["families"] = families;
  j["predicted_step_ms"] = p.step_ms;
  j["predicted_tokens_per_s"] = p.tokens_per_s;
  j["limiting_family"] = p.limiting;
  if (o.reference_tokens_per_s > 0.0) {
    j["reference_tokens_per_s"] = o.reference_tokens_per_s;
    j["predicted_over_reference"] = p.tokens_per_s / o.reference_tokens_per_s;
  }
  return j;
}

int run_predict(const BenchStepOptions& o) {
  auto result = predict(o);
  if (!result.is_ok()) return cli::report_error(result.status());
  const Json::Value& j = *result;
  if (o.json) {
    print_json_line(j);
    return 0;
  }
  std::printf(
      "prediction   %s, %.1fM parameters, batch %lld x %lld tokens, on an %s "
      "(%.0f TFLOP/s bf16, %.2f TB/s)\n",
      j["model"].asCString(), j["parameters"].asDouble() / 1e6,
      static_cast<long long>(j["batch"].asInt64()), static_cast<long long>(j["seq_len"].asInt64()),
      j["card"].asCString(), j["card_bf16_tflops"].asDouble(), j["card_hbm_tb_s"].asDouble());
  std::printf("%-20s %12s %12s %8s %10s  %s\n", "family", "GFLOP", "GB", "of peak", "ms",
              "counted");
  for (const Json::Value& f : j["families"]) {
    std::printf("%-20s %12.1f %12.3f %7.0f%% %10.3f  %s\n", f["family"].asCString(),
                f["flops"].asDouble() / 1e9, f["bytes"].asDouble() / 1e9,
                f["fraction_of_peak"].asDouble() * 100.0, f["ms"].asDouble(),
                f["counted"].asCString());
  }
  std::printf("step         %.2f ms predicted, %.0f tokens/s; the longest family: %s\n",
              j["predicted_step_ms"].asDouble(), j["predicted_tokens_per_s"].asDouble(),
              j["limiting_family"].asCString());
  if (j.isMember("reference_tokens_per_s")) {
    std::printf("reference    %.0f tokens/s measured: predicted / reference = %.2f\n",
                j["reference_tokens_per_s"].asDouble(), j["predicted_over_reference"].asDouble());
  }
  return 0;
}

int run_bench_step(const BenchStepOptions& o) {
  if (o.predict) return run_predict(o);
  auto result = bench(o);
  if (!result.is_ok()) return cli::report_error(result.status());
  const Json::Value& j = *result;
  if (o.json) {
    print_json_line(j);
    return 0;
  }
  std::printf("backend      %s\n", j["backend_description"].asCString());
  for (const Json::Value& path : j["fast_paths"]) {
    std::string use;
    if (path.isMember("uses")) {
      use = fmt::format(" [{} calls took it, {} the verified path]", path["uses"].asInt64(),
                        path["declined"].asInt64());
    }
    std::printf("fast path    %s: %s%s%s\n", path["name"].asCString(),
                path["active"].asBool() ? "on: " : "off: ", path["detail"].asCString(),
                use.c_str());
  }
  std::printf("model        %s, %.1fM parameters, %lld layers, hidden %lld\n",
              j["model"].asCString(), j["parameters"].asDouble() / 1e6,
              static_cast<long long>(j["layers"].asInt64()),
              static_cast<long long>(j["hidden_size"].asInt64()));
  std::printf(
      "step         batch %lld x %lld tokens, %s, activation checkpointing %s, %lld threads\n",
      static_cast<long long>(j["batch"].asInt64()), static_cast<long long>(j["seq_len"].asInt64()),
      j["precision"].asCString(), j["activation_checkpointing"].asBool() ? "on" : "off",
      static_cast<long long>(j["threads"].asInt64()));
  std::printf("time         median %.1f ms over %d steps (compute %.1f ms, optimizer %.1f ms)\n",
              j["step_ms_median"].asDouble(), j["steps"].asInt(), j["compute_ms_median"].asDouble(),
              j["optimizer_ms_median"].asDouble());
  std::printf("throughput   %.1f tokens/s, %.2f GFLOP/s (model FLOPs %.3g per step)\n",
              j["tokens_per_s"].asDouble(), j["achieved_gflops"].asDouble(),
              j["model_flops_per_step"].asDouble());
  if (j.isMember("openblas_threads_gflops")) {
    std::printf(
        "GEMM peak    %.2f GFLOP/s (sgemm %lld^3, oneTBB tiles); OpenBLAS's own threads: "
        "%.2f GFLOP/s\n",
        j["gemm_peak_gflops"].asDouble(), static_cast<long long>(j["gemm_peak_n"].asInt64()),
        j["openblas_threads_gflops"].asDouble());
  } else {
    std::printf("GEMM peak    %.2f GFLOP/s (%s backend GEMM %lld^3)\n",
                j["gemm_peak_gflops"].asDouble(), j["backend"].asCString(),
                static_cast<long long>(j["gemm_peak_n"].asInt64()));
  }
  std::printf("MFU          %.3f\n", j["mfu"].asDouble());
  return 0;
}

}  // namespace

void register_step(CLI::App* bench, cli::Registry& registry) {
  auto o = std::make_shared<BenchStepOptions>();
  CLI::App* step = bench->add_subcommand(
      "step",
      "Tokens/s and GFLOP/s of full training steps against the GEMM peak measured in the same "
      "run (MFU)");
  add_training_options(step, o.get(), "Device arena budget (reserved, not committed)");
  step->add_option("--peak-sizes", o->peak_sizes,
                   "Square sgemm sizes for the peak; the largest is the peak")
      ->capture_default_str();
  step->add_option("--peak-repeats", o->peak_repeats, "Timed sgemm calls per size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  step->add_option("--backend", o->backend, "auto, cpu or cuda (strata.backend)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  step->add_flag("--predict", o->predict,
                 "Run nothing: print the model of the bf16 step's time on a GPU, per kernel family "
                 "(docs/benchmarks.md)");
  step->add_option("--card", o->card, "With --predict: h100, h200 or a100")->capture_default_str();
  step->add_option("--gemm-fraction", o->fractions.gemm,
                   "With --predict: the fraction of the card's bf16 peak GEMMs reach")
      ->check(CLI::Range(1e-3, 1.0))
      ->capture_default_str();
  step->add_option("--attention-fraction", o->fractions.attention,
                   "With --predict: the fraction of the card's bf16 peak attention reaches")
      ->check(CLI::Range(1e-3, 1.0))
      ->capture_default_str();
  step->add_option("--memory-fraction", o->fractions.memory,
                   "With --predict: the fraction of the card's HBM bandwidth memory-bound kernels "
                   "reach")
      ->check(CLI::Range(1e-3, 1.0))
      ->capture_default_str();
  step->add_option("--reference-tokens-per-s", o->reference_tokens_per_s,
                   "With --predict: a measured tokens/s (e.g. PyTorch's) to compare with")
      ->check(CLI::NonNegativeNumber);
  registry.add(step, [o] { return run_bench_step(*o); });
}

}  // namespace strata::bench

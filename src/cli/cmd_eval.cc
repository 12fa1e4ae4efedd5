// `strata eval --model DIR --data FILE [--json]`: the mean next-token loss of a Hugging Face
// model directory on a token file (llm.c or nanoGPT .bin) or a text file (bytes), over every
// non-overlapping window of --seq-len tokens.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "backend/cpu_backend.h"
#include "cli/command.h"
#include "common/units.h"
#include "data/token_file.h"
#include "model/hf_io.h"
#include "model/resident_store.h"
#include "model/runner.h"
#include "train/metrics.h"

namespace strata::cli {
namespace {

struct EvalOptions {
  std::string model;
  std::string data;
  std::string format = "auto";
  std::int64_t seq_len = 0;
  std::int64_t batch = 4;
  std::int64_t max_batches = 0;
  int threads = 0;
  std::string device_bytes = "4GiB";
  bool json = false;
};

// Loss over `count` windows starting at window `first`, with a runner sized for them.
Result<double> run_windows(model::ModelRunner<float>& runner, model::ResidentStore<float>& store,
                           const data::TokenFile& file, std::int64_t first, std::int64_t count,
                           std::int64_t seq_len, std::vector<std::int32_t>& inputs,
                           std::vector<std::int32_t>& targets) {
  for (std::int64_t w = 0; w < count; ++w) {
    const std::int64_t start = (first + w) * seq_len;
    for (std::int64_t t = 0; t < seq_len; ++t) {
      inputs[w * seq_len + t] = file.at(start + t);
      targets[w * seq_len + t] = file.at(start + t + 1);
    }
  }
  Status batch_ok = runner.set_batch(inputs.data(), targets.data());
  if (!batch_ok.is_ok()) return batch_ok.with_context(file.path());
  return runner.evaluate(store);
}

Result<std::unique_ptr<model::ModelRunner<float>>> make_runner(backend::Backend& backend,
                                                               const model::ModelShape& shape,
                                                               const model::ModelLayout& layout,
                                                               std::int64_t batch,
                                                               std::int64_t seq_len) {
  model::RunnerOptions options;
  options.batch = batch;
  options.seq_len = seq_len;
  return model::ModelRunner<float>::create(backend, shape, layout, options);
}

Result<Json::Value> evaluate(const EvalOptions& o) {
  STRATA_ASSIGN_OR_RETURN(model::ModelShape shape, model::read_hf_spec(o.model));
  const model::ModelLayout layout = model::build_layout(shape);
  const auto device_bytes = parse_bytes(o.device_bytes);
  if (!device_bytes) {
    return Status(ErrorCode::kUsage, "not a byte count: '" + o.device_bytes + "'",
                  "--device-bytes");
  }
  backend::CpuBackendOptions backend_options;
  backend_options.device_bytes_max = *device_bytes;
  backend_options.threads = o.threads;
  backend_options.device_budget_name = "--device-bytes";
  STRATA_ASSIGN_OR_RETURN(auto backend, backend::make_cpu_backend(backend_options));
  STRATA_ASSIGN_OR_RETURN(auto store, model::ResidentStore<float>::create(*backend, layout));
  std::vector<float*> units;
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    units.push_back(store->params(static_cast<int>(u)));
  STRATA_TRY(model::load_hf_weights(o.model, layout, units));

  bool text = o.format == "text";
  if (o.format == "auto") {
    text = std::filesystem::path(o.data).extension() == ".txt";
  } else if (o.format != "tokens" && o.format != "text") {
    return Status(ErrorCode::kUsage, "'" + o.format + "'; valid: auto, tokens, text", "--format");
  }
  STRATA_ASSIGN_OR_RETURN(data::TokenFile file, data::TokenFile::open(o.data, text));
  const std::int64_t seq_len =
      o.seq_len > 0 ? o.seq_len : std::min<std::int64_t>(shape.max_seq_len, 1024);
  if (seq_len > shape.max_seq_len) {
    return Status(ErrorCode::kUsage,
                  fmt::format("{} exceeds the model's max_seq_len {}", seq_len, shape.max_seq_len),
                  "--seq-len");
  }
  std::int64_t windows = (file.size() - 1) / seq_len;
  if (windows < 1) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} tokens are too few for one window of {} tokens plus its target",
                              file.size(), seq_len),
                  o.data);
  }
  const std::int64_t batch = std::max<std::int64_t>(1, std::min(o.batch, windows));
  if (o.max_batches > 0) windows = std::min(windows, o.max_batches * batch);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(batch * seq_len));
  std::vector<std::int32_t> targets(inputs.size());
  double loss_sum = 0.0;
  const std::int64_t full = windows / batch;
  STRATA_ASSIGN_OR_RETURN(auto runner, make_runner(*backend, shape, layout, batch, seq_len));
  for (std::int64_t b = 0; b < full; ++b) {
    STRATA_ASSIGN_OR_RETURN(double loss, run_windows(*runner, *store, file, b * batch, batch,
                                                     seq_len, inputs, targets));
    loss_sum += loss * static_cast<double>(batch * seq_len);
  }
  if (const std::int64_t rest = windows - full * batch; rest > 0) {
    runner.reset();
    STRATA_ASSIGN_OR_RETURN(auto tail, make_runner(*backend, shape, layout, rest, seq_len));
    STRATA_ASSIGN_OR_RETURN(double loss, run_windows(*tail, *store, file, full * batch, rest,
                                                     seq_len, inputs, targets));
    loss_sum += loss * static_cast<double>(rest * seq_len);
  }
  const std::int64_t tokens = windows * seq_len;
  Json::Value j(Json::objectValue);
  j["loss"] = loss_sum / static_cast<double>(tokens);
  j["tokens"] = Json::Int64(tokens);
  return j;
}

int run_eval(const EvalOptions& options) {
  auto result = evaluate(options);
  if (!result.is_ok()) return report_error(result.status());
  if (options.json) {
    std::printf("%s\n", train::MetricsLog::to_line(*result).c_str());
  } else {
    const double loss = (*result)["loss"].asDouble();
    std::printf("loss %.6f nats/token (perplexity %.3f) over %lld tokens\n", loss, std::exp(loss),
                static_cast<long long>((*result)["tokens"].asInt64()));
  }
  return 0;
}

}  // namespace

void register_eval(CLI::App& root, Registry& registry) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* eval = root.add_subcommand(
      "eval", "Mean next-token loss of a Hugging Face model directory on a token or text file");
  eval->add_option("--model,-m", o->model, "Model directory (config.json + safetensors)")
      ->required();
  eval->add_option("--data,-d", o->data, "llm.c / nanoGPT .bin token file, or a text file")
      ->required();
  eval->add_option("--format", o->format, "auto (.txt is text), tokens or text")
      ->capture_default_str();
  eval->add_option("--seq-len", o->seq_len, "Tokens per window (default: min(max_seq_len, 1024))")
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--batch", o->batch, "Windows per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  eval->add_option("--max-batches", o->max_batches, "Stop after this many batches (0 = all)")
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--threads", o->threads, "Compute threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--device-bytes", o->device_bytes, "Device arena budget")->capture_default_str();
  eval->add_flag("--json", o->json, "Print {\"loss\": ..., \"tokens\": ...}");
  registry.add(eval, [o] { return run_eval(*o); });
}

}  // namespace strata::cli

// `strata eval --model DIR --data FILE [--json]`: the mean next-token loss of a Hugging Face
// model directory on a token file (llm.c or nanoGPT .bin) or a text file (bytes), over every
// non-overlapping window of --seq-len tokens (or, with --packing, over its documents packed into
// windows). A mask file beside the token file (data/token_mask.h) leaves the targets it does not
// count out of the mean.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "cli/command.h"
#include "common/units.h"
#include "data/batch.h"
#include "data/token_file.h"
#include "data/token_mask.h"
#include "data/windows.h"
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
  bool packing = false;
  bool json = false;
};

// Sum of the token losses and the targets counted over `count` windows from window `first`,
// with a runner sized for them.
Result<std::pair<double, std::int64_t>> run_windows(model::ModelRunner<float>& runner,
                                                    model::ResidentStore<float>& store,
                                                    const data::TokenWindows& windows,
                                                    std::int64_t vocab, std::int64_t first,
                                                    std::int64_t count, data::Batch& batch) {
  batch.resize(count, batch.seq_len);
  for (std::int64_t w = 0; w < count; ++w) {
    const std::int64_t at = w * batch.seq_len;
    STRATA_TRY(windows.fill(first + w, vocab, batch.inputs.data() + at, batch.targets.data() + at,
                            batch.positions.data() + at));
  }
  batch.packed = windows.is_packed();
  batch.count_targets();
  STRATA_TRY(data::feed_batch(runner, batch));
  STRATA_ASSIGN_OR_RETURN(double loss, runner.evaluate(store));
  return std::make_pair(loss * static_cast<double>(batch.counted), batch.counted);
}

// Raw bytes given to a model that has its own tokenizer would be scored as the ids 0..255 of
// its vocabulary: meaningless, so refused unless --format text asked for it.
Status check_text_for_model(const EvalOptions& o, bool explicit_text) {
  const std::filesystem::path tokenizer = std::filesystem::path(o.model) / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(tokenizer, ec)) return Status::ok();
  const std::string how = fmt::format(
      "tokenize it with the model's tokenizer first: tools/prepare_data.py --model {} --input {} "
      "--output DIR, then strata eval --model {} --data DIR/train.bin",
      o.model, o.data, o.model);
  if (explicit_text) {
    std::fprintf(stderr,
                 "strata eval: warning: scoring the bytes of %s as token ids 0..255, but %s has "
                 "its own tokenizer; to score the text as the model reads it, %s\n",
                 o.data.c_str(), o.model.c_str(), how.c_str());
    return Status::ok();
  }
  return Status(ErrorCode::kUsage,
                fmt::format("{} would be read as raw bytes (token ids 0..255), but {} has its "
                            "own tokenizer ({}); {} (or pass --format text to score the bytes "
                            "anyway)",
                            o.data, o.model, tokenizer.string(), how),
                "--data");
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
  if (text) STRATA_TRY(check_text_for_model(o, o.format == "text"));
  if (text && o.packing) {
    return Status(ErrorCode::kUsage,
                  "packing needs a token file with its mask file (document boundaries); a text "
                  "file has none",
                  "--packing");
  }
  STRATA_ASSIGN_OR_RETURN(data::TokenFile file, data::TokenFile::open(o.data, text));
  std::optional<data::MaskFile> mask;
  if (!text) {
    STRATA_ASSIGN_OR_RETURN(std::optional<data::MaskFile> beside,
                            data::MaskFile::open_beside(file));
    if (beside) mask.emplace(std::move(*beside));
  }
  const std::int64_t seq_len =
      o.seq_len > 0 ? o.seq_len : std::min<std::int64_t>(shape.max_seq_len, 1024);
  if (seq_len > shape.max_seq_len) {
    return Status(ErrorCode::kUsage,
                  fmt::format("{} exceeds the model's max_seq_len {}", seq_len, shape.max_seq_len),
                  "--seq-len");
  }
  data::TokenWindows windows;
  std::vector<std::int64_t> starts;
  if (o.packing) {
    if (!mask) {
      return Status(ErrorCode::kUsage,
                    fmt::format("packing needs the documents' boundaries, which the mask file {} "
                                "records, and there is none: prepare the data with "
                                "tools/prepare_data.py",
                                data::mask_path_for(o.data)),
                    "--packing");
    }
    starts = data::document_starts(*mask);
    windows = data::TokenWindows::packed(file, *mask, seq_len, starts, 0, starts.size());
    if (windows.count() < 1) {
      return Status(ErrorCode::kInvalidArgument,
                    "packing found no document with a target that counts", o.data);
    }
    if (windows.stats().split_documents > 0) {
      std::fprintf(stderr,
                   "strata eval: warning: %lld document(s) are longer than %lld tokens and were "
                   "cut into pieces; a piece after the first is scored without the tokens before "
                   "it (raise --seq-len)\n",
                   static_cast<long long>(windows.stats().split_documents),
                   static_cast<long long>(seq_len + 1));
    }
  } else {
    const std::int64_t count = (file.size() - 1) / seq_len;
    if (count < 1) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("{} tokens are too few for one window of {} tokens plus its "
                                "target",
                                file.size(), seq_len),
                    o.data);
    }
    windows = data::TokenWindows::stream(file, mask ? &*mask : nullptr, seq_len, 0, count);
  }
  std::int64_t window_count = windows.count();
  const std::int64_t batch = std::max<std::int64_t>(1, std::min(o.batch, window_count));
  if (o.max_batches > 0) window_count = std::min(window_count, o.max_batches * batch);
  data::Batch rows;
  rows.resize(batch, seq_len);
  double loss_sum = 0.0;
  std::int64_t counted = 0;
  const std::int64_t full = window_count / batch;
  STRATA_ASSIGN_OR_RETURN(auto runner, make_runner(*backend, shape, layout, batch, seq_len));
  for (std::int64_t b = 0; b < full; ++b) {
    STRATA_ASSIGN_OR_RETURN(
        auto part, run_windows(*runner, *store, windows, shape.vocab_size, b * batch, batch, rows));
    loss_sum += part.first;
    counted += part.second;
  }
  if (const std::int64_t rest = window_count - full * batch; rest > 0) {
    runner.reset();
    STRATA_ASSIGN_OR_RETURN(auto tail, make_runner(*backend, shape, layout, rest, seq_len));
    STRATA_ASSIGN_OR_RETURN(
        auto part, run_windows(*tail, *store, windows, shape.vocab_size, full * batch, rest, rows));
    loss_sum += part.first;
    counted += part.second;
  }
  if (counted == 0) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("no target counts in the {} window(s) scored: the mask file {} "
                              "leaves every one out",
                              window_count, mask ? mask->path() : std::string("-")),
                  o.data);
  }
  Json::Value j(Json::objectValue);
  j["loss"] = loss_sum / static_cast<double>(counted);
  j["tokens"] = Json::Int64(counted);
  if (mask) j["mask"] = mask->path();
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
  eval->add_option("--data,-d", o->data,
                   "llm.c / nanoGPT .bin token file (from tools/prepare_data.py), or a text file")
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
  eval->add_flag("--packing", o->packing,
                 "Pack whole documents into windows (needs the token file's mask file)");
  eval->add_flag("--json", o->json, "Print {\"loss\": ..., \"tokens\": ...}");
  registry.add(eval, [o] { return run_eval(*o); });
}

}  // namespace strata::cli

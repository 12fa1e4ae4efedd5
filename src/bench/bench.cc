// `strata bench ...`: the benchmark family and what its members share (see bench.h).
#include "bench/bench.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "model/model_spec.h"
#include "train/metrics.h"

namespace strata::cli {

void register_bench(CLI::App& root, Registry& registry) {
  CLI::App* bench = root.add_subcommand("bench", "Measure Strata's components on this machine");
  bench->require_subcommand(1);
  bench::register_io(bench, registry);
  bench::register_adam(bench, registry);
  bench::register_step(bench, registry);
  bench::register_comm(bench, registry);
  bench::register_offload(bench, registry);
}

}  // namespace strata::cli

namespace strata::bench {

void add_training_options(CLI::App* cmd, TrainingOptions* o, const std::string& device_bytes_help) {
  cmd->add_option("--model,-m", o->model,
                  "A Hugging Face config.json, or a Strata config (its strata.model)")
      ->required();
  cmd->add_option("--batch", o->batch, "Micro-batch size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--seq-len", o->seq_len, "Tokens per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Measured steps (per configuration)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Steps run before measuring")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--precision", o->precision, "fp32, bf16 or fp16 parameters")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "Compute threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--device-bytes", o->device_bytes, device_bytes_help)->capture_default_str();
  cmd->add_flag("--checkpointing", o->checkpointing, "Activation checkpointing per block");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of text");
}

Result<BenchModel> load_model(const TrainingOptions& o) {
  std::ifstream in(o.model, std::ios::binary);
  if (!in) return Status(ErrorCode::kNotFound, "cannot open", o.model);
  std::ostringstream text;
  text << in.rdbuf();
  BenchModel m;
  if (text.str().find("\"model_type\"") != std::string::npos) {
    STRATA_ASSIGN_OR_RETURN(m.config, model::read_hf_config(o.model));
  } else {
    STRATA_ASSIGN_OR_RETURN(config::Loaded loaded, config::load_config_file(o.model, {}));
    m.config = loaded.config.strata.model;
  }
  STRATA_ASSIGN_OR_RETURN(m.shape, model::resolve_shape(m.config));
  if (o.seq_len > m.shape.max_seq_len) {
    return Status(
        ErrorCode::kUsage,
        fmt::format("{} exceeds the model's max_seq_len {}", o.seq_len, m.shape.max_seq_len),
        "--seq-len");
  }
  return m;
}

Result<std::string> precision_keys(const std::string& precision) {
  if (precision == "bf16") return std::string(R"("bf16": {"enabled": true},)");
  if (precision == "fp16") return std::string(R"("fp16": {"enabled": true},)");
  if (precision == "fp32") return std::string();
  return Status(ErrorCode::kUsage, "'" + precision + "'; valid: fp32, bf16, fp16", "--precision");
}

void use_model(config::Config* config, const BenchModel& model, bool checkpointing,
               bool activation_offload) {
  config::ModelConfig m = model.config;
  m.path.clear();
  m.family = model.shape.family;
  m.vocab_size = model.shape.vocab_size;
  m.max_seq_len = model.shape.max_seq_len;
  m.hidden_size = model.shape.hidden_size;
  m.num_layers = model.shape.num_layers;
  m.num_heads = model.shape.num_heads;
  m.num_kv_heads = model.shape.num_kv_heads;
  m.intermediate_size = model.shape.intermediate_size;
  m.activation_checkpointing = checkpointing || activation_offload;
  m.activation_offload = activation_offload;
  config->strata.model = m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Json::Value json_array(const std::vector<double>& v) {
  Json::Value a(Json::arrayValue);
  for (double x : v)
    a.append(x);
  return a;
}

void print_json_line(const Json::Value& j) {
  std::printf("%s\n", train::MetricsLog::to_line(j).c_str());
}

}  // namespace strata::bench

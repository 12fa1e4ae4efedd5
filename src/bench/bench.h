// `strata bench`: every benchmark of the program lives in this folder, one command per file
// (bench_io, bench_adam, bench_step, bench_comm, bench_offload) with the measurement code beside
// them (io_passes, offload_parts); register_bench (cli/command.h) puts them under `bench`. What
// they share is here: the options of the benchmarks that train a model for a few steps, the model
// those options name, and the statistics and output every benchmark prints.
#pragma once

#include <json/json.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "cli/command.h"
#include "config/config.h"
#include "model/model_spec.h"

namespace strata::bench {

// Each adds its subcommand under `bench`.
void register_io(CLI::App* bench, cli::Registry& registry);
void register_adam(CLI::App* bench, cli::Registry& registry);
void register_step(CLI::App* bench, cli::Registry& registry);
void register_comm(CLI::App* bench, cli::Registry& registry);
void register_offload(CLI::App* bench, cli::Registry& registry);

// The options of a benchmark that trains a model for a few steps (bench step, bench offload).
// The defaults are the struct's; a benchmark may change them before registering.
struct TrainingOptions {
  std::string model;  // a Hugging Face config.json, or a Strata config (its strata.model)
  std::int64_t batch = 4;
  std::int64_t seq_len = 256;
  int steps = 3;
  int warmup = 1;
  std::string precision = "fp32";
  int threads = 0;  // compute threads (0 = all cores)
  std::string device_bytes = "16GiB";
  bool checkpointing = false;
  bool json = false;
};

// Registers --model, --batch, --seq-len, --steps, --warmup, --precision, --threads,
// --device-bytes, --checkpointing and --json for `o` on `cmd`.
void add_training_options(CLI::App* cmd, TrainingOptions* o, const std::string& device_bytes_help);

// The model --model names, its shape resolved and checked against --seq-len.
struct BenchModel {
  config::ModelConfig config;
  model::ModelShape shape;
};
Result<BenchModel> load_model(const TrainingOptions& o);

// The config keys --precision asks for ("" for fp32); kUsage naming --precision for anything but
// fp32, bf16 and fp16.
Result<std::string> precision_keys(const std::string& precision);

// Puts the benchmark's model into `config` (its shape; no weights file) with the activation
// choices.
void use_model(config::Config* config, const BenchModel& model, bool checkpointing,
               bool activation_offload);

double median(std::vector<double> v);
Json::Value json_array(const std::vector<double>& v);
// Prints `j` as one line on stdout (--json).
void print_json_line(const Json::Value& j);

}  // namespace strata::bench

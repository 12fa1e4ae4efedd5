// The typed training configuration: DeepSpeed's JSON schema (with DeepSpeed's defaults) plus
// Strata's own "strata" section. Defaults live in exactly one place: the member initialisers
// below. Parsing, printing and documentation all walk the same per-section field lists
// (config/schema.h), so a key cannot be read under one name and printed under another.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/state_format.h"
#include "common/status.h"
#include "config/model_arch.h"

namespace strata::config {

enum class OffloadDevice { kNone, kCpu, kNvme };
enum class OptimizerType { kAdam, kAdamW };
enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };
enum class Backend { kAuto, kCpu, kCuda };
// What the CUDA backend rounds GEMM inputs to (auto: follows fp16/bf16; fp32 runs keep fp32).
enum class GemmPrecision { kAuto, kFp32, kTf32, kBf16, kFp16 };
enum class DeviceOptimizer { kAuto, kOn, kOff };
// How strata.torch's ranks sum gradients: gathered to the owner and added in rank order, or by
// the collective backend's reduce.
enum class GradientSum { kOrdered, kBackend };
enum class ModelFamily { kGpt2, kLlama };
enum class DataSource { kSynthetic, kTokens, kText };
enum class Precision { kFp32, kFp16, kBf16 };

const char* to_string(OffloadDevice device);
const char* to_string(Precision precision);

// ---- DeepSpeed sections ---------------------------------------------------------------------
// Only the keys Strata acts on have fields here. The DeepSpeed keys it accepts without acting on
// them (and the ones it refuses) are listed in config/schema.h with the reason, and reported by
// `strata config check` (docs/config.md, "What Strata does with each DeepSpeed key").

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic loss scaling
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct Bf16Config {
  bool enabled = false;
};

struct OptimizerParams {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  // DeepSpeed's "Adam" decouples weight decay (AdamW) unless adam_w_mode is false.
  bool adam_w_mode = true;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  OptimizerParams params;
  // Derived: true when the update decouples weight decay (AdamW, or Adam with adam_w_mode).
  bool decoupled_weight_decay() const {
    return type == OptimizerType::kAdamW || params.adam_w_mode;
  }
};

struct SchedulerParams {
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  std::int64_t total_num_steps = 0;  // WarmupDecayLR / WarmupCosineLR: 0 = strata.train_steps
  double warmup_min_ratio = 0.0;     // WarmupCosineLR
  double cos_min_ratio = 1e-4;       // WarmupCosineLR
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;  // no section: constant learning rate
  SchedulerParams params;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::vector<std::string> nvme_path;  // one path, or several to stripe over
  std::int64_t buffer_count = 5;
  std::uint64_t buffer_size = 100'000'000;   // elements per staging buffer; 0 = the largest unit
  std::uint64_t max_in_cpu = 1'000'000'000;  // elements kept in host memory with nvme offload
};

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::vector<std::string> nvme_path;
  double ratio = 1.0;  // fraction of the optimizer state offloaded; the rest stays on the host
};

struct ZeroConfig {
  std::int64_t stage = 0;
  // Elements per optimizer tile. DeepSpeed's default is 1e9 (4 GB per fp32 array); Strata's is
  // 2^25 (128 MiB per fp32 array), which keeps the five pipeline stages of four arrays (and their
  // 16-bit copy-out) in ~2.9 GiB (docs/tiers.md). 0 (valid in DeepSpeed) is read as Strata's
  // default.
  std::uint64_t sub_group_size = 33'554'432;
  std::uint64_t stage3_prefetch_bucket_size = 50'000'000;      // elements
  std::uint64_t stage3_max_live_parameters = 1'000'000'000;    // elements
  std::uint64_t stage3_max_reuse_distance = 1'000'000'000;     // elements
  std::uint64_t stage3_param_persistence_threshold = 100'000;  // elements
  // Write the final model in the training's 16-bit type (as DeepSpeed's save_16bit_model does)
  // instead of the fp32 master weights.
  bool stage3_gather_16bit_weights_on_model_save = false;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
};

struct AioConfig {
  std::uint64_t block_size = 1'048'576;   // bytes per I/O request piece; multiple of 4096
  std::int64_t queue_depth = 8;           // requests in flight per ring
  std::int64_t intra_op_parallelism = 1;  // I/O threads (old name: thread_count)
  bool single_submit = false;
  bool overlap_events = true;
};

// DeepSpeed's activation_checkpointing section, read into strata.model's own switches (it is
// not printed in the effective configuration; the strata.model keys it set are).
struct DsActivationCheckpointing {
  bool cpu_checkpointing = false;  // -> strata.model.activation_offload
};

// DeepSpeed's data_types section: Strata accumulates gradients in fp32 and refuses the rest.
struct DsDataTypes {
  std::string grad_accum_dtype;  // "" or fp32 spellings; others are refused
};

// ---- Strata's own section -------------------------------------------------------------------

// A model shape in Strata's names. Filled from strata.model, or from a Hugging Face config.json
// (model/model_spec.h maps the HF names). 0 means "the family's default".
struct ModelConfig {
  std::string path;  // Hugging Face model directory or config.json; "" = use the fields below
  ModelFamily family = ModelFamily::kGpt2;
  std::int64_t vocab_size = 50257;
  std::int64_t max_seq_len = 1024;
  std::int64_t hidden_size = 768;
  std::int64_t num_layers = 12;
  std::int64_t num_heads = 12;
  std::int64_t num_kv_heads = 0;       // 0 = num_heads (no grouped KV)
  std::int64_t intermediate_size = 0;  // 0 = 4 * hidden (gpt2) or the Llama rule
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;  // llama
  // The sliding_window from config.json (Mistral, Qwen2/3, Phi-3): a query attends to itself and
  // the window - 1 tokens before it; 0 = no limit.
  std::int64_t attention_window = 0;
  bool tie_word_embeddings = true;
  ModelArch arch;  // what a config.json adds (model/model_spec.h); defaults for strata.model
  bool activation_checkpointing = false;
  bool activation_offload = false;  // keep activation checkpoints in host memory
};

struct DataConfig {
  DataSource source = DataSource::kSynthetic;
  std::string path;      // token file (.bin) or text file
  std::string val_path;  // optional separate validation file
  std::int64_t seq_len = 256;
  double val_fraction = 0.05;  // held out from `path` when val_path is empty
  bool shuffle = true;
  // Pack whole documents into windows, positions restarting at each (needs a mask file).
  bool packing = false;
  std::int64_t synthetic_vocab_size = 256;
  std::int64_t synthetic_branching = 4;  // successors per state of the synthetic Markov chain
};

// How the optimizer state is stored outside the device (strata.optimizer_state; docs/adam.md):
// the one definition in common/state_format.h, read as it is (block is the key block_size,
// grad the key gradients).
using OptimizerStateConfig = StateFormat;

struct StrataConfig {
  std::string output_dir = "strata_out";
  std::int64_t train_steps = 100;
  std::uint64_t seed = 1234;
  Backend backend = Backend::kAuto;
  GemmPrecision gemm_precision = GemmPrecision::kAuto;  // CUDA GEMM inputs; accumulation is fp32
  std::int64_t cpu_threads = 0;  // compute threads of the CPU backend; 0 = every core available
  // Threads of CPU Adam; 0 = the compute threads, less one when the optimizer state is on NVMe.
  std::int64_t optimizer_threads = 0;
  // Optimizer tiles in flight with the state on NVMe (stages of pinned buffers): read ahead,
  // Adam, write behind. 3 = read i+1 || Adam i || write i-1; 5 lets slow writes finish without
  // stalling the forward that follows the optimizer (docs/tiers.md).
  std::int64_t optimizer_pipeline_depth = 5;
  std::uint64_t device_bytes_max = 0;  // 0 = auto: GPU memory (CUDA) or 4 GiB arena (CPU)
  std::uint64_t host_bytes_max = 0;    // 0 = auto: 80% of the memory available at start-up
  std::uint64_t nvme_bytes_max = 0;    // 0 = auto: free space on the nvme_path file systems
  std::int64_t eval_every_steps = 0;   // 0 = evaluate only at the end
  std::int64_t eval_batches = 8;
  std::int64_t checkpoint_every_steps = 0;  // 0 = checkpoint only at the end
  std::string checkpoint_dir;               // "" = <output_dir>/checkpoints
  std::string resume_from;                  // checkpoint directory to resume from
  std::int64_t checkpoint_keep_last = 0;    // keep the newest N checkpoints; 0 = all
  bool overwrite_output_dir = false;        // a fresh run may replace another run's output_dir
  std::string trace_file;                   // Chrome/Perfetto trace; "" = none
  std::int64_t log_every_steps = 1;
  // Steps between progress lines on the console (and wall_clock_breakdown / memory_breakdown
  // lines); 0 = auto: about 20 lines per run, at least every 100 steps.
  std::int64_t print_every_steps = 0;
  bool nvme_checksum = true;  // verify every NVMe tile with xxHash3 on read
  // Seconds a collective may wait without progress before the run fails naming the silent rank.
  double comm_timeout_s = 300.0;
  // Let the optimizer step stream its tiles while the next step's forward runs (each unit's
  // forward waits for its own update); false finishes the optimizer before the step returns.
  bool overlap_optimizer = true;
  // With offload_optimizer none: the optimizer state on the device and Adam run there. auto = on a
  // GPU when the state fits the device budget beside the working set, else in host memory with
  // CPU Adam; on = always (an error naming the budget when it does not fit); off = host memory.
  DeviceOptimizer device_optimizer = DeviceOptimizer::kAuto;
  // strata.torch across ranks (OffloadAdamW(process_group=...)): ordered = every unit's gradients
  // gathered to its owner and summed in rank order (the bits of one rank accumulating), backend =
  // the backend's reduce (NCCL/gloo order). The CLI's ranks always sum in rank order.
  GradientSum gradient_sum = GradientSum::kOrdered;
  OptimizerStateConfig optimizer_state;
  ModelConfig model;
  DataConfig data;
};

// ---- the whole configuration ----------------------------------------------------------------

struct Config {
  // Batch sizes: after loading, all three are set and consistent with world_size.
  std::uint64_t train_batch_size = 0;
  std::uint64_t train_micro_batch_size_per_gpu = 0;
  std::uint64_t gradient_accumulation_steps = 0;
  // DeepSpeed's default since 0.19.3 (earlier versions: 0, no clipping); 0 = no clipping.
  double gradient_clipping = 1.0;
  bool wall_clock_breakdown = false;  // print the step's forward/backward/optimizer/I/O split
  bool memory_breakdown = false;      // print the tiers' bytes at every progress line
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero_optimization;
  AioConfig aio;
  DsActivationCheckpointing activation_checkpointing;
  DsDataTypes data_types;
  StrataConfig strata;

  // Derived from the settings above, filled in by the loader.
  std::int64_t world_size = 1;
  Precision precision() const {
    return fp16.enabled ? Precision::kFp16 : bf16.enabled ? Precision::kBf16 : Precision::kFp32;
  }
};

enum class Severity { kNote, kWarning };

// A message the loader wants the user to see: an old key name mapped, a key accepted with no
// effect (a warning when its value asks for something Strata does not do), a derived value.
struct Note {
  std::string path;
  std::string message;
  Severity severity = Severity::kNote;
};

// What Strata did with one key of the input, for the migration report (`config check`).
enum class KeyUse {
  kUsed,      // Strata acts on it (or its value is what Strata always does)
  kNoEffect,  // accepted; changes nothing in Strata
  kRefused,   // a feature Strata does not have that would change the arithmetic: an error
  kInvalid,   // a bad value, an unknown key: an error
};

struct KeyReport {
  std::string path;  // as written in the file (an alias or old name, not the name it maps to)
  KeyUse use = KeyUse::kUsed;
  std::string detail;  // "auto" resolution, the name it was read as, why it has no effect
  std::string origin;  // "file:LINE:COL" or the override ("--lr 2e-5", "--set a.b=1")
};

// An "auto" resolved to a value that shapes the job (learning rate, batch, precision,
// clipping, ...): printed together, loudly, before a run starts.
struct AutoChoice {
  std::string path;
  std::string value;   // as JSON text
  std::string reason;  // where the value came from, and the flag that chooses it
};

// A `strata train` flag as given on the command line (config/flags.h lists them): the flag name
// and its value ("" for switches such as --bf16).
struct FlagValue {
  std::string flag;
  std::string value;
};

enum class Purpose {
  kCheck,  // config check / estimate: a config without a model or data is fine
  kTrain,  // strata train: the config (or the flags) must name the model and the data
};

struct LoadOptions {
  LoadOptions() = default;
  explicit LoadOptions(std::int64_t world_size_in) : world_size(world_size_in) {}

  std::int64_t world_size = 1;  // data-parallel ranks; derives the batch-size triple
  Purpose purpose = Purpose::kCheck;
  std::vector<FlagValue> flags;  // applied before the --set overrides
  // What "auto" precision (fp16/bf16.enabled = "auto") means on this machine: bf16 or fp16, and
  // why. Called only when a config says "auto" there; empty = bf16 ("the CPU backend").
  std::function<std::pair<Precision, std::string>()> auto_precision;
};

struct Loaded {
  Config config;
  std::vector<Note> notes;
  std::vector<AutoChoice> autos;
  std::vector<KeyReport> keys;  // every key given, in file order, then the overrides
  // True when `path` (dotted) was given in the file or by an override.
  bool given(const std::string& path) const;
};

// Everything known about a config, valid or not: `status` is ok or the kConfig/kUsage error
// listing every problem; `loaded` holds what could be read (the key report is complete either
// way).
struct Checked {
  Status status;
  Loaded loaded;
};

// Reads a DeepSpeed-style JSON file (// and /* */ comments allowed, duplicate keys rejected),
// applies the flags and `overrides` ("dotted.key.path=VALUE", VALUE parsed as JSON, else taken
// as a string), fills in defaults, resolves "auto", validates, and derives the batch sizes.
// Errors are kConfig and name the file, line, column and key path at fault and what would be
// valid; every problem is reported at once.
Result<Loaded> load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                                const LoadOptions& options = {});

// The same from text in memory; `source_name` stands in for the file name in errors.
Result<Loaded> load_config_text(const std::string& text, const std::string& source_name,
                                const std::vector<std::string>& overrides,
                                const LoadOptions& options = {});

// The same, keeping what was learnt when the config is not valid (for `config check`).
Checked check_config_file(const std::string& path, const std::vector<std::string>& overrides,
                          const LoadOptions& options = {});
Checked check_config_text(const std::string& text, const std::string& source_name,
                          const std::vector<std::string>& overrides,
                          const LoadOptions& options = {});

// The effective configuration as pretty-printed JSON, every key with its value in effect, in
// the schema's order. Loading this text again yields the same configuration.
std::string to_json(const Config& config);

// Every leaf key path Strata acts on ("zero_optimization.offload_param.device", ...), in schema
// order: the keys of the effective configuration.
std::vector<std::string> all_key_paths();

// Every key path Strata accepts, with what it does with it: the keys above, the DeepSpeed keys
// accepted with no effect, the refused ones, and other names (aliases, old names). For the
// documentation test and for the lists of valid keys in errors.
struct AcceptedKey {
  std::string path;
  KeyUse use = KeyUse::kUsed;  // kUsed, kNoEffect or kRefused
  std::string note;            // why it has no effect / is refused, or "alias of X"
};
std::vector<AcceptedKey> accepted_keys();

}  // namespace strata::config

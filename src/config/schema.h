// The configuration schema: for each section, the list of its keys in order, each with what
// Strata does with it. Every visitor (the JSON reader, the JSON writer, the key lister) walks
// these lists, so a key exists in exactly one place. A visitor provides:
//
// Keys Strata acts on (they have a field in Config and appear in the effective configuration):
//   boolean(key, bool&)                 true/false
//   integer(key, int64&, lo, hi)        whole number in [lo, hi]
//   count(key, uint64&, lo, hi, mult)   whole number (5e8 allowed) in [lo, hi], a multiple of mult
//   bytes(key, uint64&)                 byte count: number or string with unit ("24GiB")
//   real(key, double&, lo, hi, lo_open) number in [lo, hi] ((lo, hi] when lo_open)
//   text(key, string&)                  string
//   choice(key, Enum&, names[, refused]) one of the names (case-insensitive); `refused` names
//                                       DeepSpeed values Strata refuses, each with the reason
//   paths(key, vector<string>&)         a string, a list of strings, or null
//   pair(key, array<double,2>&, lo, hi) two numbers in [lo, hi)
//   batch(key, uint64&, hi)             batch size in [1, hi]; 0 or "auto" = derive
//   section(key, S&)                    nested object, visited with visit_fields(v, S&)
//   mapped_section(key, S&)             a DeepSpeed section read into Strata's own keys; not
//                                       printed in the effective configuration
// Keys Strata accepts without acting on them, and features it refuses:
//   unused(key, Check, Unused)          value checked as DeepSpeed checks it, then reported as
//                                       having no effect (a warning when it asks for something)
//   refused(key, Check, Refuse)         an arithmetic-changing feature: an error when it is on
// Other names and the section's policy:
//   alias(name, key)                    DeepSpeed's other name for a key (populate_by_name)
//   renamed(old_key, key)               an old DeepSpeed name for a key (read with a note)
//   legacy(old_key, target)             an old switch mapped elsewhere before reading (config.cc)
//   unknown_keys(policy)                keys the section does not know: errors where DeepSpeed
//                                       refuses them (its pydantic models), warnings where it
//                                       ignores them (the top level, aio, ...)
#pragma once

#include <json/json.h>

#include <array>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/enum_names.h"

namespace strata::config {

// Upper bounds. Every whole-number key has one, chosen so that the arithmetic built on it (bytes
// of staging buffers, tokens per step, tokens seen over a run) stays far inside 64 bits.
inline constexpr std::int64_t kIntMax = std::numeric_limits<std::int64_t>::max();
inline constexpr std::uint64_t kElementsMax = std::uint64_t{1} << 50;  // element counts (1.1e15)
inline constexpr std::int64_t kStepsMax = std::int64_t{1} << 28;       // steps of a run (2.7e8)
inline constexpr std::int64_t kScheduleStepsMax = std::int64_t{1} << 40;
inline constexpr std::uint64_t kMicroBatchMax = std::uint64_t{1} << 20;
inline constexpr std::uint64_t kAccumulationMax = std::uint64_t{1} << 24;
inline constexpr std::uint64_t kTrainBatchMax = std::uint64_t{1} << 40;
inline constexpr std::uint64_t kTokensPerMicroBatchMax = std::uint64_t{1} << 28;
inline constexpr std::uint64_t kTokensPerStepMax = std::uint64_t{1} << 34;
inline constexpr double kHuge = std::numeric_limits<double>::max();

// How an accepted-but-unused key's value is checked (as DeepSpeed would check it). null passes.
struct Check {
  enum class Kind { kAny, kBoolean, kWhole, kNumber, kText };
  Kind kind = Kind::kAny;
  double lo = 0.0;
  double hi = 0.0;
  static Check any() { return {}; }
  static Check boolean() { return {Kind::kBoolean}; }
  static Check whole(double lo, double hi) { return {Kind::kWhole, lo, hi}; }
  static Check number(double lo, double hi) { return {Kind::kNumber, lo, hi}; }
  static Check text() { return {Kind::kText}; }
};

// A key Strata accepts and does not act on. A value equal to `honoured` is what Strata always does
// (reported as used); a value equal to DeepSpeed's default, "auto" or null asks for nothing
// (reported, no warning); any other value gets a warning that it has no effect, saying `why`.
struct Unused {
  const char* why;
  Json::Value ds_default = Json::Value();
  Json::Value honoured = Json::Value();
};

// A feature that changes the arithmetic, which Strata does not have: an error when it is on.
enum class RefuseWhen {
  kTrue,           // the value is true
  kPresent,        // any value but null/false/{} (a section that exists turns the feature on)
  kEnabledInside,  // an "enabled": true anywhere inside the section
  kNotBenign,      // any value but `benign`
};
struct Refuse {
  RefuseWhen when;
  const char* why;
  Json::Value benign = Json::Value();
};

enum class UnknownKeys { kError, kWarn };

template <typename V>
void visit_fields(V& v, Fp16Config& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.boolean("enabled", c.enabled);
  v.unused("auto_cast", Check::boolean(),
           {"Strata casts every op's inputs to the compute type anyway", false, true});
  v.real("loss_scale", c.loss_scale, 0.0, kHuge, false);
  v.integer("initial_scale_power", c.initial_scale_power, 0, 64);
  v.integer("loss_scale_window", c.loss_scale_window, 0, kScheduleStepsMax);
  v.integer("hysteresis", c.hysteresis, 1, std::int64_t{1} << 31);
  v.boolean("consecutive_hysteresis", c.consecutive_hysteresis);
  v.real("min_loss_scale", c.min_loss_scale, 0.0, kHuge, false);
  v.refused("fp16_master_weights_and_grads", Check::boolean(),
            {RefuseWhen::kTrue,
             "fp16 master weights and gradients change the update's arithmetic; Strata keeps "
             "them in fp32, or in bf16 with stochastic rounding when asked with "
             "strata.optimizer_state.master and .gradients \"bf16\""});
}

template <typename V>
void visit_fields(V& v, Bf16Config& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.boolean("enabled", c.enabled);
  v.unused("immediate_grad_update", Check::boolean(),
           {"Strata applies the whole update once per step", false});
  v.unused("check_grad_overflow", Check::boolean(),
           {"Strata always skips a step whose gradient is not finite", true, true});
  v.refused("bf16_master_weights_and_grads", Check::boolean(),
            {RefuseWhen::kTrue,
             "Strata's bf16 master weights and gradients round stochastically, which is not "
             "DeepSpeed's arithmetic; ask for them with strata.optimizer_state.master and "
             ".gradients \"bf16\" instead"});
  v.refused("bf16_optimizer_states", Check::boolean(),
            {RefuseWhen::kTrue,
             "Strata's bf16 Adam moments round stochastically, which is not DeepSpeed's "
             "arithmetic; ask for them with strata.optimizer_state.moments \"bf16\" instead"});
}

template <typename V>
void visit_fields(V& v, OptimizerParams& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.real("lr", c.lr, 0.0, kHuge, false);
  v.pair("betas", c.betas, 0.0, 1.0);
  v.real("eps", c.eps, 0.0, kHuge, true);
  v.real("weight_decay", c.weight_decay, 0.0, kHuge, false);
  v.boolean("bias_correction", c.bias_correction);
  v.boolean("adam_w_mode", c.adam_w_mode);
  v.unused("torch_adam", Check::boolean(),
           {"Strata always runs its own Adam kernels; the update is Adam's either way", false});
  for (const char* key : {"fused", "foreach", "capturable", "differentiable", "set_grad_none"}) {
    v.unused(key, Check::any(),
             {"a switch of PyTorch's implementation; Strata runs its own Adam kernels"});
  }
  v.refused("amsgrad", Check::boolean(),
            {RefuseWhen::kTrue,
             "AMSGrad keeps the running maximum of the second moment, which "
             "changes the update; Strata has no AMSGrad"});
  v.refused("maximize", Check::boolean(),
            {RefuseWhen::kTrue, "maximize ascends the gradient; Strata minimises the loss"});
  v.refused("fp32_optimizer_states", Check::boolean(),
            {RefuseWhen::kNotBenign,
             "DeepSpeed's 16-bit Adam moments change the update's arithmetic; Strata keeps them in "
             "fp32, or compressed when asked with strata.optimizer_state.moments \"bf16\" or "
             "\"8bit\"",
             true});
  v.legacy("max_grad_norm", "gradient_clipping");
}

template <typename V>
void visit_fields(V& v, OptimizerConfig& c) {
  v.unknown_keys(UnknownKeys::kWarn);
  v.choice("type", c.type, optimizer_type_names(), refused_optimizer_types());
  v.section("params", c.params);
  v.unused("legacy_fusion", Check::boolean(), {"Strata's Adam kernels are always fused", false});
}

template <typename V>
void visit_fields(V& v, SchedulerParams& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.real("warmup_min_lr", c.warmup_min_lr, 0.0, kHuge, false);
  v.real("warmup_max_lr", c.warmup_max_lr, 0.0, kHuge, false);
  v.integer("warmup_num_steps", c.warmup_num_steps, 0, kScheduleStepsMax);
  v.choice("warmup_type", c.warmup_type, warmup_type_names());
  v.integer("total_num_steps", c.total_num_steps, 0, kScheduleStepsMax);
  v.real("warmup_min_ratio", c.warmup_min_ratio, 0.0, 1.0, false);
  v.real("cos_min_ratio", c.cos_min_ratio, 0.0, 1.0, false);
  v.unused("last_batch_iteration", Check::whole(-1, static_cast<double>(kScheduleStepsMax)),
           {"Strata restores the schedule's position from its checkpoint", -1});
}

template <typename V>
void visit_fields(V& v, SchedulerConfig& c) {
  v.unknown_keys(UnknownKeys::kWarn);
  v.choice("type", c.type, scheduler_type_names(), refused_scheduler_types());
  v.section("params", c.params);
}

inline constexpr const char* kPinnedWhy =
    "Strata always pins its host memory, allocated once and counted against "
    "strata.host_bytes_max";

template <typename V>
void visit_fields(V& v, OffloadParamConfig& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.choice("device", c.device, offload_device_names());
  v.paths("nvme_path", c.nvme_path);
  v.unused("pin_memory", Check::boolean(), {kPinnedWhy, true, true});
  v.integer("buffer_count", c.buffer_count, 0, 1024);
  v.count("buffer_size", c.buffer_size, 0, std::uint64_t{1} << 40, 1);
  v.count("max_in_cpu", c.max_in_cpu, 0, kElementsMax, 1);
}

template <typename V>
void visit_fields(V& v, OffloadOptimizerConfig& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.choice("device", c.device, offload_device_names());
  v.paths("nvme_path", c.nvme_path);
  v.unused("pin_memory", Check::boolean(), {kPinnedWhy, true, true});
  v.unused("buffer_count", Check::whole(0, 1 << 20),
           {"Strata's optimizer pipeline holds strata.optimizer_pipeline_depth tiles", 4});
  v.unused("pipeline_read", Check::boolean(),
           {"Strata always reads the next tile while Adam updates the current one", false, true});
  v.unused(
      "pipeline_write", Check::boolean(),
      {"Strata always writes the previous tile while Adam updates the current one", false, true});
  v.unused("fast_init", Check::boolean(),
           {"Strata creates its swap files with fallocate, which is already fast", false});
  v.real("ratio", c.ratio, 0.0, 1.0, false);
  v.unused(
      "super_offload", Check::boolean(),
      {"a CPU Adam schedule for Grace-Hopper systems; Strata's update is the same Adam", false});
  v.unused("cpuadam_cores_perc", Check::number(0.0, 1.0),
           {"set Strata's CPU Adam threads with strata.optimizer_threads", 0.8});
}

inline constexpr const char* kNoBucketsWhy =
    "Strata reduces or gathers each unit (a transformer block) in one collective; it has no "
    "buckets";

template <typename V>
void visit_fields(V& v, ZeroConfig& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.integer("stage", c.stage, 0, 3);
  v.unused("contiguous_gradients", Check::boolean(),
           {"Strata always builds gradients in their final flat layout", true, true});
  v.unused("reduce_scatter", Check::boolean(),
           {"Strata reduce-scatters gradients from stage 1 on and all-reduces them at stage 0",
            true, true});
  v.unused("reduce_bucket_size", Check::whole(0, static_cast<double>(kElementsMax)),
           {kNoBucketsWhy, 5e8});
  v.unused("use_multi_rank_bucket_allreduce", Check::boolean(), {kNoBucketsWhy, true});
  v.unused("allgather_partitions", Check::boolean(),
           {"Strata gathers updated parameters with all-gathers", true, true});
  v.unused("allgather_bucket_size", Check::whole(0, static_cast<double>(kElementsMax)),
           {kNoBucketsWhy, 5e8});
  v.unused("overlap_comm", Check::boolean(),
           {"Strata schedules its collectives itself (stage-3 all-gathers are prefetched ahead "
            "of use)"});
  v.unused("load_from_fp32_weights", Check::boolean(),
           {"Strata's checkpoints always hold the fp32 master weights", true, true});
  v.unused("elastic_checkpoint", Check::boolean(), {"Strata has no elastic checkpoints", false});
  v.unused("ignore_unused_parameters", Check::boolean(),
           {"Strata's models have no unused parameters", true});
  v.unused("legacy_stage1", Check::boolean(), {"Strata has one stage-1 implementation", false});
  v.unused("round_robin_gradients", Check::boolean(),
           {"Strata already copies each unit's gradient out once, as it is finished", false});
  v.count("sub_group_size", c.sub_group_size, 0, kElementsMax, 1);
  v.count("stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size, 0, kElementsMax, 1);
  v.alias("prefetch_bucket_size", "stage3_prefetch_bucket_size");
  v.count("stage3_max_live_parameters", c.stage3_max_live_parameters, 0, kElementsMax, 1);
  v.alias("max_live_parameters", "stage3_max_live_parameters");
  v.count("stage3_max_reuse_distance", c.stage3_max_reuse_distance, 0, kElementsMax, 1);
  v.alias("max_reuse_distance", "stage3_max_reuse_distance");
  v.count("stage3_param_persistence_threshold", c.stage3_param_persistence_threshold, 0,
          kElementsMax, 1);
  v.alias("param_persistence_threshold", "stage3_param_persistence_threshold");
  v.unused("stage3_model_persistence_threshold", Check::whole(0, 9.3e18),
           {"Strata's device budget (strata.device_bytes_max) bounds what stays gathered",
            9223372036854775807.0});
  v.alias("model_persistence_threshold", "stage3_model_persistence_threshold");
  v.boolean("stage3_gather_16bit_weights_on_model_save",
            c.stage3_gather_16bit_weights_on_model_save);
  v.alias("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save");
  v.renamed("stage3_gather_fp16_weights_on_model_save",
            "stage3_gather_16bit_weights_on_model_save");
  v.renamed("gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save");
  v.unused("stage3_module_granularity_threshold", Check::whole(-9.3e18, 9.3e18),
           {"Strata fetches whole units (a transformer block each), never single modules", 0});
  v.alias("module_granularity_threshold", "stage3_module_granularity_threshold");
  v.unused("stage3_use_all_reduce_for_fetch_params", Check::boolean(),
           {"Strata gathers stage-3 shards with all-gathers", false});
  v.alias("use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params");
  v.unused("stage3_allgather_sequential", Check::boolean(),
           {"Strata gathers a whole unit in one collective", false});
  v.alias("allgather_sequential", "stage3_allgather_sequential");
  v.section("offload_param", c.offload_param);
  v.section("offload_optimizer", c.offload_optimizer);
  v.legacy("cpu_offload", "zero_optimization.offload_optimizer.device");
  v.legacy("cpu_offload_param", "zero_optimization.offload_param.device");
  v.legacy("cpu_offload_params", "zero_optimization.offload_param.device");
  v.legacy("cpu_offload_use_pin_memory", "zero_optimization.offload_optimizer.pin_memory");
  v.unused("zero_hpz_partition_size", Check::whole(0, 1 << 30),
           {"Strata has no secondary partition (ZeRO++ hpZ); stage 3 gathers from all ranks", 1});
  v.unused("mics_shard_size", Check::whole(-1, 1 << 30), {"Strata has no MiCS sub-groups", -1});
  v.unused("mics_hierarchical_params_gather", Check::boolean(),
           {"Strata has no MiCS sub-groups", false});
  v.unused("memory_efficient_linear", Check::boolean(),
           {"a PyTorch memory switch; Strata's linear layers are its own", true});
  v.unused("pipeline_loading_checkpoint", Check::boolean(),
           {"Strata has no pipeline parallelism", false});
  v.unused("override_module_apply", Check::boolean(), {"a PyTorch module hook switch", true});
  v.unused("log_trace_cache_warnings", Check::boolean(),
           {"Strata records the unit order itself (docs/tiers.md)", false});
  v.unused("enable_sanity_checks", Check::boolean(),
           {"Strata's checks are always on (STRATA_ASSERT)", false});
  v.unused("save_muon_momentum_buffer_in_memory", Check::boolean(),
           {"Strata has no Muon optimizer", false});
  v.unused("leaf_module", Check::any(),
           {"Strata fetches whole units (a transformer block each), never single modules"});
  v.unused("zeropp_loco_param", Check::any(),
           {"only used with ZeRO++ quantized gradients, which Strata refuses"});
  v.refused("zero_quantized_weights", Check::boolean(),
            {RefuseWhen::kTrue, "ZeRO++ quantized weight gathers change the arithmetic"});
  v.refused("zero_quantized_nontrainable_weights", Check::boolean(),
            {RefuseWhen::kTrue, "quantized frozen weights change the arithmetic"});
  v.refused("zero_quantized_gradients", Check::boolean(),
            {RefuseWhen::kTrue, "ZeRO++ quantized gradient reductions change the arithmetic"});
  v.refused("zenflow", Check::any(),
            {RefuseWhen::kPresent,
             "ZenFlow updates only the most important gradient columns at each step and the "
             "rest later, which changes the arithmetic"});
}

template <typename V>
void visit_fields(V& v, AioConfig& c) {
  v.unknown_keys(UnknownKeys::kWarn);
  v.count("block_size", c.block_size, 4096, std::uint64_t{1} << 30, 4096);
  v.integer("queue_depth", c.queue_depth, 1, 4096);
  v.integer("intra_op_parallelism", c.intra_op_parallelism, 1, 256);
  v.renamed("thread_count", "intra_op_parallelism");
  v.boolean("single_submit", c.single_submit);
  v.boolean("overlap_events", c.overlap_events);
  v.refused("use_gds", Check::boolean(),
            {RefuseWhen::kTrue,
             "GPUDirect Storage is not supported; Strata reads NVMe into pinned host memory"});
}

template <typename V>
void visit_fields(V& v, DsActivationCheckpointing& c) {
  v.unknown_keys(UnknownKeys::kWarn);
  v.unused("partition_activations", Check::boolean(),
           {"it splits checkpoints across model-parallel ranks; Strata has no model parallelism",
            false});
  v.boolean("cpu_checkpointing", c.cpu_checkpointing);
  v.unused("contiguous_memory_optimization", Check::boolean(),
           {"Strata's checkpoints live in buffers allocated once at start-up", false, true});
  v.unused("number_checkpoints", Check::any(), {"Strata checkpoints every block's input"});
  v.unused("synchronize_checkpoint_boundary", Check::boolean(),
           {"a CUDA synchronisation for profiling", false});
  v.unused("profile", Check::boolean(), {"use strata train --trace", false});
}

template <typename V>
void visit_fields(V& v, DsDataTypes& c) {
  v.unknown_keys(UnknownKeys::kWarn);
  v.text("grad_accum_dtype", c.grad_accum_dtype);
  v.unused("param_dtype", Check::any(),
           {"bf16.enabled and fp16.enabled choose the parameters' type"});
  v.unused("buffer_dtype", Check::any(), {"Strata's models have no buffers"});
}

template <typename V>
void visit_fields(V& v, ModelConfig& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.text("path", c.path);
  v.choice("family", c.family, model_family_names());
  v.integer("vocab_size", c.vocab_size, 1, (std::int64_t{1} << 31) - 1);
  v.integer("max_seq_len", c.max_seq_len, 1, std::int64_t{1} << 24);
  v.integer("hidden_size", c.hidden_size, 1, std::int64_t{1} << 17);
  v.integer("num_layers", c.num_layers, 1, std::int64_t{1} << 14);
  v.integer("num_heads", c.num_heads, 1, std::int64_t{1} << 14);
  v.integer("num_kv_heads", c.num_kv_heads, 0, std::int64_t{1} << 14);
  v.integer("intermediate_size", c.intermediate_size, 0, std::int64_t{1} << 20);
  v.real("norm_eps", c.norm_eps, 0.0, 1.0, true);
  v.real("rope_theta", c.rope_theta, 0.0, kHuge, true);
  v.boolean("tie_word_embeddings", c.tie_word_embeddings);
  v.boolean("activation_checkpointing", c.activation_checkpointing);
  v.boolean("activation_offload", c.activation_offload);
}

template <typename V>
void visit_fields(V& v, OptimizerStateConfig& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.choice("moments", c.moments, moment_format_names());
  v.integer("block_size", c.block, 64, 2048);
  v.choice("master", c.master, state_dtype_names());
  v.choice("gradients", c.grad, state_dtype_names());
}

template <typename V>
void visit_fields(V& v, DataConfig& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.choice("source", c.source, data_source_names());
  v.text("path", c.path);
  v.text("val_path", c.val_path);
  v.integer("seq_len", c.seq_len, 1, std::int64_t{1} << 24);
  v.real("val_fraction", c.val_fraction, 0.0, 0.5, false);
  v.boolean("shuffle", c.shuffle);
  v.boolean("packing", c.packing);
  v.integer("synthetic_vocab_size", c.synthetic_vocab_size, 2, 1 << 20);
  v.integer("synthetic_branching", c.synthetic_branching, 1, 1 << 20);
}

template <typename V>
void visit_fields(V& v, StrataConfig& c) {
  v.unknown_keys(UnknownKeys::kError);
  v.text("output_dir", c.output_dir);
  v.integer("train_steps", c.train_steps, 1, kStepsMax);
  v.count("seed", c.seed, 0, std::numeric_limits<std::uint64_t>::max(), 1);
  v.choice("backend", c.backend, backend_names());
  v.choice("gemm_precision", c.gemm_precision, gemm_precision_names());
  v.integer("cpu_threads", c.cpu_threads, 0, 4096);
  v.integer("optimizer_threads", c.optimizer_threads, 0, 4096);
  v.integer("optimizer_pipeline_depth", c.optimizer_pipeline_depth, 3, 16);
  v.bytes("device_bytes_max", c.device_bytes_max);
  v.bytes("host_bytes_max", c.host_bytes_max);
  v.bytes("nvme_bytes_max", c.nvme_bytes_max);
  v.integer("eval_every_steps", c.eval_every_steps, 0, kStepsMax);
  v.integer("eval_batches", c.eval_batches, 1, std::int64_t{1} << 20);
  v.integer("checkpoint_every_steps", c.checkpoint_every_steps, 0, kStepsMax);
  v.text("checkpoint_dir", c.checkpoint_dir);
  v.text("resume_from", c.resume_from);
  v.integer("checkpoint_keep_last", c.checkpoint_keep_last, 0, 1 << 20);
  v.boolean("overwrite_output_dir", c.overwrite_output_dir);
  v.text("trace_file", c.trace_file);
  v.integer("log_every_steps", c.log_every_steps, 1, kStepsMax);
  v.integer("print_every_steps", c.print_every_steps, 0, kStepsMax);
  v.boolean("nvme_checksum", c.nvme_checksum);
  v.real("comm_timeout_s", c.comm_timeout_s, 0.0, 86400.0, true);
  v.boolean("overlap_optimizer", c.overlap_optimizer);
  v.choice("device_optimizer", c.device_optimizer, device_optimizer_names());
  v.choice("gradient_sum", c.gradient_sum, gradient_sum_names());
  v.section("optimizer_state", c.optimizer_state);
  v.section("model", c.model);
  v.section("data", c.data);
}

// Top-level DeepSpeed sections Strata has no use for. Each is accepted; its presence gets a
// warning unless it says "enabled": false.
inline constexpr std::pair<const char*, const char*> kUnusedSections[] = {
    {"tensorboard", "Strata writes its metrics to <output_dir>/metrics.jsonl"},
    {"wandb", "Strata writes its metrics to <output_dir>/metrics.jsonl"},
    {"csv_monitor", "Strata writes its metrics to <output_dir>/metrics.jsonl"},
    {"comet", "Strata writes its metrics to <output_dir>/metrics.jsonl"},
    {"monitor_config", "Strata writes its metrics to <output_dir>/metrics.jsonl"},
    {"flops_profiler", "use strata train --trace for a timeline of the step"},
    {"comms_logger", "Strata's summary reports its collectives; --trace shows them"},
    {"comms_config", "Strata's summary reports its collectives; --trace shows them"},
    {"timers", "use wall_clock_breakdown or strata train --trace"},
    {"nebula", "Strata writes its own checkpoints (strata.checkpoint_every_steps)"},
    {"datastates", "Strata writes its own checkpoints (strata.checkpoint_every_steps)"},
    {"checkpoint", "Strata writes its own checkpoints (strata.checkpoint_every_steps)"},
    {"autotuning", "a launcher feature; strata estimate shows where each byte goes"},
    {"pipeline", "Strata has no pipeline parallelism"},
    {"hybrid_engine", "Strata has no RLHF generation engine"},
    {"compile", "Strata has no torch.compile; its kernels are compiled ahead of time"},
    {"tensor_parallel", "Strata has no tensor parallelism; each rank runs whole layers"},
    {"expert_parallel", "Strata's models have no experts"},
};

// Top-level DeepSpeed sections that change the arithmetic when on: refused then.
inline constexpr std::pair<const char*, const char*> kRefusedSections[] = {
    {"amp", "NVIDIA Apex AMP mixed precision; use fp16.enabled or bf16.enabled"},
    {"torch_autocast", "PyTorch autocast mixed precision; use bf16.enabled or fp16.enabled"},
    {"compression_training", "quantisation or pruning during training changes the arithmetic"},
    {"data_efficiency",
     "curriculum sampling and random layerwise token dropping change what "
     "the model is trained on"},
    {"curriculum_learning", "a curriculum changes the sequences the model is trained on"},
    {"progressive_layer_drop", "dropping layers changes the arithmetic"},
    {"eigenvalue", "it drives quantisation during training, which changes the arithmetic"},
    {"quantize_training", "quantisation during training changes the arithmetic"},
    {"elasticity", "elastic training changes the batch size"},
};

template <typename V>
void visit_fields(V& v, Config& c) {
  v.unknown_keys(UnknownKeys::kWarn);
  v.batch("train_batch_size", c.train_batch_size, kTrainBatchMax);
  v.batch("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, kMicroBatchMax);
  v.batch("gradient_accumulation_steps", c.gradient_accumulation_steps, kAccumulationMax);
  v.real("gradient_clipping", c.gradient_clipping, 0.0, kHuge, false);
  v.unused("steps_per_print", Check::whole(1, static_cast<double>(kIntMax)),
           {"Strata prints progress every strata.print_every_steps steps (auto: about 20 lines "
            "per run)"});
  v.boolean("wall_clock_breakdown", c.wall_clock_breakdown);
  v.boolean("memory_breakdown", c.memory_breakdown);
  v.unused("prescale_gradients", Check::boolean(),
           {"Strata averages gradients over the ranks once, in fp32: dividing before or after "
            "the reduction gives the same average",
            false});
  v.unused("gradient_predivide_factor", Check::number(0.0, kHuge),
           {"Strata averages gradients over the ranks once, in fp32: dividing before or after "
            "the reduction gives the same average",
            1.0});
  v.refused("gradient_allreduce_op", Check::text(),
            {RefuseWhen::kNotBenign,
             "'sum' leaves the gradients summed over the ranks instead of averaged, which "
             "changes the update; Strata averages (\"mean\")",
             "mean"});
  v.unused("zero_allow_untested_optimizer", Check::boolean(),
           {"Strata runs only its own Adam and AdamW", false});
  v.unused("zero_force_ds_cpu_optimizer", Check::boolean(),
           {"Strata always runs its own CPU Adam on offloaded optimizer state", true, true});
  v.unused("communication_data_type", Check::any(),
           {"Strata chooses the type of its collectives itself"});
  v.unused("seq_parallel_communication_data_type", Check::any(),
           {"Strata has no sequence parallelism"});
  v.unused("managed_gradient_accumulation", Check::boolean(),
           {"Strata's trainer runs the accumulation loop itself", true, true});
  v.unused("sparse_gradients", Check::boolean(),
           {"Strata's embedding gradients are dense; the update is the same", false});
  v.unused("disable_allgather", Check::boolean(), {"Strata gathers parameters itself", false});
  v.unused("dump_state", Check::boolean(),
           {"strata config check prints the effective configuration", false});
  v.unused("vocabulary_size", Check::any(), {"Strata takes the vocabulary from the model"});
  v.unused("dataloader_drop_last", Check::boolean(),
           {"Strata's data loader always yields full micro-batches", false});
  v.unused("log_level", Check::any(), {"Strata has no log levels; --quiet silences its notes"});
  v.unused("graph_harvesting", Check::boolean(), {"a CUDA-graph switch for PyTorch", false});
  v.unused("use_data_before_expert_parallelism", Check::boolean(),
           {"Strata's models have no experts", false});
  v.section("fp16", c.fp16);
  v.section("bf16", c.bf16);
  v.renamed("bfloat16", "bf16");
  v.section("optimizer", c.optimizer);
  v.section("scheduler", c.scheduler);
  v.section("zero_optimization", c.zero_optimization);
  v.section("aio", c.aio);
  v.mapped_section("activation_checkpointing", c.activation_checkpointing);
  v.mapped_section("data_types", c.data_types);
  v.section("strata", c.strata);
  for (const auto& [key, why] : kUnusedSections)
    v.unused(key, Check::any(), {why});
  for (const auto& [key, why] : kRefusedSections)
    v.refused(key, Check::any(), {RefuseWhen::kEnabledInside, why});
  v.refused("sparse_attention", Check::any(),
            {RefuseWhen::kPresent, "block-sparse attention changes the arithmetic"});
  v.refused("weight_quantization", Check::any(),
            {RefuseWhen::kPresent, "quantised weights change the arithmetic"});
}

}  // namespace strata::config

// The configuration schema: for each section, the list of its keys in order. Every visitor
// (the JSON reader, the JSON writer, the key lister) walks these lists, so a key exists in exactly
// one place. A visitor provides:
//   boolean(key, bool&)                 true/false
//   integer(key, int64&, lo, hi)        whole number in [lo, hi]
//   count(key, uint64&, lo, hi, mult)   whole number (5e8 allowed) in [lo, hi], a multiple of mult
//   bytes(key, uint64&)                 byte count: number or string with unit ("24GiB")
//   real(key, double&, lo, hi, lo_open) number in [lo, hi] ((lo, hi] when lo_open)
//   text(key, string&)                  string
//   choice(key, Enum&, names)           one of the names (case-insensitive)
//   paths(key, vector<string>&)         a string, a list of strings, or null
//   pair(key, array<double,2>&, lo, hi) two numbers in [lo, hi)
//   optional_boolean(key, optional<bool>&)
//   batch(key, uint64&)                 batch size; 0 or "auto" = derive
//   section(key, S&)                    nested object, visited with visit_fields(v, S&)
//   ignored(key)                        a DeepSpeed key Strata accepts but does not use
//   renamed(old_key, new_key)           an old DeepSpeed name for a key of this section
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"

namespace strata::config {

template <typename E>
using EnumNames = std::vector<std::pair<E, std::string_view>>;

inline const EnumNames<OffloadDevice>& offload_device_names() {
  static const EnumNames<OffloadDevice> names = {
      {OffloadDevice::kNone, "none"}, {OffloadDevice::kCpu, "cpu"}, {OffloadDevice::kNvme, "nvme"}};
  return names;
}
inline const EnumNames<OptimizerType>& optimizer_type_names() {
  static const EnumNames<OptimizerType> names = {{OptimizerType::kAdam, "Adam"},
                                                 {OptimizerType::kAdamW, "AdamW"}};
  return names;
}
inline const EnumNames<SchedulerType>& scheduler_type_names() {
  static const EnumNames<SchedulerType> names = {
      {SchedulerType::kNone, "none"},
      {SchedulerType::kWarmupLR, "WarmupLR"},
      {SchedulerType::kWarmupDecayLR, "WarmupDecayLR"},
      {SchedulerType::kWarmupCosineLR, "WarmupCosineLR"}};
  return names;
}
inline const EnumNames<WarmupType>& warmup_type_names() {
  static const EnumNames<WarmupType> names = {{WarmupType::kLog, "log"},
                                              {WarmupType::kLinear, "linear"}};
  return names;
}
inline const EnumNames<Backend>& backend_names() {
  static const EnumNames<Backend> names = {
      {Backend::kAuto, "auto"}, {Backend::kCpu, "cpu"}, {Backend::kCuda, "cuda"}};
  return names;
}
inline const EnumNames<GemmPrecision>& gemm_precision_names() {
  static const EnumNames<GemmPrecision> names = {{GemmPrecision::kAuto, "auto"},
                                                 {GemmPrecision::kFp32, "fp32"},
                                                 {GemmPrecision::kTf32, "tf32"},
                                                 {GemmPrecision::kBf16, "bf16"},
                                                 {GemmPrecision::kFp16, "fp16"}};
  return names;
}
inline const EnumNames<ModelFamily>& model_family_names() {
  static const EnumNames<ModelFamily> names = {{ModelFamily::kGpt2, "gpt2"},
                                               {ModelFamily::kLlama, "llama"}};
  return names;
}
inline const EnumNames<DataSource>& data_source_names() {
  static const EnumNames<DataSource> names = {{DataSource::kSynthetic, "synthetic"},
                                              {DataSource::kTokens, "tokens"},
                                              {DataSource::kText, "text"}};
  return names;
}

inline constexpr std::int64_t kIntMax = std::numeric_limits<std::int64_t>::max();
inline constexpr std::uint64_t kCountMax = std::uint64_t{1} << 62;
inline constexpr double kHuge = std::numeric_limits<double>::max();

template <typename V>
void visit_fields(V& v, Fp16Config& c) {
  v.boolean("enabled", c.enabled);
  v.boolean("auto_cast", c.auto_cast);
  v.real("loss_scale", c.loss_scale, 0.0, kHuge, false);
  v.integer("initial_scale_power", c.initial_scale_power, 0, 64);
  v.integer("loss_scale_window", c.loss_scale_window, 1, kIntMax);
  v.integer("hysteresis", c.hysteresis, 1, kIntMax);
  v.boolean("consecutive_hysteresis", c.consecutive_hysteresis);
  v.real("min_loss_scale", c.min_loss_scale, 0.0, kHuge, true);
  v.ignored("fp16_master_weights_and_grads");
}

template <typename V>
void visit_fields(V& v, Bf16Config& c) {
  v.boolean("enabled", c.enabled);
  v.ignored("immediate_grad_update");
  v.ignored("check_grad_overflow");
}

template <typename V>
void visit_fields(V& v, OptimizerParams& c) {
  v.real("lr", c.lr, 0.0, kHuge, false);
  v.pair("betas", c.betas, 0.0, 1.0);
  v.real("eps", c.eps, 0.0, kHuge, true);
  v.real("weight_decay", c.weight_decay, 0.0, kHuge, false);
  v.boolean("bias_correction", c.bias_correction);
  v.boolean("adam_w_mode", c.adam_w_mode);
  v.boolean("torch_adam", c.torch_adam);
  v.boolean("amsgrad", c.amsgrad);
  v.ignored("fused");
  v.ignored("foreach");
  v.ignored("capturable");
}

template <typename V>
void visit_fields(V& v, OptimizerConfig& c) {
  v.choice("type", c.type, optimizer_type_names());
  v.section("params", c.params);
}

template <typename V>
void visit_fields(V& v, SchedulerParams& c) {
  v.real("warmup_min_lr", c.warmup_min_lr, 0.0, kHuge, false);
  v.real("warmup_max_lr", c.warmup_max_lr, 0.0, kHuge, false);
  v.integer("warmup_num_steps", c.warmup_num_steps, 0, kIntMax);
  v.choice("warmup_type", c.warmup_type, warmup_type_names());
  v.integer("total_num_steps", c.total_num_steps, 0, kIntMax);
  v.real("warmup_min_ratio", c.warmup_min_ratio, 0.0, 1.0, false);
  v.real("cos_min_ratio", c.cos_min_ratio, 0.0, 1.0, false);
  v.ignored("last_batch_iteration");
}

template <typename V>
void visit_fields(V& v, SchedulerConfig& c) {
  v.choice("type", c.type, scheduler_type_names());
  v.section("params", c.params);
}

template <typename V>
void visit_fields(V& v, OffloadParamConfig& c) {
  v.choice("device", c.device, offload_device_names());
  v.paths("nvme_path", c.nvme_path);
  v.boolean("pin_memory", c.pin_memory);
  v.integer("buffer_count", c.buffer_count, 1, 1024);
  v.count("buffer_size", c.buffer_size, 1, kCountMax, 1);
  v.count("max_in_cpu", c.max_in_cpu, 0, kCountMax, 1);
}

template <typename V>
void visit_fields(V& v, OffloadOptimizerConfig& c) {
  v.choice("device", c.device, offload_device_names());
  v.paths("nvme_path", c.nvme_path);
  v.boolean("pin_memory", c.pin_memory);
  v.integer("buffer_count", c.buffer_count, 1, 1024);
  v.boolean("pipeline_read", c.pipeline_read);
  v.boolean("pipeline_write", c.pipeline_write);
  v.boolean("fast_init", c.fast_init);
  v.real("ratio", c.ratio, 0.0, 1.0, true);
}

template <typename V>
void visit_fields(V& v, ZeroConfig& c) {
  v.integer("stage", c.stage, 0, 3);
  v.boolean("contiguous_gradients", c.contiguous_gradients);
  v.boolean("reduce_scatter", c.reduce_scatter);
  v.count("reduce_bucket_size", c.reduce_bucket_size, 1, kCountMax, 1);
  v.boolean("allgather_partitions", c.allgather_partitions);
  v.count("allgather_bucket_size", c.allgather_bucket_size, 1, kCountMax, 1);
  v.optional_boolean("overlap_comm", c.overlap_comm);
  v.boolean("round_robin_gradients", c.round_robin_gradients);
  v.count("sub_group_size", c.sub_group_size, 1024, kCountMax, 1);
  v.count("stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size, 0, kCountMax, 1);
  v.count("stage3_max_live_parameters", c.stage3_max_live_parameters, 0, kCountMax, 1);
  v.count("stage3_max_reuse_distance", c.stage3_max_reuse_distance, 0, kCountMax, 1);
  v.count("stage3_param_persistence_threshold", c.stage3_param_persistence_threshold, 0, kCountMax,
          1);
  v.boolean("stage3_gather_16bit_weights_on_model_save",
            c.stage3_gather_16bit_weights_on_model_save);
  v.renamed("stage3_gather_fp16_weights_on_model_save",
            "stage3_gather_16bit_weights_on_model_save");
  v.section("offload_param", c.offload_param);
  v.section("offload_optimizer", c.offload_optimizer);
  for (const char* key :
       {"load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1",
        "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
        "zero_quantized_gradients", "mics_shard_size", "mics_hierarchical_params_gather",
        "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
        "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
        "log_trace_cache_warnings", "module_granularity_threshold",
        "gather_16bit_weights_on_model_save"}) {
    v.ignored(key);
  }
}

template <typename V>
void visit_fields(V& v, AioConfig& c) {
  v.count("block_size", c.block_size, 4096, std::uint64_t{1} << 30, 4096);
  v.integer("queue_depth", c.queue_depth, 1, 4096);
  v.integer("intra_op_parallelism", c.intra_op_parallelism, 1, 256);
  v.renamed("thread_count", "intra_op_parallelism");
  v.boolean("single_submit", c.single_submit);
  v.boolean("overlap_events", c.overlap_events);
  v.boolean("use_gds", c.use_gds);
}

template <typename V>
void visit_fields(V& v, ModelConfig& c) {
  v.text("path", c.path);
  v.choice("family", c.family, model_family_names());
  v.integer("vocab_size", c.vocab_size, 1, std::int64_t{1} << 31);
  v.integer("max_seq_len", c.max_seq_len, 1, std::int64_t{1} << 24);
  v.integer("hidden_size", c.hidden_size, 1, std::int64_t{1} << 20);
  v.integer("num_layers", c.num_layers, 1, 100000);
  v.integer("num_heads", c.num_heads, 1, 100000);
  v.integer("num_kv_heads", c.num_kv_heads, 0, 100000);
  v.integer("intermediate_size", c.intermediate_size, 0, std::int64_t{1} << 24);
  v.real("norm_eps", c.norm_eps, 0.0, 1.0, true);
  v.real("rope_theta", c.rope_theta, 0.0, kHuge, true);
  v.boolean("tie_word_embeddings", c.tie_word_embeddings);
  v.boolean("activation_checkpointing", c.activation_checkpointing);
  v.boolean("activation_offload", c.activation_offload);
}

template <typename V>
void visit_fields(V& v, DataConfig& c) {
  v.choice("source", c.source, data_source_names());
  v.text("path", c.path);
  v.text("val_path", c.val_path);
  v.integer("seq_len", c.seq_len, 1, std::int64_t{1} << 24);
  v.real("val_fraction", c.val_fraction, 0.0, 0.5, false);
  v.boolean("shuffle", c.shuffle);
  v.integer("synthetic_vocab_size", c.synthetic_vocab_size, 2, 1 << 20);
  v.integer("synthetic_branching", c.synthetic_branching, 1, 1 << 20);
}

template <typename V>
void visit_fields(V& v, StrataConfig& c) {
  v.text("output_dir", c.output_dir);
  v.integer("train_steps", c.train_steps, 1, kIntMax);
  v.count("seed", c.seed, 0, std::numeric_limits<std::uint64_t>::max(), 1);
  v.choice("backend", c.backend, backend_names());
  v.choice("gemm_precision", c.gemm_precision, gemm_precision_names());
  v.integer("cpu_threads", c.cpu_threads, 0, 4096);
  v.integer("optimizer_threads", c.optimizer_threads, 0, 4096);
  v.integer("optimizer_pipeline_depth", c.optimizer_pipeline_depth, 3, 16);
  v.bytes("device_bytes_max", c.device_bytes_max);
  v.bytes("host_bytes_max", c.host_bytes_max);
  v.bytes("nvme_bytes_max", c.nvme_bytes_max);
  v.integer("eval_every_steps", c.eval_every_steps, 0, kIntMax);
  v.integer("eval_batches", c.eval_batches, 1, kIntMax);
  v.integer("checkpoint_every_steps", c.checkpoint_every_steps, 0, kIntMax);
  v.text("checkpoint_dir", c.checkpoint_dir);
  v.text("resume_from", c.resume_from);
  v.integer("checkpoint_keep_last", c.checkpoint_keep_last, 0, 1 << 20);
  v.boolean("overwrite_output_dir", c.overwrite_output_dir);
  v.text("trace_file", c.trace_file);
  v.integer("log_every_steps", c.log_every_steps, 1, kIntMax);
  v.boolean("nvme_checksum", c.nvme_checksum);
  v.real("comm_timeout_s", c.comm_timeout_s, 0.0, 86400.0, true);
  v.boolean("overlap_optimizer", c.overlap_optimizer);
  v.section("model", c.model);
  v.section("data", c.data);
}

template <typename V>
void visit_fields(V& v, Config& c) {
  v.batch("train_batch_size", c.train_batch_size);
  v.batch("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu);
  v.batch("gradient_accumulation_steps", c.gradient_accumulation_steps);
  v.real("gradient_clipping", c.gradient_clipping, 0.0, kHuge, false);
  v.integer("steps_per_print", c.steps_per_print, 1, kIntMax);
  v.boolean("wall_clock_breakdown", c.wall_clock_breakdown);
  v.boolean("memory_breakdown", c.memory_breakdown);
  v.boolean("prescale_gradients", c.prescale_gradients);
  v.real("gradient_predivide_factor", c.gradient_predivide_factor, 0.0, kHuge, true);
  v.boolean("zero_allow_untested_optimizer", c.zero_allow_untested_optimizer);
  v.section("fp16", c.fp16);
  v.section("bf16", c.bf16);
  v.renamed("bfloat16", "bf16");
  v.section("optimizer", c.optimizer);
  v.section("scheduler", c.scheduler);
  v.section("zero_optimization", c.zero_optimization);
  v.section("aio", c.aio);
  v.section("strata", c.strata);
  for (const char* key : {"tensorboard",
                          "wandb",
                          "csv_monitor",
                          "comet",
                          "flops_profiler",
                          "comms_logger",
                          "activation_checkpointing",
                          "data_efficiency",
                          "curriculum_learning",
                          "compression_training",
                          "elasticity",
                          "autotuning",
                          "amp",
                          "sparse_attention",
                          "pipeline",
                          "checkpoint",
                          "data_types",
                          "dump_state",
                          "zero_force_ds_cpu_optimizer",
                          "communication_data_type",
                          "seq_parallel_communication_data_type",
                          "sparse_gradients",
                          "timers",
                          "nebula",
                          "compile",
                          "weight_quantization",
                          "hybrid_engine",
                          "eigenvalue",
                          "progressive_layer_drop",
                          "quantize_training",
                          "disable_allgather",
                          "fp32_allreduce",
                          "gradient_accumulation_dtype",
                          "use_node_local_storage",
                          "load_universal_checkpoint",
                          "graph_harvesting",
                          "monitor_config"}) {
    v.ignored(key);
  }
}

}  // namespace strata::config

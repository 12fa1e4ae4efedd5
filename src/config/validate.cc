// "auto" resolution and the checks that span several keys (see validate.h).
#include "config/validate.h"

#include <fmt/format.h>

#include <algorithm>

#include "config/render.h"
#include "config/schema.h"

namespace strata::config {
namespace {

using u128 = unsigned __int128;

// "auto" values that stand for a Hugging Face TrainingArguments value: resolved as the Trainer
// resolves them with its default arguments, the flag that chooses each named.
struct TrainerAuto {
  const char* path;
  const char* reason;
};
constexpr TrainerAuto kTrainerAutos[] = {
    {"optimizer.params.lr", "the Hugging Face Trainer's default learning_rate; --lr chooses"},
    {"optimizer.params.betas", "the Hugging Face Trainer's default adam_beta1, adam_beta2"},
    {"optimizer.params.eps", "the Hugging Face Trainer's default adam_epsilon"},
    {"optimizer.params.weight_decay",
     "the Hugging Face Trainer's default weight_decay; --weight-decay chooses"},
    {"gradient_clipping",
     "the Hugging Face Trainer's default max_grad_norm; --max-grad-norm "
     "chooses"},
    {"scheduler.params.warmup_min_lr", "the Hugging Face Trainer's value"},
    {"scheduler.params.warmup_max_lr",
     "the optimizer's learning rate, as the Hugging Face "
     "Trainer sets it"},
    {"scheduler.params.warmup_num_steps",
     "the Hugging Face Trainer's default warmup_steps; --warmup-steps chooses"},
    {"scheduler.params.total_num_steps", "strata.train_steps; --steps chooses"},
};

// "auto" values the Hugging Face Trainer derives from the model's hidden size; Strata keeps
// DeepSpeed's default (what DeepSpeed itself does with "auto").
bool model_sized(const std::string& path) {
  return path == "zero_optimization.stage3_prefetch_bucket_size" ||
         path == "zero_optimization.stage3_param_persistence_threshold";
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool LoadContext::given(const std::string& path) const {
  return loaded.given(path);
}

bool LoadContext::any_invalid(std::initializer_list<const char*> paths) const {
  for (const char* p : paths) {
    if (out.invalid.count(p) != 0) return true;
  }
  return false;
}

void LoadContext::error(const std::string& path, const std::string& message) {
  // The value's place in the file (or the override that set it), else the file's name.
  const Json::Value* node = &source.root();
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->isObject() || !node->isMember(key)) {
      node = nullptr;
      break;
    }
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const std::string where = source.locate(node != nullptr ? *node : Json::Value(), path);
  out.errors.push_back(where + ": " + path + ": " + message);
  out.invalid.insert(path);
}

void LoadContext::note(const std::string& path, const std::string& message, Severity severity) {
  out.notes.push_back({path, message, severity});
}

void LoadContext::resolved(const std::string& path, const std::string& value,
                           const std::string& reason, bool loud) {
  for (KeyReport& key : loaded.keys) {
    if (key.path == path && key.detail == "\"auto\"") {
      key.detail = "\"auto\" -> " + value + " (" + reason + ")";
    }
  }
  if (loud) {
    loaded.autos.push_back({path, value, reason});
  } else {
    note(path, "\"auto\" -> " + value + " (" + reason + ")");
  }
}

void resolve_autos(LoadContext& ctx) {
  Config& c = ctx.loaded.config;
  const std::set<std::string>& autos = ctx.out.autos;
  auto is_auto = [&](const char* path) { return autos.count(path) != 0; };

  // Precision: "auto" means the mixed precision this machine runs best, unless the other
  // switch is on explicitly.
  const bool fp16_auto = is_auto("fp16.enabled");
  const bool bf16_auto = is_auto("bf16.enabled");
  if (fp16_auto || bf16_auto) {
    const bool explicit_fp16 = !fp16_auto && c.fp16.enabled;
    const bool explicit_bf16 = !bf16_auto && c.bf16.enabled;
    if (explicit_fp16 || explicit_bf16) {
      const char* other = explicit_fp16 ? "fp16.enabled" : "bf16.enabled";
      if (fp16_auto) ctx.resolved("fp16.enabled", "false", std::string(other) + " is true", false);
      if (bf16_auto) ctx.resolved("bf16.enabled", "false", std::string(other) + " is true", false);
    } else {
      std::pair<Precision, std::string> choice = {
          Precision::kBf16, "the CPU backend: bf16 halves memory and needs no loss scaling"};
      if (ctx.options.auto_precision) choice = ctx.options.auto_precision();
      c.fp16.enabled = choice.first == Precision::kFp16;
      c.bf16.enabled = choice.first == Precision::kBf16;
      const std::string reason = choice.second + "; --bf16, --fp16 or --fp32 chooses";
      if (fp16_auto) ctx.resolved("fp16.enabled", render(c.fp16.enabled), reason, false);
      if (bf16_auto) ctx.resolved("bf16.enabled", render(c.bf16.enabled), reason, false);
      ctx.loaded.autos.push_back({"precision", to_string(c.precision()), reason});
    }
  }

  for (const TrainerAuto& rule : kTrainerAutos) {
    if (!is_auto(rule.path)) continue;
    const std::string path = rule.path;
    if (path == "optimizer.params.lr") c.optimizer.params.lr = 5e-5;
    if (path == "optimizer.params.betas") c.optimizer.params.betas = {0.9, 0.999};
    if (path == "optimizer.params.eps") c.optimizer.params.eps = 1e-8;
    if (path == "optimizer.params.weight_decay") c.optimizer.params.weight_decay = 0.0;
    if (path == "gradient_clipping") c.gradient_clipping = 1.0;
    if (path == "scheduler.params.warmup_min_lr") c.scheduler.params.warmup_min_lr = 0.0;
    if (path == "scheduler.params.warmup_max_lr") {
      c.scheduler.params.warmup_max_lr = c.optimizer.params.lr;
    }
    if (path == "scheduler.params.warmup_num_steps") c.scheduler.params.warmup_num_steps = 0;
    if (path == "scheduler.params.total_num_steps") {
      c.scheduler.params.total_num_steps = c.strata.train_steps;
    }
    ctx.resolved(path, render_path(c, path), rule.reason, true);
  }

  // Every other "auto": the default on docs/config.md (DeepSpeed's, unless Strata's differs).
  for (const std::string& path : autos) {
    if (path == "fp16.enabled" || path == "bf16.enabled" || path == "train_batch_size" ||
        path == "train_micro_batch_size_per_gpu" || path == "gradient_accumulation_steps") {
      continue;
    }
    bool trainer = false;
    for (const TrainerAuto& rule : kTrainerAutos)
      trainer = trainer || path == rule.path;
    if (trainer) continue;
    const std::string value = render_path(c, path);
    if (value.empty()) continue;  // an enum without "auto" read as its default, say
    ctx.resolved(path, value,
                 model_sized(path) ? "DeepSpeed's default; the Hugging Face Trainer would derive "
                                     "it from the model's hidden size"
                                   : "the default",
                 false);
  }
}

namespace {

// DeepSpeed's rule: train_batch_size = micro_batch_per_gpu * gradient_accumulation * world.
// Any two (or one, with defaults) determine the rest; all three must agree. Products are taken
// in 128 bits: the bounds keep each factor small, the check keeps their product small too.
void derive_batch_sizes(LoadContext& ctx) {
  Config& c = ctx.loaded.config;
  if (ctx.any_invalid(
          {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})) {
    return;
  }
  std::uint64_t& t = c.train_batch_size;
  std::uint64_t& m = c.train_micro_batch_size_per_gpu;
  std::uint64_t& g = c.gradient_accumulation_steps;
  const auto w = static_cast<std::uint64_t>(c.world_size);
  const bool micro_auto = ctx.out.autos.count("train_micro_batch_size_per_gpu") != 0;
  auto divides = [&](std::uint64_t total, u128 part, const char* derived,
                     const std::string& formula) -> bool {
    if (part == 0 || total % part != 0 || total / part == 0) {
      ctx.error("train_batch_size",
                fmt::format("{} is not a whole multiple of {} = {}, so {} cannot be derived; "
                            "make train_batch_size a multiple of {}",
                            t, formula, static_cast<std::uint64_t>(part), derived,
                            static_cast<std::uint64_t>(part)));
      return false;
    }
    return true;
  };
  bool micro_default = false;
  if (t && m && g) {
    if (u128{t} != u128{m} * g * w) {
      ctx.error("train_batch_size",
                fmt::format("{} does not equal train_micro_batch_size_per_gpu ({}) × "
                            "gradient_accumulation_steps ({}) × world size ({}) = {}",
                            t, m, g, w, static_cast<std::uint64_t>(u128{m} * g * w)));
      return;
    }
  } else if (t && m) {
    if (!divides(t, u128{m} * w, "gradient_accumulation_steps",
                 fmt::format("train_micro_batch_size_per_gpu ({}) × world size ({})", m, w))) {
      return;
    }
    g = t / (m * w);
  } else if (t && g) {
    if (!divides(t, u128{g} * w, "train_micro_batch_size_per_gpu",
                 fmt::format("gradient_accumulation_steps ({}) × world size ({})", g, w))) {
      return;
    }
    m = t / (g * w);
  } else if (m && g) {
    t = static_cast<std::uint64_t>(u128{m} * g * w);
  } else if (t) {
    g = 1;
    if (!divides(t, w, "train_micro_batch_size_per_gpu", fmt::format("world size ({})", w))) {
      return;
    }
    m = t / w;
  } else if (m) {
    g = 1;
    t = m * w;
  } else {
    // Nothing to derive the micro-batch from: "auto" takes the Trainer's default; a config
    // without batch sizes (which DeepSpeed refuses) gets 1.
    if (!g) g = 1;
    m = micro_auto ? 8 : 1;
    micro_default = true;
    t = static_cast<std::uint64_t>(u128{m} * g * w);
    if (!micro_auto) {
      ctx.note("train_micro_batch_size_per_gpu",
               "neither train_batch_size nor train_micro_batch_size_per_gpu is set; Strata uses a "
               "micro-batch of 1 per rank (--micro-batch-size chooses)",
               Severity::kWarning);
    }
  }
  for (const char* path :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    if (ctx.out.autos.count(path) == 0) continue;
    const std::string p = path;
    std::string reason =
        fmt::format("derived: train_batch_size = micro-batch × accumulation × world size {}", w);
    if (p == "train_micro_batch_size_per_gpu" && micro_default) {
      reason =
          "the Hugging Face Trainer's default per_device_train_batch_size; --micro-batch-size "
          "chooses";
    } else if (p == "gradient_accumulation_steps") {
      reason += "; --grad-accum chooses";
    }
    ctx.resolved(p, render_path(c, p), reason, true);
  }
  // Tokens per micro-batch and per step: the buffers and counters built on them stay small.
  const u128 micro_tokens = u128{m} * static_cast<std::uint64_t>(c.strata.data.seq_len);
  if (micro_tokens > kTokensPerMicroBatchMax) {
    ctx.error("train_micro_batch_size_per_gpu",
              fmt::format("{} samples × strata.data.seq_len {} = {} tokens per micro-batch; valid: "
                          "at most {} tokens",
                          m, c.strata.data.seq_len, static_cast<std::uint64_t>(micro_tokens),
                          kTokensPerMicroBatchMax));
  } else if (micro_tokens * g * w > kTokensPerStepMax) {
    ctx.error("gradient_accumulation_steps",
              fmt::format("{} tokens per micro-batch × {} accumulation steps × world size {} is "
                          "more than {} tokens per step",
                          static_cast<std::uint64_t>(micro_tokens), g, w, kTokensPerStepMax));
  }
}

// Keys Strata acts on in general but not in this configuration (the loss-scale settings when
// fp16 is off, stage-3 settings at stage 2, ...): reported as having no effect, without a
// warning, so the migration report does not claim more than happens.
void mark_inert_keys(LoadContext& ctx) {
  const Config& c = ctx.loaded.config;
  const ZeroConfig& z = c.zero_optimization;
  const bool nvme = z.offload_param.device == OffloadDevice::kNvme ||
                    z.offload_optimizer.device == OffloadDevice::kNvme;
  const SchedulerType type = c.scheduler.type;
  struct Rule {
    const char* prefix;  // a key path, or a section ending in '.'
    bool inert;
    const char* why;
  };
  const Rule rules[] = {
      {"fp16.", !c.fp16.enabled, "fp16 is off"},
      {"zero_optimization.stage3_", z.stage != 3, "only at ZeRO stage 3"},
      {"zero_optimization.offload_param.", z.offload_param.device == OffloadDevice::kNone,
       "parameters are not offloaded"},
      {"zero_optimization.offload_param.nvme_path", z.offload_param.device != OffloadDevice::kNvme,
       "only with device \"nvme\""},
      {"zero_optimization.offload_param.buffer_", z.offload_param.device != OffloadDevice::kNvme,
       "only with device \"nvme\""},
      {"zero_optimization.offload_param.max_in_cpu", z.offload_param.device != OffloadDevice::kNvme,
       "only with device \"nvme\""},
      {"zero_optimization.offload_optimizer.nvme_path",
       z.offload_optimizer.device != OffloadDevice::kNvme, "only with device \"nvme\""},
      {"zero_optimization.offload_optimizer.ratio",
       z.offload_optimizer.device != OffloadDevice::kNvme, "only with device \"nvme\""},
      {"aio.", !nvme, "nothing is offloaded to NVMe"},
      {"scheduler.params.", type == SchedulerType::kNone, "no scheduler.type"},
      {"scheduler.params.warmup_min_lr", type == SchedulerType::kWarmupCosineLR,
       "WarmupCosineLR scales optimizer.params.lr instead"},
      {"scheduler.params.warmup_max_lr", type == SchedulerType::kWarmupCosineLR,
       "WarmupCosineLR scales optimizer.params.lr instead"},
      {"scheduler.params.total_num_steps", type == SchedulerType::kWarmupLR,
       "WarmupLR does not decay"},
      {"scheduler.params.warmup_min_ratio", type != SchedulerType::kWarmupCosineLR,
       "only for WarmupCosineLR"},
      {"scheduler.params.cos_min_ratio", type != SchedulerType::kWarmupCosineLR,
       "only for WarmupCosineLR"},
  };
  for (KeyReport& key : ctx.loaded.keys) {
    if (key.use != KeyUse::kUsed) continue;
    // An alias or old name is judged by the key it was read as.
    std::string path = key.path;
    if (key.detail.rfind("read as ", 0) == 0) {
      path = key.detail.substr(8, key.detail.find(';') - 8);
    }
    for (const Rule& rule : rules) {
      if (!rule.inert || path.rfind(rule.prefix, 0) != 0 || path == "fp16.enabled") {
        continue;
      }
      key.use = KeyUse::kNoEffect;
      key.detail = std::string("in this configuration: ") + rule.why +
                   (key.detail.empty() ? "" : "; " + key.detail);
      break;
    }
  }
}

}  // namespace

void validate(LoadContext& ctx) {
  Config& c = ctx.loaded.config;
  ZeroConfig& z = c.zero_optimization;
  auto error = [&](std::initializer_list<const char*> involved, const std::string& path,
                   const std::string& message) {
    if (ctx.any_invalid(involved)) return;
    ctx.error(path, message);
  };

  if (c.fp16.enabled && c.bf16.enabled) {
    error({"fp16.enabled", "bf16.enabled"}, "bf16.enabled",
          "fp16 and bf16 are both enabled; enable at most one of fp16.enabled and bf16.enabled");
  }
  if (c.fp16.enabled && c.fp16.loss_scale == 0.0) {
    // DeepSpeed's checks for dynamic loss scaling (0 would divide by zero or never recover).
    if (c.fp16.loss_scale_window < 1) {
      error({"fp16.loss_scale_window"}, "fp16.loss_scale_window",
            "must be at least 1 with dynamic loss scaling (fp16.loss_scale = 0)");
    }
    if (c.fp16.min_loss_scale <= 0.0) {
      error({"fp16.min_loss_scale"}, "fp16.min_loss_scale",
            "must be greater than 0 with dynamic loss scaling (fp16.loss_scale = 0)");
    }
  }
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
    error({"zero_optimization.stage", "zero_optimization.offload_param.device"},
          "zero_optimization.offload_param.device",
          fmt::format("offloading parameters needs ZeRO stage 3, but zero_optimization.stage is "
                      "{}; set stage to 3 or offload_param.device to \"none\"",
                      z.stage));
  }
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0) {
    error({"zero_optimization.stage", "zero_optimization.offload_optimizer.device"},
          "zero_optimization.offload_optimizer.device",
          "offloading the optimizer needs ZeRO stage 1, 2 or 3, but zero_optimization.stage is 0");
  }
  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.nvme_path.empty()) {
    error({"zero_optimization.offload_param.nvme_path"},
          "zero_optimization.offload_param.nvme_path",
          "device is \"nvme\" but no nvme_path is set; give a directory on the NVMe drive");
  }
  if (z.offload_optimizer.device == OffloadDevice::kNvme && z.offload_optimizer.nvme_path.empty()) {
    error({"zero_optimization.offload_optimizer.nvme_path"},
          "zero_optimization.offload_optimizer.nvme_path",
          "device is \"nvme\" but no nvme_path is set; give a directory on the NVMe drive");
  }
  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.buffer_count == 0) {
    error({"zero_optimization.offload_param.buffer_count"},
          "zero_optimization.offload_param.buffer_count",
          "0 staging buffers cannot read parameters from NVMe; valid: 1 to 1024");
  }
  if (z.offload_optimizer.ratio < 1.0 && z.offload_optimizer.device == OffloadDevice::kNone) {
    error({"zero_optimization.offload_optimizer.ratio"},
          "zero_optimization.offload_optimizer.ratio",
          "a ratio below 1 splits offloaded optimizer state, but offload_optimizer.device is "
          "\"none\"");
  }
  if (z.sub_group_size == 0) {
    // DeepSpeed would give every parameter tensor its own sub-group; Strata's tiles cut flat
    // units, so 0 means its default tile.
    z.sub_group_size = ZeroConfig{}.sub_group_size;
    ctx.note("zero_optimization.sub_group_size",
             fmt::format("0: Strata's tiles are slices of flat units, so it uses its default tile "
                         "of {} elements",
                         z.sub_group_size));
  }
  const std::string& accum = c.data_types.grad_accum_dtype;
  if (!accum.empty() && accum != "fp32" && accum != "float32" && accum != "torch.float32" &&
      accum != "float") {
    error({"data_types.grad_accum_dtype"}, "data_types.grad_accum_dtype",
          fmt::format("'{}' is not supported by Strata: gradients accumulate in fp32, and "
                      "accumulating in 16 bits changes the arithmetic; set it to \"fp32\" or "
                      "remove it",
                      accum));
  }

  // DeepSpeed's activation_checkpointing section: Strata's own activation checkpointing, unless
  // strata.model says otherwise.
  const Json::Value& root = ctx.source.root();
  if (root.isMember("activation_checkpointing") && root["activation_checkpointing"].isObject()) {
    StrataConfig& s = c.strata;
    if (!ctx.given("strata.model.activation_checkpointing")) {
      s.model.activation_checkpointing = true;
      ctx.note("activation_checkpointing",
               "read as strata.model.activation_checkpointing = true (each block is recomputed "
               "in backward from its saved input; the arithmetic is the same)");
    }
    if (c.activation_checkpointing.cpu_checkpointing &&
        !ctx.given("strata.model.activation_offload")) {
      s.model.activation_offload = s.model.activation_checkpointing;
      ctx.note("activation_checkpointing.cpu_checkpointing",
               "read as strata.model.activation_offload = " + render(s.model.activation_offload));
    }
  }

  SchedulerConfig& s = c.scheduler;
  if (s.type == SchedulerType::kNone && ctx.given("scheduler.params")) {
    ctx.note("scheduler.params",
             "scheduler.type is not set, so the learning rate is constant "
             "and the scheduler's parameters have no effect",
             Severity::kWarning);
  }
  if (s.type == SchedulerType::kWarmupDecayLR || s.type == SchedulerType::kWarmupCosineLR) {
    if (s.params.total_num_steps == 0) {
      s.params.total_num_steps = c.strata.train_steps;
      if (!ctx.out.autos.count("scheduler.params.total_num_steps")) {
        ctx.note("scheduler.params.total_num_steps",
                 fmt::format("not set; taken from strata.train_steps = {}", c.strata.train_steps));
      }
    }
  }
  if (s.type != SchedulerType::kNone &&
      !ctx.any_invalid({"scheduler.params.warmup_num_steps", "strata.train_steps"})) {
    // As in DeepSpeed, a warm-up longer than the run is allowed (the rate is still rising when it
    // ends): shortening strata.train_steps for a quick try must not need a scheduler edit.
    const std::int64_t horizon = s.type == SchedulerType::kWarmupLR
                                     ? c.strata.train_steps
                                     : std::min(c.strata.train_steps, s.params.total_num_steps);
    if (s.params.warmup_num_steps > horizon) {
      ctx.note("scheduler.params.warmup_num_steps",
               fmt::format("{} warm-up steps are more than the {} steps {}; the learning rate will "
                           "still be warming up when {}",
                           s.params.warmup_num_steps, horizon,
                           horizon == c.strata.train_steps ? "of the run (strata.train_steps)"
                                                           : "of the schedule (total_num_steps)",
                           horizon == c.strata.train_steps ? "the run ends" : "the decay starts"),
               Severity::kWarning);
    }
  }
  if (s.type == SchedulerType::kWarmupLR || s.type == SchedulerType::kWarmupDecayLR) {
    if (s.params.warmup_min_lr > s.params.warmup_max_lr) {
      error({"scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr"},
            "scheduler.params.warmup_min_lr",
            fmt::format("{} is above warmup_max_lr ({})", s.params.warmup_min_lr,
                        s.params.warmup_max_lr));
    }
  }

  const ModelConfig& model = c.strata.model;
  if (model.path.empty()) {
    if (model.hidden_size % model.num_heads != 0) {
      error({"strata.model.hidden_size", "strata.model.num_heads"}, "strata.model.num_heads",
            fmt::format("{} heads do not divide hidden_size {}; valid: a divisor of {}",
                        model.num_heads, model.hidden_size, model.hidden_size));
    }
    if (model.num_kv_heads != 0 && model.num_heads % model.num_kv_heads != 0) {
      error({"strata.model.num_heads", "strata.model.num_kv_heads"}, "strata.model.num_kv_heads",
            fmt::format("{} KV heads do not divide num_heads {}; valid: a divisor of {}",
                        model.num_kv_heads, model.num_heads, model.num_heads));
    }
    if (c.strata.data.seq_len > model.max_seq_len) {
      error({"strata.data.seq_len", "strata.model.max_seq_len"}, "strata.data.seq_len",
            fmt::format("{} is longer than the model's max_seq_len ({})", c.strata.data.seq_len,
                        model.max_seq_len));
    }
  }
  DataConfig& data = c.strata.data;
  if (!data.path.empty() && !ctx.given("strata.data.source") &&
      !ctx.any_invalid({"strata.data.path"})) {
    // A data file named without a source (--data FILE): the extension says which.
    data.source = ends_with(data.path, ".bin") ? DataSource::kTokens : DataSource::kText;
    ctx.note("strata.data.source",
             fmt::format("not set; \"{}\" from the file name {} (.bin: tokens, else text)",
                         data.source == DataSource::kTokens ? "tokens" : "text", data.path));
  }
  if (data.source == DataSource::kSynthetic && !data.path.empty()) {
    ctx.note("strata.data.path", "has no effect: strata.data.source is \"synthetic\"",
             Severity::kWarning);
  }
  if (data.source != DataSource::kSynthetic && data.path.empty()) {
    error({"strata.data.source"}, "strata.data.path",
          "required when strata.data.source is \"tokens\" or \"text\"");
  }
  if (data.packing && data.source != DataSource::kTokens) {
    error({"strata.data.packing", "strata.data.source"}, "strata.data.packing",
          "packs documents, whose starts a token file's mask file records, so it needs "
          "strata.data.source \"tokens\"");
  }
  if (data.source == DataSource::kSynthetic &&
      u128(data.synthetic_vocab_size) * static_cast<std::uint64_t>(data.synthetic_branching) >
          (u128{1} << 24)) {
    error({"strata.data.synthetic_vocab_size", "strata.data.synthetic_branching"},
          "strata.data.synthetic_branching",
          fmt::format(
              "{} successors for each of {} states make a table of {} entries; valid: a "
              "vocabulary × branching of at most {}",
              data.synthetic_branching, data.synthetic_vocab_size,
              static_cast<std::uint64_t>(u128(data.synthetic_vocab_size) *
                                         static_cast<std::uint64_t>(data.synthetic_branching)),
              1 << 24));
  }
  if (model.activation_offload && !model.activation_checkpointing) {
    error({"strata.model.activation_offload"}, "strata.model.activation_offload",
          "moves activation checkpoints to the host, so it needs "
          "strata.model.activation_checkpointing = true");
  }
  const OptimizerStateConfig& state = c.strata.optimizer_state;
  if ((state.block & (state.block - 1)) != 0) {
    error({"strata.optimizer_state.block_size"}, "strata.optimizer_state.block_size",
          fmt::format("{} is not a power of two; valid: 64, 128, 256, 512, 1024 or 2048",
                      state.block));
  }
  const bool compressed = state.compressed();
  if (compressed && c.strata.device_optimizer == DeviceOptimizer::kOn &&
      c.zero_optimization.offload_optimizer.device == OffloadDevice::kNone) {
    error({"strata.optimizer_state", "strata.device_optimizer"}, "strata.optimizer_state",
          "compressed optimizer state is kept and updated by CPU Adam in host memory or on NVMe; "
          "with strata.device_optimizer \"on\" it would live on the device, where AdamW runs on "
          "fp32 state; set strata.device_optimizer to \"auto\" or \"off\", or "
          "offload_optimizer.device to \"cpu\" or \"nvme\"");
  }

  derive_batch_sizes(ctx);
  mark_inert_keys(ctx);
}

void check_named_model_and_data(LoadContext& ctx) {
  const Config& c = ctx.loaded.config;
  bool model_named = !c.strata.model.path.empty();
  for (const char* key : {"family", "vocab_size", "max_seq_len", "hidden_size", "num_layers",
                          "num_heads", "num_kv_heads", "intermediate_size"}) {
    model_named = model_named || ctx.given(std::string("strata.model.") + key);
  }
  const bool data_named = !c.strata.data.path.empty() || ctx.given("strata.data.source");
  if (model_named && data_named) return;
  std::string missing = !model_named && !data_named ? "neither a model nor data"
                        : !model_named              ? "no model"
                                                    : "no data";
  if (ctx.options.purpose != Purpose::kTrain) {
    ctx.note("strata", fmt::format("the config names {}: strata train will ask for {}{}{}", missing,
                                   !model_named ? "--model DIR" : "",
                                   !model_named && !data_named ? " and " : "",
                                   !data_named ? "--data FILE" : ""));
    return;
  }
  ctx.out.errors.push_back(fmt::format(
      "{}: strata train: the config names {}, so it would train {}; give {}{}{} (or name them in "
      "the config's strata section: strata.model.path, strata.data.path; the synthetic source "
      "is used only when asked for, with strata.data.source = \"synthetic\")",
      ctx.source.name(), missing,
      !model_named ? "the default 124M GPT-2 from random weights" : "on the synthetic source",
      !model_named ? "--model DIR (a Hugging Face model directory)" : "",
      !model_named && !data_named ? " and " : "",
      !data_named ? "--data FILE (a token .bin file or a text file)" : ""));
}

}  // namespace strata::config

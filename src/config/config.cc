// Loading a configuration: parse, override, read through the schema, then the checks that span
// several keys (precision, offload vs stage, NVMe paths, batch-size arithmetic).
#include "config/config.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config/json_source.h"
#include "config/reader.h"
#include "config/schema.h"

namespace strata::config {
namespace {

// The location of the value at a dotted path, or the file name when the key is absent.
std::string locate_path(const JsonSource& source, const std::string& path) {
  const Json::Value* node = &source.root();
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t dot = path.find('.', start);
    std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->isObject() || !node->isMember(key)) return source.locate(Json::Value(), path);
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return source.locate(*node, path);
}

// DeepSpeed's pre-0.3.16 offload switches inside zero_optimization, mapped to today's sections.
void map_legacy_offload(JsonSource& source, std::vector<std::string>* errors,
                        std::vector<Note>* notes) {
  Json::Value& root = source.root();
  if (!root.isMember("zero_optimization") || !root["zero_optimization"].isObject()) return;
  Json::Value& zero = root["zero_optimization"];
  struct Legacy {
    const char* key;
    const char* section;
    const char* field;
  };
  for (const Legacy& legacy :
       {Legacy{"cpu_offload", "offload_optimizer", "device"},
        Legacy{"cpu_offload_params", "offload_param", "device"},
        Legacy{"cpu_offload_use_pin_memory", "offload_optimizer", "pin_memory"}}) {
    if (!zero.isMember(legacy.key)) continue;
    std::string path = std::string("zero_optimization.") + legacy.key;
    const Json::Value& value = zero[legacy.key];
    if (!value.isBool()) {
      errors->push_back(source.locate(value, path) + ": " + path + ": expected true or false");
      zero.removeMember(legacy.key);
      continue;
    }
    std::string target = std::string("zero_optimization.") + legacy.section + "." + legacy.field;
    if (zero.isMember(legacy.section) && zero[legacy.section].isObject() &&
        zero[legacy.section].isMember(legacy.field)) {
      errors->push_back(source.locate(value, path) + ": " + path + ": an old switch for '" +
                        target + "', which is also set; keep only '" + target + "'");
      zero.removeMember(legacy.key);
      continue;
    }
    bool on = value.asBool();
    Json::Value mapped =
        std::string(legacy.field) == "device" ? Json::Value(on ? "cpu" : "none") : Json::Value(on);
    if (!zero.isMember(legacy.section) || !zero[legacy.section].isObject()) {
      zero[legacy.section] = Json::Value(Json::objectValue);
    }
    zero[legacy.section][legacy.field] = mapped;
    notes->push_back({path, "old DeepSpeed switch; read as " + target + " = " +
                                (mapped.isBool() ? (on ? "true" : "false") : mapped.asString())});
    zero.removeMember(legacy.key);
  }
}

// DeepSpeed's rule: train_batch_size = micro_batch_per_gpu * gradient_accumulation * world.
// Any two (or one, with defaults) determine the rest; all three must agree.
void derive_batch_sizes(Config& c, const JsonSource& source, std::vector<std::string>* errors,
                        std::vector<Note>* notes) {
  std::uint64_t& t = c.train_batch_size;
  std::uint64_t& m = c.train_micro_batch_size_per_gpu;
  std::uint64_t& g = c.gradient_accumulation_steps;
  const auto w = static_cast<std::uint64_t>(c.world_size);
  auto error = [&](const std::string& key, const std::string& message) {
    errors->push_back(locate_path(source, key) + ": " + key + ": " + message);
  };
  auto divides = [&](std::uint64_t total, std::uint64_t part, const char* derived,
                     const std::string& formula) -> bool {
    if (part == 0 || total % part != 0 || total / part == 0) {
      error("train_batch_size",
            fmt::format("{} is not a whole multiple of {} = {}, so {} cannot be derived; make "
                        "train_batch_size a multiple of {}",
                        t, formula, part, derived, part));
      return false;
    }
    return true;
  };
  if (t && m && g) {
    if (t != m * g * w) {
      error("train_batch_size",
            fmt::format("{} does not equal train_micro_batch_size_per_gpu ({}) × "
                        "gradient_accumulation_steps ({}) × world size ({}) = {}",
                        t, m, g, w, m * g * w));
    }
  } else if (t && m) {
    if (divides(t, m * w, "gradient_accumulation_steps",
                fmt::format("train_micro_batch_size_per_gpu ({}) × world size ({})", m, w))) {
      g = t / (m * w);
    }
  } else if (t && g) {
    if (divides(t, g * w, "train_micro_batch_size_per_gpu",
                fmt::format("gradient_accumulation_steps ({}) × world size ({})", g, w))) {
      m = t / (g * w);
    }
  } else if (m && g) {
    t = m * g * w;
  } else if (t) {
    g = 1;
    if (divides(t, w, "train_micro_batch_size_per_gpu", fmt::format("world size ({})", w))) {
      m = t / w;
    }
  } else if (m) {
    g = 1;
    t = m * w;
  } else {
    if (!g) g = 1;
    m = 1;
    t = g * w;
    notes->push_back({"train_micro_batch_size_per_gpu",
                      "neither train_batch_size nor train_micro_batch_size_per_gpu is set; Strata "
                      "uses a micro-batch of 1 per rank"});
  }
}

void validate(Config& c, const JsonSource& source, std::vector<std::string>* errors,
              std::vector<Note>* notes) {
  auto error = [&](const std::string& key, const std::string& message) {
    errors->push_back(locate_path(source, key) + ": " + key + ": " + message);
  };
  const ZeroConfig& z = c.zero_optimization;

  if (c.fp16.enabled && c.bf16.enabled) {
    error("bf16.enabled",
          "fp16 and bf16 are both enabled; enable at most one of fp16.enabled and bf16.enabled");
  }
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3) {
    error("zero_optimization.offload_param.device",
          fmt::format("offloading parameters needs ZeRO stage 3, but zero_optimization.stage is "
                      "{}; set stage to 3 or offload_param.device to \"none\"",
                      z.stage));
  }
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0) {
    error("zero_optimization.offload_optimizer.device",
          "offloading the optimizer needs ZeRO stage 1, 2 or 3, but zero_optimization.stage is 0");
  }
  if (z.offload_param.device == OffloadDevice::kNvme && z.offload_param.nvme_path.empty()) {
    error("zero_optimization.offload_param.nvme_path",
          "device is \"nvme\" but no nvme_path is set; give a directory on the NVMe drive");
  }
  if (z.offload_optimizer.device == OffloadDevice::kNvme && z.offload_optimizer.nvme_path.empty()) {
    error("zero_optimization.offload_optimizer.nvme_path",
          "device is \"nvme\" but no nvme_path is set; give a directory on the NVMe drive");
  }
  if (z.offload_optimizer.ratio < 1.0 && z.offload_optimizer.device == OffloadDevice::kNone) {
    error("zero_optimization.offload_optimizer.ratio",
          "a ratio below 1 splits offloaded optimizer state, but offload_optimizer.device is "
          "\"none\"");
  }
  if (c.aio.use_gds) {
    error("aio.use_gds", "GPUDirect Storage is not supported; set use_gds to false");
  }
  if (c.optimizer.params.amsgrad) {
    error("optimizer.params.amsgrad", "AMSGrad is not supported; set amsgrad to false");
  }

  SchedulerConfig& s = c.scheduler;
  if (s.type == SchedulerType::kWarmupDecayLR || s.type == SchedulerType::kWarmupCosineLR) {
    if (s.params.total_num_steps == 0) {
      s.params.total_num_steps = c.strata.train_steps;
      notes->push_back(
          {"scheduler.params.total_num_steps",
           fmt::format("not set; taken from strata.train_steps = {}", c.strata.train_steps)});
    }
    if (s.params.warmup_num_steps > s.params.total_num_steps) {
      error("scheduler.params.warmup_num_steps",
            fmt::format("{} warm-up steps exceed total_num_steps ({}); valid: at most {}",
                        s.params.warmup_num_steps, s.params.total_num_steps,
                        s.params.total_num_steps));
    }
  }
  if (s.type == SchedulerType::kWarmupLR || s.type == SchedulerType::kWarmupDecayLR) {
    if (s.params.warmup_min_lr > s.params.warmup_max_lr) {
      error("scheduler.params.warmup_min_lr",
            fmt::format("{} is above warmup_max_lr ({})", s.params.warmup_min_lr,
                        s.params.warmup_max_lr));
    }
  }

  const ModelConfig& model = c.strata.model;
  if (model.path.empty()) {
    if (model.hidden_size % model.num_heads != 0) {
      error("strata.model.num_heads",
            fmt::format("{} heads do not divide hidden_size {}; valid: a divisor of {}",
                        model.num_heads, model.hidden_size, model.hidden_size));
    }
    if (model.num_kv_heads != 0 && model.num_heads % model.num_kv_heads != 0) {
      error("strata.model.num_kv_heads",
            fmt::format("{} KV heads do not divide num_heads {}; valid: a divisor of {}",
                        model.num_kv_heads, model.num_heads, model.num_heads));
    }
    if (c.strata.data.seq_len > model.max_seq_len) {
      error("strata.data.seq_len", fmt::format("{} is longer than the model's max_seq_len ({})",
                                               c.strata.data.seq_len, model.max_seq_len));
    }
  }
  if (c.strata.data.source != DataSource::kSynthetic && c.strata.data.path.empty()) {
    error("strata.data.path", "required when strata.data.source is \"tokens\" or \"text\"");
  }
  if (c.strata.data.packing && c.strata.data.source != DataSource::kTokens) {
    error("strata.data.packing",
          "packs documents, whose starts a token file's mask file records, so it needs "
          "strata.data.source \"tokens\"");
  }
  if (model.activation_offload && !model.activation_checkpointing) {
    error("strata.model.activation_offload",
          "moves activation checkpoints to the host, so it needs "
          "strata.model.activation_checkpointing = true");
  }

  derive_batch_sizes(c, source, errors, notes);
}

Result<Loaded> load_from_source(JsonSource source, const std::vector<std::string>& overrides,
                                const LoadOptions& options) {
  if (options.world_size < 1) {
    return Status(ErrorCode::kUsage,
                  fmt::format("world size {} is invalid; valid: 1 or more", options.world_size));
  }
  for (const std::string& assignment : overrides) {
    STRATA_TRY(source.apply_override(assignment));
  }
  Loaded loaded;
  std::vector<std::string> errors;
  map_legacy_offload(source, &errors, &loaded.notes);
  Reader reader(source, &errors, &loaded.notes);
  reader.read_object(source.root(), "", loaded.config);
  loaded.config.world_size = options.world_size;
  if (errors.empty()) validate(loaded.config, source, &errors, &loaded.notes);
  if (!errors.empty()) {
    std::string message = errors.size() == 1 ? errors[0]
                                             : fmt::format("{} problems:\n  {}", errors.size(),
                                                           fmt::join(errors, "\n  "));
    return Status(ErrorCode::kConfig, message);
  }
  return loaded;
}

}  // namespace

const char* to_string(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "unknown";
}

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "unknown";
}

Result<Loaded> load_config_text(const std::string& text, const std::string& source_name,
                                const std::vector<std::string>& overrides,
                                const LoadOptions& options) {
  STRATA_ASSIGN_OR_RETURN(JsonSource source, JsonSource::parse(text, source_name));
  return load_from_source(std::move(source), overrides, options);
}

Result<Loaded> load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                                const LoadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(ErrorCode::kConfig,
                  fmt::format("cannot read the config file: {}", std::strerror(errno)), path);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return Status(ErrorCode::kConfig, "error while reading the config file", path);
  }
  return load_config_text(text.str(), path, overrides, options);
}

}  // namespace strata::config

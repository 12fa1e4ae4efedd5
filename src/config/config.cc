// Loading a configuration: read the file (bounded), parse, apply the flags and overrides, map old
// DeepSpeed switches, read through the schema, then resolve "auto" and check what spans several
// keys (validate.cc). Every problem is collected and reported at once; no exception escapes.
#include "config/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <map>
#include <numeric>

#include "config/flags.h"
#include "config/json_source.h"
#include "config/reader.h"
#include "config/schema.h"
#include "config/validate.h"

namespace strata::config {
namespace {

// At most this many problems are listed; the rest are counted (a hostile file).
constexpr std::size_t kProblemsListedMax = 50;

bool equals_ignore_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// The value of a flag as JSON, or an error naming the flag.
bool flag_value(const TrainFlag& flag, const FlagValue& given, std::string_view fixed,
                Json::Value* out, std::string* error) {
  const std::string origin = given.flag + (given.value.empty() ? "" : " " + given.value);
  switch (flag.kind) {
    case FlagKind::kSwitch:
      *out = Json::Value(fixed == "true");
      return true;
    case FlagKind::kText:
      if (given.value.empty()) {
        *error = origin + ": needs a value (" + std::string(flag.value_name) + ")";
        return false;
      }
      *out = Json::Value(given.value);
      return true;
    case FlagKind::kNumber: {
      char* end = nullptr;
      errno = 0;
      const double d = std::strtod(given.value.c_str(), &end);
      if (given.value.empty() || end != given.value.c_str() + given.value.size() ||
          !std::isfinite(d) || errno == ERANGE) {
        *error = origin + ": expected a number such as 2e-5";
        return false;
      }
      *out = Json::Value(d);
      return true;
    }
    case FlagKind::kWhole: {
      char* end = nullptr;
      errno = 0;
      const unsigned long long n = std::strtoull(given.value.c_str(), &end, 10);
      if (given.value.empty() || given.value[0] == '-' ||
          end != given.value.c_str() + given.value.size() || errno == ERANGE) {
        *error = origin + ": expected a whole number ≥ 0";
        return false;
      }
      *out = Json::Value(static_cast<Json::UInt64>(n));
      return true;
    }
  }
  return false;
}

// Applies the `strata train` flags, then the --set overrides. Two of them setting one key
// differently is an error naming both.
void apply_command_line(JsonSource& source, const std::vector<FlagValue>& flags,
                        const std::vector<std::string>& overrides, ReaderOutput& out,
                        bool* usage_only) {
  std::map<std::string, std::pair<std::string, Json::Value>> set_by;  // path -> origin, value
  auto claim = [&](const std::string& path, const Json::Value& value, const std::string& origin) {
    auto [it, fresh] = set_by.emplace(path, std::make_pair(origin, value));
    if (!fresh && it->second.second != value) {
      out.errors.push_back(fmt::format("{} and {} both set {}, differently; give one",
                                       it->second.first, origin, path));
      *usage_only = false;
      return false;
    }
    return true;
  };
  std::string scheduler_type;
  const Json::Value& root = source.root();
  if (root.isMember("scheduler") && root["scheduler"].isObject() &&
      root["scheduler"].isMember("type") && root["scheduler"]["type"].isString()) {
    scheduler_type = root["scheduler"]["type"].asString();
  }
  const bool has_warmup_max_lr = equals_ignore_case(scheduler_type, "WarmupLR") ||
                                 equals_ignore_case(scheduler_type, "WarmupDecayLR");
  for (const FlagValue& given : flags) {
    const TrainFlag* flag = find_train_flag(given.flag);
    if (flag == nullptr) {
      out.errors.push_back(given.flag + ": not a strata train flag");
      continue;
    }
    const std::string origin = given.flag + (given.value.empty() ? "" : " " + given.value);
    for (const FlagTarget& target : flag->targets) {
      if (target.when == FlagWhen::kWarmupMaxLr && !has_warmup_max_lr) continue;
      Json::Value value;
      std::string error;
      if (!flag_value(*flag, given, target.fixed, &value, &error)) {
        out.errors.push_back(error);
        *usage_only = false;
        break;
      }
      const std::string path(target.path);
      if (!claim(path, value, origin)) continue;
      // A flag replacing a value the file gives (not "auto") is said, as the Trainer would.
      const Json::Value* old = &source.root();
      std::size_t start = 0;
      while (old != nullptr) {
        const std::size_t dot = path.find('.', start);
        const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
        old = old->isObject() && old->isMember(key) ? &(*old)[key] : nullptr;
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
      if (old != nullptr && !old->isNull() && !(old->isString() && old->asString() == "auto") &&
          *old != value &&
          !(old->isNumeric() && value.isNumeric() && !old->isBool() && !value.isBool() &&
            old->asDouble() == value.asDouble())) {
        out.notes.push_back(
            {path, fmt::format("{} replaces the value {} in {}", origin,
                               old->toStyledString().substr(0, old->toStyledString().find('\n')),
                               source.name())});
      }
      Status status = source.set(path, value, origin);
      if (!status.is_ok()) {
        out.errors.push_back(status.to_string());
        *usage_only = false;
      }
    }
  }
  for (const std::string& assignment : overrides) {
    const std::size_t eq = assignment.find('=');
    Status status = source.apply_override(assignment);
    if (!status.is_ok()) {
      out.errors.push_back(status.to_string());
      if (status.code() != ErrorCode::kUsage) *usage_only = false;
      continue;
    }
    const std::string path = assignment.substr(0, eq);
    // The value as set, found again by walking the path.
    const Json::Value* node = &source.root();
    std::size_t start = 0;
    while (node != nullptr) {
      const std::size_t dot = path.find('.', start);
      const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
      node = node->isObject() && node->isMember(key) ? &(*node)[key] : nullptr;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    if (node != nullptr && !claim(path, *node, "--set " + assignment)) continue;
  }
}

// DeepSpeed's pre-0.3.16 offload switches inside zero_optimization, and the older
// "zero_optimization": true, mapped to today's sections.
void map_legacy(JsonSource& source, ReaderOutput& out) {
  Json::Value& root = source.root();
  // optimizer.params.max_grad_norm: the clipping norm of old DeepSpeed's fp16 wrapper (today's
  // DeepSpeed refuses it as an Adam parameter): read as gradient_clipping.
  if (root.isMember("optimizer") && root["optimizer"].isObject() &&
      root["optimizer"].isMember("params") && root["optimizer"]["params"].isObject() &&
      root["optimizer"]["params"].isMember("max_grad_norm")) {
    Json::Value& params = root["optimizer"]["params"];
    const std::string path = "optimizer.params.max_grad_norm";
    const Json::Value value = params["max_grad_norm"];
    params.removeMember("max_grad_norm");
    auto keep = [&](KeyUse use, const std::string& detail) {
      out.keys.push_back({path, use, detail, source.locate(value, path)});
      out.key_offsets.push_back(value.getOffsetStart());
    };
    if (!value.isNumeric() || value.isBool() || !std::isfinite(value.asDouble()) ||
        value.asDouble() < 0) {
      out.errors.push_back(source.locate(value, path) + ": " + path +
                           ": expected a clipping norm ≥ 0 (it is read as gradient_clipping)");
      out.invalid.insert(path);
      keep(KeyUse::kInvalid, "expected a number ≥ 0");
    } else if (root.isMember("gradient_clipping") && !root["gradient_clipping"].isNull()) {
      const Json::Value& clip = root["gradient_clipping"];
      if (clip.isNumeric() && !clip.isBool() && clip.asDouble() == value.asDouble()) {
        keep(KeyUse::kUsed, "the same norm as gradient_clipping");
      } else {
        out.errors.push_back(source.locate(value, path) + ": " + path +
                             ": a second clipping norm, different from gradient_clipping; keep "
                             "only gradient_clipping");
        out.invalid.insert(path);
        keep(KeyUse::kInvalid, "conflicts with gradient_clipping");
      }
    } else {
      root["gradient_clipping"] = value;
      out.notes.push_back({path,
                           "read as gradient_clipping (the optimizer parameter of old "
                           "DeepSpeed versions)"});
      keep(KeyUse::kUsed, "read as gradient_clipping");
    }
  }
  if (!root.isMember("zero_optimization")) return;
  if (root["zero_optimization"].isBool()) {
    const Json::Value old = root["zero_optimization"];
    const bool on = old.asBool();
    out.notes.push_back(
        {"zero_optimization",
         fmt::format("the old switch form; read as zero_optimization.stage = {}", on ? 1 : 0)});
    out.keys.push_back({"zero_optimization", KeyUse::kUsed,
                        fmt::format("old switch: read as stage {}", on ? 1 : 0),
                        source.locate(old, "zero_optimization")});
    out.key_offsets.push_back(old.getOffsetStart());
    Json::Value section(Json::objectValue);
    section["stage"] = on ? 1 : 0;
    section["stage"].setOffsetStart(old.getOffsetStart());
    root["zero_optimization"] = section;
    return;
  }
  if (!root["zero_optimization"].isObject()) return;
  Json::Value& zero = root["zero_optimization"];
  struct Legacy {
    const char* key;
    const char* section;
    const char* field;
  };
  for (const Legacy& legacy :
       {Legacy{"cpu_offload", "offload_optimizer", "device"},
        Legacy{"cpu_offload_param", "offload_param", "device"},
        Legacy{"cpu_offload_params", "offload_param", "device"},
        Legacy{"cpu_offload_use_pin_memory", "offload_optimizer", "pin_memory"}}) {
    if (!zero.isMember(legacy.key)) continue;
    const std::string path = std::string("zero_optimization.") + legacy.key;
    const Json::Value value = zero[legacy.key];
    zero.removeMember(legacy.key);
    auto keep = [&](KeyUse use, const std::string& detail) {
      out.keys.push_back({path, use, detail, source.locate(value, path)});
      out.key_offsets.push_back(value.getOffsetStart());
    };
    if (value.isNull()) {
      keep(KeyUse::kNoEffect, "null");
      continue;
    }
    if (!value.isBool()) {
      out.errors.push_back(source.locate(value, path) + ": " + path + ": expected true or false");
      out.invalid.insert(path);
      keep(KeyUse::kInvalid, "expected true or false");
      continue;
    }
    const std::string target =
        std::string("zero_optimization.") + legacy.section + "." + legacy.field;
    if (zero.isMember(legacy.section) && zero[legacy.section].isObject() &&
        zero[legacy.section].isMember(legacy.field)) {
      out.errors.push_back(source.locate(value, path) + ": " + path + ": an old switch for '" +
                           target + "', which is also set; keep only '" + target + "'");
      out.invalid.insert(path);
      keep(KeyUse::kInvalid, "conflicts with " + target);
      continue;
    }
    const bool on = value.asBool();
    Json::Value mapped =
        std::string(legacy.field) == "device" ? Json::Value(on ? "cpu" : "none") : Json::Value(on);
    mapped.setOffsetStart(value.getOffsetStart());
    if (!zero.isMember(legacy.section) || !zero[legacy.section].isObject()) {
      zero[legacy.section] = Json::Value(Json::objectValue);
    }
    zero[legacy.section][legacy.field] = mapped;
    const std::string text = mapped.isBool() ? (on ? "true" : "false") : mapped.asString();
    out.notes.push_back({path, "old DeepSpeed switch; read as " + target + " = " + text});
    keep(KeyUse::kUsed, "old switch: read as " + target + " = " + text);
  }
}

Checked check_source(JsonSource source, const std::vector<std::string>& overrides,
                     const LoadOptions& options) {
  Checked checked;
  Loaded& loaded = checked.loaded;
  if (options.world_size < 1) {
    checked.status = Status(ErrorCode::kUsage, fmt::format("world size {} is invalid; valid: 1 or "
                                                           "more",
                                                           options.world_size));
    return checked;
  }
  ReaderOutput out;
  bool usage_only = true;
  apply_command_line(source, options.flags, overrides, out, &usage_only);
  const std::size_t command_line_errors = out.errors.size();
  map_legacy(source, out);
  Reader reader(source, &out);
  reader.read_object(source.root(), "", loaded.config);
  loaded.config.world_size = options.world_size;
  if (out.errors.size() > command_line_errors) usage_only = false;

  // The keys given, for the report and for given(); then the steps that use them.
  std::vector<std::size_t> order(out.keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return out.key_offsets[a] < out.key_offsets[b];
  });
  for (std::size_t i : order)
    loaded.keys.push_back(std::move(out.keys[i]));
  out.keys.clear();

  LoadContext ctx{source, out, loaded, options};
  const std::size_t before = out.errors.size();
  resolve_autos(ctx);
  validate(ctx);
  check_named_model_and_data(ctx);
  if (out.errors.size() > before) usage_only = false;
  loaded.notes.insert(loaded.notes.begin(), out.notes.begin(), out.notes.end());

  if (!out.errors.empty()) {
    std::vector<std::string>& errors = out.errors;
    std::string message;
    if (errors.size() == 1) {
      message = errors[0];
    } else {
      const std::size_t listed = std::min(errors.size(), kProblemsListedMax);
      message = fmt::format("{} problems:", errors.size());
      for (std::size_t i = 0; i < listed; ++i)
        message += "\n  " + errors[i];
      if (listed < errors.size()) {
        message += fmt::format("\n  ... and {} more (not listed)", errors.size() - listed);
      }
    }
    checked.status = Status(usage_only ? ErrorCode::kUsage : ErrorCode::kConfig, message);
  }
  return checked;
}

// Runs `body`, turning any exception (jsoncpp throws on misuse, std::bad_alloc) into a kConfig
// error naming the source: no exception leaves the config module.
template <typename F>
Checked guarded(const std::string& name, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    Checked checked;
    checked.status = Status(ErrorCode::kConfig,
                            fmt::format("could not read the config: {} (please report this as "
                                        "a bug in Strata)",
                                        e.what()),
                            name);
    return checked;
  }
}

Result<Loaded> to_result(Checked checked) {
  if (!checked.status.is_ok()) return checked.status;
  return std::move(checked.loaded);
}

}  // namespace

bool Loaded::given(const std::string& path) const {
  auto inside = [](const std::string& inner, const std::string& outer) {
    return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
           inner[outer.size()] == '.';
  };
  for (const KeyReport& key : keys) {
    // The key itself, a key inside the section asked about, or a section given whole (an
    // override "strata.model={...}") that holds the key.
    if (key.path == path || inside(key.path, path) || inside(path, key.path)) return true;
  }
  return false;
}

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

Checked check_config_text(const std::string& text, const std::string& source_name,
                          const std::vector<std::string>& overrides, const LoadOptions& options) {
  return guarded(source_name, [&]() -> Checked {
    Result<JsonSource> source = JsonSource::parse(text, source_name);
    if (!source.is_ok()) return Checked{source.status(), {}};
    return check_source(std::move(*source), overrides, options);
  });
}

Checked check_config_file(const std::string& path, const std::vector<std::string>& overrides,
                          const LoadOptions& options) {
  return guarded(path, [&]() -> Checked {
    Result<std::string> text = JsonSource::read_file(path);
    if (!text.is_ok()) return Checked{text.status(), {}};
    return check_config_text(*text, path, overrides, options);
  });
}

Result<Loaded> load_config_text(const std::string& text, const std::string& source_name,
                                const std::vector<std::string>& overrides,
                                const LoadOptions& options) {
  return to_result(check_config_text(text, source_name, overrides, options));
}

Result<Loaded> load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                                const LoadOptions& options) {
  return to_result(check_config_file(path, overrides, options));
}

}  // namespace strata::config

// trainer_state.json: rendering and hostile-input parsing (see manifest.h).
#include "checkpoint/manifest.h"

#include <fmt/format.h>
#include <json/json.h>
#include <xxhash.h>

#include <cmath>
#include <exception>
#include <limits>

#include "common/bounded_read.h"

namespace strata::checkpoint {
namespace {

constexpr std::string_view kChecksumKey = "\"checksum\"";
constexpr std::string_view kChecksumPrefix = "xxh3:";
constexpr std::size_t kHexDigits = 16;
constexpr std::size_t kModelJsonBytesMax = 1 << 20;

std::string hex64(std::uint64_t v) {
  return fmt::format("{:016x}", v);
}

bool parse_hex64(std::string_view s, std::uint64_t* out) {
  if (s.size() != kHexDigits) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    int d = 0;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  *out = v;
  return true;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Offsets of the 16 hex digits of every `"checksum": "xxh3:<16 hex>"` in the raw text. A key
// inside a string value cannot match: its quotes are escaped there.
std::vector<std::size_t> checksum_digits(std::string_view text) {
  std::vector<std::size_t> found;
  for (std::size_t at = text.find(kChecksumKey); at != std::string_view::npos;
       at = text.find(kChecksumKey, at + 1)) {
    std::size_t i = at + kChecksumKey.size();
    while (i < text.size() && is_space(text[i]))
      ++i;
    if (i >= text.size() || text[i] != ':') continue;
    ++i;
    while (i < text.size() && is_space(text[i]))
      ++i;
    if (text.substr(i, 1 + kChecksumPrefix.size()) != "\"xxh3:") continue;
    i += 1 + kChecksumPrefix.size();
    if (i + kHexDigits < text.size() && text[i + kHexDigits] == '"') found.push_back(i);
  }
  return found;
}

// xxHash3-64 of `text` with the checksum's digits at `digits` read as zeros.
std::uint64_t manifest_digest(std::string_view text, std::size_t digits) {
  std::string copy(text);
  copy.replace(digits, kHexDigits, kHexDigits, '0');
  return XXH3_64bits(copy.data(), copy.size());
}

// Typed, range-checked access to the fields of trainer_state.json; the first problem wins.
class Fields {
 public:
  explicit Fields(std::string source) : source_(std::move(source)) {}

  // The member `key` of `object` (named `path` in errors), or null after recording a problem.
  const Json::Value* member(const Json::Value& object, const std::string& path, const char* key) {
    const std::string name = path.empty() ? key : path + "." + key;
    if (!object.isObject()) {
      fail(path, "is not an object");
      return nullptr;
    }
    const Json::Value* v = object.find(key, key + std::char_traits<char>::length(key));
    if (v == nullptr) fail(name, "is missing");
    return v;
  }

  std::int64_t integer(const Json::Value& object, const std::string& path, const char* key,
                       std::int64_t lo, std::int64_t hi) {
    const Json::Value* v = member(object, path, key);
    if (v == nullptr) return lo;
    if (!v->isInt64() || v->asInt64() < lo || v->asInt64() > hi) {
      fail(path.empty() ? key : path + "." + key,
           fmt::format("is {}; valid: an integer in [{}, {}]", shown(*v), lo, hi));
      return lo;
    }
    return v->asInt64();
  }

  std::uint64_t unsigned_integer(const Json::Value& object, const char* key) {
    const Json::Value* v = member(object, "", key);
    if (v == nullptr) return 0;
    if (!v->isUInt64()) {
      fail(key, fmt::format("is {}; valid: an integer in [0, 2^64)", shown(*v)));
      return 0;
    }
    return v->asUInt64();
  }

  double positive_real(const Json::Value& object, const std::string& path, const char* key) {
    const Json::Value* v = member(object, path, key);
    if (v == nullptr) return 1.0;
    if (!v->isNumeric() || !std::isfinite(v->asDouble()) || v->asDouble() <= 0.0) {
      fail(path + "." + key, fmt::format("is {}; valid: a positive finite number", shown(*v)));
      return 1.0;
    }
    return v->asDouble();
  }

  std::string text(const Json::Value& object, const char* key, std::size_t bytes_max) {
    const Json::Value* v = member(object, "", key);
    if (v == nullptr) return {};
    if (!v->isString() || v->asString().size() > bytes_max) {
      fail(key, fmt::format("is {}; valid: a string of at most {} bytes", shown(*v), bytes_max));
      return {};
    }
    return v->asString();
  }

  std::uint64_t digest(const Json::Value& object, const std::string& path, const char* key) {
    const Json::Value* v = member(object, path, key);
    std::uint64_t d = 0;
    if (v != nullptr && (!v->isString() || !parse_hex64(v->asString(), &d))) {
      fail(path + "." + key, fmt::format("is {}; valid: 16 lowercase hex digits", shown(*v)));
    }
    return d;
  }

  void fail(const std::string& field, const std::string& message) {
    if (status_.is_ok()) status_ = Status(ErrorCode::kCorrupt, field + " " + message, source_);
  }
  const Status& status() const { return status_; }

 private:
  static std::string shown(const Json::Value& v) {
    if (v.isNull()) return "null";
    if (v.isObject()) return "an object";
    if (v.isArray()) return "an array";
    Json::StreamWriterBuilder w;
    w["indentation"] = "";
    std::string s = Json::writeString(w, v);
    if (s.size() > 64) s = s.substr(0, 61) + "...";
    return s;
  }

  std::string source_;
  Status status_;
};

Status check_files(Fields& f, const Json::Value& root, CheckpointManifest& m) {
  const Json::Value* files = f.member(root, "", "files");
  if (files == nullptr) return f.status();
  if (!files->isArray() || files->size() != static_cast<Json::ArrayIndex>(m.state_files)) {
    f.fail("files", fmt::format("must list the {} state files", m.state_files));
    return f.status();
  }
  for (int r = 0; r < m.state_files; ++r) {
    const Json::Value& entry = (*files)[static_cast<Json::ArrayIndex>(r)];
    const std::string path = fmt::format("files[{}]", r);
    StateFileDigest d;
    d.name = state_file_name(r, m.state_files);
    const Json::Value* name = f.member(entry, path, "name");
    if (name != nullptr && (!name->isString() || name->asString() != d.name)) {
      f.fail(path + ".name", "is not " + d.name);
    }
    d.bytes = static_cast<std::uint64_t>(
        f.integer(entry, path, "bytes", 8, std::numeric_limits<std::int64_t>::max()));
    d.header_xxh3 = f.digest(entry, path, "header_xxh3");
    const Json::Value* tensors = f.member(entry, path, "tensors");
    if (tensors != nullptr && !tensors->isObject()) f.fail(path + ".tensors", "is not an object");
    if (!f.status().is_ok()) return f.status();
    for (auto it = tensors->begin(); it != tensors->end(); ++it) {
      const std::string tensor = it.name();
      d.tensor_xxh3[tensor] = f.digest(*tensors, path + ".tensors", tensor.c_str());
    }
    if (!f.status().is_ok()) return f.status();
    m.files.push_back(std::move(d));
  }
  return Status::ok();
}

Result<CheckpointManifest> parse_fields(const Json::Value& root, std::string_view text,
                                        const std::string& source) {
  Fields f(source);
  CheckpointManifest m;
  const std::string format = f.text(root, "format", 64);
  if (!f.status().is_ok()) return f.status();
  m.version = 0;
  for (int v = 1; v <= kCheckpointVersion; ++v) {
    if (format == checkpoint_format(v)) m.version = v;
  }
  if (m.version == 0) {
    const bool newer = format.rfind("strata-checkpoint-", 0) == 0;
    return Status(ErrorCode::kCorrupt,
                  fmt::format("format '{}' is not one this Strata reads ({}, -2 or -1){}", format,
                              checkpoint_format(kCheckpointVersion),
                              newer ? "; a newer Strata wrote it" : ""),
                  source);
  }
  if (m.version >= 3) {
    const std::vector<std::size_t> digits = checksum_digits(text);
    std::uint64_t recorded = 0;
    const std::string value = f.text(root, "checksum", 64);
    if (!f.status().is_ok()) return f.status();
    if (digits.size() != 1 ||
        value != std::string(kChecksumPrefix) + std::string(text.substr(digits[0], kHexDigits)) ||
        !parse_hex64(text.substr(digits[0], kHexDigits), &recorded)) {
      return Status(ErrorCode::kCorrupt,
                    "checksum is missing or malformed; valid: one \"checksum\": \"xxh3:<16 hex "
                    "digits>\"",
                    source);
    }
    const std::uint64_t computed = manifest_digest(text, digits[0]);
    if (computed != recorded) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("the file fails its checksum (recorded xxh3 {}, computed {}): it "
                                "was changed or damaged after it was written",
                                hex64(recorded), hex64(computed)),
                    source);
    }
  }
  TrainerCounters& c = m.counters;
  c.step = f.integer(root, "", "step", 0, kCounterMax);
  c.adam_step = f.integer(root, "", "adam_step", 0, kCounterMax);
  c.scheduler_iteration = f.integer(root, "", "scheduler_last_batch_iteration", -1, kCounterMax);
  c.skipped_steps = f.integer(root, "", "skipped_steps", 0, kCounterMax);
  c.tokens_seen = f.integer(root, "", "tokens_seen", 0, kCounterMax);
  const Json::Value* scaler = f.member(root, "", "loss_scaler");
  if (scaler != nullptr) {
    c.scaler.scale = f.positive_real(*scaler, "loss_scaler", "scale");
    c.scaler.iteration = f.integer(*scaler, "loss_scaler", "iteration", 0, kCounterMax);
    c.scaler.last_overflow_iteration =
        f.integer(*scaler, "loss_scaler", "last_overflow_iteration", -1, kCounterMax);
    c.scaler.hysteresis = f.integer(*scaler, "loss_scaler", "hysteresis", 1, 1 << 30);
  }
  const Json::Value* data = f.member(root, "", "data");
  if (data != nullptr) {
    c.data.epoch = f.integer(*data, "data", "epoch", 0, kCounterMax);
    c.data.sample = f.integer(*data, "data", "sample", 0, kCounterMax);
  }
  const Json::Value* losses = f.member(root, "", "recent_losses");
  if (losses != nullptr && (!losses->isArray() || losses->size() > kRecentLossesMax)) {
    f.fail("recent_losses", fmt::format("valid: a list of at most {} numbers", kRecentLossesMax));
  } else if (losses != nullptr) {
    for (const Json::Value& l : *losses) {
      // A diverged step's loss (NaN, inf) is written as null.
      if (!l.isNull() && !l.isNumeric()) {
        f.fail("recent_losses", "holds a value that is not a number");
        break;
      }
      c.recent_losses.push_back(l.isNull() ? std::nan("") : l.asDouble());
    }
  }
  m.seed = f.unsigned_integer(root, "seed");
  m.precision = f.text(root, "precision", 16);
  if (f.status().is_ok() && m.precision != "fp32" && m.precision != "bf16" &&
      m.precision != "fp16") {
    f.fail("precision", fmt::format("is '{}'; valid: fp32, bf16, fp16", m.precision));
  }
  m.model_json = f.text(root, "model", kModelJsonBytesMax);
  if (root.isMember("source_model")) m.source_model = f.text(root, "source_model", 4096);
  if (m.version >= 2) {
    m.world_size = static_cast<int>(f.integer(root, "", "world_size", 1, kStateFilesMax));
    m.zero_stage = static_cast<int>(f.integer(root, "", "zero_stage", 0, 3));
    m.state_files = static_cast<int>(f.integer(root, "", "state_files", 1, kStateFilesMax));
    const int expected = m.zero_stage >= 1 ? m.world_size : 1;
    if (f.status().is_ok() && m.state_files != expected) {
      f.fail("state_files", fmt::format("is {}; a run of {} rank(s) at ZeRO stage {} writes {}",
                                        m.state_files, m.world_size, m.zero_stage, expected));
    }
  }
  if (!f.status().is_ok()) return f.status();
  STRATA_TRY(check_counters(c, source));
  if (m.version >= 3) STRATA_TRY(check_files(f, root, m));
  return m;
}

}  // namespace

std::string checkpoint_format(int version) {
  return fmt::format("strata-checkpoint-{}", version);
}

std::string state_file_name(int rank, int state_files) {
  return fmt::format("state-rank{:05d}-of-{:05d}.safetensors", rank, state_files);
}

Status check_counters(const TrainerCounters& c, const std::string& source) {
  auto bad = [&source](const std::string& message) {
    return Status(ErrorCode::kCorrupt, "inconsistent counters: " + message, source);
  };
  for (auto [name, value] : {std::pair<const char*, std::int64_t>{"step", c.step},
                             {"adam_step", c.adam_step},
                             {"skipped_steps", c.skipped_steps},
                             {"tokens_seen", c.tokens_seen},
                             {"data.epoch", c.data.epoch},
                             {"data.sample", c.data.sample},
                             {"loss_scaler.iteration", c.scaler.iteration}}) {
    if (value < 0 || value > kCounterMax) {
      return bad(fmt::format("{} is {}; valid: [0, {}]", name, value, kCounterMax));
    }
  }
  if (c.adam_step + c.skipped_steps != c.step) {
    return bad(fmt::format("step {} is not adam_step {} + skipped_steps {}", c.step, c.adam_step,
                           c.skipped_steps));
  }
  if (c.scheduler_iteration != c.adam_step - 1) {
    return bad(
        fmt::format("scheduler_last_batch_iteration {} is not adam_step {} - 1 (the "
                    "schedule advances once per applied step from -1)",
                    c.scheduler_iteration, c.adam_step));
  }
  if (!std::isfinite(c.scaler.scale) || c.scaler.scale <= 0.0) {
    return bad(
        fmt::format("loss_scaler.scale is {}; valid: a positive finite number", c.scaler.scale));
  }
  if (c.scaler.iteration != c.step) {
    return bad(
        fmt::format("loss_scaler.iteration {} is not step {} (the scaler counts every "
                    "step)",
                    c.scaler.iteration, c.step));
  }
  const std::int64_t overflow = c.scaler.last_overflow_iteration;
  if (overflow != -1 && (overflow < 0 || overflow >= c.scaler.iteration)) {
    return bad(
        fmt::format("loss_scaler.last_overflow_iteration {} is neither -1 (none) nor in "
                    "[0, {})",
                    overflow, c.scaler.iteration));
  }
  if (c.scaler.hysteresis < 1) {
    return bad(fmt::format("loss_scaler.hysteresis is {}; valid: at least 1", c.scaler.hysteresis));
  }
  if (c.recent_losses.size() > kRecentLossesMax) {
    return bad(
        fmt::format("{} recent losses; at most {}", c.recent_losses.size(), kRecentLossesMax));
  }
  return Status::ok();
}

std::string render_checkpoint_manifest(const CheckpointManifest& m) {
  const TrainerCounters& c = m.counters;
  Json::Value j(Json::objectValue);
  j["format"] = checkpoint_format(kCheckpointVersion);
  j["step"] = Json::Int64(c.step);
  j["adam_step"] = Json::Int64(c.adam_step);
  j["scheduler_last_batch_iteration"] = Json::Int64(c.scheduler_iteration);
  j["skipped_steps"] = Json::Int64(c.skipped_steps);
  j["tokens_seen"] = Json::Int64(c.tokens_seen);
  j["loss_scaler"]["scale"] = c.scaler.scale;
  j["loss_scaler"]["iteration"] = Json::Int64(c.scaler.iteration);
  j["loss_scaler"]["last_overflow_iteration"] = Json::Int64(c.scaler.last_overflow_iteration);
  j["loss_scaler"]["hysteresis"] = Json::Int64(c.scaler.hysteresis);
  j["data"]["epoch"] = Json::Int64(c.data.epoch);
  j["data"]["sample"] = Json::Int64(c.data.sample);
  j["seed"] = Json::UInt64(m.seed);
  j["precision"] = m.precision;
  j["world_size"] = m.world_size;
  j["zero_stage"] = m.zero_stage;
  j["state_files"] = m.state_files;
  j["model"] = m.model_json;
  if (!m.source_model.empty()) j["source_model"] = m.source_model;
  Json::Value losses(Json::arrayValue);
  for (double l : c.recent_losses)
    losses.append(std::isfinite(l) ? Json::Value(l) : Json::Value());
  j["recent_losses"] = losses;
  Json::Value files(Json::arrayValue);
  for (const StateFileDigest& d : m.files) {
    Json::Value f(Json::objectValue);
    f["name"] = d.name;
    f["bytes"] = Json::UInt64(d.bytes);
    f["header_xxh3"] = hex64(d.header_xxh3);
    Json::Value tensors(Json::objectValue);
    for (const auto& [name, digest] : d.tensor_xxh3)
      tensors[name] = hex64(digest);
    f["tensors"] = tensors;
    files.append(f);
  }
  j["files"] = files;
  j["checksum"] = std::string(kChecksumPrefix) + std::string(kHexDigits, '0');
  Json::StreamWriterBuilder writer;
  writer["indentation"] = "  ";
  writer["precision"] = 17;
  std::string text = Json::writeString(writer, j) + "\n";
  STRATA_ASSERT(checksum_digits(text).size() == 1);
  return seal_checkpoint_manifest(text);
}

std::string seal_checkpoint_manifest(std::string_view text) {
  std::string sealed(text);
  const std::vector<std::size_t> digits = checksum_digits(text);
  if (digits.size() == 1) {
    sealed.replace(digits[0], kHexDigits, hex64(manifest_digest(text, digits[0])));
  }
  return sealed;
}

Result<CheckpointManifest> parse_checkpoint_manifest(std::string_view text,
                                                     const std::string& source) {
  JsonLimits limits;
  limits.bytes_max = kManifestBytesMax;
  limits.depth_max = kManifestDepthMax;
  STRATA_ASSIGN_OR_RETURN(const Json::Value root, parse_json_bounded(text, source, limits));
  if (!root.isObject()) return Status(ErrorCode::kCorrupt, "not a JSON object", source);
  try {
    return parse_fields(root, text, source);
  } catch (const std::exception& e) {
    // Every access above is checked; this only keeps a jsoncpp surprise from escaping.
    return Status(ErrorCode::kCorrupt, fmt::format("cannot be read: {}", e.what()), source);
  }
}

}  // namespace strata::checkpoint

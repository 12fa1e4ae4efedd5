// Checkpoint reading at any world size (see checkpoint_reader.h), and read_checkpoint /
// find_checkpoint of checkpoint.h.
#include "train/checkpoint_reader.h"

#include <fmt/format.h>
#include <json/json.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "model/hf_io.h"
#include "model/safetensors.h"

namespace strata::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormatV1 = "strata-checkpoint-1";  // one state.safetensors, whole units
constexpr const char* kFormatV2 = "strata-checkpoint-2";  // rank files
constexpr int kStateFilesMax = 1 << 16;

Result<Json::Value> read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorCode::kNotFound, "cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  Json::CharReaderBuilder builder;
  builder["rejectDupKeys"] = true;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  Json::Value root;
  std::string errors;
  const std::string s = text.str();
  if (!reader->parse(s.data(), s.data() + s.size(), &root, &errors) || !root.isObject()) {
    return Status(ErrorCode::kCorrupt, "not a JSON object: " + errors, path);
  }
  return root;
}

// An integer key of trainer_state.json within [lo, hi].
Result<int> int_key(const Json::Value& j, const char* key, int lo, int hi,
                    const std::string& path) {
  const Json::Value& v = j[key];
  if (!v.isIntegral() || v.asInt64() < lo || v.asInt64() > hi) {
    std::string shown = v.isNull() ? "missing" : v.toStyledString();
    while (!shown.empty() && shown.back() == '\n')
      shown.pop_back();
    return Status(ErrorCode::kCorrupt,
                  fmt::format("'{}' is {}; valid: an integer in [{}, {}]", key, shown, lo, hi),
                  path);
  }
  return static_cast<int>(v.asInt64());
}

struct StateFile {
  model::SafetensorsFile file;
  bool whole_units = false;  // format 1: every tensor is a whole unit from element 0
};

// Metadata key `key` of `f` as a non-negative integer.
Result<std::int64_t> meta_int(const StateFile& f, const std::string& key) {
  const auto& meta = f.file.metadata();
  auto it = meta.find(key);
  std::int64_t value = -1;
  if (it != meta.end()) {
    const std::string& s = it->second;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) value = -1;
  }
  if (value < 0) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("metadata '{}' is {}; expected a non-negative integer", key,
                              it == meta.end() ? "missing" : "'" + it->second + "'"),
                  f.file.path());
  }
  return value;
}

}  // namespace

struct CheckpointReader::Impl {
  std::string dir;
  std::string meta_path;
  Json::Value j;
  std::string model_json;
  std::string precision;
  int world = 1;
  int stage = 0;
  std::vector<StateFile> files;
};

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&& other) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&& other) noexcept = default;

const std::string& CheckpointReader::dir() const {
  return impl_->dir;
}
const std::string& CheckpointReader::model_json() const {
  return impl_->model_json;
}
const std::string& CheckpointReader::precision() const {
  return impl_->precision;
}
std::uint64_t CheckpointReader::seed() const {
  return impl_->j["seed"].asUInt64();
}
int CheckpointReader::world_size() const {
  return impl_->world;
}
int CheckpointReader::zero_stage() const {
  return impl_->stage;
}
int CheckpointReader::state_files() const {
  return static_cast<int>(impl_->files.size());
}

Result<CheckpointReader> CheckpointReader::open(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->meta_path = dir + "/trainer_state.json";
  STRATA_ASSIGN_OR_RETURN(impl->j, read_json(impl->meta_path));
  const Json::Value& j = impl->j;
  const std::string format = j["format"].asString();
  if (format != kFormatV1 && format != kFormatV2) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("format '{}' is not '{}' or '{}'", format, kFormatV2, kFormatV1),
                  impl->meta_path);
  }
  if (!j["model"].isString() || !j["precision"].isString() || !j["seed"].isIntegral()) {
    return Status(ErrorCode::kCorrupt, "'model', 'precision' or 'seed' is missing",
                  impl->meta_path);
  }
  impl->model_json = j["model"].asString();
  impl->precision = j["precision"].asString();
  if (format == kFormatV1) {
    const std::string path = dir + "/state.safetensors";
    STRATA_ASSIGN_OR_RETURN(model::SafetensorsFile file, model::SafetensorsFile::open(path));
    impl->files.push_back(StateFile{std::move(file), true});
    return CheckpointReader(std::move(impl));
  }
  STRATA_ASSIGN_OR_RETURN(impl->world,
                          int_key(j, "world_size", 1, kStateFilesMax, impl->meta_path));
  STRATA_ASSIGN_OR_RETURN(impl->stage, int_key(j, "zero_stage", 0, 3, impl->meta_path));
  STRATA_ASSIGN_OR_RETURN(const int files,
                          int_key(j, "state_files", 1, impl->world, impl->meta_path));
  for (int r = 0; r < files; ++r) {
    const std::string path = dir + "/" + state_file_name(r, files);
    Result<model::SafetensorsFile> file = model::SafetensorsFile::open(path);
    if (!file.is_ok()) {
      return Status(file.status().code(),
                    fmt::format("the state file of rank {} of {} cannot be read: {}", r, files,
                                file.status().message()),
                    path);
    }
    StateFile f{std::move(*file), false};
    STRATA_ASSIGN_OR_RETURN(const std::int64_t rank, meta_int(f, "rank"));
    STRATA_ASSIGN_OR_RETURN(const std::int64_t count, meta_int(f, "state_files"));
    if (rank != r || count != files) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("metadata says rank {} of {}; the file name says rank {} of {}",
                                rank, count, r, files),
                    path);
    }
    impl->files.push_back(std::move(f));
  }
  return CheckpointReader(std::move(impl));
}

Result<model::ModelShape> CheckpointReader::shape() const {
  const std::string source = impl_->meta_path + ": model";
  STRATA_ASSIGN_OR_RETURN(config::ModelConfig m, model::parse_hf_config(impl_->model_json, source));
  STRATA_ASSIGN_OR_RETURN(model::ModelShape s, model::resolve_shape(m));
  if (model::hf_config_json(s, "") != impl_->model_json) {
    return Status(ErrorCode::kCorrupt, "the model config does not describe a shape Strata wrote",
                  source);
  }
  if (impl_->j["source_model"].isString()) s.arch.source_dir = impl_->j["source_model"].asString();
  return s;
}

Result<TrainerCounters> CheckpointReader::counters() const {
  const Json::Value& j = impl_->j;
  TrainerCounters c;
  c.step = j["step"].asInt64();
  c.adam_step = j["adam_step"].asInt64();
  c.scheduler_iteration = j["scheduler_last_batch_iteration"].asInt64();
  c.skipped_steps = j["skipped_steps"].asInt64();
  c.tokens_seen = j["tokens_seen"].asInt64();
  c.scaler.scale = j["loss_scaler"]["scale"].asDouble();
  c.scaler.iteration = j["loss_scaler"]["iteration"].asInt64();
  c.scaler.last_overflow_iteration = j["loss_scaler"]["last_overflow_iteration"].asInt64();
  c.scaler.hysteresis = j["loss_scaler"]["hysteresis"].asInt64();
  c.data.epoch = j["data"]["epoch"].asInt64();
  c.data.sample = j["data"]["sample"].asInt64();
  for (const Json::Value& l : j["recent_losses"])
    c.recent_losses.push_back(l.asDouble());
  if (c.step < 0 || c.adam_step < 0 || c.adam_step > c.step) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("inconsistent counters: step {}, adam_step {}", c.step, c.adam_step),
                  impl_->meta_path);
  }
  return c;
}

Status CheckpointReader::read(const model::UnitLayout& unit, tier::SlotKind kind,
                              std::int64_t begin, std::int64_t numel, float* dst) const {
  STRATA_ASSERT(begin >= 0 && numel >= 0 && (dst != nullptr || numel == 0));
  STRATA_ASSERT(kind == tier::SlotKind::kMaster || kind == tier::SlotKind::kExpAvg ||
                kind == tier::SlotKind::kExpAvgSq);
  const std::string name = unit.name + "." + tier::to_string(kind);
  const std::int64_t end = begin + numel;
  if (numel > 0) std::memset(dst, 0, static_cast<std::size_t>(numel) * sizeof(float));
  std::vector<std::pair<std::int64_t, std::int64_t>> covered;  // [lo, hi) copied
  for (const StateFile& f : impl_->files) {
    const model::StTensor* t = f.file.find(name);
    if (t == nullptr) {
      return Status(ErrorCode::kCorrupt, fmt::format("tensor '{}' is missing", name),
                    f.file.path());
    }
    if (t->dtype != model::StDType::kF32 || t->shape.size() != 1) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("tensor '{}' is {} of {} dimensions; expected F32 of 1", name,
                                model::st_dtype_name(t->dtype), t->shape.size()),
                    f.file.path());
    }
    const std::int64_t file_numel = t->shape[0];
    std::int64_t file_begin = 0, file_padded = file_numel;
    if (!f.whole_units) {
      STRATA_ASSIGN_OR_RETURN(file_begin, meta_int(f, unit.name + ".shard_begin"));
      STRATA_ASSIGN_OR_RETURN(file_padded, meta_int(f, unit.name + ".padded_numel"));
    }
    if (file_padded < unit.numel || file_begin > file_padded ||
        file_numel > file_padded - file_begin) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("tensor '{}' holds elements [{}, {}) of a unit of {} padded "
                                "elements; the unit has {} elements",
                                name, file_begin, file_begin + file_numel, file_padded, unit.numel),
                    f.file.path());
    }
    const std::int64_t lo = std::max(begin, file_begin);
    const std::int64_t hi = std::min(end, file_begin + file_numel);
    if (lo >= hi) continue;
    std::memcpy(dst + (lo - begin), f.file.data(*t) + (lo - file_begin) * 4,
                static_cast<std::size_t>(hi - lo) * 4);
    covered.emplace_back(lo, hi);
  }
  // Every real element must have come from some file; the rest is padding and stays zero.
  std::sort(covered.begin(), covered.end());
  const std::int64_t real_end = std::min(end, unit.numel);
  std::int64_t next = begin;
  for (const auto& [lo, hi] : covered) {
    if (next >= real_end || lo > next) break;
    next = std::max(next, hi);
  }
  if (next < real_end) {
    std::int64_t gap_end = real_end;
    for (const auto& [lo, hi] : covered) {
      if (lo > next) {
        gap_end = std::min(gap_end, lo);
        break;
      }
    }
    return Status(ErrorCode::kCorrupt,
                  fmt::format("elements [{}, {}) of '{}' (a unit of {} elements) are in none of "
                              "the checkpoint's {} state file(s)",
                              next, gap_end, name, unit.numel, impl_->files.size()),
                  impl_->dir);
  }
  return Status::ok();
}

Status consolidate_checkpoint(const CheckpointReader& reader, const std::string& out_dir,
                              kernels::DType dtype) {
  STRATA_ASSIGN_OR_RETURN(const model::ModelShape shape, reader.shape());
  const model::ModelLayout layout = model::build_layout(shape);
  std::int64_t largest = 0;
  for (const model::UnitLayout& unit : layout.units)
    largest = std::max(largest, unit.padded_numel);
  std::vector<float> buffer(static_cast<std::size_t>(largest));
  return model::save_hf_model(
      out_dir, shape, layout,
      [&](int u) -> Result<const float*> {
        const model::UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
        STRATA_TRY(reader.read(unit, tier::SlotKind::kMaster, 0, unit.padded_numel, buffer.data()));
        return static_cast<const float*>(buffer.data());
      },
      dtype);
}

Result<std::string> find_checkpoint(const std::string& path) {
  if (fs::exists(path + "/trainer_state.json")) return path;
  std::ifstream latest(path + "/latest");
  std::string name;
  if (latest >> name && name.find('/') == std::string::npos &&
      fs::exists(path + "/" + name + "/trainer_state.json")) {
    return path + "/" + name;
  }
  return Status(ErrorCode::kNotFound,
                "no checkpoint here: expected trainer_state.json, or a 'latest' file naming a "
                "checkpoint directory",
                path);
}

Result<TrainerCounters> read_checkpoint(const std::string& dir, TrainState& state,
                                        const model::ModelShape& shape,
                                        const std::string& precision, std::uint64_t seed) {
  STRATA_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::open(dir));
  const std::string meta_path = dir + "/trainer_state.json";
  STRATA_ASSIGN_OR_RETURN(const model::ModelShape saved, reader.shape());
  if (!model::same_model(saved, shape)) {
    return Status(ErrorCode::kInvalidArgument,
                  "the checkpoint is of a different model shape than strata.model describes",
                  meta_path);
  }
  if (reader.precision() != precision) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("the checkpoint was trained in {}, the config asks for {}; resume "
                              "with the same precision",
                              reader.precision(), precision),
                  meta_path);
  }
  if (reader.seed() != seed) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("the checkpoint was trained with seed {}, the config says {}; the "
                              "data order would differ",
                              reader.seed(), seed),
                  meta_path);
  }
  STRATA_ASSIGN_OR_RETURN(TrainerCounters counters, reader.counters());
  const model::ModelLayout& layout = state.layout();
  const tier::TierPlan& plan = state.tiers().plan();
  for (int u = 0; u < state.units(); ++u) {
    const model::UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
    const tier::UnitPlan& up = plan.units[static_cast<std::size_t>(u)];
    for (tier::SlotKind kind :
         {tier::SlotKind::kMaster, tier::SlotKind::kExpAvg, tier::SlotKind::kExpAvgSq}) {
      float* buffer = state.fill_buffer(kind, u);
      STRATA_TRY(reader.read(unit, kind, up.shard_begin, up.shard_numel, buffer));
      STRATA_TRY(state.store(kind, u, buffer));
    }
  }
  return counters;
}

}  // namespace strata::train

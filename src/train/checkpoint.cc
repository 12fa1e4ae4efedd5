// Checkpoint write and read (see checkpoint.h).
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <json/json.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "model/safetensors.h"

namespace strata::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "strata-checkpoint-1";
const char* const kKinds[3] = {"master", "exp_avg", "exp_avg_sq"};
const tier::SlotKind kSlotKinds[3] = {tier::SlotKind::kMaster, tier::SlotKind::kExpAvg,
                                      tier::SlotKind::kExpAvgSq};

Status write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return Status(ErrorCode::kIo, "cannot write", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status(ErrorCode::kIo, "cannot rename into place: " + ec.message(), path);
  return Status::ok();
}

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

}  // namespace

Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& c,
                                     TrainState& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed) {
  const std::string name = fmt::format("step_{:08d}", c.step);
  const std::string final_dir = root + "/" + name;
  const std::string tmp_dir = final_dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec)
    return Status(ErrorCode::kIo, "cannot create the checkpoint directory: " + ec.message(),
                  tmp_dir);

  // State homed on NVMe is streamed through the unit scratch, one unit and kind at a time.
  STRATA_TRY(state.finish_optimizer());
  std::vector<model::StTensorToWrite> tensors;
  std::vector<model::StProduceFn> producers;
  const model::ModelLayout& layout = state.layout();
  for (int u = 0; u < state.units(); ++u) {
    const model::UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
    for (int kind = 0; kind < 3; ++kind) {
      tensors.push_back(model::StTensorToWrite{
          unit.name + "." + kKinds[kind], model::StDType::kF32, {unit.padded_numel}, nullptr});
      producers.push_back([&state, u, kind, n = unit.padded_numel](const model::StWriteFn& write) {
        STRATA_ASSIGN_OR_RETURN(const float* data, state.view(kSlotKinds[kind], u));
        return write(data, static_cast<std::uint64_t>(n) * 4);
      });
    }
  }
  STRATA_TRY(model::write_safetensors(tmp_dir + "/state.safetensors", tensors,
                                      {{"format", kFormat}}, producers));

  Json::Value j(Json::objectValue);
  j["format"] = kFormat;
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
  j["seed"] = Json::UInt64(seed);
  j["precision"] = precision;
  j["model"] = model::hf_config_json(shape, "float32");
  Json::Value losses(Json::arrayValue);
  for (double l : c.recent_losses)
    losses.append(l);
  j["recent_losses"] = losses;
  Json::StreamWriterBuilder writer;
  writer["indentation"] = "  ";
  writer["precision"] = 17;
  STRATA_TRY(write_text(tmp_dir + "/trainer_state.json", Json::writeString(writer, j) + "\n"));

  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec)
    return Status(ErrorCode::kIo, "cannot rename the checkpoint into place: " + ec.message(),
                  final_dir);
  STRATA_TRY(write_text(root + "/latest", name + "\n"));
  return final_dir;
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
  const std::string meta_path = dir + "/trainer_state.json";
  STRATA_ASSIGN_OR_RETURN(Json::Value j, read_json(meta_path));
  if (j["format"].asString() != kFormat) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("format '{}' is not '{}'", j["format"].asString(), kFormat),
                  meta_path);
  }
  if (j["model"].asString() != model::hf_config_json(shape, "float32")) {
    return Status(ErrorCode::kInvalidArgument,
                  "the checkpoint is of a different model shape than strata.model describes",
                  meta_path);
  }
  if (j["precision"].asString() != precision) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("the checkpoint was trained in {}, the config asks for {}; resume "
                              "with the same precision",
                              j["precision"].asString(), precision),
                  meta_path);
  }
  if (j["seed"].asUInt64() != seed) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("the checkpoint was trained with seed {}, the config says {}; the "
                              "data order would differ",
                              j["seed"].asUInt64(), seed),
                  meta_path);
  }
  STRATA_ASSIGN_OR_RETURN(model::SafetensorsFile file,
                          model::SafetensorsFile::open(dir + "/state.safetensors"));
  const model::ModelLayout& layout = state.layout();
  for (int u = 0; u < state.units(); ++u) {
    const model::UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
    for (int kind = 0; kind < 3; ++kind) {
      float* buffer = state.fill_buffer(kSlotKinds[kind], u);
      STRATA_TRY(file.read_f32(unit.name + "." + kKinds[kind], {unit.padded_numel}, buffer));
      STRATA_TRY(state.store(kSlotKinds[kind], u, buffer));
    }
  }
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
                  meta_path);
  }
  return c;
}

}  // namespace strata::train

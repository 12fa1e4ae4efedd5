// Checkpoint writing, in three phases (see checkpoint.h); reading is in checkpoint_reader.cc.
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <json/json.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "comm/comm.h"
#include "common/assert.h"
#include "model/safetensors.h"

namespace strata::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "strata-checkpoint-2";
constexpr tier::SlotKind kStateKinds[3] = {tier::SlotKind::kMaster, tier::SlotKind::kExpAvg,
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

void check_who(const CheckpointRank& who) {
  STRATA_ASSERT(who.world >= 1 && who.rank >= 0 && who.rank < who.world && who.zero_stage >= 0 &&
                who.zero_stage <= 3);
}

// Checks that rank file `rank` of `files` is complete and says what it is.
Status check_state_file(const std::string& path, int rank, int files) {
  Result<model::SafetensorsFile> file = model::SafetensorsFile::open(path);
  if (!file.is_ok()) {
    return Status(file.status().code(),
                  fmt::format("the state file of rank {} of {} is missing or incomplete: {}", rank,
                              files, file.status().message()),
                  path);
  }
  const auto& meta = file->metadata();
  auto value = [&meta](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  if (value("format") != kFormat || value("rank") != std::to_string(rank) ||
      value("state_files") != std::to_string(files)) {
    return Status(
        ErrorCode::kCorrupt,
        fmt::format("metadata says format '{}', rank '{}' of '{}'; expected {}, rank {} "
                    "of {}",
                    value("format"), value("rank"), value("state_files"), kFormat, rank, files),
        path);
  }
  return Status::ok();
}

// Exchanges each rank's outcome of a phase: every rank gets this rank's own failure, else the
// first failed rank's error code with a message naming that rank.
Status agree(comm::Comm& comm, const Status& mine, const std::string& phase,
             const std::string& context) {
  std::vector<std::int32_t> codes(static_cast<std::size_t>(comm.world_size()), 0);
  const auto code = static_cast<std::int32_t>(mine.code());
  STRATA_ASSIGN_OR_RETURN(comm::Handle h,
                          comm.all_gather(&code, codes.data(), 1, comm::DataType::kI32));
  STRATA_TRY(comm.wait(h));
  if (!mine.is_ok()) return mine;
  for (int r = 0; r < comm.world_size(); ++r) {
    const std::int32_t c = codes[static_cast<std::size_t>(r)];
    if (c == 0) continue;
    const bool known = c > 0 && c <= static_cast<std::int32_t>(ErrorCode::kInternal);
    return Status(known ? static_cast<ErrorCode>(c) : ErrorCode::kInternal,
                  fmt::format("rank {} could not {} (its log says why)", r, phase), context);
  }
  return Status::ok();
}

}  // namespace

std::string state_file_name(int rank, int state_files) {
  return fmt::format("state-rank{:05d}-of-{:05d}.safetensors", rank, state_files);
}

std::string checkpoint_dir(const std::string& root, std::int64_t step) {
  return root + "/" + fmt::format("step_{:08d}", step);
}

Result<std::string> prepare_checkpoint(const std::string& root, std::int64_t step) {
  const std::string tmp_dir = checkpoint_dir(root, step) + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  if (ec)
    return Status(ErrorCode::kIo, "cannot remove a stale checkpoint: " + ec.message(), tmp_dir);
  fs::create_directories(tmp_dir, ec);
  if (ec)
    return Status(ErrorCode::kIo, "cannot create the checkpoint directory: " + ec.message(),
                  tmp_dir);
  return tmp_dir;
}

Status write_checkpoint_shard(const std::string& root, std::int64_t step, TrainState& state,
                              const CheckpointRank& who) {
  check_who(who);
  // State homed on NVMe is streamed through the unit scratch, one unit and kind at a time.
  STRATA_TRY(state.finish_optimizer());
  if (!who.writes()) return Status::ok();
  const std::string tmp_dir = checkpoint_dir(root, step) + ".tmp";
  if (!fs::is_directory(tmp_dir)) {
    return Status(ErrorCode::kNotFound,
                  "the checkpoint directory does not exist (rank 0's prepare_checkpoint must "
                  "complete first)",
                  tmp_dir);
  }
  const int files = who.state_files();
  std::map<std::string, std::string> metadata = {{"format", kFormat},
                                                 {"rank", std::to_string(who.rank)},
                                                 {"state_files", std::to_string(files)},
                                                 {"world_size", std::to_string(who.world)}};
  std::vector<model::StTensorToWrite> tensors;
  std::vector<model::StProduceFn> producers;
  const model::ModelLayout& layout = state.layout();
  const tier::TierPlan& plan = state.tiers().plan();
  for (int u = 0; u < state.units(); ++u) {
    const model::UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
    const tier::UnitPlan& up = plan.units[static_cast<std::size_t>(u)];
    if (files == 1 && (up.shard_begin != 0 || up.shard_numel != up.padded_numel)) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("ZeRO stage {} at world size {} keeps whole units, but this "
                                "state holds elements [{}, {}) of unit '{}' ({} elements)",
                                who.zero_stage, who.world, up.shard_begin,
                                up.shard_begin + up.shard_numel, unit.name, up.padded_numel),
                    tmp_dir);
    }
    metadata[unit.name + ".shard_begin"] = std::to_string(up.shard_begin);
    metadata[unit.name + ".padded_numel"] = std::to_string(up.padded_numel);
    for (tier::SlotKind kind : kStateKinds) {
      tensors.push_back(model::StTensorToWrite{unit.name + "." + tier::to_string(kind),
                                               model::StDType::kF32,
                                               {up.shard_numel},
                                               nullptr});
      producers.push_back([&state, u, kind, n = up.shard_numel](const model::StWriteFn& write) {
        STRATA_ASSIGN_OR_RETURN(const float* data, state.view(kind, u));
        return write(data, static_cast<std::uint64_t>(n) * 4);
      });
    }
  }
  return model::write_safetensors(tmp_dir + "/" + state_file_name(who.rank, files), tensors,
                                  metadata, producers);
}

Result<std::string> commit_checkpoint(const std::string& root, const TrainerCounters& c,
                                      const model::ModelShape& shape, const std::string& precision,
                                      std::uint64_t seed, const CheckpointRank& who) {
  check_who(who);
  STRATA_ASSERT(who.rank == 0);
  const std::string final_dir = checkpoint_dir(root, c.step);
  const std::string tmp_dir = final_dir + ".tmp";
  const int files = who.state_files();
  std::set<std::string> expected = {"trainer_state.json"};
  for (int r = 0; r < files; ++r) {
    const std::string name = state_file_name(r, files);
    STRATA_TRY(check_state_file(tmp_dir + "/" + name, r, files));
    expected.insert(name);
  }
  // Leftovers of an attempt that stopped midway (other world sizes, partial files) go.
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(tmp_dir, ec)) {
    if (expected.count(entry.path().filename().string()) == 0) {
      std::error_code ignored;
      fs::remove_all(entry.path(), ignored);
    }
  }
  if (ec) return Status(ErrorCode::kIo, "cannot list: " + ec.message(), tmp_dir);

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
  j["world_size"] = who.world;
  j["zero_stage"] = who.zero_stage;
  j["state_files"] = files;
  j["model"] = model::hf_config_json(shape, "");
  // Where the model came from: `strata convert` copies its tokenizer files from there.
  if (!shape.arch.source_dir.empty()) j["source_model"] = shape.arch.source_dir;
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
  STRATA_TRY(write_text(root + "/latest", fs::path(final_dir).filename().string() + "\n"));
  return final_dir;
}

Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     TrainState& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed) {
  const CheckpointRank who;
  STRATA_TRY(prepare_checkpoint(root, counters.step).status());
  STRATA_TRY(write_checkpoint_shard(root, counters.step, state, who));
  return commit_checkpoint(root, counters, shape, precision, seed, who);
}

Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     TrainState& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed,
                                     int zero_stage, comm::Comm& comm) {
  const CheckpointRank who{comm.rank(), comm.world_size(), zero_stage};
  const std::string dir = checkpoint_dir(root, counters.step);
  Status prepared = Status::ok();
  if (who.rank == 0) prepared = prepare_checkpoint(root, counters.step).status();
  STRATA_TRY(agree(comm, prepared, "prepare the checkpoint directory", dir + ".tmp"));
  const Status written = write_checkpoint_shard(root, counters.step, state, who);
  STRATA_TRY(agree(comm, written, "write its checkpoint shard", dir + ".tmp"));
  Status committed = Status::ok();
  if (who.rank == 0)
    committed = commit_checkpoint(root, counters, shape, precision, seed, who).status();
  STRATA_TRY(agree(comm, committed, "commit the checkpoint", dir));
  return dir;
}

}  // namespace strata::train

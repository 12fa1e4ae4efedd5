// Checkpoint writing, in three phases (see checkpoint.h); reading is in checkpoint_reader.cc,
// the checkpoint root (latest, rotation) in root.cc.
#include "checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "checkpoint/root.h"
#include "comm/comm.h"
#include "common/assert.h"
#include "common/durable_file.h"
#include "common/fault_points.h"
#include "model/safetensors.h"
#include "offload/slot_codec.h"

namespace strata::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr offload::SlotKind kStateKinds[3] = {
    offload::SlotKind::kMaster, offload::SlotKind::kExpAvg, offload::SlotKind::kExpAvgSq};

void check_who(const CheckpointRank& who) {
  STRATA_ASSERT(who.world >= 1 && who.rank >= 0 && who.rank < who.world && who.zero_stage >= 0 &&
                who.zero_stage <= 3);
}

// The identity a rank file's metadata carries.
std::map<std::string, std::string> identity(const CheckpointRank& who, std::int64_t step) {
  return {
      {"format", checkpoint_format(kCheckpointVersion)},  {"rank", std::to_string(who.rank)},
      {"state_files", std::to_string(who.state_files())}, {"world_size", std::to_string(who.world)},
      {"zero_stage", std::to_string(who.zero_stage)},     {"step", std::to_string(step)}};
}

// Checks that rank file `rank` is complete, is the one `digest` describes and says what it is.
Status check_state_file(const std::string& path, int rank, const CheckpointRank& who,
                        std::int64_t step, const StateFileDigest& digest) {
  const int files = who.state_files();
  Result<model::SafetensorsFile> file = model::SafetensorsFile::open(path);
  if (!file.is_ok()) {
    return Status(file.status().code(),
                  fmt::format("the state file of rank {} of {} is missing or incomplete: {}", rank,
                              files, file.status().message()),
                  path);
  }
  const auto& meta = file->metadata();
  for (const auto& [key, expected] :
       identity(CheckpointRank{rank, who.world, who.zero_stage}, step)) {
    auto it = meta.find(key);
    const std::string found = it == meta.end() ? "(missing)" : it->second;
    if (found != expected) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("metadata '{}' is '{}'; this checkpoint's rank {} of {} has '{}' "
                                "(a file of another checkpoint or run?)",
                                key, found, rank, files, expected),
                    path);
    }
  }
  if (digest.name != state_file_name(rank, files) || file->file_bytes() != digest.bytes ||
      file->header_xxh3() != digest.header_xxh3) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("the file ({} bytes) is not the one rank {} wrote ({} bytes, "
                              "header digest {:016x})",
                              file->file_bytes(), rank, digest.bytes, digest.header_xxh3),
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

// The tensor names of a rank file, in the order it writes them: each kind, and after an 8-bit
// moment its per-block absmax.
std::vector<std::string> tensor_names(const model::ModelLayout& layout,
                                      const offload::TierPlan& plan) {
  std::vector<std::string> names;
  for (const model::UnitLayout& unit : layout.units) {
    for (offload::SlotKind kind : kStateKinds) {
      names.push_back(unit.name + "." + offload::to_string(kind));
      if (offload::has_absmax(plan, kind)) names.push_back(names.back() + kAbsmaxSuffix);
    }
  }
  return names;
}

// The file's element type of a kind as stored (slot_codec.h).
model::StDType stored_st_dtype(const offload::TierPlan& plan, offload::SlotKind kind) {
  if (offload::has_absmax(plan, kind))
    return kind == offload::SlotKind::kExpAvg ? model::StDType::kI8 : model::StDType::kU8;
  return offload::value_bytes(plan, kind) == 2 ? model::StDType::kBF16 : model::StDType::kF32;
}

// Every rank's digest on rank 0, as a fixed-size row of int64 per rank: bytes, header digest,
// then one digest per tensor in tensor_names order (zeros for a rank that writes no file).
Result<std::vector<StateFileDigest>> gather_digests(comm::Comm& comm, const StateFileDigest& mine,
                                                    const model::ModelLayout& layout,
                                                    const offload::TierPlan& plan,
                                                    int state_files) {
  const std::vector<std::string> names = tensor_names(layout, plan);
  const std::size_t row = 2 + names.size();
  std::vector<std::int64_t> send(row, 0);
  if (!mine.name.empty()) {
    send[0] = static_cast<std::int64_t>(mine.bytes);
    send[1] = static_cast<std::int64_t>(mine.header_xxh3);
    for (std::size_t i = 0; i < names.size(); ++i) {
      auto it = mine.tensor_xxh3.find(names[i]);
      STRATA_ASSERT(it != mine.tensor_xxh3.end());
      send[2 + i] = static_cast<std::int64_t>(it->second);
    }
  }
  std::vector<std::int64_t> all(row * static_cast<std::size_t>(comm.world_size()), 0);
  STRATA_ASSIGN_OR_RETURN(comm::Handle h,
                          comm.all_gather(send.data(), all.data(), row, comm::DataType::kI64));
  STRATA_TRY(comm.wait(h));
  std::vector<StateFileDigest> digests;
  for (int r = 0; r < state_files; ++r) {
    const std::int64_t* p = all.data() + row * static_cast<std::size_t>(r);
    StateFileDigest d;
    d.name = state_file_name(r, state_files);
    d.bytes = static_cast<std::uint64_t>(p[0]);
    d.header_xxh3 = static_cast<std::uint64_t>(p[1]);
    for (std::size_t i = 0; i < names.size(); ++i)
      d.tensor_xxh3[names[i]] = static_cast<std::uint64_t>(p[2 + i]);
    digests.push_back(std::move(d));
  }
  return digests;
}

}  // namespace

std::string checkpoint_dir(const std::string& root, std::int64_t step) {
  return root + "/" + fmt::format("step_{:08d}", step);
}

std::int64_t first_invalid_value(offload::SlotKind kind, const float* data, std::int64_t n) {
  const bool non_negative = kind == offload::SlotKind::kExpAvgSq;
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(data[i]) || (non_negative && data[i] < 0.0f)) return i;
  }
  return -1;
}

Status check_final_masters(const model::UnitLayout& unit, const float* masters,
                           const std::string& dir) {
  const std::int64_t bad = first_invalid_value(offload::SlotKind::kMaster, masters, unit.numel);
  if (bad < 0) return Status::ok();
  return Status(ErrorCode::kCorrupt,
                fmt::format("the master weights of '{}' hold {} at element {}: the run diverged; "
                            "the final model is not written",
                            unit.name, masters[bad], bad),
                dir);
}

Result<std::string> prepare_checkpoint(const std::string& root, std::int64_t step) {
  const std::string tmp_dir = checkpoint_dir(root, step) + ".tmp";
  crash_point("checkpoint.prepare");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) {
    return Status(ErrorCode::kIo, "cannot create the checkpoint directory: " + ec.message(), root);
  }
  fs::remove_all(tmp_dir, ec);
  if (ec)
    return Status(ErrorCode::kIo, "cannot remove a stale checkpoint: " + ec.message(), tmp_dir);
  fs::create_directory(tmp_dir, ec);
  if (ec)
    return Status(ErrorCode::kIo, "cannot create the checkpoint directory: " + ec.message(),
                  tmp_dir);
  return tmp_dir;
}

Result<StateFileDigest> write_checkpoint_shard(const std::string& root, std::int64_t step,
                                               offload::OffloadStore& state,
                                               const CheckpointRank& who) {
  check_who(who);
  // State homed on NVMe is streamed through the unit scratch, one unit and kind at a time.
  STRATA_TRY(state.finish_optimizer());
  if (!who.writes()) return StateFileDigest{};
  const std::string tmp_dir = checkpoint_dir(root, step) + ".tmp";
  std::error_code ec;
  if (!fs::is_directory(tmp_dir, ec)) {
    return Status(ErrorCode::kNotFound,
                  "the checkpoint directory does not exist (rank 0's prepare_checkpoint must "
                  "complete first)",
                  tmp_dir);
  }
  const int files = who.state_files();
  std::map<std::string, std::string> metadata = identity(who, step);
  std::vector<model::StTensorToWrite> tensors;
  std::vector<model::StProduceFn> producers;
  const model::ModelLayout& layout = state.layout();
  const offload::TierPlan& plan = state.tiers().plan();
  const std::string path = tmp_dir + "/" + state_file_name(who.rank, files);
  for (int u = 0; u < state.units(); ++u) {
    const model::UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
    const offload::UnitPlan& up = plan.units[static_cast<std::size_t>(u)];
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
    for (offload::SlotKind kind : kStateKinds) {
      const std::string name = unit.name + "." + offload::to_string(kind);
      // As stored (fp32, bf16, or 8-bit codes and their absmax): a compressed state's checkpoint
      // is as small as the state, and resumes bit for bit.
      tensors.push_back(
          model::StTensorToWrite{name, stored_st_dtype(plan, kind), {up.shard_numel}, nullptr});
      producers.push_back([&, u, kind, name, begin = up.shard_begin, n = up.shard_numel,
                           tiles = up.tiles](const model::StWriteFn& write) -> Status {
        STRATA_ASSIGN_OR_RETURN(const float* data, state.view(kind, u));
        // A diverged or damaged state must not replace the last good checkpoint.
        const std::int64_t bad = first_invalid_value(kind, data, n);
        if (bad >= 0) {
          return Status(ErrorCode::kCorrupt,
                        fmt::format("'{}' holds {} at element {}; a checkpoint may not hold it, "
                                    "so the checkpoint of step {} is not written (the previous "
                                    "one stays where `latest` names it)",
                                    name, data[bad], begin + bad, step),
                        path);
        }
        if (offload::stored_as_fp32(plan, kind))
          return write(data, static_cast<std::uint64_t>(n) * 4);
        STRATA_ASSIGN_OR_RETURN(const void* stored, state.view_stored(kind, u));
        for (std::int64_t t = 0; t < tiles; ++t) {
          const std::int64_t tn = plan.tile_numel(u, t);
          STRATA_TRY(write(static_cast<const char*>(stored) + plan.tile_offset(kind, u, t),
                           static_cast<std::uint64_t>(tn) * offload::value_bytes(plan, kind)));
        }
        return Status::ok();
      });
      if (!offload::has_absmax(plan, kind)) continue;
      const std::int64_t blocks = up.shard_numel / plan.state.block;
      tensors.push_back(
          model::StTensorToWrite{name + kAbsmaxSuffix, model::StDType::kF32, {blocks}, nullptr});
      producers.push_back([&, u, kind, tiles = up.tiles](const model::StWriteFn& write) -> Status {
        STRATA_ASSIGN_OR_RETURN(const void* stored, state.view_stored(kind, u));
        for (std::int64_t t = 0; t < tiles; ++t) {
          const std::int64_t tn = plan.tile_numel(u, t);
          const offload::StoredTile tile = offload::stored_tile(
              plan, kind,
              const_cast<char*>(static_cast<const char*>(stored)) + plan.tile_offset(kind, u, t),
              tn);
          STRATA_TRY(write(tile.absmax, static_cast<std::uint64_t>(tn / plan.state.block) * 4));
        }
        return Status::ok();
      });
    }
  }
  model::StDigest digest;
  STRATA_TRY(model::write_safetensors(path, tensors, metadata, producers, &digest));
  StateFileDigest out;
  out.name = state_file_name(who.rank, files);
  out.bytes = digest.file_bytes;
  out.header_xxh3 = digest.header_xxh3;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    out.tensor_xxh3[tensors[i].name] = digest.tensor_xxh3[i];
  crash_point("checkpoint.shard_written");
  return out;
}

Result<std::string> commit_checkpoint(const std::string& root, const TrainerCounters& c,
                                      const model::ModelShape& shape, const std::string& precision,
                                      std::uint64_t seed, const CheckpointRank& who,
                                      const std::vector<StateFileDigest>& files) {
  check_who(who);
  STRATA_ASSERT(who.rank == 0);
  const std::string final_dir = checkpoint_dir(root, c.step);
  const std::string tmp_dir = final_dir + ".tmp";
  // The trainer's counters obey the manifest's invariants; a violation is a bug, not bad input.
  STRATA_TRY(check_counters(c, "the trainer's counters").with_context("checkpoint"));
  const int count = who.state_files();
  if (files.size() != static_cast<std::size_t>(count)) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{} digests for {} state files", files.size(), count), tmp_dir);
  }
  std::set<std::string> expected = {"trainer_state.json"};
  for (int r = 0; r < count; ++r) {
    const std::string name = state_file_name(r, count);
    STRATA_TRY(
        check_state_file(tmp_dir + "/" + name, r, who, c.step, files[static_cast<std::size_t>(r)]));
    expected.insert(name);
  }
  // Leftovers of an attempt that stopped midway (other world sizes, partial files) go.
  std::error_code ec;
  for (fs::directory_iterator it(tmp_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (expected.count(it->path().filename().string()) == 0) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }
  if (ec) return Status(ErrorCode::kIo, "cannot list: " + ec.message(), tmp_dir);

  CheckpointManifest m;
  m.counters = c;
  m.seed = seed;
  m.precision = precision;
  m.model_json = model::hf_config_json(shape, "");
  m.source_model = shape.arch.source_dir;
  m.world_size = who.world;
  m.zero_stage = who.zero_stage;
  m.state_files = count;
  m.files = files;
  STRATA_TRY(write_file_atomically(tmp_dir + "/trainer_state.json", render_checkpoint_manifest(m)));
  // Publishing: the step directory, then `latest`, each renamed into place and made durable.
  crash_point("checkpoint.publish");
  if (fs::exists(final_dir, ec)) fs::remove_all(final_dir, ec);
  if (ec) {
    return Status(ErrorCode::kIo, "cannot replace an older copy of this step: " + ec.message(),
                  final_dir);
  }
  STRATA_TRY(rename_durably(tmp_dir, final_dir));
  crash_point("checkpoint.latest");
  STRATA_TRY(
      write_file_atomically(root + "/latest", fs::path(final_dir).filename().string() + "\n"));
  crash_point("checkpoint.committed");
  return final_dir;
}

Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     offload::OffloadStore& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed,
                                     const CheckpointOptions& options) {
  const CheckpointRank who{0, 1, options.zero_stage};
  STRATA_TRY(prepare_checkpoint(root, counters.step).status());
  STRATA_ASSIGN_OR_RETURN(StateFileDigest digest,
                          write_checkpoint_shard(root, counters.step, state, who));
  STRATA_ASSIGN_OR_RETURN(std::string dir, commit_checkpoint(root, counters, shape, precision, seed,
                                                             who, {std::move(digest)}));
  STRATA_TRY(rotate_checkpoints(root, options.keep_last, counters.step));
  return dir;
}

Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     offload::OffloadStore& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed,
                                     const CheckpointOptions& options, comm::Comm& comm) {
  const CheckpointRank who{comm.rank(), comm.world_size(), options.zero_stage};
  const std::string dir = checkpoint_dir(root, counters.step);
  Status prepared = Status::ok();
  if (who.rank == 0) prepared = prepare_checkpoint(root, counters.step).status();
  STRATA_TRY(agree(comm, prepared, "prepare the checkpoint directory", dir + ".tmp"));
  Result<StateFileDigest> written = write_checkpoint_shard(root, counters.step, state, who);
  STRATA_TRY(agree(comm, written.status(), "write its checkpoint shard", dir + ".tmp"));
  STRATA_ASSIGN_OR_RETURN(
      const std::vector<StateFileDigest> digests,
      gather_digests(comm, *written, state.layout(), state.tiers().plan(), who.state_files()));
  Status committed = Status::ok();
  if (who.rank == 0) {
    committed = commit_checkpoint(root, counters, shape, precision, seed, who, digests).status();
    if (committed.is_ok()) committed = rotate_checkpoints(root, options.keep_last, counters.step);
  }
  STRATA_TRY(agree(comm, committed, "commit the checkpoint", dir));
  return dir;
}

}  // namespace strata::checkpoint

// Checkpoints of the trainer: everything a resumed run needs to continue bit-identically to one
// that never stopped, written by every rank of a data-parallel run and readable at any world size.
//
// Layout (format "strata-checkpoint-3"; manifest.h):
//   <root>/step_00000042/state-rank00000-of-00002.safetensors  rank 0's shard of every unit
//   <root>/step_00000042/state-rank00001-of-00002.safetensors  rank 1's shard
//   <root>/step_00000042/trainer_state.json   the manifest: counters, scheduler, loss scaler,
//                                             data position, seed, model shape, precision,
//                                             world_size, zero_stage, state_files, and each
//                                             state file's size and xxHash3 digests (header,
//                                             every tensor); checksummed itself (rank 0)
//   <root>/latest                             the name of the newest complete step dir
// A rank file holds, per unit, `<unit>.master`, `<unit>.exp_avg` and `<unit>.exp_avg_sq` (shape
// {shard_numel}, as strata.optimizer_state stores them: F32 by default, BF16, or 8-bit codes, I8
// for exp_avg and U8 for exp_avg_sq, each followed by `<name>.absmax`, F32 of shard_numel / block
// elements, the block size being shard_numel / that): elements [shard_begin, shard_begin +
// shard_numel) of the unit's flat padded buffer. Its safetensors metadata says which, and whose it
// is: "format", "rank", "state_files", "world_size", "zero_stage", "step", and per unit
// "<unit>.shard_begin" and
// "<unit>.padded_numel". With ZeRO stage >= 1 every rank writes its shard (state_files = world
// size); at stage 0 every rank holds whole units, so only rank 0 writes (state_files = 1). A
// world-1 run writes state-rank00000-of-00001. Formats 2 (rank files without digests) and 1 (one
// state.safetensors of whole units) still load, unverified.
//
// Readers map by element index within a unit, so a run resumes at any world size: elements no
// file covers must be padding (at or beyond the unit's numel) and read as zero; a real element
// that no file covers is an error naming the unit, kind and range. What they load is verified:
// each file's size, header digest and identity (step, rank, world size) against the manifest,
// each tensor's digest before its first use, and every value (finite; exp_avg_sq >= 0).
//
// Writing is three phases so that no rank sees a half-written checkpoint:
//   1. rank 0: prepare_checkpoint()  clears a stale step_N.tmp and creates it;
//   -- barrier --
//   2. every rank: write_checkpoint_shard()  checks its values (a non-finite master or moment is
//      refused, so a diverged state never replaces a good checkpoint), writes its rank file
//      atomically and durably (file.tmp, fsync, rename, fsync dir) and returns its digests;
//   -- barrier; the digests are gathered on rank 0 --
//   3. rank 0: commit_checkpoint()  checks every rank file against its digests, writes
//      trainer_state.json (fsync), renames step_N.tmp to step_N (fsync of the root), replaces
//      `latest` the same way, and removes checkpoints beyond keep_last.
// A crash anywhere leaves the previous checkpoint and `latest` intact; once `latest` names a
// step, that step's files are on stable storage (docs/reliability.md). The checkpoint directory
// must be one shared file system for all ranks (multi-node: NFS, Lustre, ...). The 16-bit device
// parameters are not stored: they are the masters rounded, recomputed on load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "common/status.h"
#include "model/model_spec.h"
#include "offload/offload_store.h"

namespace strata::comm {
class Comm;
}

namespace strata::checkpoint {

// Who writes a checkpoint: this rank, the world size and the ZeRO stage (0 at world size 1).
struct CheckpointRank {
  int rank = 0;
  int world = 1;
  int zero_stage = 0;
  // Rank files of the checkpoint: world when the optimizer state is partitioned, else 1.
  int state_files() const { return zero_stage >= 1 ? world : 1; }
  // Whether this rank writes a file.
  bool writes() const { return rank < state_files(); }
};

// The name suffix of an 8-bit moment's per-block absmax tensor.
inline constexpr const char* kAbsmaxSuffix = ".absmax";

// "<root>/step_00000042": where the checkpoint of `step` goes.
std::string checkpoint_dir(const std::string& root, std::int64_t step);

// The first element of `data[0, n)` a checkpoint may not hold as `kind`: a non-finite value, or
// a negative exp_avg_sq. -1 when there is none.
std::int64_t first_invalid_value(offload::SlotKind kind, const float* data, std::int64_t n);

// kCorrupt naming the unit, element and `dir` when the masters of `unit` (its numel elements)
// hold a non-finite value: a final model must not be written from them.
Status check_final_masters(const model::UnitLayout& unit, const float* masters,
                           const std::string& dir);

// Phase 1, rank 0 only: creates `root` when missing, removes a stale `<checkpoint_dir>.tmp` and
// creates it empty; returns it.
Result<std::string> prepare_checkpoint(const std::string& root, std::int64_t step);

// Phase 2, every rank (after phase 1 completed on rank 0): finishes the optimizer step in flight
// and writes this rank's shard of every unit into `<checkpoint_dir(root, step)>.tmp` (nothing
// when !who.writes(): the digest's name is then empty). `state` holds exactly `who.rank`'s shard
// (its plan was made for that rank). kCorrupt naming the unit, kind and element when a value may
// not be checkpointed (first_invalid_value); kNoSpace / kIo naming the file when it cannot be
// written.
Result<StateFileDigest> write_checkpoint_shard(const std::string& root, std::int64_t step,
                                               offload::OffloadStore& state,
                                               const CheckpointRank& who);

// Phase 3, rank 0 only (after phase 2 completed on every rank): checks that every rank file is
// there, whole and the one its digest describes (`files`: every rank's digest in rank order),
// writes trainer_state.json, renames the directory into place and updates `latest`; returns the
// checkpoint's directory. Errors name the missing or corrupt rank file.
Result<std::string> commit_checkpoint(const std::string& root, const TrainerCounters& counters,
                                      const model::ModelShape& shape, const std::string& precision,
                                      std::uint64_t seed, const CheckpointRank& who,
                                      const std::vector<StateFileDigest>& files);

struct CheckpointOptions {
  int zero_stage = 0;  // of the run (recorded; decides how many rank files there are)
  int keep_last = 0;   // after a commit, remove all but the newest keep_last checkpoints; 0 = none
};

// The three phases at world size 1 (no Comm needed); returns the checkpoint's directory.
Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     offload::OffloadStore& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed,
                                     const CheckpointOptions& options = {});

// The three phases on every rank of `comm`, with its collectives between them (each phase's
// outcome is exchanged, so one rank's failure fails every rank at once, naming that rank, instead
// of leaving the others in a barrier). Every rank returns the same result: the checkpoint's
// directory, or the first failure. Call on every rank with the same arguments but `state`.
Result<std::string> write_checkpoint(const std::string& root, const TrainerCounters& counters,
                                     offload::OffloadStore& state, const model::ModelShape& shape,
                                     const std::string& precision, std::uint64_t seed,
                                     const CheckpointOptions& options, comm::Comm& comm);

// The checkpoint directory `path` means: itself when it holds trainer_state.json, else the one
// its `latest` file names. kNotFound when neither; never follows `latest` out of `path`.
Result<std::string> find_checkpoint(const std::string& path);

// Loads a checkpoint taken at any world size into `state` (this rank's shard of the masters and
// moments, as its plan says; call refresh after) and returns its counters. Errors when the model
// shape, precision or seed differ from the run's, and name any missing, corrupt (failing a
// digest) or foreign (another step's) rank file and any value that may not be loaded.
Result<TrainerCounters> read_checkpoint(const std::string& dir, offload::OffloadStore& state,
                                        const model::ModelShape& shape,
                                        const std::string& precision, std::uint64_t seed);

}  // namespace strata::checkpoint

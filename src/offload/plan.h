// The tier plan: where every byte of training state lives and how much of each tier a run takes,
// decided once from the config, the model's unit layout and the budgets. The tier manager
// allocates exactly what the plan lists (tests compare the two), and `strata estimate` prints the
// same items, so the estimate and the run cannot disagree.
//
// Slots: each unit's shard (this rank's part of the unit's flat padded buffer; the whole unit at
// world size 1) holds five kinds of state, each with a home tier:
//   param       the parameters in the storage type (fp32, bf16 or fp16): offload_param.device
//               (units within max_in_cpu elements stay on the host when it says nvme);
//   master, exp_avg, exp_avg_sq, grad (fp32): offload_optimizer.device; Strata's optimizer runs
//               on the CPU, so "none" keeps them in host memory like "cpu" ("ratio" < 1 keeps the
//               first units' state on the host and offloads the rest).
// Optimizer work and NVMe extents are cut into tiles of `tile_elements` (sub_group_size rounded
// up to 2048 elements, so every tile is a whole number of 4 KiB pages in every dtype).
//
// Device frames: units whose parameters do not live on the device reach it through frames, one
// pool per size class (units of equal padded size share a class): a base frame per class (two
// where the tied head and the embedding share one), plus prefetch frames within
// stage3_prefetch_bucket_size, stage3_max_live_parameters and the device budget. Units below
// stage3_param_persistence_threshold get a frame of their own and stay resident.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/cpu/dtype.h"
#include "model/layout.h"
#include "offload/estimate.h"

namespace strata::offload {

enum class SlotKind : std::uint8_t { kParam = 0, kMaster, kExpAvg, kExpAvgSq, kGrad };
inline constexpr int kSlotKinds = 5;
// "param", "master", "exp_avg", "exp_avg_sq", "grad" (also the swap file kind names).
const char* to_string(SlotKind kind);

// Stagger between arrays that Adam reads together (docs/adam.md: arrays a multiple of 128 MiB
// apart run 2-6x slower on AMD Zen), and the unit of every pinned size.
inline constexpr std::uint64_t kStaggerBytes = 4096;
// Alignment of pinned staging areas (2 MiB: one transparent huge page, so a 1 MiB I/O block is
// one DMA segment, docs/io.md).
inline constexpr std::uint64_t kStagingAlignBytes = 2ull << 20;

struct UnitPlan {
  std::int64_t padded_numel = 0;  // the whole unit, as the device uses it
  std::int64_t shard_begin = 0;   // this rank's shard of the flat buffer, elements
  std::int64_t shard_numel = 0;   // master, exp_avg, exp_avg_sq (ZeRO >= 1 partitions them)
  std::int64_t param_numel = 0;   // parameters held by this rank (ZeRO 3: the shard, else all)
  std::int64_t grad_numel = 0;    // accumulated gradient (ZeRO >= 2: the shard, else all)
  Tier param_home = Tier::kDevice;
  Tier optim_home = Tier::kHost;  // master, exp_avg, exp_avg_sq and grad
  int size_class = 0;
  bool framed = false;      // parameters reach the device through frames
  bool persistent = false;  // framed, with a frame of its own that stays resident
  std::int64_t tiles = 0;   // optimizer tiles of the shard
  // Where this rank's shard starts within the parameter home (0 when the home holds only the
  // shard, as at stage 3).
  std::int64_t param_shard_offset() const { return param_numel > shard_numel ? shard_begin : 0; }
};

struct SizeClass {
  std::int64_t numel = 0;  // padded unit elements
  std::vector<int> units;  // members, in unit order
  int param_frames = 0;    // shared frames for the framed, non-persistent members
  int param_frames_base = 0;
  int compute_slots = 0;  // fp32 copies of 16-bit parameters
  int grad_frames = 0;    // fp32 gradient buffers (plus a storage-type copy for 16-bit)
  int grad_frames_base = 0;
};

struct PlanItem {
  Tier tier = Tier::kDevice;
  std::string what;
  std::uint64_t bytes = 0;
};

struct PlanInput {
  const config::Config* config = nullptr;
  const model::ModelLayout* layout = nullptr;
  int rank = 0;
  int world = 1;
  std::uint64_t activation_device_bytes = 0;  // the runner's device buffers
  std::uint64_t activation_host_bytes = 0;    // the runner's host checkpoints (activation_offload)
  std::uint64_t device_budget_bytes = 0;      // 0: no limit (prefetch frames as the config asks)
};

struct TierPlan {
  int rank = 0;  // this rank, of `world` data-parallel ranks
  int world = 1;
  int zero_stage = 0;  // zero_optimization.stage
  kernels::DType storage = kernels::DType::kF32;
  std::uint64_t storage_bytes = 4;
  std::int64_t tile_elements = 0;
  std::int64_t largest_unit = 0;   // padded elements
  std::int64_t largest_shard = 0;  // elements
  std::int64_t largest_tile = 0;   // elements: min(tile, largest shard)
  std::vector<UnitPlan> units;
  std::vector<SizeClass> classes;

  // Pinned host areas (counts; sizes in elements of their type).
  int param_staging_buffers = 0;  // NVMe -> host -> device parameter staging (storage type)
  std::int64_t param_staging_elements = 0;
  int grad_staging_buffers = 0;  // device -> host gradient staging (storage type)
  std::int64_t grad_staging_elements = 0;
  int pipeline_depth = 5;          // optimizer tiles in flight (strata.optimizer_pipeline_depth)
  bool pipeline_state = false;     // fp32 stage buffers for NVMe-homed optimizer state
  bool pipeline_copy_out = false;  // storage-type copy-out buffers (params not in host memory)
  int grad_write_buffers = 0;      // fp32 write-behind tiles for NVMe-homed gradients
  bool unit_scratch = false;       // one fp32 unit for loading, saving and initialising
  std::uint64_t swap_bytes[kSlotKinds] = {0, 0, 0, 0, 0};  // data bytes per kind on NVMe
  std::uint64_t swap_footer_bytes = 0;                     // one 4 KiB checksum block per NVMe tile

  std::vector<PlanItem> items;             // everything allocated, per tier
  std::uint64_t device_minimum_bytes = 0;  // the device working set with base frames only

  // Sum of the items of `tier`.
  std::uint64_t bytes(Tier tier) const;
  // Whether any slot of `kind` is homed on `tier`.
  bool uses(SlotKind kind, Tier tier) const;
  // Elements [begin, begin + n) of tile `t` of unit `u`, relative to the shard's start.
  std::int64_t tile_begin(int unit, std::int64_t t) const;
  std::int64_t tile_numel(int unit, std::int64_t t) const;
  // Bytes of the optimizer pipeline's staging area (0 when none).
  std::uint64_t pipeline_bytes() const;
  // Offsets within the pipeline area: stage s (0..depth-1), array a (0 master, 1 exp_avg,
  // 2 exp_avg_sq, 3 grad, 4 copy-out).
  std::uint64_t pipeline_offset(int stage, int array) const;
};

// How many equal shards the model layout is cut into (model::build_layout): the world size from
// ZeRO stage 1, else 1 (every rank holds whole units).
int layout_shards(const config::Config& c);

// The tier of `kind` for unit `u`.
Tier home_of(const TierPlan& plan, int unit, SlotKind kind);

// Lines for the start-up log: where each kind of state lives, tiles, frames, staging.
std::vector<std::string> describe_plan(const TierPlan& plan,
                                       const std::vector<std::string>& swap_dirs);

// The plan for `input`. kOutOfMemory naming strata.device_bytes_max when the device budget is
// below the minimum working set (the message names the minimum and what it is made of).
// The parameters' storage type for the config's precision (bf16, fp16 or fp32).
kernels::DType storage_of(const config::Config& c);

Result<TierPlan> make_plan(const PlanInput& input);

// The same plan without the budget check (for `strata estimate`, which reports verdicts).
TierPlan make_plan_unchecked(const PlanInput& input);

}  // namespace strata::offload

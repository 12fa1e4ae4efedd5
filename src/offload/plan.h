// The tier plan: where every byte of training state lives and how much of each tier a run takes,
// decided once from the plan's settings, the unit layout and the budgets. The tier manager
// allocates exactly what the plan lists (tests compare the two), and `strata estimate` prints the
// same items, so the estimate and the run cannot disagree.
//
// The settings (PlanSettings) are plain values: train/run_settings.h is the one place that fills
// them from the configuration, and everything downstream of the plan (the tier manager, the
// prefetch scheduler, the optimizer pipeline, the swap files) reads them from the plan, never
// from the configuration. A caller without a config (a binding, a test) fills them itself.
//
// Slots (tier.h): each unit's shard (this rank's part of the unit's flat padded buffer; the whole
// unit at world size 1) holds five kinds of state, each with a home tier:
//   param       settings.param_tier (units within param_host_elements_max elements stay on the
//               host when it says nvme);
//   master, exp_avg, exp_avg_sq, grad: settings.optim_tier. On the device (offload_optimizer
//               none) Adam runs there, on the backend's OptimizerOps, when device_optimizer allows
//               and the state fits the device budget beside the working set (else the plan homes
//               it on the host and says why in `notes`); on the host or NVMe CPU Adam runs
//               (optim_nvme_fraction < 1 keeps the first units' state on the host and offloads
//               the rest).
// Optimizer work and NVMe extents are cut into tiles of `tile_elements` (settings.tile_elements
// rounded up to 2048 elements, so every tile is a whole number of 4 KiB pages in every dtype).
//
// Device frames: units whose parameters do not live on the device reach it through frames, one
// pool per size class (units of equal padded size share a class): a base frame per class (two
// where the tied head and the embedding share one), plus prefetch frames within the prefetch
// limits and the device budget. Units below settings.persistence_threshold_elements get a frame of
// their own and stay resident.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/state_format.h"
#include "common/status.h"
#include "io/engine.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/state_codec.h"
#include "model/layout.h"
#include "offload/tier.h"

namespace strata::offload {

// Stagger between arrays that Adam reads together (docs/adam.md: arrays a multiple of 128 MiB
// apart run 2-6x slower on AMD Zen), and the unit of every pinned size.
inline constexpr std::uint64_t kStaggerBytes = 4096;
// Alignment of pinned staging areas (2 MiB: one transparent huge page, so a 1 MiB I/O block is
// one DMA segment, docs/io.md).
inline constexpr std::uint64_t kStagingAlignBytes = 2ull << 20;

// How far ahead the prefetch scheduler may fetch parameters, in elements (DeepSpeed's stage3_*
// limits): the plan sizes the device frames from them, the scheduler obeys them.
struct PrefetchLimits {
  std::uint64_t bucket_elements = 0;     // fetched ahead and not yet used (0: no prefetch)
  std::uint64_t live_elements_max = 0;   // on the device at once: in use, cached, in flight
  std::uint64_t reuse_distance_max = 0;  // a released unit stays cached if used again this soon
};

// The swap files: where they go and how they are read and written.
struct SwapSettings {
  std::vector<std::string> param_dirs;  // the parameters' NVMe folders (striped over them)
  std::vector<std::string> optim_dirs;  // the optimizer state's (the same list shares one space)
  bool checksum = false;                // a 4 KiB checksum block after every tile, verified on read
  std::uint64_t bytes_max = 0;          // the swap files at most (0: no limit)
  io::EngineOptions engine;             // the I/O engine's block size, queue depth, threads
};

// Whether optimizer state asked for on the device (optim_tier kDevice) goes there
// (strata.device_optimizer): auto = on a GPU when it fits, on = always, off = the host instead.
enum class DeviceOptimizer : std::uint8_t { kAuto, kOn, kOff };

// Everything the plan is decided from besides the model's layout, the rank and the budgets. The
// member defaults are neutral (nothing offloaded, nothing sized); train::plan_settings(config)
// gives the configuration's values, whose member initialisers hold Strata's defaults.
struct PlanSettings {
  int zero_stage = 0;  // ZeRO: from 1 optimizer state and gradients are sharded, at 3 parameters
  kernels::DType storage = kernels::DType::kF32;  // the parameters' type
  Tier param_tier = Tier::kDevice;                // the parameters' home
  std::uint64_t param_host_elements_max = 0;      // with param_tier nvme: kept on the host
  int param_staging_buffers = 0;                  // NVMe -> host -> device staging buffers
  std::uint64_t param_staging_elements = 0;       // each at least the largest NVMe unit
  Tier optim_tier = Tier::kHost;                  // master, moments, gradients
  DeviceOptimizer device_optimizer = DeviceOptimizer::kAuto;  // with optim_tier device
  StateFormat state;                 // how master, moments and gradients are stored (common/)
  std::uint64_t rounding_seed = 0;   // of the stochastic rounding of compressed state
  double optim_nvme_fraction = 1.0;  // with optim_tier nvme: the part offloaded
  std::uint64_t tile_elements = 0;   // optimizer and NVMe tile (rounded up)
  std::uint64_t persistence_threshold_elements = 0;  // smaller framed units stay resident
  int pipeline_depth = 0;                            // optimizer tiles in flight (3 to 16)
  PrefetchLimits prefetch;
  SwapSettings swap;
};

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
  // fp32 parameters homed on the host beside a host-homed master of the same extent: the master
  // array is the parameters' home (no second copy to keep equal).
  bool params_in_master = false;
  std::int64_t tiles = 0;  // optimizer tiles of the shard
  // Where the unit's norm weights and biases are kept apart in fp32 (UnitRanges), elements into
  // TierPlan::apart_numel; -1: none (fp32 parameters, the embedding, no matrices).
  std::int64_t apart_offset = -1;
  // The unit's id in its stochastic-rounding keys (kernels::rounding_key): its index, unless the
  // caller holds some of a larger set of units and names them by their ids there (a Python
  // optimizer shard: the bits match one process holding every unit).
  int rounding_id = 0;
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
  // The gradient frames carry the 16-bit copy a gradient leaves the device in: 16-bit storage and
  // a member whose gradient leaves (not homed on the device of the only rank, where it is rounded
  // and added in place, GradPath::add_on_device).
  bool grad_copy = false;
};

struct PlanItem {
  Tier tier = Tier::kDevice;
  std::string what;
  std::uint64_t bytes = 0;
};

struct PlanInput {
  PlanSettings settings;
  const model::ModelLayout* layout = nullptr;
  // A plan for caller-owned parameters (the Python optimizer): the units are the caller's tensors,
  // one process, no model runner. Parameters are homed on the host (where the step writes them);
  // nothing is framed, prefetched or staged and nothing lives on the device, so the plan lists
  // exactly the homes, the optimizer pipeline's stages and the unit scratch. ZeRO's stage and the
  // parameter tier of the settings do not apply.
  bool optimizer_only = false;
  // Each unit's UnitPlan::rounding_id, one per layout unit, >= 0 and distinct; empty: the units'
  // indices.
  std::vector<int> rounding_ids;
  int rank = 0;
  int world = 1;
  std::uint64_t activation_device_bytes = 0;  // the runner's device buffers
  std::uint64_t activation_host_bytes = 0;    // the runner's host checkpoints (activation_offload)
  std::uint64_t device_budget_bytes = 0;      // 0: no limit (prefetch frames as the config asks)
  // The backend's device memory is host memory (the CPU backend): device_optimizer auto keeps the
  // optimizer on the host there, where CPU Adam overlaps the next forward.
  bool device_is_host = false;
};

struct TierPlan {
  int rank = 0;  // this rank, of `world` data-parallel ranks
  int world = 1;
  int zero_stage = 0;  // zero_optimization.stage
  kernels::DType storage = kernels::DType::kF32;
  std::uint64_t storage_bytes = 4;
  StateFormat state;                // how master, moments and gradients are stored
  std::uint64_t rounding_seed = 0;  // of their stochastic rounding (kernels::rounding_key)
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
  int pipeline_depth = 0;          // optimizer tiles in flight (settings.pipeline_depth)
  bool pipeline_state = false;     // fp32 stage buffers for NVMe-homed optimizer state
  bool pipeline_copy_out = false;  // storage-type copy-out buffers (params not in host memory)
  int grad_write_buffers = 0;      // fp32 write-behind tiles for NVMe-homed gradients
  bool unit_scratch = false;       // one fp32 unit for loading, saving and initialising
  // Device fp32 elements holding every unit's norm weights and biases apart from the compute
  // copies (UnitPlan::apart_offset), with 16-bit parameters, a model runner and a device apart
  // from the host; 0 otherwise.
  std::int64_t apart_numel = 0;
  // With compressed state: a second scratch of the largest shard's slot as stored (state
  // decoded from / encoded into it; 0 otherwise).
  std::uint64_t raw_scratch_bytes = 0;
  std::uint64_t swap_bytes[kSlotKinds] = {0, 0, 0, 0, 0};  // data bytes per kind on NVMe
  std::uint64_t swap_footer_bytes = 0;                     // one 4 KiB checksum block per NVMe tile

  PrefetchLimits prefetch;  // what the prefetch scheduler obeys (from the settings)
  SwapSettings swap;        // what the tier manager builds the swap files with

  std::vector<PlanItem> items;             // everything allocated, per tier
  std::uint64_t device_minimum_bytes = 0;  // the device working set with base frames only
  std::vector<std::string> notes;          // choices the plan made that the user should know

  // Sum of the items of `tier`.
  std::uint64_t bytes(Tier tier) const;
  // Whether any slot of `kind` is homed on `tier`.
  bool uses(SlotKind kind, Tier tier) const;
  // Elements [begin, begin + n) of tile `t` of unit `u`, relative to the shard's start.
  std::int64_t tile_begin(int unit, std::int64_t t) const;
  std::int64_t tile_numel(int unit, std::int64_t t) const;
  // Bytes of n elements of `kind` as stored (parameters in the storage type; kQ8 moments: the
  // codes, then each block's absmax), without padding.
  std::uint64_t slot_bytes(SlotKind kind, std::int64_t n) const;
  // A tile as it is stored, in host memory as on NVMe: slot_bytes of its elements rounded up to
  // 4 KiB (so a tile is read from NVMe straight into its place). A slot's tiles lie one after
  // the other; only the kQ8 format is ever rounded.
  std::uint64_t tile_bytes(SlotKind kind, int unit, std::int64_t t) const;
  // Where tile t of a slot of unit u starts, in bytes from the slot's start.
  std::uint64_t tile_offset(SlotKind kind, int unit, std::int64_t t) const;
  // The slot's bytes (every tile of its shard).
  std::uint64_t shard_bytes(SlotKind kind, int unit) const;
  // Bytes of the training state of `kind` homed on `tier`, as stored: the parameters in the
  // storage type (none when they are the master), master, moments and gradients per
  // strata.optimizer_state (no staging, stagger or NVMe checksum footers).
  std::uint64_t state_bytes(Tier tier, SlotKind kind) const;
  // Bytes of the optimizer pipeline's staging area (0 when none).
  std::uint64_t pipeline_bytes() const;
  // Offsets within the pipeline area: stage s (0..depth-1), array a (0 master, 1 exp_avg,
  // 2 exp_avg_sq, 3 grad, 4 copy-out).
  std::uint64_t pipeline_offset(int stage, int array) const;
};

// The tier of `kind` for unit `u`.
Tier home_of(const TierPlan& plan, int unit, SlotKind kind);

// A unit's tensors by who reads them: the element ranges [begin[i], begin[i] + n[i]) that kernels
// other than GEMMs read (norm weights, biases: the tensors of other than two dimensions, each run
// of consecutive ones one range with the alignment gaps between them), packed at at[i] into
// apart_numel elements (each range 16-byte aligned) when kept apart, and the matrices
// [weights_begin[j], weights_begin[j] + weights_n[j]) only GEMMs read. The embedding unit (its
// table read by the lookup) has neither: it is widened whole.
struct UnitRanges {
  std::vector<std::int64_t> begin, n, at, weights_begin, weights_n;
  std::int64_t apart_numel = 0;
};
UnitRanges unit_ranges(const model::UnitLayout& unit);

// Whether unit u's gradient stays on the device: homed there (offload_optimizer none) on the only
// rank, it is added into its home in place (GradPath::add_on_device) and never leaves.
bool gradient_stays_on_device(const TierPlan& plan, int unit);

// Bytes of one gradient frame of class k: fp32, plus the storage-type copy where k.grad_copy.
std::uint64_t grad_frame_bytes(const TierPlan& plan, const SizeClass& k);

// Lines for the start-up log: where each kind of state lives, tiles, frames, staging.
std::vector<std::string> describe_plan(const TierPlan& plan,
                                       const std::vector<std::string>& swap_dirs);

// The plan for `input`. kOutOfMemory naming strata.device_bytes_max when the device budget is
// below the minimum working set (the message names the minimum and what it is made of; with
// device_optimizer on, the optimizer state counts in it).
Result<TierPlan> make_plan(const PlanInput& input);

// The same plan without the budget check (for `strata estimate`, which reports verdicts).
TierPlan make_plan_unchecked(const PlanInput& input);

}  // namespace strata::offload

// ZeRO's sharding, in one place (as FSDP2 keeps its collectives in one file): which part of every
// unit this rank owns, and every collective the engine makes over the data-parallel ranks.
//
// Geometry. A unit's flat padded buffer is cut into `world` equal shards of whole pages
// (kUnitPadElements), the last one shorter or empty; rank r owns [begin, begin + numel). What is
// sharded depends on the stage (DeepSpeed's meaning):
//   stage 0   nothing: every rank holds and updates whole units (gradients all-reduced);
//   stage 1/2 master weights, moments and the accumulated gradient (gradients reduce-scattered);
//             parameters stay whole on every rank's device and are re-gathered after an update;
//   stage 3   parameters too: each rank's home holds its shard, gathered into a frame at use.
// The plan (plan.h) takes its numbers from shard_of(); the model layout is cut into
// layout_shards() shards so that each is whole pages.
//
// Collectives, all on the ranks' Comm (NCCL on GPUs, MPI on the CPU), issued by every rank at the
// same point of the same order of uses, so they stay in step whatever the timing:
//   start_gather          stage 3: a unit's shards into its frame, at acquire (or one use ahead);
//   start_grad_reduction  a unit's gradient summed over the ranks as it leaves the device: the
//                         all-reduce of stage 0 or the reduce-scatter of stages 1-2-3;
//   regather_params       stage 1/2: the shards other ranks updated, into the device parameters,
//                         at the unit's first use after an update;
//   sum_over_ranks        between steps: the loss, the stop flag and the gradient norm's parts;
//   gather_unit           a whole unit of fp32 values (masters, to save the model) from shards.
// NCCL reduces device memory only, so the between-step collectives move host values through
// device memory: between steps the gradient frames are idle (every gradient has left the device
// by finish_backward(), the next micro-batch has not begun), and a class's first frame holds a
// whole unit in fp32. Call those between steps, on every rank in the same order.
#pragma once

#include <cstdint>
#include <string_view>

#include "comm/comm.h"
#include "offload/plan.h"

namespace strata::offload {

class TierManager;

struct ShardGeometry {
  std::int64_t begin = 0;        // the shard's first element within the unit
  std::int64_t numel = 0;        // master, moments and gradient held by this rank
  std::int64_t param_numel = 0;  // parameters held by this rank (stage 3: the shard, else all)
};

// This rank's part of a unit of `padded_numel` elements (the plan's numbers).
ShardGeometry shard_of(std::int64_t padded_numel, int rank, int world, int zero_stage);

// How many equal shards the model layout is cut into (model::build_layout): `world` from ZeRO
// stage 1 (each rank owns a shard of every unit), else 1 (every rank holds whole units).
int layout_shards(int zero_stage, int world);

// The collective type of a storage type.
comm::DataType comm_type(kernels::DType type);

class Sharding {
 public:
  // `comm`: the data-parallel ranks; may be null on one rank, and for a plan of several ranks
  // that only holds a rank's state (checkpoint tools, tests): the collectives assert one.
  Sharding(TierManager& tiers, comm::Comm* comm);

  int world() const { return plan_.world; }
  comm::Comm* comm() const { return comm_; }
  // Stage 1/2 on several ranks: unit u's device parameters are whole, but this rank updates only
  // its shard, so they are re-gathered after an update.
  bool regathers_params(int unit) const;

  // Starts the all-gather of unit u's parameter shards into `frame` (the unit's whole padded
  // buffer on the device; this rank's shard is in its place already).
  Result<comm::Handle> start_gather(int unit, void* frame);
  // Starts summing unit u's gradient over the ranks, in place in `copy` (its storage-type bytes on
  // the device): all-reduce at stage 0, reduce-scatter from stage 1 (this rank's shard is final).
  Result<comm::Handle> start_grad_reduction(int unit, void* copy);
  // Waits for a collective of unit u; an error names `what` and the unit.
  Status wait(comm::Handle handle, std::string_view what, int unit);
  // The shards the other ranks updated, into unit u's device parameters (blocking).
  Status regather_params(int unit);

  // values[0 .. count) (fp64, any host memory) summed over the ranks, in place; at most
  // max_sum_values().
  Status sum_over_ranks(double* values, int count);
  // How many fp64 values sum_over_ranks takes at once (the smallest gradient frame's bytes / 8).
  int max_sum_values() const;
  // The whole unit u of fp32 values (padded_numel elements) into `whole` (any host memory), from
  // every rank's `shard` (shard_numel elements, any host memory).
  Status gather_unit(int unit, const float* shard, float* whole);

 private:
  int smallest_class() const;

  TierManager& tiers_;
  const TierPlan& plan_;
  comm::Comm* comm_;
};

}  // namespace strata::offload

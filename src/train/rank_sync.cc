// Collectives over host data between steps (see rank_sync.h).
#include "train/rank_sync.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace strata::train {
namespace {

using offload::TierPlan;
using offload::UnitPlan;

// The idle gradient frame of `size_class` (see rank_sync.h).
float* idle_frame(offload::OffloadStore& store, int size_class) {
  return store.tiers().grad_frame(size_class, 0);
}

// The size class of the smallest units: its frame bounds what sum_over_ranks takes.
int smallest_class(const TierPlan& plan) {
  int smallest = 0;
  for (std::size_t k = 0; k < plan.classes.size(); ++k) {
    if (plan.classes[k].numel < plan.classes[static_cast<std::size_t>(smallest)].numel)
      smallest = static_cast<int>(k);
  }
  return smallest;
}

}  // namespace

int max_sum_values(const offload::OffloadStore& store) {
  const TierPlan& plan = store.plan();
  return static_cast<int>(plan.classes[static_cast<std::size_t>(smallest_class(plan))].numel / 2);
}

Status sum_over_ranks(offload::OffloadStore& store, comm::Comm& comm, double* values, int count) {
  STRATA_ASSERT(count >= 1 && count <= max_sum_values(store));
  backend::Backend& b = store.tiers().backend();
  void* frame = idle_frame(store, smallest_class(store.plan()));
  const auto bytes = static_cast<std::uint64_t>(count) * 8;
  STRATA_TRY(b.copy_async(backend::StreamKind::kCompute, frame, values, bytes));
  STRATA_TRY(b.synchronize(backend::StreamKind::kCompute));
  STRATA_ASSIGN_OR_RETURN(comm::Handle h,
                          comm.all_reduce(frame, frame, static_cast<std::uint64_t>(count),
                                          comm::DataType::kF64, comm::ReduceOp::kSum));
  STRATA_TRY(comm.wait(h).with_context("summing the loss and gradient norm over ranks"));
  return b.copy_async(backend::StreamKind::kCompute, values, frame, bytes);
}

Status gather_masters(offload::OffloadStore& store, comm::Comm* comm, int unit, float* whole) {
  const TierPlan& plan = store.plan();
  const UnitPlan& up = plan.units[static_cast<std::size_t>(unit)];
  STRATA_TRY(store.finish_optimizer());
  STRATA_ASSIGN_OR_RETURN(const float* shard, store.view(offload::SlotKind::kMaster, unit));
  if (comm == nullptr || plan.world == 1 || up.shard_numel == up.padded_numel) {
    std::memcpy(whole, shard, static_cast<std::size_t>(up.padded_numel) * 4);
    return Status::ok();
  }
  backend::Backend& b = store.tiers().backend();
  float* frame = idle_frame(store, up.size_class);
  STRATA_TRY(b.copy_async(backend::StreamKind::kCompute, frame + up.shard_begin, shard,
                          static_cast<std::uint64_t>(up.shard_numel) * 4));
  STRATA_TRY(b.synchronize(backend::StreamKind::kCompute));
  STRATA_ASSIGN_OR_RETURN(
      comm::Handle h,
      comm->all_gather(frame + up.shard_begin, frame, static_cast<std::uint64_t>(up.shard_numel),
                       comm::DataType::kF32));
  STRATA_TRY(comm->wait(h).with_context(
      fmt::format("gathering the master weights of {}",
                  store.layout().units[static_cast<std::size_t>(unit)].name)));
  return b.copy_async(backend::StreamKind::kCompute, whole, frame,
                      static_cast<std::uint64_t>(up.padded_numel) * 4);
}

}  // namespace strata::train

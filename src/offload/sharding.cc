// ZeRO's sharding: geometry and the engine's collectives (see sharding.h).
#include "offload/sharding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/units.h"
#include "offload/tier_manager.h"

namespace strata::offload {
namespace {

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

}  // namespace

ShardGeometry shard_of(std::int64_t padded_numel, int rank, int world, int zero_stage) {
  STRATA_ASSERT(world >= 1 && rank >= 0 && rank < world);
  ShardGeometry g;
  if (zero_stage < 1) {
    g.numel = padded_numel;
    g.param_numel = padded_numel;
    return g;
  }
  const std::int64_t shard = static_cast<std::int64_t>(
      align_up(u64((padded_numel + world - 1) / world), model::kUnitPadElements));
  g.begin = std::min(padded_numel, shard * rank);
  g.numel = std::min(shard, padded_numel - g.begin);
  g.param_numel = zero_stage >= 3 ? g.numel : padded_numel;
  return g;
}

int layout_shards(int zero_stage, int world) {
  return zero_stage >= 1 ? std::max(world, 1) : 1;
}

comm::DataType comm_type(kernels::DType type) {
  switch (type) {
    case kernels::DType::kBF16:
      return comm::DataType::kBF16;
    case kernels::DType::kF16:
      return comm::DataType::kF16;
    default:
      return comm::DataType::kF32;
  }
}

Sharding::Sharding(TierManager& tiers, comm::Comm* comm)
    : tiers_(tiers), plan_(tiers.plan()), comm_(comm) {
  STRATA_ASSERT(comm == nullptr || comm->world_size() == plan_.world);
}

bool Sharding::regathers_params(int unit) const {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  return plan_.world > 1 && !up.framed && up.shard_numel < up.padded_numel;
}

Result<comm::Handle> Sharding::start_gather(int unit, void* frame) {
  STRATA_ASSERT_MSG(comm_ != nullptr, "stage 3 on several ranks needs their Comm");
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  auto* base = static_cast<char*>(frame);
  return comm_->all_gather(base + u64(up.shard_begin) * plan_.storage_bytes, base,
                           u64(up.shard_numel), comm_type(plan_.storage));
}

Result<comm::Handle> Sharding::start_grad_reduction(int unit, void* copy) {
  STRATA_ASSERT_MSG(comm_ != nullptr, "gradients on several ranks need their Comm");
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  // In place, in the type the gradient leaves in (the fold of comm.h: fp32 arithmetic in rank
  // order). Stage 0 keeps every unit whole on every rank; from stage 1 each rank keeps its shard.
  auto* base = static_cast<char*>(copy);
  const comm::DataType type = comm_type(plan_.storage);
  if (plan_.zero_stage == 0) {
    return comm_->all_reduce(base, base, u64(up.padded_numel), type, comm::ReduceOp::kSum);
  }
  return comm_->reduce_scatter(base, base + u64(up.shard_begin) * plan_.storage_bytes,
                               u64(up.shard_numel), type, comm::ReduceOp::kSum);
}

Status Sharding::wait(comm::Handle handle, std::string_view what, int unit) {
  return comm_->wait(handle).with_context(
      fmt::format("{} of {}", what, tiers_.layout().units[static_cast<std::size_t>(unit)].name));
}

Status Sharding::regather_params(int unit) {
  STRATA_ASSERT_MSG(comm_ != nullptr, "parameters on several ranks need their Comm");
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  auto* base = static_cast<char*>(tiers_.device_param(unit));
  STRATA_ASSIGN_OR_RETURN(comm::Handle h,
                          comm_->all_gather(base + u64(up.shard_begin) * plan_.storage_bytes, base,
                                            u64(up.shard_numel), comm_type(plan_.storage)));
  return wait(h, "gathering the parameters", unit);
}

int Sharding::smallest_class() const {
  int smallest = 0;
  for (std::size_t k = 0; k < plan_.classes.size(); ++k) {
    if (plan_.classes[k].numel < plan_.classes[static_cast<std::size_t>(smallest)].numel)
      smallest = static_cast<int>(k);
  }
  return smallest;
}

int Sharding::max_sum_values() const {
  return static_cast<int>(plan_.classes[static_cast<std::size_t>(smallest_class())].numel / 2);
}

Status Sharding::sum_over_ranks(double* values, int count) {
  STRATA_ASSERT(count >= 1 && count <= max_sum_values());
  STRATA_ASSERT_MSG(comm_ != nullptr, "sums over ranks need their Comm");
  backend::Backend& b = tiers_.backend();
  void* frame = tiers_.grad_frame(smallest_class(), 0);
  const auto bytes = static_cast<std::uint64_t>(count) * 8;
  STRATA_TRY(b.copy_async(backend::StreamKind::kCompute, frame, values, bytes));
  STRATA_TRY(b.synchronize(backend::StreamKind::kCompute));
  STRATA_ASSIGN_OR_RETURN(
      comm::Handle h,
      comm_->all_reduce(frame, frame, u64(count), comm::DataType::kF64, comm::ReduceOp::kSum));
  STRATA_TRY(comm_->wait(h).with_context("summing the loss and gradient norm over ranks"));
  return b.copy_async(backend::StreamKind::kCompute, values, frame, bytes);
}

Status Sharding::gather_unit(int unit, const float* shard, float* whole) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  if (comm_ == nullptr || plan_.world == 1 || up.shard_numel == up.padded_numel) {
    std::memcpy(whole, shard, static_cast<std::size_t>(up.padded_numel) * 4);
    return Status::ok();
  }
  backend::Backend& b = tiers_.backend();
  float* frame = tiers_.grad_frame(up.size_class, 0);
  STRATA_TRY(b.copy_async(backend::StreamKind::kCompute, frame + up.shard_begin, shard,
                          u64(up.shard_numel) * 4));
  STRATA_TRY(b.synchronize(backend::StreamKind::kCompute));
  STRATA_ASSIGN_OR_RETURN(
      comm::Handle h,
      comm_->all_gather(frame + up.shard_begin, frame, u64(up.shard_numel), comm::DataType::kF32));
  STRATA_TRY(wait(h, "gathering the master weights", unit));
  return b.copy_async(backend::StreamKind::kCompute, whole, frame, u64(up.padded_numel) * 4);
}

}  // namespace strata::offload

// The in-memory trainer's state (see train_state.h).
#include "train/train_state.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/cpu/cast.h"
#include "kernels/cpu/nn_ops.h"

namespace strata::train {

TrainState::TrainState(backend::Backend& backend, const model::ModelLayout& layout,
                       kernels::DType storage)
    : backend_(backend), layout_(layout), storage_(storage) {}

TrainState::~TrainState() {
  if (copied_.valid()) backend_.destroy_event(copied_);
  if (computed_.valid()) backend_.destroy_event(computed_);
}

Result<std::unique_ptr<TrainState>> TrainState::create(backend::Backend& backend,
                                                       const model::ModelLayout& layout,
                                                       kernels::DType storage) {
  std::unique_ptr<TrainState> s(new TrainState(backend, layout, storage));
  const std::uint64_t storage_bytes = kernels::dtype_bytes(storage);
  std::int64_t largest = 0;
  for (int u = 0; u < s->units(); ++u) {
    largest = std::max(largest, layout.units[static_cast<std::size_t>(u)].padded_numel);
    DeviceUnit d;
    STRATA_ASSIGN_OR_RETURN(d.params,
                            backend.allocate_device(s->unit_bytes(u, storage_bytes), "parameters"));
    STRATA_ASSIGN_OR_RETURN(d.grad, backend.allocate_device(s->unit_bytes(u, 4), "gradients"));
    backend.ops_f32().zero(d.grad.as<float>(),
                           layout.units[static_cast<std::size_t>(u)].padded_numel);
    s->device_.push_back(std::move(d));
    HostUnit h;
    const std::uint64_t stride = s->unit_bytes(u, 4) + 4096;
    STRATA_ASSIGN_OR_RETURN(h.block,
                            backend.allocate_pinned(4 * stride, "master weights and Adam state"));
    for (int k = 0; k < 4; ++k) {
      h.arrays[k] =
          reinterpret_cast<float*>(h.block.as<char>() + static_cast<std::uint64_t>(k) * stride);
    }
    s->host_.push_back(std::move(h));
  }
  const std::uint64_t largest_bytes = static_cast<std::uint64_t>(largest);
  if (storage != kernels::DType::kF32) {
    for (ComputeSlot& slot : s->slots_) {
      STRATA_ASSIGN_OR_RETURN(slot.buffer,
                              backend.allocate_device(largest_bytes * 4, "fp32 parameter copies"));
    }
  }
  STRATA_ASSIGN_OR_RETURN(s->device_staging_, backend.allocate_device(largest_bytes * storage_bytes,
                                                                      "gradient staging"));
  STRATA_ASSIGN_OR_RETURN(
      s->host_staging_,
      backend.allocate_pinned(largest_bytes * std::max<std::uint64_t>(storage_bytes, 4),
                              "transfer staging"));
  STRATA_ASSIGN_OR_RETURN(s->copied_, backend.create_event());
  STRATA_ASSIGN_OR_RETURN(s->computed_, backend.create_event());
  s->zero_moments();
  for (int u = 0; u < s->units(); ++u) {
    const std::int64_t n = layout.units[static_cast<std::size_t>(u)].padded_numel;
    std::fill(s->master(u), s->master(u) + n, 0.0f);
    std::fill(s->grad_accumulator(u), s->grad_accumulator(u) + n, 0.0f);
  }
  return s;
}

void TrainState::zero_moments() {
  for (int u = 0; u < units(); ++u) {
    const std::int64_t n = layout_.units[idx(u)].padded_numel;
    std::fill(exp_avg(u), exp_avg(u) + n, 0.0f);
    std::fill(exp_avg_sq(u), exp_avg_sq(u) + n, 0.0f);
  }
}

Status TrainState::copy_and_wait(backend::StreamKind stream, void* dst, const void* src,
                                 std::uint64_t bytes) {
  STRATA_TRY(backend_.copy_async(stream, dst, src, bytes));
  STRATA_TRY(backend_.record(copied_, stream));
  return backend_.synchronize(copied_);
}

Status TrainState::upload_params() {
  for (ComputeSlot& slot : slots_)
    slot.unit = -1;
  for (int u = 0; u < units(); ++u) {
    const std::int64_t n = layout_.units[idx(u)].padded_numel;
    const void* src = master(u);
    if (storage_ != kernels::DType::kF32) {
      kernels::cast_array(host_staging_.data(), storage_, master(u), kernels::DType::kF32, n);
      src = host_staging_.data();
    }
    STRATA_TRY(copy_and_wait(backend::StreamKind::kHostToDevice, device_[idx(u)].params.data(), src,
                             unit_bytes(u, kernels::dtype_bytes(storage_))));
  }
  return Status::ok();
}

double TrainState::grad_sum_squares() const {
  double total = 0.0;
  for (int u = 0; u < units(); ++u) {
    total += kernels::sum_squares(host_[idx(u)].arrays[3], layout_.units[idx(u)].padded_numel);
  }
  return total;
}

Status TrainState::optimizer_step(optim::AdamOptimizer& adam, double lr, double grad_multiplier,
                                  std::int64_t step) {
  for (ComputeSlot& slot : slots_)
    slot.unit = -1;
  const bool copy = storage_ != kernels::DType::kF32;
  for (int u = 0; u < units(); ++u) {
    optim::AdamUpdate update;
    update.master = master(u);
    update.exp_avg = exp_avg(u);
    update.exp_avg_sq = exp_avg_sq(u);
    update.grad = grad_accumulator(u);
    update.n = layout_.units[idx(u)].padded_numel;
    update.lr = lr;
    update.grad_multiplier = grad_multiplier;
    update.step = step;
    update.copy_out = copy ? host_staging_.data() : nullptr;
    update.copy_dtype = storage_;
    adam.update(update);
    STRATA_TRY(copy_and_wait(backend::StreamKind::kHostToDevice, device_[idx(u)].params.data(),
                             copy ? host_staging_.data() : static_cast<const void*>(master(u)),
                             unit_bytes(u, kernels::dtype_bytes(storage_))));
  }
  return Status::ok();
}

Result<const float*> TrainState::acquire_params(int unit) {
  DeviceUnit& d = device_[idx(unit)];
  if (storage_ == kernels::DType::kF32) return d.params.as<const float>();
  for (ComputeSlot& slot : slots_) {
    if (slot.unit == unit) {
      ++slot.users;
      return slot.buffer.as<const float>();
    }
  }
  for (ComputeSlot& slot : slots_) {
    if (slot.users == 0) {
      backend_.ops_f32().cast_from(slot.buffer.as<float>(), d.params.data(), storage_,
                                   layout_.units[idx(unit)].padded_numel);
      slot.unit = unit;
      slot.users = 1;
      return slot.buffer.as<const float>();
    }
  }
  return Status(ErrorCode::kInternal,
                fmt::format("unit {} needs an fp32 parameter copy but both slots are in use",
                            layout_.units[idx(unit)].name));
}

void TrainState::release_params(int unit) {
  if (storage_ == kernels::DType::kF32) return;
  for (ComputeSlot& slot : slots_) {
    if (slot.unit == unit && slot.users > 0) {
      --slot.users;
      return;
    }
  }
  STRATA_ASSERT_MSG(false, "release_params of a unit that was not acquired");
}

Result<float*> TrainState::acquire_grads(int unit) {
  return device_[idx(unit)].grad.as<float>();
}

Status TrainState::grads_ready(int unit) {
  DeviceUnit& d = device_[idx(unit)];
  const std::int64_t n = layout_.units[idx(unit)].padded_numel;
  const void* device_src = d.grad.data();
  if (storage_ != kernels::DType::kF32) {
    // The gradient leaves the device in the parameters' type, as a 16-bit .grad would.
    backend_.ops_f32().cast_to(device_staging_.data(), storage_, d.grad.as<float>(), n);
    device_src = device_staging_.data();
  }
  // The copy stream must not start before the compute stream has finished the gradient (on a GPU
  // the two run concurrently).
  STRATA_TRY(backend_.record(computed_, backend::StreamKind::kCompute));
  STRATA_TRY(backend_.wait(backend::StreamKind::kDeviceToHost, computed_));
  STRATA_TRY(copy_and_wait(backend::StreamKind::kDeviceToHost, host_staging_.data(), device_src,
                           unit_bytes(unit, kernels::dtype_bytes(storage_))));
  kernels::accumulate_from(grad_accumulator(unit), host_staging_.data(), storage_, n,
                           first_micro_batch_);
  backend_.ops_f32().zero(d.grad.as<float>(), n);
  return Status::ok();
}

}  // namespace strata::train

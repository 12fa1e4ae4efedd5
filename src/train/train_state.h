// All training state of the in-memory trainer (ZeRO stage 0, one rank), unit by unit:
//   device (backend arena): the parameters in their storage type (fp32, bf16 or fp16), an fp32
//     gradient buffer per unit, fp32 compute copies of 16-bit parameters (two slots: a block, or
//     the head plus the tied embedding) and a staging buffer for the gradient's trip to the host;
//   host (pinned): fp32 master weights, Adam's exp_avg and exp_avg_sq, the fp32 gradient
//     accumulator, and a staging buffer for the parameters' trip back.
// It is the runner's UnitStore: when a unit's gradient is complete, it leaves the device once, in
// the parameters' storage type (so fp16 gradients overflow as DeepSpeed's do), through the
// device->host stream, and is accumulated in fp32 on the host. The optimizer then updates the
// masters and sends the new 16-bit parameters back through the host->device stream.
// Everything is allocated at creation; the step loop allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kernels/cpu/dtype.h"
#include "model/layout.h"
#include "model/runner.h"
#include "optim/adam_optimizer.h"

namespace strata::train {

class TrainState final : public model::UnitStore<float> {
 public:
  // Allocates every buffer; kOutOfMemory naming the budget when something does not fit.
  static Result<std::unique_ptr<TrainState>> create(backend::Backend& backend,
                                                    const model::ModelLayout& layout,
                                                    kernels::DType storage);
  ~TrainState() override;

  const model::ModelLayout& layout() const { return layout_; }
  kernels::DType storage() const { return storage_; }
  int units() const { return static_cast<int>(layout_.units.size()); }

  // Host state of unit u (padded_numel floats each).
  float* master(int unit) { return host_[idx(unit)].arrays[0]; }
  float* exp_avg(int unit) { return host_[idx(unit)].arrays[1]; }
  float* exp_avg_sq(int unit) { return host_[idx(unit)].arrays[2]; }
  float* grad_accumulator(int unit) { return host_[idx(unit)].arrays[3]; }

  // Rounds every master to the storage type and copies it to the device parameters.
  Status upload_params();
  // Zeroes the moments (a fresh optimizer).
  void zero_moments();
  // The next micro-batch's gradients overwrite the accumulators instead of adding to them.
  void begin_accumulation() { first_micro_batch_ = true; }
  // Called after the last micro-batch of a step.
  void end_micro_batch() { first_micro_batch_ = false; }
  // Sum of squares of every accumulated gradient, units in order (inf/NaN when any is).
  double grad_sum_squares() const;
  // One optimizer step over every unit, then the new parameters to the device.
  Status optimizer_step(optim::AdamOptimizer& adam, double lr, double grad_multiplier,
                        std::int64_t step);

  // UnitStore.
  Result<const float*> acquire_params(int unit) override;
  void release_params(int unit) override;
  Result<float*> acquire_grads(int unit) override;
  Status grads_ready(int unit) override;

 private:
  // A unit's four host arrays (master, exp_avg, exp_avg_sq, gradient) share one pinned
  // mapping; array k starts at k * (unit bytes + 4 KiB), so no two are a multiple of 128 MiB
  // apart (Adam runs 2-6x slower on such arrays on AMD Zen, docs/adam.md) and each stays 4 KiB
  // aligned for direct I/O.
  struct HostUnit {
    backend::Buffer block;
    float* arrays[4] = {nullptr, nullptr, nullptr, nullptr};
  };
  struct DeviceUnit {
    backend::Buffer params;  // storage type
    backend::Buffer grad;    // fp32
  };
  struct ComputeSlot {
    backend::Buffer buffer;
    int unit = -1;
    int users = 0;
  };

  TrainState(backend::Backend& backend, const model::ModelLayout& layout, kernels::DType storage);
  std::size_t idx(int unit) const {
    STRATA_ASSERT(unit >= 0 && unit < units());
    return static_cast<std::size_t>(unit);
  }
  std::uint64_t unit_bytes(int unit, std::uint64_t element_bytes) const {
    return static_cast<std::uint64_t>(layout_.units[idx(unit)].padded_numel) * element_bytes;
  }
  Status copy_and_wait(backend::StreamKind stream, void* dst, const void* src, std::uint64_t bytes);

  backend::Backend& backend_;
  model::ModelLayout layout_;
  kernels::DType storage_;
  std::vector<HostUnit> host_;
  std::vector<DeviceUnit> device_;
  ComputeSlot slots_[2];
  backend::Buffer device_staging_;  // a unit's gradient in the storage type
  backend::Buffer host_staging_;    // a unit's gradient or new parameters in the storage type
  backend::Event copied_;
  backend::Event computed_;  // the gradient's compute-stream work, waited for by its copy
  bool first_micro_batch_ = true;
};

}  // namespace strata::train

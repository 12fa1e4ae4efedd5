// ResidentStore: the simplest UnitStore, every unit's parameters and gradient held on the device
// in the compute type T. Used by tests, benchmarks and `strata eval`; the trainer uses its own
// store (16-bit parameter storage, gradients leaving the device once per micro-batch).
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/runner.h"

namespace strata::model {

template <typename T>
class ResidentStore final : public UnitStore<T> {
 public:
  // Allocates params and grads for every unit of `layout` (padded), zeroed when it returns (so a
  // caller on a backend whose device memory is host memory may fill them at once).
  static Result<std::unique_ptr<ResidentStore>> create(backend::Backend& backend,
                                                       const ModelLayout& layout) {
    std::unique_ptr<ResidentStore> store(new ResidentStore());
    store->ops_ = backend.ops<T>();
    for (const UnitLayout& unit : layout.units) {
      const std::uint64_t bytes = static_cast<std::uint64_t>(unit.padded_numel) * sizeof(T);
      STRATA_ASSIGN_OR_RETURN(backend::Buffer p, backend.allocate_device(bytes, "parameters"));
      STRATA_ASSIGN_OR_RETURN(backend::Buffer g, backend.allocate_device(bytes, "gradients"));
      store->ops_->zero(p.template as<T>(), unit.padded_numel);
      store->ops_->zero(g.template as<T>(), unit.padded_numel);
      store->numel_.push_back(unit.padded_numel);
      store->params_.push_back(std::move(p));
      store->grads_.push_back(std::move(g));
      store->fresh_.push_back(false);
    }
    STRATA_TRY(backend.synchronize(backend::StreamKind::kCompute));
    return store;
  }

  T* params(int unit) { return params_[static_cast<std::size_t>(unit)].template as<T>(); }
  T* grads(int unit) { return grads_[static_cast<std::size_t>(unit)].template as<T>(); }
  // Zeroes every gradient (the start of an accumulation).
  void zero_grads() {
    for (std::size_t u = 0; u < grads_.size(); ++u) {
      ops_->zero(grads_[u].template as<T>(), numel_[u]);
      fresh_[u] = false;
    }
  }
  // How many times grads_ready(u) was called.
  int ready_count(int unit) const { return ready_[static_cast<std::size_t>(unit)]; }

  Result<const T*> acquire_params(int unit) override { return params(unit); }
  void release_params(int) override {}
  // Gradients accumulate across micro-batches until zero_grads().
  Result<T*> acquire_grads(int unit) override { return grads(unit); }
  Status grads_ready(int unit) override {
    if (ready_.size() <= static_cast<std::size_t>(unit)) ready_.resize(unit + 1, 0);
    ++ready_[static_cast<std::size_t>(unit)];
    return Status::ok();
  }

 private:
  ResidentStore() = default;

  backend::Ops<T>* ops_ = nullptr;
  std::vector<std::int64_t> numel_;
  std::vector<backend::Buffer> params_;
  std::vector<backend::Buffer> grads_;
  std::vector<bool> fresh_;
  std::vector<int> ready_;
};

}  // namespace strata::model

// What the files of strata._core share (python/src/): the error type raised as
// strata.StrataError, the helpers that turn a Status into it, and the Context (one checked
// config, the backend and the budgets every group and parameter store of it share).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "config/config.h"
#include "optim/loss_scaler.h"
#include "train/job.h"
#include "train/run_directories.h"
#include "train/run_settings.h"

namespace py = pybind11;

namespace strata::python {

// Raised as strata.StrataError (a RuntimeError) by the translator core.cc registers.
class StrataFailure : public std::runtime_error {
 public:
  explicit StrataFailure(const Status& status) : std::runtime_error(status.to_string()) {}
};

inline void check(const Status& status) {
  if (!status.is_ok()) throw StrataFailure(status);
}

template <typename T>
T take(Result<T> result) {
  if (!result.is_ok()) throw StrataFailure(result.status());
  return std::move(*result);
}

inline Status invalid(const std::string& what, const std::string& message) {
  return Status(ErrorCode::kInvalidArgument, message, what);
}

// ---- Context ------------------------------------------------------------------------------------

class Context {
 public:
  Context(const std::string& config_text, const std::string& source_name) {
    config::LoadOptions load;
    load.purpose = config::Purpose::kCheck;
    load.auto_precision = train::auto_precision_here;
    // One process drives this optimizer, so ZeRO's stage has nothing to shard; a config that
    // gives none (a DeepSpeed config always does) is read at stage 2, where offload_optimizer
    // is valid.
    config::Checked checked = config::check_config_text(config_text, source_name, {}, load);
    if (!checked.loaded.given("zero_optimization.stage")) {
      checked =
          config::check_config_text(config_text, source_name, {"zero_optimization.stage=2"}, load);
    }
    check(checked.status);
    const config::Loaded& loaded = checked.loaded;
    config_ = loaded.config;
    // The swap folders pass the checks `strata train` makes (created 0700, never one that every
    // user may write to without the sticky bit), before any group puts files there.
    check(train::prepare_nvme_paths(config_));
    clip_given_ = loaded.given("gradient_clipping");
    for (const config::Note& note : loaded.notes)
      notes_.push_back(note.path.empty() ? note.message : note.path + ": " + note.message);
    scaler_ = std::make_unique<optim::LossScaler>(config_);
    // The optimizer's state lives in host memory or on NVMe whatever strata.backend says: the
    // parameters are the caller's tensors, and Strata's Adam runs on the CPU.
    backend::BackendRequest request = train::backend_request(config_);
    request.kind = config::Backend::kCpu;
    backend_ = take(backend::make_backend(request)).backend;
    nvme_budget_ = config_.strata.nvme_bytes_max;
  }

  const config::Config& config() const { return config_; }
  backend::Backend& backend() { return *backend_; }

  // What the Python side needs of the config.
  py::dict settings() const {
    py::dict d;
    const auto& zo = config_.zero_optimization.offload_optimizer;
    d["offload_optimizer"] = config::to_string(zo.device);
    d["nvme_path"] = zo.nvme_path;
    d["gradient_clipping"] = clip_given_ ? config_.gradient_clipping : 0.0;
    d["fp16"] = config_.fp16.enabled;
    d["bf16"] = config_.bf16.enabled;
    d["dynamic_loss_scale"] = scaler_->dynamic();
    // For strata.torch.offload_parameters (ZeRO-3 offload_param, with DeepSpeed's meanings).
    const config::ZeroConfig& z = config_.zero_optimization;
    d["zero_stage"] = z.stage;
    d["offload_param"] = config::to_string(z.offload_param.device);
    d["offload_param_nvme_path"] = z.offload_param.nvme_path;
    d["offload_param_buffer_count"] = z.offload_param.buffer_count;
    d["offload_param_buffer_size"] = z.offload_param.buffer_size;
    d["offload_param_max_in_cpu"] = z.offload_param.max_in_cpu;
    d["stage3_prefetch_bucket_size"] = z.stage3_prefetch_bucket_size;
    d["stage3_max_live_parameters"] = z.stage3_max_live_parameters;
    d["stage3_max_reuse_distance"] = z.stage3_max_reuse_distance;
    d["stage3_param_persistence_threshold"] = z.stage3_param_persistence_threshold;
    d["device_bytes_max"] = config_.strata.device_bytes_max;
    d["comm_timeout_s"] = config_.strata.comm_timeout_s;
    d["gradient_sum"] =
        config_.strata.gradient_sum == config::GradientSum::kOrdered ? "ordered" : "backend";
    d["notes"] = notes_;
    return d;
  }

  double loss_scale() const { return scaler_->scale(); }
  void update_loss_scale(bool overflow) { check(scaler_->update(overflow)); }
  py::dict scaler_state() const {
    const optim::LossScalerState& s = scaler_->state();
    py::dict d;
    d["scale"] = s.scale;
    d["iteration"] = s.iteration;
    d["last_overflow_iteration"] = s.last_overflow_iteration;
    d["hysteresis"] = s.hysteresis;
    return d;
  }
  void restore_scaler(double scale, std::int64_t iteration, std::int64_t last_overflow,
                      std::int64_t hysteresis) {
    if (!(scale > 0.0) || iteration < 0 || hysteresis < 1) {
      check(invalid("loss_scaler",
                    "a saved loss scaler needs scale > 0, iteration >= 0 and "
                    "hysteresis >= 1"));
    }
    scaler_->restore({scale, iteration, last_overflow, hysteresis});
  }

  // The NVMe bytes a new group may still take under strata.nvme_bytes_max (0: no limit).
  std::uint64_t nvme_left() const {
    if (nvme_budget_ == 0) return 0;
    return nvme_budget_ > nvme_used_ ? nvme_budget_ - nvme_used_ : 1;
  }
  void add_nvme(std::uint64_t bytes) { nvme_used_ += bytes; }
  // Gives back what add_nvme took (a parameter store that is closed).
  void release_nvme(std::uint64_t bytes) { nvme_used_ -= std::min(bytes, nvme_used_); }
  std::string next_tag() {
    return "py" + std::to_string(::getpid()) + "-" + std::to_string(id_) + "-g" +
           std::to_string(groups_++);
  }
  // The swap tag of a parameter store: never one of the groups' (next_tag).
  std::string next_param_tag() {
    return "py" + std::to_string(::getpid()) + "-" + std::to_string(id_) + "-params" +
           std::to_string(param_stores_++);
  }

 private:
  config::Config config_;
  bool clip_given_ = false;
  std::vector<std::string> notes_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<backend::Backend> backend_;
  std::uint64_t nvme_budget_ = 0;
  std::uint64_t nvme_used_ = 0;
  int groups_ = 0;
  int param_stores_ = 0;
  int id_ = next_id_++;
  static inline std::atomic<int> next_id_{0};
};

// Registers ParamStore and aligned_buffer (param_store.cc) on the module.
void bind_param_store(py::module_& m);

}  // namespace strata::python

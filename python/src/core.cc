// strata._core: the thin binding under the Python package (python/strata/). It exposes the
// offload engine as it is, through the interfaces it already has for a caller without a model
// (offload/plan.h: "a binding fills the settings itself"):
//
//   Context   one DeepSpeed-style config, read and checked by config::load_config_text, and the
//             CPU backend its budgets ask for (backend_factory, as the trainer's;
//             strata.host_bytes_max bounds every pinned byte of every group); the loss scaler and
//             the clipping rule of optim/loss_scaler.h (binding.h).
//   Group     one parameter group: flat units (whole tensors packed by the Python side) and the
//             offload engine built for them by offload::Engine::create in its optimizer-only kind
//             (the one builder the trainer uses too): a plan of the homes alone, the tier manager
//             (host memory or swap files on NVMe, under the budgets), the CPU Adam driver with the
//             group's hyperparameters and the OptimizerPipeline that runs the step
//             (read || Adam || write). The state of a unit is reached through numpy views: its host
//             home itself, or the unit scratch for NVMe-homed state, which load_state /
//             store_state move to and from the swap files. unit_ids (default 0..n-1) give each
//             unit's id among all units, which keys its stochastic rounding: a rank holding some of
//             the units (ZeRO sharding) gets the bits of one process holding all of them.
//   ParamStore the 16-bit parameters of modules in a swap file under
//             zero_optimization.offload_param.nvme_path (offload/param_store.h), and
//             aligned_buffer for buffers that move to and from it directly (param_store.cc).
//   train / estimate   train::run_job and train::estimate_report, the CLI's library functions.
//
// Every Status that is not ok becomes strata.StrataError with Strata's message; no C++ exception
// other than that one leaves this file, and the GIL is released while the engine works.
#include <json/reader.h>
#include <json/writer.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "common/units.h"
#include "model/layout.h"
#include "offload/optimizer_pipeline.h"
#include "offload/plan.h"
#include "offload/slot_codec.h"
#include "offload/tier_manager.h"
#include "offload/unit_state.h"
#include "optim/adam_optimizer.h"
#include "strata/build_info.h"
#include "train/estimate_report.h"
#include "train/job.h"
#include "train/stop_signal.h"

namespace strata::python {
namespace {

offload::SlotKind kind_of(const std::string& name) {
  for (int k = 0; k < offload::kSlotKinds; ++k) {
    const auto kind = static_cast<offload::SlotKind>(k);
    if (name == offload::to_string(kind)) return kind;
  }
  check(invalid("kind", "'" + name +
                            "' is not a kind of state; valid: param, master, exp_avg, "
                            "exp_avg_sq, grad"));
  return offload::SlotKind::kParam;
}

kernels::DType dtype_of(const std::string& name) {
  if (name == "fp32" || name == "float32") return kernels::DType::kF32;
  if (name == "bf16" || name == "bfloat16") return kernels::DType::kBF16;
  if (name == "fp16" || name == "float16") return kernels::DType::kF16;
  check(invalid("dtype", "'" + name + "' is not a parameter type; valid: fp32, bf16, fp16"));
  return kernels::DType::kF32;
}

py::object json_to_python(const Json::Value& value) {
  Json::StreamWriterBuilder writer;
  writer["indentation"] = "";
  const std::string text = Json::writeString(writer, value);
  return py::module_::import("json").attr("loads")(text);
}

// ---- Group --------------------------------------------------------------------------------------

struct GroupOptions {
  std::vector<std::int64_t> units;  // elements of each unit (before padding)
  // Each unit's id among all units (its stochastic-rounding key): a rank holding some of the
  // optimizer's units names them by their ids in the whole so its bits match one process holding
  // every unit. None: 0 to n-1.
  std::optional<std::vector<std::int64_t>> unit_ids;
  std::string dtype = "fp32";
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool adamw = true;
};

class Group {
 public:
  Group(Context& context, const GroupOptions& o) {
    if (o.units.empty()) check(invalid("units", "a parameter group needs at least one unit"));
    for (std::size_t i = 0; i < o.units.size(); ++i) {
      if (o.units[i] <= 0) {
        check(invalid("units", "unit " + std::to_string(i) + " has " + std::to_string(o.units[i]) +
                                   " elements; valid: 1 or more"));
      }
      model::UnitLayout u;
      u.kind = model::UnitKind::kBlock;
      u.index = static_cast<int>(i);
      u.layer = static_cast<int>(i);
      u.name = "unit." + std::to_string(i);
      u.numel = o.units[i];
      u.padded_numel = static_cast<std::int64_t>(
          align_up(static_cast<std::uint64_t>(o.units[i]), model::kUnitPadElements));
      u.tensors.push_back({"flat", {o.units[i]}, 0, o.units[i]});
      layout_.units.push_back(std::move(u));
    }
    const std::vector<int> ids = checked_unit_ids(o.unit_ids, o.units.size());
    // The one builder of the engine, for caller-owned parameters: the plan lists the homes, the
    // pipeline's stages and the unit scratch, exactly what the tier manager allocates.
    offload::EngineSpec spec = train::engine_spec(context.config());
    spec.kind = offload::EngineKind::kOptimizerOnly;
    spec.backend = &context.backend();
    spec.layout = &layout_;
    spec.rounding_ids = ids;
    spec.settings.storage = dtype_of(o.dtype);
    spec.settings.swap.bytes_max = context.nvme_left();
    spec.adam.beta1 = o.beta1;
    spec.adam.beta2 = o.beta2;
    spec.adam.eps = o.eps;
    spec.adam.weight_decay = o.weight_decay;
    spec.adam.adamw = o.adamw;
    spec.adam.bias_correction = true;
    spec.tier_options.swap_tag = context.next_tag();
    engine_ = take(offload::Engine::create(spec));
    tiers_ = &engine_->tiers();
    pipeline_ = &engine_->pipeline();
    std::uint64_t nvme = 0;
    for (std::uint64_t b : tiers_->plan().swap_bytes)
      nvme += b;
    context.add_nvme(nvme + tiers_->plan().swap_footer_bytes);
  }

  int units() const { return tiers_->units(); }
  std::int64_t shard_numel(int u) const { return unit(u).shard_numel; }
  std::string storage() const { return kernels::to_string(tiers_->plan().storage); }
  bool nvme() const {
    return tiers_->plan().uses(offload::SlotKind::kMaster, offload::Tier::kNvme);
  }

  // A float32 view of unit u's state of `kind` (not param): the host home itself when it is
  // stored there as fp32, else the unit scratch (one unit at a time: load_state / store_state
  // move it, decoding and encoding compressed state, strata.optimizer_state).
  py::array state_view(py::object self, const std::string& kind_name, int u) {
    const offload::SlotKind kind = kind_of(kind_name);
    if (kind == offload::SlotKind::kParam) {
      check(invalid("kind", "state_view takes an optimizer kind; use param_view for 'param'"));
    }
    float* data = direct(checked(u), kind) ? tiers_->host_state(u, kind) : tiers_->unit_scratch();
    if (data == nullptr) check(Status(ErrorCode::kInternal, "no memory for this state", kind_name));
    return py::array(py::dtype::of<float>(), {shard_numel(u)}, {sizeof(float)}, data, self);
  }
  // Whether the state_view of `kind` is its home (writes need no store_state).
  bool view_is_home(const std::string& kind_name) const {
    const offload::SlotKind kind = kind_of(kind_name);
    for (int u = 0; u < units(); ++u) {
      if (!direct(u, kind)) return false;
    }
    return true;
  }

  // Unit u's parameters in the storage type: float32 or uint16 (bf16 / fp16 bits).
  py::array param_view(py::object self, int u) {
    void* data = tiers_->host_param(checked(u));
    const std::int64_t n = unit(u).param_numel;
    if (tiers_->plan().storage == kernels::DType::kF32) {
      return py::array(py::dtype::of<float>(), {n}, {sizeof(float)}, static_cast<float*>(data),
                       self);
    }
    return py::array(py::dtype::of<std::uint16_t>(), {n}, {sizeof(std::uint16_t)},
                     static_cast<std::uint16_t*>(data), self);
  }

  // Reads unit u's `kind` into the scratch view (decoded) / writes the scratch view to its home
  // (encoded). No-ops when the view is the home.
  void load_state(const std::string& kind_name, int u) {
    const offload::SlotKind kind = kind_of(kind_name);
    if (direct(checked(u), kind)) return;
    py::gil_scoped_release release;
    // Not a host fp32 home (direct), so the state lands in the unit scratch: the view.
    check(offload::read_unit_state(*tiers_, kind, u).status());
  }
  void store_state(const std::string& kind_name, int u) {
    const offload::SlotKind kind = kind_of(kind_name);
    if (direct(checked(u), kind)) return;
    py::gil_scoped_release release;
    check(offload::write_unit_state(*tiers_, kind, u, tiers_->unit_scratch()));
  }
  // The parameters of unit u from its master weights (rounded to the storage type).
  void refresh_params(int u) {
    checked(u);
    py::gil_scoped_release release;
    check(tiers_->refresh_params(u));
  }

  // One Adam step over every tile of every unit (the gradients must be in their homes).
  void step(double lr, double grad_multiplier, std::int64_t t) {
    const offload::PipelineStep s = pipeline_step(lr, grad_multiplier, t);
    py::gil_scoped_release release;
    check(pipeline_->start(s));
    check(pipeline_->finish());
  }
  // The same step over `units` alone, in that order, left running: wait_params(u) returns when
  // unit u's new parameters are in their home, finish() when the step is done. A step split into
  // parts gives the bits of the whole (the overlapped hand-off of strata.torch).
  void start(double lr, double grad_multiplier, std::int64_t t, const std::vector<int>& parts) {
    const offload::PipelineStep s = pipeline_step(lr, grad_multiplier, t);
    if (pipeline_->active()) {
      check(Status(ErrorCode::kInvalidArgument,
                   "a step is running; valid: finish() it before starting another", "start"));
    }
    py::gil_scoped_release release;
    check(pipeline_->start(s, parts));
  }
  void wait_params(int u) {
    checked(u);
    py::gil_scoped_release release;
    check(pipeline_->wait_for_params(u));
  }
  void finish() {
    py::gil_scoped_release release;
    check(pipeline_->finish());
  }

  py::dict usage() const {
    const offload::TierUsage use = tiers_->usage();
    const offload::IoCounters io = tiers_->io_counters();
    py::dict d;
    for (int t = 0; t < offload::kTierCount; ++t) {
      py::dict one;
      one["bytes"] = tiers_->plan().bytes(static_cast<offload::Tier>(t));
      one["bytes_in_use"] = use.bytes_in_use[t];
      one["bytes_peak"] = use.bytes_peak[t];
      one["bytes_max"] = use.bytes_max[t];
      d[offload::to_string(static_cast<offload::Tier>(t))] = one;
    }
    std::uint64_t read = 0, written = 0;
    for (int k = 0; k < offload::kSlotKinds; ++k) {
      read += io.read_bytes[k];
      written += io.write_bytes[k];
    }
    d["nvme_read_bytes"] = read;
    d["nvme_write_bytes"] = written;
    const offload::PipelineTimes times = pipeline_->times();
    d["adam_ms"] = times.adam_ms;
    d["io_wait_ms"] = times.wait_ms;
    d["optimizer"] = engine_->adam().description();
    d["plan"] = offload::describe_plan(tiers_->plan(), tiers_->swap_dirs());
    py::list items;
    for (const offload::PlanItem& item : tiers_->plan().items) {
      if (item.bytes == 0) continue;
      items.append(py::make_tuple(offload::to_string(item.tier), item.what, item.bytes));
    }
    d["items"] = items;
    d["swap_dirs"] = tiers_->swap_dirs();
    return d;
  }

 private:
  // The units' rounding ids (empty: their indices), or StrataError naming unit_ids.
  static std::vector<int> checked_unit_ids(const std::optional<std::vector<std::int64_t>>& given,
                                           std::size_t units) {
    if (!given) return {};
    const std::vector<std::int64_t>& ids = *given;
    if (ids.size() != units) {
      check(invalid("unit_ids", std::to_string(ids.size()) + " ids for " + std::to_string(units) +
                                    " units; valid: one id per unit"));
    }
    std::map<std::int64_t, std::size_t> first;  // id -> the unit that has it
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > std::numeric_limits<int>::max()) {
        check(invalid("unit_ids", "unit " + std::to_string(i) + " has id " +
                                      std::to_string(ids[i]) + "; valid: 0 to " +
                                      std::to_string(std::numeric_limits<int>::max())));
      }
      const auto [at, added] = first.emplace(ids[i], i);
      if (!added) {
        check(invalid("unit_ids", "units " + std::to_string(at->second) + " and " +
                                      std::to_string(i) + " both have id " +
                                      std::to_string(ids[i]) + "; valid: distinct ids"));
      }
    }
    return std::vector<int>(ids.begin(), ids.end());
  }
  static offload::PipelineStep pipeline_step(double lr, double grad_multiplier, std::int64_t t) {
    if (!(lr >= 0.0)) check(invalid("lr", "the learning rate must be 0 or more"));
    if (t < 1) check(invalid("step", "Adam's step count starts at 1"));
    offload::PipelineStep s;
    s.lr = lr;
    s.grad_multiplier = grad_multiplier;
    s.step = t;
    return s;
  }
  const offload::UnitPlan& unit(int u) const {
    return tiers_->plan().units[static_cast<std::size_t>(u)];
  }
  bool direct(int u, offload::SlotKind kind) const {
    return offload::home_of(tiers_->plan(), u, kind) == offload::Tier::kHost &&
           offload::stored_as_fp32(tiers_->plan(), kind);
  }
  int checked(int u) const {
    if (u < 0 || u >= units()) {
      check(invalid("unit", std::to_string(u) + " is not a unit; valid: 0 to " +
                                std::to_string(units() - 1)));
    }
    return u;
  }

  model::ModelLayout layout_;
  std::unique_ptr<offload::Engine> engine_;
  offload::TierManager* tiers_ = nullptr;           // engine_->tiers()
  offload::OptimizerPipeline* pipeline_ = nullptr;  // engine_->pipeline()
};

// ---- train / estimate ---------------------------------------------------------------------------

// Runs `strata train` in this process. SIGINT and SIGTERM ask the trainer for a clean stop (a
// checkpoint, then the summary says "stopped"); Python's handlers are put back afterwards.
py::dict train(const std::string& config_file, const std::vector<std::string>& overrides,
               bool quiet) {
  train::JobOptions job;
  job.config_file = config_file;
  job.overrides = overrides;
  job.quiet = quiet;
  job.progress_tty = ::isatty(STDERR_FILENO) == 1;
  struct sigaction old_int {
  }, old_term{};
  ::sigaction(SIGINT, nullptr, &old_int);
  ::sigaction(SIGTERM, nullptr, &old_term);
  Status status;
  train::JobOutcome o;
  {
    py::gil_scoped_release release;
    status = train::install_stop_handlers();
    if (status.is_ok()) {
      bool started = false;
      Result<train::JobOutcome> outcome = train::run_job(job, &started);
      if (outcome.is_ok()) {
        o = std::move(*outcome);
      } else {
        status = outcome.status();
      }
    }
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
  }
  check(status);
  py::dict d;
  d["summary"] = json_to_python(o.summary);
  d["stopped_by"] = o.stopped == 0  ? py::object(py::none())
                    : o.stopped > 0 ? py::object(py::str(train::signal_name(o.stopped)))
                                    : py::object(py::str("another rank"));
  d["step"] = o.step;
  d["last_checkpoint"] = o.last_checkpoint;
  d["output_dir"] = o.output_dir;
  return d;
}

py::object estimate(const std::string& config_file, const std::vector<std::string>& overrides,
                    const std::string& params, const std::string& model,
                    std::int64_t ranks_per_node, std::int64_t nodes,
                    const std::string& device_bytes, const std::string& host_bytes,
                    const std::string& nvme_bytes) {
  train::EstimateRequest r;
  r.config_file = config_file;
  r.overrides = overrides;
  r.params = params;
  r.model = model;
  r.ranks_per_node = ranks_per_node;
  r.nodes = nodes;
  r.device_bytes = device_bytes;
  r.host_bytes = host_bytes;
  r.nvme_bytes = nvme_bytes;
  r.params_name = "params";
  r.model_name = "model";
  r.device_bytes_name = "device_bytes";
  r.host_bytes_name = "host_bytes";
  r.nvme_bytes_name = "nvme_bytes";
  train::EstimateReport report = take(train::estimate_report(r));
  return json_to_python(train::estimate_json(report));
}

}  // namespace
}  // namespace strata::python

PYBIND11_MODULE(_core, m) {
  using namespace strata::python;
  m.doc() = "Strata's offload engine (the binding under the strata package)";
  static py::exception<StrataFailure> error(m, "StrataError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StrataFailure& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
  m.attr("__version__") = strata::build::kVersion;
  m.attr("git_commit") = strata::build::kGitCommit;

  py::class_<Context>(m, "Context")
      .def(py::init<const std::string&, const std::string&>(), py::arg("config_text"),
           py::arg("source_name"))
      .def("settings", &Context::settings)
      .def("loss_scale", &Context::loss_scale)
      .def("update_loss_scale", &Context::update_loss_scale, py::arg("overflow"))
      .def("scaler_state", &Context::scaler_state)
      .def("restore_scaler", &Context::restore_scaler);

  py::class_<Group>(m, "Group")
      .def(py::init([](Context& context, std::vector<std::int64_t> units, std::string dtype,
                       double weight_decay, double beta1, double beta2, double eps, bool adamw,
                       std::optional<std::vector<std::int64_t>> unit_ids) {
             GroupOptions o;
             o.units = std::move(units);
             o.unit_ids = std::move(unit_ids);
             o.dtype = std::move(dtype);
             o.weight_decay = weight_decay;
             o.beta1 = beta1;
             o.beta2 = beta2;
             o.eps = eps;
             o.adamw = adamw;
             return std::make_unique<Group>(context, o);
           }),
           py::arg("context"), py::arg("units"), py::arg("dtype"), py::arg("weight_decay"),
           py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("adamw"), py::kw_only(),
           py::arg("unit_ids") = py::none(), py::keep_alive<1, 2>())
      .def("units", &Group::units)
      .def("shard_numel", &Group::shard_numel)
      .def("storage", &Group::storage)
      .def("nvme", &Group::nvme)
      .def("state_view", [](py::object self, const std::string& kind,
                            int u) { return self.cast<Group&>().state_view(self, kind, u); })
      .def("param_view",
           [](py::object self, int u) { return self.cast<Group&>().param_view(self, u); })
      .def("view_is_home", &Group::view_is_home)
      .def("load_state", &Group::load_state)
      .def("store_state", &Group::store_state)
      .def("refresh_params", &Group::refresh_params)
      .def("step", &Group::step, py::arg("lr"), py::arg("grad_multiplier"), py::arg("step"))
      .def("start", &Group::start, py::arg("lr"), py::arg("grad_multiplier"), py::arg("step"),
           py::arg("units"))
      .def("wait_params", &Group::wait_params, py::arg("unit"))
      .def("finish", &Group::finish)
      .def("usage", &Group::usage);

  m.def("gradient_multiplier", &strata::optim::gradient_multiplier, py::arg("scaled_norm"),
        py::arg("loss_scale"), py::arg("clip"),
        "1 / (loss scale x clipping factor), as DeepSpeed's unscale_and_clip_grads");
  m.def("train", &train, py::arg("config_file"), py::arg("overrides"), py::arg("quiet"));
  m.def("estimate", &estimate, py::arg("config_file"), py::arg("overrides"), py::arg("params"),
        py::arg("model"), py::arg("ranks_per_node"), py::arg("nodes"), py::arg("device_bytes"),
        py::arg("host_bytes"), py::arg("nvme_bytes"));
  bind_param_store(m);
}

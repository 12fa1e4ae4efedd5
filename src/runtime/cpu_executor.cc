#include "runtime/cpu_executor.h"

#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_scheduler_observer.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace strata::runtime {
namespace {

// Affinity masks saved on arena entry, restored on exit. Arenas can nest (a kernel called from
// inside another arena's task), so each thread keeps a small stack; deeper nesting stays pinned.
constexpr int kPinDepthMax = 4;
thread_local cpu_set_t t_saved_masks[kPinDepthMax];
thread_local int t_pin_depth = 0;

void warn_once(const char* what, int error) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    STRATA_LOG_WARN("CPU kernels: {} failed ({}); threads stay where the OS puts them", what,
                    std::strerror(error));
  }
}

// Pins every thread that enters the arena (workers and the caller of execute()) to the CPUs of
// one NUMA node and gives it back its previous mask when it leaves.
class PinningObserver final : public tbb::task_scheduler_observer {
 public:
  PinningObserver(tbb::task_arena& arena, const std::vector<int>& cpus)
      : tbb::task_scheduler_observer(arena) {
    CPU_ZERO(&mask_);
    for (int cpu : cpus) {
      if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &mask_);
    }
    observe(true);
  }
  ~PinningObserver() override { observe(false); }

  void on_scheduler_entry(bool /*is_worker*/) override {
    if (t_pin_depth >= kPinDepthMax) {
      ++t_pin_depth;
      return;
    }
    cpu_set_t& saved = t_saved_masks[t_pin_depth++];
    if (sched_getaffinity(0, sizeof(saved), &saved) != 0) {
      warn_once("sched_getaffinity", errno);
      CPU_ZERO(&saved);
      return;
    }
    if (sched_setaffinity(0, sizeof(mask_), &mask_) != 0) warn_once("sched_setaffinity", errno);
  }

  void on_scheduler_exit(bool /*is_worker*/) override {
    if (t_pin_depth == 0) return;
    if (--t_pin_depth >= kPinDepthMax) return;
    const cpu_set_t& saved = t_saved_masks[t_pin_depth];
    if (CPU_COUNT(&saved) == 0) return;
    if (sched_setaffinity(0, sizeof(saved), &saved) != 0) warn_once("sched_setaffinity", errno);
  }

 private:
  cpu_set_t mask_;
};

}  // namespace

struct CpuExecutor::NodeArena {
  std::unique_ptr<tbb::task_arena> arena;
  std::unique_ptr<PinningObserver> observer;
  int threads = 1;
};

Result<std::unique_ptr<CpuExecutor>> CpuExecutor::create(const Options& options) {
  Result<sys::NumaTopology> topology = sys::NumaTopology::load_this_machine();
  if (!topology.is_ok()) {
    STRATA_LOG_WARN("CPU kernels: {}; threads will not follow NUMA placement",
                    topology.status().to_string());
    Result<sys::NumaTopology> flat = sys::NumaTopology::load_synthetic("pu:1");
    if (!flat.is_ok()) return flat.status();
    Options unpinned = options;
    unpinned.follow_memory = false;
    unpinned.pin_single_node = false;
    return create_with(unpinned, std::move(flat).value());
  }
  return create_with(options, std::move(topology).value());
}

Result<std::unique_ptr<CpuExecutor>> CpuExecutor::create_with(const Options& options,
                                                              sys::NumaTopology topology) {
  if (options.threads < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "CPU kernel threads must be 0 (all CPUs) or positive, got {}",
                      options.threads);
  }
  std::unique_ptr<CpuExecutor> executor(new CpuExecutor());
  executor->threads_ =
      options.threads > 0 ? options.threads : std::max(1, tbb::info::default_concurrency());
  executor->follow_memory_ = options.follow_memory;
  executor->topology_ = std::make_unique<sys::NumaTopology>(std::move(topology));
  executor->default_arena_ = std::make_unique<tbb::task_arena>(executor->threads_);
  const int nodes = executor->topology_->node_count();
  if (options.follow_memory && (nodes > 1 || options.pin_single_node)) {
    for (int node = 0; node < nodes; ++node) {
      auto node_arena = std::make_unique<NodeArena>();
      const std::vector<int>& cpus = executor->topology_->node_cpus(node);
      node_arena->threads = std::min(executor->threads_, static_cast<int>(cpus.size()));
      node_arena->arena = std::make_unique<tbb::task_arena>(node_arena->threads);
      node_arena->arena->initialize();
      node_arena->observer = std::make_unique<PinningObserver>(*node_arena->arena, cpus);
      executor->node_arenas_.push_back(std::move(node_arena));
    }
  }
  return executor;
}

CpuExecutor::~CpuExecutor() = default;

int CpuExecutor::numa_nodes() const {
  return topology_->node_count();
}

int CpuExecutor::threads_for_node(int node) const {
  if (node < 0) return threads_;
  STRATA_ASSERT(static_cast<std::size_t>(node) < node_arenas_.size());
  return node_arenas_[static_cast<std::size_t>(node)]->threads;
}

int CpuExecutor::node_for(const void* near, std::size_t near_bytes) const {
  if (node_arenas_.empty()) return -1;
  if (node_arenas_.size() == 1) return 0;  // pin_single_node on a one-node machine
  return topology_->node_of_memory(near, near_bytes);
}

tbb::task_arena& CpuExecutor::arena(int node) {
  if (node < 0) return *default_arena_;
  STRATA_ASSERT(static_cast<std::size_t>(node) < node_arenas_.size());
  return *node_arenas_[static_cast<std::size_t>(node)]->arena;
}

}  // namespace strata::runtime

// Crash points and injected file faults (see fault_points.h).
#include "common/fault_points.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace strata {
namespace {

struct CrashPlan {
  bool active = false;
  bool trace = false;
  std::string name;         // only points whose name contains this count
  std::int64_t target = 0;  // kill at this count
};

const CrashPlan& crash_plan() {
  static const CrashPlan plan = [] {
    CrashPlan p;
    const char* env = std::getenv("STRATA_TEST_CRASH_POINT");
    if (env == nullptr || *env == '\0') return p;
    const std::string text = env;
    if (text == "trace") {
      p.active = p.trace = true;
      return p;
    }
    const std::size_t colon = text.rfind(':');
    const std::string count = colon == std::string::npos ? text : text.substr(colon + 1);
    if (colon != std::string::npos) p.name = text.substr(0, colon);
    char* end = nullptr;
    p.target = std::strtoll(count.c_str(), &end, 10);
    p.active = end != nullptr && *end == '\0' && p.target > 0;
    if (!p.active) {
      std::fprintf(
          stderr, "strata: STRATA_TEST_CRASH_POINT='%s' is not N, NAME:N or trace; ignored\n", env);
    }
    return p;
  }();
  return plan;
}

std::atomic<std::int64_t> g_points{0};
std::atomic<bool> g_fault_set{false};
std::mutex g_fault_mutex;
std::optional<FileFault> g_fault;

}  // namespace

void crash_point(const char* name) {
  const CrashPlan& plan = crash_plan();
  if (!plan.active) return;
  if (!plan.name.empty() && std::strstr(name, plan.name.c_str()) == nullptr) return;
  const std::int64_t n = g_points.fetch_add(1) + 1;
  if (plan.trace) {
    std::fprintf(stderr, "strata: crash point %lld: %s\n", static_cast<long long>(n), name);
    return;
  }
  if (n != plan.target) return;
  std::fprintf(stderr, "strata: crash point %lld (%s): SIGKILL\n", static_cast<long long>(n), name);
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  ::pause();
}

void set_file_fault(std::optional<FileFault> fault) {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  g_fault = std::move(fault);
  g_fault_set.store(g_fault.has_value());
}

int injected_file_error(FileOp op, const std::string& path, std::uint64_t offset,
                        std::uint64_t bytes, std::uint64_t* allowed) {
  if (allowed != nullptr) *allowed = bytes;
  if (!g_fault_set.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  if (!g_fault || g_fault->op != op || path.find(g_fault->path_contains) == std::string::npos) {
    return 0;
  }
  if (op != FileOp::kWrite) return g_fault->error;
  if (offset + bytes <= g_fault->after_bytes) return 0;
  if (allowed != nullptr)
    *allowed = g_fault->after_bytes > offset ? g_fault->after_bytes - offset : 0;
  return g_fault->error;
}

}  // namespace strata

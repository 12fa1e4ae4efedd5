// Crash points and injected file faults (see fault_points.h).
#include "common/fault_points.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

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

// A positive count, or 0 when `text` is not one.
std::uint64_t parse_count(const std::string& text) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  return !text.empty() && text[0] != '-' && end != nullptr && *end == '\0' ? n : 0;
}

// An errno from a number ("28") or its name ("ENOSPC"); 0 when it is neither.
int parse_errno(const std::string& text) {
  const std::uint64_t n = parse_count(text);
  if (n > 0 && n < 4096) return static_cast<int>(n);
  for (int e = 1; e < 256; ++e) {
    const char* name = strerrorname_np(e);
    if (name != nullptr && text == name) return e;
  }
  return 0;
}

std::optional<IoFault> io_fault_from_env() {
  const char* env = std::getenv("STRATA_TEST_IO_FAULT");
  if (env == nullptr || *env == '\0') return std::nullopt;
  std::vector<std::string> fields;
  const std::string text = env;
  for (std::size_t begin = 0;;) {
    const std::size_t colon = text.find(':', begin);
    fields.push_back(text.substr(begin, colon - begin));
    if (colon == std::string::npos) break;
    begin = colon + 1;
  }
  if ((fields.size() == 3 || fields.size() == 4) && !fields[0].empty()) {
    IoFault f;
    f.path_contains = fields[0];
    f.nth = parse_count(fields[1]);
    f.error = parse_errno(fields[2]);
    const std::string only = fields.size() == 4 ? fields[3] : "";
    f.reads = only != "write";
    f.writes = only != "read";
    if (f.nth > 0 && f.error > 0 && (only.empty() || only == "read" || only == "write")) return f;
  }
  std::fprintf(stderr,
               "strata: STRATA_TEST_IO_FAULT='%s' is not TEXT:N:ERRNO[:read|:write] (e.g. "
               ".swp:40:ENOSPC:write); ignored\n",
               env);
  return std::nullopt;
}

std::optional<SwapCorruption> swap_corruption_from_env() {
  const char* env = std::getenv("STRATA_TEST_SWAP_CORRUPT");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string text = env;
  const std::size_t colon = text.rfind(':');
  if (colon != std::string::npos && colon > 0) {
    SwapCorruption c;
    c.kind = text.substr(0, colon);
    c.nth = parse_count(text.substr(colon + 1));
    if (c.nth > 0) return c;
  }
  std::fprintf(stderr,
               "strata: STRATA_TEST_SWAP_CORRUPT='%s' is not KIND:N (e.g. master:3); ignored\n",
               env);
  return std::nullopt;
}

// Read from the environment once, at start-up; set_*() replaces them.
std::mutex g_io_mutex;
std::optional<IoFault> g_io_fault = io_fault_from_env();
std::uint64_t g_io_operations = 0;
std::atomic<bool> g_io_set{g_io_fault.has_value()};

std::mutex g_swap_mutex;
std::optional<SwapCorruption> g_swap_corruption = swap_corruption_from_env();
std::uint64_t g_swap_writes = 0;
std::atomic<bool> g_swap_set{g_swap_corruption.has_value()};

std::mutex g_uring_mutex;
std::atomic<bool> g_uring_set{false};
struct UringFault {
  int error = 0;
  std::uint32_t count = 0;
};
UringFault g_uring[2];

std::optional<std::uint64_t> stream_jitter_from_env() {
  const char* env = std::getenv("STRATA_TEST_STREAM_JITTER");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string text = env;
  char* end = nullptr;
  const unsigned long long seed = std::strtoull(text.c_str(), &end, 10);
  if (text[0] != '-' && end != nullptr && *end == '\0') return seed;
  std::fprintf(stderr,
               "strata: STRATA_TEST_STREAM_JITTER='%s' is not a decimal seed (e.g. 7); ignored\n",
               env);
  return std::nullopt;
}

std::mutex g_jitter_mutex;
std::optional<std::uint64_t> g_jitter = stream_jitter_from_env();

std::string planted_race_from_env() {
  const char* env = std::getenv("STRATA_TEST_PLANT_RACE");
  return env == nullptr ? std::string() : std::string(env);
}

std::mutex g_plant_mutex;
std::string g_plant = planted_race_from_env();
std::atomic<bool> g_plant_set{!g_plant.empty()};

std::atomic<bool> g_no_flock{[] {
  const char* env = std::getenv("STRATA_TEST_NO_FLOCK");
  return env != nullptr && std::strcmp(env, "1") == 0;
}()};

std::atomic<bool> g_poison_weights{[] {
  const char* env = std::getenv("STRATA_TEST_POISON_WEIGHTS");
  return env != nullptr && std::strcmp(env, "1") == 0;
}()};

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

void set_io_fault(std::optional<IoFault> fault) {
  std::lock_guard<std::mutex> lock(g_io_mutex);
  g_io_fault = std::move(fault);
  g_io_operations = 0;
  g_io_set.store(g_io_fault.has_value());
}

bool io_fault_armed() {
  return g_io_set.load(std::memory_order_relaxed);
}

int injected_io_error(const std::string& path, bool write) {
  if (!io_fault_armed()) return 0;
  std::lock_guard<std::mutex> lock(g_io_mutex);
  if (!g_io_fault || !(write ? g_io_fault->writes : g_io_fault->reads) ||
      path.find(g_io_fault->path_contains) == std::string::npos) {
    return 0;
  }
  return ++g_io_operations == g_io_fault->nth ? g_io_fault->error : 0;
}

std::uint64_t io_fault_operations() {
  std::lock_guard<std::mutex> lock(g_io_mutex);
  return g_io_operations;
}

void set_swap_corruption(std::optional<SwapCorruption> corruption) {
  std::lock_guard<std::mutex> lock(g_swap_mutex);
  g_swap_corruption = std::move(corruption);
  g_swap_writes = 0;
  g_swap_set.store(g_swap_corruption.has_value());
}

bool swap_write_corrupts(const std::string& kind) {
  if (!g_swap_set.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(g_swap_mutex);
  if (!g_swap_corruption || kind != g_swap_corruption->kind) return false;
  return ++g_swap_writes == g_swap_corruption->nth;
}

std::uint64_t swap_corruption_writes() {
  std::lock_guard<std::mutex> lock(g_swap_mutex);
  return g_swap_writes;
}

void set_uring_fault(UringCall call, int error, std::uint32_t count) {
  std::lock_guard<std::mutex> lock(g_uring_mutex);
  g_uring[static_cast<int>(call)] = UringFault{error, count};
  g_uring_set.store(g_uring[0].count != 0 || g_uring[1].count != 0);
}

int injected_uring_error(UringCall call) {
  if (!g_uring_set.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(g_uring_mutex);
  UringFault& f = g_uring[static_cast<int>(call)];
  if (f.count == 0) return 0;
  --f.count;
  g_uring_set.store(g_uring[0].count != 0 || g_uring[1].count != 0);
  return f.error;
}

std::optional<std::uint64_t> stream_jitter_seed() {
  std::lock_guard<std::mutex> lock(g_jitter_mutex);
  return g_jitter;
}

void set_stream_jitter(std::optional<std::uint64_t> seed) {
  std::lock_guard<std::mutex> lock(g_jitter_mutex);
  g_jitter = seed;
}

bool planted_race(const char* name) {
  if (!g_plant_set.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(g_plant_mutex);
  return g_plant == name;
}

void set_planted_race(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_plant_mutex);
  g_plant = name;
  g_plant_set.store(!g_plant.empty());
}

void test_barrier(const char* name) {
  const char* env = std::getenv("STRATA_TEST_BARRIER");
  if (env == nullptr || *env == '\0') return;
  const std::string text = env;
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0) {
    std::fprintf(stderr, "strata: STRATA_TEST_BARRIER='%s' is not NAME:DIR; ignored\n", env);
    return;
  }
  if (std::strstr(name, text.substr(0, colon).c_str()) == nullptr) return;
  const std::string dir = text.substr(colon + 1);
  const int go = ::open((dir + "/go").c_str(), O_RDWR | O_CLOEXEC);
  const int arrive = ::open((dir + "/arrive").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  bool ok = go >= 0 && arrive >= 0;
  if (ok) {
    const std::string line = std::to_string(::getpid()) + "\n";
    ok = ::write(arrive, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  }
  if (ok) {
    pollfd p{go, POLLIN, 0};
    char byte = 0;
    ok = ::poll(&p, 1, 120000) == 1 && ::read(go, &byte, 1) == 1;
  }
  if (!ok)
    std::fprintf(stderr, "strata: test barrier %s in %s failed; going on\n", name, dir.c_str());
  if (arrive >= 0) ::close(arrive);
  if (go >= 0) ::close(go);
}

bool flock_disabled_for_test() {
  return g_no_flock.load(std::memory_order_relaxed);
}

void set_flock_disabled(bool disabled) {
  g_no_flock.store(disabled);
}

bool poison_weights_for_test() {
  return g_poison_weights.load(std::memory_order_relaxed);
}

void set_poison_weights(bool poison) {
  g_poison_weights.store(poison);
}

}  // namespace strata

// CpuBackend (see cpu_backend.h): capped host arena, pinned accounting, copy-stream threads with
// fixed-capacity queues, CUDA-like events, and ops on a oneTBB arena; in stream-jitter mode also
// a compute-stream thread and random delays before every command.
#include "backend/cpu/cpu_backend.h"

#include <sys/mman.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/arena.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_optimizer_ops.h"
#include "backend/cpu/cpu_queued_ops.h"
#include "common/fault_points.h"
#include "common/log.h"
#include "common/units.h"
#include "kernels/cpu/gemm.h"

namespace strata::backend {
namespace {

constexpr std::size_t kQueueCapacity = 1024;  // commands per stream
constexpr std::uint32_t kEventsMax = 4096;

struct EventSlot {
  std::atomic<std::uint64_t> recorded{0};   // records issued (host thread)
  std::atomic<std::uint64_t> completed{0};  // highest record reached by its stream
  bool in_use = false;
};

struct Command {
  enum class Kind : std::uint8_t { kCopy, kRecord, kWait, kHostFunc, kOp };
  Kind kind = Kind::kCopy;
  void* dst = nullptr;
  const void* src = nullptr;
  std::uint64_t bytes = 0;
  std::uint32_t event = 0;
  std::uint64_t ticket = 0;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  std::function<void()> op;  // kOp: a queued compute op (stream-jitter mode)
};

Command make_command(Command::Kind kind, void* dst, const void* src, std::uint64_t bytes,
                     std::uint32_t event, std::uint64_t ticket) {
  Command c;
  c.kind = kind;
  c.dst = dst;
  c.src = src;
  c.bytes = bytes;
  c.event = event;
  c.ticket = ticket;
  return c;
}

// SplitMix64: the jitter's generator (one per stream, seeded from the backend's seed).
std::uint64_t next_random(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The delay before one command in jitter mode: none half of the time, up to 64 us most of the
// rest, and 0.2-2 ms one time in eight, so that a stream sometimes falls far behind the others.
void jitter_pause(std::uint64_t& state) {
  const std::uint64_t r = next_random(state);
  const unsigned pick = static_cast<unsigned>(r & 7u);
  if (pick < 4) return;
  const std::uint64_t us = pick < 7 ? (r >> 8) % 64 : 200 + (r >> 8) % 1800;
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

class CpuBackend;

// One stream run by a thread of its own, draining a fixed-capacity ring of commands in order:
// each copy stream always, the compute stream in jitter mode (then it is also the queued ops'
// ComputeQueue).
class CommandStream final : public ComputeQueue {
 public:
  CommandStream(CpuBackend* backend, StreamKind kind) : backend_(backend), kind_(kind) {}
  ~CommandStream() override { stop(); }

  // With `jitter`, every command waits a random time first (jitter_pause), drawn from `seed`.
  void start(std::optional<std::uint64_t> seed) {
    jitter_ = seed.has_value();
    rng_ = seed.value_or(0) ^ (0xd1b54a32d192ed03ull * (static_cast<std::uint64_t>(kind_) + 1));
    worker_ = std::thread([this] { loop(); });
  }
  bool started() const { return worker_.joinable(); }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    not_empty_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  // Blocks while the queue is full (back-pressure), then enqueues.
  void push_command(Command command) {
    std::unique_lock<std::mutex> lock(mutex_);
    not_full_.wait(lock, [&] { return count_ < kQueueCapacity; });
    ring_[(head_ + count_) % kQueueCapacity] = std::move(command);
    ++count_;
    ++issued_;
    not_empty_.notify_one();
  }
  // ComputeQueue.
  void push(std::function<void()> op) override {
    Command command;
    command.kind = Command::Kind::kOp;
    command.op = std::move(op);
    push_command(std::move(command));
  }
  // Blocks until every command issued so far has run.
  void drain() override {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t target = issued_;
    idle_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void loop();

  CpuBackend* backend_;
  StreamKind kind_;
  bool jitter_ = false;
  std::uint64_t rng_ = 0;  // the worker's only
  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_, idle_;
  std::array<Command, kQueueCapacity> ring_{};
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  std::uint64_t issued_ = 0;
  std::uint64_t done_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(void* base, const CpuBackendOptions& options, std::uint64_t host_budget, int threads,
             kernels::AdamKernel adam, std::optional<std::uint64_t> jitter_seed)
      : base_(static_cast<std::uint8_t*>(base)),
        arena_(options.device_bytes_max, "device arena", options.device_budget_name),
        host_budget_name_(options.host_budget_name),
        host_budget_(host_budget),
        threads_(threads),
        tbb_arena_(threads),
        ops_f32_(&tbb_arena_),
        ops_f64_(&tbb_arena_),
        optimizer_ops_(&tbb_arena_, adam),
        jitter_seed_(jitter_seed),
        compute_(this, StreamKind::kCompute),
        h2d_(this, StreamKind::kHostToDevice),
        d2h_(this, StreamKind::kDeviceToHost),
        queued_f32_(&ops_f32_, &compute_),
        queued_f64_(&ops_f64_, &compute_),
        queued_optimizer_(&optimizer_ops_, &compute_),
        events_(kEventsMax) {
    kernels::blas_setup();
    if (jitter_seed_) {
      compute_.start(jitter_seed_);
      STRATA_LOG_INFO(
          "cpu backend: stream jitter on (seed {}): the compute stream runs on its own thread "
          "and every stream command is delayed at random",
          *jitter_seed_);
    }
    h2d_.start(jitter_seed_);
    d2h_.start(jitter_seed_);
  }

  ~CpuBackend() override {
    compute_.stop();
    h2d_.stop();
    d2h_.stop();
    ::munmap(base_, arena_.capacity());
  }

  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return fmt::format("cpu: {} compute threads (oneTBB), device arena {}, pinned budget {}; {}{}",
                       threads_, format_bytes(arena_.capacity()), format_bytes(host_budget_),
                       kernels::blas_description(),
                       jitter_seed_ ? fmt::format("; stream jitter seed {}", *jitter_seed_) : "");
  }

  Result<Buffer> allocate_device(std::uint64_t bytes, std::string_view purpose,
                                 std::uint64_t alignment) override {
    STRATA_ASSIGN_OR_RETURN(std::uint64_t offset, arena_.allocate(bytes, alignment, purpose));
    // Jitter mode also poisons fresh memory (all bits set: NaN in every float type, -1 as an
    // index), as a GPU's recycled memory holds whatever was there: a read before the first
    // write shows up instead of reading the zeros of a fresh mapping.
    if (jitter_seed_) std::memset(base_ + offset, 0xff, bytes);
    return make_buffer(base_ + offset, bytes, MemoryKind::kDevice);
  }

  Result<Buffer> allocate_pinned(std::uint64_t bytes, std::string_view purpose) override {
    const std::uint64_t size = align_up(std::max<std::uint64_t>(bytes, 1), 4096);
    {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      if (pinned_in_use_ + size > host_budget_) {
        return Status(ErrorCode::kOutOfMemory,
                      fmt::format("cannot allocate {} for {}: {} of the {} budget ({}) are "
                                  "in use; raise {} or shrink the job",
                                  format_bytes(size), purpose, format_bytes(pinned_in_use_),
                                  format_bytes(host_budget_), host_budget_name_, host_budget_name_),
                      "pinned host memory");
      }
      pinned_in_use_ += size;
      pinned_peak_ = std::max(pinned_peak_, pinned_in_use_);
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      pinned_in_use_ -= size;
      return Status(ErrorCode::kOutOfMemory,
                    fmt::format("mmap of {} for {} failed: {}", format_bytes(size), purpose,
                                std::strerror(err)),
                    "pinned host memory");
    }
    {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      pinned_ranges_[reinterpret_cast<std::uintptr_t>(p)] = size;
    }
    if (jitter_seed_) std::memset(p, 0xff, size);
    return make_buffer(p, bytes, MemoryKind::kPinnedHost);
  }

  MemoryStats device_memory() const override {
    return {arena_.capacity(), arena_.bytes_in_use(), arena_.bytes_peak()};
  }
  MemoryStats pinned_memory() const override {
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    return {host_budget_, pinned_in_use_, pinned_peak_};
  }

  Result<Event> create_event() override {
    for (std::uint32_t i = 0; i < kEventsMax; ++i) {
      const std::uint32_t index = (next_event_ + i) % kEventsMax;
      if (!events_[index].in_use) {
        events_[index].in_use = true;
        next_event_ = index + 1;
        return Event{index};
      }
    }
    return Status(ErrorCode::kOutOfMemory,
                  fmt::format("all {} events of the CPU backend are in use", kEventsMax));
  }

  void destroy_event(Event event) override {
    EventSlot& slot = slot_of(event);
    slot.in_use = false;
    // A later create_event may reuse the slot: it starts as "complete".
    slot.completed.store(slot.recorded.load());
  }

  Status record(Event event, StreamKind stream) override {
    EventSlot& slot = slot_of(event);
    const std::uint64_t ticket = slot.recorded.fetch_add(1) + 1;
    if (stream == StreamKind::kCompute && !compute_.started()) {
      complete(event.index, ticket);
    } else {
      stream_of(stream).push_command(
          make_command(Command::Kind::kRecord, nullptr, nullptr, 0, event.index, ticket));
    }
    return Status::ok();
  }

  Status wait(StreamKind stream, Event event) override {
    EventSlot& slot = slot_of(event);
    const std::uint64_t target = slot.recorded.load();
    if (stream == StreamKind::kCompute && !compute_.started()) {
      wait_until(event.index, target);
    } else {
      stream_of(stream).push_command(
          make_command(Command::Kind::kWait, nullptr, nullptr, 0, event.index, target));
    }
    return Status::ok();
  }

  Status synchronize(Event event) override {
    wait_until(event.index, slot_of(event).recorded.load());
    return Status::ok();
  }

  Status synchronize(StreamKind stream) override {
    if (stream != StreamKind::kCompute || compute_.started()) stream_of(stream).drain();
    return Status::ok();
  }

  bool query(Event event) override {
    EventSlot& slot = slot_of(event);
    return slot.completed.load() >= slot.recorded.load();
  }

  Status launch_host_func(StreamKind stream, void (*fn)(void*), void* arg) override {
    STRATA_ASSERT(fn != nullptr);
    if (stream == StreamKind::kCompute && !compute_.started()) {
      fn(arg);
    } else {
      Command command;
      command.kind = Command::Kind::kHostFunc;
      command.fn = fn;
      command.arg = arg;
      stream_of(stream).push_command(std::move(command));
    }
    return Status::ok();
  }

  Status copy_async(StreamKind stream, void* dst, const void* src, std::uint64_t bytes) override {
    if (bytes == 0) return Status::ok();
    STRATA_ASSERT(dst != nullptr && src != nullptr);
    if (stream == StreamKind::kCompute && !compute_.started()) {
      std::memcpy(dst, src, bytes);
      return Status::ok();
    }
    // As on a GPU: a copy that touches ordinary (pageable) host memory has completed when
    // copy_async returns; between the backend's own memory it is queued.
    const bool pageable = !backend_memory(dst, bytes) || !backend_memory(src, bytes);
    if (stream == StreamKind::kCompute && pageable) {
      compute_.drain();
      std::memcpy(dst, src, bytes);
      return Status::ok();
    }
    CommandStream& s = stream_of(stream);
    s.push_command(make_command(Command::Kind::kCopy, dst, src, bytes, 0, 0));
    if (pageable && jitter_seed_) s.drain();
    return Status::ok();
  }

  Ops<float>& ops_f32() override {
    return compute_.started() ? static_cast<Ops<float>&>(queued_f32_) : ops_f32_;
  }
  Ops<double>* ops_f64() override {
    return compute_.started() ? static_cast<Ops<double>*>(&queued_f64_) : &ops_f64_;
  }
  OptimizerOps& optimizer_ops() override {
    return compute_.started() ? static_cast<OptimizerOps&>(queued_optimizer_) : optimizer_ops_;
  }
  int compute_threads() const override { return threads_; }
  bool device_memory_is_host() const override { return true; }

  // Called by the copy-stream threads.
  void complete(std::uint32_t index, std::uint64_t ticket) {
    {
      std::lock_guard<std::mutex> lock(event_mutex_);
      EventSlot& slot = events_[index];
      if (slot.completed.load() < ticket) slot.completed.store(ticket);
    }
    event_cv_.notify_all();
  }
  void wait_until(std::uint32_t index, std::uint64_t ticket) {
    std::unique_lock<std::mutex> lock(event_mutex_);
    event_cv_.wait(lock, [&] { return events_[index].completed.load() >= ticket; });
  }

 protected:
  void release(void* data, std::uint64_t bytes, MemoryKind kind) override {
    if (kind == MemoryKind::kDevice) {
      arena_.free(static_cast<std::uint64_t>(static_cast<std::uint8_t*>(data) - base_));
      return;
    }
    const std::uint64_t size = align_up(std::max<std::uint64_t>(bytes, 1), 4096);
    if (jitter_seed_) {
      // Queued copies may still name this memory: let them land before it is unmapped (teardown
      // order is not what the jitter mode tests).
      if (compute_.started()) compute_.drain();
      h2d_.drain();
      d2h_.drain();
    }
    ::munmap(data, size);
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    pinned_in_use_ -= size;
    pinned_ranges_.erase(reinterpret_cast<std::uintptr_t>(data));
  }

 private:
  EventSlot& slot_of(Event event) {
    STRATA_ASSERT(event.valid() && event.index < kEventsMax && events_[event.index].in_use);
    return events_[event.index];
  }
  CommandStream& stream_of(StreamKind stream) {
    if (stream == StreamKind::kCompute) return compute_;
    return stream == StreamKind::kHostToDevice ? h2d_ : d2h_;
  }
  // Whether [p, p + bytes) lies in the arena or in one pinned allocation of this backend.
  bool backend_memory(const void* p, std::uint64_t bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto base = reinterpret_cast<std::uintptr_t>(base_);
    if (a >= base && a + bytes <= base + arena_.capacity()) return true;
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    auto it = pinned_ranges_.upper_bound(a);
    if (it == pinned_ranges_.begin()) return false;
    --it;
    return a + bytes <= it->first + it->second;
  }

  std::uint8_t* base_;
  Arena arena_;
  const std::string host_budget_name_;
  const std::uint64_t host_budget_;
  const int threads_;
  tbb::task_arena tbb_arena_;
  CpuOps<float> ops_f32_;
  CpuOps<double> ops_f64_;
  CpuOptimizerOps optimizer_ops_;
  const std::optional<std::uint64_t> jitter_seed_;
  CommandStream compute_;  // started only in jitter mode
  CommandStream h2d_;
  CommandStream d2h_;
  QueuedOps<float> queued_f32_;
  QueuedOps<double> queued_f64_;
  QueuedOptimizerOps queued_optimizer_;
  std::vector<EventSlot> events_;
  std::uint32_t next_event_ = 0;
  std::mutex event_mutex_;
  std::condition_variable event_cv_;
  mutable std::mutex pinned_mutex_;
  std::uint64_t pinned_in_use_ = 0;
  std::uint64_t pinned_peak_ = 0;
  std::map<std::uintptr_t, std::uint64_t> pinned_ranges_;  // start -> mapped size
};

void CommandStream::loop() {
  for (;;) {
    Command command;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      not_empty_.wait(lock, [&] { return count_ > 0 || stopping_; });
      if (count_ == 0) return;  // stopping with nothing left
      command = std::move(ring_[head_]);
    }
    if (jitter_) jitter_pause(rng_);
    switch (command.kind) {
      case Command::Kind::kCopy:
        std::memcpy(command.dst, command.src, command.bytes);
        break;
      case Command::Kind::kRecord:
        backend_->complete(command.event, command.ticket);
        break;
      case Command::Kind::kWait:
        backend_->wait_until(command.event, command.ticket);
        break;
      case Command::Kind::kHostFunc:
        command.fn(command.arg);
        break;
      case Command::Kind::kOp:
        command.op();
        break;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      head_ = (head_ + 1) % kQueueCapacity;
      --count_;
      ++done_;
    }
    not_full_.notify_one();
    idle_.notify_all();
  }
}

}  // namespace

std::uint64_t host_memory_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

Result<std::unique_ptr<Backend>> make_cpu_backend(const CpuBackendOptions& options) {
  if (options.device_bytes_max < 4096) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("device budget {} is too small; valid: at least 4 KiB",
                              format_bytes(options.device_bytes_max)),
                  options.device_budget_name);
  }
  std::uint64_t host_budget = options.host_bytes_max;
  if (host_budget == 0) {
    const std::uint64_t available = host_memory_available_bytes();
    host_budget = available > 0 ? available / 5 * 4 : (8ull << 30);
  }
  int threads = options.threads;
  if (threads <= 0) threads = tbb::info::default_concurrency();
  const std::uint64_t capacity = align_up(options.device_bytes_max, 4096);
  void* base = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return Status(ErrorCode::kOutOfMemory,
                  fmt::format("cannot reserve the {} device arena: {}", format_bytes(capacity),
                              std::strerror(errno)),
                  options.device_budget_name);
  }
  auto adam = kernels::AdamKernel::create();
  if (!adam.is_ok()) {
    ::munmap(base, capacity);
    return adam.status();
  }
  CpuBackendOptions effective = options;
  effective.device_bytes_max = capacity;
  const std::optional<std::uint64_t> jitter =
      options.stream_jitter ? options.stream_jitter : stream_jitter_seed();
  return std::unique_ptr<Backend>(
      new CpuBackend(base, effective, host_budget, threads, *adam, jitter));
}

}  // namespace strata::backend

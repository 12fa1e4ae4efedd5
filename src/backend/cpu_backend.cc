// CpuBackend (see cpu_backend.h): capped host arena, pinned accounting, copy-stream threads with
// fixed-capacity queues, CUDA-like events, and ops on a oneTBB arena.
#include "backend/cpu_backend.h"

#include <sys/mman.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/arena.h"
#include "backend/cpu_ops.h"
#include "backend/cpu_optimizer_ops.h"
#include "common/units.h"
#include "kernels/cpu/gemm.h"

namespace strata::backend {
namespace {

constexpr std::size_t kQueueCapacity = 1024;  // commands per copy stream
constexpr std::uint32_t kEventsMax = 4096;

struct EventSlot {
  std::atomic<std::uint64_t> recorded{0};   // records issued (host thread)
  std::atomic<std::uint64_t> completed{0};  // highest record reached by its stream
  bool in_use = false;
};

struct Command {
  enum class Kind : std::uint8_t { kCopy, kRecord, kWait, kHostFunc };
  Kind kind = Kind::kCopy;
  void* dst = nullptr;
  const void* src = nullptr;
  std::uint64_t bytes = 0;
  std::uint32_t event = 0;
  std::uint64_t ticket = 0;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
};

class CpuBackend;

// One copy stream: a thread draining a fixed-capacity ring of commands in order.
class CopyStream {
 public:
  CopyStream(CpuBackend* backend, StreamKind kind) : backend_(backend), kind_(kind) {}
  ~CopyStream() { stop(); }

  void start() {
    worker_ = std::thread([this] { loop(); });
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    not_empty_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  // Blocks while the queue is full (back-pressure), then enqueues.
  void push(const Command& command) {
    std::unique_lock<std::mutex> lock(mutex_);
    not_full_.wait(lock, [&] { return count_ < kQueueCapacity; });
    ring_[(head_ + count_) % kQueueCapacity] = command;
    ++count_;
    ++issued_;
    not_empty_.notify_one();
  }
  // Blocks until every command issued so far has run.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t target = issued_;
    idle_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void loop();

  CpuBackend* backend_;
  StreamKind kind_;
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
             kernels::AdamKernel adam)
      : base_(static_cast<std::uint8_t*>(base)),
        arena_(options.device_bytes_max, "device arena", options.device_budget_name),
        host_budget_name_(options.host_budget_name),
        host_budget_(host_budget),
        threads_(threads),
        tbb_arena_(threads),
        ops_f32_(&tbb_arena_),
        ops_f64_(&tbb_arena_),
        optimizer_ops_(&tbb_arena_, adam),
        h2d_(this, StreamKind::kHostToDevice),
        d2h_(this, StreamKind::kDeviceToHost),
        events_(kEventsMax) {
    kernels::blas_setup();
    h2d_.start();
    d2h_.start();
  }

  ~CpuBackend() override {
    h2d_.stop();
    d2h_.stop();
    ::munmap(base_, arena_.capacity());
  }

  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return fmt::format("cpu: {} compute threads (oneTBB), device arena {}, pinned budget {}; {}",
                       threads_, format_bytes(arena_.capacity()), format_bytes(host_budget_),
                       kernels::blas_description());
  }

  Result<Buffer> allocate_device(std::uint64_t bytes, std::string_view purpose,
                                 std::uint64_t alignment) override {
    STRATA_ASSIGN_OR_RETURN(std::uint64_t offset, arena_.allocate(bytes, alignment, purpose));
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
    if (stream == StreamKind::kCompute) {
      complete(event.index, ticket);
    } else {
      copy_stream(stream).push({Command::Kind::kRecord, nullptr, nullptr, 0, event.index, ticket});
    }
    return Status::ok();
  }

  Status wait(StreamKind stream, Event event) override {
    EventSlot& slot = slot_of(event);
    const std::uint64_t target = slot.recorded.load();
    if (stream == StreamKind::kCompute) {
      wait_until(event.index, target);
    } else {
      copy_stream(stream).push({Command::Kind::kWait, nullptr, nullptr, 0, event.index, target});
    }
    return Status::ok();
  }

  Status synchronize(Event event) override {
    wait_until(event.index, slot_of(event).recorded.load());
    return Status::ok();
  }

  Status synchronize(StreamKind stream) override {
    if (stream != StreamKind::kCompute) copy_stream(stream).drain();
    return Status::ok();
  }

  bool query(Event event) override {
    EventSlot& slot = slot_of(event);
    return slot.completed.load() >= slot.recorded.load();
  }

  Status launch_host_func(StreamKind stream, void (*fn)(void*), void* arg) override {
    STRATA_ASSERT(fn != nullptr);
    if (stream == StreamKind::kCompute) {
      fn(arg);
    } else {
      Command command;
      command.kind = Command::Kind::kHostFunc;
      command.fn = fn;
      command.arg = arg;
      copy_stream(stream).push(command);
    }
    return Status::ok();
  }

  Status copy_async(StreamKind stream, void* dst, const void* src, std::uint64_t bytes) override {
    if (bytes == 0) return Status::ok();
    STRATA_ASSERT(dst != nullptr && src != nullptr);
    if (stream == StreamKind::kCompute) {
      std::memcpy(dst, src, bytes);
    } else {
      copy_stream(stream).push({Command::Kind::kCopy, dst, src, bytes, 0, 0});
    }
    return Status::ok();
  }

  Ops<float>& ops_f32() override { return ops_f32_; }
  Ops<double>* ops_f64() override { return &ops_f64_; }
  OptimizerOps& optimizer_ops() override { return optimizer_ops_; }
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
    ::munmap(data, size);
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    pinned_in_use_ -= size;
  }

 private:
  EventSlot& slot_of(Event event) {
    STRATA_ASSERT(event.valid() && event.index < kEventsMax && events_[event.index].in_use);
    return events_[event.index];
  }
  CopyStream& copy_stream(StreamKind stream) {
    STRATA_ASSERT(stream != StreamKind::kCompute);
    return stream == StreamKind::kHostToDevice ? h2d_ : d2h_;
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
  CopyStream h2d_;
  CopyStream d2h_;
  std::vector<EventSlot> events_;
  std::uint32_t next_event_ = 0;
  std::mutex event_mutex_;
  std::condition_variable event_cv_;
  mutable std::mutex pinned_mutex_;
  std::uint64_t pinned_in_use_ = 0;
  std::uint64_t pinned_peak_ = 0;
};

void CopyStream::loop() {
  for (;;) {
    Command command;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      not_empty_.wait(lock, [&] { return count_ > 0 || stopping_; });
      if (count_ == 0) return;  // stopping with nothing left
      command = ring_[head_];
    }
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
  return std::unique_ptr<Backend>(new CpuBackend(base, effective, host_budget, threads, *adam));
}

}  // namespace strata::backend

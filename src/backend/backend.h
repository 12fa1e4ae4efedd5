// The compute backend: what the trainer, and later the tier manager and prefetch scheduler, know
// about the device. A small interface with one implementation per device kind (CpuBackend here;
// CudaBackend behind the same interface):
//   - device memory from one arena under a hard byte budget (strata.device_bytes_max);
//   - pinned host memory, counted against the host budget;
//   - three streams (compute, host->device, device->host) and events from a fixed pool, with
//     CUDA's semantics: work on one stream runs in order, an event completes when the work before
//     its latest record has completed, a stream can wait for an event;
//   - asynchronous copies on the copy streams;
//   - op dispatch through Ops<T> (backend/ops.h) and OptimizerOps (backend/optimizer_ops.h),
//     executed on the compute stream.
// Errors inside ops (which return nothing, like kernel launches) are sticky: the next call that
// returns a Status (record, wait, synchronize, copy_async, launch_host_func) reports them.
// All functions are called from one host thread (the trainer's), except where a contract says
// otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/fast_path.h"
#include "backend/ops.h"
#include "backend/optimizer_ops.h"
#include "common/status.h"

namespace strata::backend {

enum class StreamKind : std::uint8_t { kCompute = 0, kHostToDevice = 1, kDeviceToHost = 2 };
inline constexpr int kStreamCount = 3;
const char* to_string(StreamKind stream);

enum class MemoryKind : std::uint8_t { kDevice = 0, kPinnedHost = 1 };

// An event from the backend's fixed pool (create_event / destroy_event).
struct Event {
  static constexpr std::uint32_t kInvalid = 0xffffffffu;
  std::uint32_t index = kInvalid;
  bool valid() const { return index != kInvalid; }
};

struct MemoryStats {
  std::uint64_t bytes_max = 0;     // the budget
  std::uint64_t bytes_in_use = 0;  // allocated now
  std::uint64_t bytes_peak = 0;    // most ever allocated at once
};

class Backend;

// Memory from a backend (device arena or pinned host); returned to it on destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::uint64_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Returns the memory now (no-op on an empty buffer).
  void reset();

 private:
  friend class Backend;
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kDevice;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:0".
  virtual std::string name() const = 0;
  // One line for logs: device, threads, libraries.
  virtual std::string description() const = 0;

  // ---- memory ---------------------------------------------------------------------------------
  // `bytes` of device memory from the arena, aligned to `alignment` (a power of two <= 4096).
  // kOutOfMemory naming the budget, the request and `purpose` when it does not fit.
  virtual Result<Buffer> allocate_device(std::uint64_t bytes, std::string_view purpose,
                                         std::uint64_t alignment = 4096) = 0;
  // Page-aligned pinned host memory, counted against the host budget; kOutOfMemory when over.
  virtual Result<Buffer> allocate_pinned(std::uint64_t bytes, std::string_view purpose) = 0;
  // The device arena's budget, use and peak.
  virtual MemoryStats device_memory() const = 0;
  // Pinned host memory's budget, use and peak.
  virtual MemoryStats pinned_memory() const = 0;

  // ---- streams and events ---------------------------------------------------------------------
  // An event from the fixed pool; kOutOfMemory when all are in use.
  virtual Result<Event> create_event() = 0;
  // Returns the event to the pool; it must not be waited on afterwards.
  virtual void destroy_event(Event event) = 0;
  // The event completes when all work issued to `stream` before this call has completed.
  virtual Status record(Event event, StreamKind stream) = 0;
  // Work issued to `stream` after this call starts only once the event's latest record completed.
  virtual Status wait(StreamKind stream, Event event) = 0;
  // Blocks the calling thread until the event's latest record has completed (ok if never recorded).
  virtual Status synchronize(Event event) = 0;
  // Blocks until all work issued to `stream` has completed.
  virtual Status synchronize(StreamKind stream) = 0;
  // Whether the event's latest record has completed, without blocking.
  virtual bool query(Event event) = 0;
  // Runs fn(arg) on `stream` in order with its other work (cudaLaunchHostFunc). fn must not call
  // this backend's stream, event or copy functions.
  virtual Status launch_host_func(StreamKind stream, void (*fn)(void*), void* arg) = 0;

  // ---- copies ---------------------------------------------------------------------------------
  // Copies `bytes` from src to dst in order with `stream`'s other work; either side may be device
  // or pinned host memory of this backend. Returns once queued (asynchronous). On the compute
  // stream a side may also be ordinary (pageable) host memory: that copy has completed when
  // copy_async returns.
  virtual Status copy_async(StreamKind stream, void* dst, const void* src, std::uint64_t bytes) = 0;
  // Whether narrow_async runs here: a kernel queued on a copy stream, beside the compute stream's
  // work (the CUDA backend); false (the default, the CPU backend, whose copy streams are a thread
  // each): callers round on the compute stream (Ops::cast_to) instead.
  virtual bool narrows_on_copy_streams() const { return false; }
  // dst (n elements of 16-bit `type`) = device fp32 src rounded to nearest even (Ops::cast_to's
  // bits), in order with `stream`'s other work, so that a copy of dst queued after it on the same
  // stream sends the result while the compute stream goes on. Only where
  // narrows_on_copy_streams().
  virtual Status narrow_async(StreamKind stream, void* dst, DType type, const float* src,
                              std::int64_t n) {
    (void)stream, (void)dst, (void)type, (void)src, (void)n;
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{} does not narrow on its copy streams", name()));
  }

  // ---- compute --------------------------------------------------------------------------------
  // Model ops in float, on the compute stream.
  virtual Ops<float>& ops_f32() = 0;
  // Model ops in double, or nullptr when the backend has none (CUDA).
  virtual Ops<double>* ops_f64() = 0;
  // Adam and gradient statistics on tiles kept in device memory, on the compute stream.
  virtual OptimizerOps& optimizer_ops() = 0;
  // Host threads for CPU work: the CPU backend's ops split over this many; on the CUDA backend
  // they are the threads the host-side optimizer (CPU Adam) may use.
  virtual int compute_threads() const = 0;
  // The fast paths this backend checked when it started (backend/fast_path.h), on or off, with
  // why; empty where it has none (the CPU backend).
  virtual std::vector<FastPath> fast_paths() const { return {}; }
  // Whether device memory is ordinary host memory (the CPU backend): NVMe reads may then land in
  // it directly, with no staging buffer and no host->device copy.
  virtual bool device_memory_is_host() const { return false; }

  template <typename T>
  Ops<T>* ops();

 protected:
  // Hands out a Buffer over memory this backend allocated.
  Buffer make_buffer(void* data, std::uint64_t bytes, MemoryKind kind);
  // Takes back the memory of a Buffer (called by Buffer's destructor).
  virtual void release(void* data, std::uint64_t bytes, MemoryKind kind) = 0;

  friend class Buffer;
};

template <>
inline Ops<float>* Backend::ops<float>() {
  return &ops_f32();
}
template <>
inline Ops<double>* Backend::ops<double>() {
  return ops_f64();
}

}  // namespace strata::backend

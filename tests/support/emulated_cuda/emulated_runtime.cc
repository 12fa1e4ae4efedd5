// The emulated CUDA runtime (include/cuda_runtime_api.h): one device whose memory is host memory,
// streams that hold their work until the host waits for it (below).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>

#include "kernels/cuda/cublaslt_api.h"
#include "tests/support/emulated_cuda/emulated_cuda.h"

namespace {

struct Runtime {
  std::mutex mutex;
  std::map<const std::uint8_t*, std::size_t> device;      // cudaMalloc'ed ranges
  std::map<const std::uint8_t*, std::size_t> registered;  // cudaHostRegister'ed ranges
  std::atomic<cudaError_t> last_error{cudaSuccess};
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

// Whether p lies in one of `ranges`.
bool inside(const std::map<const std::uint8_t*, std::size_t>& ranges, const void* p) {
  const auto* byte = static_cast<const std::uint8_t*>(p);
  auto it = ranges.upper_bound(byte);
  if (it == ranges.begin()) return false;
  --it;
  return byte < it->first + it->second;
}

constexpr std::size_t kDeviceBytes = 16ull << 30;  // what cudaMemGetInfo reports

void drain_all();  // runs every stream's queue (below)

cudaError_t fail(cudaError_t error) {
  runtime().last_error = error;
  return error;
}

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *prop = {};
  std::strncpy(prop->name, "SIMT emulator", sizeof(prop->name) - 1);
  prop->totalGlobalMem = kDeviceBytes;
  prop->major = 8;
  prop->minor = 0;
  prop->multiProcessorCount = 2;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  *total_bytes = kDeviceBytes;
  std::size_t used = 0;
  std::lock_guard<std::mutex> lock(runtime().mutex);
  for (const auto& [p, bytes] : runtime().device)
    used += bytes;
  *free_bytes = kDeviceBytes > used ? kDeviceBytes - used : 0;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  return runtime().last_error.exchange(cudaSuccess);
}
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorLaunchFailure:
      return "the SIMT emulator failed to run a kernel (see the test failure it reported)";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    default:
      return "an error of the emulated CUDA runtime";
  }
}

// Device memory is host memory, filled with 0xff bytes (NaN in every float type) so that a read
// before the first write shows up in results.
cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  void* memory = std::aligned_alloc(4096, (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (memory == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(memory, 0xff, bytes);
  std::lock_guard<std::mutex> lock(runtime().mutex);
  runtime().device[static_cast<std::uint8_t*>(memory)] = bytes;
  *p = memory;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;  // cudaFree(nullptr) creates the context
  drain_all();                           // it waits for the device, as the real one does
  std::lock_guard<std::mutex> lock(runtime().mutex);
  if (runtime().device.erase(static_cast<std::uint8_t*>(p)) != 1) {
    return fail(cudaErrorInvalidValue);
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* p, std::size_t bytes, unsigned int) {
  std::lock_guard<std::mutex> lock(runtime().mutex);
  if (inside(runtime().registered, p)) return fail(cudaErrorInvalidValue);
  runtime().registered[static_cast<std::uint8_t*>(p)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  std::lock_guard<std::mutex> lock(runtime().mutex);
  return runtime().registered.erase(static_cast<std::uint8_t*>(p)) == 1
             ? cudaSuccess
             : fail(cudaErrorInvalidValue);
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  *attributes = {};
  std::lock_guard<std::mutex> lock(runtime().mutex);
  if (inside(runtime().device, p)) {
    attributes->type = cudaMemoryTypeDevice;
  } else if (inside(runtime().registered, p)) {
    attributes->type = cudaMemoryTypeHost;
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
  }
  attributes->devicePointer = const_cast<void*>(p);
  attributes->hostPointer = const_cast<void*>(p);
  return cudaSuccess;
}

// Streams hold their work until the host waits for it: a stream runs its queue, in order, when
// the host synchronizes it, an event recorded on it, or another stream that waits on one of its
// events, or when it is destroyed or device memory freed. That is the latest any GPU could run
// it, so a read of results the host did not wait for, or a copy between streams without an event,
// sees stale or poisoned bytes instead of passing by luck. One recursive lock serializes all
// stream work (the emulator has one machine anyway).
struct RecordState {  // one cudaEventRecord
  EmulatedCudaStream* stream = nullptr;
  bool done = false;
};
struct EmulatedCudaStream {
  std::deque<std::function<void()>> queue;
  bool draining = false;
};
struct EmulatedCudaEvent {
  std::shared_ptr<RecordState> latest;  // null: never recorded (complete)
};

namespace {

std::recursive_mutex& stream_mutex() {
  static std::recursive_mutex m;
  return m;
}
std::set<EmulatedCudaStream*>& all_streams() {
  static std::set<EmulatedCudaStream*> streams;
  return streams;
}
std::atomic<bool> kernel_failed{false};  // a deferred kernel the emulator could not run

// Runs `stream`'s queue to its end.
void drain(EmulatedCudaStream* stream) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  if (stream->draining) {
    std::fprintf(stderr, "emulated CUDA runtime: a stream waits on itself\n");
    std::abort();
  }
  stream->draining = true;
  while (!stream->queue.empty()) {
    std::function<void()> work = std::move(stream->queue.front());
    stream->queue.pop_front();
    work();
  }
  stream->draining = false;
}

// Runs streams until `record` is complete.
void complete(const std::shared_ptr<RecordState>& record) {
  if (record && !record->done) drain(record->stream);
}

cudaError_t synchronized() {
  return kernel_failed.exchange(false) ? fail(cudaErrorLaunchFailure) : cudaSuccess;
}

void drain_all() {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  for (EmulatedCudaStream* s : all_streams())
    drain(s);
}

}  // namespace

namespace strata::testing::emulated_cuda {

void enqueue(EmulatedCudaStream* stream, std::function<bool()> work) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  stream->queue.push_back([work = std::move(work)] {
    if (!work()) kernel_failed = true;
  });
}

}  // namespace strata::testing::emulated_cuda

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  *stream = new EmulatedCudaStream;
  all_streams().insert(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  drain(stream);
  all_streams().erase(stream);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  drain(stream);
  return synchronized();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  // The wait is for the event's latest record at the time of this call.
  stream->queue.push_back([record = event->latest] { complete(record); });
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  stream->queue.push_back([=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  stream->queue.push_back([=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  stream->queue.push_back([=] { fn(user_data); });
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new EmulatedCudaEvent;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  auto record = std::make_shared<RecordState>();
  record->stream = stream;
  event->latest = record;
  stream->queue.push_back([record] { record->done = true; });
  return cudaSuccess;
}
// Not ready the first time it is asked about an incomplete record, which then runs: a poll
// sees both answers and always ends.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(stream_mutex());
  const std::shared_ptr<RecordState> record = event->latest;
  if (!record || record->done) return cudaSuccess;
  complete(record);
  return fail(cudaErrorNotReady);
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::shared_ptr<RecordState> record;
  {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex());
    record = event->latest;
  }
  complete(record);
  return synchronized();
}

// There is no cuBLASLt under the emulator: the GEMM engine runs its fallback kernel.
STRATA_CUDA_NAMESPACE(cuda) {

Result<const CublasLtApi*> load_cublaslt() {
  return Status(ErrorCode::kUnavailable,
                "the emulated CUDA runtime has no cuBLASLt (the fallback GEMM kernel stands in)",
                "cuBLASLt");
}

}  // STRATA_CUDA_NAMESPACE(cuda)

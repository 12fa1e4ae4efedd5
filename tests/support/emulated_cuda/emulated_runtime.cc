// The emulated CUDA runtime (include/cuda_runtime_api.h): one device whose memory is host memory,
// streams that run each operation as it is enqueued, and the launch log (emulated_cuda.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

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

// Streams and events carry no state: every operation has run by the time its call returns.
struct EmulatedCudaStream {};
struct EmulatedCudaEvent {};

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = new EmulatedCudaStream;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) {
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* user_data) {
  fn(user_data);
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
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) {
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}

// There is no cuBLASLt under the emulator: the GEMM engine runs its fallback kernel.
STRATA_CUDA_NAMESPACE(cuda) {

Result<const CublasLtApi*> load_cublaslt() {
  return Status(ErrorCode::kUnavailable,
                "the emulated CUDA runtime has no cuBLASLt (the fallback GEMM kernel stands in)",
                "cuBLASLt");
}

}  // STRATA_CUDA_NAMESPACE(cuda)

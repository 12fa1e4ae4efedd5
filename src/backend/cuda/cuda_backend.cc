// CudaBackend (see src/backend/cuda_backend.h): one cudaMalloc'ed arena, registered pinned
// mappings, three streams, a fixed event pool, and the ops of kernels/cuda.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <tbb/info.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "backend/alone_check.h"
#include "backend/apart_check.h"
#include "backend/arena.h"
#include "backend/attention_alone_check.h"
#include "backend/attention_check.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/memory_plan.h"
#include "backend/gate_up_check.h"
#include "backend/gelu_check.h"
#include "backend/gemm_check.h"
#include "backend/logits_check.h"
#include "backend/norm_check.h"
#include "backend/norm_grad_check.h"
#include "backend/qkv_alone_check.h"
#include "backend/rope_check.h"
#include "common/fault_points.h"
#include "common/log.h"
#include "common/units.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_plan.h"
#if defined(STRATA_HAVE_CUDNN)
#include "kernels/cuda/cudnn_sdpa.h"
#endif
#include "sys/memory.h"

STRATA_CUDA_NAMESPACE(backend) {
namespace {

constexpr std::uint32_t kEventsMax = 4096;
constexpr std::uint64_t kMiscBytes = 8192;  // reduce partials and result slots

struct EventSlot {
  cudaEvent_t event = nullptr;
  bool in_use = false;
  bool recorded = false;  // since create_event: a never-recorded event is complete
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}

  ~CudaBackend() override {
    for (cudaStream_t stream : streams_) {
      if (stream != nullptr) (void)STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    optimizer_ops_.reset();
    ops_.reset();
#if defined(STRATA_HAVE_CUDNN)
    cudnn_.reset();
#endif
    gemm_.reset();
    internal_.clear();
    pinned_scratch_.reset();
    for (EventSlot& slot : events_) {
      if (slot.event != nullptr) (void)STRATA_CUDA_CHECK(cudaEventDestroy(slot.event));
    }
    for (cudaStream_t stream : streams_) {
      if (stream != nullptr) (void)STRATA_CUDA_CHECK(cudaStreamDestroy(stream));
    }
    if (base_ != nullptr) (void)STRATA_CUDA_CHECK(cudaFree(base_));
  }

  Status init();
  // A fast path's check (`key`: the path, data type, head size and workspace sizes) runs once
  // per process and device: a backend created again with the same settings takes its
  // predecessor's result, as the kernels, the libraries and the device are the same. The attention
  // checks take seconds under the SIMT emulator and tens of milliseconds on a GPU; the others are
  // cheap and always run.
  Status checked_once(const std::string& key, const std::function<Status()>& check);
  void choose_fast_paths(const OpsScratch& scratch);
  void choose_cudnn(const OpsScratch& scratch, const std::vector<std::int64_t>& flash_sizes,
                    bool bf16);
  // The weights' check (kWeights16Name): B rounded to 16 bits and noted as the widening of that
  // copy; the product must read it (the bias then added by the verified kernel).
  Result<bool> widened_product(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                               const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                               const float* bias, float* c, backend::DType type);
  // The activations' companions' check (kActivations16Name): A and B copied into buffers paired
  // with 16-bit companions and written again, unchanged, by a kernel that writes companions
  // (gelu_backward adding GELU'(0) x 0); the product must read both from them (the bias then
  // added by the verified kernel). check_gemm_bias judges the values.
  Result<bool> companion_product(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                 const float* bias, float* c);

  std::string name() const override {
    return fmt::format("cuda:{}", options_.device);
  }
  std::string description() const override {
    return fmt::format(
        "cuda:{} {} (sm_{}{}, {} SMs, {}): device arena {} ({} for the backend's workspaces), "
        "pinned limit {} ({}); {}; {} host threads",
        options_.device, prop_.name, prop_.major, prop_.minor, prop_.multiProcessorCount,
        format_bytes(prop_.totalGlobalMem), format_bytes(arena_->capacity()),
        format_bytes(internal_bytes_), format_bytes(pinned_limit_.bytes), pinned_limit_.reason,
        gemm_->description(), threads_);
  }

  Result<Buffer> allocate_device(std::uint64_t bytes, std::string_view purpose,
                                 std::uint64_t alignment) override {
    STRATA_ASSIGN_OR_RETURN(std::uint64_t offset, arena_->allocate(bytes, alignment, purpose));
    return make_buffer(base_ + offset, bytes, MemoryKind::kDevice);
  }

  Result<Buffer> allocate_pinned(std::uint64_t bytes, std::string_view purpose) override {
    const std::uint64_t size = align_up(std::max<std::uint64_t>(bytes, 1), 4096);
    {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      if (pinned_in_use_ + size > pinned_limit_.bytes) {
        const bool memlock = pinned_limit_.reason == "ulimit -l";
        return Status(
            ErrorCode::kOutOfMemory,
            fmt::format("cannot pin {} for {}: {} of the {} limit ({}) are in use; {}",
                        format_bytes(size), purpose, format_bytes(pinned_in_use_),
                        format_bytes(pinned_limit_.bytes), pinned_limit_.reason,
                        memlock ? "raise the locked-memory limit (ulimit -l unlimited, memlock in "
                                  "/etc/security/limits.conf, or docker --ulimit memlock=-1)"
                                : fmt::format("raise {} or shrink the job", pinned_limit_.reason)),
            "pinned host memory");
      }
      pinned_in_use_ += size;
      pinned_peak_ = std::max(pinned_peak_, pinned_in_use_);
    }
    auto undo = [&] {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      pinned_in_use_ -= size;
    };
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      undo();
      return Status(ErrorCode::kOutOfMemory,
                    fmt::format("mmap of {} for {} failed: {}", format_bytes(size), purpose,
                                std::strerror(err)),
                    "pinned host memory");
    }
    const Status registered =
        STRATA_CUDA_CHECK(cudaHostRegister(p, size, cudaHostRegisterPortable));
    if (!registered.is_ok()) {
      ::munmap(p, size);
      undo();
      return Status(ErrorCode::kOutOfMemory,
                    fmt::format("cannot pin {} for {} ({}); check `ulimit -l`", format_bytes(size),
                                purpose, registered.message()),
                    "pinned host memory");
    }
    return make_buffer(p, bytes, MemoryKind::kPinnedHost);
  }

  MemoryStats device_memory() const override {
    return {arena_->capacity(), arena_->bytes_in_use(), arena_->bytes_peak()};
  }
  MemoryStats pinned_memory() const override {
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    return {pinned_limit_.bytes, pinned_in_use_, pinned_peak_};
  }

  Result<Event> create_event() override {
    for (std::uint32_t i = 0; i < kEventsMax; ++i) {
      const std::uint32_t index = (next_event_ + i) % kEventsMax;
      if (!events_[index].in_use) {
        events_[index].in_use = true;
        events_[index].recorded = false;
        next_event_ = index + 1;
        return Event{index};
      }
    }
    return Status(ErrorCode::kOutOfMemory,
                  fmt::format("all {} events of the CUDA backend are in use", kEventsMax));
  }

  void destroy_event(Event event) override {
    slot_of(event).in_use = false;
  }

  Status record(Event event, StreamKind stream) override {
    STRATA_TRY(sticky());
    EventSlot& slot = slot_of(event);
    STRATA_TRY(STRATA_CUDA_CHECK(cudaEventRecord(slot.event, stream_of(stream))));
    slot.recorded = true;
    return Status::ok();
  }

  Status wait(StreamKind stream, Event event) override {
    STRATA_TRY(sticky());
    EventSlot& slot = slot_of(event);
    if (!slot.recorded) return Status::ok();
    return STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_of(stream), slot.event, 0));
  }

  Status synchronize(Event event) override {
    STRATA_TRY(sticky());
    EventSlot& slot = slot_of(event);
    if (!slot.recorded) return Status::ok();
    STRATA_TRY(STRATA_CUDA_CHECK(cudaEventSynchronize(slot.event)));
    return sticky();
  }

  Status synchronize(StreamKind stream) override {
    STRATA_TRY(sticky());
    STRATA_TRY(STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream))));
    return sticky();
  }

  bool query(Event event) override {
    EventSlot& slot = slot_of(event);
    if (!slot.recorded) return true;
    const cudaError_t result = cudaEventQuery(slot.event);
    if (result == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is an answer, not an error for the next launch
      return false;
    }
    // An error is reported by the next Status-returning call; waiting on it would never end.
    sink_.add(STRATA_CUDA_CHECK(result));
    return true;
  }

  Status launch_host_func(StreamKind stream, void (*fn)(void*), void* arg) override {
    STRATA_ASSERT(fn != nullptr);
    STRATA_TRY(sticky());
    return STRATA_CUDA_CHECK(cudaLaunchHostFunc(stream_of(stream), fn, arg));
  }

  bool narrows_on_copy_streams() const override {
    return true;
  }
  Status narrow_async(StreamKind stream, void* dst, DType type, const float* src,
                      std::int64_t n) override {
    STRATA_ASSERT(type == DType::kBF16 || type == DType::kF16);
    STRATA_TRY(sticky());
    if (n <= 0) return Status::ok();
    gemm_->forget_written(dst, static_cast<std::uint64_t>(n) * 2);  // as Ops::cast_to
    return STRATA_CUDA_CHECK(cuda_kernels::cast(stream_of(stream), dst, static_cast<int>(type), src,
                                                cuda_kernels::kCodeF32, n));
  }

  Status copy_async(StreamKind stream, void* dst, const void* src, std::uint64_t bytes) override {
    if (bytes == 0) return Status::ok();
    STRATA_ASSERT(dst != nullptr && src != nullptr);
    STRATA_TRY(sticky());
    const cudaStream_t s = stream_of(stream);
    STRATA_TRY(STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s)));
    // Pageable host memory: make the copy complete before returning, as the contract says (the
    // caller may reuse or free the memory at once).
    STRATA_ASSIGN_OR_RETURN(bool dst_pageable, pageable(dst));
    STRATA_ASSIGN_OR_RETURN(bool src_pageable, pageable(src));
    if (dst_pageable || src_pageable) {
      STRATA_TRY(STRATA_CUDA_CHECK(cudaStreamSynchronize(s)));
    }
    return Status::ok();
  }

  std::vector<FastPath> fast_paths() const override {
    std::vector<FastPath> paths = fast_paths_.list();
    for (FastPath& p : paths) {
      if (!p.active) continue;
      if (p.name == kFlashAttentionName) {
        p.uses = ops_->flash_calls();
        p.declined = ops_->fp32_attention_calls();
      } else if (p.name == kCudnnAttentionName) {
        p.uses = ops_->cudnn_calls();
        p.declined = ops_->flash_calls() + ops_->fp32_attention_calls();
      } else if (p.name == kResidualNormName) {
        p.uses = ops_->fused_norm_calls();
        p.declined = 0;  // it takes every shape
      } else if (p.name == kWeights16Name) {
        p.uses = gemm_->twin_calls();
      } else if (p.name == kActivations16Name) {
        // GEMM operands, and attention outputs the backward's 16-bit staging read, from their
        // companions.
        p.uses = gemm_->companion_reads() + ops_->staged_companion_reads();
      } else if (p.name == kKeptApartName) {
        p.uses = ops_->apart_reads();
      } else if (p.name == kLogits16Name) {
        p.uses = ops_->narrow_logit_rows();
      } else if (p.name == kGateUp16Name) {
        p.uses = ops_->narrow_swiglu_calls();
      } else if (p.name == kGelu16Name) {
        p.uses = ops_->narrow_gelu_calls();
      } else if (p.name == kGeluGradAloneName) {
        p.uses = ops_->gelu_grad_writes();
      } else if (p.name == kActivations16AloneName) {
        p.uses = ops_->alone_writes();
      } else if (p.name == kAttentionAloneName) {
        p.uses = ops_->attention_alone_writes();
      } else if (p.name == kAttentionGradAloneName) {
        p.uses = ops_->attention_grad_reads();
      } else if (p.name == kSwigluGradAloneName) {
        p.uses = ops_->swiglu_grad_reads();
      } else if (p.name == kNormGradAloneName) {
        p.uses = ops_->norm_grad_reads();
      } else if (p.name == kGateUpGradAloneName) {
        p.uses = ops_->gate_up_grad_writes();
      } else if (p.name == kQkvGradAloneName) {
        p.uses = ops_->qkv_grad_writes();
      } else if (p.name == kQkvAloneName) {
        p.uses = ops_->qkv_alone_reads();
      } else if (p.name == kRopeAttentionName) {
        p.uses = ops_->rotated_attention_calls();
      } else if (p.name == kGemmBiasName) {
        p.uses = gemm_->bias_fused();
        p.declined = gemm_->bias_unfused();
      } else if (p.name == kGemmBiasGeluName) {
        p.uses = gemm_->gelu_fused();
        p.declined = gemm_->gelu_unfused();
      } else if (p.name == kGemmDgeluName) {
        p.uses = gemm_->dgelu_fused();
        p.declined = gemm_->dgelu_unfused();
      } else if (p.name == kGemmResidualName) {
        p.uses = gemm_->residual_fused();
        p.declined = gemm_->residual_unfused();
      } else if (p.name == kGemmBiasGelu16Name) {
        p.uses = gemm_->gelu16_fused();
        p.declined = gemm_->gelu16_unfused();
      } else if (p.name == kGemmDgelu16Name) {
        p.uses = gemm_->dgelu16_fused();
        p.declined = gemm_->dgelu16_unfused();
      }
    }
    return paths;
  }
  Ops<float>& ops_f32() override {
    return *ops_;
  }
  Ops<double>* ops_f64() override {
    return nullptr;
  }
  OptimizerOps& optimizer_ops() override {
    return *optimizer_ops_;
  }
  int compute_threads() const override {
    return threads_;
  }

 protected:
  void release(void* data, std::uint64_t bytes, MemoryKind kind) override {
    if (kind == MemoryKind::kDevice) {
      arena_->free(static_cast<std::uint64_t>(static_cast<std::uint8_t*>(data) - base_));
      return;
    }
    const std::uint64_t size = align_up(std::max<std::uint64_t>(bytes, 1), 4096);
    (void)STRATA_CUDA_CHECK(cudaHostUnregister(data));
    ::munmap(data, size);
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    pinned_in_use_ -= size;
  }

 private:
  Status sticky() const {
    return sink_.first();
  }
  EventSlot& slot_of(Event event) {
    STRATA_ASSERT(event.valid() && event.index < kEventsMax && events_[event.index].in_use);
    return events_[event.index];
  }
  cudaStream_t stream_of(StreamKind stream) const {
    return streams_[static_cast<std::size_t>(stream)];
  }
  // Whether p is host memory CUDA does not know (neither the arena nor registered/pinned).
  Result<bool> pageable(const void* p) const {
    const auto* byte = static_cast<const std::uint8_t*>(p);
    if (byte >= base_ && byte < base_ + arena_->capacity()) return false;
    cudaPointerAttributes attributes{};
    STRATA_TRY(STRATA_CUDA_CHECK(cudaPointerGetAttributes(&attributes, p)));
    return attributes.type == cudaMemoryTypeUnregistered;
  }
  Result<void*> internal(std::uint64_t bytes, const char* purpose) {
    STRATA_ASSIGN_OR_RETURN(Buffer buffer, allocate_device(bytes, purpose, 4096));
    internal_bytes_ += bytes;
    void* p = buffer.data();
    internal_.push_back(std::move(buffer));
    return p;
  }

  CudaBackendOptions options_;
  cudaDeviceProp prop_{};
  int threads_ = 1;
  cudaStream_t streams_[kStreamCount] = {nullptr, nullptr, nullptr};
  std::vector<EventSlot> events_;
  std::uint32_t next_event_ = 0;
  std::uint8_t* base_ = nullptr;
  std::unique_ptr<Arena> arena_;
  PinnedLimit pinned_limit_;
  mutable std::mutex pinned_mutex_;
  std::uint64_t pinned_in_use_ = 0;
  std::uint64_t pinned_peak_ = 0;
  std::vector<Buffer> internal_;  // the backend's own workspaces in the arena
  std::uint64_t internal_bytes_ = 0;
  Buffer pinned_scratch_;
  strata::cuda::ErrorSink sink_;
  std::unique_ptr<strata::cuda::GemmEngine> gemm_;
  std::unique_ptr<CudaOps> ops_;
  std::unique_ptr<CudaOptimizerOps> optimizer_ops_;
  FastPaths fast_paths_;
  // cuDNN's attention borrows the cuBLASLt workspace: both run on the compute stream, in turn.
  void* cublas_workspace_ = nullptr;
  std::uint64_t cublas_workspace_bytes_ = 0;
#if defined(STRATA_HAVE_CUDNN)
  std::unique_ptr<strata::cuda::CudnnAttention> cudnn_;
#endif
};

Status CudaBackend::init() {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    const std::string why =
        counted != cudaSuccess
            ? fmt::format("{} ({})", cudaGetErrorString(counted), cudaGetErrorName(counted))
            : std::string("the CUDA runtime found no device");
    cudaGetLastError();
    return Status(ErrorCode::kUnavailable, "cudaGetDeviceCount: " + why, "CUDA");
  }
  if (options_.device < 0 || options_.device >= count) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("CUDA device {} does not exist; valid: 0 to {}", options_.device, count - 1),
        "CUDA");
  }
  STRATA_TRY(STRATA_CUDA_CHECK(cudaSetDevice(options_.device)));
  STRATA_TRY(STRATA_CUDA_CHECK(cudaFree(nullptr)));  // creates the context now
  STRATA_TRY(STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop_, options_.device)));
  threads_ = options_.cpu_threads > 0 ? options_.cpu_threads : tbb::info::default_concurrency();
  for (cudaStream_t& stream : streams_)
    STRATA_TRY(STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  events_.resize(kEventsMax);
  for (EventSlot& slot : events_) {
    STRATA_TRY(STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&slot.event, cudaEventDisableTiming)));
  }

  // Host budget and the locked-memory limit.
  STRATA_ASSIGN_OR_RETURN(sys::HostMemory host, sys::probe_host_memory());
  std::uint64_t host_budget = options_.host_bytes_max;
  if (host_budget == 0) {
    host_budget = host.available_bytes > 0 ? host.available_bytes / 5 * 4 : (8ull << 30);
  }
  pinned_limit_ = pinned_limit(host_budget, options_.host_budget_name, host.memlock_soft_bytes,
                               host.can_lock_unlimited);

  // The arena: the one cudaMalloc.
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  STRATA_TRY(STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes)));
  std::uint64_t capacity = options_.device_bytes_max;
  if (capacity == 0) {
    if (free_bytes <= options_.device_reserve_bytes) {
      return Status(ErrorCode::kOutOfMemory,
                    fmt::format("GPU {} has only {} free; nothing is left after the {} kept "
                                "for the CUDA context and libraries",
                                options_.device, format_bytes(free_bytes),
                                format_bytes(options_.device_reserve_bytes)),
                    options_.device_budget_name);
    }
    capacity = free_bytes - options_.device_reserve_bytes;
  } else if (capacity > free_bytes) {
    return Status(
        ErrorCode::kOutOfMemory,
        fmt::format("{} is {} but GPU {} ({}) has only {} free", options_.device_budget_name,
                    format_bytes(capacity), options_.device, prop_.name, format_bytes(free_bytes)),
        options_.device_budget_name);
  }
  capacity = capacity / 4096 * 4096;
  const WorkspaceSizes workspaces = plan_workspaces(
      capacity, options_.cublas_workspace_bytes, options_.reduce_scratch_bytes,
      options_.gemm_workspace_bytes, cuda::converts_operands(options_.gemm_precision));
  const std::uint64_t needed = workspaces.total() + kMiscBytes;
  if (capacity < needed + (1u << 20)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("a device budget of {} is too small: the CUDA backend's own "
                              "workspaces take {}",
                              format_bytes(capacity), format_bytes(needed)),
                  options_.device_budget_name);
  }
  void* base = nullptr;
  STRATA_TRY(STRATA_CUDA_CHECK(cudaMalloc(&base, capacity)));
  base_ = static_cast<std::uint8_t*>(base);
  if (stream_jitter_seed()) {
    // The stream-jitter test mode (common/fault_points.h) poisons fresh memory, as the CPU
    // backend's does: all bits set (NaN in every float type), so a read before the first write
    // shows up in results instead of reading the zeros a fresh process often gets.
    STRATA_TRY(STRATA_CUDA_CHECK(cudaMemset(base, 0xff, capacity)));
    STRATA_LOG_INFO("cuda backend: stream-jitter test mode: the {} arena is poisoned (0xff)",
                    format_bytes(capacity));
  }
  arena_ = std::make_unique<Arena>(capacity, "device arena", options_.device_budget_name);

  // The backend's own workspaces, from the arena.
  strata::cuda::GemmEngineConfig gemm;
  gemm.precision = options_.gemm_precision;
  gemm.use_cublaslt = options_.use_cublaslt;
  if (workspaces.cublas_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(gemm.cublas_workspace,
                            internal(workspaces.cublas_bytes, "cuBLASLt workspace"));
    gemm.cublas_workspace_bytes = workspaces.cublas_bytes;
    cublas_workspace_ = gemm.cublas_workspace;
    cublas_workspace_bytes_ = workspaces.cublas_bytes;
  }
  if (workspaces.convert_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(gemm.convert_workspace,
                            internal(workspaces.convert_bytes, "GEMM operand conversion"));
    gemm.convert_elements = static_cast<std::int64_t>(workspaces.convert_bytes / 2);
  }
  OpsScratch scratch;
  STRATA_ASSIGN_OR_RETURN(void* reduce,
                          internal(workspaces.reduce_bytes, "column-reduction scratch"));
  scratch.reduce = static_cast<double*>(reduce);
  scratch.reduce_doubles = static_cast<std::int64_t>(workspaces.reduce_bytes / 8);
  STRATA_ASSIGN_OR_RETURN(void* misc, internal(kMiscBytes, "reduction results"));
  auto* doubles = static_cast<double*>(misc);
  scratch.partials = doubles;
  scratch.sum_result = doubles + 2 * cuda::kReduceBlocks;
  scratch.tile_result = scratch.sum_result + 2;
  static_assert((2 * cuda::kReduceBlocks + 4) * sizeof(double) <= kMiscBytes);
  STRATA_ASSIGN_OR_RETURN(pinned_scratch_, allocate_pinned(64, "reduction read-back"));
  scratch.host = pinned_scratch_.as<double>();

  scratch.sixteen = static_cast<std::uint16_t*>(gemm.convert_workspace);
  scratch.sixteen_elements = gemm.convert_elements;

  STRATA_ASSIGN_OR_RETURN(gemm_,
                          strata::cuda::GemmEngine::create(gemm, stream_of(StreamKind::kCompute)));
  ops_ = std::make_unique<CudaOps>(stream_of(StreamKind::kCompute), gemm_.get(), scratch, &sink_);
  optimizer_ops_ =
      std::make_unique<CudaOptimizerOps>(stream_of(StreamKind::kCompute), scratch, &sink_);
  STRATA_TRY(STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_of(StreamKind::kCompute))));
  STRATA_TRY(sticky());
  choose_fast_paths(scratch);
  return sticky();
}

Status CudaBackend::checked_once(const std::string& key, const std::function<Status()>& check) {
  static std::mutex mutex;
  static std::map<std::string, Status> results;
  const std::string full = fmt::format("device {}: {}", options_.device, key);
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = results.find(full);
    if (it != results.end()) return it->second;
  }
  Status result = check();
  std::lock_guard<std::mutex> lock(mutex);
  return results.emplace(full, std::move(result)).first->second;
}

// The fast paths, each checked on small shapes against its reference (backend/fast_path.h). The
// checks call the launchers directly, not through the ops, so that a refused launch is the check's
// result and not the backend's sticky error.
Result<bool> CudaBackend::widened_product(bool ta, bool tb, std::int64_t m, std::int64_t n,
                                          std::int64_t k, const float* a, std::int64_t lda,
                                          const float* b, std::int64_t ldb, const float* bias,
                                          float* c, backend::DType type) {
  // B's values are 16-bit values: their 16-bit copy, noted as B's source.
  const std::int64_t elements = (tb ? n : k) * ldb;
  STRATA_ASSIGN_OR_RETURN(
      Buffer b16, allocate_device(static_cast<std::uint64_t>(elements) * 2, "GEMM check", 256));
  ops_->cast_to(b16.data(), type, b, elements);
  ops_->note_widened(b, b16.data(), type, elements);
  const std::int64_t before = gemm_->twin_calls();
  const Status product = gemm_->gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
  ops_->forget_widened(b);
  STRATA_TRY(product);
  STRATA_TRY(
      STRATA_CUDA_CHECK(cuda_kernels::add_bias(stream_of(StreamKind::kCompute), c, bias, m, n)));
  STRATA_TRY(synchronize(StreamKind::kCompute));  // b16 is freed on return
  if (gemm_->twin_calls() == before) {
    return Status(ErrorCode::kUnavailable,
                  "the product converted B instead of reading its 16-bit copy");
  }
  return true;
}

Result<bool> CudaBackend::companion_product(bool ta, bool tb, std::int64_t m, std::int64_t n,
                                            std::int64_t k, const float* a, std::int64_t lda,
                                            const float* b, std::int64_t ldb, const float* bias,
                                            float* c) {
  const std::int64_t a_elements = (ta ? k : m) * lda, b_elements = (tb ? n : k) * ldb;
  const std::int64_t most = std::max(a_elements, b_elements);
  const auto bytes = [](std::int64_t elements, std::size_t size) {
    return static_cast<std::uint64_t>(elements) * size;
  };
  STRATA_ASSIGN_OR_RETURN(Buffer wide,
                          allocate_device(bytes(a_elements + b_elements, 4), "GEMM check", 256));
  STRATA_ASSIGN_OR_RETURN(Buffer narrow,
                          allocate_device(bytes(a_elements + b_elements, 2), "GEMM check", 256));
  STRATA_ASSIGN_OR_RETURN(Buffer zeros, allocate_device(bytes(most, 4), "GEMM check", 256));
  float* a2 = wide.as<float>();
  float* b2 = a2 + a_elements;
  auto* a16 = static_cast<std::uint16_t*>(narrow.data());
  ops_->pair_narrow(a2, a16, a_elements);
  ops_->pair_narrow(b2, a16 + a_elements, b_elements);
  ops_->zero(zeros.as<float>(), most);
  ops_->copy(a2, a, a_elements);
  ops_->copy(b2, b, b_elements);
  ops_->gelu_backward(a2, zeros.as<float>(), zeros.as<float>(), a_elements);
  ops_->gelu_backward(b2, zeros.as<float>(), zeros.as<float>(), b_elements);
  const std::int64_t before = gemm_->companion_reads();
  const Status product = gemm_->gemm(ta, tb, m, n, k, 1.0f, a2, lda, b2, ldb, 0.0f, c, n);
  const std::int64_t reads = gemm_->companion_reads() - before;
  ops_->unpair_narrow(a2);
  ops_->unpair_narrow(b2);
  STRATA_TRY(product);
  STRATA_TRY(
      STRATA_CUDA_CHECK(cuda_kernels::add_bias(stream_of(StreamKind::kCompute), c, bias, m, n)));
  STRATA_TRY(synchronize(StreamKind::kCompute));  // the buffers are freed on return
  STRATA_TRY(sink_.first());
  if (reads != 2) {
    return Status(
        ErrorCode::kUnavailable,
        fmt::format("the product read {} of its 2 operands from their companions", reads));
  }
  return true;
}

void CudaBackend::choose_fast_paths(const OpsScratch& scratch) {
  const bool sixteen_bit =
      strata::cuda::converts_operands(options_.gemm_precision) && scratch.sixteen != nullptr;
  const bool bf16 = options_.gemm_precision == strata::cuda::GemmPrecision::kBf16;
  const cudaStream_t stream = stream_of(StreamKind::kCompute);
  AttentionPath flash;
  flash.forward = [&](float* out, float* lse, const float* q, const float* k, const float* v,
                      const AttentionShape& shape) {
    return STRATA_CUDA_CHECK(cuda_kernels::flash_attention_forward_f32(
        stream, bf16, scratch.sixteen, scratch.sixteen_elements, out, lse, q, k, v, shape));
  };
  flash.backward = [&](float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape) {
    return STRATA_CUDA_CHECK(cuda_kernels::flash_attention_backward_f32(
        stream, bf16, scratch.sixteen, scratch.sixteen_elements, dq, dk, dv, dout, out, lse, q, k,
        v, shape));
  };
  std::vector<std::int64_t> head_sizes = choose_flash_attention(
      fast_paths_, sixteen_bit, bf16,
      [&](std::int64_t head_dim) {
        return checked_once(fmt::format("{}:{}:{}:{}", kFlashAttentionName, bf16 ? "bf16" : "fp16",
                                        head_dim, scratch.sixteen_elements),
                            [&] { return check_attention_path(*this, flash, bf16, head_dim); });
      },
      options_.attention_head_sizes);
  ops_->use_flash_attention(bf16, head_sizes);
  choose_cudnn(scratch, head_sizes, bf16);

  // RoPE fused into the 16-bit attention's staging: checked bit for bit against the rope kernel,
  // the flash attention and the rope kernel's backward, at one head size the flash attention took
  // (the staging does not depend on it).
  if (head_sizes.empty()) {
    fast_paths_.not_applicable(kRopeAttentionName, kRopeAttentionReplaces,
                               fmt::format("{} is off (its 16-bit staging is where q and k would "
                                           "be rotated)",
                                           kFlashAttentionName));
  } else {
    RopeAttentionPaths rope;
    rope.rotate = [&](float* x, const RopeShape& shape, const float* cos, const float* sin) {
      return STRATA_CUDA_CHECK(cuda_kernels::rope(stream, x, shape, cos, sin, 1.0f));
    };
    rope.attention = flash;
    rope.rotate_back = [&](float* x, const RopeShape& shape, const float* cos, const float* sin) {
      return STRATA_CUDA_CHECK(cuda_kernels::rope(stream, x, shape, cos, sin, -1.0f));
    };
    rope.forward_rotated = [&](float* out, float* lse, const float* q, const float* k,
                               const float* v, const AttentionShape& shape,
                               const kernels::QkRotation<float>& r) {
      return STRATA_CUDA_CHECK(cuda_kernels::flash_attention_forward_f32(
          stream, bf16, scratch.sixteen, scratch.sixteen_elements, out, lse, q, k, v, shape, {},
          r));
    };
    rope.backward_rotated = [&](float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q, const float* k,
                                const float* v, const AttentionShape& shape,
                                const kernels::QkRotation<float>& r) {
      return STRATA_CUDA_CHECK(cuda_kernels::flash_attention_backward_f32(
          stream, bf16, scratch.sixteen, scratch.sixteen_elements, dq, dk, dv, dout, out, lse, q, k,
          v, shape, {}, r));
    };
    const std::int64_t head_dim = head_sizes.front();
    ops_->use_rope_in_attention(fast_paths_.adopt(
        kRopeAttentionName, kRopeAttentionReplaces,
        "q and k rotated as the 16-bit attention (flash or cuDNN) rounds them, and dq, dk rotated "
        "back as it widens them, with the bits of the rope kernel and the staging; the "
        "activations keep q and k unrotated",
        [&] {
          return checked_once(fmt::format("{}:{}:{}:{}", kRopeAttentionName, bf16 ? "bf16" : "fp16",
                                          head_dim, scratch.sixteen_elements),
                              [&] { return check_rope_in_attention(*this, rope, head_dim); });
        }));
  }

  // The bias in cuBLASLt's epilogue (gemm_bias): checked through the engine itself.
  if (!gemm_->has_cublaslt()) {
    fast_paths_.not_applicable(kGemmBiasName, kGemmBiasReplaces,
                               "cuBLASLt is not used (every GEMM runs Strata's fallback kernel)");
  } else {
    gemm_->use_bias_epilogue(true);
    const bool on = fast_paths_.adopt(
        kGemmBiasName, kGemmBiasReplaces,
        "cuBLASLt's CUBLASLT_EPILOGUE_BIAS on every product that is one cuBLASLt call", [&] {
          return check_gemm_bias(
              *this,
              [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
                  float* c) { return gemm_->gemm_bias(ta, tb, m, n, k, a, lda, b, ldb, bias, c); },
              options_.gemm_precision == strata::cuda::GemmPrecision::kFp16);
        });
    gemm_->use_bias_epilogue(on);
  }

  // The residual add in the product giving each block's output (gemm_residual): checked through
  // the engine itself, with and without a bias.
  if (!gemm_->has_cublaslt()) {
    fast_paths_.not_applicable(kGemmResidualName, kGemmResidualReplaces,
                               "cuBLASLt is not used (every GEMM runs Strata's fallback kernel)");
  } else {
    gemm_->use_residual_epilogue(true);
    gemm_->use_residual_epilogue(fast_paths_.adopt(
        kGemmResidualName, kGemmResidualReplaces,
        "cuBLASLt reading the residual as its C matrix (beta 1) and writing the block's output as "
        "its D, with CUBLASLT_EPILOGUE_BIAS where the projection has a bias, on every such product "
        "that is one cuBLASLt call",
        [&] {
          return check_gemm_residual(
              *this,
              [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
                  const float* residual, float* c) {
                return gemm_->gemm_residual(ta, tb, m, n, k, a, lda, b, ldb, bias, residual, c);
              },
              options_.gemm_precision == strata::cuda::GemmPrecision::kFp16);
        }));
  }

  // The GELU epilogues serve 16-bit GEMM inputs only (the bf16/fp16 runs they are for); their
  // checks hold cuBLASLt's GELU, and its derivative, to this model's tanh form.
  const auto adopt_gelu_epilogue = [&](const char* name, const char* replaces, const char* covers,
                                       const std::function<void(bool)>& use,
                                       const std::function<Status()>& check) {
    if (!gemm_->has_cublaslt() || !sixteen_bit) {
      fast_paths_.not_applicable(
          name, replaces,
          !gemm_->has_cublaslt() ? "cuBLASLt is not used (every GEMM runs Strata's fallback kernel)"
                                 : "GEMM inputs are fp32 or tf32 (it serves bf16 and fp16 runs)");
      return;
    }
    use(true);
    use(fast_paths_.adopt(name, replaces, covers, check));
  };
  // Bias and GELU in the epilogue (gemm_bias_gelu).
  adopt_gelu_epilogue(
      kGemmBiasGeluName, kGemmBiasGeluReplaces,
      "cuBLASLt's CUBLASLT_EPILOGUE_GELU_AUX_BIAS (the pre-activation as its aux output) on every "
      "product that is one cuBLASLt call",
      [&](bool on) { gemm_->use_gelu_epilogue(on); },
      [&] {
        return check_gemm_bias_gelu(
            *this,
            [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, float* pre,
                float* act) {
              return gemm_->gemm_bias_gelu(ta, tb, m, n, k, a, lda, b, ldb, bias, pre, act);
            },
            !bf16);
      });
  // GELU's gradient in the epilogue of the product that gives its output's gradient (gemm_dgelu).
  adopt_gelu_epilogue(
      kGemmDgeluName, kGemmDgeluReplaces,
      "cuBLASLt's CUBLASLT_EPILOGUE_DGELU (the forward's pre-activation as its aux input) on every "
      "product that is one cuBLASLt call",
      [&](bool on) { gemm_->use_dgelu_epilogue(on); },
      [&] {
        return check_gemm_dgelu(
            *this,
            [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, const float* pre, float* dpre) {
              return gemm_->gemm_dgelu(ta, tb, m, n, k, a, lda, b, ldb, pre, dpre);
            },
            !bf16);
      });
  // The GEMMs' 16-bit operands read where they lie, without a conversion: 16-bit GEMM inputs
  // only; each checked with check_gemm_bias on a product that must read them, and `use` turns the
  // path on or off.
  const bool fp16 = options_.gemm_precision == strata::cuda::GemmPrecision::kFp16;
  const backend::DType sixteen = fp16 ? backend::DType::kF16 : backend::DType::kBF16;
  auto adopt_16bit_operands = [&](const char* name, const char* replaces, const char* detail,
                                  const std::function<void(bool)>& use, const GemmBiasFn& product) {
    if (!strata::cuda::converts_operands(options_.gemm_precision)) {
      fast_paths_.not_applicable(name, replaces,
                                 "the GEMM inputs are fp32 (strata.gemm_precision)");
      return;
    }
    use(true);
    use(fast_paths_.adopt(name, replaces, detail,
                          [&] { return check_gemm_bias(*this, product, fp16); }));
  };
  // Weights read from their 16-bit parameters (Ops::note_widened).
  adopt_16bit_operands(
      kWeights16Name, kWeights16Replaces,
      "every product whose B is a weight reads it from the 16-bit parameters (block by block "
      "where A is cut into blocks)",
      [&](bool on) { gemm_->use_weight_twins(on); },
      [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
          float* c) { return widened_product(ta, tb, m, n, k, a, lda, b, ldb, bias, c, sixteen); });
  // Activations' 16-bit companions (Ops::pair_narrow), written by the kernels that write the
  // activations.
  adopt_16bit_operands(
      kActivations16Name, kActivations16Replaces,
      "the kernels writing an activation a GEMM reads (norms, attention, GELU, SwiGLU, RoPE, "
      "cross-entropy) write its 16-bit rounding beside it, and every product reads its operands "
      "from there (block by block where the other is cut into blocks)",
      [&](bool on) { ops_->use_companions(on ? sixteen : backend::DType::kF32); },
      [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
          float* c) { return companion_product(ta, tb, m, n, k, a, lda, b, ldb, bias, c); });
  // A unit's norm weights and biases kept apart from its compute copy (Ops::note_kept_apart): only
  // where the copy leaves out the weights already (their products read the 16-bit parameters).
  if (!fast_paths_.active(kWeights16Name)) {
    fast_paths_.not_applicable(kKeptApartName, kKeptApartReplaces,
                               "the weights are widened into the compute copy (" +
                                   std::string(kWeights16Name) + " is off)");
  } else {
    ops_->use_kept_apart(true);
    KeptApartPath apart;
    apart.note = [&](const float* wide, const float* kept, const std::int64_t* begin,
                     const std::int64_t* n, const std::int64_t* at,
                     int count) { return ops_->note_kept_apart(wide, kept, begin, n, at, count); };
    apart.forget = [&](const float* wide) { ops_->forget_widened(wide); };
    ops_->use_kept_apart(fast_paths_.adopt(
        kKeptApartName, kKeptApartReplaces,
        "the norms' weights and biases and the products' biases of every block and the head, "
        "widened into an fp32 area of their own once per change of the parameters and read there",
        [&] { return check_kept_apart(*this, apart); }));
  }
  // The products written in 16 bits (the head's logits, the Llama family's gate and up) are for
  // runs that read both operands in 16 bits already: gemm_to_16 never cuts a product along k, so
  // it converts A whole (B in blocks of columns where it must).
  const bool operands_16 =
      fast_paths_.active(kWeights16Name) && fast_paths_.active(kActivations16Name);
  const std::string operands_not_16 =
      fmt::format("the product's operands are not both read in 16 bits ({} or {} is off)",
                  kWeights16Name, kActivations16Name);
  // The checks run through ops_: the ops' calls so far, waited for, and their first error.
  const std::function<Status()> ops_finished = [&]() -> Status {
    STRATA_TRY(synchronize(StreamKind::kCompute));
    return sink_.first();
  };
  // The head's logits in 16 bits alone (Ops::logits_in_narrow).
  if (!operands_16) {
    fast_paths_.not_applicable(kLogits16Name, kLogits16Replaces, operands_not_16);
  } else {
    NarrowLogitsPath logits;
    logits.type = sixteen;
    logits.to_narrow = [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                           const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                           void* c, std::int64_t ldc) {
      return gemm_->gemm_to_16(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    };
    logits.from_narrow = [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                             float alpha, const void* a, std::int64_t lda, const float* b,
                             std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
      return gemm_->gemm_from_16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    };
    logits.cross_entropy = [&](bool gradient, void* x, std::int64_t ld, float* losses,
                               const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                               double grad_scale) {
      return STRATA_CUDA_CHECK(
          cuda_kernels::cross_entropy_16(stream, gradient, x, ld, gemm_->sixteen_code(), losses,
                                         targets, rows, vocab, static_cast<float>(grad_scale)));
    };
    ops_->use_narrow_logits(fast_paths_.adopt(
        kLogits16Name, kLogits16Replaces,
        "the head's logits written in 16 bits by their product, read twice by the cross-entropy "
        "(one pass for its statistics, one for the gradient written over them) and by the two "
        "products of the gradient; no fp32 logits",
        [&] { return check_narrow_logits(*this, logits); }));
  }
  // The Llama family's gate and up in 16 bits alone (Ops::keeps_gate_up_narrow).
  if (!operands_16) {
    fast_paths_.not_applicable(kGateUp16Name, kGateUp16Replaces, operands_not_16);
  } else {
    const NarrowGateUpPath gate_up = ops_gate_up_path(*ops_, ops_finished);
    ops_->use_gate_up_narrow(true);
    ops_->use_gate_up_narrow(fast_paths_.adopt(
        kGateUp16Name, kGateUp16Replaces,
        "the Llama family's [gate | up] written in 16 bits by their product (no MLP bias) and read "
        "so by SwiGLU's forward and backward; no fp32 gate and up",
        [&] { return check_narrow_gate_up(*this, gate_up); }));
  }
  // GPT-2's MLP pre-activation in 16 bits (Ops::keeps_gelu_narrow).
  if (!operands_16) {
    fast_paths_.not_applicable(kGelu16Name, kGelu16Replaces, operands_not_16);
  } else {
    const NarrowGeluPath gelu = ops_gelu_path(*ops_, ops_finished);
    ops_->use_gelu_narrow(true);
    ops_->use_gelu_narrow(fast_paths_.adopt(
        kGelu16Name, kGelu16Replaces,
        "GPT-2's MLP pre-activation written in 16 bits by its product and bias (fp32 accumulation "
        "and bias rounded once) and read so by GELU's forward and backward; no fp32 "
        "pre-activation",
        [&] { return check_narrow_gelu(*this, gelu); }));
  }
  // The residual add fused into the norm after it: checked bit for bit against the two launches.
  ResidualNormPath two_launches, one_kernel;
  two_launches.layernorm = [&](float* res, const float* x, float* out, float* mean, float* rstd,
                               const float* w, const float* b, std::int64_t rows,
                               std::int64_t channels, double eps) -> Status {
    STRATA_TRY(STRATA_CUDA_CHECK(cuda_kernels::add(stream, res, res, x, rows * channels)));
    return STRATA_CUDA_CHECK(
        cuda_kernels::layernorm_forward(stream, out, mean, rstd, res, w, b, rows, channels, eps));
  };
  two_launches.rmsnorm = [&](float* res, const float* x, float* out, float* rstd, const float* w,
                             std::int64_t rows, std::int64_t channels, double eps) -> Status {
    STRATA_TRY(STRATA_CUDA_CHECK(cuda_kernels::add(stream, res, res, x, rows * channels)));
    return STRATA_CUDA_CHECK(
        cuda_kernels::rmsnorm_forward(stream, out, rstd, res, w, rows, channels, eps));
  };
  one_kernel.layernorm = [&](float* res, const float* x, float* out, float* mean, float* rstd,
                             const float* w, const float* b, std::int64_t rows,
                             std::int64_t channels, double eps) -> Status {
    return STRATA_CUDA_CHECK(cuda_kernels::add_layernorm_forward(stream, res, x, out, mean, rstd, w,
                                                                 b, rows, channels, eps));
  };
  one_kernel.rmsnorm = [&](float* res, const float* x, float* out, float* rstd, const float* w,
                           std::int64_t rows, std::int64_t channels, double eps) -> Status {
    return STRATA_CUDA_CHECK(
        cuda_kernels::add_rmsnorm_forward(stream, res, x, out, rstd, w, rows, channels, eps));
  };
  ops_->use_fused_residual_norm(fast_paths_.adopt(
      kResidualNormName, kResidualNormReplaces,
      "LayerNorm and RMSNorm after a residual add (each block's second norm), in one kernel with "
      "the bits of the two",
      [&] { return check_residual_norm(*this, two_launches, one_kernel); }));

  // Whether a product reading the n floats at p reads them from a 16-bit companion (the paths kept
  // alone read their activations only once this says so).
  const auto reads_companion = [&](const float* p, std::int64_t n) {
    return gemm_->has_companion(p, n, static_cast<int>(sixteen));
  };
  // The activations only GEMMs read in 16 bits alone (Ops::pair_narrow_alone): where the products
  // read the activations' companions already; checked bit for bit against the companions kept
  // beside, after the residual-norm choice (the norms with the residual add run as the step will).
  if (!fast_paths_.active(kActivations16Name)) {
    fast_paths_.not_applicable(
        kActivations16AloneName, kActivations16AloneReplaces,
        fmt::format("the products do not read the activations' companions ({} is off)",
                    kActivations16Name));
  } else {
    const NarrowAlonePath alone = ops_alone_path(*ops_, reads_companion, ops_finished);
    ops_->use_narrow_alone(true);
    ops_->use_narrow_alone(fast_paths_.adopt(
        kActivations16AloneName, kActivations16AloneReplaces,
        "each block's norm outputs and MLP activation written into their 16-bit companions alone "
        "(no fp32 arrays are allocated for them) and read there by their products; the GEMM with "
        "bias and GELU then runs the product and GELU's kernel",
        [&] { return check_narrow_alone(*this, alone); }));
  }
  // Each block's attention output in 16 bits alone too, where the 16-bit attention writes it and
  // its backward reads it from the companion: checked bit for bit against the output kept beside;
  // then its gradient, written in 16 bits by its product and read in place by the backward: within
  // 1 unit in the last place of the verified product rounded, and the backward's bits on those
  // values. Each at every head size the flash attention took, once per process (their kernels are
  // the flash attention's, whose check runs once too).
  const AttentionAlonePath attention =
      ops_attention_alone_path(*ops_, reads_companion, ops_finished);
  const auto each_head_size =
      [&](const char* name,
          Status (*check)(Backend&, const AttentionAlonePath&, std::int64_t)) -> Status {
    for (const std::int64_t d : head_sizes) {
      STRATA_TRY(checked_once(
          fmt::format("{}:{}:{}:{}", name, bf16 ? "bf16" : "fp16", d, scratch.sixteen_elements),
          [&] { return check(*this, attention, d); }));
    }
    return Status::ok();
  };
  const int attention_code = bf16 ? cuda_kernels::kCodeBF16 : cuda_kernels::kCodeF16;
  // Why the paths kept alone on top of the activations' (and of gate and up's) do not apply.
  const bool activations_alone = fast_paths_.active(kActivations16AloneName);
  const std::string activations_not_alone = fmt::format(
      "the activations are not kept in 16 bits alone ({} is off)", kActivations16AloneName);
  const bool gate_up_alone = activations_alone && fast_paths_.active(kGateUp16Name);
  const std::string gate_up_not_alone = fmt::format(
      "gate and up are not kept in 16 bits alone or the activations are not ({} or {} "
      "is off)",
      kGateUp16Name, kActivations16AloneName);
  if (!activations_alone) {
    fast_paths_.not_applicable(kAttentionAloneName, kAttentionAloneReplaces, activations_not_alone);
  } else if (head_sizes.empty()) {
    fast_paths_.not_applicable(
        kAttentionAloneName, kAttentionAloneReplaces,
        fmt::format("the attention runs in fp32 ({} is off)", kFlashAttentionName));
  } else if (static_cast<int>(sixteen) != attention_code) {
    fast_paths_.not_applicable(kAttentionAloneName, kAttentionAloneReplaces,
                               "the attention's 16-bit type is not the companions'");
  } else {
    ops_->use_attention_alone(true);
    ops_->use_attention_alone(fast_paths_.adopt(
        kAttentionAloneName, kAttentionAloneReplaces,
        fmt::format("each block's attention output written by the 16-bit attention into its "
                    "companion alone (no fp32 array is allocated for it), read there by its "
                    "backward and its products; head sizes {}",
                    fmt::join(head_sizes, ", ")),
        [&] { return each_head_size(kAttentionAloneName, check_attention_alone); }));
  }
  if (!fast_paths_.active(kAttentionAloneName)) {
    fast_paths_.not_applicable(kAttentionGradAloneName, kAttentionGradAloneReplaces,
                               fmt::format("the attention's output is not kept in 16 bits alone "
                                           "({} is off)",
                                           kAttentionAloneName));
  } else {
    ops_->use_attention_grad_alone(true);
    ops_->use_attention_grad_alone(fast_paths_.adopt(
        kAttentionGradAloneName, kAttentionGradAloneReplaces,
        fmt::format("the gradient of each block's attention output written in 16 bits by its "
                    "product (fp32 accumulation rounded once; no fp32 array is allocated for it) "
                    "and read in place by the attention's backward; head sizes {}",
                    fmt::join(head_sizes, ", ")),
        [&] { return each_head_size(kAttentionGradAloneName, check_attention_grad_alone); }));
  }
  // The gradient of the Llama family's SwiGLU output in 16 bits alone, written so by its product
  // and read so by SwiGLU's 16-bit backward: within 1 unit in the last place of the verified
  // product rounded, and the backward's bits on those values.
  if (!gate_up_alone) {
    fast_paths_.not_applicable(kSwigluGradAloneName, kSwigluGradAloneReplaces, gate_up_not_alone);
  } else {
    const SwigluGradAlonePath swiglu_grad = ops_swiglu_grad_path(*ops_, ops_finished);
    ops_->use_swiglu_grad_alone(true);
    ops_->use_swiglu_grad_alone(fast_paths_.adopt(
        kSwigluGradAloneName, kSwigluGradAloneReplaces,
        "the gradient of the Llama family's SwiGLU output written in 16 bits by the down "
        "projection's input gradient (fp32 accumulation rounded once; no fp32 array is allocated "
        "for it) and read so, widened, by SwiGLU's 16-bit backward",
        [&] { return check_swiglu_grad_alone(*this, swiglu_grad); }));
  }
  // The gradient of the Llama family's gate and up in 16 bits alone, written into its companion
  // only by SwiGLU's 16-bit backward and read there by its products: the bits of the companion kept
  // beside the fp32 array.
  if (!gate_up_alone) {
    fast_paths_.not_applicable(kGateUpGradAloneName, kGateUpGradAloneReplaces, gate_up_not_alone);
  } else {
    const GateUpGradAlonePath gate_up_grad =
        ops_gate_up_grad_path(*ops_, reads_companion, ops_finished);
    ops_->use_gate_up_grad_alone(true);
    ops_->use_gate_up_grad_alone(fast_paths_.adopt(
        kGateUpGradAloneName, kGateUpGradAloneReplaces,
        "the gradient of the Llama family's gate and up written by SwiGLU's 16-bit backward into "
        "its 16-bit companion only (no fp32 array is allocated for it) and read there by the "
        "gate/up projection's two products",
        [&] { return check_gate_up_grad_alone(*this, gate_up_grad); }));
  }
  // GPT-2's GELU gradient in 16 bits alone, written into its companion only by GELU's 16-bit
  // backward and read there by its products (the bits of the companion kept beside the fp32 array)
  // and, widened, by its bias's column sums.
  if (!activations_alone || !fast_paths_.active(kGelu16Name)) {
    fast_paths_.not_applicable(
        kGeluGradAloneName, kGeluGradAloneReplaces,
        fmt::format("GELU's input is not kept in 16 bits or the activations are not kept in 16 "
                    "bits alone ({} or {} is off)",
                    kGelu16Name, kActivations16AloneName));
  } else {
    const GeluGradAlonePath gelu_grad = ops_gelu_grad_path(*ops_, reads_companion, ops_finished);
    ops_->use_gelu_grad_alone(true);
    ops_->use_gelu_grad_alone(fast_paths_.adopt(
        kGeluGradAloneName, kGeluGradAloneReplaces,
        "GPT-2's GELU gradient written by GELU's 16-bit backward into its 16-bit companion only "
        "(no "
        "fp32 array is allocated for it) and read there by the fc projection's two products and, "
        "widened, by its bias gradient",
        [&] { return check_gelu_grad_alone(*this, gelu_grad); }));
  }
  // GPT-2's MLP with GELU, and GELU's gradient, back in the product's epilogue with 16-bit outputs
  // (the activation and the gradient kept alone): cuBLASLt's GELU_AUX_BIAS and DGELU with a 16-bit
  // D and aux, or without cuBLASLt Strata's fallback kernel with the same epilogue. Checked through
  // the engine against the product in double, as the fp32 epilogues are.
  const auto adopt_gelu_epilogue_16 = [&](const char* name, const char* replaces,
                                          const char* epilogue, const std::string& not_applicable,
                                          const std::function<void(bool)>& use,
                                          const std::function<Status()>& check) {
    if (!not_applicable.empty()) {
      fast_paths_.not_applicable(name, replaces, not_applicable);
      return;
    }
    use(true);
    use(fast_paths_.adopt(
        name, replaces,
        gemm_->has_cublaslt()
            ? fmt::format("cuBLASLt's {} with a 16-bit D and aux on every such product (the "
                          "unfused kernels where cuBLASLt has no algorithm with it)",
                          epilogue)
            : fmt::format("Strata's fallback GEMM kernel with {}'s arithmetic in its epilogue "
                          "(cuBLASLt is not used)",
                          epilogue),
        check));
  };
  adopt_gelu_epilogue_16(
      kGemmBiasGelu16Name, kGemmBiasGelu16Replaces,
      "CUBLASLT_EPILOGUE_GELU_AUX_BIAS (the activation as D, the pre-activation as aux)",
      activations_alone && fast_paths_.active(kGelu16Name)
          ? std::string()
          : fmt::format("the MLP's activation is not kept in 16 bits alone or its pre-activation "
                        "not in 16 bits ({} or {} is off)",
                        kActivations16AloneName, kGelu16Name),
      [&](bool on) { gemm_->use_gelu_epilogue_16(on); },
      [&] {
        return check_gemm_bias_gelu_16(
            *this,
            [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, void* pre16,
                void* act16) {
              return gemm_->gemm_bias_gelu_to_16(ta, tb, m, n, k, a, lda, b, ldb, bias, nullptr,
                                                 pre16, act16);
            },
            !bf16);
      });
  adopt_gelu_epilogue_16(
      kGemmDgelu16Name, kGemmDgelu16Replaces,
      "CUBLASLT_EPILOGUE_DGELU (GELU's gradient as D, the 16-bit pre-activation as aux)",
      fast_paths_.active(kGeluGradAloneName)
          ? std::string()
          : fmt::format("GELU's gradient is not kept in 16 bits alone ({} is off)",
                        kGeluGradAloneName),
      [&](bool on) { gemm_->use_dgelu_epilogue_16(on); },
      [&] {
        return check_gemm_dgelu_16(
            *this,
            [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, const void* pre16,
                void* dpre16) {
              return gemm_->gemm_dgelu_to_16(ta, tb, m, n, k, a, lda, b, ldb, pre16, dpre16);
            },
            !bf16);
      });
  // Each block's q, k and v in 16 bits alone, written so by their product (with its bias where it
  // has one) and read so (widened) by the attention's staging, rotating or not: within 1 unit in
  // the last place of the verified product rounded, and the attention's bits on those values.
  // Then their gradient, written into its companion only by the attention's backward and read
  // there by its products (and GPT-2's bias gradient): the bits of the companion kept beside the
  // fp32 array. Each at one head size the attention took (the staging does not depend on it); both
  // checks run rotated cases too, so they need rope_in_attention even for GPT-2.
  // Why neither applies (the same conditions for both; empty: they do).
  std::string qkv_not_applicable;
  if (!activations_alone) {
    qkv_not_applicable = activations_not_alone;
  } else if (!fast_paths_.active(kRopeAttentionName)) {
    qkv_not_applicable = fmt::format(
        "the attention does not rotate q and k ({} is off): the rope kernel rotates them in place "
        "in fp32",
        kRopeAttentionName);
  } else if (static_cast<int>(sixteen) != attention_code) {
    qkv_not_applicable = "the attention's 16-bit type is not the companions'";
  }
  const QkvAlonePath qkv_path = ops_qkv_alone_path(*ops_, reads_companion, ops_finished);
  const auto qkv_checked = [&](const char* name,
                               Status (*check)(Backend&, const QkvAlonePath&, std::int64_t)) {
    const std::int64_t head_dim = head_sizes.front();
    return checked_once(fmt::format("{}:{}:{}:{}", name, bf16 ? "bf16" : "fp16", head_dim,
                                    scratch.sixteen_elements),
                        [&] { return check(*this, qkv_path, head_dim); });
  };
  if (!qkv_not_applicable.empty()) {
    fast_paths_.not_applicable(kQkvAloneName, kQkvAloneReplaces, qkv_not_applicable);
  } else {
    ops_->use_qkv_alone(true);
    ops_->use_qkv_alone(fast_paths_.adopt(
        kQkvAloneName, kQkvAloneReplaces,
        "each block's q, k and v written in 16 bits by their product (fp32 accumulation, plus "
        "the bias where the projection has one, rounded once; no fp32 array is allocated for "
        "them) and read so, widened, by the 16-bit attention's staging",
        [&] { return qkv_checked(kQkvAloneName, check_qkv_alone); }));
  }
  if (!qkv_not_applicable.empty()) {
    fast_paths_.not_applicable(kQkvGradAloneName, kQkvGradAloneReplaces, qkv_not_applicable);
  } else {
    ops_->use_qkv_grad_alone(true);
    ops_->use_qkv_grad_alone(fast_paths_.adopt(
        kQkvGradAloneName, kQkvGradAloneReplaces,
        "the gradient of q, k and v written by the 16-bit attention's backward (its epilogue, or "
        "its staging's widening where it rotates q and k) into its 16-bit companion only (no fp32 "
        "array is allocated for it) and read there by the qkv projection's two products and "
        "GPT-2's bias gradient",
        [&] { return qkv_checked(kQkvGradAloneName, check_qkv_grad_alone); }));
  }
  // The gradient of the blocks' norm outputs in 16 bits alone, written so by the projections'
  // input gradients and read so by the norms' backwards: within 1 unit in the last place of the
  // verified product rounded, and the backwards' bits on those values.
  if (!activations_alone) {
    fast_paths_.not_applicable(kNormGradAloneName, kNormGradAloneReplaces, activations_not_alone);
  } else {
    const NormGradAlonePath norm_grad = ops_norm_grad_path(*ops_, ops_finished);
    ops_->use_norm_grad_alone(true);
    ops_->use_norm_grad_alone(fast_paths_.adopt(
        kNormGradAloneName, kNormGradAloneReplaces,
        "the gradient of each block's norm outputs written in 16 bits by the projections' input "
        "gradients (fp32 accumulation rounded once; no fp32 array is allocated for it) and read "
        "so, widened, by LayerNorm's and RMSNorm's backwards",
        [&] { return check_norm_grad_alone(*this, norm_grad); }));
  }
  gemm_->reset_epilogue_counts();  // count the run's calls, not the checks'
  ops_->reset_alone_writes();
  ops_->reset_attention_alone_writes();
  ops_->reset_gradient_reads();
  ops_->reset_narrow_swiglu_calls();
  ops_->reset_fused_norm_calls();
  ops_->reset_apart_reads();
  ops_->reset_narrow_logit_rows();
  ops_->reset_rotated_attention_calls();
  ops_->reset_staged_companion_reads();
}

// cuDNN's fused attention over the flash attention's staging (kernels/cuda/cudnn_sdpa.h), for the
// head sizes the flash attention took, each checked on the flash attention's cases without packed
// documents.
void CudaBackend::choose_cudnn(const OpsScratch& scratch,
                               const std::vector<std::int64_t>& flash_sizes, bool bf16) {
#if defined(STRATA_HAVE_CUDNN)
  namespace sc = strata::cuda;
  // Not applicable without the library or a workspace to lend it (library); a handle cuDNN
  // refuses fails every head size's check (created).
  Status library = Status::ok();
  Status created = Status::ok();
  if (!flash_sizes.empty()) {
    Result<const sc::CudnnApi*> api = sc::load_cudnn();
    if (!api.is_ok()) {
      library = api.status();
    } else if (cublas_workspace_ == nullptr) {
      library =
          Status(ErrorCode::kUnavailable, "no cuBLASLt workspace to lend it (cuBLASLt is off)");
    } else {
      Result<std::unique_ptr<sc::CudnnAttention>> made = sc::CudnnAttention::create(
          stream_of(StreamKind::kCompute), cublas_workspace_, cublas_workspace_bytes_);
      if (made.is_ok()) {
        cudnn_ = std::move(made).value();
        cudnn_->set_bf16(bf16);
      } else {
        created = made.status();
      }
    }
  }
  sc::CudnnAttention* cudnn = cudnn_.get();
  const std::int64_t elements = scratch.sixteen_elements;
  // Both directions' passes of a shape (launch_plan.h's plan_flash_io), the full one and the
  // last: ok when cuDNN's plans for all of them build, else the first reason not.
  const auto prepared = [cudnn, bf16, elements](const AttentionShape& s) -> Status {
    for (const bool backward : {false, true}) {
      const std::int64_t rows =
          sc::plan_flash_io(s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim, backward, elements)
              .batch_rows;
      if (rows <= 0) {
        return Status(ErrorCode::kUnavailable, "one batch row does not fit the 16-bit workspace");
      }
      if (rows < s.batch && (s.heads * s.seq_len) % 4 != 0) {
        return Status(ErrorCode::kUnavailable,
                      "the lse of a pass after the first would not be 16-byte aligned");
      }
      for (const std::int64_t b : {std::min(rows, s.batch), s.batch % rows}) {
        if (b == 0) continue;
        AttentionShape pass = s;
        pass.batch = b;
        STRATA_TRY(cudnn->prepare(sc::sdpa_spec(pass, bf16)));
      }
    }
    return Status::ok();
  };
  const cudaStream_t stream = stream_of(StreamKind::kCompute);
  // A call's result: cuDNN's own error behind cudaErrorUnknown, else the CUDA error.
  const auto staged_result = [cudnn](cudaError_t err) -> Status {
    if (err == cudaSuccess) return Status::ok();
    Status why = cudnn->take_error();
    return why.is_ok() ? STRATA_CUDA_CHECK(err) : why;
  };
  AttentionPath path;
  path.forward = [&](float* out, float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& shape) -> Status {
    STRATA_TRY(prepared(shape).with_context("building cuDNN's plans"));
    return staged_result(cuda_kernels::attention16_forward_f32(
        stream, bf16, *cudnn, scratch.sixteen, elements, out, lse, q, k, v, shape));
  };
  path.backward = [&](float* dq, float* dk, float* dv, const float* dout, const float* out,
                      const float* lse, const float* q, const float* k, const float* v,
                      const AttentionShape& shape) -> Status {
    return staged_result(
        cuda_kernels::attention16_backward_f32(stream, bf16, *cudnn, scratch.sixteen, elements, dq,
                                               dk, dv, dout, out, lse, q, k, v, shape));
  };
  std::vector<std::int64_t> sizes =
      choose_cudnn_attention(fast_paths_, flash_sizes, bf16, library, [&](std::int64_t d) {
        if (!created.is_ok()) return created;
        return checked_once(
            fmt::format("{}:{}:{}:{}:{}", kCudnnAttentionName, bf16 ? "bf16" : "fp16", d, elements,
                        cublas_workspace_bytes_),
            [&] { return check_attention_path(*this, path, bf16, d, /*documents=*/false); });
      });
  if (sizes.empty()) {
    cudnn_.reset();
    return;
  }
  CudaOps::StagedAttention staged;
  staged.inner = cudnn;
  staged.head_sizes = std::move(sizes);
  staged.accepts = [prepared](const AttentionShape& s) { return prepared(s).is_ok(); };
  staged.take_error = [cudnn] { return cudnn->take_error(); };
  staged.refused = [this](const Status& why) {
    fast_paths_.disable(kCudnnAttentionName,
                        fmt::format("a call was refused at run time: {}", why.to_string()));
  };
  ops_->use_cudnn_attention(std::move(staged));
#else
  (void)scratch;
  choose_cudnn_attention(
      fast_paths_, flash_sizes, bf16,
      Status(ErrorCode::kUnavailable,
             "this build has no cuDNN attention (cuDNN 9's headers were not found at build "
             "time)"),
      nullptr);
#endif
}

}  // namespace

bool cuda_backend_built() {
  return true;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  auto backend = std::make_unique<CudaBackend>(options);
  STRATA_TRY(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // STRATA_CUDA_NAMESPACE(backend)

// The CUDA backend run on the CPU (issue 36, item 2): the backend's own host code
// (src/backend/cuda, kernels/cuda/*.cc) built with STRATA_CUDA_EMULATED against the stand-in
// runtime in include/, its kernels' own source (kernels/cuda/*.cu and *_kernels.cuh) launched
// through the SIMT emulator (tests/support/simt_emulator.h), and Strata's fallback GEMM kernel
// standing in for cuBLASLt. That build's code lives in the inline namespace `emulated`
// (kernels/cuda/cuda_namespace.h), so a test program also linking the real CUDA backend keeps the
// two apart.
//
// The launch log records every kernel the emulated backend launches, by the kernel function's name,
// in launch order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

struct EmulatedCudaStream;  // cudaStream_t of the emulated runtime

namespace strata::testing::emulated_cuda {

// Queues `work` on `stream` (the emulated launcher's kernels); false from it is a kernel the
// emulator could not run, reported by the next synchronization as cudaErrorLaunchFailure.
void enqueue(EmulatedCudaStream* stream, std::function<bool()> work);

// The kernels launched since the last clear, by name (e.g. "cast_block_kernel"), in order.
std::vector<std::string> launch_log();
// The same, only the kernels launched on the stream the GEMMs run on (the compute stream: the
// kernels a GEMM waits behind; a copy stream's run beside them).
std::vector<std::string> compute_stream_log();
void clear_launch_log();

// The family a kernel belongs to, for counting a step's launches ("gemm", "cast", "attention",
// "norm", "elementwise", "loss", "adam", "reduce", "embedding", "rope", "other").
std::string kernel_family(const std::string& kernel);
// Launches of the kernel named `kernel` in `log`.
std::int64_t launches_of(const std::vector<std::string>& log, const std::string& kernel);
// Launches per family in `log`.
std::map<std::string, std::int64_t> launches_by_family(const std::vector<std::string>& log);
// The cast kernels that feed a GEMM: each run of cast kernels launched right before a GEMM kernel
// (with nothing else between them) counts; casts whose next kernel is something else (the flash
// attention's staging, the parameters' casts) do not.
std::int64_t casts_before_gemms(const std::vector<std::string>& log);
// Those casts by kernel name (the part before its template arguments and parameters).
std::map<std::string, std::int64_t> casts_before_gemms_by_kernel(
    const std::vector<std::string>& log);
// For each GEMM kernel, how many of the casts right before it narrow an fp32 operand to 16 bits
// (cast_block_kernel): GEMMs by that number (0, 1 or 2 operands converted).
std::map<int, std::int64_t> gemms_by_operands_narrowed(const std::vector<std::string>& log);

}  // namespace strata::testing::emulated_cuda

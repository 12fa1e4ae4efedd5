// The start-up check of an attention fast path that computes in 16 bits on the backend's fp32
// arrays (the tensor-core flash attention on the CUDA backend,
// kernels/cuda/flash_attention_f32.cuh), and the choice of the head sizes it runs for. CUDA-free:
// the CUDA backend passes its launchers, the tests fakes and the emulated kernels on the CPU
// backend.
//
// The check runs the path, forward and backward, on the backend's memory for small cases of one
// head size (GQA, partial tiles, packed documents, a sliding window), on inputs exactly
// representable in the 16-bit type, and compares every element with the CPU reference computed in
// double (kernels/cpu/nn_ops.h, the reference the fp32 CUDA kernels are verified against) within
// the bounds derived from 16-bit rounding in kernels/cpu/flash_attention_check.h. An error from
// the path, an element over its bound or a padding column written fails it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "backend/fast_path.h"
#include "common/status.h"
#include "kernels/cpu/flash_attention_check.h"

namespace strata::backend {

// An attention implementation on device fp32 arrays, with Ops<float>'s contracts; each call
// returns the launch's result (the check then synchronizes the compute stream).
struct AttentionPath {
  std::function<Status(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape)>
      forward;
  std::function<Status(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape)>
      backward;
};

// The cases the check runs for one head size and 16-bit type; `documents` false: none with packed
// documents (a path that declines them).
std::vector<kernels::flash_check::FlashCase> attention_check_cases(bool bf16, std::int64_t head_dim,
                                                                   bool documents = true);

// OK, or an error naming the case, the tensor, the first element over its bound with its value,
// the reference and the bound (or the path's own error).
Status check_attention_path(Backend& backend, const AttentionPath& path, bool bf16,
                            std::int64_t head_dim, bool documents = true);

// The flash attention's head sizes.
inline constexpr std::int64_t kFlashHeadSizes[] = {64, 80, 96, 128, 256};
inline constexpr const char* kFlashAttentionName = "flash_attention";
inline constexpr const char* kFlashAttentionReplaces = "the fp32 attention kernels (CUDA cores)";

// Which head sizes the flash attention runs for: `check(head_dim)` for each of kFlashHeadSizes that
// is in `wanted` (the run's head sizes; empty: all of them), listed in `paths` as
// kFlashAttentionName: on for the sizes that passed (one warning naming any that failed, and why),
// off when none did. Not applicable, nothing checked: `sixteen_bit` false (fp32 or tf32 GEMMs), or
// none of `wanted` has flash kernels. Returns the sizes that passed.
std::vector<std::int64_t> choose_flash_attention(
    FastPaths& paths, bool sixteen_bit, bool bf16,
    const std::function<Status(std::int64_t head_dim)>& check,
    const std::vector<std::int64_t>& wanted = {});

// cuDNN's fused attention over the flash attention (kernels/cuda/cudnn_sdpa.h): checked on the
// same cases without packed documents (which it declines), for the head sizes the flash attention
// took; it needs the flash attention on, as the path its declined calls take.
inline constexpr const char* kCudnnAttentionName = "cudnn_attention";
inline constexpr const char* kCudnnAttentionReplaces = "flash_attention (Strata's own kernels)";

// Which head sizes cuDNN's attention runs for: not applicable (nothing checked) when
// `flash_sizes` is empty or `library` is not ok (cuDNN not built in or not loadable: its message
// is the reason); else `check(head_dim)` for each of flash_sizes, listed like the flash attention.
std::vector<std::int64_t> choose_cudnn_attention(
    FastPaths& paths, const std::vector<std::int64_t>& flash_sizes, bool bf16,
    const Status& library, const std::function<Status(std::int64_t head_dim)>& check);

}  // namespace strata::backend

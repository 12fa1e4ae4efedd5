// The start-up check of RoPE fused into the 16-bit attention's staging (`rope_in_attention`,
// Ops::attention_rotates): q and k are rotated as the attention rounds them to 16 bits
// (kernels/cuda/flash_attention_f32.cuh), in place of the rope kernel rotating them in place in
// fp32 before the attention; the backward's dq and dk are rotated back as they are widened, in
// place of the rope kernel's backward after it. CUDA-free: the CUDA backend passes its launchers,
// the tests fakes and the emulated kernels on the CPU backend.
//
// The fused staging is built to give the bits of the rope kernel followed by the plain staging
// (the same rotation arithmetic, then the same rounding), and the backward's widening of dq and dk
// the bits of the plain widening followed by the rope kernel's backward, so the check asks for
// exactly those bits: on the backend's memory, for two cases of one head size (GQA with the whole
// head rotated; a partial rotary width with packed documents and a sliding window), q, k and v side
// by side in each row as the model keeps them, the fused path's out, lse, dq, dk and dv are
// compared bit for bit with the verified path's, and its q and k must be left unrotated.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/attention_check.h"
#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kRopeAttentionName = "rope_in_attention";
inline constexpr const char* kRopeAttentionReplaces =
    "the rope kernel rotating q and k in place before the attention (q and k read and written "
    "once more in fp32)";

// The two paths on device fp32 arrays; each call returns the launch's result (the check then
// synchronizes the compute stream).
struct RopeAttentionPaths {
  // The verified path: rope_forward's rotation in place, then the attention of the rotated q, k,
  // then rope_backward's rotation back of dq and dk in place.
  std::function<Status(float* x, const RopeShape& shape, const float* cos, const float* sin)>
      rotate;
  AttentionPath attention;
  std::function<Status(float* dx, const RopeShape& shape, const float* cos, const float* sin)>
      rotate_back;
  // The fused path: Ops::attention_forward_rotated and attention_backward_rotated (dq and dk
  // rotated back).
  std::function<Status(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, const kernels::QkRotation<float>& rope)>
      forward_rotated;
  std::function<Status(float* dq, float* dk, float* dv, const float* dout, const float* out,
                       const float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, const kernels::QkRotation<float>& rope)>
      backward_rotated;
};

// OK, or an error naming the case, the tensor and the first element whose bits differ (or a
// path's own error).
Status check_rope_in_attention(Backend& backend, const RopeAttentionPaths& paths,
                               std::int64_t head_dim);

}  // namespace strata::backend

// The start-up check of the parameters kept apart (`params_kept_apart`, Ops::note_kept_apart): a
// unit's norm weights and biases widened once per change of the parameters into an fp32 area of
// their own, and read there by the kernels, instead of widened into the unit's fp32 compute copy
// at every use of the unit. CUDA-free: the CUDA backend passes its ops, the tests fakes on the CPU
// backend.
//
// The kernels are the same either way, only the address they read changes, so the check asks for
// the verified path's bits: on the backend's memory, a LayerNorm, an RMSNorm and a product with a
// bias (the bias epilogue where it is on) read their weights and biases through a copy noted as
// keeping them apart, the copy itself filled with NaN, and give the bits of the same ops reading
// the widened values directly.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kKeptApartName = "params_kept_apart";
inline constexpr const char* kKeptApartReplaces =
    "each block's norm weights and biases widened into its fp32 compute copy at every use of the "
    "block";

// How a backend keeps parameters apart: `note` as Ops::note_kept_apart (false: refused), `forget`
// as Ops::forget_widened.
struct KeptApartPath {
  std::function<bool(const float* wide, const float* apart, const std::int64_t* begin,
                     const std::int64_t* n, const std::int64_t* at, int count)>
      note;
  std::function<void(const float* wide)> forget;
};

// OK, or an error naming the op and the first element that differs from the verified path (or the
// refusal, or an op's own error). Runs the ops of backend.ops_f32().
Status check_kept_apart(Backend& backend, const KeptApartPath& path);

}  // namespace strata::backend

// Host-callable launches of the tensor-core flash attention forward and backward
// (kernels/cuda/flash_attention_kernels.cuh, flash_attention_backward_kernels.cuh) for
// tests/kernels/flash_attention_gputest.cc: the kernels are not behind the backend yet, and a gtest
// file is plain C++, so the launches live in flash_attention_gputest.cu (built into the gpu test
// program only with CUDA, STRATA_HAVE_CUDA). Pointers are device memory (q, k, v, out, dout 16-byte
// aligned; shape.positions too when set); layouts are those of the kernel header. Each call waits
// for the device before and after, so it orders itself with work on any stream. Returns "" or what
// went wrong (the CUDA error's text).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/nn_ops.h"

namespace strata::testing {

// The instantiated head sizes here: 64 and 128 (the ptx check compiles every head size).
inline bool flash_gpu_head_dim(std::int64_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}

// One forward pass, bf16 (else fp16) elements.
std::string flash_forward_on_gpu(bool bf16, std::uint16_t* out, float* lse, const std::uint16_t* q,
                                 const std::uint16_t* k, const std::uint16_t* v,
                                 const kernels::AttentionShape& shape);

// `warmup` forward passes, then `runs` more, each timed alone with CUDA events: their
// milliseconds, in order, in `ms`.
std::string time_flash_forward_on_gpu(bool bf16, std::uint16_t* out, float* lse,
                                      const std::uint16_t* q, const std::uint16_t* k,
                                      const std::uint16_t* v, const kernels::AttentionShape& shape,
                                      int warmup, int runs, std::vector<double>& ms);

// One backward pass, bf16 (else fp16) elements: writes dq (q_stride), dk and dv (kv_stride), and
// `delta`, the kernel's fp32 workspace of batch * heads * seq_len floats (D = rowsum(dO * O));
// dout and out have out_stride, lse is the forward's (batch, heads, seq_len).
std::string flash_backward_on_gpu(bool bf16, std::uint16_t* dq, std::uint16_t* dk,
                                  std::uint16_t* dv, float* delta, const std::uint16_t* dout,
                                  const std::uint16_t* out, const float* lse,
                                  const std::uint16_t* q, const std::uint16_t* k,
                                  const std::uint16_t* v, const kernels::AttentionShape& shape);

// `warmup` backward passes, then `runs` more, each timed alone: as time_flash_forward_on_gpu.
std::string time_flash_backward_on_gpu(bool bf16, std::uint16_t* dq, std::uint16_t* dk,
                                       std::uint16_t* dv, float* delta, const std::uint16_t* dout,
                                       const std::uint16_t* out, const float* lse,
                                       const std::uint16_t* q, const std::uint16_t* k,
                                       const std::uint16_t* v, const kernels::AttentionShape& shape,
                                       int warmup, int runs, std::vector<double>& ms);

}  // namespace strata::testing

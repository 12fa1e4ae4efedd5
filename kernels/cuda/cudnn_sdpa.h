// cuDNN's fused flash attention (cuDNN 9's backend graph API), the `cudnn_attention` fast path
// over Strata's own tensor-core flash attention: it runs on the same 16-bit staging
// (flash_attention_f32.cuh, through cuda_kernels::Attention16), so the fp32 activations, the
// passes of whole batch rows and the lse layout are the flash path's.
//
// The graphs are cuDNN's composite scaled-dot-product-attention patterns, built node by node:
//   forward:  S = (Q·Kᵀ)·scale, causal (and sliding-window) masks as index comparisons selecting
//             -inf, softmax with stats = max + log Σexp (Strata's lse), O = P·V;
//   backward: S recomputed from Q, K and the stats, dV = Pᵀ·dO, dS = P∘(dO·Vᵀ −
//   rowsum(dO∘O))·scale,
//             dK = dSᵀ·Q, dQ = dS·K, with grouped KV heads summed by reductions.
// The backward is the deterministic form: dQ comes straight from its product (no fp32 accumulator
// updated with atomics), and engines cuDNN marks NONDETERMINISTIC are never chosen, so its bits do
// not depend on timing. Packed documents (per-token positions) are not expressed: calls with them
// take the flash kernels. Each spec's two plans are built once per process and device (cuDNN's
// heuristics, mode A; building may compile kernels, so every backend of a process shares them),
// and their workspace must fit the one the backend lends (the cuBLASLt workspace: same stream, so
// never in use by both at once). One cuDNN handle per device serves every backend of the process;
// a call sets its stream on it and enqueues, under a lock.
#pragma once

#include <cuda_runtime_api.h>

#include <compare>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/cpu/nn_ops.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/cudnn_api.h"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(cuda) {

// One pass's attention on the compact 16-bit layout.
struct SdpaSpec {
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t window = 0;
  float scale = 0.0f;
  bool bf16 = true;
  auto operator<=>(const SdpaSpec&) const = default;
};
SdpaSpec sdpa_spec(const kernels::AttentionShape& pass, bool bf16);

// Builds the forward (backward) graph's tensors and operations for `spec` with the library and
// finalizes every one of them, without a handle or a device: what a machine without a GPU can
// check of the graphs (tests/kernels/cudnn_sdpa_gputest.cc). The number of operation nodes, or
// an error naming the node and cuDNN's message.
Result<int> finalize_sdpa_nodes(const CudnnApi& api, const SdpaSpec& spec, bool backward);

class CudnnAttention final : public cuda_kernels::Attention16 {
 public:
  // Calls on `stream` (of the current device); the plans' workspace is `workspace`
  // (workspace_bytes, device memory).
  static Result<std::unique_ptr<CudnnAttention>> create(cudaStream_t stream, void* workspace,
                                                        std::size_t workspace_bytes);
  // For tests on the CPU: over `api` (a fake table) and its `handle`, with plans of its own.
  static std::unique_ptr<CudnnAttention> for_test(const CudnnApi* api, void* handle,
                                                  cudaStream_t stream, void* workspace,
                                                  std::size_t workspace_bytes);
  ~CudnnAttention() override;
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Builds (once per process and device) the forward and backward plans of `spec`: ok when both
  // run here, else why not (kUnavailable; kept, so a spec is tried once).
  Status prepare(const SdpaSpec& spec);

  // Attention16: the prepared spec of `pass`; cudaErrorUnknown on a failure, whose Status
  // take_error() then returns.
  cudaError_t forward(std::uint16_t* out, float* lse, const std::uint16_t* q,
                      const std::uint16_t* k, const std::uint16_t* v,
                      const kernels::AttentionShape& pass) const override;
  cudaError_t backward(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv, float* delta,
                       const std::uint16_t* dout, const std::uint16_t* out, const float* lse,
                       const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                       const kernels::AttentionShape& pass) const override;
  Status take_error() const;

  bool bf16() const { return bf16_; }
  void set_bf16(bool bf16) { bf16_ = bf16; }
  // "cuDNN 9.26.0 (/path/libcudnn.so.9)"
  std::string describe() const;

  struct Device;  // the process's handle and plans on one device
  struct Plans;

 private:
  CudnnAttention(Device* device, cudaStream_t stream, void* workspace, std::size_t workspace_bytes);
  cudaError_t run(const Plans& plans, bool backward, const void* const* pointers) const;
  const Plans* find(const kernels::AttentionShape& pass) const;

  Device* device_;
  std::unique_ptr<Device> own_device_;  // for_test's
  cudaStream_t stream_;
  void* workspace_;
  std::size_t workspace_bytes_;
  bool bf16_ = true;
  mutable Status error_;
};

}  // STRATA_CUDA_NAMESPACE(cuda)

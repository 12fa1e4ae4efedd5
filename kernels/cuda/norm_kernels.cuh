// LayerNorm, RMSNorm, bias gradients and the embedding backward (contracts in launch.h), with
// their launch functions (generic over the launcher, see device_math.cuh). Row statistics
// accumulate in double, as on the CPU. Parameter gradients are column reductions over rows done
// deterministically in two passes: fixed chunks of rows write double partials to the scratch,
// then one thread per column adds them in chunk order (launch_plan.h). The embedding backward adds
// each token's rows in row order, like the CPU kernel, so its result is the CPU's bit for bit.
#pragma once

#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {
namespace {

constexpr int kRowWarps = 4;  // rows per block of the row kernels (a warp per row)
constexpr int kColumnThreads = 256;

// A null `out` with a companion: the companion alone is written (an activation kept in 16 bits
// alone), the same bits.
// kResidual: the residual add fused in front (res += add, then the norm of res): x is res, read,
// and written back through res_out; the sum is the add kernel's (res + add in fp32), so the bits
// are those of add then the plain kernel.
template <bool kResidual>
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* x,
                                         float* res_out, const float* add, const float* w,
                                         const float* b, std::int64_t rows, std::int64_t channels,
                                         double eps, Narrow narrow) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float* xr = kResidual ? res_out + row * channels : x + row * channels;
  double s = 0.0;
  for (std::int64_t c = lane; c < channels; c += 32) {
    float v = x[row * channels + c];
    if constexpr (kResidual) {
      v = v + add[row * channels + c];
      res_out[row * channels + c] = v;
    }
    s += static_cast<double>(v);
  }
  const double m = warp_sum(s) / static_cast<double>(channels);
  double v = 0.0;
  for (std::int64_t c = lane; c < channels; c += 32) {
    const double d = static_cast<double>(xr[c]) - m;
    v += d * d;
  }
  v = warp_sum(v) / static_cast<double>(channels);
  const float mr = static_cast<float>(m);
  const float rs = static_cast<float>(1.0 / sqrt(v + eps));
  for (std::int64_t c = lane; c < channels; c += 32) {
    const float y = (xr[c] - mr) * rs * w[c] + b[c];
    if (out != nullptr) out[row * channels + c] = y;
    store_narrow(narrow, row * channels + c, y);
  }
  if (lane == 0) {
    mean[row] = mr;
    rstd[row] = rs;
  }
}

// dout's element i as fp32: dout's, or dout16's widened where it is set (a gradient kept in 16 bits
// alone; dout is then null).
__device__ __forceinline__ float grad_at(const float* dout, Sixteen dout16, std::int64_t i) {
  return dout16.p != nullptr ? float_from_16_bits(dout16.p[i], dout16.code) : dout[i];
}

// A row of dout, read through grad_at.
struct GradRow {
  const float* f;
  Sixteen h;
  std::int64_t at;
  __device__ __forceinline__ float operator[](std::int64_t c) const {
    return grad_at(f, h, at + c);
  }
};

__global__ void layernorm_dx_kernel(float* dx, const float* dout, Sixteen dout16, const float* x,
                                    const float* w, const float* mean, const float* rstd,
                                    std::int64_t rows, std::int64_t channels, Narrow narrow) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float* xr = x + row * channels;
  const GradRow dr{dout, dout16, row * channels};
  const float m = mean[row];
  const float rs = rstd[row];
  double dnorm_mean = 0.0;
  double dnorm_xhat_mean = 0.0;
  for (std::int64_t c = lane; c < channels; c += 32) {
    const double xhat = static_cast<double>((xr[c] - m) * rs);
    const double dnorm = static_cast<double>(dr[c] * w[c]);
    dnorm_mean += dnorm;
    dnorm_xhat_mean += dnorm * xhat;
  }
  const float a = static_cast<float>(warp_sum(dnorm_mean) / static_cast<double>(channels));
  const float bb = static_cast<float>(warp_sum(dnorm_xhat_mean) / static_cast<double>(channels));
  float* dxr = dx + row * channels;
  for (std::int64_t c = lane; c < channels; c += 32) {
    const float xhat = (xr[c] - m) * rs;
    dxr[c] += (dr[c] * w[c] - a - xhat * bb) * rs;
    store_narrow(narrow, row * channels + c, dxr[c]);
  }
}

// kResidual: as layernorm_forward_kernel's.
template <bool kResidual>
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* x, float* res_out,
                                       const float* add, const float* w, std::int64_t rows,
                                       std::int64_t channels, double eps, Narrow narrow) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float* xr = kResidual ? res_out + row * channels : x + row * channels;
  double s = 0.0;
  for (std::int64_t c = lane; c < channels; c += 32) {
    float v = x[row * channels + c];
    if constexpr (kResidual) {
      v = v + add[row * channels + c];
      res_out[row * channels + c] = v;
    }
    s += static_cast<double>(v) * static_cast<double>(v);
  }
  s = warp_sum(s);
  const float rs = static_cast<float>(1.0 / sqrt(s / static_cast<double>(channels) + eps));
  for (std::int64_t c = lane; c < channels; c += 32) {
    const float y = w[c] * (xr[c] * rs);
    if (out != nullptr) out[row * channels + c] = y;
    store_narrow(narrow, row * channels + c, y);
  }
  if (lane == 0) rstd[row] = rs;
}

__global__ void rmsnorm_dx_kernel(float* dx, const float* dout, Sixteen dout16, const float* x,
                                  const float* w, const float* rstd, std::int64_t rows,
                                  std::int64_t channels, Narrow narrow) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float* xr = x + row * channels;
  const GradRow dr{dout, dout16, row * channels};
  const float rs = rstd[row];
  double dot = 0.0;
  for (std::int64_t c = lane; c < channels; c += 32)
    dot += static_cast<double>(dr[c] * w[c]) * static_cast<double>(xr[c] * rs);
  const float mdot = static_cast<float>(warp_sum(dot) / static_cast<double>(channels));
  float* dxr = dx + row * channels;
  for (std::int64_t c = lane; c < channels; c += 32) {
    dxr[c] += rs * (dr[c] * w[c] - (xr[c] * rs) * mdot);
    store_narrow(narrow, row * channels + c, dxr[c]);
  }
}

// Per-head RMSNorm (Qwen3's q_norm / k_norm): a warp per (row, head) vector of D values at
// x + row*x_stride + head*D.
__global__ void rmsnorm_heads_forward_kernel(float* out, float* rstd, const float* x,
                                             const float* w, std::int64_t rows, std::int64_t heads,
                                             std::int64_t head_dim, std::int64_t x_stride,
                                             std::int64_t out_stride, double eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (v >= rows * heads) return;
  const std::int64_t r = v / heads, h = v - r * heads;
  const float* xr = x + r * x_stride + h * head_dim;
  double s = 0.0;
  for (std::int64_t c = lane; c < head_dim; c += 32)
    s += static_cast<double>(xr[c]) * static_cast<double>(xr[c]);
  s = warp_sum(s);
  const float rs = static_cast<float>(1.0 / sqrt(s / static_cast<double>(head_dim) + eps));
  float* o = out + r * out_stride + h * head_dim;
  for (std::int64_t c = lane; c < head_dim; c += 32)
    o[c] = w[c] * (xr[c] * rs);
  if (lane == 0) rstd[v] = rs;
}

// In place: d holds dout on entry and dx on return (each element depends on its own dout and the
// vector's dot product, taken before any is overwritten).
__global__ void rmsnorm_heads_dx_kernel(float* d, const float* x, const float* w, const float* rstd,
                                        std::int64_t rows, std::int64_t heads,
                                        std::int64_t head_dim, std::int64_t d_stride,
                                        std::int64_t x_stride, Narrow narrow) {
  const int lane = threadIdx.x & 31;
  const std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (v >= rows * heads) return;
  const std::int64_t r = v / heads, h = v - r * heads;
  const float* xr = x + r * x_stride + h * head_dim;
  float* dr = d + r * d_stride + h * head_dim;
  const float rs = rstd[v];
  double dot = 0.0;
  for (std::int64_t c = lane; c < head_dim; c += 32)
    dot += static_cast<double>(dr[c] * w[c]) * static_cast<double>(xr[c] * rs);
  const float mdot = static_cast<float>(warp_sum(dot) / static_cast<double>(head_dim));
  for (std::int64_t c = lane; c < head_dim; c += 32) {
    dr[c] = rs * (dr[c] * w[c] - (xr[c] * rs) * mdot);
    store_narrow(narrow, r * d_stride + h * head_dim + c, dr[c]);
  }
}

// dw of the per-head RMSNorm, pass 1: like column_partials_kernel over the rows*heads vectors
// (vector v = row v / heads, head v % heads), in vector order within a chunk.
__global__ void rmsnorm_heads_partials_kernel(const float* d, const float* x, const float* rstd,
                                              std::int64_t vectors, std::int64_t heads,
                                              std::int64_t head_dim, std::int64_t d_stride,
                                              std::int64_t x_stride, std::int64_t per_chunk,
                                              double* scratch) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= head_dim) return;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t v0 = chunk * per_chunk;
  const std::int64_t v1 = v0 + per_chunk < vectors ? v0 + per_chunk : vectors;
  double acc = 0.0;
  for (std::int64_t v = v0; v < v1; ++v) {
    const std::int64_t r = v / heads, h = v - r * heads;
    const float xhat = x[r * x_stride + h * head_dim + c] * rstd[v];
    acc += static_cast<double>(d[r * d_stride + h * head_dim + c] * xhat);
  }
  scratch[chunk * head_dim + c] = acc;
}

// What a column reduction adds per (row, column), for up to two arrays.
enum class ColumnTerm { kLayerNorm, kRmsNorm, kBias };

struct ColumnInputs {
  const float* dout;
  const float* x;
  const float* mean;
  const float* rstd;
  Sixteen dout16 = {};  // set: dout in 16 bits (dout null), read widened
};

// Pass 1: blockIdx.y is the chunk; each thread owns one column and walks the chunk's rows in order.
template <ColumnTerm kTerm>
__global__ void column_partials_kernel(ColumnInputs in, std::int64_t rows, std::int64_t channels,
                                       std::int64_t rows_per_chunk, double* scratch) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t r0 = chunk * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  double acc0 = 0.0;
  double acc1 = 0.0;
  for (std::int64_t r = r0; r < r1; ++r) {
    const float d = grad_at(in.dout, in.dout16, r * channels + c);
    if constexpr (kTerm == ColumnTerm::kLayerNorm) {
      const float xhat = (in.x[r * channels + c] - in.mean[r]) * in.rstd[r];
      acc0 += static_cast<double>(d * xhat);
      acc1 += static_cast<double>(d);
    } else if constexpr (kTerm == ColumnTerm::kRmsNorm) {
      acc0 += static_cast<double>(d * (in.x[r * channels + c] * in.rstd[r]));
    } else {
      acc0 += static_cast<double>(d);
    }
  }
  constexpr int kArrays = kTerm == ColumnTerm::kLayerNorm ? 2 : 1;
  scratch[(chunk * kArrays) * channels + c] = acc0;
  if constexpr (kArrays == 2) scratch[(chunk * kArrays + 1) * channels + c] = acc1;
}

// Pass 2: out_a[c] += sum of the chunks' partials, in chunk order (and out_b for two arrays).
// The loads of kFinishBatch chunks go out before their adds, which keep the chunk order (the same
// bits): one chunk at a time, each add waited for its load, and with 512 chunks of 768 columns the
// kernel took 63 us on an H200, 3 ms of a GPT-2 step.
constexpr int kFinishBatch = 16;

__global__ void column_finish_kernel(float* out_a, float* out_b, const double* scratch,
                                     std::int64_t chunks, std::int64_t channels, int arrays) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  double a = 0.0;
  double b = 0.0;
  std::int64_t k = 0;
  for (; k + kFinishBatch <= chunks; k += kFinishBatch) {
    double va[kFinishBatch];
    double vb[kFinishBatch];
    STRATA_UNROLL
    for (int j = 0; j < kFinishBatch; ++j) {
      const double* row = scratch + ((k + j) * arrays) * channels + c;
      va[j] = row[0];
      vb[j] = arrays == 2 ? row[channels] : 0.0;
    }
    STRATA_UNROLL
    for (int j = 0; j < kFinishBatch; ++j) {
      a += va[j];
      b += vb[j];
    }
  }
  for (; k < chunks; ++k) {
    a += scratch[(k * arrays) * channels + c];
    if (arrays == 2) b += scratch[(k * arrays + 1) * channels + c];
  }
  out_a[c] += static_cast<float>(a);
  if (arrays == 2) out_b[c] += static_cast<float>(b);
}

// dwpe[t] += dout rows r with r % T == t, in row order.
__global__ void embedding_wpe_backward_kernel(float* dwpe, const float* dout, std::int64_t rows,
                                              std::int64_t seq_len, std::int64_t channels) {
  const std::int64_t total = seq_len * channels;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t t = i / channels;
    const std::int64_t c = i - t * channels;
    float acc = dwpe[i];
    for (std::int64_t r = t; r < rows; r += seq_len)
      acc += dout[r * channels + c];
    dwpe[i] = acc;
  }
}

constexpr int kEmbedThreads = 256;
constexpr int kEmbedColumnsPerThread = 4;
constexpr int kEmbedColumnsPerBlock = kEmbedThreads * kEmbedColumnsPerThread;

// Block (r, column chunk): if row r holds the first occurrence of its token, it adds every row
// with that token, in row order, into dwte[token] for its columns; other blocks exit.
__global__ void embedding_wte_backward_kernel(float* dwte, const float* dout,
                                              const std::int32_t* tokens, std::int64_t rows,
                                              std::int64_t channels, std::int32_t padding_idx) {
  __shared__ int list[kEmbedThreads];
  __shared__ int warp_counts[kEmbedThreads / 32];
  const std::int64_t r = blockIdx.x;
  const std::int32_t token = tokens[r];
  if (token == padding_idx) return;  // nn.Embedding's padding_idx: no gradient (uniform exit)
  for (std::int64_t base = 0; base < r; base += kEmbedThreads) {
    const std::int64_t i = base + threadIdx.x;
    const int hit = (i < r && tokens[i] == token) ? 1 : 0;
    if (__syncthreads_or(hit)) return;  // an earlier row owns this token (uniform exit)
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const std::int64_t c0 =
      static_cast<std::int64_t>(blockIdx.y) * kEmbedColumnsPerBlock + threadIdx.x;
  float* e = dwte + static_cast<std::int64_t>(token) * channels;
  float acc[kEmbedColumnsPerThread];
  for (int u = 0; u < kEmbedColumnsPerThread; ++u) {
    const std::int64_t c = c0 + u * kEmbedThreads;
    acc[u] = c < channels ? e[c] : 0.0f;
  }
  for (std::int64_t base = r; base < rows; base += kEmbedThreads) {
    const std::int64_t i = base + threadIdx.x;
    const bool hit = i < rows && tokens[i] == token;
    const unsigned ballot = __ballot_sync(kFullMask, hit);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0;
    int total = 0;
    for (int w2 = 0; w2 < kEmbedThreads / 32; ++w2) {
      if (w2 < warp) offset += warp_counts[w2];
      total += warp_counts[w2];
    }
    if (hit) list[offset + __popc(ballot & ((1u << lane) - 1u))] = static_cast<int>(i - base);
    __syncthreads();
    for (int k = 0; k < total; ++k) {
      const float* d = dout + (base + list[k]) * channels;
      for (int u = 0; u < kEmbedColumnsPerThread; ++u) {
        const std::int64_t c = c0 + u * kEmbedThreads;
        if (c < channels) acc[u] += d[c];
      }
    }
    __syncthreads();  // list and warp_counts are rewritten next round
  }
  for (int u = 0; u < kEmbedColumnsPerThread; ++u) {
    const std::int64_t c = c0 + u * kEmbedThreads;
    if (c < channels) e[c] = acc[u];
  }
}

dim3 row_grid(std::int64_t rows) {
  return dim3(static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps));
}

template <ColumnTerm kTerm, typename L>
auto run_column_reduce(const L& launch, float* out_a, float* out_b, const ColumnInputs& in,
                       std::int64_t rows, std::int64_t channels, const cuda::ColumnReducePlan& plan,
                       double* scratch) {
  constexpr int kArrays = kTerm == ColumnTerm::kLayerNorm ? 2 : 1;
  const unsigned col_blocks =
      static_cast<unsigned>((channels + kColumnThreads - 1) / kColumnThreads);
  auto err =
      launch(column_partials_kernel<kTerm>, dim3(col_blocks, static_cast<unsigned>(plan.chunks)),
             dim3(kColumnThreads), 0, in, rows, channels, plan.rows_per_chunk, scratch);
  if (!launched(err)) return err;
  return launch(column_finish_kernel, dim3(col_blocks), dim3(kColumnThreads), 0, out_a, out_b,
                static_cast<const double*>(scratch), plan.chunks, channels, kArrays);
}

template <typename L>
auto run_layernorm_forward(const L& launch, float* out, float* mean, float* rstd, const float* x,
                           const float* w, const float* b, std::int64_t rows, std::int64_t channels,
                           double eps, Narrow narrow = {}) {
  return launch(layernorm_forward_kernel<false>, row_grid(rows), dim3(kRowWarps * 32), 0, out, mean,
                rstd, x, static_cast<float*>(nullptr), static_cast<const float*>(nullptr), w, b,
                rows, channels, eps, narrow);
}

// res += x, then out = LayerNorm(res), in one kernel: the bits of add, then run_layernorm_forward.
template <typename L>
auto run_add_layernorm_forward(const L& launch, float* res, const float* x, float* out, float* mean,
                               float* rstd, const float* w, const float* b, std::int64_t rows,
                               std::int64_t channels, double eps, Narrow narrow = {}) {
  return launch(layernorm_forward_kernel<true>, row_grid(rows), dim3(kRowWarps * 32), 0, out, mean,
                rstd, static_cast<const float*>(res), res, x, w, b, rows, channels, eps, narrow);
}

template <typename L>
auto run_layernorm_backward(const L& launch, float* dx, float* dw, float* db, const float* dout,
                            const float* x, const float* w, const float* mean, const float* rstd,
                            std::int64_t rows, std::int64_t channels,
                            const cuda::ColumnReducePlan& plan, double* scratch, Narrow narrow = {},
                            Sixteen dout16 = {}) {
  auto err = launch(layernorm_dx_kernel, row_grid(rows), dim3(kRowWarps * 32), 0, dx, dout, dout16,
                    x, w, mean, rstd, rows, channels, narrow);
  if (!launched(err)) return err;
  return run_column_reduce<ColumnTerm::kLayerNorm>(
      launch, dw, db, ColumnInputs{dout, x, mean, rstd, dout16}, rows, channels, plan, scratch);
}

template <typename L>
auto run_rmsnorm_forward(const L& launch, float* out, float* rstd, const float* x, const float* w,
                         std::int64_t rows, std::int64_t channels, double eps, Narrow narrow = {}) {
  return launch(rmsnorm_forward_kernel<false>, row_grid(rows), dim3(kRowWarps * 32), 0, out, rstd,
                x, static_cast<float*>(nullptr), static_cast<const float*>(nullptr), w, rows,
                channels, eps, narrow);
}

// res += x, then out = RMSNorm(res), in one kernel: the bits of add, then run_rmsnorm_forward.
template <typename L>
auto run_add_rmsnorm_forward(const L& launch, float* res, const float* x, float* out, float* rstd,
                             const float* w, std::int64_t rows, std::int64_t channels, double eps,
                             Narrow narrow = {}) {
  return launch(rmsnorm_forward_kernel<true>, row_grid(rows), dim3(kRowWarps * 32), 0, out, rstd,
                static_cast<const float*>(res), res, x, w, rows, channels, eps, narrow);
}

template <typename L>
auto run_rmsnorm_backward(const L& launch, float* dx, float* dw, const float* dout, const float* x,
                          const float* w, const float* rstd, std::int64_t rows,
                          std::int64_t channels, const cuda::ColumnReducePlan& plan,
                          double* scratch, Narrow narrow = {}, Sixteen dout16 = {}) {
  auto err = launch(rmsnorm_dx_kernel, row_grid(rows), dim3(kRowWarps * 32), 0, dx, dout, dout16, x,
                    w, rstd, rows, channels, narrow);
  if (!launched(err)) return err;
  return run_column_reduce<ColumnTerm::kRmsNorm>(launch, dw, nullptr,
                                                 ColumnInputs{dout, x, nullptr, rstd, dout16}, rows,
                                                 channels, plan, scratch);
}

// Whether a norm backward's dout is given once: fp32 or 16 bits, not both, not neither.
inline bool norm_backward_dout_valid(const float* dout, Sixteen dout16) {
  return (dout == nullptr) != (dout16.p == nullptr);
}

template <typename L>
auto run_rmsnorm_heads_forward(const L& launch, float* out, float* rstd, const float* x,
                               const float* w, std::int64_t rows, std::int64_t heads,
                               std::int64_t head_dim, std::int64_t x_stride,
                               std::int64_t out_stride, double eps) {
  return launch(rmsnorm_heads_forward_kernel, row_grid(rows * heads), dim3(kRowWarps * 32), 0, out,
                rstd, x, w, rows, heads, head_dim, x_stride, out_stride, eps);
}

// dw first (it reads dout), then dx over dout. `plan` splits rows * heads vectors of head_dim.
template <typename L>
auto run_rmsnorm_heads_backward(const L& launch, float* d, float* dw, const float* x,
                                const float* w, const float* rstd, std::int64_t rows,
                                std::int64_t heads, std::int64_t head_dim, std::int64_t d_stride,
                                std::int64_t x_stride, const cuda::ColumnReducePlan& plan,
                                double* scratch, Narrow narrow = {}) {
  const unsigned col_blocks =
      static_cast<unsigned>((head_dim + kColumnThreads - 1) / kColumnThreads);
  auto err =
      launch(rmsnorm_heads_partials_kernel, dim3(col_blocks, static_cast<unsigned>(plan.chunks)),
             dim3(kColumnThreads), 0, static_cast<const float*>(d), x, rstd, rows * heads, heads,
             head_dim, d_stride, x_stride, plan.rows_per_chunk, scratch);
  if (!launched(err)) return err;
  err = launch(column_finish_kernel, dim3(col_blocks), dim3(kColumnThreads), 0, dw,
               static_cast<float*>(nullptr), static_cast<const double*>(scratch), plan.chunks,
               head_dim, 1);
  if (!launched(err)) return err;
  return launch(rmsnorm_heads_dx_kernel, row_grid(rows * heads), dim3(kRowWarps * 32), 0, d, x, w,
                rstd, rows, heads, head_dim, d_stride, x_stride, narrow);
}

template <typename L>
auto run_bias_backward(const L& launch, float* dbias, const float* dout, std::int64_t rows,
                       std::int64_t channels, const cuda::ColumnReducePlan& plan, double* scratch,
                       Sixteen dout16 = {}) {
  return run_column_reduce<ColumnTerm::kBias>(launch, dbias, nullptr,
                                              ColumnInputs{dout, nullptr, nullptr, nullptr, dout16},
                                              rows, channels, plan, scratch);
}

template <typename L>
auto run_embedding_backward(const L& launch, float* dwte, float* dwpe, const float* dout,
                            const std::int32_t* tokens, const std::int32_t* positions,
                            std::int64_t rows, std::int64_t seq_len, std::int64_t channels,
                            std::int32_t padding_idx) {
  const unsigned col_chunks =
      static_cast<unsigned>((channels + kEmbedColumnsPerBlock - 1) / kEmbedColumnsPerBlock);
  auto err = launch(embedding_wte_backward_kernel, dim3(static_cast<unsigned>(rows), col_chunks),
                    dim3(kEmbedThreads), 0, dwte, dout, tokens, rows, channels, padding_idx);
  if (!launched(err) || dwpe == nullptr) return err;
  if (positions != nullptr) {
    // Packed positions repeat like token ids: the same ordered gather, keyed by position.
    return launch(embedding_wte_backward_kernel, dim3(static_cast<unsigned>(rows), col_chunks),
                  dim3(kEmbedThreads), 0, dwpe, dout, positions, rows, channels, -1);
  }
  return launch(embedding_wpe_backward_kernel,
                dim3(static_cast<unsigned>(cuda::elementwise_blocks(seq_len * channels))),
                dim3(cuda::kElementwiseThreads), 0, dwpe, dout, rows, seq_len, channels);
}

}  // namespace
}  // STRATA_CUDA_NAMESPACE(cuda_kernels)

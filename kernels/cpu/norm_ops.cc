// Embedding, LayerNorm, RMSNorm and per-head RMSNorm, forward and backward (contracts in nn_ops.h).
// Row statistics accumulate in double. Parameter gradients are reduced over rows column by column:
// each task owns a range of columns and walks the rows in order, so the sum order is fixed.
#include <cmath>
#include <vector>

#include "common/assert.h"
#include "kernels/cpu/nn_ops.h"
#include "kernels/cpu/parallel.h"

namespace strata::kernels {
namespace {

constexpr std::int64_t kColumnGrain = 32;

}  // namespace

template <typename T>
void embedding_forward(T* out, const std::int32_t* tokens, const std::int32_t* positions,
                       const T* wte, const T* wpe, std::int64_t rows, std::int64_t seq_len,
                       std::int64_t channels) {
  STRATA_ASSERT(seq_len > 0 && channels > 0);
  parallel_chunks(rows, rows_grain(channels), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* e = wte + static_cast<std::int64_t>(tokens[r]) * channels;
      T* o = out + r * channels;
      if (wpe != nullptr) {
        const T* p = wpe + (positions != nullptr ? positions[r] : r % seq_len) * channels;
        for (std::int64_t c = 0; c < channels; ++c)
          o[c] = e[c] + p[c];
      } else {
        for (std::int64_t c = 0; c < channels; ++c)
          o[c] = e[c];
      }
    }
  });
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens,
                        const std::int32_t* positions, std::int64_t rows, std::int64_t seq_len,
                        std::int64_t channels, std::int32_t padding_idx) {
  // Column ranges in parallel; within a range, rows in order: a fixed summation order even when
  // a token repeats.
  parallel_chunks(channels, kColumnGrain, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* d = dout + r * channels;
      if (tokens[r] != padding_idx) {
        T* e = dwte + static_cast<std::int64_t>(tokens[r]) * channels;
        for (std::int64_t c = c0; c < c1; ++c)
          e[c] += d[c];
      }
      if (dwpe != nullptr) {
        T* p = dwpe + (positions != nullptr ? positions[r] : r % seq_len) * channels;
        for (std::int64_t c = c0; c < c1; ++c)
          p[c] += d[c];
      }
    }
  });
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                       std::int64_t rows, std::int64_t channels, double eps) {
  parallel_chunks(rows, rows_grain(channels), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * channels;
      double s = 0.0;
      for (std::int64_t c = 0; c < channels; ++c)
        s += static_cast<double>(xr[c]);
      const double m = s / static_cast<double>(channels);
      double v = 0.0;
      for (std::int64_t c = 0; c < channels; ++c) {
        const double d = static_cast<double>(xr[c]) - m;
        v += d * d;
      }
      v /= static_cast<double>(channels);
      const T mr = static_cast<T>(m);
      const T rs = static_cast<T>(1.0 / std::sqrt(v + eps));
      T* o = out + r * channels;
      for (std::int64_t c = 0; c < channels; ++c)
        o[c] = (xr[c] - mr) * rs * w[c] + b[c];
      mean[r] = mr;
      rstd[r] = rs;
    }
  });
}

template <typename T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                        const T* rstd, std::int64_t rows, std::int64_t channels) {
  parallel_chunks(rows, rows_grain(channels), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * channels;
      const T* dr = dout + r * channels;
      const T m = mean[r];
      const T rs = rstd[r];
      double dnorm_mean = 0.0;
      double dnorm_xhat_mean = 0.0;
      for (std::int64_t c = 0; c < channels; ++c) {
        const double xhat = static_cast<double>((xr[c] - m) * rs);
        const double dnorm = static_cast<double>(dr[c] * w[c]);
        dnorm_mean += dnorm;
        dnorm_xhat_mean += dnorm * xhat;
      }
      dnorm_mean /= static_cast<double>(channels);
      dnorm_xhat_mean /= static_cast<double>(channels);
      const T a = static_cast<T>(dnorm_mean);
      const T bb = static_cast<T>(dnorm_xhat_mean);
      T* dxr = dx + r * channels;
      for (std::int64_t c = 0; c < channels; ++c) {
        const T xhat = (xr[c] - m) * rs;
        dxr[c] += (dr[c] * w[c] - a - xhat * bb) * rs;
      }
    }
  });
  parallel_chunks(channels, kColumnGrain, [&](std::int64_t c0, std::int64_t c1) {
    double acc_w[kColumnGrain] = {};
    double acc_b[kColumnGrain] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * channels;
      const T* dr = dout + r * channels;
      const T m = mean[r];
      const T rs = rstd[r];
      for (std::int64_t c = c0; c < c1; ++c) {
        const T xhat = (xr[c] - m) * rs;
        acc_w[c - c0] += static_cast<double>(dr[c] * xhat);
        acc_b[c - c0] += static_cast<double>(dr[c]);
      }
    }
    for (std::int64_t c = c0; c < c1; ++c) {
      dw[c] += static_cast<T>(acc_w[c - c0]);
      db[c] += static_cast<T>(acc_b[c - c0]);
    }
  });
}

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                     std::int64_t channels, double eps) {
  parallel_chunks(rows, rows_grain(channels), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * channels;
      double s = 0.0;
      for (std::int64_t c = 0; c < channels; ++c) {
        s += static_cast<double>(xr[c]) * static_cast<double>(xr[c]);
      }
      const T rs = static_cast<T>(1.0 / std::sqrt(s / static_cast<double>(channels) + eps));
      T* o = out + r * channels;
      // Hugging Face normalises first, then multiplies by the weight.
      for (std::int64_t c = 0; c < channels; ++c)
        o[c] = w[c] * (xr[c] * rs);
      rstd[r] = rs;
    }
  });
}

template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                      std::int64_t rows, std::int64_t channels) {
  parallel_chunks(rows, rows_grain(channels), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * channels;
      const T* dr = dout + r * channels;
      const T rs = rstd[r];
      double dot = 0.0;
      for (std::int64_t c = 0; c < channels; ++c) {
        dot += static_cast<double>(dr[c] * w[c]) * static_cast<double>(xr[c] * rs);
      }
      const T mdot = static_cast<T>(dot / static_cast<double>(channels));
      T* dxr = dx + r * channels;
      for (std::int64_t c = 0; c < channels; ++c) {
        dxr[c] += rs * (dr[c] * w[c] - (xr[c] * rs) * mdot);
      }
    }
  });
  parallel_chunks(channels, kColumnGrain, [&](std::int64_t c0, std::int64_t c1) {
    double acc[kColumnGrain] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * channels;
      const T* dr = dout + r * channels;
      const T rs = rstd[r];
      for (std::int64_t c = c0; c < c1; ++c)
        acc[c - c0] += static_cast<double>(dr[c] * (xr[c] * rs));
    }
    for (std::int64_t c = c0; c < c1; ++c)
      dw[c] += static_cast<T>(acc[c - c0]);
  });
}

template <typename T>
void rmsnorm_heads_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                           std::int64_t heads, std::int64_t head_dim, std::int64_t x_stride,
                           std::int64_t out_stride, double eps) {
  parallel_chunks(rows, rows_grain(heads * head_dim), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const T* xr = x + r * x_stride + h * head_dim;
        double s = 0.0;
        for (std::int64_t c = 0; c < head_dim; ++c)
          s += static_cast<double>(xr[c]) * static_cast<double>(xr[c]);
        const T rs = static_cast<T>(1.0 / std::sqrt(s / static_cast<double>(head_dim) + eps));
        T* o = out + r * out_stride + h * head_dim;
        for (std::int64_t c = 0; c < head_dim; ++c)
          o[c] = w[c] * (xr[c] * rs);
        rstd[r * heads + h] = rs;
      }
    }
  });
}

template <typename T>
void rmsnorm_heads_backward(T* d, T* dw, const T* x, const T* w, const T* rstd, std::int64_t rows,
                            std::int64_t heads, std::int64_t head_dim, std::int64_t d_stride,
                            std::int64_t x_stride) {
  // dw first, while d still holds dout; then dx over it, head by head.
  parallel_chunks(head_dim, kColumnGrain, [&](std::int64_t c0, std::int64_t c1) {
    double acc[kColumnGrain] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const T* xr = x + r * x_stride + h * head_dim;
        const T* dr = d + r * d_stride + h * head_dim;
        const T rs = rstd[r * heads + h];
        for (std::int64_t c = c0; c < c1; ++c)
          acc[c - c0] += static_cast<double>(dr[c] * (xr[c] * rs));
      }
    }
    for (std::int64_t c = c0; c < c1; ++c)
      dw[c] += static_cast<T>(acc[c - c0]);
  });
  parallel_chunks(rows, rows_grain(heads * head_dim), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const T* xr = x + r * x_stride + h * head_dim;
        T* dr = d + r * d_stride + h * head_dim;
        const T rs = rstd[r * heads + h];
        double dot = 0.0;
        for (std::int64_t c = 0; c < head_dim; ++c)
          dot += static_cast<double>(dr[c] * w[c]) * static_cast<double>(xr[c] * rs);
        const T mdot = static_cast<T>(dot / static_cast<double>(head_dim));
        for (std::int64_t c = 0; c < head_dim; ++c)
          dr[c] = rs * (dr[c] * w[c] - (xr[c] * rs) * mdot);
      }
    }
  });
}

#define STRATA_INSTANTIATE_NORM(T)                                                                 \
  template void embedding_forward<T>(T*, const std::int32_t*, const std::int32_t*, const T*,       \
                                     const T*, std::int64_t, std::int64_t, std::int64_t);          \
  template void embedding_backward<T>(T*, T*, const T*, const std::int32_t*, const std::int32_t*,  \
                                      std::int64_t, std::int64_t, std::int64_t, std::int32_t);     \
  template void rmsnorm_heads_forward<T>(T*, T*, const T*, const T*, std::int64_t, std::int64_t,   \
                                         std::int64_t, std::int64_t, std::int64_t, double);        \
  template void rmsnorm_heads_backward<T>(T*, T*, const T*, const T*, const T*, std::int64_t,      \
                                          std::int64_t, std::int64_t, std::int64_t, std::int64_t); \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t,       \
                                     std::int64_t, double);                                        \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const T*, std::int64_t, std::int64_t);                       \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, std::int64_t, std::int64_t,         \
                                   double);                                                        \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, std::int64_t,  \
                                    std::int64_t);
STRATA_INSTANTIATE_NORM(float)
STRATA_INSTANTIATE_NORM(double)
#undef STRATA_INSTANTIATE_NORM

}  // namespace strata::kernels

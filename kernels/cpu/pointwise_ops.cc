// GELU, SwiGLU, residual add, bias and rotary embeddings (contracts in nn_ops.h).
#include <cmath>
#include <vector>

#include "common/assert.h"
#include "kernels/cpu/nn_ops.h"
#include "kernels/cpu/parallel.h"

namespace strata::kernels {
namespace {

constexpr std::int64_t kGrain = 1 << 14;
constexpr std::int64_t kColumnGrain = 32;
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluC = 0.044715;

}  // namespace

template <typename T>
void gelu_forward(T* out, const T* x, std::int64_t n) {
  const T k = static_cast<T>(kGeluK);
  const T c = static_cast<T>(kGeluC);
  parallel_chunks(n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const T v = x[i];
      out[i] = T(0.5) * v * (T(1) + std::tanh(k * (v + c * v * v * v)));
    }
  });
}

template <typename T>
void gelu_backward(T* dx, const T* x, const T* dout, std::int64_t n) {
  const T k = static_cast<T>(kGeluK);
  const T c = static_cast<T>(kGeluC);
  parallel_chunks(n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const T v = x[i];
      const T th = std::tanh(k * (v + c * v * v * v));
      const T sech2 = T(1) - th * th;
      const T grad = T(0.5) * (T(1) + th) + T(0.5) * v * sech2 * k * (T(1) + T(3) * c * v * v);
      dx[i] += grad * dout[i];
    }
  });
}

template <typename T>
void swiglu_forward(T* out, const T* gate_up, std::int64_t rows, std::int64_t inner) {
  parallel_chunks(rows, rows_grain(inner), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* g = gate_up + r * 2 * inner;
      const T* u = g + inner;
      T* o = out + r * inner;
      for (std::int64_t i = 0; i < inner; ++i) {
        const T s = T(1) / (T(1) + std::exp(-g[i]));
        o[i] = g[i] * s * u[i];
      }
    }
  });
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, std::int64_t rows,
                     std::int64_t inner) {
  parallel_chunks(rows, rows_grain(inner), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* g = gate_up + r * 2 * inner;
      const T* u = g + inner;
      const T* d = dout + r * inner;
      T* dg = dgate_up + r * 2 * inner;
      T* du = dg + inner;
      for (std::int64_t i = 0; i < inner; ++i) {
        const T s = T(1) / (T(1) + std::exp(-g[i]));
        const T silu = g[i] * s;
        dg[i] = d[i] * u[i] * s * (T(1) + g[i] * (T(1) - s));
        du[i] = d[i] * silu;
      }
    }
  });
}

template <typename T>
void add(T* out, const T* a, const T* b, std::int64_t n) {
  parallel_chunks(n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i)
      out[i] = a[i] + b[i];
  });
}

template <typename T>
void add_bias(T* x, const T* bias, std::int64_t rows, std::int64_t channels) {
  parallel_chunks(rows, rows_grain(channels), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      T* xr = x + r * channels;
      for (std::int64_t c = 0; c < channels; ++c)
        xr[c] += bias[c];
    }
  });
}

template <typename T>
void bias_backward(T* dbias, const T* dout, std::int64_t rows, std::int64_t channels) {
  parallel_chunks(channels, kColumnGrain, [&](std::int64_t c0, std::int64_t c1) {
    double acc[kColumnGrain] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* d = dout + r * channels;
      for (std::int64_t c = c0; c < c1; ++c)
        acc[c - c0] += static_cast<double>(d[c]);
    }
    for (std::int64_t c = c0; c < c1; ++c)
      dbias[c] += static_cast<T>(acc[c - c0]);
  });
}

template <typename T>
void rope_tables(T* cos, T* sin, std::int64_t seq_len, std::int64_t half, const T* inv_freq,
                 double scaling) {
  const T scale = static_cast<T>(scaling);
  for (std::int64_t d = 0; d < half; ++d) {
    for (std::int64_t t = 0; t < seq_len; ++t) {
      const T angle = static_cast<T>(t) * inv_freq[d];
      T c = static_cast<T>(std::cos(static_cast<double>(angle)));
      T s = static_cast<T>(std::sin(static_cast<double>(angle)));
      if (scaling != 1.0) {
        c *= scale;
        s *= scale;
      }
      cos[t * half + d] = c;
      sin[t * half + d] = s;
    }
  }
}

template <typename T>
void rope_default_inv_freq(T* inv_freq, std::int64_t head_dim, double theta) {
  STRATA_ASSERT(head_dim % 2 == 0);
  for (std::int64_t d = 0; d < head_dim / 2; ++d) {
    // Hugging Face: inv_freq = 1 / base ** (arange(0, D, 2).float() / D), all in T's precision.
    const T exponent = static_cast<T>(2 * d) / static_cast<T>(head_dim);
    inv_freq[d] = T(1) / static_cast<T>(std::pow(static_cast<T>(theta), exponent));
  }
}

template <typename T>
void rope_tables(T* cos, T* sin, std::int64_t seq_len, std::int64_t head_dim, double theta) {
  std::vector<T> inv_freq(static_cast<std::size_t>(head_dim / 2));
  rope_default_inv_freq(inv_freq.data(), head_dim, theta);
  rope_tables(cos, sin, seq_len, head_dim / 2, inv_freq.data(), 1.0);
}

namespace {

template <typename T>
void rope_rotate(T* x, const RopeShape& p, const T* cos, const T* sin, T direction) {
  const std::int64_t rotary = p.rotary_dim > 0 ? p.rotary_dim : p.head_dim;
  STRATA_ASSERT(rotary % 2 == 0 && rotary <= p.head_dim && p.seq_len > 0);
  const std::int64_t half = rotary / 2;
  parallel_chunks(p.rows, rows_grain(p.heads * rotary), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t t = p.positions != nullptr ? p.positions[r] : r % p.seq_len;
      const T* cr = cos + t * half;
      const T* sr = sin + t * half;
      for (std::int64_t h = 0; h < p.heads; ++h) {
        T* x1 = x + r * p.stride + h * p.head_dim;
        T* x2 = x1 + half;
        for (std::int64_t d = 0; d < half; ++d) {
          const T a = x1[d];
          const T b = x2[d];
          const T s = direction * sr[d];
          x1[d] = a * cr[d] - b * s;
          x2[d] = b * cr[d] + a * s;
        }
      }
    }
  });
}

}  // namespace

template <typename T>
void rope_forward(T* x, const RopeShape& shape, const T* cos, const T* sin) {
  rope_rotate(x, shape, cos, sin, T(1));
}

template <typename T>
void rope_backward(T* dx, const RopeShape& shape, const T* cos, const T* sin) {
  // The map is a rotation times the tables' scaling: its transpose is the rotation by the opposite
  // angle with the same scaling.
  rope_rotate(dx, shape, cos, sin, T(-1));
}

#define STRATA_INSTANTIATE_POINTWISE(T)                                                 \
  template void gelu_forward<T>(T*, const T*, std::int64_t);                            \
  template void gelu_backward<T>(T*, const T*, const T*, std::int64_t);                 \
  template void swiglu_forward<T>(T*, const T*, std::int64_t, std::int64_t);            \
  template void swiglu_backward<T>(T*, const T*, const T*, std::int64_t, std::int64_t); \
  template void add<T>(T*, const T*, const T*, std::int64_t);                           \
  template void add_bias<T>(T*, const T*, std::int64_t, std::int64_t);                  \
  template void bias_backward<T>(T*, const T*, std::int64_t, std::int64_t);             \
  template void rope_tables<T>(T*, T*, std::int64_t, std::int64_t, const T*, double);   \
  template void rope_default_inv_freq<T>(T*, std::int64_t, double);                     \
  template void rope_tables<T>(T*, T*, std::int64_t, std::int64_t, double);             \
  template void rope_forward<T>(T*, const RopeShape&, const T*, const T*);              \
  template void rope_backward<T>(T*, const RopeShape&, const T*, const T*);
STRATA_INSTANTIATE_POINTWISE(float)
STRATA_INSTANTIATE_POINTWISE(double)
#undef STRATA_INSTANTIATE_POINTWISE

}  // namespace strata::kernels

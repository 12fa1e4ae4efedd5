// The tensor-core flash attention (flash_attention_kernels.cuh,
// flash_attention_backward_kernels.cuh) on the CUDA backend's fp32 activations, with the contracts
// of kernels/cpu/nn_ops.h's attention_forward / attention_backward (fp32 q, k, v, out, dq, dk, dv
// with their strides; lse (B, H, T) in fp32): each pass rounds its inputs to 16 bits into the
// workspace, compactly laid out (strides heads * head_dim and kv_heads * head_dim), runs the flash
// kernels there, and writes the results into the caller's arrays, over launch_plan.h's
// plan_flash_io (passes of whole batch rows): the flash kernels' epilogues write them widened to
// fp32 (and rounded into their companions) themselves; another 16-bit attention's results are
// widened by a cast kernel. Generic over the launcher (device_math.cuh), so the
// emulator tests run exactly this code.
//
// With a QkRotation (RoPE fused into the staging, Ops::attention_rotates), q and k are rotated as
// they are rounded (rope_block_to_16_kernel): the bits of rope_kernel in place, then the plain
// staging; the caller's q and k stay unrotated. The backward's dq and dk are then the gradients
// with respect to the unrotated q and k: the attention writes them in 16 bits into the workspace,
// and rope_block_from_16_kernel widens them and rotates them back (the bits of the widening
// followed by rope_kernel's backward in place), writing their companions too.
//
// The forward's out is 16-bit values widened, so the backward's rounding of out back to 16 bits is
// exact; where the caller has those 16 bits already (`out16`: out's companion, compact rows of
// heads * head_dim, 16-byte aligned, out_stride equal to that width), the backward reads them
// instead of rounding out again; dq, dk, dv are WRITTEN (the padding columns of the caller's
// strides are not touched).
//
// An output kept in 16 bits alone (Ops::pair_narrow_alone, fast path attention_16bit_alone) has no
// fp32 array: the forward's `out` is null and each pass's 16-bit attention writes its result
// straight into the companion (`out_narrow`, of the attention's own 16-bit type, compact rows:
// out_stride equal to heads * head_dim), with the bits it would have written beside the fp32
// values; the backward's `out` is null too and `out16` is that companion. The backward's dO kept
// in 16 bits alone likewise (fast path attention_grad_16bit: its product writes it in the
// attention's 16-bit type) comes as `dout16` (compact rows, 16-byte aligned; `dout` null) and is
// read in place instead of being rounded into the workspace.
//
// The q/k/v gradient kept in 16 bits alone (fast path qkv_grad_16bit_alone) likewise has no fp32
// arrays: dq, dk and dv are null and the flash epilogue or the widening writes only their
// companions (`d_narrow`), the bits it writes beside the fp32 values.
//
// q, k and v kept in 16 bits alone (fast path qkv_16bit) come as `qkv16` (each piece's 16 bits at
// its first element, with the caller's strides; its fp32 pointer null): the staging reads them
// widened (q and k rotated as they are rounded again, v copied), with the bits it gives on fp32
// arrays holding those values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>

#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/flash_attention_backward_kernels.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

// Whether the flash path takes this shape on the fp32 arrays: launch_plan.h's flash_io_takes, and
// the kernels' own conditions on the compact layout.
inline bool flash_f32_supported(const kernels::AttentionShape& s, std::int64_t workspace_elements) {
  kernels::AttentionShape compact = s;
  compact.q_stride = compact.out_stride = s.heads * s.head_dim;
  compact.kv_stride = s.kv_heads * s.head_dim;
  return cuda::flash_io_takes(s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim,
                              workspace_elements) &&
         flash_attention_backward_supported(compact);
}

// Whether a call's output arrays are valid: an fp32 `out`, or, for an output kept in 16 bits
// alone (out null), its companion in the attention's 16-bit type (`bf16`) with compact rows
// (forward: `out_narrow`; backward: `out16`, where the backward reads out's 16 bits).
inline bool flash_f32_forward_out_valid(const float* out, const Narrow& out_narrow,
                                        const kernels::AttentionShape& s, bool bf16) {
  if (out != nullptr) return true;
  return out_narrow.p != nullptr && out_narrow.code == (bf16 ? kCodeBF16 : kCodeF16) &&
         s.out_stride == s.heads * s.head_dim;
}
// Likewise the backward's: out, or out16 where it is kept alone; dout, or (dO kept in 16 bits
// alone, written so by its product) dout16, in compact rows.
inline bool flash_f32_backward_out_valid(const float* out, const std::uint16_t* out16,
                                         const float* dout, const std::uint16_t* dout16,
                                         const kernels::AttentionShape& s) {
  if (out == nullptr && out16 == nullptr) return false;
  if (dout16 != nullptr) return s.out_stride == s.heads * s.head_dim;
  return dout != nullptr;
}

// Likewise the backward's gradients: dq, dk and dv; or, kept in 16 bits alone, none of them, with
// the three companions (the flash epilogue or the widening writes them).
inline bool flash_f32_backward_grads_valid(const float* dq, const float* dk, const float* dv,
                                           const QkvNarrow& d_narrow) {
  if (dq != nullptr && dk != nullptr && dv != nullptr) return true;
  return dq == nullptr && dk == nullptr && dv == nullptr && d_narrow.q.p != nullptr &&
         d_narrow.k.p != nullptr && d_narrow.v.p != nullptr;
}

// Whether a call's inputs are valid: each of q, k and v given once, in fp32 or (kept in 16 bits
// alone) as bf16 or fp16 in qkv16.
inline bool flash_f32_inputs_valid(const float* q, const float* k, const float* v,
                                   const QkvSixteen& qkv16) {
  const auto once = [](const float* wide, const Sixteen& narrow) {
    if (narrow.p == nullptr) return wide != nullptr;
    return wide == nullptr && (narrow.code == kCodeBF16 || narrow.code == kCodeF16);
  };
  return once(q, qkv16.q) && once(k, qkv16.k) && once(v, qkv16.v);
}

namespace flash_f32_detail {

// Whether `Inner` writes its results into the fp32 arrays itself (FlashInner::kWritesWide).
template <typename Inner>
concept WritesWide = requires {
  requires Inner::kWritesWide;
};

// Whether an inner pass rounding to `code` can write this companion itself: none is wanted, or it
// is of the same 16-bit type (else the caller widens, and the widening rounds to its type).
inline bool same_code(const cuda_kernels::Narrow& n, int code) {
  return n.p == nullptr || n.code == code;
}

// The shape of one pass over batch rows [b0, b0 + rows) in the compact 16-bit layout.
inline kernels::AttentionShape pass_shape(const kernels::AttentionShape& s, std::int64_t b0,
                                          std::int64_t batch_rows) {
  kernels::AttentionShape p = s;
  p.batch = batch_rows;
  p.q_stride = p.out_stride = s.heads * s.head_dim;
  p.kv_stride = s.kv_heads * s.head_dim;
  if (s.positions != nullptr) p.positions = s.positions + b0 * s.seq_len;
  return p;
}

// What both directions need: the 16-bit type's code, the row widths and the passes.
struct Io {
  int code = 0;
  std::int64_t T = 0, hd = 0, kvd = 0;
  cuda::FlashIoPlan plan;
};
template <typename E>
Io io_of(const kernels::AttentionShape& s, std::int64_t workspace_elements, bool backward) {
  Io io;
  io.code = E::kBf16 ? kCodeBF16 : kCodeF16;
  io.T = s.seq_len;
  io.hd = s.heads * s.head_dim;
  io.kvd = s.kv_heads * s.head_dim;
  io.plan = cuda::plan_flash_io(s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim, backward,
                                workspace_elements);
  return io;
}

// The launcher's result (cudaError_t, or the emulator's int).
template <typename L>
using LaunchResult = decltype(std::declval<const L&>()(
    cast_block_kernel, dim3(), dim3(), std::size_t{0}, static_cast<std::uint16_t*>(nullptr), 0,
    std::int64_t{0}, static_cast<const float*>(nullptr), std::int64_t{0}, std::int64_t{0},
    std::int64_t{0}));

// `rows` rows of fp32 `src` (leading dimension src_ld) rounded into compact 16-bit `dst`; or, where
// `src16` is set (src null), its 16-bit rows copied.
struct Narrow {
  std::uint16_t* dst;
  const float* src;
  std::int64_t src_ld, cols;
  cuda_kernels::Sixteen src16 = {};
};
// `rows` rows of compact 16-bit `src` widened into fp32 `dst` (leading dimension dst_ld), and
// rounded into dst's companion where `also` has one (its pointer at dst's first element).
struct Widen {
  float* dst;
  std::int64_t dst_ld;
  const std::uint16_t* src;
  std::int64_t cols;
  cuda_kernels::Narrow also;
};

// `p` `offset` elements on; null (an array kept in 16 bits alone) stays null.
template <typename T>
T* at(T* p, std::int64_t offset) {
  return p != nullptr ? p + offset : nullptr;
}
// A companion's (Narrow) or 16-bit input's (Sixteen) pointer `offset` elements on (none stays
// none).
template <typename Bits>
Bits advance(Bits n, std::int64_t offset) {
  n.p = at(n.p, offset);
  return n;
}

template <typename L, std::size_t N>
LaunchResult<L> narrow(const L& launch, int code, std::int64_t rows, const Narrow (&pieces)[N]) {
  LaunchResult<L> err{};
  for (const Narrow& p : pieces) {
    err = p.src16.p != nullptr
              ? run_cast_block_16(launch, p.dst, code, p.cols, p.src16, p.src_ld, rows, p.cols)
              : run_cast_block_to_16(launch, p.dst, code, p.cols, p.src, p.src_ld, rows, p.cols);
    if (!launched(err)) return err;
  }
  return err;
}

template <typename L, std::size_t N>
LaunchResult<L> widen(const L& launch, int code, std::int64_t rows, const Widen (&pieces)[N]) {
  LaunchResult<L> err{};
  for (const Widen& p : pieces) {
    err =
        run_cast_block_from_16(launch, p.dst, p.dst_ld, p.src, code, p.cols, rows, p.cols, p.also);
    if (!launched(err)) return err;
  }
  return err;
}

// One pass over batch rows [b0, b0 + batch_rows): its token rows, the first of them, q, k, v
// rounded into the start of the workspace, and the workspace after them (`rest`).
struct Pass {
  std::int64_t b0 = 0, batch_rows = 0, rows = 0, first = 0;
  std::uint16_t *q16 = nullptr, *k16 = nullptr, *v16 = nullptr, *rest = nullptr;
};

// The rotation of `heads` heads of the rows from `first` on, in `direction`.
inline RopeRows rope_rows(const kernels::AttentionShape& shape,
                          const kernels::QkRotation<float>& rope, std::int64_t first,
                          std::int64_t heads, float direction) {
  RopeRows r;
  r.heads = heads;
  r.head_dim = shape.head_dim;
  r.half = (rope.rotary_dim > 0 ? rope.rotary_dim : shape.head_dim) / 2;
  r.seq_len = shape.seq_len;
  r.positions = shape.positions != nullptr ? shape.positions + first : nullptr;
  r.cos = rope.cos;
  r.sin = rope.sin;
  r.direction = direction;
  return r;
}

// q's or k's rows of one pass rotated by `rope` as they are rounded (rope_block_to_16_kernel).
template <typename L>
LaunchResult<L> narrow_rotated(const L& launch, int code, const kernels::AttentionShape& shape,
                               const kernels::QkRotation<float>& rope, std::int64_t first,
                               std::int64_t rows, std::int64_t heads, const Narrow& piece) {
  return run_rope_block_to_16(launch, piece.dst, code, piece.cols, piece.src, piece.src_ld, rows,
                              rope_rows(shape, rope, first, heads, 1.0f), piece.src16);
}

// dq's or dk's rows of one pass widened and rotated back (rope_block_from_16_kernel: the
// transpose of the rotation, rope_kernel's backward), with their companion where given.
template <typename L>
LaunchResult<L> widen_rotated(const L& launch, int code, const kernels::AttentionShape& shape,
                              const kernels::QkRotation<float>& rope, std::int64_t first,
                              std::int64_t rows, std::int64_t heads, const Widen& piece) {
  return run_rope_block_from_16(launch, piece.dst, piece.dst_ld, piece.src, code, piece.cols, rows,
                                rope_rows(shape, rope, first, heads, -1.0f), piece.also);
}

// For each pass of io.plan: rounds the pass's q, k, v into the workspace (q and k rotated first
// where `rope` has tables; from their 16 bits where `qkv16` has them), then runs body(pass).
template <typename L, typename Body>
LaunchResult<L> for_each_pass(const L& launch, const Io& io, const kernels::AttentionShape& shape,
                              std::uint16_t* workspace, const float* q, const float* k,
                              const float* v, const kernels::QkRotation<float>& rope,
                              const QkvSixteen& qkv16, Body&& body) {
  LaunchResult<L> err{};
  for (std::int64_t b0 = 0; b0 < shape.batch; b0 += io.plan.batch_rows) {
    Pass p;
    p.b0 = b0;
    p.batch_rows = std::min(io.plan.batch_rows, shape.batch - b0);
    p.rows = p.batch_rows * io.T;
    p.first = b0 * io.T;
    p.q16 = workspace;
    p.k16 = p.q16 + p.rows * io.hd;
    p.v16 = p.k16 + p.rows * io.kvd;
    p.rest = p.v16 + p.rows * io.kvd;
    const std::int64_t at_q = p.first * shape.q_stride, at_kv = p.first * shape.kv_stride;
    const Narrow in[] = {{p.q16, at(q, at_q), shape.q_stride, io.hd, advance(qkv16.q, at_q)},
                         {p.k16, at(k, at_kv), shape.kv_stride, io.kvd, advance(qkv16.k, at_kv)},
                         {p.v16, at(v, at_kv), shape.kv_stride, io.kvd, advance(qkv16.v, at_kv)}};
    if (rope.cos != nullptr) {
      // A pass holds whole sequences, so row r of it is at r % T (without positions).
      err = narrow_rotated(launch, io.code, shape, rope, p.first, p.rows, shape.heads, in[0]);
      if (!launched(err)) return err;
      err = narrow_rotated(launch, io.code, shape, rope, p.first, p.rows, shape.kv_heads, in[1]);
      if (!launched(err)) return err;
      const Narrow values[] = {in[2]};
      err = narrow(launch, io.code, p.rows, values);
    } else {
      err = narrow(launch, io.code, p.rows, in);
    }
    if (!launched(err)) return err;
    err = body(p);
    if (!launched(err)) return err;
  }
  return err;
}

}  // namespace flash_f32_detail

// The 16-bit attention each pass runs on the compact layout: the flash kernels here; another
// implementation (cuDNN's fused attention, flash_attention.cu) supplies the same two calls. One
// that also has forward_wide and backward_wide (kWritesWide) writes its results straight into the
// caller's fp32 arrays and their companions, so no widening kernel runs after it.
template <typename E, FlashFault kFault, typename L>
struct FlashInner {
  static constexpr bool kWritesWide = true;
  const L& launch;
  // O into `out` (fp32, rows of pass.out_stride) and its 16-bit bits into `o16` (or null), same
  // rows.
  auto forward_wide(std::uint16_t* o16, float* out, float* lse, const std::uint16_t* q16,
                    const std::uint16_t* k16, const std::uint16_t* v16,
                    const kernels::AttentionShape& pass) const {
    return run_flash_attention_forward<E, kFault>(launch, o16, lse, q16, k16, v16, pass, out);
  }
  auto backward_wide(std::uint16_t* dq16, std::uint16_t* dk16, std::uint16_t* dv16, float* delta,
                     const std::uint16_t* do16, const std::uint16_t* o16, const float* lse,
                     const std::uint16_t* q16, const std::uint16_t* k16, const std::uint16_t* v16,
                     const kernels::AttentionShape& pass, const FlashGradsOut& wide) const {
    return run_flash_attention_backward<E, kFault>(launch, dq16, dk16, dv16, delta, do16, o16, lse,
                                                   q16, k16, v16, pass, wide);
  }
  auto forward(std::uint16_t* o16, float* lse, const std::uint16_t* q16, const std::uint16_t* k16,
               const std::uint16_t* v16, const kernels::AttentionShape& pass) const {
    return forward_wide(o16, nullptr, lse, q16, k16, v16, pass);
  }
  auto backward(std::uint16_t* dq16, std::uint16_t* dk16, std::uint16_t* dv16, float* delta,
                const std::uint16_t* do16, const std::uint16_t* o16, const float* lse,
                const std::uint16_t* q16, const std::uint16_t* k16, const std::uint16_t* v16,
                const kernels::AttentionShape& pass) const {
    return backward_wide(dq16, dk16, dv16, delta, do16, o16, lse, q16, k16, v16, pass, {});
  }
};

// E: FlashBf16 or FlashFp16 (the 16-bit type the inputs are rounded to). `workspace` holds
// `workspace_elements` 16-bit elements, 16-byte aligned; flash_f32_supported(shape, ...) holds.
// `inner` runs each pass (FlashInner, or one with its calls).
template <typename E, typename L, typename Inner>
flash_f32_detail::LaunchResult<L> run_attention16_forward_f32(
    const L& launch, const Inner& inner, std::uint16_t* workspace, std::int64_t workspace_elements,
    float* out, float* lse, const float* q, const float* k, const float* v,
    const kernels::AttentionShape& shape, Narrow out_narrow = {},
    const kernels::QkRotation<float>& rope = {}, const QkvSixteen& qkv16 = {}) {
  namespace d = flash_f32_detail;
  const d::Io io = d::io_of<E>(shape, workspace_elements, false);
  return d::for_each_pass(
      launch, io, shape, workspace, q, k, v, rope, qkv16, [&](const d::Pass& p) {
        const std::int64_t at = p.first * shape.out_stride;
        float* pass_lse = lse + p.b0 * shape.heads * io.T;
        if (out == nullptr) {
          // Kept alone: the pass's compact 16-bit result is the companion's rows themselves.
          return inner.forward(d::advance(out_narrow, at).p, pass_lse, p.q16, p.k16, p.v16,
                               d::pass_shape(shape, p.b0, p.batch_rows));
        }
        if constexpr (d::WritesWide<Inner>) {
          if (d::same_code(out_narrow, io.code)) {
            // The kernel writes out (and its companion) in the caller's layout.
            kernels::AttentionShape pass = d::pass_shape(shape, p.b0, p.batch_rows);
            pass.out_stride = shape.out_stride;
            return inner.forward_wide(d::advance(out_narrow, at).p, out + at, pass_lse, p.q16,
                                      p.k16, p.v16, pass);
          }
        }
        std::uint16_t* o16 = p.rest;
        auto err = inner.forward(o16, pass_lse, p.q16, p.k16, p.v16,
                                 d::pass_shape(shape, p.b0, p.batch_rows));
        if (!launched(err)) return err;
        const d::Widen result[] = {
            {out + at, shape.out_stride, o16, io.hd, d::advance(out_narrow, at)}};
        return d::widen(launch, io.code, p.rows, result);
      });
}

template <typename E, typename L, typename Inner>
flash_f32_detail::LaunchResult<L> run_attention16_backward_f32(
    const L& launch, const Inner& inner, std::uint16_t* workspace, std::int64_t workspace_elements,
    float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
    const float* q, const float* k, const float* v, const kernels::AttentionShape& shape,
    QkvNarrow d_narrow = {}, const kernels::QkRotation<float>& rope = {},
    const std::uint16_t* out16 = nullptr, const std::uint16_t* dout16 = nullptr,
    const QkvSixteen& qkv16 = {}) {
  namespace d = flash_f32_detail;
  const d::Io io = d::io_of<E>(shape, workspace_elements, true);
  return d::for_each_pass(
      launch, io, shape, workspace, q, k, v, rope, qkv16, [&](const d::Pass& p) {
        const std::int64_t rows = p.rows, hd = io.hd, kvd = io.kvd;
        std::uint16_t* dq16 = p.rest;
        std::uint16_t* dk16 = dq16 + rows * hd;
        std::uint16_t* dv16 = dk16 + rows * kvd;
        std::uint16_t* o16_room = dv16 + rows * kvd;
        std::uint16_t* do16_room = o16_room + rows * hd;
        auto* delta = reinterpret_cast<float*>(do16_room + rows * hd);
        // out's and dO's 16 bits where they are there already (compact rows: read in place), else
        // rounded into the workspace.
        const std::uint16_t* o16 = out16 != nullptr ? out16 + p.first * hd : o16_room;
        const std::uint16_t* do16 = dout16 != nullptr ? dout16 + p.first * hd : do16_room;
        d::LaunchResult<L> err{};
        if (out16 == nullptr) {
          const d::Narrow in[] = {
              {o16_room, out + p.first * shape.out_stride, shape.out_stride, hd}};
          err = d::narrow(launch, io.code, rows, in);
          if (!launched(err)) return err;
        }
        if (dout16 == nullptr) {
          const d::Narrow in[] = {
              {do16_room, dout + p.first * shape.out_stride, shape.out_stride, hd}};
          err = d::narrow(launch, io.code, rows, in);
          if (!launched(err)) return err;
        }
        const float* pass_lse = lse + p.b0 * shape.heads * io.T;
        const std::int64_t at_q = p.first * shape.q_stride, at_kv = p.first * shape.kv_stride;
        if constexpr (d::WritesWide<Inner>) {
          if (rope.cos == nullptr && d::same_code(d_narrow.q, io.code) &&
              d::same_code(d_narrow.k, io.code) && d::same_code(d_narrow.v, io.code)) {
            // The kernels write dq, dk, dv (and their companions, or those alone where the arrays
            // are null: kept alone) in the caller's layout.
            const FlashGradsOut wide{d::at(dq, at_q), d::at(dk, at_kv), d::at(dv, at_kv),
                                     shape.q_stride, shape.kv_stride};
            return inner.backward_wide(
                d::advance(d_narrow.q, at_q).p, d::advance(d_narrow.k, at_kv).p,
                d::advance(d_narrow.v, at_kv).p, delta, do16, o16, pass_lse, p.q16, p.k16, p.v16,
                d::pass_shape(shape, p.b0, p.batch_rows), wide);
          }
        }
        err = inner.backward(dq16, dk16, dv16, delta, do16, o16, pass_lse, p.q16, p.k16, p.v16,
                             d::pass_shape(shape, p.b0, p.batch_rows));
        if (!launched(err)) return err;
        if (rope.cos != nullptr) {
          // dv widened, then dq and dk rotated back as they are widened (the rotation's transpose).
          // Null arrays (kept alone): only the companions.
          const d::Widen values[] = {
              {d::at(dv, at_kv), shape.kv_stride, dv16, kvd, d::advance(d_narrow.v, at_kv)}};
          err = d::widen(launch, io.code, rows, values);
          if (!launched(err)) return err;
          err = d::widen_rotated(
              launch, io.code, shape, rope, p.first, rows, shape.heads,
              {d::at(dq, at_q), shape.q_stride, dq16, hd, d::advance(d_narrow.q, at_q)});
          if (!launched(err)) return err;
          return d::widen_rotated(
              launch, io.code, shape, rope, p.first, rows, shape.kv_heads,
              {d::at(dk, at_kv), shape.kv_stride, dk16, kvd, d::advance(d_narrow.k, at_kv)});
        }
        const d::Widen result[] = {
            {d::at(dq, at_q), shape.q_stride, dq16, hd, d::advance(d_narrow.q, at_q)},
            {d::at(dk, at_kv), shape.kv_stride, dk16, kvd, d::advance(d_narrow.k, at_kv)},
            {d::at(dv, at_kv), shape.kv_stride, dv16, kvd, d::advance(d_narrow.v, at_kv)}};
        return d::widen(launch, io.code, rows, result);
      });
}

// The flash kernels on the fp32 arrays.
template <typename E, FlashFault kFault = FlashFault::kNone, typename L>
flash_f32_detail::LaunchResult<L> run_flash_attention_forward_f32(
    const L& launch, std::uint16_t* workspace, std::int64_t workspace_elements, float* out,
    float* lse, const float* q, const float* k, const float* v,
    const kernels::AttentionShape& shape, Narrow out_narrow = {},
    const kernels::QkRotation<float>& rope = {}, const QkvSixteen& qkv16 = {}) {
  return run_attention16_forward_f32<E>(launch, FlashInner<E, kFault, L>{launch}, workspace,
                                        workspace_elements, out, lse, q, k, v, shape, out_narrow,
                                        rope, qkv16);
}

template <typename E, FlashFault kFault = FlashFault::kNone, typename L>
flash_f32_detail::LaunchResult<L> run_flash_attention_backward_f32(
    const L& launch, std::uint16_t* workspace, std::int64_t workspace_elements, float* dq,
    float* dk, float* dv, const float* dout, const float* out, const float* lse, const float* q,
    const float* k, const float* v, const kernels::AttentionShape& shape, QkvNarrow d_narrow = {},
    const kernels::QkRotation<float>& rope = {}, const std::uint16_t* out16 = nullptr,
    const std::uint16_t* dout16 = nullptr, const QkvSixteen& qkv16 = {}) {
  return run_attention16_backward_f32<E>(launch, FlashInner<E, kFault, L>{launch}, workspace,
                                         workspace_elements, dq, dk, dv, dout, out, lse, q, k, v,
                                         shape, d_narrow, rope, out16, dout16, qkv16);
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)

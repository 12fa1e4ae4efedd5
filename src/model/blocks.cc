// GPT-2 and Llama-family transformer blocks, forward and backward (see blocks.h). Linear layers:
// GPT-2's Conv1D stores W as (in, out), y = x W + b; Llama's nn.Linear stores W as (out, in),
// y = x W^T + b. Llama's q/k/v and gate/up weights (and biases) are adjacent in the unit
// (layout.h), so each group is one GEMM (one bias add).
#include "model/blocks.h"

#include <cmath>

namespace strata::model {

std::int64_t qkv_width(const ModelShape& s) {
  return s.family == Family::kGpt2 ? 3 * s.hidden_size
                                   : (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
}

bool qkv_alone_applies(const ModelShape& s) {
  return !s.arch.qk_norm;
}

bool qkv_grad_alone_applies(const ModelShape& s) {
  return s.family == Family::kGpt2 || (qkv_alone_applies(s) && llama_block_slots(s).qkv_b < 0);
}

std::int64_t fc_width(const ModelShape& s) {
  return s.family == Family::kGpt2 ? s.intermediate_size : 2 * s.intermediate_size;
}

std::int64_t qkv_raw_width(const ModelShape& s) {
  return s.arch.qk_norm ? qkv_width(s) : 0;
}

std::int64_t qk_rstd_width(const ModelShape& s) {
  return s.arch.qk_norm ? s.num_heads + s.num_kv_heads : 0;
}

kernels::AttentionShape attention_shape(const ModelShape& s, std::int64_t batch,
                                        std::int64_t seq_len, int layer,
                                        const std::int32_t* positions) {
  kernels::AttentionShape a;
  a.batch = batch;
  a.seq_len = seq_len;
  a.heads = s.num_heads;
  a.kv_heads = s.num_kv_heads;
  a.head_dim = s.head_dim;
  a.q_stride = qkv_width(s);
  a.kv_stride = qkv_width(s);
  a.out_stride = s.num_heads * s.head_dim;
  a.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  a.window = attention_window_of(s, layer);
  a.positions = positions;
  return a;
}

namespace {

template <typename T>
kernels::AttentionShape attention_shape(const BlockContext<T>& ctx, int layer) {
  return attention_shape(*ctx.spec, ctx.batch, ctx.seq_len, layer, ctx.positions);
}

template <typename T>
kernels::RopeShape rope_shape(const BlockContext<T>& ctx, std::int64_t heads) {
  const ModelShape& s = *ctx.spec;
  kernels::RopeShape r;
  r.rows = ctx.rows;
  r.stride = qkv_width(s);
  r.seq_len = ctx.seq_len;
  r.heads = heads;
  r.head_dim = s.head_dim;
  r.rotary_dim = rotary_dim(s);
  r.positions = ctx.positions;
  return r;
}

template <typename T>
kernels::QkRotation<T> qk_rotation(const BlockContext<T>& ctx) {
  kernels::QkRotation<T> r;
  r.cos = ctx.rope_cos;
  r.sin = ctx.rope_sin;
  r.rotary_dim = rotary_dim(*ctx.spec);
  return r;
}

template <typename T>
void gpt2_forward(const BlockContext<T>& ctx, const UnitLayout& u, const T* w, const T* x, T* out,
                  const BlockActs<T>& a) {
  using namespace gpt2;
  backend::Ops<T>& ops = *ctx.ops;
  const std::int64_t n = ctx.rows, c = ctx.spec->hidden_size, in = ctx.spec->intermediate_size;
  auto p = [&](int i) { return w + u.tensors[i].offset; };
  const double eps = ctx.spec->norm_eps;
  ops.layernorm_forward(a.ln1, a.mean1, a.rstd1, x, p(kLn1W), p(kLn1B), n, c, eps);
  ops.gemm_bias(false, false, n, 3 * c, c, a.ln1, c, p(kAttnW), 3 * c, p(kAttnB), a.qkv);
  ops.attention_forward(a.att, a.lse, a.qkv, a.qkv + c, a.qkv + 2 * c,
                        attention_shape(ctx, u.layer));
  ops.gemm_bias(false, false, n, c, c, a.att, c, p(kProjW), c, p(kProjB), a.res1);
  ops.add_layernorm_forward(a.res1, x, a.ln2, a.mean2, a.rstd2, p(kLn2W), p(kLn2B), n, c, eps);
  if (a.fc16 != nullptr) {
    // The pre-activation in 16 bits (the runner chose it: Ops::keeps_gelu_narrow).
    ops.gemm_bias_gelu_narrow(false, false, n, in, c, a.ln2, c, p(kFcW), in, p(kFcB), a.fc16,
                              a.act);
  } else {
    ops.gemm_bias_gelu(false, false, n, in, c, a.ln2, c, p(kFcW), in, p(kFcB), a.fc, a.act);
  }
  ops.gemm_residual(false, false, n, c, in, a.act, in, p(kFcProjW), c, p(kFcProjB), a.res1, out);
}

template <typename T>
void gpt2_backward(const BlockContext<T>& ctx, const UnitLayout& u, const T* w, T* g, const T* x,
                   const BlockActs<T>& a, const BlockScratch<T>& s, T* dout, T* dx) {
  using namespace gpt2;
  backend::Ops<T>& ops = *ctx.ops;
  const std::int64_t n = ctx.rows, c = ctx.spec->hidden_size, in = ctx.spec->intermediate_size;
  auto p = [&](int i) { return w + u.tensors[i].offset; };
  auto gp = [&](int i) { return g + u.tensors[i].offset; };
  // MLP: out = res1 + gelu(ln2 Wfc + bfc) Wproj + bproj
  if (a.fc16 != nullptr) {
    ops.gemm_dgelu_narrow(false, true, n, in, c, dout, c, p(kFcProjW), c, a.fc16, s.dact, s.dfc);
  } else {
    ops.gemm_dgelu(false, true, n, in, c, dout, c, p(kFcProjW), c, a.fc, s.dact, s.dfc);
  }
  ops.gemm(true, false, in, c, n, T(1), a.act, in, dout, c, T(1), gp(kFcProjW), c);
  ops.bias_backward(gp(kFcProjB), dout, n, c);
  ops.gemm(false, true, n, c, in, T(1), s.dfc, in, p(kFcW), in, T(0), s.dln, c);
  ops.gemm(true, false, c, in, n, T(1), a.ln2, c, s.dfc, in, T(1), gp(kFcW), in);
  ops.bias_backward(gp(kFcB), s.dfc, n, in);
  // dout now becomes d(res1): the residual path plus the MLP's norm.
  ops.layernorm_backward(dout, gp(kLn2W), gp(kLn2B), s.dln, a.res1, p(kLn2W), a.mean2, a.rstd2, n,
                         c);
  // Attention: res1 = x + attn(ln1) Wproj + bproj
  ops.gemm(false, true, n, c, c, T(1), dout, c, p(kProjW), c, T(0), s.datt, c);
  ops.gemm(true, false, c, c, n, T(1), a.att, c, dout, c, T(1), gp(kProjW), c);
  ops.bias_backward(gp(kProjB), dout, n, c);
  ops.attention_backward(s.dqkv, s.dqkv + c, s.dqkv + 2 * c, s.datt, a.att, a.lse, a.qkv, a.qkv + c,
                         a.qkv + 2 * c, attention_shape(ctx, u.layer));
  ops.gemm(false, true, n, c, 3 * c, T(1), s.dqkv, 3 * c, p(kAttnW), 3 * c, T(0), s.dln, c);
  ops.gemm(true, false, c, 3 * c, n, T(1), a.ln1, c, s.dqkv, 3 * c, T(1), gp(kAttnW), 3 * c);
  ops.bias_backward(gp(kAttnB), s.dqkv, n, 3 * c);
  ops.copy(dx, dout, n * c);
  ops.layernorm_backward(dx, gp(kLn1W), gp(kLn1B), s.dln, x, p(kLn1W), a.mean1, a.rstd1, n, c);
}

// out(n, outs) = x(n, ins) W^T (+ bias, when there is one) for a weight stored (outs, ins), as
// Hugging Face's Linear keeps it: the bias through the backend's gemm_bias (which may fuse it).
template <typename T>
void linear(backend::Ops<T>& ops, std::int64_t n, std::int64_t outs, std::int64_t ins, const T* x,
            const T* w, const T* bias, T* out) {
  if (bias != nullptr) {
    ops.gemm_bias(false, true, n, outs, ins, x, ins, w, ins, bias, out);
  } else {
    ops.gemm(false, true, n, outs, ins, T(1), x, ins, w, ins, T(0), out, outs);
  }
}

template <typename T>
void llama_forward(const BlockContext<T>& ctx, const UnitLayout& u, const T* w, const T* x, T* out,
                   const BlockActs<T>& a) {
  backend::Ops<T>& ops = *ctx.ops;
  const ModelShape& s = *ctx.spec;
  const LlamaBlockSlots& slot = ctx.slots;
  const std::int64_t n = ctx.rows, c = s.hidden_size, in = s.intermediate_size;
  const std::int64_t hd = s.num_heads * s.head_dim, kvd = s.num_kv_heads * s.head_dim;
  const std::int64_t qkv = hd + 2 * kvd;
  auto p = [&](int i) { return w + u.tensors[static_cast<std::size_t>(i)].offset; };
  auto bias = [&](int i) { return i >= 0 ? p(i) : nullptr; };
  const double eps = s.norm_eps;
  ops.rmsnorm_forward(a.ln1, a.rstd1, x, p(slot.in_norm), n, c, eps);
  // With q/k norms the projection lands in qkv_raw and the normalised q, k in qkv; v stays raw.
  T* proj = s.arch.qk_norm ? a.qkv_raw : a.qkv;
  linear(ops, n, qkv, c, a.ln1, p(slot.qkv_w), bias(slot.qkv_b), proj);
  if (s.arch.qk_norm) {
    ops.rmsnorm_heads_forward(a.qkv, a.qk_rstd, proj, p(slot.q_norm), n, s.num_heads, s.head_dim,
                              qkv, qkv, eps);
    ops.rmsnorm_heads_forward(a.qkv + hd, a.qk_rstd + n * s.num_heads, proj + hd, p(slot.k_norm), n,
                              s.num_kv_heads, s.head_dim, qkv, qkv, eps);
  }
  const kernels::AttentionShape att = attention_shape(ctx, u.layer);
  if (ops.attention_rotates(att)) {
    // The attention rotates q and k as it reads them: a.qkv keeps them unrotated, and the
    // backward's attention rotates them again alike (and its dq, dk back).
    ops.attention_forward_rotated(a.att, a.lse, a.qkv, a.qkv + hd, proj + hd + kvd, att,
                                  qk_rotation(ctx));
  } else {
    // q's heads and k's follow each other in every row: one rotation over both.
    ops.rope_forward(a.qkv, rope_shape(ctx, s.num_heads + s.num_kv_heads), ctx.rope_cos,
                     ctx.rope_sin);
    ops.attention_forward(a.att, a.lse, a.qkv, a.qkv + hd, proj + hd + kvd, att);
  }
  linear(ops, n, c, hd, a.att, p(slot.o_w), bias(slot.o_b), a.res1);
  ops.add_rmsnorm_forward(a.res1, x, a.ln2, a.rstd2, p(slot.post_norm), n, c, eps);
  if (a.fc16 != nullptr) {
    // Gate and up in 16 bits alone (the runner chose it only without their bias).
    STRATA_ASSERT(slot.gate_up_b < 0);
    ops.gemm_to_narrow(false, true, n, 2 * in, c, a.ln2, c, p(slot.gate_up_w), c, a.fc16, 2 * in);
    ops.swiglu_forward_narrow(a.act, a.fc16, n, in);
  } else {
    linear(ops, n, 2 * in, c, a.ln2, p(slot.gate_up_w), bias(slot.gate_up_b), a.fc);
    ops.swiglu_forward(a.act, a.fc, n, in);
  }
  ops.gemm_residual(false, true, n, c, in, a.act, in, p(slot.down_w), in, bias(slot.down_b), a.res1,
                    out);
}

template <typename T>
void llama_backward(const BlockContext<T>& ctx, const UnitLayout& u, const T* w, T* g, const T* x,
                    const BlockActs<T>& a, const BlockScratch<T>& sc, T* dout, T* dx) {
  backend::Ops<T>& ops = *ctx.ops;
  const ModelShape& s = *ctx.spec;
  const LlamaBlockSlots& slot = ctx.slots;
  const std::int64_t n = ctx.rows, c = s.hidden_size, in = s.intermediate_size;
  const std::int64_t hd = s.num_heads * s.head_dim, kvd = s.num_kv_heads * s.head_dim;
  const std::int64_t qkv = hd + 2 * kvd;
  auto p = [&](int i) { return w + u.tensors[static_cast<std::size_t>(i)].offset; };
  auto gp = [&](int i) { return g + u.tensors[static_cast<std::size_t>(i)].offset; };
  const T* proj = s.arch.qk_norm ? a.qkv_raw : a.qkv;
  // MLP: out = res1 + (silu(ln2 Wg^T + bg) * (ln2 Wu^T + bu)) Wd^T + bd
  ops.gemm(false, false, n, in, c, T(1), dout, c, p(slot.down_w), in, T(0), sc.dact, in);
  ops.gemm(true, false, c, in, n, T(1), dout, c, a.act, in, T(1), gp(slot.down_w), in);
  if (slot.down_b >= 0) ops.bias_backward(gp(slot.down_b), dout, n, c);
  if (a.fc16 != nullptr) {
    ops.swiglu_backward_narrow(sc.dfc, a.fc16, sc.dact, n, in);
  } else {
    ops.swiglu_backward(sc.dfc, a.fc, sc.dact, n, in);
  }
  ops.gemm(false, false, n, c, 2 * in, T(1), sc.dfc, 2 * in, p(slot.gate_up_w), c, T(0), sc.dln, c);
  ops.gemm(true, false, 2 * in, c, n, T(1), sc.dfc, 2 * in, a.ln2, c, T(1), gp(slot.gate_up_w), c);
  if (slot.gate_up_b >= 0) ops.bias_backward(gp(slot.gate_up_b), sc.dfc, n, 2 * in);
  ops.rmsnorm_backward(dout, gp(slot.post_norm), sc.dln, a.res1, p(slot.post_norm), a.rstd2, n, c);
  // Attention: res1 = x + attn(rope(norm(ln1 Wqkv^T + bqkv))) Wo^T + bo
  ops.gemm(false, false, n, hd, c, T(1), dout, c, p(slot.o_w), hd, T(0), sc.datt, hd);
  ops.gemm(true, false, c, hd, n, T(1), dout, c, a.att, hd, T(1), gp(slot.o_w), hd);
  if (slot.o_b >= 0) ops.bias_backward(gp(slot.o_b), dout, n, c);
  const kernels::AttentionShape att = attention_shape(ctx, u.layer);
  if (ops.attention_rotates(att)) {
    // dq and dk come back rotated back: the unrotated q's and k's gradients.
    ops.attention_backward_rotated(sc.dqkv, sc.dqkv + hd, sc.dqkv + hd + kvd, sc.datt, a.att, a.lse,
                                   a.qkv, a.qkv + hd, proj + hd + kvd, att, qk_rotation(ctx));
  } else {
    ops.attention_backward(sc.dqkv, sc.dqkv + hd, sc.dqkv + hd + kvd, sc.datt, a.att, a.lse, a.qkv,
                           a.qkv + hd, proj + hd + kvd, att);
    ops.rope_backward(sc.dqkv, rope_shape(ctx, s.num_heads + s.num_kv_heads), ctx.rope_cos,
                      ctx.rope_sin);
  }
  if (s.arch.qk_norm) {
    ops.rmsnorm_heads_backward(sc.dqkv, gp(slot.q_norm), proj, p(slot.q_norm), a.qk_rstd, n,
                               s.num_heads, s.head_dim, qkv, qkv);
    ops.rmsnorm_heads_backward(sc.dqkv + hd, gp(slot.k_norm), proj + hd, p(slot.k_norm),
                               a.qk_rstd + n * s.num_heads, n, s.num_kv_heads, s.head_dim, qkv,
                               qkv);
  }
  if (slot.qkv_b >= 0) ops.bias_backward(gp(slot.qkv_b), sc.dqkv, n, qkv);
  ops.gemm(false, false, n, c, qkv, T(1), sc.dqkv, qkv, p(slot.qkv_w), c, T(0), sc.dln, c);
  ops.gemm(true, false, qkv, c, n, T(1), sc.dqkv, qkv, a.ln1, c, T(1), gp(slot.qkv_w), c);
  ops.copy(dx, dout, n * c);
  ops.rmsnorm_backward(dx, gp(slot.in_norm), sc.dln, x, p(slot.in_norm), a.rstd1, n, c);
}

}  // namespace

template <typename T>
void block_forward(const BlockContext<T>& ctx, const UnitLayout& unit, const T* w, const T* x,
                   T* out, const BlockActs<T>& acts) {
  if (ctx.spec->family == Family::kGpt2) {
    gpt2_forward(ctx, unit, w, x, out, acts);
  } else {
    llama_forward(ctx, unit, w, x, out, acts);
  }
}

template <typename T>
void block_backward(const BlockContext<T>& ctx, const UnitLayout& unit, const T* w, T* g,
                    const T* x, const BlockActs<T>& acts, const BlockScratch<T>& scratch, T* dout,
                    T* dx) {
  if (ctx.spec->family == Family::kGpt2) {
    gpt2_backward(ctx, unit, w, g, x, acts, scratch, dout, dx);
  } else {
    llama_backward(ctx, unit, w, g, x, acts, scratch, dout, dx);
  }
}

template void block_forward<float>(const BlockContext<float>&, const UnitLayout&, const float*,
                                   const float*, float*, const BlockActs<float>&);
template void block_forward<double>(const BlockContext<double>&, const UnitLayout&, const double*,
                                    const double*, double*, const BlockActs<double>&);
template void block_backward<float>(const BlockContext<float>&, const UnitLayout&, const float*,
                                    float*, const float*, const BlockActs<float>&,
                                    const BlockScratch<float>&, float*, float*);
template void block_backward<double>(const BlockContext<double>&, const UnitLayout&, const double*,
                                     double*, const double*, const BlockActs<double>&,
                                     const BlockScratch<double>&, double*, double*);

}  // namespace strata::model

// Forward and backward of one transformer block, for GPT-2 and the Llama family (Llama, Mistral,
// Qwen2, Qwen3, Phi-3: optional q/k/v, o and MLP biases, per-head q/k norms, sliding windows,
// partial rotary), written against Ops<T>. Used by ModelRunner; shapes: N = batch * seq_len rows,
// C = hidden, I = intermediate, H/KV heads of D values.
#pragma once

#include <cstdint>

#include "backend/ops.h"
#include "model/layout.h"

namespace strata::model {

template <typename T>
struct BlockContext {
  backend::Ops<T>* ops = nullptr;
  const ModelShape* spec = nullptr;
  std::int64_t rows = 0;        // N
  std::int64_t batch = 0;       // B
  std::int64_t seq_len = 0;     // T
  const T* rope_cos = nullptr;  // (T, R/2) for R rotated dimensions, Llama family
  const T* rope_sin = nullptr;
  // (N) each row's position in its document (packed sequences), or null: t = r % T.
  const std::int32_t* positions = nullptr;
  LlamaBlockSlots slots;  // llama_block_slots(*spec), Llama family
};

// What a block's forward keeps for its backward (Llama leaves mean1/mean2 unused).
template <typename T>
struct BlockActs {
  T* ln1 = nullptr;      // (N,C) normalised input
  T* mean1 = nullptr;    // (N)
  T* rstd1 = nullptr;    // (N)
  T* qkv = nullptr;      // (N, qkv_width): GPT-2 3C; Llama (H+2KV)D after rotary embedding
  T* qkv_raw = nullptr;  // (N, qkv_width) before the q/k norms (only with them; v is read here)
  T* qk_rstd = nullptr;  // (N*H) then (N*KV): the q/k norms' statistics
  T* att = nullptr;      // (N, H*D) attention output
  T* lse = nullptr;      // (B,H,T)
  T* res1 = nullptr;     // (N,C) input + attention branch
  T* ln2 = nullptr;      // (N,C)
  T* mean2 = nullptr;    // (N)
  T* rstd2 = nullptr;    // (N)
  T* fc = nullptr;       // (N, fc_width): GPT-2 I (pre-GELU); Llama 2I ([gate | up])
  // fc in the ops' narrow_type() in place of the fp32 array (fc is then null): the Llama family's
  // [gate | up] (RunnerOptions::narrow_gate_up), SwiGLU reading them so; GPT-2's pre-activation
  // (RunnerOptions::narrow_gelu), GELU's forward and backward reading it so. The product writes it
  // in 16 bits.
  void* fc16 = nullptr;
  T* act = nullptr;  // (N, I): GELU output / SwiGLU output
};

// Backward scratch shared by all blocks.
template <typename T>
struct BlockScratch {
  T* dact = nullptr;  // (N, I)
  T* dfc = nullptr;   // (N, fc_width)
  T* dqkv = nullptr;  // (N, qkv_width)
  T* datt = nullptr;  // (N, H*D)
  T* dln = nullptr;   // (N, C)
};

std::int64_t qkv_width(const ModelShape& spec);
std::int64_t fc_width(const ModelShape& spec);
// Elements of BlockActs::qkv_raw and qk_rstd per row (0 without q/k norms).
std::int64_t qkv_raw_width(const ModelShape& spec);
std::int64_t qk_rstd_width(const ModelShape& spec);
// The attention's shape in block `layer` over micro-batches of batch x seq_len tokens (positions:
// each row's position in its document, or null).
kernels::AttentionShape attention_shape(const ModelShape& spec, std::int64_t batch,
                                        std::int64_t seq_len, int layer,
                                        const std::int32_t* positions = nullptr);
// Whether `holds` holds for every block's attention shape over such micro-batches (and there is a
// block).
template <typename Holds>
bool every_attention_shape(const ModelShape& spec, std::int64_t batch, std::int64_t seq_len,
                           Holds&& holds) {
  for (int l = 0; l < spec.num_layers; ++l) {
    if (!holds(attention_shape(spec, batch, seq_len, l))) return false;
  }
  return spec.num_layers > 0;
}
// Whether `ops` keep every block's attention output (`gradient` false) or its gradient (true) in
// 16 bits alone over such micro-batches (Ops::keeps_attention_alone or keeps_attention_grad_alone
// for each layer's shape).
template <typename T>
bool keeps_attention_alone(const backend::Ops<T>& ops, const ModelShape& spec, std::int64_t batch,
                           std::int64_t seq_len, bool gradient = false) {
  return every_attention_shape(spec, batch, seq_len, [&](const kernels::AttentionShape& s) {
    return gradient ? ops.keeps_attention_grad_alone(s) : ops.keeps_attention_alone(s);
  });
}
// Whether a block's q, k and v may be kept in 16 bits alone: every block without q/k norms (whose
// forward reads the raw projection and writes q and k normalised in fp32). The projection's output
// (with its bias where it has one: GPT-2's, Qwen2's) is then read by the attention alone.
bool qkv_alone_applies(const ModelShape& spec);
// Whether a block's q/k/v gradient (the backward scratch dqkv) may be: GPT-2's (its attention does
// not rotate, so the gradient's companion holds its fp32 values exactly, and the bias's column sums
// read those), and the Llama family's without q/k norms or a qkv bias (no q/k norm backward reads
// it in fp32, no bias sums its rotated values rounded: only the projection's two products read
// it).
bool qkv_grad_alone_applies(const ModelShape& spec);
// Whether `ops` keep every block's q, k and v (`gradient` false) or their gradient (true) in 16
// bits alone over such micro-batches: the model allows it (above), and Ops::keeps_qkv_alone or
// keeps_qkv_grad_alone for each layer's shape, whose attention rotates q and k in the Llama family
// (else the rope kernel rotates them in fp32).
template <typename T>
bool keeps_qkv_alone(const backend::Ops<T>& ops, const ModelShape& spec, std::int64_t batch,
                     std::int64_t seq_len, bool gradient = false) {
  if (!(gradient ? qkv_grad_alone_applies(spec) : qkv_alone_applies(spec))) return false;
  const bool rotates = spec.family != Family::kGpt2;
  return every_attention_shape(spec, batch, seq_len, [&](const kernels::AttentionShape& s) {
    return (gradient ? ops.keeps_qkv_grad_alone(s) : ops.keeps_qkv_alone(s)) &&
           (!rotates || ops.attention_rotates(s));
  });
}

// out(N,C) = block(x); fills `acts`. `w` is the unit's flat parameters.
template <typename T>
void block_forward(const BlockContext<T>& ctx, const UnitLayout& unit, const T* w, const T* x,
                   T* out, const BlockActs<T>& acts);

// Given dout (N,C) (clobbered), WRITES dx (N,C) and accumulates the unit's flat gradient g.
template <typename T>
void block_backward(const BlockContext<T>& ctx, const UnitLayout& unit, const T* w, T* g,
                    const T* x, const BlockActs<T>& acts, const BlockScratch<T>& scratch, T* dout,
                    T* dx);

}  // namespace strata::model

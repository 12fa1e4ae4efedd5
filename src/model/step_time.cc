#include "model/step_time.h"

#include <algorithm>
#include <array>

namespace strata::model {
namespace {

constexpr double kActivationBytes = 2.0;     // bf16
constexpr std::int64_t kAttentionTile = 64;  // query and key rows of a flash-attention tile

const std::array<Card, 3>& cards() {
  static const std::array<Card, 3> all = {
      Card{"h100", 989e12, 3.35e12}, Card{"h200", 989e12, 4.8e12}, Card{"a100", 312e12, 2.039e12}};
  return all;
}

// Of the T x T score matrix, the fraction a causal (and windowed) flash attention computes: whole
// 64 x 64 tiles, so the diagonal tiles count in full.
double attention_tile_fraction(std::int64_t seq_len, std::int64_t window) {
  const std::int64_t n = (seq_len + kAttentionTile - 1) / kAttentionTile;
  std::int64_t tiles = 0;
  for (std::int64_t q = 0; q < n; ++q) {
    std::int64_t first = 0;
    if (window > 0)
      first = std::max<std::int64_t>(0, (q * kAttentionTile - window + 1) / kAttentionTile);
    tiles += q - first + 1;
  }
  return static_cast<double>(tiles) / static_cast<double>(n * n);
}

}  // namespace

const Card* find_card(const std::string& name) {
  for (const Card& c : cards())
    if (c.name == name) return &c;
  return nullptr;
}

std::string card_names() {
  std::string out;
  for (const Card& c : cards())
    out += (out.empty() ? "" : ", ") + c.name;
  return out;
}

StepPrediction predict_step(const ModelShape& s, std::int64_t batch, std::int64_t seq_len,
                            const Card& card, const Fractions& f) {
  const double tokens = static_cast<double>(batch * seq_len);
  const double h = static_cast<double>(s.hidden_size);
  const double inter = static_cast<double>(s.intermediate_size);
  const double q_width = static_cast<double>(s.num_heads * s.head_dim);
  const double kv_width = static_cast<double>(s.num_kv_heads * s.head_dim);
  const double layers = static_cast<double>(s.num_layers);
  const double vocab = static_cast<double>(s.vocab_size);
  const bool gated = s.family != config::ModelFamily::kGpt2;  // SwiGLU MLP (Llama family)

  StepPrediction p;
  auto compute = [&](std::string family, double flops, double fraction, std::string what) {
    p.families.push_back({std::move(family), flops, 0.0, true, fraction,
                          flops / (card.bf16_flops * fraction) * 1e3, std::move(what)});
  };
  auto memory = [&](std::string family, double bytes, std::string what) {
    p.families.push_back({std::move(family), 0.0, bytes, false, f.memory,
                          bytes / (card.hbm_bytes_s * f.memory) * 1e3, std::move(what)});
  };

  // Matrix products: 2 FLOPs per multiply-add, the forward once and the backward twice (input and
  // weight gradients); bias, GELU and the residual ride in cuBLASLt epilogues.
  const double block_matrix =
      h * q_width + 2.0 * h * kv_width + q_width * h + (gated ? 3.0 : 2.0) * h * inter;
  const double gemm_params = layers * block_matrix + vocab * h;
  compute("gemm", 6.0 * gemm_params * tokens, f.gemm,
          "6 x (block matrices + head) x tokens: forward, input and weight gradients");

  // Attention: S = QK^T and O = PV forward (4 B H T^2 d), FlashAttention-2's backward 2.5x that
  // (S recomputed, dP, dV, dK, dQ), over the tiles a causal/windowed kernel computes.
  double attention = 0.0;
  for (std::int64_t l = 0; l < s.num_layers; ++l) {
    const double frac =
        attention_tile_fraction(seq_len, attention_window_of(s, static_cast<int>(l)));
    attention += 3.5 * 4.0 * static_cast<double>(batch) * static_cast<double>(s.num_heads) *
                 static_cast<double>(seq_len) * static_cast<double>(seq_len) *
                 static_cast<double>(s.head_dim) * frac;
  }
  compute("attention", attention, f.attention,
          "3.5 x 4 B H T^2 d per layer over the 64 x 64 tiles computed (causal, windows)");

  // Bandwidth-bound kernels, bytes of bf16 activations per token.
  // Residual + norm fused: forward reads x and the branch, writes x' and y (4 h); backward reads
  // dy, x', the residual's gradient, writes dx (4 h). Two per block, one final.
  memory("norm+residual", (2.0 * layers + 1.0) * 8.0 * h * kActivationBytes * tokens,
         "8 h bytes-of-bf16 per token per fused residual+norm (forward 4, backward 4)");
  // The MLP's activation: SwiGLU fused (forward reads gate and up, writes out; backward reads
  // gate, up, dout, writes dgate, dup), or GELU in the GEMM epilogue (the pre-activation written
  // forward and read backward).
  memory(gated ? "swiglu" : "gelu-aux",
         layers * (gated ? 8.0 : 2.0) * inter * kActivationBytes * tokens,
         gated ? "8 I per token per block (fused SwiGLU forward 3, backward 5)"
               : "2 I per token per block (GELU epilogue's saved pre-activation, written, read)");
  if (s.family != config::ModelFamily::kGpt2) {
    // RoPE rides in the attention's staging (rope_in_attention): q and k rotated as they are
    // read, dq and dk rotated back as they are written; no bytes of its own.
    memory("rope", 0.0, "none: q, k rotated as the attention reads them, dq, dk as it writes them");
  }
  // Cross-entropy of the 16-bit logits (logits_16bit, cross_entropy_16): one pass for the running
  // max and sum, a second reading them again to write the gradient over them: 3 V.
  memory("cross-entropy", 3.0 * vocab * kActivationBytes * tokens,
         "3 V per token (logits read twice, their gradient written)");
  // Embedding gather forward, scatter-add of its gradient backward (fp32 gradient).
  memory("embedding", (h * kActivationBytes + 2.0 * h * 4.0) * tokens,
         "h bf16 gathered, h fp32 gradient read and written per token");
  // AdamW on the device: fp32 master, m, v read and written (24 bytes), the bf16 gradient read
  // and the bf16 parameter written (4): 28 bytes per parameter.
  memory("adamw", 28.0 * static_cast<double>(total_params(s)),
         "28 bytes per parameter (fp32 master, m, v read and written; bf16 gradient, parameter)");
  memory("casts before GEMMs", 0.0, "none: activations are bf16 end to end");

  double longest = -1.0;
  for (const FamilyTime& t : p.families) {
    p.step_ms += t.ms;
    if (t.ms > longest) {
      longest = t.ms;
      p.limiting = t.family;
    }
  }
  p.tokens_per_s = tokens / (p.step_ms / 1e3);
  return p;
}

}  // namespace strata::model

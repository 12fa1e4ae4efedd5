// ModelRunner: runs a model's units forward and backward on a backend for one micro-batch shape.
// It owns the activations (allocated once from the device arena when created: the step loop does
// not allocate) and borrows parameters and gradient buffers unit by unit from a UnitStore, so
// where a unit's bytes live (resident, offloaded, prefetched) is the store's business.
//
// Order of use, which a prefetcher can rely on:
//   forward  : params 0, 1..L, then L+1 (with 0 again when the embeddings are tied);
//   the head's backward runs fused with its forward (the logits are never all held at once);
//   backward : L..1 (params + grads), then 0 (grads only).
// With activation checkpointing each block keeps only its input and is recomputed in backward;
// the kernels are deterministic, so the gradients are bit-identical either way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/address_range.h"
#include "model/blocks.h"
#include "model/layout.h"

namespace strata::model {

template <typename T>
class UnitStore {
 public:
  virtual ~UnitStore() = default;
  // Unit u's parameters in T, flat layout, on the device; valid until release_params(u).
  virtual Result<const T*> acquire_params(int unit) = 0;
  // The runner is done with unit u's parameters for now.
  virtual void release_params(int unit) = 0;
  // Unit u's gradient buffer in T, flat layout, on the device; the runner only accumulates (+=)
  // into it. What it holds before a micro-batch's first contribution is the store's choice
  // (zeros, or the sum of earlier micro-batches).
  virtual Result<T*> acquire_grads(int unit) = 0;
  // Unit u's gradient for this micro-batch is complete (no more contributions).
  virtual Status grads_ready(int unit) = 0;
};

struct RunnerOptions {
  std::int64_t batch = 1;
  std::int64_t seq_len = 1;
  bool activation_checkpointing = false;
  // Activation checkpoints (every block's input) in pinned host memory instead of the device:
  // each leaves in forward (device->host, overlapping the block) and comes back one block ahead
  // in backward. Needs activation_checkpointing.
  bool activation_offload = false;
  std::uint64_t logits_chunk_bytes = 32ull << 20;  // logits rows computed at once in the head
  // 16-bit companions of the activations GEMMs read (Ops::pair_narrow: the norms' outputs and
  // input gradients, the MLP's activation and its gradient), allocated when the backend's ops
  // take them (narrow_type() 16-bit) and counted by memory_needed: 2 bytes per element of each.
  bool narrow_companions = false;
  // The head's logits chunk in the ops' 16-bit type alone (Ops::logits_in_narrow, fast path
  // logits_16bit), counted so by memory_needed: 2 bytes per logit in rows padded to 8 elements,
  // where the fp32 chunk and its companion take 6. Only with narrow_companions, and only where the
  // backend's ops promise it (the trainer asks them); otherwise the fp32 chunk.
  bool narrow_logits = false;
  // The activations only GEMMs read (each block's ln1, ln2 and act: the norms' outputs and the
  // MLP's activation) in the ops' 16-bit type alone (Ops::pair_narrow_alone, fast path
  // activations_16bit_alone): their fp32 arrays are never allocated (address ranges with nothing
  // behind them stand for them) and memory_needed counts their 2 bytes per element alone. Only
  // with narrow_companions, and only where the backend's ops promise it (the trainer asks them:
  // Ops::keeps_narrow_alone); otherwise the fp32 arrays beside their companions.
  bool narrow_alone = false;
  // The Llama family's gate and up projections (each block's fc, N x 2I) in the ops' 16-bit type
  // alone (Ops::keeps_gate_up_narrow, fast path gate_up_16bit): written so by their product, read
  // so by SwiGLU; memory_needed counts 2 bytes per element where the fp32 fc took 4. Only with
  // narrow_companions, for the Llama family without an MLP bias, and only where the backend's ops
  // promise it (the trainer asks them); otherwise the fp32 fc.
  bool narrow_gate_up = false;
  // GPT-2's MLP pre-activation (each block's fc, N x 4C) in the ops' 16-bit type
  // (Ops::keeps_gelu_narrow, fast path gelu_16bit): written so by its product and bias, read so by
  // GELU's forward and backward; memory_needed counts 2 bytes per element where the fp32 fc took
  // 4. Only with narrow_companions, for GPT-2, and only where the backend's ops promise it (the
  // trainer asks them); otherwise the fp32 fc.
  bool narrow_gelu = false;
  // GELU's gradient there (the backward scratch dfc, N x 4C) in the ops' 16-bit type alone
  // (Ops::keeps_gelu_grad_alone, fast path gelu_grad_16bit_alone): written into its companion only
  // by GELU's 16-bit backward, read there by the fc projection's products and its bias's column
  // sums; memory_needed counts only the companion. Only with narrow_gelu and narrow_alone in
  // effect, and only where the backend's ops promise it; otherwise the fp32 array beside its
  // companion.
  bool narrow_gelu_grad = false;
  // GELU's gradient written by the product's epilogue (Ops::fuses_gelu_grad, fast path
  // gemm_dgelu_epilogue_16bit): GPT-2's fp32 backward scratch before GELU's gradient (dact, N x 4C)
  // is then not allocated. Only with narrow_gelu_grad in effect, and only where the backend's ops
  // promise it; otherwise the scratch.
  bool fused_gelu_grad = false;
  // Each block's attention output (att, N x H*D) in the ops' 16-bit type alone too (Ops::
  // keeps_attention_alone, fast path attention_16bit_alone): written so by the 16-bit attention,
  // read so by its backward and its products; memory_needed counts 2 bytes per element. Only with
  // narrow_alone, and only where the backend's ops promise it for every layer's shape (the trainer
  // asks them: keeps_attention_alone in blocks.h); otherwise the fp32 array beside its companion.
  bool narrow_attention_alone = false;
  // The gradient of each block's attention output (the backward scratch datt, N x H*D) in the ops'
  // 16-bit type alone too (Ops::keeps_attention_grad_alone, fast path attention_grad_16bit):
  // written so by its product, read so by the attention's backward; memory_needed counts 2 bytes
  // per element. Only with narrow_attention_alone, and only where the backend's ops promise it for
  // every layer's shape (the trainer asks them); otherwise the fp32 array.
  bool narrow_attention_grad = false;
  // The gradient of the Llama family's SwiGLU output (the backward scratch dact, N x I) in the ops'
  // 16-bit type alone (Ops::keeps_swiglu_grad_alone, fast path swiglu_grad_16bit): written so by
  // the down projection's input gradient, read so by SwiGLU's 16-bit backward; memory_needed counts
  // 2 bytes per element. Only with narrow_gate_up and narrow_alone in effect; otherwise the fp32
  // array.
  bool narrow_swiglu_grad = false;
  // The gradient of the blocks' norm outputs (the backward scratch dln, N x C) in the ops' 16-bit
  // type alone (Ops::keeps_norm_grad_alone, fast path norm_grad_16bit): written so by the
  // projections' input gradients, read so by the norms' backwards; memory_needed counts 2 bytes per
  // element. Only with narrow_alone in effect; otherwise the fp32 array.
  bool narrow_norm_grad = false;
  // The gradient of the Llama family's gate and up (the backward scratch dfc, N x 2I) in the ops'
  // 16-bit type alone (Ops::keeps_gate_up_grad_alone, fast path gate_up_grad_16bit_alone): written
  // into its companion only by SwiGLU's 16-bit backward, read there by the products; memory_needed
  // counts only the companion. Only with narrow_gate_up and narrow_alone in effect; otherwise the
  // fp32 array beside its companion.
  bool narrow_gate_up_grad = false;
  // The gradient of q, k and v (the backward scratch dqkv, N x qkv_width) in the ops' 16-bit type
  // alone (Ops::keeps_qkv_grad_alone, fast path qkv_grad_16bit_alone): written into its companion
  // only by the attention's backward, read there by the qkv projection's products (and, for GPT-2,
  // by its bias's column sums); memory_needed counts only the companion. Only with narrow_alone in
  // effect, where qkv_grad_alone_applies, and only where the backend's ops promise it for every
  // layer's shape (the trainer asks them: keeps_qkv_alone in blocks.h); otherwise the fp32 array
  // beside its companion.
  bool narrow_qkv_grad = false;
  // Each block's q, k and v (qkv, N x qkv_width) in the ops' 16-bit type alone (Ops::
  // keeps_qkv_alone, fast path qkv_16bit): written so by the qkv projection (its bias added before
  // the rounding), read so (widened) by the attention's forward and backward; memory_needed counts
  // 2 bytes per element. Only
  // with narrow_alone in effect, where qkv_alone_applies, and only where the backend's ops promise
  // it for every layer's shape (the trainer asks them); otherwise the fp32 array.
  bool narrow_qkv = false;
};

// What a runner allocates: device bytes as the arena counts them (256-byte granules), pinned
// host bytes (4 KiB pages).
struct RunnerMemory {
  std::uint64_t device_bytes = 0;
  std::uint64_t host_bytes = 0;
};

template <typename T>
class ModelRunner {
 public:
  // A target that counts for nothing (PyTorch's ignore_index): no loss, no gradient.
  static constexpr std::int32_t kIgnoredTarget = -1;

  // Allocates every activation buffer; kOutOfMemory (naming the device budget) if they do not
  // fit; kInvalidArgument when seq_len exceeds the model's max_seq_len. The 16-bit companions
  // (narrow_companions) are a speed-up, not a need: where they do not fit beside the rest, the
  // runner is made without them and companions_dropped() says why.
  static Result<std::unique_ptr<ModelRunner>> create(backend::Backend& backend,
                                                     const ModelShape& spec,
                                                     const ModelLayout& layout,
                                                     const RunnerOptions& options);
  ~ModelRunner();
  // Why the companions asked for were left out (empty: they were not, or none were asked for).
  const std::string& companions_dropped() const { return companions_dropped_; }

  // Exactly what create() would allocate, without a backend (the tier plan and `strata
  // estimate` count it).
  static RunnerMemory memory_needed(const ModelShape& spec, const RunnerOptions& options);

  // Copies a micro-batch to the device: inputs and targets are (B, T) host arrays of token ids,
  // each in [0, vocab_size), a target also kIgnoredTarget (checked: kInvalidArgument naming the
  // position). `positions` (B, T), when not null, gives each token's position in its own document
  // (packed sequences, as transformers' restarting position_ids): each in [0, T), and in a row
  // each either 0 (a document starts) or the previous + 1 (kInvalidArgument naming row and
  // column). RoPE and GPT-2's learned positions use it, and a token attends only to the keys of
  // its own document (within the sliding window, if any). Null: positions 0..T-1 in every row.
  Status set_batch(const std::int32_t* inputs, const std::int32_t* targets,
                   const std::int32_t* positions = nullptr);

  // Targets of the current batch that count (not kIgnoredTarget): what mean losses divide by.
  std::int64_t counted_targets() const { return counted_targets_; }

  // Forward, loss, and backward of the current batch. Unit gradients accumulate
  // d(grad_scale * sum of counted token losses). Returns the mean loss over the counted targets
  // (0, with zero gradients, when none counts).
  Result<double> train_step(UnitStore<T>& store, double grad_scale);

  // Forward and loss only; returns the mean loss over the counted targets (0 when none counts).
  Result<double> evaluate(UnitStore<T>& store);

  // Forward, then every logit, (B*T, V) row-major, copied to host memory at `logits`.
  Status logits(UnitStore<T>& store, T* logits);

  // Device bytes this runner allocated (as the arena counts them), and pinned host bytes.
  std::uint64_t device_bytes() const { return device_bytes_; }
  std::uint64_t host_bytes() const { return host_bytes_; }
  const RunnerOptions& options() const { return options_; }

 private:
  ModelRunner(backend::Backend* backend, const ModelShape& spec, const ModelLayout& layout,
              const RunnerOptions& options);
  Status allocate();
  // The activations' 16-bit companions (RunnerOptions::narrow_companions).
  Status allocate_companions();
  struct RopeTables {
    T* cos = nullptr;  // (T, R/2)
    T* sin = nullptr;
  };
  Status allocate_rope_tables(bool long_factors, RopeTables* tables);
  Status check_positions(const std::int32_t* positions) const;
  double mean_loss(double loss_sum) const;
  Result<T*> alloc(std::int64_t elements, const char* purpose);
  Result<T*> alloc_host(std::int64_t elements, const char* purpose);
  // An address range for `elements` values with nothing behind it (AddressRange), not counted.
  Result<T*> reserve(std::int64_t elements, const char* purpose);
  // Whether ln1, ln2 and act are kept in 16 bits alone (RunnerOptions::narrow_alone).
  bool keeps_alone() const;
  // Whether each block's attention output is kept in 16 bits alone too
  // (RunnerOptions::narrow_attention_alone).
  bool keeps_attention_alone() const;
  // Whether the gradient of each block's attention output is kept in 16 bits alone too
  // (RunnerOptions::narrow_attention_grad).
  bool keeps_attention_grad_alone() const;
  // Whether the Llama family's gate and up are kept in 16 bits alone
  // (RunnerOptions::narrow_gate_up).
  bool keeps_gate_up_narrow() const;
  // Whether GPT-2's MLP pre-activation is kept in 16 bits (RunnerOptions::narrow_gelu).
  bool keeps_gelu_narrow() const;
  // Whether GELU's gradient is kept in 16 bits alone too (RunnerOptions::narrow_gelu_grad).
  bool keeps_gelu_grad_alone() const;
  // Whether GPT-2's GELU gradient skips its fp32 scratch (RunnerOptions::fused_gelu_grad).
  bool fuses_gelu_grad() const;
  // Whether the gradient of SwiGLU's output is kept in 16 bits alone too
  // (RunnerOptions::narrow_swiglu_grad).
  bool keeps_swiglu_grad_alone() const;
  // Whether the gradient of the blocks' norm outputs is kept in 16 bits alone too
  // (RunnerOptions::narrow_norm_grad).
  bool keeps_norm_grad_alone() const;
  // Whether the gradient of gate and up is kept in 16 bits alone too
  // (RunnerOptions::narrow_gate_up_grad).
  bool keeps_gate_up_grad_alone() const;
  // Whether the gradient of q, k and v is kept in 16 bits alone too
  // (RunnerOptions::narrow_qkv_grad).
  bool keeps_qkv_grad_alone() const;
  // Whether q, k and v are kept in 16 bits alone too (RunnerOptions::narrow_qkv).
  bool keeps_qkv_alone() const;
  BlockActs<T>& acts_for(int layer);
  // Block `layer`'s input (layer == num_layers: the head's input).
  T* block_input(int layer);
  Status save_checkpoint(int layer);
  Status load_checkpoint(int layer);
  backend::Event saved(int parity) const { return events_[parity]; }
  backend::Event loaded(int parity) const { return events_[2 + parity]; }
  backend::Event computed() const { return events_[4]; }
  Status forward_blocks(UnitStore<T>& store, bool training);
  // Final norm into lnf_; returns the head's parameters and the logits weight.
  Status head_norm(const T* head_params);
  const T* head_weight(const T* head_params, const T* embedding_params) const;
  // The head's product for rows [r0, r0 + rows): the chunk's logits, in logits16_ (the ops'
  // 16-bit type) where the runner keeps them so, else in logits_.
  void head_logits(std::int64_t r0, std::int64_t rows, const T* weight);
  // Inference up to the head: the blocks forward, the head's (and a tied embedding's) parameters
  // acquired, the final norm into lnf_; returns the logits weight, held until release_head().
  Result<const T*> forward_to_head(UnitStore<T>& store);
  void release_head(UnitStore<T>& store);

  backend::Backend* backend_;  // null only while sizing
  backend::Ops<T>* ops_;
  ModelShape spec_;
  ModelLayout layout_;
  RunnerOptions options_;
  BlockContext<T> ctx_;
  std::int64_t rows_ = 0;
  std::int64_t chunk_rows_ = 0;
  std::uint64_t device_bytes_ = 0;
  std::uint64_t host_bytes_ = 0;
  bool sizing_ = false;
  backend::Event events_[5];
  std::vector<T*> host_checkpoints_;  // activation_offload: per block, (N,C) pinned
  std::vector<backend::Buffer> buffers_;
  std::vector<AddressRange> reserved_;  // the keys of the activations kept in 16 bits alone
  std::int32_t* inputs_ = nullptr;
  std::int32_t* targets_ = nullptr;
  std::int32_t* positions_ = nullptr;  // used when set_batch was given positions
  std::int64_t counted_targets_ = 0;
  RopeTables rope_short_;     // the tables (LongRoPE: of short_factor)
  RopeTables rope_long_;      // LongRoPE's long_factor tables, when a batch may need them
  std::vector<T*> residual_;  // L+1 of (N,C); 2 with activation_offload
  std::vector<BlockActs<T>> acts_;
  BlockScratch<T> scratch_;
  T* dres_[2] = {nullptr, nullptr};
  T* lnf_ = nullptr;
  T* meanf_ = nullptr;
  T* rstdf_ = nullptr;
  T* logits_ = nullptr;  // fp32 logits chunk (null where logits16_ is set)
  // The logits chunk in the ops' narrow_type() alone (RunnerOptions::narrow_logits); null: the
  // fp32 chunk (logits_) instead.
  void* logits16_ = nullptr;
  // Its rows' stride: the vocabulary rounded up to 8 elements, so that every row starts 16-byte
  // aligned (cuBLASLt's fast kernels need it; GPT-2's 50257 would not be).
  std::int64_t logits16_ld_ = 0;
  T* losses_ = nullptr;
  std::vector<T*> paired_;  // buffers with a 16-bit companion (Ops::pair_narrow)
  std::string companions_dropped_;
};

extern template class ModelRunner<float>;
extern template class ModelRunner<double>;

// The activations without their 16-bit companions, for a working set that does not fit the
// device budget with them (a speed-up, not a need: the GEMMs then convert their activations):
// the options, what they allocate, and the one line the trainer and `strata estimate` print,
// naming the bytes the companions would have taken.
struct WithoutCompanions {
  RunnerOptions options;
  RunnerMemory memory;
  std::string note;
};
WithoutCompanions without_companions(const ModelShape& spec, const RunnerOptions& options);

}  // namespace strata::model

// ModelRunner (see runner.h).
#include "model/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "common/units.h"
#include "kernels/cpu/cast.h"
#include "model/rope.h"

namespace strata::model {

template <typename T>
ModelRunner<T>::ModelRunner(backend::Backend* backend, const ModelShape& spec,
                            const ModelLayout& layout, const RunnerOptions& options)
    : backend_(backend),
      ops_(backend != nullptr ? backend->ops<T>() : nullptr),
      spec_(spec),
      layout_(layout),
      options_(options) {}

template <typename T>
ModelRunner<T>::~ModelRunner() {
  for (const T* wide : paired_)
    ops_->unpair_narrow(wide);
  for (backend::Event& e : events_) {
    if (e.valid()) backend_->destroy_event(e);
  }
}

template <typename T>
T* ModelRunner<T>::block_input(int layer) {
  return options_.activation_offload ? residual_[static_cast<std::size_t>(layer % 2)]
                                     : residual_[static_cast<std::size_t>(layer)];
}

template <typename T>
Status ModelRunner<T>::save_checkpoint(int layer) {
  // The block's output buffer held the input of block layer - 1: its trip to the host must be
  // over before this block overwrites it.
  const std::uint64_t bytes = static_cast<std::uint64_t>(rows_ * spec_.hidden_size) * sizeof(T);
  if (layer >= 1) STRATA_TRY(backend_->wait(backend::StreamKind::kCompute, saved(1 - layer % 2)));
  STRATA_TRY(backend_->record(computed(), backend::StreamKind::kCompute));
  STRATA_TRY(backend_->wait(backend::StreamKind::kDeviceToHost, computed()));
  STRATA_TRY(backend_->copy_async(backend::StreamKind::kDeviceToHost,
                                  host_checkpoints_[static_cast<std::size_t>(layer)],
                                  block_input(layer), bytes));
  return backend_->record(saved(layer % 2), backend::StreamKind::kDeviceToHost);
}

template <typename T>
Status ModelRunner<T>::load_checkpoint(int layer) {
  // Into the buffer that held the input of block layer + 2, which backward no longer needs.
  const std::uint64_t bytes = static_cast<std::uint64_t>(rows_ * spec_.hidden_size) * sizeof(T);
  STRATA_TRY(backend_->record(computed(), backend::StreamKind::kCompute));
  STRATA_TRY(backend_->wait(backend::StreamKind::kHostToDevice, computed()));
  STRATA_TRY(backend_->wait(backend::StreamKind::kHostToDevice, saved(layer % 2)));
  STRATA_TRY(backend_->copy_async(backend::StreamKind::kHostToDevice, block_input(layer),
                                  host_checkpoints_[static_cast<std::size_t>(layer)], bytes));
  return backend_->record(loaded(layer % 2), backend::StreamKind::kHostToDevice);
}

template <typename T>
Result<std::unique_ptr<ModelRunner<T>>> ModelRunner<T>::create(backend::Backend& backend,
                                                               const ModelShape& spec,
                                                               const ModelLayout& layout,
                                                               const RunnerOptions& options) {
  if (backend.ops<T>() == nullptr) {
    return Status(ErrorCode::kUnavailable, fmt::format("the {} backend has no {}-byte compute type",
                                                       backend.name(), sizeof(T)));
  }
  if (options.batch < 1 || options.seq_len < 1) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("batch {} and seq_len {} must both be at least 1", options.batch,
                              options.seq_len));
  }
  if (options.seq_len > spec.max_seq_len) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("seq_len {} exceeds the model's max_seq_len {}", options.seq_len,
                              spec.max_seq_len));
  }
  if (options.activation_offload && !options.activation_checkpointing) {
    return Status(ErrorCode::kInvalidArgument,
                  "activation_offload keeps activation checkpoints on the host, so it needs "
                  "activation_checkpointing");
  }
  std::unique_ptr<ModelRunner> runner(new ModelRunner(&backend, spec, layout, options));
  Status made = runner->allocate();
  if (!made.is_ok() && made.code() == ErrorCode::kOutOfMemory && options.narrow_companions) {
    RunnerOptions without = options;
    without.narrow_companions = false;
    runner.reset();  // its buffers go back to the arena first
    runner.reset(new ModelRunner(&backend, spec, layout, without));
    runner->companions_dropped_ = made.message();
    made = runner->allocate();
  }
  STRATA_TRY(made);
  return runner;
}

template <typename T>
RunnerMemory ModelRunner<T>::memory_needed(const ModelShape& spec, const RunnerOptions& options) {
  ModelRunner sizing(nullptr, spec, ModelLayout{}, options);
  sizing.sizing_ = true;
  Status s = sizing.allocate();
  STRATA_ASSERT(s.is_ok());
  return RunnerMemory{sizing.device_bytes_, sizing.host_bytes_};
}

template <typename T>
Result<T*> ModelRunner<T>::alloc_host(std::int64_t elements, const char* purpose) {
  const std::uint64_t bytes =
      static_cast<std::uint64_t>(std::max<std::int64_t>(elements, 1)) * sizeof(T);
  host_bytes_ += align_up(bytes, 4096);
  if (sizing_) return reinterpret_cast<T*>(alignof(T));
  STRATA_ASSIGN_OR_RETURN(backend::Buffer buffer, backend_->allocate_pinned(bytes, purpose));
  T* p = buffer.template as<T>();
  buffers_.push_back(std::move(buffer));
  return p;
}

template <typename T>
Result<T*> ModelRunner<T>::alloc(std::int64_t elements, const char* purpose) {
  const std::uint64_t bytes =
      static_cast<std::uint64_t>(std::max<std::int64_t>(elements, 1)) * sizeof(T);
  // What the arena counts: 256-byte granules.
  device_bytes_ += align_up(bytes, 256);
  if (sizing_) return reinterpret_cast<T*>(alignof(T));
  STRATA_ASSIGN_OR_RETURN(backend::Buffer buffer, backend_->allocate_device(bytes, purpose, 256));
  T* p = buffer.template as<T>();
  buffers_.push_back(std::move(buffer));
  return p;
}

template <typename T>
Status ModelRunner<T>::allocate() {
  const std::int64_t b = options_.batch, t = options_.seq_len;
  const std::int64_t n = b * t, c = spec_.hidden_size, in = spec_.intermediate_size;
  const std::int64_t hd = spec_.num_heads * spec_.head_dim;
  const std::int64_t layers = spec_.num_layers;
  rows_ = n;
  ctx_.ops = ops_;
  ctx_.spec = &spec_;
  ctx_.rows = n;
  ctx_.batch = b;
  ctx_.seq_len = t;
  if (spec_.family == Family::kLlama) ctx_.slots = llama_block_slots(spec_);
  chunk_rows_ = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(options_.logits_chunk_bytes / (sizeof(T) * spec_.vocab_size)), 1,
      n);

  STRATA_ASSIGN_OR_RETURN(T * tokens, alloc((3 * n * 4 + sizeof(T) - 1) / sizeof(T), "token ids"));
  inputs_ = reinterpret_cast<std::int32_t*>(tokens);
  targets_ = inputs_ + n;
  positions_ = targets_ + n;
  // The residual stream: every block's input on the device (they are the activation
  // checkpoints), or, with activation_offload, two device buffers that blocks alternate between
  // and every block's input in pinned host memory.
  const std::int64_t device_residuals = options_.activation_offload ? 2 : layers + 1;
  for (std::int64_t l = 0; l < device_residuals; ++l) {
    STRATA_ASSIGN_OR_RETURN(T * r, alloc(n * c, "residual stream"));
    residual_.push_back(r);
  }
  if (options_.activation_offload) {
    STRATA_ASSIGN_OR_RETURN(T * h, alloc_host(layers * n * c, "activation checkpoints (host)"));
    for (std::int64_t l = 0; l < layers; ++l)
      host_checkpoints_.push_back(h + l * n * c);
  }
  const std::int64_t saved_sets = options_.activation_checkpointing ? 1 : layers;
  // The activations only GEMMs read (the norms' outputs, the MLP's activation) in 16 bits alone:
  // address ranges stand for their fp32 arrays, and their companions (allocate_companions) hold
  // them.
  const bool alone = keeps_alone();
  const bool attention_alone = keeps_attention_alone();
  // The MLP's pre-activation in 16 bits: the Llama family's gate and up, GPT-2's fc.
  const bool fc_narrow = keeps_gate_up_narrow() || keeps_gelu_narrow();
  // An fp32 array (`what`), or where it is kept in 16 bits alone an address range standing for it
  // (`kept`; its companion holds it).
  auto fp32_or_key = [&](T** p, std::int64_t elements, bool kept_alone, const char* what,
                         const char* kept) -> Status {
    if (kept_alone) {
      STRATA_ASSIGN_OR_RETURN(*p, reserve(elements, kept));
    } else {
      STRATA_ASSIGN_OR_RETURN(*p, alloc(elements, what));
    }
    return Status::ok();
  };
  const char* activation = "an activation kept in 16 bits";
  for (std::int64_t l = 0; l < saved_sets; ++l) {
    BlockActs<T> a;
    const char* what = "block activations";
    STRATA_TRY(fp32_or_key(&a.ln1, n * c, alone, what, activation));
    STRATA_ASSIGN_OR_RETURN(a.mean1, alloc(n, what));
    STRATA_ASSIGN_OR_RETURN(a.rstd1, alloc(n, what));
    STRATA_TRY(fp32_or_key(&a.qkv, n * qkv_width(spec_), keeps_qkv_alone(), what,
                           "q, k and v kept in 16 bits"));
    if (spec_.arch.qk_norm) {
      STRATA_ASSIGN_OR_RETURN(a.qkv_raw, alloc(n * qkv_raw_width(spec_), what));
      STRATA_ASSIGN_OR_RETURN(a.qk_rstd, alloc(n * qk_rstd_width(spec_), what));
    }
    STRATA_TRY(
        fp32_or_key(&a.att, n * hd, attention_alone, what, "an attention output kept in 16 bits"));
    STRATA_ASSIGN_OR_RETURN(a.lse, alloc(b * spec_.num_heads * t, what));
    STRATA_ASSIGN_OR_RETURN(a.res1, alloc(n * c, what));
    STRATA_TRY(fp32_or_key(&a.ln2, n * c, alone, what, activation));
    STRATA_ASSIGN_OR_RETURN(a.mean2, alloc(n, what));
    STRATA_ASSIGN_OR_RETURN(a.rstd2, alloc(n, what));
    if (fc_narrow) {
      const std::int64_t bytes = n * fc_width(spec_) * 2;  // bf16 or fp16
      STRATA_ASSIGN_OR_RETURN(T * fc16,
                              alloc((bytes + static_cast<std::int64_t>(sizeof(T)) - 1) / sizeof(T),
                                    "the MLP's pre-activation (16-bit)"));
      a.fc16 = fc16;
    } else {
      STRATA_ASSIGN_OR_RETURN(a.fc, alloc(n * fc_width(spec_), what));
    }
    STRATA_TRY(fp32_or_key(&a.act, n * in, alone, what, activation));
    acts_.push_back(a);
  }
  const char* what = "backward scratch";
  // GPT-2's product before GELU's gradient: none where the product's epilogue writes the gradient.
  if (!fuses_gelu_grad()) {
    STRATA_TRY(fp32_or_key(&scratch_.dact, n * in, keeps_swiglu_grad_alone(), what,
                           "a SwiGLU gradient kept in 16 bits"));
  }
  STRATA_TRY(fp32_or_key(&scratch_.dfc, n * fc_width(spec_),
                         keeps_gate_up_grad_alone() || keeps_gelu_grad_alone(), what,
                         "an MLP pre-activation's gradient kept in 16 bits"));
  STRATA_TRY(fp32_or_key(&scratch_.dqkv, n * qkv_width(spec_), keeps_qkv_grad_alone(), what,
                         "a q/k/v gradient kept in 16 bits"));
  STRATA_TRY(fp32_or_key(&scratch_.datt, n * hd, keeps_attention_grad_alone(), what,
                         "an attention gradient kept in 16 bits"));
  STRATA_TRY(fp32_or_key(&scratch_.dln, n * c, keeps_norm_grad_alone(), what,
                         "a norm gradient kept in 16 bits"));
  STRATA_ASSIGN_OR_RETURN(dres_[0], alloc(n * c, what));
  STRATA_ASSIGN_OR_RETURN(dres_[1], alloc(n * c, what));
  STRATA_ASSIGN_OR_RETURN(lnf_, alloc(n * c, "final norm"));
  STRATA_ASSIGN_OR_RETURN(meanf_, alloc(n, "final norm"));
  STRATA_ASSIGN_OR_RETURN(rstdf_, alloc(n, "final norm"));
  if (options_.narrow_logits && options_.narrow_companions &&
      (sizing_ || ops_->logits_in_narrow())) {
    logits16_ld_ = (spec_.vocab_size + 7) / 8 * 8;
    const std::int64_t bytes = chunk_rows_ * logits16_ld_ * 2;  // bf16 or fp16
    STRATA_ASSIGN_OR_RETURN(T * chunk,
                            alloc((bytes + static_cast<std::int64_t>(sizeof(T)) - 1) / sizeof(T),
                                  "logits chunk (16-bit)"));
    logits16_ = chunk;
  } else {
    STRATA_ASSIGN_OR_RETURN(logits_, alloc(chunk_rows_ * spec_.vocab_size, "logits chunk"));
  }
  STRATA_ASSIGN_OR_RETURN(losses_, alloc(n, "token losses"));
  STRATA_TRY(allocate_companions());
  if (spec_.family == Family::kLlama) {
    // LongRoPE over sequences longer than its original context keeps both tables: which one a
    // batch uses depends on its largest position (set_batch).
    STRATA_TRY(allocate_rope_tables(false, &rope_short_));
    if (rope_needs_long_tables(spec_, t)) STRATA_TRY(allocate_rope_tables(true, &rope_long_));
    ctx_.rope_cos = rope_short_.cos;
    ctx_.rope_sin = rope_short_.sin;
  }
  if (options_.activation_offload && !sizing_) {
    for (backend::Event& e : events_) {
      STRATA_ASSIGN_OR_RETURN(e, backend_->create_event());
    }
  }
  return Status::ok();
}

template <typename T>
bool ModelRunner<T>::keeps_alone() const {
  return options_.narrow_alone && options_.narrow_companions &&
         (sizing_ || ops_->keeps_narrow_alone());
}

template <typename T>
bool ModelRunner<T>::keeps_attention_alone() const {
  return options_.narrow_attention_alone && keeps_alone() &&
         (sizing_ || model::keeps_attention_alone(*ops_, spec_, options_.batch, options_.seq_len));
}

template <typename T>
bool ModelRunner<T>::keeps_attention_grad_alone() const {
  return options_.narrow_attention_grad && keeps_attention_alone() &&
         (sizing_ ||
          model::keeps_attention_alone(*ops_, spec_, options_.batch, options_.seq_len, true));
}

template <typename T>
bool ModelRunner<T>::keeps_gate_up_narrow() const {
  return options_.narrow_gate_up && options_.narrow_companions && spec_.family == Family::kLlama &&
         llama_block_slots(spec_).gate_up_b < 0 && (sizing_ || ops_->keeps_gate_up_narrow());
}

template <typename T>
bool ModelRunner<T>::keeps_gelu_narrow() const {
  return options_.narrow_gelu && options_.narrow_companions && spec_.family == Family::kGpt2 &&
         (sizing_ || ops_->keeps_gelu_narrow());
}

template <typename T>
bool ModelRunner<T>::keeps_gelu_grad_alone() const {
  return options_.narrow_gelu_grad && keeps_gelu_narrow() && keeps_alone() &&
         (sizing_ || ops_->keeps_gelu_grad_alone());
}

template <typename T>
bool ModelRunner<T>::fuses_gelu_grad() const {
  return options_.fused_gelu_grad && keeps_gelu_grad_alone() &&
         (sizing_ || ops_->fuses_gelu_grad());
}

template <typename T>
bool ModelRunner<T>::keeps_swiglu_grad_alone() const {
  return options_.narrow_swiglu_grad && keeps_gate_up_narrow() && keeps_alone() &&
         (sizing_ || ops_->keeps_swiglu_grad_alone());
}

template <typename T>
bool ModelRunner<T>::keeps_norm_grad_alone() const {
  return options_.narrow_norm_grad && keeps_alone() && (sizing_ || ops_->keeps_norm_grad_alone());
}

template <typename T>
bool ModelRunner<T>::keeps_gate_up_grad_alone() const {
  return options_.narrow_gate_up_grad && keeps_gate_up_narrow() && keeps_alone() &&
         (sizing_ || ops_->keeps_gate_up_grad_alone());
}

template <typename T>
bool ModelRunner<T>::keeps_qkv_grad_alone() const {
  return options_.narrow_qkv_grad && keeps_alone() && qkv_grad_alone_applies(spec_) &&
         (sizing_ || model::keeps_qkv_alone(*ops_, spec_, options_.batch, options_.seq_len, true));
}

template <typename T>
bool ModelRunner<T>::keeps_qkv_alone() const {
  return options_.narrow_qkv && keeps_alone() && qkv_alone_applies(spec_) &&
         (sizing_ || model::keeps_qkv_alone(*ops_, spec_, options_.batch, options_.seq_len));
}

template <typename T>
Result<T*> ModelRunner<T>::reserve(std::int64_t elements, const char* purpose) {
  // Not device memory: nothing for the arena to count.
  if (sizing_) return reinterpret_cast<T*>(alignof(T));
  STRATA_ASSIGN_OR_RETURN(
      AddressRange range,
      AddressRange::reserve(static_cast<std::uint64_t>(elements) * sizeof(T), purpose));
  T* p = static_cast<T*>(range.begin());
  reserved_.push_back(std::move(range));
  return p;
}

template <typename T>
Status ModelRunner<T>::allocate_companions() {
  if (!options_.narrow_companions) return Status::ok();
  const backend::DType type = sizing_ ? backend::DType::kBF16 : ops_->narrow_type();
  if (type == backend::DType::kF32) return Status::ok();
  const std::int64_t n = rows_, c = spec_.hidden_size, in = spec_.intermediate_size;
  const std::int64_t hd = spec_.num_heads * spec_.head_dim;
  auto pair = [&](T* wide, std::int64_t elements, bool alone = false) -> Status {
    const std::int64_t narrow_elements =
        (elements * static_cast<std::int64_t>(kernels::dtype_bytes(type)) + sizeof(T) - 1) /
        static_cast<std::int64_t>(sizeof(T));
    STRATA_ASSIGN_OR_RETURN(T * narrow, alloc(narrow_elements, "16-bit activation companions"));
    if (sizing_) return Status::ok();
    if (!alone) {
      ops_->pair_narrow(wide, narrow, elements);
    } else if (!ops_->pair_narrow_alone(wide, narrow, elements)) {
      return Status(ErrorCode::kInternal,
                    fmt::format("the {} backend promised to keep activations in 16 bits "
                                "alone but refused its {} elements",
                                backend_->name(), elements));
    }
    paired_.push_back(wide);
    return Status::ok();
  };
  // What the GEMMs read: each block's normalised inputs, attention output and MLP activation
  // (forward, and the weight gradients), the MLP's and the attention's input gradients, the
  // residual gradient, the final norm, the logits' gradient.
  const bool alone = keeps_alone();
  const bool attention_alone = keeps_attention_alone();
  for (BlockActs<T>& a : acts_) {
    STRATA_TRY(pair(a.ln1, n * c, alone));
    STRATA_TRY(pair(a.att, n * hd, attention_alone));
    STRATA_TRY(pair(a.ln2, n * c, alone));
    STRATA_TRY(pair(a.act, n * in, alone));
    if (keeps_qkv_alone()) STRATA_TRY(pair(a.qkv, n * qkv_width(spec_), true));
  }
  if (keeps_attention_grad_alone()) STRATA_TRY(pair(scratch_.datt, n * hd, true));
  if (keeps_swiglu_grad_alone()) STRATA_TRY(pair(scratch_.dact, n * in, true));
  if (keeps_norm_grad_alone()) STRATA_TRY(pair(scratch_.dln, n * c, true));
  STRATA_TRY(pair(scratch_.dfc, n * fc_width(spec_),
                  keeps_gate_up_grad_alone() || keeps_gelu_grad_alone()));
  STRATA_TRY(pair(scratch_.dqkv, n * qkv_width(spec_), keeps_qkv_grad_alone()));
  STRATA_TRY(pair(dres_[0], n * c));
  STRATA_TRY(pair(dres_[1], n * c));
  if (logits16_ == nullptr) STRATA_TRY(pair(logits_, chunk_rows_ * spec_.vocab_size));
  return pair(lnf_, n * c);
}

template <typename T>
Status ModelRunner<T>::allocate_rope_tables(bool long_factors, RopeTables* tables) {
  const std::int64_t t = options_.seq_len, half = rotary_dim(spec_) / 2;
  STRATA_ASSIGN_OR_RETURN(tables->cos, alloc(t * half, "rotary tables"));
  STRATA_ASSIGN_OR_RETURN(tables->sin, alloc(t * half, "rotary tables"));
  if (sizing_) return Status::ok();
  const std::vector<T> inv_freq = rope_inv_freq<T>(spec_, long_factors);
  std::vector<T> cos(static_cast<std::size_t>(t * half)), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), t, half, inv_freq.data(),
                       rope_attention_scaling(spec_));
  // From pageable memory on the compute stream: complete when copy_async returns.
  STRATA_TRY(backend_->copy_async(backend::StreamKind::kCompute, tables->cos, cos.data(),
                                  cos.size() * sizeof(T)));
  return backend_->copy_async(backend::StreamKind::kCompute, tables->sin, sin.data(),
                              sin.size() * sizeof(T));
}

template <typename T>
BlockActs<T>& ModelRunner<T>::acts_for(int layer) {
  return options_.activation_checkpointing ? acts_[0] : acts_[static_cast<std::size_t>(layer)];
}

template <typename T>
Status ModelRunner<T>::check_positions(const std::int32_t* positions) const {
  const std::int64_t t_len = options_.seq_len;
  for (std::int64_t b = 0; b < options_.batch; ++b) {
    const std::int32_t* row = positions + b * t_len;
    for (std::int64_t t = 0; t < t_len; ++t) {
      const std::int32_t p = row[t];
      if (p < 0 || p >= t_len) {
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("position {} at row {} column {} is outside [0, seq_len {})", p,
                                  b, t, t_len),
                      "positions");
      }
      if (t >= 1 && p != 0 && p != row[t - 1] + 1) {
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("position {} at row {} column {} follows {}; a position either "
                                  "starts a document (0) or continues one (previous + 1)",
                                  p, b, t, row[t - 1]),
                      "positions");
      }
    }
  }
  return Status::ok();
}

template <typename T>
Status ModelRunner<T>::set_batch(const std::int32_t* inputs, const std::int32_t* targets,
                                 const std::int32_t* positions) {
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < rows_; ++i) {
    if (inputs[i] < 0 || inputs[i] >= spec_.vocab_size) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("token id {} at batch position {} is outside the model's "
                                "vocabulary [0, {})",
                                inputs[i], i, spec_.vocab_size),
                    "inputs");
    }
    if (targets[i] == kIgnoredTarget) continue;
    if (targets[i] < 0 || targets[i] >= spec_.vocab_size) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("token id {} at batch position {} is outside the model's "
                                "vocabulary [0, {}) (and is not -1, which counts for nothing)",
                                targets[i], i, spec_.vocab_size),
                    "targets");
    }
    ++counted;
  }
  std::int32_t max_position = static_cast<std::int32_t>(options_.seq_len - 1);
  if (positions != nullptr) {
    STRATA_TRY(check_positions(positions));
    max_position = *std::max_element(positions, positions + rows_);
  }
  counted_targets_ = counted;
  STRATA_TRY(backend_->copy_async(backend::StreamKind::kCompute, inputs_, inputs,
                                  static_cast<std::uint64_t>(rows_) * 4));
  STRATA_TRY(backend_->copy_async(backend::StreamKind::kCompute, targets_, targets,
                                  static_cast<std::uint64_t>(rows_) * 4));
  ctx_.positions = nullptr;
  if (positions != nullptr) {
    STRATA_TRY(backend_->copy_async(backend::StreamKind::kCompute, positions_, positions,
                                    static_cast<std::uint64_t>(rows_) * 4));
    ctx_.positions = positions_;
  }
  if (rope_long_.cos != nullptr) {
    const bool long_factors = rope_uses_long_factors(spec_, max_position);
    ctx_.rope_cos = long_factors ? rope_long_.cos : rope_short_.cos;
    ctx_.rope_sin = long_factors ? rope_long_.sin : rope_short_.sin;
  }
  return Status::ok();
}

template <typename T>
double ModelRunner<T>::mean_loss(double loss_sum) const {
  return counted_targets_ > 0 ? loss_sum / static_cast<double>(counted_targets_) : 0.0;
}

template <typename T>
Status ModelRunner<T>::forward_blocks(UnitStore<T>& store, bool training) {
  const std::int64_t n = rows_, c = spec_.hidden_size;
  const int emb = layout_.embedding_unit();
  STRATA_ASSIGN_OR_RETURN(const T* ew, store.acquire_params(emb));
  const UnitLayout& eu = layout_.units[static_cast<std::size_t>(emb)];
  const T* wpe = spec_.family == Family::kGpt2 ? ew + eu.tensors[gpt2::kWpe].offset : nullptr;
  if (options_.activation_offload && !training) {
    // An evaluation after training: the output buffer may still be on its way to the host.
    STRATA_TRY(backend_->wait(backend::StreamKind::kCompute, saved(0)));
    STRATA_TRY(backend_->wait(backend::StreamKind::kCompute, saved(1)));
  }
  ops_->embedding_forward(block_input(0), inputs_, ctx_.positions, ew + eu.tensors[0].offset, wpe,
                          n, options_.seq_len, c);
  store.release_params(emb);
  for (int l = 0; l < spec_.num_layers; ++l) {
    const int u = layout_.block_unit(l);
    STRATA_ASSIGN_OR_RETURN(const T* w, store.acquire_params(u));
    if (options_.activation_offload && training) STRATA_TRY(save_checkpoint(l));
    block_forward(ctx_, layout_.units[static_cast<std::size_t>(u)], w, block_input(l),
                  block_input(l + 1), acts_for(l));
    store.release_params(u);
  }
  return Status::ok();
}

template <typename T>
Status ModelRunner<T>::head_norm(const T* hw) {
  const UnitLayout& hu = layout_.units[static_cast<std::size_t>(layout_.head_unit())];
  const T* x = block_input(static_cast<int>(spec_.num_layers));
  if (spec_.family == Family::kGpt2) {
    ops_->layernorm_forward(lnf_, meanf_, rstdf_, x, hw + hu.tensors[gpt2::kLnfW].offset,
                            hw + hu.tensors[gpt2::kLnfB].offset, rows_, spec_.hidden_size,
                            spec_.norm_eps);
  } else {
    ops_->rmsnorm_forward(lnf_, rstdf_, x, hw + hu.tensors[llama::kNorm].offset, rows_,
                          spec_.hidden_size, spec_.norm_eps);
  }
  return Status::ok();
}

template <typename T>
const T* ModelRunner<T>::head_weight(const T* hw, const T* ew) const {
  if (layout_.tied) return ew;  // tensor 0 of the embedding unit
  const UnitLayout& hu = layout_.units[static_cast<std::size_t>(layout_.head_unit())];
  const int index = spec_.family == Family::kGpt2 ? static_cast<int>(gpt2::kLmHead)
                                                  : static_cast<int>(llama::kLmHead);
  return hw + hu.tensors[static_cast<std::size_t>(index)].offset;
}

template <typename T>
Result<const T*> ModelRunner<T>::forward_to_head(UnitStore<T>& store) {
  STRATA_TRY(forward_blocks(store, false));
  STRATA_ASSIGN_OR_RETURN(const T* hw, store.acquire_params(layout_.head_unit()));
  const T* ew = nullptr;
  if (layout_.tied) {
    STRATA_ASSIGN_OR_RETURN(ew, store.acquire_params(layout_.embedding_unit()));
  }
  STRATA_TRY(head_norm(hw));
  return head_weight(hw, ew);
}

template <typename T>
void ModelRunner<T>::release_head(UnitStore<T>& store) {
  store.release_params(layout_.head_unit());
  if (layout_.tied) store.release_params(layout_.embedding_unit());
}

template <typename T>
Result<double> ModelRunner<T>::train_step(UnitStore<T>& store, double grad_scale) {
  const std::int64_t n = rows_, c = spec_.hidden_size, v = spec_.vocab_size;
  const int head = layout_.head_unit(), emb = layout_.embedding_unit();
  STRATA_TRY(forward_blocks(store, true));

  // Head: final norm, then logits chunk by chunk with the loss and its gradient fused.
  STRATA_ASSIGN_OR_RETURN(const T* hw, store.acquire_params(head));
  const T* ew = nullptr;
  if (layout_.tied) {
    STRATA_ASSIGN_OR_RETURN(ew, store.acquire_params(emb));
  }
  STRATA_ASSIGN_OR_RETURN(T * hg, store.acquire_grads(head));
  T* eg = nullptr;
  if (layout_.tied) {
    STRATA_ASSIGN_OR_RETURN(eg, store.acquire_grads(emb));
  }
  STRATA_TRY(head_norm(hw));
  const T* weight = head_weight(hw, ew);
  T* weight_grad = layout_.tied ? eg : hg + (weight - hw);
  // The final norm's output gradient, in the block gradient the last block's backward writes last
  // (its dx): free until then, and an fp32 array whether or not the blocks' dln is one.
  T* dlnf = dres_[1];
  for (std::int64_t r0 = 0; r0 < n; r0 += chunk_rows_) {
    const std::int64_t rows = std::min(chunk_rows_, n - r0);
    head_logits(r0, rows, weight);
    if (logits16_ != nullptr) {
      // The logits and their gradient in 16 bits alone, in place.
      ops_->cross_entropy_narrow(true, logits16_, logits16_ld_, losses_ + r0, targets_ + r0, rows,
                                 v, grad_scale);
      ops_->gemm_from_narrow(false, false, rows, c, v, T(1), logits16_, logits16_ld_, weight, c,
                             T(0), dlnf + r0 * c, c);
      ops_->gemm_from_narrow(true, false, v, c, rows, T(1), logits16_, logits16_ld_, lnf_ + r0 * c,
                             c, T(1), weight_grad, c);
      continue;
    }
    ops_->cross_entropy_fused(logits_, losses_ + r0, targets_ + r0, rows, v, grad_scale);
    ops_->gemm(false, false, rows, c, v, T(1), logits_, v, weight, c, T(0), dlnf + r0 * c, c);
    ops_->gemm(true, false, v, c, rows, T(1), logits_, v, lnf_ + r0 * c, c, T(1), weight_grad, c);
  }
  T* dres = dres_[0];
  ops_->zero(dres, n * c);
  const UnitLayout& hu = layout_.units[static_cast<std::size_t>(head)];
  const T* x = block_input(static_cast<int>(spec_.num_layers));
  if (spec_.family == Family::kGpt2) {
    ops_->layernorm_backward(dres, hg + hu.tensors[gpt2::kLnfW].offset,
                             hg + hu.tensors[gpt2::kLnfB].offset, dlnf, x,
                             hw + hu.tensors[gpt2::kLnfW].offset, meanf_, rstdf_, n, c);
  } else {
    ops_->rmsnorm_backward(dres, hg + hu.tensors[llama::kNorm].offset, dlnf, x,
                           hw + hu.tensors[llama::kNorm].offset, rstdf_, n, c);
  }
  const double loss_sum = ops_->sum(losses_, n);
  STRATA_TRY(store.grads_ready(head));
  store.release_params(head);
  if (layout_.tied) store.release_params(emb);

  // Blocks, last to first.
  int current = 0;
  for (int l = static_cast<int>(spec_.num_layers) - 1; l >= 0; --l) {
    const int u = layout_.block_unit(l);
    const UnitLayout& unit = layout_.units[static_cast<std::size_t>(u)];
    STRATA_ASSIGN_OR_RETURN(const T* w, store.acquire_params(u));
    STRATA_ASSIGN_OR_RETURN(T * g, store.acquire_grads(u));
    if (options_.activation_offload) {
      // This block's input is on the device (the last block's never left; the others were
      // loaded one block ahead); start loading the next one's.
      if (l < spec_.num_layers - 1)
        STRATA_TRY(backend_->wait(backend::StreamKind::kCompute, loaded(l % 2)));
      if (l >= 1) STRATA_TRY(load_checkpoint(l - 1));
    }
    if (options_.activation_checkpointing) {
      // Recompute this block's activations from its saved input; its output is not needed: it
      // goes where this block's backward writes its dx last.
      block_forward(ctx_, unit, w, block_input(l), dres_[1 - current], acts_for(l));
    }
    block_backward(ctx_, unit, w, g, block_input(l), acts_for(l), scratch_, dres_[current],
                   dres_[1 - current]);
    current = 1 - current;
    STRATA_TRY(store.grads_ready(u));
    store.release_params(u);
  }

  // Embedding: its backward needs only the token ids, not the parameters.
  STRATA_ASSIGN_OR_RETURN(T * g0, store.acquire_grads(emb));
  const UnitLayout& eu = layout_.units[static_cast<std::size_t>(emb)];
  T* dwpe = spec_.family == Family::kGpt2 ? g0 + eu.tensors[gpt2::kWpe].offset : nullptr;
  ops_->embedding_backward(g0 + eu.tensors[0].offset, dwpe, dres_[current], inputs_, ctx_.positions,
                           n, options_.seq_len, c,
                           static_cast<std::int32_t>(spec_.arch.padding_idx));
  STRATA_TRY(store.grads_ready(emb));
  return mean_loss(loss_sum);
}

template <typename T>
Result<double> ModelRunner<T>::evaluate(UnitStore<T>& store) {
  const std::int64_t n = rows_, v = spec_.vocab_size;
  STRATA_ASSIGN_OR_RETURN(const T* weight, forward_to_head(store));
  for (std::int64_t r0 = 0; r0 < n; r0 += chunk_rows_) {
    const std::int64_t rows = std::min(chunk_rows_, n - r0);
    head_logits(r0, rows, weight);
    if (logits16_ != nullptr) {
      ops_->cross_entropy_narrow(false, logits16_, logits16_ld_, losses_ + r0, targets_ + r0, rows,
                                 v, 0.0);
      continue;
    }
    ops_->cross_entropy_forward(losses_ + r0, logits_, targets_ + r0, rows, v);
  }
  const double loss_sum = ops_->sum(losses_, n);
  release_head(store);
  return mean_loss(loss_sum);
}

template <typename T>
void ModelRunner<T>::head_logits(std::int64_t r0, std::int64_t rows, const T* weight) {
  const std::int64_t c = spec_.hidden_size, v = spec_.vocab_size;
  if (logits16_ != nullptr) {
    ops_->gemm_to_narrow(false, true, rows, v, c, lnf_ + r0 * c, c, weight, c, logits16_,
                         logits16_ld_);
  } else {
    ops_->gemm(false, true, rows, v, c, T(1), lnf_ + r0 * c, c, weight, c, T(0), logits_, v);
  }
}

template <typename T>
Status ModelRunner<T>::logits(UnitStore<T>& store, T* out) {
  const std::int64_t n = rows_, v = spec_.vocab_size;
  STRATA_ASSIGN_OR_RETURN(const T* weight, forward_to_head(store));
  for (std::int64_t r0 = 0; r0 < n; r0 += chunk_rows_) {
    const std::int64_t rows = std::min(chunk_rows_, n - r0);
    head_logits(r0, rows, weight);
    if (logits16_ != nullptr) {
      // The logits as the head computes them (rounded to 16 bits), widened here.
      std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows * logits16_ld_));
      STRATA_TRY(backend_->copy_async(backend::StreamKind::kCompute, bits.data(), logits16_,
                                      bits.size() * sizeof(std::uint16_t)));
      STRATA_TRY(backend_->synchronize(backend::StreamKind::kCompute));
      std::vector<float> row(static_cast<std::size_t>(v));
      for (std::int64_t r = 0; r < rows; ++r) {
        kernels::cast_array(row.data(), backend::DType::kF32, bits.data() + r * logits16_ld_,
                            ops_->narrow_type(), v);
        std::copy(row.begin(), row.end(), out + (r0 + r) * v);
      }
      continue;
    }
    STRATA_TRY(backend_->copy_async(backend::StreamKind::kCompute, out + r0 * v, logits_,
                                    static_cast<std::uint64_t>(rows * v) * sizeof(T)));
  }
  release_head(store);
  return Status::ok();
}

WithoutCompanions without_companions(const ModelShape& spec, const RunnerOptions& options) {
  WithoutCompanions w;
  w.options = options;
  w.options.narrow_companions = false;
  w.options.narrow_logits = false;  // they need the companions' 16-bit operands
  w.options.narrow_alone = false;   // its companion is all it has
  w.options.narrow_attention_alone = false;
  w.options.narrow_attention_grad = false;
  w.options.narrow_swiglu_grad = false;
  w.options.narrow_norm_grad = false;
  w.options.narrow_gate_up_grad = false;
  w.options.narrow_qkv_grad = false;
  w.options.narrow_qkv = false;
  w.options.narrow_gate_up = false;  // its product reads the companions
  w.options.narrow_gelu = false;     // likewise
  w.options.narrow_gelu_grad = false;
  w.options.fused_gelu_grad = false;
  w.memory = ModelRunner<float>::memory_needed(spec, w.options);
  const RunnerMemory with = ModelRunner<float>::memory_needed(spec, options);
  w.note = fmt::format(
      "no 16-bit activation companions: their {} do not fit the device budget beside the "
      "working set, so the GEMMs convert their activations",
      format_bytes(with.device_bytes - w.memory.device_bytes));
  return w;
}

template class ModelRunner<float>;
template class ModelRunner<double>;

}  // namespace strata::model

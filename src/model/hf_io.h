// Hugging Face model directories: config.json plus model.safetensors, or a sharded
// model.safetensors.index.json with its shards. Loading fills one fp32 flat buffer per unit
// (model/layout.h); saving writes a directory that `transformers` loads unchanged.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cast.h"
#include "model/layout.h"
#include "model/model_spec.h"

namespace strata::model {

// True when `dir` holds weights: model.safetensors, model.safetensors.index.json, or PyTorch's
// pytorch_model.bin(.index.json), which load_hf_weights refuses with a message that says how to
// convert them (tools/convert_pytorch_bin.sh).
bool has_hf_weights(const std::string& dir);

// Reads `dir`/config.json (or `path` itself when it is a .json file).
Result<ModelShape> read_hf_spec(const std::string& path);

// Reads every tensor of `layout` from the safetensors in `dir` into units[u] (padded_numel
// floats each; padding zeroed). Checks names, shapes and dtypes; ignores GPT-2's attention-mask
// buffers (attn.bias, attn.masked_bias), Llama's rotary_emb.inv_freq, and lm_head.weight when the
// embeddings are tied; any other unexpected tensor is an error. GPT-2 files saved from
// GPT2Model (names without the "transformer." prefix) are accepted.
Status load_hf_weights(const std::string& dir, const ModelLayout& layout,
                       const std::vector<float*>& units);

// The same, one unit at a time (for state that is not all in memory): `target(u)` gives where
// unit u's padded_numel floats go, `done(u)` is called once they are there.
Status load_hf_weights(const std::string& dir, const ModelLayout& layout,
                       const std::function<float*(int unit)>& target,
                       const std::function<Status(int unit)>& done);

// Copies the tokenizer files and generation_config.json that `source_dir` holds into `out_dir`
// (nothing when source_dir is empty, missing, or out_dir itself); returns the names copied.
Result<std::vector<std::string>> copy_hf_side_files(const std::string& source_dir,
                                                    const std::string& out_dir);

// Writes `dir`/config.json and `dir`/model.safetensors (tensors in `dtype`: f32, bf16 or f16),
// creating `dir` if needed, then copies spec.arch.source_dir's side files (copy_hf_side_files) so
// AutoTokenizer and generate() find what the source model had.
Status save_hf_model(const std::string& dir, const ModelShape& spec, const ModelLayout& layout,
                     const std::vector<const float*>& units, kernels::DType dtype);

// The same, reading each unit's fp32 parameters through `unit_data(u)` when its tensors are
// written (units in order; the pointer is used before the next call).
Status save_hf_model(const std::string& dir, const ModelShape& spec, const ModelLayout& layout,
                     const std::function<Result<const float*>(int unit)>& unit_data,
                     kernels::DType dtype);

}  // namespace strata::model

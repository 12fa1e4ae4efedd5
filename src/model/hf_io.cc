// Hugging Face directory load and save (see hf_io.h).
#include "model/hf_io.h"

#include <fmt/format.h>
#include <json/json.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "model/safetensors.h"

namespace strata::model {
namespace fs = std::filesystem;
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool ignorable(const std::string& name, const ModelLayout& layout) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
         ends_with(name, "rotary_emb.inv_freq") || (layout.tied && name == "lm_head.weight");
}

// Hugging Face name -> the name found in the file (GPT2Model files lack "transformer.").
std::string alias_in(const std::map<std::string, int>& names, const std::string& name) {
  if (names.count(name)) return name;
  const std::string prefix = "transformer.";
  if (name.rfind(prefix, 0) == 0) {
    std::string bare = name.substr(prefix.size());
    if (names.count(bare)) return bare;
  }
  return name;
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorCode::kNotFound, "cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Weights in PyTorch's pickle format, which Strata does not read (unpickling can run code).
bool has_pytorch_bin(const std::string& dir) {
  return fs::exists(dir + "/pytorch_model.bin") ||
         fs::exists(dir + "/pytorch_model.bin.index.json");
}

// The shard files of `dir` and which file holds each tensor name.
Result<std::vector<std::string>> shard_files(const std::string& dir,
                                             std::map<std::string, int>* owner) {
  const std::string single = dir + "/model.safetensors";
  if (fs::exists(single)) return std::vector<std::string>{single};
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (!fs::exists(index_path) && has_pytorch_bin(dir)) {
    return Status(ErrorCode::kInvalidArgument,
                  "the weights are PyTorch pickle files (pytorch_model.bin), which Strata does not "
                  "read; convert them to safetensors first: tools/convert_pytorch_bin.sh " +
                      dir + " (or save_pretrained(..., safe_serialization=True))",
                  dir);
  }
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text(index_path));
  Json::CharReaderBuilder builder;
  builder["rejectDupKeys"] = true;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  Json::Value root;
  std::string errors;
  if (!reader->parse(text.data(), text.data() + text.size(), &root, &errors) || !root.isObject() ||
      !root["weight_map"].isObject()) {
    return Status(ErrorCode::kCorrupt, "not a safetensors index (no weight_map object): " + errors,
                  index_path);
  }
  std::vector<std::string> files;
  std::map<std::string, int> file_index;
  const Json::Value& map = root["weight_map"];
  for (const std::string& name : map.getMemberNames()) {
    if (!map[name].isString()) {
      return Status(ErrorCode::kCorrupt, "weight_map." + name + " is not a file name", index_path);
    }
    const std::string file = map[name].asString();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == ".." ||
        !ends_with(file, ".safetensors")) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("weight_map.{} names '{}'; valid: a .safetensors file name in the "
                                "same directory",
                                name, file),
                    index_path);
    }
    auto [it, added] = file_index.emplace(file, static_cast<int>(files.size()));
    if (added) files.push_back(dir + "/" + file);
    (*owner)[name] = it->second;
  }
  return files;
}

}  // namespace

bool has_hf_weights(const std::string& dir) {
  return fs::exists(dir + "/model.safetensors") ||
         fs::exists(dir + "/model.safetensors.index.json") || has_pytorch_bin(dir);
}

Result<std::vector<std::string>> copy_hf_side_files(const std::string& source_dir,
                                                    const std::string& out_dir) {
  static const char* const kFiles[] = {"generation_config.json",
                                       "tokenizer.json",
                                       "tokenizer_config.json",
                                       "special_tokens_map.json",
                                       "added_tokens.json",
                                       "tokenizer.model",
                                       "vocab.json",
                                       "merges.txt",
                                       "vocab.txt",
                                       "chat_template.jinja",
                                       "chat_template.json"};
  std::vector<std::string> copied;
  std::error_code ec;
  if (source_dir.empty() || !fs::is_directory(source_dir, ec)) return copied;
  if (fs::exists(out_dir, ec) && fs::equivalent(source_dir, out_dir, ec)) return copied;
  for (const char* name : kFiles) {
    const fs::path from = fs::path(source_dir) / name;
    if (!fs::is_regular_file(from, ec)) continue;
    const fs::path to = fs::path(out_dir) / name;
    const fs::path tmp = fs::path(out_dir) / (std::string(name) + ".tmp");
    fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(tmp, to, ec);
    if (ec) {
      return Status(ErrorCode::kIo,
                    fmt::format("cannot copy {} from {}: {}", name, source_dir, ec.message()),
                    out_dir);
    }
    copied.push_back(name);
  }
  return copied;
}

Result<ModelShape> read_hf_spec(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(config::ModelConfig model, read_hf_config(path));
  return resolve_shape(model);
}

Status load_hf_weights(const std::string& dir, const ModelLayout& layout,
                       const std::vector<float*>& units) {
  STRATA_ASSERT(units.size() == layout.units.size());
  return load_hf_weights(
      dir, layout, [&units](int u) { return units[static_cast<std::size_t>(u)]; },
      [](int) { return Status::ok(); });
}

Status load_hf_weights(const std::string& dir, const ModelLayout& layout,
                       const std::function<float*(int unit)>& target,
                       const std::function<Status(int unit)>& done) {
  std::map<std::string, int> owner;
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> paths, shard_files(dir, &owner));
  std::vector<SafetensorsFile> files;
  std::map<std::string, int> where;  // tensor name -> file
  for (std::size_t f = 0; f < paths.size(); ++f) {
    STRATA_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(paths[f]));
    for (const StTensor& t : file.tensors()) {
      if (!where.emplace(t.name, static_cast<int>(f)).second) {
        return Status(ErrorCode::kCorrupt,
                      fmt::format("tensor '{}' appears in more than one shard", t.name), paths[f]);
      }
      if (!owner.empty() && (!owner.count(t.name) || owner[t.name] != static_cast<int>(f))) {
        return Status(ErrorCode::kCorrupt,
                      fmt::format("tensor '{}' is not mapped to this shard by the index", t.name),
                      paths[f]);
      }
    }
    files.push_back(std::move(file));
  }
  std::set<std::string> used;
  for (std::size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    float* dst = target(static_cast<int>(u));
    std::fill(dst, dst + unit.padded_numel, 0.0f);
    for (const TensorSlot& slot : unit.tensors) {
      const std::string name = alias_in(where, slot.name);
      auto it = where.find(name);
      if (it == where.end()) {
        return Status(
            ErrorCode::kNotFound,
            fmt::format("the model has no tensor '{}' (needed by unit {})", slot.name, unit.name),
            dir);
      }
      STRATA_TRY(files[it->second].read_f32(name, slot.shape, dst + slot.offset));
      used.insert(name);
    }
    STRATA_TRY(done(static_cast<int>(u)));
  }
  for (const auto& [name, file] : where) {
    if (!used.count(name) && !ignorable(name, layout)) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("unexpected tensor '{}': not part of this model (check that "
                                "config.json matches the weights)",
                                name),
                    paths[file]);
    }
  }
  return Status::ok();
}

Status save_hf_model(const std::string& dir, const ModelShape& spec, const ModelLayout& layout,
                     const std::vector<const float*>& units, kernels::DType dtype) {
  STRATA_ASSERT(units.size() == layout.units.size());
  return save_hf_model(
      dir, spec, layout,
      [&units](int u) -> Result<const float*> { return units[static_cast<std::size_t>(u)]; },
      dtype);
}

Status save_hf_model(const std::string& dir, const ModelShape& spec, const ModelLayout& layout,
                     const std::function<Result<const float*>(int unit)>& unit_data,
                     kernels::DType dtype) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status(ErrorCode::kIo, "cannot create the directory: " + ec.message(), dir);
  StDType st = StDType::kF32;
  std::string torch_dtype = "float32";
  if (dtype == kernels::DType::kBF16) {
    st = StDType::kBF16;
    torch_dtype = "bfloat16";
  } else if (dtype == kernels::DType::kF16) {
    st = StDType::kF16;
    torch_dtype = "float16";
  } else {
    STRATA_ASSERT(dtype == kernels::DType::kF32);
  }
  // Each tensor is streamed from its unit (converted in chunks for 16-bit files), so the model
  // never has to be in memory all at once.
  constexpr std::int64_t kChunk = 1 << 20;
  std::vector<std::uint16_t> chunk(st == StDType::kF32 ? 0 : static_cast<std::size_t>(kChunk));
  std::vector<StTensorToWrite> tensors;
  std::vector<StProduceFn> producers;
  for (std::size_t u = 0; u < layout.units.size(); ++u) {
    for (const TensorSlot& slot : layout.units[u].tensors) {
      tensors.push_back(StTensorToWrite{slot.name, st, slot.shape, nullptr});
      producers.push_back([&, u, slot](const StWriteFn& write) -> Status {
        STRATA_ASSIGN_OR_RETURN(const float* data, unit_data(static_cast<int>(u)));
        const float* src = data + slot.offset;
        if (st == StDType::kF32) return write(src, static_cast<std::uint64_t>(slot.numel) * 4);
        for (std::int64_t at = 0; at < slot.numel; at += kChunk) {
          const std::int64_t n = std::min(kChunk, slot.numel - at);
          kernels::cast_array(chunk.data(), dtype, src + at, kernels::DType::kF32, n);
          STRATA_TRY(write(chunk.data(), static_cast<std::uint64_t>(n) * 2));
        }
        return Status::ok();
      });
    }
  }
  STRATA_TRY(write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}, producers));
  const std::string config = hf_config_json(spec, torch_dtype);
  const std::string tmp = dir + "/config.json.tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << config;
    if (!out) return Status(ErrorCode::kIo, "cannot write", tmp);
  }
  fs::rename(tmp, dir + "/config.json", ec);
  if (ec) return Status(ErrorCode::kIo, "cannot rename into place: " + ec.message(), dir);
  return copy_hf_side_files(spec.arch.source_dir, dir).status();
}

}  // namespace strata::model

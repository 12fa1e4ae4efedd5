// Checkpoint reading at any world size (see reader.h), and read_checkpoint of
// checkpoint.h.
#include "checkpoint/reader.h"

#include <fmt/format.h>
#include <json/json.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/bounded_read.h"
#include "common/log.h"
#include "model/hf_io.h"
#include "model/safetensors.h"

namespace strata::checkpoint {
namespace {

struct StateFile {
  model::SafetensorsFile file;
  bool whole_units = false;                 // format 1: every tensor is a whole unit from element 0
  const StateFileDigest* digest = nullptr;  // format 3: what the manifest says of it
  // Tensors whose digest was checked (by index in file.tensors()); reads are single-threaded.
  mutable std::vector<bool> checked;
};

// Checks, once, that `t`'s bytes are the ones the manifest recorded.
Status check_tensor(const StateFile& f, const model::StTensor& t) {
  if (f.digest == nullptr) return Status::ok();
  const auto index = static_cast<std::size_t>(&t - f.file.tensors().data());
  if (f.checked.empty()) f.checked.assign(f.file.tensors().size(), false);
  if (f.checked[index]) return Status::ok();
  auto it = f.digest->tensor_xxh3.find(t.name);
  if (it == f.digest->tensor_xxh3.end()) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("tensor '{}' has no digest in the manifest", t.name), f.file.path());
  }
  const std::uint64_t computed = f.file.tensor_xxh3(t);
  if (computed != it->second) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("tensor '{}' fails its checksum (recorded xxh3 {:016x}, computed "
                              "{:016x}): the file was damaged after it was written",
                              t.name, it->second, computed),
                  f.file.path());
  }
  f.checked[index] = true;
  return Status::ok();
}

// Metadata key `key` of `f` as a non-negative integer.
Result<std::int64_t> meta_int(const StateFile& f, const std::string& key) {
  const auto& meta = f.file.metadata();
  auto it = meta.find(key);
  std::int64_t value = -1;
  if (it != meta.end()) {
    const std::string& s = it->second;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) value = -1;
  }
  if (value < 0) {
    return Status(ErrorCode::kCorrupt,
                  fmt::format("metadata '{}' is {}; expected a non-negative integer", key,
                              it == meta.end() ? "missing" : "'" + it->second + "'"),
                  f.file.path());
  }
  return value;
}

}  // namespace

struct CheckpointReader::Impl {
  std::string dir;
  std::string meta_path;
  CheckpointManifest manifest;
  std::vector<StateFile> files;
};

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&& other) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&& other) noexcept = default;

const std::string& CheckpointReader::dir() const {
  return impl_->dir;
}
const std::string& CheckpointReader::model_json() const {
  return impl_->manifest.model_json;
}
const std::string& CheckpointReader::precision() const {
  return impl_->manifest.precision;
}
std::uint64_t CheckpointReader::seed() const {
  return impl_->manifest.seed;
}
int CheckpointReader::world_size() const {
  return impl_->manifest.world_size;
}
int CheckpointReader::zero_stage() const {
  return impl_->manifest.zero_stage;
}
int CheckpointReader::format_version() const {
  return impl_->manifest.version;
}
bool CheckpointReader::verified() const {
  return impl_->manifest.version >= 3;
}
int CheckpointReader::state_files() const {
  return static_cast<int>(impl_->files.size());
}

Result<CheckpointReader> CheckpointReader::open(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->meta_path = dir + "/trainer_state.json";
  STRATA_ASSIGN_OR_RETURN(
      const std::string text,
      read_regular_file(impl->meta_path, kManifestBytesMax, "the checkpoint's trainer_state.json"));
  STRATA_ASSIGN_OR_RETURN(impl->manifest, parse_checkpoint_manifest(text, impl->meta_path));
  const CheckpointManifest& m = impl->manifest;
  if (m.version == 1) {
    const std::string path = dir + "/state.safetensors";
    STRATA_ASSIGN_OR_RETURN(model::SafetensorsFile file, model::SafetensorsFile::open(path));
    impl->files.push_back(StateFile{std::move(file), true, nullptr, {}});
    return CheckpointReader(std::move(impl));
  }
  const int files = m.state_files;
  for (int r = 0; r < files; ++r) {
    const std::string path = dir + "/" + state_file_name(r, files);
    Result<model::SafetensorsFile> file = model::SafetensorsFile::open(path);
    if (!file.is_ok()) {
      return Status(file.status().code(),
                    fmt::format("the state file of rank {} of {} cannot be read: {}", r, files,
                                file.status().message()),
                    path);
    }
    StateFile f{std::move(*file), false, nullptr, {}};
    STRATA_ASSIGN_OR_RETURN(const std::int64_t rank, meta_int(f, "rank"));
    STRATA_ASSIGN_OR_RETURN(const std::int64_t count, meta_int(f, "state_files"));
    if (rank != r || count != files) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("metadata says rank {} of {}; the file name says rank {} of {}",
                                rank, count, r, files),
                    path);
    }
    if (m.version >= 3) {
      const StateFileDigest& d = m.files[static_cast<std::size_t>(r)];
      STRATA_ASSIGN_OR_RETURN(const std::int64_t step, meta_int(f, "step"));
      STRATA_ASSIGN_OR_RETURN(const std::int64_t world, meta_int(f, "world_size"));
      if (step != m.counters.step || world != m.world_size) {
        return Status(ErrorCode::kCorrupt,
                      fmt::format("the file is of step {} at world size {}, the checkpoint of "
                                  "step {} at world size {}: a file of another checkpoint",
                                  step, world, m.counters.step, m.world_size),
                      path);
      }
      if (f.file.file_bytes() != d.bytes || f.file.header_xxh3() != d.header_xxh3) {
        return Status(
            ErrorCode::kCorrupt,
            fmt::format("the file ({} bytes, header xxh3 {:016x}) is not the one the "
                        "manifest lists ({} bytes, header xxh3 {:016x}): damaged, "
                        "truncated or replaced",
                        f.file.file_bytes(), f.file.header_xxh3(), d.bytes, d.header_xxh3),
            path);
      }
      f.digest = &d;
    }
    impl->files.push_back(std::move(f));
  }
  return CheckpointReader(std::move(impl));
}

Result<model::ModelShape> CheckpointReader::shape() const {
  const std::string source = impl_->meta_path + ": model";
  STRATA_ASSIGN_OR_RETURN(config::ModelConfig m,
                          model::parse_hf_config(impl_->manifest.model_json, source));
  STRATA_ASSIGN_OR_RETURN(model::ModelShape s, model::resolve_shape(m));
  if (model::hf_config_json(s, "") != impl_->manifest.model_json) {
    return Status(ErrorCode::kCorrupt, "the model config does not describe a shape Strata wrote",
                  source);
  }
  s.arch.source_dir = impl_->manifest.source_model;
  return s;
}

Result<TrainerCounters> CheckpointReader::counters() const {
  return impl_->manifest.counters;
}

Status CheckpointReader::read(const model::UnitLayout& unit, offload::SlotKind kind,
                              std::int64_t begin, std::int64_t numel, float* dst) const {
  STRATA_ASSERT(begin >= 0 && numel >= 0 && (dst != nullptr || numel == 0));
  STRATA_ASSERT(kind == offload::SlotKind::kMaster || kind == offload::SlotKind::kExpAvg ||
                kind == offload::SlotKind::kExpAvgSq);
  const std::string name = unit.name + "." + offload::to_string(kind);
  const std::int64_t end = begin + numel;
  if (numel > 0) std::memset(dst, 0, static_cast<std::size_t>(numel) * sizeof(float));
  std::vector<std::pair<std::int64_t, std::int64_t>> covered;  // [lo, hi) copied
  for (const StateFile& f : impl_->files) {
    const model::StTensor* t = f.file.find(name);
    if (t == nullptr) {
      return Status(ErrorCode::kCorrupt, fmt::format("tensor '{}' is missing", name),
                    f.file.path());
    }
    if (t->dtype != model::StDType::kF32 || t->shape.size() != 1) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("tensor '{}' is {} of {} dimensions; expected F32 of 1", name,
                                model::st_dtype_name(t->dtype), t->shape.size()),
                    f.file.path());
    }
    const std::int64_t file_numel = t->shape[0];
    std::int64_t file_begin = 0, file_padded = file_numel;
    if (!f.whole_units) {
      STRATA_ASSIGN_OR_RETURN(file_begin, meta_int(f, unit.name + ".shard_begin"));
      STRATA_ASSIGN_OR_RETURN(file_padded, meta_int(f, unit.name + ".padded_numel"));
    }
    if (file_padded < unit.numel || file_begin > file_padded ||
        file_numel > file_padded - file_begin) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("tensor '{}' holds elements [{}, {}) of a unit of {} padded "
                                "elements; the unit has {} elements",
                                name, file_begin, file_begin + file_numel, file_padded, unit.numel),
                    f.file.path());
    }
    const std::int64_t lo = std::max(begin, file_begin);
    const std::int64_t hi = std::min(end, file_begin + file_numel);
    if (lo >= hi) continue;
    STRATA_TRY(check_tensor(f, *t));
    float* out = dst + (lo - begin);
    std::memcpy(out, f.file.data(*t) + (lo - file_begin) * 4,
                static_cast<std::size_t>(hi - lo) * 4);
    const std::int64_t bad = first_invalid_value(kind, out, hi - lo);
    if (bad >= 0) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("tensor '{}' holds {} at element {}, which training cannot "
                                "continue from (the run had diverged, or the file was damaged)",
                                name, out[bad], lo + bad),
                    f.file.path());
    }
    covered.emplace_back(lo, hi);
  }
  // Every real element must have come from some file; the rest is padding and stays zero.
  std::sort(covered.begin(), covered.end());
  const std::int64_t real_end = std::min(end, unit.numel);
  std::int64_t next = begin;
  for (const auto& [lo, hi] : covered) {
    if (next >= real_end || lo > next) break;
    next = std::max(next, hi);
  }
  if (next < real_end) {
    std::int64_t gap_end = real_end;
    for (const auto& [lo, hi] : covered) {
      if (lo > next) {
        gap_end = std::min(gap_end, lo);
        break;
      }
    }
    return Status(ErrorCode::kCorrupt,
                  fmt::format("elements [{}, {}) of '{}' (a unit of {} elements) are in none of "
                              "the checkpoint's {} state file(s)",
                              next, gap_end, name, unit.numel, impl_->files.size()),
                  impl_->dir);
  }
  return Status::ok();
}

Status consolidate_checkpoint(const CheckpointReader& reader, const std::string& out_dir,
                              kernels::DType dtype) {
  STRATA_ASSIGN_OR_RETURN(const model::ModelShape shape, reader.shape());
  const model::ModelLayout layout = model::build_layout(shape);
  std::int64_t largest = 0;
  for (const model::UnitLayout& unit : layout.units)
    largest = std::max(largest, unit.padded_numel);
  std::vector<float> buffer(static_cast<std::size_t>(largest));
  return model::save_hf_model(
      out_dir, shape, layout,
      [&](int u) -> Result<const float*> {
        const model::UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
        STRATA_TRY(
            reader.read(unit, offload::SlotKind::kMaster, 0, unit.padded_numel, buffer.data()));
        return static_cast<const float*>(buffer.data());
      },
      dtype);
}

Result<TrainerCounters> read_checkpoint(const std::string& dir, offload::OffloadStore& state,
                                        const model::ModelShape& shape,
                                        const std::string& precision, std::uint64_t seed) {
  STRATA_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::open(dir));
  const std::string meta_path = dir + "/trainer_state.json";
  if (!reader.verified()) {
    STRATA_LOG_WARN("{}: format {} carries no checksums; its files are loaded unverified",
                    meta_path, checkpoint_format(reader.format_version()));
  }
  STRATA_ASSIGN_OR_RETURN(const model::ModelShape saved, reader.shape());
  if (!model::same_model(saved, shape)) {
    return Status(ErrorCode::kInvalidArgument,
                  "the checkpoint is of a different model shape than strata.model describes",
                  meta_path);
  }
  if (reader.precision() != precision) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("the checkpoint was trained in {}, the config asks for {}; resume "
                              "with the same precision",
                              reader.precision(), precision),
                  meta_path);
  }
  if (reader.seed() != seed) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("the checkpoint was trained with seed {}, the config says {}; the "
                              "data order would differ",
                              reader.seed(), seed),
                  meta_path);
  }
  STRATA_ASSIGN_OR_RETURN(TrainerCounters counters, reader.counters());
  const model::ModelLayout& layout = state.layout();
  const offload::TierPlan& plan = state.tiers().plan();
  for (int u = 0; u < state.units(); ++u) {
    const model::UnitLayout& unit = layout.units[static_cast<std::size_t>(u)];
    const offload::UnitPlan& up = plan.units[static_cast<std::size_t>(u)];
    for (offload::SlotKind kind :
         {offload::SlotKind::kMaster, offload::SlotKind::kExpAvg, offload::SlotKind::kExpAvgSq}) {
      float* buffer = state.fill_buffer(kind, u);
      STRATA_TRY(reader.read(unit, kind, up.shard_begin, up.shard_numel, buffer));
      STRATA_TRY(state.store(kind, u, buffer));
    }
  }
  return counters;
}

}  // namespace strata::checkpoint

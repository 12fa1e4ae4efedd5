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
#include "common/units.h"
#include "kernels/cpu/state_codec.h"
#include "model/hf_io.h"
#include "model/safetensors.h"
#include "offload/slot_codec.h"

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

namespace {

// Part of a unit's `kind` found in one rank file: elements [lo, hi) of the unit, in tensor `t`
// (its values) that holds elements [file_begin, file_begin + t.shape[0]); 8-bit moments also
// have their absmax tensor and block size.
struct Piece {
  const StateFile* file = nullptr;
  const model::StTensor* values = nullptr;
  const model::StTensor* absmax = nullptr;
  std::int64_t lo = 0, hi = 0, file_begin = 0;
  std::int64_t block = 0;
};

bool valid_block(std::int64_t block) {
  return block >= static_cast<std::int64_t>(kernels::kQ8BlockMinElems) &&
         block <= static_cast<std::int64_t>(kernels::kQ8BlockMaxElems) &&
         (block & (block - 1)) == 0;
}

// The pieces covering elements [begin, begin + numel) of `unit`'s `kind`, each tensor's form
// and digest checked; kCorrupt when a real element (below unit.numel) is in none of them.
Result<std::vector<Piece>> find_pieces(const std::vector<StateFile>& files, const std::string& dir,
                                       const model::UnitLayout& unit, offload::SlotKind kind,
                                       std::int64_t begin, std::int64_t numel) {
  const std::string name = unit.name + "." + offload::to_string(kind);
  const std::int64_t end = begin + numel;
  const bool moment = kind != offload::SlotKind::kMaster;
  std::vector<Piece> pieces;
  for (const StateFile& f : files) {
    const model::StTensor* t = f.file.find(name);
    if (t == nullptr) {
      return Status(ErrorCode::kCorrupt, fmt::format("tensor '{}' is missing", name),
                    f.file.path());
    }
    const model::StDType code_type =
        kind == offload::SlotKind::kExpAvg ? model::StDType::kI8 : model::StDType::kU8;
    const bool coded = moment && t->dtype == code_type;
    if ((t->dtype != model::StDType::kF32 && t->dtype != model::StDType::kBF16 && !coded) ||
        t->shape.size() != 1) {
      return Status(
          ErrorCode::kCorrupt,
          fmt::format("tensor '{}' is {} of {} dimensions; expected F32 or BF16{} of 1", name,
                      model::st_dtype_name(t->dtype), t->shape.size(),
                      moment ? fmt::format(" or {} (8-bit, with '{}{}')",
                                           model::st_dtype_name(code_type), name, kAbsmaxSuffix)
                             : std::string()),
          f.file.path());
    }
    Piece piece;
    piece.file = &f;
    piece.values = t;
    const std::int64_t file_numel = t->shape[0];
    if (coded) {
      const std::string absmax_name = name + kAbsmaxSuffix;
      const model::StTensor* a = f.file.find(absmax_name);
      const std::int64_t blocks =
          a != nullptr && a->shape.size() == 1 ? a->shape[0] : std::int64_t{0};
      piece.block = blocks > 0 ? file_numel / blocks : 0;
      if (a == nullptr || a->dtype != model::StDType::kF32 || a->shape.size() != 1 || blocks <= 0 ||
          file_numel % blocks != 0 || !valid_block(piece.block)) {
        return Status(ErrorCode::kCorrupt,
                      fmt::format("tensor '{}' holds 8-bit codes, so '{}' must be F32 of one "
                                  "value per block of 64 to 2048 (a power of two) elements",
                                  name, absmax_name),
                      f.file.path());
      }
      piece.absmax = a;
    }
    std::int64_t file_padded = file_numel;
    if (!f.whole_units) {
      STRATA_ASSIGN_OR_RETURN(piece.file_begin, meta_int(f, unit.name + ".shard_begin"));
      STRATA_ASSIGN_OR_RETURN(file_padded, meta_int(f, unit.name + ".padded_numel"));
    }
    if (file_padded < unit.numel || piece.file_begin > file_padded ||
        file_numel > file_padded - piece.file_begin) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("tensor '{}' holds elements [{}, {}) of a unit of {} padded "
                                "elements; the unit has {} elements",
                                name, piece.file_begin, piece.file_begin + file_numel, file_padded,
                                unit.numel),
                    f.file.path());
    }
    piece.lo = std::max(begin, piece.file_begin);
    piece.hi = std::min(end, piece.file_begin + file_numel);
    if (piece.lo >= piece.hi) continue;
    STRATA_TRY(check_tensor(f, *t));
    if (piece.absmax != nullptr) STRATA_TRY(check_tensor(f, *piece.absmax));
    pieces.push_back(piece);
  }
  // Every real element must have come from some file; the rest is padding and stays zero.
  std::vector<std::pair<std::int64_t, std::int64_t>> covered;
  for (const Piece& p : pieces)
    covered.emplace_back(p.lo, p.hi);
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
                              next, gap_end, name, unit.numel, files.size()),
                  dir);
  }
  return pieces;
}

// A piece's values decoded to fp32 into out[0, hi - lo).
void decode_piece(const Piece& p, offload::SlotKind kind, float* out) {
  const std::uint8_t* data = p.file->file.data(*p.values);
  const std::int64_t first = p.lo - p.file_begin, n = p.hi - p.lo;
  switch (p.values->dtype) {
    case model::StDType::kF32:
      std::memcpy(out, data + first * 4, static_cast<std::size_t>(n) * 4);
      return;
    case model::StDType::kBF16:
      kernels::decode_values(kernels::DType::kBF16, data + first * 2, out,
                             static_cast<std::size_t>(n));
      return;
    default: {
      std::vector<float> absmax(static_cast<std::size_t>(p.absmax->shape[0]));
      std::memcpy(absmax.data(), p.file->file.data(*p.absmax), absmax.size() * 4);
      const kernels::Moment which = kind == offload::SlotKind::kExpAvg ? kernels::Moment::kExpAvg
                                                                       : kernels::Moment::kExpAvgSq;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t e = first + i;
        out[i] = kernels::q8_value(which, data[e], absmax[static_cast<std::size_t>(e / p.block)]);
      }
      return;
    }
  }
}

}  // namespace

Status CheckpointReader::read(const model::UnitLayout& unit, offload::SlotKind kind,
                              std::int64_t begin, std::int64_t numel, float* dst) const {
  STRATA_ASSERT(begin >= 0 && numel >= 0 && (dst != nullptr || numel == 0));
  STRATA_ASSERT(kind == offload::SlotKind::kMaster || kind == offload::SlotKind::kExpAvg ||
                kind == offload::SlotKind::kExpAvgSq);
  if (numel > 0) std::memset(dst, 0, static_cast<std::size_t>(numel) * sizeof(float));
  STRATA_ASSIGN_OR_RETURN(const std::vector<Piece> pieces,
                          find_pieces(impl_->files, impl_->dir, unit, kind, begin, numel));
  for (const Piece& p : pieces) {
    float* out = dst + (p.lo - begin);
    decode_piece(p, kind, out);
    const std::int64_t bad = first_invalid_value(kind, out, p.hi - p.lo);
    if (bad >= 0) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("tensor '{}' holds {} at element {}, which training cannot "
                                "continue from (the run had diverged, or the file was damaged)",
                                p.values->name, out[bad], p.lo + bad),
                    p.file->file.path());
    }
  }
  return Status::ok();
}

Result<bool> CheckpointReader::read_stored(const model::UnitLayout& unit, offload::SlotKind kind,
                                           std::int64_t begin, std::int64_t numel,
                                           const offload::TierPlan& plan, void* values,
                                           float* absmax) const {
  STRATA_ASSIGN_OR_RETURN(const std::vector<Piece> pieces,
                          find_pieces(impl_->files, impl_->dir, unit, kind, begin, numel));
  const bool coded = offload::has_absmax(plan, kind);
  const std::uint64_t vb = offload::value_bytes(plan, kind);
  const std::int64_t block = plan.state.block;
  for (const Piece& p : pieces) {
    const bool same = coded ? p.absmax != nullptr && p.block == block &&
                                  (p.lo - p.file_begin) % block == 0 &&
                                  (p.hi - p.lo) % block == 0 && (p.lo - begin) % block == 0
                            : p.absmax == nullptr && model::st_dtype_bytes(p.values->dtype) == vb;
    if (!same) return false;
  }
  std::memset(values, 0, static_cast<std::size_t>(numel) * vb);
  if (coded) std::memset(absmax, 0, static_cast<std::size_t>(numel / block) * 4);
  std::vector<float> check;
  for (const Piece& p : pieces) {
    const std::int64_t first = p.lo - p.file_begin, n = p.hi - p.lo;
    std::memcpy(static_cast<char*>(values) + static_cast<std::uint64_t>(p.lo - begin) * vb,
                p.file->file.data(*p.values) + static_cast<std::uint64_t>(first) * vb,
                static_cast<std::size_t>(n) * vb);
    if (coded) {
      std::memcpy(absmax + (p.lo - begin) / block,
                  p.file->file.data(*p.absmax) + (first / block) * 4,
                  static_cast<std::size_t>(n / block) * 4);
    }
    // The same check as read(): every value as training would see it.
    check.resize(static_cast<std::size_t>(n));
    decode_piece(p, kind, check.data());
    const std::int64_t bad = first_invalid_value(kind, check.data(), n);
    if (bad >= 0) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("tensor '{}' holds {} at element {}, which training cannot "
                                "continue from (the run had diverged, or the file was damaged)",
                                p.values->name, check[static_cast<std::size_t>(bad)], p.lo + bad),
                    p.file->file.path());
    }
  }
  return true;
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
      if (!offload::stored_as_fp32(plan, kind)) {
        // Saved as this run stores it: the bytes themselves (a resume continues bit for bit).
        // Else decoded below and encoded the way this run stores it.
        char* values = reinterpret_cast<char*>(state.tiers().unit_scratch());
        float* absmax =
            reinterpret_cast<float*>(values + align_up(static_cast<std::uint64_t>(up.shard_numel) *
                                                           offload::value_bytes(plan, kind),
                                                       64));
        STRATA_ASSIGN_OR_RETURN(
            const bool same,
            reader.read_stored(unit, kind, up.shard_begin, up.shard_numel, plan, values, absmax));
        if (same) {
          offload::pack_slot(plan, kind, u, values, absmax, state.tiers().raw_scratch());
          STRATA_TRY(state.store_stored(kind, u, state.tiers().raw_scratch()));
          continue;
        }
      }
      float* buffer = state.fill_buffer(kind, u);
      STRATA_TRY(reader.read(unit, kind, up.shard_begin, up.shard_numel, buffer));
      STRATA_TRY(state.store(kind, u, buffer));
    }
  }
  return counters;
}

}  // namespace strata::checkpoint

// safetensors reading (hostile input) and writing (see safetensors.h).
#include "model/safetensors.h"

#include <fmt/format.h>
#include <json/json.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "common/bounded_read.h"
#include "common/durable_file.h"
#include "kernels/cpu/cast.h"

namespace strata::model {
namespace {

struct DTypeName {
  StDType type;
  const char* name;
  std::uint64_t bytes;
};
constexpr DTypeName kDTypes[] = {
    {StDType::kF64, "F64", 8},   {StDType::kF32, "F32", 4},        {StDType::kF16, "F16", 2},
    {StDType::kBF16, "BF16", 2}, {StDType::kI64, "I64", 8},        {StDType::kI32, "I32", 4},
    {StDType::kI16, "I16", 2},   {StDType::kI8, "I8", 1},          {StDType::kU64, "U64", 8},
    {StDType::kU32, "U32", 4},   {StDType::kU16, "U16", 2},        {StDType::kU8, "U8", 1},
    {StDType::kBool, "BOOL", 1}, {StDType::kF8E4M3, "F8_E4M3", 1}, {StDType::kF8E5M2, "F8_E5M2", 1},
};

Status corrupt(const std::string& source, const std::string& message) {
  return Status(ErrorCode::kCorrupt, message, source);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

const char* st_dtype_name(StDType type) {
  for (const DTypeName& d : kDTypes) {
    if (d.type == type) return d.name;
  }
  return "?";
}

std::uint64_t st_dtype_bytes(StDType type) {
  for (const DTypeName& d : kDTypes) {
    if (d.type == type) return d.bytes;
  }
  return 0;
}

std::uint64_t StTensor::numel() const {
  std::uint64_t n = 1;
  for (std::int64_t d : shape)
    n *= static_cast<std::uint64_t>(d);
  return n;
}

namespace {

// The header checks of parse_safetensors_header, on parsed JSON.
Result<std::vector<StTensor>> check_header(const Json::Value& root, std::uint64_t data_bytes,
                                           const std::string& source,
                                           std::map<std::string, std::string>* metadata) {
  if (!root.isObject()) return corrupt(source, "the header is not a JSON object");
  if (root.size() > kSafetensorsTensorsMax) {
    return corrupt(source, fmt::format("the header lists {} entries; at most {} are read",
                                       root.size(), kSafetensorsTensorsMax));
  }
  std::vector<StTensor> tensors;
  for (const std::string& name : root.getMemberNames()) {
    const Json::Value& entry = root[name];
    if (name == "__metadata__") {
      if (!entry.isObject()) return corrupt(source, "__metadata__ is not an object");
      for (const std::string& key : entry.getMemberNames()) {
        if (!entry[key].isString()) {
          return corrupt(source, fmt::format("__metadata__.{} is not a string", key));
        }
        if (metadata != nullptr) (*metadata)[key] = entry[key].asString();
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    if (name.empty()) return corrupt(source, "a tensor has an empty name");
    if (!entry.isObject()) return corrupt(source, where + ": not an object");
    for (const std::string& key : entry.getMemberNames()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        return corrupt(source, fmt::format("{}: unknown field '{}'", where, key));
      }
    }
    StTensor t;
    t.name = name;
    const Json::Value& dtype = entry["dtype"];
    if (!dtype.isString()) return corrupt(source, where + ": dtype is missing or not a string");
    bool known = false;
    for (const DTypeName& d : kDTypes) {
      if (dtype.asString() == d.name) {
        t.dtype = d.type;
        known = true;
      }
    }
    if (!known) {
      return corrupt(source, fmt::format("{}: unknown dtype '{}'", where, dtype.asString()));
    }
    const Json::Value& shape = entry["shape"];
    if (!shape.isArray()) return corrupt(source, where + ": shape is missing or not a list");
    if (shape.size() > 16) return corrupt(source, where + ": more than 16 dimensions");
    std::uint64_t numel = 1;
    for (const Json::Value& dim : shape) {
      if (!dim.isUInt64() || dim.asUInt64() > (std::uint64_t{1} << 48)) {
        return corrupt(source, where + ": a dimension is not an integer in [0, 2^48]");
      }
      const std::uint64_t d = dim.asUInt64();
      if (d != 0 && numel > (std::uint64_t{1} << 62) / d) {
        return corrupt(source, where + ": the shape's element count overflows");
      }
      numel *= d;
      t.shape.push_back(static_cast<std::int64_t>(d));
    }
    const Json::Value& offsets = entry["data_offsets"];
    if (!offsets.isArray() || offsets.size() != 2 || !offsets[0].isUInt64() ||
        !offsets[1].isUInt64()) {
      return corrupt(source, where + ": data_offsets must be two non-negative integers");
    }
    t.begin = offsets[0].asUInt64();
    t.end = offsets[1].asUInt64();
    if (t.begin > t.end || t.end > data_bytes) {
      return corrupt(source, fmt::format("{}: data_offsets [{}, {}] lie outside the {} data bytes",
                                         where, t.begin, t.end, data_bytes));
    }
    const std::uint64_t bytes = st_dtype_bytes(t.dtype);
    if (numel > (std::uint64_t{1} << 62) / bytes || numel * bytes != t.end - t.begin) {
      return corrupt(
          source,
          fmt::format("{}: shape {} of {} needs {} bytes but data_offsets span {}", where,
                      shape_text(t.shape), st_dtype_name(t.dtype), numel * bytes, t.end - t.begin));
    }
    tensors.push_back(std::move(t));
  }
  // The data section must be covered exactly: no overlaps, no holes.
  std::vector<const StTensor*> by_offset;
  for (const StTensor& t : tensors)
    by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const StTensor* a, const StTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t cursor = 0;
  for (const StTensor* t : by_offset) {
    if (t->begin < cursor) {
      return corrupt(source, fmt::format("tensor '{}' overlaps the tensor before it (bytes {}..{})",
                                         t->name, t->begin, t->end));
    }
    if (t->begin > cursor) {
      return corrupt(source,
                     fmt::format("bytes {}..{} of the data belong to no tensor", cursor, t->begin));
    }
    cursor = t->end;
  }
  if (cursor != data_bytes) {
    return corrupt(source, fmt::format("bytes {}..{} at the end of the data belong to no tensor",
                                       cursor, data_bytes));
  }
  return tensors;
}

}  // namespace

Result<std::vector<StTensor>> parse_safetensors_header(
    const std::string& header, std::uint64_t data_bytes, const std::string& source,
    std::map<std::string, std::string>* metadata) {
  if (header.empty() || header[0] != '{') {
    return corrupt(source, "the header does not start with '{'; not a safetensors file");
  }
  // Writers pad the header with spaces to an 8-byte boundary; nothing else may follow the object.
  std::size_t used = header.size();
  while (used > 0 && header[used - 1] == ' ')
    --used;
  JsonLimits limits;
  limits.bytes_max = kSafetensorsHeaderBytesMax;
  limits.depth_max = kSafetensorsHeaderDepthMax;
  Result<Json::Value> parsed =
      parse_json_bounded(std::string_view(header.data(), used), source, limits);
  if (!parsed.is_ok()) {
    return corrupt(source, "the header is not a valid JSON object: " + parsed.status().message());
  }
  const Json::Value& root = *parsed;
  try {
    return check_header(root, data_bytes, source, metadata);
  } catch (const std::exception& e) {
    // jsoncpp throws on a type it did not expect; every access above is checked, so this is a
    // last line of defence that still names the file.
    return corrupt(source, fmt::format("the header cannot be read: {}", e.what()));
  }
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  STRATA_ASSIGN_OR_RETURN(file.map_, MappedFile::open(path, "the safetensors file"));
  const std::uint64_t size = file.map_.size();
  if (size < 8) {
    return corrupt(path, fmt::format("{} bytes is too short for a safetensors file (at least 8 "
                                     "for the header length)",
                                     size));
  }
  file.path_ = path;
  const std::uint8_t* bytes = file.map_.bytes();
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i)
    header_bytes = (header_bytes << 8) | bytes[i];
  if (header_bytes > kSafetensorsHeaderBytesMax) {
    return corrupt(path, fmt::format("header length {} exceeds the 100 MiB limit", header_bytes));
  }
  if (header_bytes > size - 8) {
    return corrupt(path, fmt::format("header length {} runs past the end of the {}-byte file",
                                     header_bytes, size));
  }
  const std::string header(reinterpret_cast<const char*>(bytes + 8), header_bytes);
  file.header_xxh3_ = XXH3_64bits(bytes, 8 + header_bytes);
  STRATA_ASSIGN_OR_RETURN(file.tensors_, parse_safetensors_header(header, size - 8 - header_bytes,
                                                                  path, &file.metadata_));
  file.data_ = bytes + 8 + header_bytes;
  for (std::size_t i = 0; i < file.tensors_.size(); ++i)
    file.index_[file.tensors_[i].name] = i;
  return file;
}

std::uint64_t SafetensorsFile::tensor_xxh3(const StTensor& tensor) const {
  return XXH3_64bits(data(tensor), tensor.end - tensor.begin);
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::read_f32(const std::string& name, const std::vector<std::int64_t>& shape,
                                 float* dst) const {
  const StTensor* t = find(name);
  if (t == nullptr) return Status(ErrorCode::kNotFound, "no tensor '" + name + "'", path_);
  if (t->shape != shape) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("tensor '{}' has shape {}, expected {}", name, shape_text(t->shape),
                              shape_text(shape)),
                  path_);
  }
  // The data section may be unaligned (the header length is any number): copy first.
  const std::uint64_t bytes = t->end - t->begin;
  const std::int64_t n = static_cast<std::int64_t>(t->numel());
  if (n == 0) return Status::ok();  // an empty tensor (a 0 in its shape): nothing to copy
  switch (t->dtype) {
    case StDType::kF32:
      std::memcpy(dst, data(*t), bytes);
      return Status::ok();
    case StDType::kF64: {
      for (std::int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, data(*t) + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return Status::ok();
    }
    case StDType::kF16:
    case StDType::kBF16: {
      std::vector<std::uint16_t> aligned(static_cast<std::size_t>(n));
      std::memcpy(aligned.data(), data(*t), bytes);
      kernels::cast_array(dst, kernels::DType::kF32, aligned.data(),
                          t->dtype == StDType::kF16 ? kernels::DType::kF16 : kernels::DType::kBF16,
                          n);
      return Status::ok();
    }
    default:
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("tensor '{}' has dtype {}; valid: F32, F64, F16, BF16", name,
                                st_dtype_name(t->dtype)),
                    path_);
  }
}

namespace {

// Streams the file's bytes to `file` and hashes them: the length and header as one digest, each
// tensor as its own.
class HashingWriter {
 public:
  explicit HashingWriter(DurableFile& file) : file_(file), state_(XXH3_createState()) {
    STRATA_ASSERT(state_ != nullptr);
    XXH3_64bits_reset(state_);
  }
  ~HashingWriter() { XXH3_freeState(state_); }
  HashingWriter(const HashingWriter&) = delete;
  HashingWriter& operator=(const HashingWriter&) = delete;

  Status write(const void* data, std::uint64_t bytes) {
    XXH3_64bits_update(state_, data, static_cast<std::size_t>(bytes));
    return file_.write(data, bytes);
  }
  // The digest of everything since the last call, and a fresh start.
  std::uint64_t next_digest() {
    const std::uint64_t d = XXH3_64bits_digest(state_);
    XXH3_64bits_reset(state_);
    return d;
  }

 private:
  DurableFile& file_;
  XXH3_state_t* state_;
};

}  // namespace

Status write_safetensors(const std::string& path, const std::vector<StTensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         const std::vector<StProduceFn>& producers, StDigest* digest) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first_key = true;
    for (const auto& [key, value] : metadata) {
      header += (first_key ? "" : ",") + Json::valueToQuotedString(key.c_str()) + ":" +
                Json::valueToQuotedString(value.c_str());
      first_key = false;
    }
    header += "}";
    first = false;
  }
  std::uint64_t offset = 0;
  std::vector<std::uint64_t> sizes;
  for (const StTensorToWrite& t : tensors) {
    std::uint64_t numel = 1;
    for (std::int64_t d : t.shape)
      numel *= static_cast<std::uint64_t>(d);
    const std::uint64_t bytes = numel * st_dtype_bytes(t.dtype);
    sizes.push_back(bytes);
    header += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          first ? "" : ",", Json::valueToQuotedString(t.name.c_str()),
                          st_dtype_name(t.dtype), fmt::join(t.shape, ","), offset, offset + bytes);
    first = false;
    offset += bytes;
  }
  header += "}";
  while (header.size() % 8 != 0)
    header += ' ';

  const std::string tmp = path + ".tmp";
  StDigest made;
  Status written = [&]() -> Status {
    STRATA_ASSIGN_OR_RETURN(DurableFile file, DurableFile::create(tmp));
    HashingWriter out(file);
    std::uint8_t length[8];
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i)
      length[i] = static_cast<std::uint8_t>(n >> (8 * i));
    STRATA_TRY(out.write(length, 8));
    STRATA_TRY(out.write(header.data(), header.size()));
    made.header_xxh3 = out.next_digest();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (i >= producers.size() || !producers[i]) {
        if (sizes[i] > 0) STRATA_TRY(out.write(tensors[i].data, sizes[i]));
        made.tensor_xxh3.push_back(out.next_digest());
        continue;
      }
      std::uint64_t produced = 0;
      STRATA_TRY(producers[i]([&](const void* data, std::uint64_t bytes) -> Status {
        if (produced + bytes > sizes[i]) {
          return Status(ErrorCode::kInternal,
                        fmt::format("tensor '{}' produced more than its {} bytes", tensors[i].name,
                                    sizes[i]));
        }
        if (bytes > 0) STRATA_TRY(out.write(data, bytes));
        produced += bytes;
        return Status::ok();
      }));
      if (produced != sizes[i]) {
        return Status(ErrorCode::kInternal, fmt::format("tensor '{}' produced {} of its {} bytes",
                                                        tensors[i].name, produced, sizes[i]));
      }
      made.tensor_xxh3.push_back(out.next_digest());
    }
    made.file_bytes = file.bytes_written();
    STRATA_TRY(file.sync());
    return file.close();
  }();
  if (written.is_ok()) written = rename_durably(tmp, path);
  if (!written.is_ok()) {
    ::unlink(tmp.c_str());
    return written;
  }
  if (digest != nullptr) *digest = std::move(made);
  return Status::ok();
}

}  // namespace strata::model

// The safetensors format (8-byte little-endian header length, a JSON header, then the tensor
// bytes), read as hostile input: only a regular file is opened (never a FIFO or a device); the
// header length, JSON (at most kSafetensorsHeaderBytesMax bytes, nested at most
// kSafetensorsHeaderDepthMax deep), dtypes, shapes and offsets are all checked against each other
// and the file size before any tensor byte is touched, and every problem is a clear error naming
// the file, tensor and value, never a crash. The data is memory-mapped read-only. The writer
// produces files `transformers` loads (metadata {"format": "pt"}), atomically and durably
// (temporary file, fsync, rename, fsync of the directory), and can return xxHash3 digests of what
// it wrote (the header and each tensor) for a manifest.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"

namespace strata::model {

enum class StDType : std::uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2
};
const char* st_dtype_name(StDType type);
std::uint64_t st_dtype_bytes(StDType type);

struct StTensor {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets into the data section
  std::uint64_t end = 0;
  std::uint64_t numel() const;
};

// The largest header accepted (the format's own limit), its deepest nesting (a tensor's shape is
// at depth 3), and the most tensors one file may describe.
inline constexpr std::uint64_t kSafetensorsHeaderBytesMax = 100ull << 20;
inline constexpr int kSafetensorsHeaderDepthMax = 4;
inline constexpr std::uint64_t kSafetensorsTensorsMax = 1u << 20;

class SafetensorsFile {
 public:
  ~SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&& other) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;

  // Opens, maps and validates the file. kNotFound / kIo for OS problems, kCorrupt for anything
  // wrong inside the file.
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor called `name`, or nullptr.
  const StTensor* find(const std::string& name) const;
  // The tensor's bytes (valid while this object lives).
  const std::uint8_t* data(const StTensor& tensor) const { return data_ + tensor.begin; }
  // Size of the file in bytes, and the xxHash3-64 of its first 8 + header bytes (the length and
  // the JSON header, padding included): what write_safetensors' digest says for it.
  std::uint64_t file_bytes() const { return map_.size(); }
  std::uint64_t header_xxh3() const { return header_xxh3_; }
  // xxHash3-64 of the tensor's bytes (reads them all).
  std::uint64_t tensor_xxh3(const StTensor& tensor) const;

  // Copies tensor `name` into dst as fp32, converting from F32, F64, F16 or BF16, after checking
  // its shape equals `shape`. Errors name the file, tensor, and expected vs found.
  Status read_f32(const std::string& name, const std::vector<std::int64_t>& shape,
                  float* dst) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  MappedFile map_;
  const std::uint8_t* data_ = nullptr;
  std::vector<StTensor> tensors_;
  std::map<std::string, std::uint64_t> index_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t header_xxh3_ = 0;
};

// Parses and validates a header (the JSON text) against a data section of `data_bytes`;
// exposed for tests. `source` names the file in errors.
Result<std::vector<StTensor>> parse_safetensors_header(
    const std::string& header, std::uint64_t data_bytes, const std::string& source,
    std::map<std::string, std::string>* metadata);

// Hands a tensor's bytes to the writer in pieces, in order: `write(data, bytes)` may be called
// any number of times; the pieces must add up to the tensor's size.
using StWriteFn = std::function<Status(const void* data, std::uint64_t bytes)>;
using StProduceFn = std::function<Status(const StWriteFn& write)>;

struct StTensorToWrite {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;  // numel * dtype bytes (null when a producer streams them)
};

// What write_safetensors wrote: the file's size, the xxHash3-64 of its length and header, and of
// each tensor's bytes (in the order given).
struct StDigest {
  std::uint64_t file_bytes = 0;
  std::uint64_t header_xxh3 = 0;
  std::vector<std::uint64_t> tensor_xxh3;
};

// Writes the tensors, in order, to `path` (via path + ".tmp", fsync, rename, fsync of the
// directory: see common/durable_file.h). Tensor i's bytes come from `producers[i]` when that is
// given and set (state that is not in memory all at once), else from its `data`. Fills `digest`
// when given. A write error (a full disk: kNoSpace) names the file; the temporary file is removed.
Status write_safetensors(const std::string& path, const std::vector<StTensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         const std::vector<StProduceFn>& producers = {},
                         StDigest* digest = nullptr);

}  // namespace strata::model

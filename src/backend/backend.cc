// Buffer ownership and the small shared parts of the Backend interface.
#include "backend/backend.h"

namespace strata::backend {

const char* to_string(StreamKind stream) {
  switch (stream) {
    case StreamKind::kCompute:
      return "compute";
    case StreamKind::kHostToDevice:
      return "host-to-device";
    case StreamKind::kDeviceToHost:
      return "device-to-host";
  }
  return "unknown";
}

Buffer::~Buffer() {
  reset();
}

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(other.owner_), data_(other.data_), bytes_(other.bytes_), kind_(other.kind_) {
  other.owner_ = nullptr;
  other.data_ = nullptr;
  other.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = other.owner_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    kind_ = other.kind_;
    other.owner_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->release(data_, bytes_, kind_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Buffer Backend::make_buffer(void* data, std::uint64_t bytes, MemoryKind kind) {
  Buffer buffer;
  buffer.owner_ = this;
  buffer.data_ = data;
  buffer.bytes_ = bytes;
  buffer.kind_ = kind;
  return buffer;
}

}  // namespace strata::backend

// Fuzz target: a safetensors file (8-byte header length, JSON header, data), opened as the
// trainer and `strata convert` open one, then every tensor read as fp32 and hashed.
#include <vector>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  strata::fuzz::MemFile file(data, size);
  auto opened = strata::model::SafetensorsFile::open(file.path());
  strata::fuzz::check_named(opened.status(), file.path());
  if (!opened.is_ok()) return 0;
  std::vector<float> buffer;
  for (const strata::model::StTensor& t : opened->tensors()) {
    if (t.numel() > (1u << 20)) continue;
    buffer.resize(t.numel());
    strata::fuzz::check_named(opened->read_f32(t.name, t.shape, buffer.data()), file.path());
    strata::fuzz::sink(opened->tensor_xxh3(t));
  }
  return 0;
}

// Fuzz target: a mask file (data/token_mask.h) beside a fixed, valid token file, opened as `strata
// train` opens a tokens source with packing on, and a few packed batches drawn from the pair.
// The first input byte chooses packing (odd) or masked fixed windows (even); the rest is the mask
// file.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/token_file.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

constexpr int kTokens = 96;

// A folder of this process's holding tokens.bin: an llm.c file of kTokens uint16 ids.
const std::string& folder() {
  static const std::string dir = [] {
    char name[] = "/tmp/strata-fuzz-mask-XXXXXX";
    if (::mkdtemp(name) == nullptr) std::abort();
    std::vector<std::int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = kTokens;
    std::ofstream out(std::string(name) + "/tokens.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
    for (int i = 0; i < kTokens; ++i) {
      const auto id = static_cast<std::uint16_t>((i * 7) % 50);
      out.write(reinterpret_cast<const char*>(&id), 2);
    }
    return std::string(name);
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string tokens = folder() + "/tokens.bin";
  const std::string mask = folder() + "/tokens.mask.bin";
  {
    std::ofstream out(mask, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  strata::config::DataConfig config;
  config.source = strata::config::DataSource::kTokens;
  config.path = tokens;
  config.seq_len = 8;
  config.val_fraction = 0.25;
  config.packing = (data[0] & 1) != 0;
  auto dataset = strata::data::make_dataset(config, 50, 1);
  strata::fuzz::check_named(dataset.status(), mask);
  if (!dataset.is_ok()) return 0;
  strata::data::Batch batch;
  batch.resize(2, config.seq_len);
  for (int b = 0; b < 3; ++b) {
    strata::fuzz::check_named((*dataset)->next_train(batch), mask);
    strata::fuzz::sink(static_cast<std::uint64_t>(batch.counted));
    strata::fuzz::check_named((*dataset)->val_batch(b, batch), mask);
  }
  return 0;
}

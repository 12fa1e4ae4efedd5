// Fuzz target: a token file (llm.c header or nanoGPT uint16) opened as a dataset, as `strata
// train` with strata.data.source "tokens" opens one, and a few batches drawn from it.
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/token_file.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  strata::fuzz::MemFile file(data, size);
  auto tokens = strata::data::TokenFile::open(file.path(), false);
  strata::fuzz::check_named(tokens.status(), file.path());
  if (tokens.is_ok()) {
    for (std::int64_t i = 0; i < tokens->size() && i < 4096; ++i)
      strata::fuzz::sink(static_cast<std::uint64_t>(tokens->at(i)));
  }
  strata::config::DataConfig config;
  config.source = strata::config::DataSource::kTokens;
  config.path = file.path();
  config.seq_len = 4;
  config.val_fraction = 0.25;
  auto dataset = strata::data::make_dataset(config, 50257, 1);
  strata::fuzz::check_named(dataset.status(), file.path());
  if (!dataset.is_ok()) return 0;
  strata::data::Batch batch;
  batch.resize(2, config.seq_len);
  for (int b = 0; b < 3; ++b) {
    strata::fuzz::check_named((*dataset)->next_train(batch), file.path());
    strata::fuzz::check_named((*dataset)->val_batch(b, batch), file.path());
  }
  return 0;
}

// Fuzz target: a DeepSpeed-style JSON config with the strata section, loaded and checked as
// `strata train --config` and `strata config check` load one.
#include <string>

#include "config/config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto loaded = strata::config::load_config_text(text, "ds_config.json", {});
  strata::fuzz::check_named(loaded.status(), "ds_config.json");
  if (loaded.is_ok()) strata::fuzz::sink(strata::config::to_json(loaded->config).size());
  return 0;
}

// Fuzz target: a Hugging Face config.json (any model_type Strata reads) read into a model
// shape with its bounds checked, as `strata train` with strata.model.path and `strata eval` do.
#include <string>

#include "model/model_spec.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = strata::model::parse_hf_config(text, "config.json");
  strata::fuzz::check_named(config.status(), "config.json");
  if (!config.is_ok()) return 0;
  auto shape = strata::model::resolve_shape(*config);
  strata::fuzz::check_named(shape.status(), "config.json");
  if (shape.is_ok()) {
    strata::fuzz::sink(static_cast<std::uint64_t>(strata::model::total_params(*shape)));
    strata::fuzz::sink(strata::model::hf_config_json(*shape, "float32").size());
  }
  return 0;
}

// Fuzz target: a checkpoint's trainer_state.json, parsed as read_checkpoint and `strata convert`
// parse it: as given (the checksum rejects nearly every mutation) and re-sealed with its checksum
// recomputed, so that the field and counter checks behind it are fuzzed too.
#include <string>

#include "tests/fuzz/fuzz_support.h"
#include "train/checkpoint_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  strata::fuzz::check_named(strata::train::parse_checkpoint_manifest(text, "m.json").status(),
                            "m.json");
  const std::string sealed = strata::train::seal_checkpoint_manifest(text);
  auto m = strata::train::parse_checkpoint_manifest(sealed, "m.json");
  strata::fuzz::check_named(m.status(), "m.json");
  if (m.is_ok() && m->version == strata::train::kCheckpointVersion) {
    // What parses must render and parse back to the same counters.
    auto back = strata::train::parse_checkpoint_manifest(
        strata::train::render_checkpoint_manifest(*m), "rendered.json");
    if (!back.is_ok() || back->counters.step != m->counters.step) std::abort();
  }
  return 0;
}

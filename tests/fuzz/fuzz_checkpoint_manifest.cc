// Fuzz target: a checkpoint's trainer_state.json, parsed as read_checkpoint and `strata convert`
// parse it: as given (the checksum rejects nearly every mutation) and re-sealed with its checksum
// recomputed, so that the field and counter checks behind it are fuzzed too.
#include <string>

#include "checkpoint/manifest.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  strata::fuzz::check_named(strata::checkpoint::parse_checkpoint_manifest(text, "m.json").status(),
                            "m.json");
  const std::string sealed = strata::checkpoint::seal_checkpoint_manifest(text);
  auto m = strata::checkpoint::parse_checkpoint_manifest(sealed, "m.json");
  strata::fuzz::check_named(m.status(), "m.json");
  if (m.is_ok() && m->version == strata::checkpoint::kCheckpointVersion) {
    // What parses must render and parse back to the same counters.
    auto back = strata::checkpoint::parse_checkpoint_manifest(
        strata::checkpoint::render_checkpoint_manifest(*m), "rendered.json");
    if (!back.is_ok() || back->counters.step != m->counters.step) std::abort();
  }
  return 0;
}

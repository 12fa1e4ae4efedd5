// The measurements behind `strata bench offload` (docs/benchmarks.md, "Offload"): the parts an
// offloaded step is made of, each timed alone on the same state, so the offloaded step can be
// compared with the larger of them.
//   - replay_io: the NVMe bytes a step (or an optimizer step) moved, read and written again over
//     the same swap extents with plenty in flight — "the I/O alone";
//   - adam_alone: CPU Adam over every optimizer tile, its data already in memory — "the Adam
//     arithmetic alone".
#pragma once

#include <cstdint>

#include "offload/cpu_adam.h"
#include "offload/optimizer_pipeline.h"
#include "offload/tier_manager.h"

namespace strata::bench {

struct IoVolume {
  std::uint64_t read_bytes[offload::kSlotKinds] = {0, 0, 0, 0, 0};
  std::uint64_t write_bytes[offload::kSlotKinds] = {0, 0, 0, 0, 0};
  std::uint64_t reads() const;
  std::uint64_t writes() const;
};

// What `after` moved beyond `before`.
IoVolume io_since(const offload::IoCounters& before, const offload::IoCounters& after);

// Reads and writes `volume` (per kind, over that kind's NVMe tiles in unit order, wrapping
// around) with up to `in_flight` tile operations outstanding, reads and writes interleaved as
// they are submitted. Returns the wall time in milliseconds. The tiles' contents are not
// preserved: run it after training.
Result<double> replay_io(offload::TierManager& tiers, const IoVolume& volume, int in_flight);

// Runs Adam over every tile whose optimizer state is homed on NVMe, reading each tile into the
// pipeline's first stage beforehand (not timed); returns the milliseconds inside Adam.
Result<double> adam_alone_ms(offload::TierManager& tiers, offload::CpuAdam& adam,
                             const offload::PipelineStep& step);

}  // namespace strata::bench

// Collectives over host data between steps, on several ranks: the step's loss and gradient norm
// summed over the ranks, and whole units of master weights gathered from every rank's shard
// (to save the model). They sit beside the trainer, not in the offload store: they read the
// store's state but change none of it.
//
// NCCL reduces device memory only, so the host values travel through device memory, and between
// steps the gradient frames are idle: every gradient has left the device by finish_backward(),
// and the next micro-batch has not begun. The first frame of a unit's size class holds a whole
// unit in fp32, which is what both need. Call them between steps, on every rank in the same order.
#pragma once

#include "comm/comm.h"
#include "offload/offload_store.h"

namespace strata::train {

// values[0 .. count) (fp64, any host memory) summed over the ranks, in place. At most
// max_sum_values(store) values.
Status sum_over_ranks(offload::OffloadStore& store, comm::Comm& comm, double* values, int count);
// How many fp64 values sum_over_ranks takes at once (the smallest gradient frame's bytes / 8).
int max_sum_values(const offload::OffloadStore& store);

// The whole unit u of fp32 masters (padded_numel elements) into `whole` (any host memory),
// gathered from every rank's shard; waits for the optimizer step in flight first.
Status gather_masters(offload::OffloadStore& store, comm::Comm* comm, int unit, float* whole);

}  // namespace strata::train

// A small TCP rendezvous that hands one blob (NCCL's 128-byte unique id) from rank 0 to the other
// ranks when no MPI is there to do it (torchrun-style or Slurm launches of the CUDA backend). It
// carries nothing else: the data between ranks goes through NCCL.
//
// Rank 0 listens on `port` on every interface; every other rank connects to host:port, retrying
// until the deadline, and introduces itself (rank, world size, blob size). Rank 0 checks that each
// rank in 1..world_size-1 arrives exactly once with the same world size, then sends the blob to
// all of them; on a mismatch or a timeout it tells the ranks already connected why, so that they
// fail at once with the same message instead of waiting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace strata::comm {

struct RendezvousOptions {
  std::string host;  // rank 0's address (MASTER_ADDR); rank 0 itself ignores it
  int port = 0;      // rank 0's TCP port (MASTER_PORT, or STRATA_BOOTSTRAP_PORT)
  int rank = 0;
  int world_size = 1;
  double timeout_s = 300.0;  // for the whole rendezvous
};

// Rank 0: sends `blob` to every other rank. Other ranks: fill `blob` (the same size on every rank)
// with rank 0's. Errors (kUnavailable, or kConfig for inconsistent ranks) name the host, port,
// the ranks that did not arrive or the value that disagrees.
Status tcp_share_blob(const RendezvousOptions& options, std::span<std::byte> blob);

}  // namespace strata::comm

// Internal to the MPI Comm: the engine that runs one collective as one or two "phases" of direct
// point-to-point exchange (every rank with every other), segment by segment, with the rank-order
// fold at the receiver for reductions. Built once per Comm with fixed buffers: staging for two
// segments per peer and the request arrays; running an operation allocates nothing.
#pragma once

#if defined(STRATA_HAVE_MPI)

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace strata::comm::detail {

// MPI's text for an error code.
std::string mpi_error_text(int code);

// Segments of one phase in flight per peer.
inline constexpr int kWindow = 2;

// Segment size for `world_size` ranks: 4 MiB, smaller for many ranks so that the staging of
// kWindow segments per peer stays near 32 MiB, never below 64 KiB. The same on every rank.
std::uint64_t segment_bytes_for(int world_size);

class Exchange {
 public:
  Exchange(MPI_Comm comm, int rank, int world_size);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  // Starts `op` (sequence number `sequence`, which picks the MPI tags). Errors from MPI.
  Status start(const CollectiveOp& op, std::uint64_t sequence);
  // Advances the running operation without blocking. Sets *done when it has completed; returns
  // how many requests completed in this call (0: nothing moved). Errors from MPI.
  Result<int> poll(bool* done);
  // "rank 1" or "ranks 1, 3": the peers whose messages the running operation still waits for
  // (receives first, else sends).
  std::string waiting_for() const;
  // Bytes of staging memory this engine holds.
  std::uint64_t staging_bytes() const { return staging_bytes_; }

 private:
  struct Phase {
    // Per peer: what to send and where to receive (bytes); 0 = nothing.
    std::vector<const std::byte*> send_ptr;
    std::vector<std::uint64_t> send_len;
    std::vector<std::byte*> recv_ptr;
    std::vector<std::uint64_t> recv_len;
    bool handshake = false;  // one empty message each way per peer (barrier)
    bool reduce = false;     // receive into staging and fold into `out` in rank order
    std::byte* out = nullptr;
    const std::byte* own = nullptr;
    std::uint64_t reduce_len = 0;  // bytes of `out`
    DataType type = DataType::kU8;
    ReduceOp op = ReduceOp::kSum;
    int tag = 0;
    std::uint64_t segments = 0;
  };

  void clear_phase(Phase* phase) const;
  void plan(const CollectiveOp& op, std::uint64_t sequence);
  Status begin_phase(int index);
  Status post_segment(std::uint64_t segment);
  bool slot_done(int slot) const;
  MPI_Request& request(int slot, int peer, int direction) {
    return requests_[static_cast<std::size_t>((slot * world_size_ + peer) * 2 + direction)];
  }
  const MPI_Request& request(int slot, int peer, int direction) const {
    return requests_[static_cast<std::size_t>((slot * world_size_ + peer) * 2 + direction)];
  }
  std::byte* staging(int slot, int peer) {
    return staging_ + (static_cast<std::uint64_t>(slot) * static_cast<std::uint64_t>(world_size_) +
                       static_cast<std::uint64_t>(peer)) *
                          segment_bytes_;
  }

  MPI_Comm comm_;
  int rank_;
  int world_size_;
  std::uint64_t segment_bytes_;
  std::byte* staging_ = nullptr;
  std::uint64_t staging_bytes_ = 0;
  std::vector<MPI_Request> requests_;  // [slot][peer][send=0, recv=1]
  std::vector<int> indices_;           // MPI_Testsome's output
  std::vector<const void*> sources_;   // fold inputs, in rank order
  Phase phases_[2];
  int phase_count_ = 0;
  int phase_ = 0;                // running phase
  std::uint64_t head_ = 0;       // oldest segment not finished
  std::uint64_t next_post_ = 0;  // next segment to post
};

}  // namespace strata::comm::detail

#endif  // STRATA_HAVE_MPI

// NCCL for the CUDA backend: a Comm over device memory (nccl_comm.cc). Built only with CUDA; NCCL
// itself is opened at run time (nccl_api.h).
//
// Operations are issued on one CUDA stream (the Comm's own non-blocking stream, or one the caller
// passes) and run there in issue order; after each one the Comm records a CUDA event from a fixed
// ring of in_flight_max events, which test() queries and wait() polls. Inputs must be ready when
// the operation runs on that stream: produced by work issued earlier on it, or the caller makes the
// stream wait (cudaStreamWaitEvent) before issuing. A wait that sees no operation complete for
// CommOptions::timeout_s aborts the NCCL communicator (ncclCommAbort) and fails; NCCL does not say
// which rank is missing, so the message cannot name it (under mpirun, mpirun names a rank that
// exited). ncclCommInitRank itself blocks until every rank has joined; the rendezvous before it
// (MPI or the TCP bootstrap) has already checked that all ranks are up.
//
// Summation order: NCCL's own (ring or tree, chosen by NCCL). It is reproducible from run to run on
// the same machine, NCCL version and settings, but it is not the rank-order fold of the MPI Comm;
// with two ranks the two agree (a sum of two terms does not depend on the order).
#pragma once

#include <memory>

#include "comm/comm.h"
#include "comm/nccl_api.h"

namespace strata::comm {

// Ok when NCCL can be used here: built with CUDA, a GPU is visible, and libnccl.so.2 loads.
// kUnavailable saying which is missing otherwise.
Status nccl_usable();

// A new NCCL unique id (rank 0 makes it; the others receive it through MPI or the TCP bootstrap).
Result<nccl::UniqueId> nccl_unique_id();

struct NcclCommConfig {
  int rank = 0;
  int world_size = 1;
  int device = 0;  // CUDA device index this rank uses (cudaSetDevice)
  nccl::UniqueId id{};
  CommOptions options;
  void* stream = nullptr;  // cudaStream_t to issue on; nullptr: the Comm makes its own
};

// Joins the NCCL communicator (blocks until every rank has joined). Errors: kUnavailable (no CUDA,
// GPU or NCCL; NCCL or CUDA failures, with NCCL's text), kInvalidArgument for bad options.
Result<std::unique_ptr<Comm>> create_nccl_comm(const NcclCommConfig& config);

// The cudaStream_t a Comm from create_nccl_comm() issues on (to order a backend's work with it).
void* nccl_stream(Comm& comm);

}  // namespace strata::comm

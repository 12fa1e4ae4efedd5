// A program the checkpoint MPI tests start under `mpirun -np N`: each rank builds its
// offload::OffloadStore (rank r of N, the tiny GPT-2 of offload_support.h), fills it with known
// values (rank_state_support.h) and writes a checkpoint with write_checkpoint(..., comm).
//   write ROOT STAGE        every rank writes under ROOT at ZeRO STAGE; rank 0 prints
//                           "checkpoint DIR" on success.
//   fail ROOT STAGE RANK    RANK is given another root, which no rank prepared (as when the
//                           checkpoint directory is not shared): its shard write fails, and every
//                           rank must return an error naming RANK instead of waiting.
// Every rank prints "rank R: ERROR" on failure and exits 1.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/checkpoint.h"
#include "comm/world.h"
#include "tests/train/rank_state_support.h"

namespace {

using strata::Status;

Status run(strata::comm::Comm& comm, const std::string& root, int stage) {
  STRATA_ASSIGN_OR_RETURN(
      auto r, strata::testing::make_rank_state("gpt2", stage, comm.rank(), comm.world_size()));
  STRATA_TRY(strata::testing::fill_known(*r));
  const strata::checkpoint::TrainerCounters counters = strata::testing::counters_after(3);
  strata::checkpoint::CheckpointOptions options;
  options.zero_stage = stage;
  STRATA_ASSIGN_OR_RETURN(std::string dir,
                          strata::checkpoint::write_checkpoint(root, counters, *r->state, r->shape,
                                                               "fp32", 11, options, comm));
  if (comm.rank() == 0) std::printf("checkpoint %s\n", dir.c_str());
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s write ROOT STAGE | fail ROOT STAGE RANK\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  std::string root = argv[2];
  const int stage = std::atoi(argv[3]);
  strata::comm::WorldOptions options;
  options.device = strata::comm::Device::kCpu;
  options.bind = false;
  options.comm.timeout_s = 60.0;
  auto world = strata::comm::join_world(options);
  if (!world.is_ok()) {
    std::fprintf(stderr, "join_world: %s\n", world.status().to_string().c_str());
    strata::comm::abort_world_at_exit(1);
    return 1;
  }
  strata::comm::Comm& comm = *world->comm;
  if (scenario == "fail" && argc > 4 && comm.rank() == std::atoi(argv[4])) root += "/elsewhere";
  Status s = run(comm, root, stage);
  if (s.is_ok()) s = comm.wait_all();
  std::fflush(stdout);
  if (!s.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), s.to_string().c_str());
    std::fflush(stderr);
    return 1;
  }
  return 0;
}

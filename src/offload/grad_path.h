// The gradient path: each unit's gradient leaves the device once, in its final flat layout, and
// is accumulated in fp32 (or bf16, strata.optimizer_state.gradients) in its home tier (or, homed on
// the device with the optimizer, never leaves it: ready(u) adds it into its device home on the
// compute stream, with the same arithmetic).
//   acquire(u)  a device fp32 gradient frame of u's size class, zeroed (the runner accumulates
//               one micro-batch into it; the tied head and the embedding share unit 0's frame);
//   ready(u)    the frame is cast to the storage type (bf16/fp16, as a 16-bit .grad would be),
//               copied device->host into a pinned staging buffer, and the frame is free again
//               once that copy is done;
//   poll()      staged gradients are added into the home: the host accumulator in place, or the
//               NVMe tiles (read-add-write after the first micro-batch, write-behind through
//               fixed buffers). On the last micro-batch each tile's sum of squares is taken right
//               there, so the global norm needs no second pass over the gradients. The engine's
//               progress driver (progress.h) calls it.
// On several ranks, ready(u) first sums the frame over the ranks, in place and asynchronously
// (Sharding::start_grad_reduction: reduce-scatter at ZeRO stage >= 1, so only the rank's shard
// leaves; all-reduce at stage 0); the shard leaves once the reduction is done, while backward goes
// on with the next units.
// The norm is the sum of those tile sums in (unit, tile) order: the same numbers in the same order
// whatever the tiers, hence the same bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "offload/sharding.h"
#include "offload/tier_manager.h"

namespace strata::offload {

class GradPath {
 public:
  // `sharding`: the ranks' collectives (needed when the plan is for more than one rank).
  static Result<std::unique_ptr<GradPath>> create(TierManager& tiers, Sharding* sharding = nullptr);
  ~GradPath();
  GradPath(const GradPath&) = delete;
  GradPath& operator=(const GradPath&) = delete;

  // Starts a micro-batch: `first` makes it overwrite the accumulators, `last` makes its
  // gradients final (their sums of squares are taken). `sequence` numbers the micro-batch over
  // the run (step x accumulation + m): bf16 accumulators round stochastically with bits of
  // (strata.seed, sequence, unit, tile), so a resumed run adds with the same bits.
  void begin_micro_batch(bool first, bool last, std::int64_t sequence = 0);
  // Unit u's device gradient frame, zeroed at the micro-batch's first acquire.
  Result<float*> acquire(int unit);
  // Unit u's gradient for this micro-batch is complete: it leaves the device.
  Status ready(int unit);
  // Accumulates what has arrived, without blocking.
  Status poll();
  // Accumulates everything and waits for every gradient write.
  Status drain();
  // After drain() on the last micro-batch: the sum over units and tiles, in order, of each
  // tile's sum of squares (inf/NaN when any gradient is).
  double sum_squares() const;
  // Milliseconds the compute thread waited here (for a frame or a staging buffer).
  double wait_ms() const { return wait_ms_; }

 private:
  static constexpr int kFree = -1;
  static constexpr int kReducing = -2;  // its gradient is being summed over the ranks
  struct Frame {
    float* data = nullptr;
    void* copy = nullptr;  // storage-type copy (the frame itself for fp32)
    int unit = kFree;
    backend::Event left;  // the device->host copy of its last gradient is done
  };
  struct Job {
    int unit = -1;
    int staging = -1;
    bool first = true;  // of the micro-batch the gradient belongs to
    bool last = true;
    std::int64_t sequence = 0;
    bool device = false;  // homed on the device: added there, no staging buffer
    std::uint64_t begin_us = 0;
    Frame* frame = nullptr;  // several ranks: the frame whose reduction is in flight
    comm::Handle reduction;
  };
  struct Write {
    int buffer = -1;
    int unit = -1;
    std::int64_t tile = 0;
    io::SwapHandle handle;
  };

  GradPath(TierManager& tiers, Sharding* sharding);
  // Copies the job's shard of frame `f` to its staging buffer; the frame is free again after.
  Status send_home(const Job& job, Frame* f);
  // Waits for the job's reduction, then send_home().
  Status finish_reduction(Job& job);
  // Adds the job's shard of frame `f` into its device home (and takes the tile sums on the last
  // micro-batch), on the compute stream.
  void add_on_device(const Job& job, Frame* f);
  Status accumulate(const Job& job);
  Result<int> free_write_buffer();
  Status finish_oldest_job();
  Status finish_oldest_write();
  // Waits for a write of (unit, tile) still in flight, so that a read sees it.
  Status finish_writes_of(int unit, std::int64_t tile);
  Frame* frame_of(int unit);

  TierManager& tiers_;
  Sharding* sharding_ = nullptr;
  backend::Backend& backend_;
  const TierPlan& plan_;
  std::vector<std::vector<Frame>> frames_;  // per size class
  backend::Event computed_;
  std::vector<backend::Event> staged_;  // per staging buffer: its copy is done
  std::vector<std::uint8_t> staging_busy_;
  std::vector<Job> jobs_;  // FIFO, capacity = staging buffers
  std::vector<std::uint8_t> write_busy_;
  std::vector<Write> writes_;           // FIFO, capacity = write buffers
  std::vector<std::size_t> tile_base_;  // per unit: index of its first tile in sums_
  std::vector<double> sums_;            // per (unit, tile)
  bool first_ = true;
  bool last_ = true;
  std::int64_t sequence_ = 0;
  double wait_ms_ = 0.0;
};

}  // namespace strata::offload

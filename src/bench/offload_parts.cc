// Measurements for `strata bench offload` (see offload_bench.h).
#include "bench/offload_parts.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

namespace strata::bench {
namespace {

using offload::SlotKind;
using offload::Tier;

struct Op {
  SlotKind kind;
  int unit;
  std::int64_t tile;
  bool write;
};

// Tiles of `kind` on NVMe, in unit order, starting `offset` tiles in and wrapping, until `bytes`.
void add_ops(const offload::TierManager& tiers, SlotKind kind, std::uint64_t bytes, bool write,
             std::vector<Op>* out) {
  std::vector<Op> tiles;
  const offload::TierPlan& p = tiers.plan();
  for (int u = 0; u < tiers.units(); ++u) {
    if (offload::home_of(p, u, kind) != Tier::kNvme) continue;
    for (std::int64_t t = 0; t < p.units[static_cast<std::size_t>(u)].tiles; ++t)
      tiles.push_back(Op{kind, u, t, write});
  }
  if (tiles.empty()) return;
  // Writes start half way round, so a read and a write of one tile are rarely in flight together.
  std::size_t i = write ? tiles.size() / 2 : 0;
  for (std::uint64_t done = 0; done < bytes; ++i) {
    const Op& op = tiles[i % tiles.size()];
    out->push_back(op);
    done += tiers.tile_bytes(op.kind, op.unit, op.tile);
  }
}

}  // namespace

std::uint64_t IoVolume::reads() const {
  std::uint64_t sum = 0;
  for (std::uint64_t b : read_bytes)
    sum += b;
  return sum;
}

std::uint64_t IoVolume::writes() const {
  std::uint64_t sum = 0;
  for (std::uint64_t b : write_bytes)
    sum += b;
  return sum;
}

IoVolume io_since(const offload::IoCounters& before, const offload::IoCounters& after) {
  IoVolume v;
  for (int k = 0; k < offload::kSlotKinds; ++k) {
    v.read_bytes[k] = after.read_bytes[k] - before.read_bytes[k];
    v.write_bytes[k] = after.write_bytes[k] - before.write_bytes[k];
  }
  return v;
}

Result<double> replay_io(offload::TierManager& tiers, const IoVolume& volume, int in_flight) {
  std::vector<Op> reads, writes, ops;
  for (int k = 0; k < offload::kSlotKinds; ++k) {
    add_ops(tiers, static_cast<SlotKind>(k), volume.read_bytes[k], false, &reads);
    add_ops(tiers, static_cast<SlotKind>(k), volume.write_bytes[k], true, &writes);
  }
  for (std::size_t i = 0; i < std::max(reads.size(), writes.size()); ++i) {
    if (i < reads.size()) ops.push_back(reads[i]);
    if (i < writes.size()) ops.push_back(writes[i]);
  }
  if (ops.empty()) return 0.0;
  // Buffers of the largest tile, on 2 MiB boundaries like the trainer's staging (bench only:
  // outside the host budget).
  const std::uint64_t bytes = static_cast<std::uint64_t>(tiers.plan().largest_tile) * 4;
  std::vector<void*> buffers;
  for (int i = 0; i < in_flight; ++i) {
    void* p = nullptr;
    if (::posix_memalign(&p, 2u << 20, bytes) != 0) {
      for (void* b : buffers)
        std::free(b);
      return Status(ErrorCode::kOutOfMemory, "cannot allocate the I/O replay buffers");
    }
    (void)::madvise(p, bytes, MADV_HUGEPAGE);
    std::memset(p, 0, bytes);
    buffers.push_back(p);
  }
  struct Pending {
    io::SwapHandle handle;
    SlotKind kind;
    int buffer;
  };
  std::deque<Pending> pending;
  std::vector<int> free_buffers;
  for (int i = in_flight - 1; i >= 0; --i)
    free_buffers.push_back(i);
  Status first;
  auto finish_oldest = [&] {
    Pending p = pending.front();
    pending.pop_front();
    Status s = tiers.wait(p.kind, p.handle);
    // The replayed bytes are not the tiles' own (only the time counts): a read that checks a
    // tile rewritten meanwhile is not an error here.
    if (!s.is_ok() && s.code() != ErrorCode::kCorrupt && first.is_ok()) first = s;
    free_buffers.push_back(p.buffer);
  };
  const auto start = std::chrono::steady_clock::now();
  for (const Op& op : ops) {
    if (free_buffers.empty()) finish_oldest();
    const int b = free_buffers.back();
    free_buffers.pop_back();
    auto h = op.write
                 ? tiers.write_tile(op.kind, op.unit, op.tile, buffers[b], io::Priority::kPrefetch)
                 : tiers.read_tile(op.kind, op.unit, op.tile, buffers[b], io::Priority::kPrefetch);
    if (!h.is_ok()) {
      free_buffers.push_back(b);
      if (first.is_ok()) first = h.status();
      break;
    }
    pending.push_back(Pending{*h, op.kind, b});
  }
  while (!pending.empty())
    finish_oldest();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  for (void* b : buffers)
    std::free(b);
  if (!first.is_ok()) return first;
  return ms;
}

Result<double> adam_alone_ms(offload::TierManager& tiers, offload::CpuAdam& adam,
                             const offload::PipelineStep& step) {
  const offload::TierPlan& p = tiers.plan();
  const SlotKind kinds[4] = {SlotKind::kMaster, SlotKind::kExpAvg, SlotKind::kExpAvgSq,
                             SlotKind::kGrad};
  auto stage = [&](int array) {
    return reinterpret_cast<float*>(tiers.pipeline_area() + p.pipeline_offset(0, array));
  };
  const kernels::AdamParams params = optim::adam_params(adam.settings(), step.lr, step.step);
  const kernels::AdamFusion fusion = optim::adam_fusion(step.grad_multiplier);
  double ms = 0.0;
  for (int u = 0; u < tiers.units(); ++u) {
    const offload::UnitPlan& up = p.units[static_cast<std::size_t>(u)];
    if (up.optim_home != Tier::kNvme) continue;
    for (std::int64_t t = 0; t < up.tiles; ++t) {
      for (int a = 0; a < 4; ++a) {
        STRATA_ASSIGN_OR_RETURN(io::SwapHandle h,
                                tiers.read_tile(kinds[a], u, t, stage(a), io::Priority::kDemand));
        STRATA_TRY(tiers.wait(kinds[a], h));
      }
      const std::int64_t n = p.tile_numel(u, t);
      void* out = p.pipeline_copy_out
                      ? static_cast<void*>(stage(4))
                      : static_cast<char*>(tiers.host_param(u)) +
                            static_cast<std::uint64_t>(p.tile_begin(u, t)) * p.storage_bytes;
      kernels::AdamTile tile;
      tile.master = stage(0);
      tile.exp_avg = stage(1);
      tile.exp_avg_sq = stage(2);
      tile.grad = stage(3);
      tile.n = static_cast<std::size_t>(n);
      tile.copy_out = p.storage == kernels::DType::kF32 ? nullptr : out;
      tile.copy_dtype = p.storage;
      const auto start = std::chrono::steady_clock::now();
      adam.update(params, fusion, tile);
      if (p.storage == kernels::DType::kF32)
        std::memcpy(out, stage(0), static_cast<std::size_t>(n) * 4);
      ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
    }
  }
  return ms;
}

}  // namespace strata::bench

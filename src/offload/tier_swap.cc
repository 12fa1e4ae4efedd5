// The tier manager's NVMe tier (see tier_manager.h): the swap folders checked, the swap spaces and
// their extents laid out tile by tile, and the tile reads and writes the engines queue on them.
// The memory tiers, slots and staging areas are in tier_manager.cc.
#include "offload/tier_manager.h"

#include <fmt/format.h>
#include <unistd.h>

#include "common/thread_priority.h"
#include "common/units.h"
#include "io/probe.h"

namespace strata::offload {
namespace {

// Swap operations outstanding at once per swap space (io/swap_space.h): a fixed maximum above
// what the engines keep in flight together (the optimizer pipeline at most 4 per stage, the
// prefetcher 64 reads ahead, whole-slot writes 32, the gradient path its write-behind tiles).
constexpr std::uint32_t kSwapOperationsMax = 512;
// The I/O engine's handles outstanding at once: both swap spaces full, each operation an extent
// and its checksum footer (two engine requests).
constexpr std::uint32_t kSwapSpacesMax = 2;
constexpr std::uint32_t kRequestsPerOperation = 2;
constexpr std::uint32_t kEngineRequestsMax =
    kSwapSpacesMax * kSwapOperationsMax * kRequestsPerOperation;
constexpr const char* kParamKey = "zero_optimization.offload_param.nvme_path";
constexpr const char* kOptimKey = "zero_optimization.offload_optimizer.nvme_path";

}  // namespace

Status TierManager::check_paths() const {
  const SwapSettings& swap = plan_.swap;
  auto check = [](const std::vector<std::string>& dirs, const char* key) -> Status {
    for (const std::string& dir : dirs)
      STRATA_TRY(io::probe_swap_folder(dir, key).status());
    return Status::ok();
  };
  if (plan_.uses(SlotKind::kParam, Tier::kNvme)) STRATA_TRY(check(swap.param_dirs, kParamKey));
  for (SlotKind k : {SlotKind::kMaster, SlotKind::kExpAvg, SlotKind::kExpAvgSq, SlotKind::kGrad}) {
    if (plan_.uses(k, Tier::kNvme)) {
      STRATA_TRY(check(swap.optim_dirs, kOptimKey));
      break;
    }
  }
  return Status::ok();
}

Status TierManager::create_swap(const TierOptions& options) {
  const TierPlan& p = plan_;
  std::uint64_t total = 0;
  for (std::uint64_t b : p.swap_bytes)
    total += b;
  extent_base_.assign(static_cast<std::size_t>(kSlotKinds) * p.units.size() + 1, 0);
  if (total == 0) return Status::ok();
  const SwapSettings& swap = p.swap;
  io::EngineOptions eo = swap.engine;
  eo.requests_max = kEngineRequestsMax;
  {
    // The engine's threads reap completions: above busy compute threads under chrt.
    ServiceThreadPriority service;
    if (options.engine_factory) {
      STRATA_ASSIGN_OR_RETURN(engine_, options.engine_factory(eo));
    } else {
      STRATA_ASSIGN_OR_RETURN(engine_, io::make_engine(eo));
    }
  }
  const bool shared = swap.param_dirs == swap.optim_dirs;
  if (shared) space_of_kind_[0] = 1;
  // Per space: the kinds it holds and their capacities (data + one footer block per tile).
  const std::uint64_t footer = swap.checksum ? 4096 : 0;
  for (int s = 0; s < 2; ++s) {
    io::SwapOptions so;
    so.dirs = s == 0 ? swap.param_dirs : swap.optim_dirs;
    so.tag = options.swap_tag.empty() ? fmt::format("p{}", ::getpid()) : options.swap_tag;
    if (!shared) so.tag += s == 0 ? "-param" : "-optim";
    so.checksums = swap.checksum;
    so.operations_max = kSwapOperationsMax;
    std::vector<int> kinds;
    for (int k = 0; k < kSlotKinds; ++k) {
      if (space_of_kind_[k] != s || p.swap_bytes[k] == 0) continue;
      std::uint64_t capacity = 0;
      for (std::size_t u = 0; u < p.units.size(); ++u) {
        if (home_of(p, static_cast<int>(u), static_cast<SlotKind>(k)) != Tier::kNvme) continue;
        for (std::int64_t t = 0; t < p.units[u].tiles; ++t)
          capacity += tile_bytes(static_cast<SlotKind>(k), static_cast<int>(u), t) + footer;
      }
      so.kinds.push_back({to_string(static_cast<SlotKind>(k)), capacity});
      kinds.push_back(k);
      nvme_bytes_ += capacity;
    }
    if (kinds.empty()) continue;
    const char* key = s == 0 ? kParamKey : kOptimKey;
    if (swap.bytes_max > 0 && nvme_bytes_ > swap.bytes_max) {
      return Status(
          ErrorCode::kConfig,
          fmt::format("the swap files need {} ({} bytes) but strata.nvme_bytes_max is "
                      "{}; raise it or keep more state in host memory",
                      format_bytes(nvme_bytes_), nvme_bytes_, format_bytes(swap.bytes_max)),
          "strata.nvme_bytes_max");
    }
    auto space = io::SwapSpace::create(engine_.get(), so);
    if (!space.is_ok()) return space.status().with_context(key);
    spaces_[s] = std::move(*space);
    // Extents, tile by tile in unit order, so the optimizer streams each file sequentially.
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const auto kind = static_cast<SlotKind>(kinds[i]);
      for (std::size_t u = 0; u < p.units.size(); ++u) {
        if (home_of(p, static_cast<int>(u), kind) != Tier::kNvme) continue;
        for (std::int64_t t = 0; t < p.units[u].tiles; ++t) {
          auto e = spaces_[s]->allocate(static_cast<std::uint32_t>(i),
                                        tile_bytes(kind, static_cast<int>(u), t));
          if (!e.is_ok()) return e.status().with_context(key);
          extents_.push_back(*e);
        }
      }
    }
  }
  // Index: extent_base_[kind * units + unit] = first tile of that slot in extents_.
  std::size_t next = 0;
  for (int s = 0; s < 2; ++s) {
    for (int k = 0; k < kSlotKinds; ++k) {
      if (space_of_kind_[k] != s || p.swap_bytes[k] == 0) continue;
      for (std::size_t u = 0; u < p.units.size(); ++u) {
        extent_base_[static_cast<std::size_t>(k) * p.units.size() + u] = next;
        if (home_of(p, static_cast<int>(u), static_cast<SlotKind>(k)) == Tier::kNvme)
          next += static_cast<std::size_t>(p.units[u].tiles);
      }
    }
  }
  STRATA_ASSERT(next == extents_.size());
  nvme_budget_ = swap.bytes_max;
  return Status::ok();
}

std::size_t TierManager::extent_index(SlotKind kind, int unit, std::int64_t tile) const {
  STRATA_ASSERT(home_of(plan_, unit, kind) == Tier::kNvme);
  STRATA_ASSERT(tile >= 0 && tile < plan_.units[static_cast<std::size_t>(unit)].tiles);
  return extent_base_[static_cast<std::size_t>(kind) * plan_.units.size() +
                      static_cast<std::size_t>(unit)] +
         static_cast<std::size_t>(tile);
}

io::SwapSpace& TierManager::space_of(SlotKind kind) const {
  io::SwapSpace* s = spaces_[space_of_kind_[static_cast<int>(kind)]].get();
  STRATA_ASSERT(s != nullptr);
  return *s;
}

Result<io::SwapHandle> TierManager::read_tile(SlotKind kind, int unit, std::int64_t tile,
                                              void* buffer, io::Priority priority) {
  const io::Extent& e = extents_[extent_index(kind, unit, tile)];
  read_bytes_[static_cast<int>(kind)] += e.length_bytes;
  ++reads_;
  return space_of(kind).read(e, buffer, priority);
}

Result<io::SwapHandle> TierManager::write_tile(SlotKind kind, int unit, std::int64_t tile,
                                               const void* buffer, io::Priority priority) {
  const io::Extent& e = extents_[extent_index(kind, unit, tile)];
  write_bytes_[static_cast<int>(kind)] += e.length_bytes;
  ++writes_;
  return space_of(kind).write(e, buffer, priority);
}

Status TierManager::wait(SlotKind kind, io::SwapHandle handle) {
  return space_of(kind).wait(handle);
}

std::optional<Status> TierManager::poll(SlotKind kind, io::SwapHandle handle) {
  return space_of(kind).poll(handle);
}

std::vector<std::string> TierManager::swap_dirs() const {
  std::vector<std::string> dirs;
  for (const auto& space : spaces_) {
    if (space) {
      for (const std::string& d : space->run_dirs())
        dirs.push_back(d);
    }
  }
  return dirs;
}

}  // namespace strata::offload

// The tier plan (see plan.h).
#include "offload/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "common/units.h"
#include "offload/sharding.h"

namespace strata::offload {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

struct DeviceSums {
  std::uint64_t homes = 0, persistent = 0, frames = 0, compute = 0, grads = 0, apart = 0;
  std::uint64_t state[4] = {0, 0, 0, 0};  // master, exp_avg, exp_avg_sq, grad homed on the device
  std::uint64_t total(std::uint64_t activations) const {
    return homes + persistent + frames + compute + grads + apart + activations + state[0] +
           state[1] + state[2] + state[3];
  }
};

// Elements of optimizer kind k (0 master .. 3 grad) of a unit's shard.
std::int64_t state_numel(const UnitPlan& u, int k) {
  return k == 3 ? u.grad_numel : u.shard_numel;
}

DeviceSums device_sums(const TierPlan& p) {
  DeviceSums s;
  for (const UnitPlan& u : p.units) {
    if (u.param_home == Tier::kDevice && !u.params_in_master)
      s.homes += u64(u.param_numel) * p.storage_bytes;
    if (u.persistent) s.persistent += u64(u.padded_numel) * p.storage_bytes;
    if (u.optim_home == Tier::kDevice) {
      for (int k = 0; k < 4; ++k)
        s.state[k] += u64(state_numel(u, k)) * 4;
    }
  }
  for (const SizeClass& k : p.classes) {
    s.frames += u64(k.param_frames) * u64(k.numel) * p.storage_bytes;
    s.compute += u64(k.compute_slots) * u64(k.numel) * 4;
    s.grads += u64(k.grad_frames) * grad_frame_bytes(p, k);
  }
  s.apart = u64(p.apart_numel) * 4;
  return s;
}

// Adds prefetch frames and a second gradient frame where the budget (and the stage3 limits)
// allow: the gradient frame first (it lets a unit's gradient leave while the next unit's backward
// runs), then one parameter frame at a time round-robin over the classes that want more.
void grow_frames(TierPlan& p, const PrefetchLimits& limits, std::uint64_t activations,
                 std::uint64_t budget) {
  auto fits = [&] { return budget == 0 || device_sums(p).total(activations) <= budget; };
  for (SizeClass& k : p.classes) {
    if (k.units.size() < 2) continue;
    ++k.grad_frames;
    if (!fits()) --k.grad_frames;
  }
  std::vector<int> want(p.classes.size(), 0);
  std::uint64_t live = 0;
  for (std::size_t i = 0; i < p.classes.size(); ++i) {
    const SizeClass& k = p.classes[i];
    live += u64(k.param_frames) * u64(k.numel);
    int members = 0;
    for (int u : k.units) {
      if (p.units[static_cast<std::size_t>(u)].framed &&
          !p.units[static_cast<std::size_t>(u)].persistent)
        ++members;
    }
    if (members <= k.param_frames || limits.bucket_elements == 0) continue;
    const std::int64_t ahead = ceil_div(static_cast<std::int64_t>(limits.bucket_elements), k.numel);
    want[i] = static_cast<int>(std::min<std::int64_t>(members, k.param_frames + ahead));
  }
  for (bool grew = true; grew;) {
    grew = false;
    for (std::size_t i = 0; i < p.classes.size(); ++i) {
      SizeClass& k = p.classes[i];
      if (k.param_frames >= want[i]) continue;
      if (live + u64(k.numel) > std::max<std::uint64_t>(limits.live_elements_max, live)) {
        want[i] = k.param_frames;
        continue;
      }
      ++k.param_frames;
      if (!fits()) {
        --k.param_frames;
        want[i] = k.param_frames;
        continue;
      }
      live += u64(k.numel);
      grew = true;
    }
  }
}

void add_items(TierPlan& p, const PlanInput& in) {
  const char* dtype = kernels::to_string(p.storage);
  auto add = [&p](Tier tier, std::string what, std::uint64_t bytes) {
    if (bytes > 0) p.items.push_back({tier, std::move(what), bytes});
  };
  // Parameters in their homes.
  std::uint64_t param_home[kTierCount] = {0, 0, 0};
  for (const UnitPlan& u : p.units) {
    if (!u.params_in_master)
      param_home[static_cast<int>(u.param_home)] += u64(u.param_numel) * p.storage_bytes;
  }
  const DeviceSums d = device_sums(p);
  add(Tier::kDevice, fmt::format("{} parameters (device home)", dtype), d.homes);
  add(Tier::kHost, fmt::format("{} parameters (host home)", dtype), param_home[1]);
  add(Tier::kNvme, fmt::format("{} parameters (nvme home)", dtype), p.swap_bytes[0]);
  add(Tier::kDevice, "persistent units (below stage3_param_persistence_threshold)", d.persistent);
  add(Tier::kDevice, "parameter frames (units in flight: in use, cached and prefetched)", d.frames);
  add(Tier::kDevice, "fp32 compute copies of 16-bit parameters", d.compute);
  add(Tier::kDevice, "fp32 norm weights and biases, kept apart from the compute copies", d.apart);
  const bool grad_copies = std::any_of(p.classes.begin(), p.classes.end(),
                                       [](const SizeClass& k) { return k.grad_copy; });
  add(Tier::kDevice,
      grad_copies ? fmt::format("gradient frames (fp32, and the {} copy that leaves)", dtype)
                  : std::string("gradient frames (fp32)"),
      d.grads);
  // Optimizer state: one host mapping, each array followed by a 4 KiB stagger; on the device,
  // one allocation per unit and kind.
  const std::string moments = p.state.moments == kernels::MomentFormat::kQ8
                                  ? fmt::format("8bit, absmax per {}", p.state.block)
                                  : std::string(kernels::to_string(p.state.moments));
  const std::string names[4] = {
      fmt::format("{} master weights", kernels::to_string(p.state.master)),
      fmt::format("Adam exp_avg ({})", moments), fmt::format("Adam exp_avg_sq ({})", moments),
      fmt::format("{} accumulated gradients", kernels::to_string(p.state.grad))};
  for (int k = 0; k < 4; ++k) {
    std::uint64_t host = 0;
    for (std::size_t u = 0; u < p.units.size(); ++u) {
      if (p.units[u].optim_home == Tier::kHost)
        host += p.shard_bytes(static_cast<SlotKind>(k + 1), static_cast<int>(u)) + kStaggerBytes;
    }
    add(Tier::kDevice, fmt::format("{} (device home)", names[k]), d.state[k]);
    add(Tier::kHost, fmt::format("{} (host home)", names[k]), host);
    add(Tier::kNvme, fmt::format("{} (nvme home)", names[k]), p.swap_bytes[k + 1]);
  }
  add(Tier::kNvme, "checksum footers (one 4 KiB block per NVMe tile, strata.nvme_checksum)",
      p.swap_footer_bytes);
  // Pinned staging.
  const std::uint64_t slack = kStagingAlignBytes - 4096;
  if (p.param_staging_buffers > 0) {
    add(Tier::kHost,
        fmt::format("parameter staging, pinned ({} buffers x {} elements)", p.param_staging_buffers,
                    p.param_staging_elements),
        u64(p.param_staging_buffers) *
                align_up(u64(p.param_staging_elements) * p.storage_bytes, kStaggerBytes) +
            slack);
  }
  if (p.grad_staging_buffers > 0) {
    add(Tier::kHost,
        fmt::format("gradient staging, pinned ({} x one unit shard, device to host)",
                    p.grad_staging_buffers),
        u64(p.grad_staging_buffers) *
                align_up(u64(p.grad_staging_elements) * p.storage_bytes, kStaggerBytes) +
            slack);
  }
  if (p.pipeline_bytes() > 0) {
    add(Tier::kHost,
        fmt::format("optimizer pipeline, pinned ({} stages x {}{} elements)", p.pipeline_depth,
                    p.pipeline_state ? "4 state arrays + " : "",
                    p.pipeline_copy_out ? fmt::format("a {} copy-out of {}", dtype, p.largest_tile)
                                        : fmt::format("{}", p.largest_tile)),
        p.pipeline_bytes() + slack);
  }
  if (p.grad_write_buffers > 0) {
    add(Tier::kHost,
        fmt::format("gradient write-behind, pinned ({} {} tiles)", p.grad_write_buffers,
                    kernels::to_string(p.state.grad)),
        u64(p.grad_write_buffers) *
                (align_up(p.slot_bytes(SlotKind::kGrad, p.largest_tile), 4096) + kStaggerBytes) +
            slack);
  }
  if (p.unit_scratch) {
    add(Tier::kHost, "unit scratch, pinned (one fp32 unit: initialisation, checkpoints)",
        u64(p.largest_unit) * 4);
  }
  if (p.raw_scratch_bytes > 0) {
    add(Tier::kHost, "state scratch, pinned (one unit's compressed state as stored)",
        p.raw_scratch_bytes);
  }
  add(Tier::kDevice, "activations, logits chunk and backward scratch (the model runner)",
      in.activation_device_bytes);
  add(Tier::kHost, "activation checkpoints, pinned (activation_offload)", in.activation_host_bytes);
}

}  // namespace

std::uint64_t TierPlan::bytes(Tier tier) const {
  std::uint64_t sum = 0;
  for (const PlanItem& item : items) {
    if (item.tier == tier) sum += item.bytes;
  }
  return sum;
}

bool TierPlan::uses(SlotKind kind, Tier tier) const {
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (home_of(*this, static_cast<int>(u), kind) == tier) return true;
  }
  return false;
}

std::int64_t TierPlan::tile_begin(int unit, std::int64_t t) const {
  STRATA_ASSERT(unit >= 0 && static_cast<std::size_t>(unit) < units.size());
  STRATA_ASSERT(t >= 0 && t < units[static_cast<std::size_t>(unit)].tiles);
  return t * tile_elements;
}

std::int64_t TierPlan::tile_numel(int unit, std::int64_t t) const {
  const std::int64_t begin = tile_begin(unit, t);
  return std::min(tile_elements, units[static_cast<std::size_t>(unit)].shard_numel - begin);
}

std::uint64_t TierPlan::slot_bytes(SlotKind kind, std::int64_t n) const {
  switch (kind) {
    case SlotKind::kParam:
      return u64(n) * storage_bytes;
    case SlotKind::kMaster:
      return u64(n) * kernels::dtype_bytes(state.master);
    case SlotKind::kExpAvg:
    case SlotKind::kExpAvgSq:
      return kernels::moment_bytes(state.moments, u64(n)) +
             4 * kernels::absmax_count(state.moments, u64(n), u64(state.block));
    case SlotKind::kGrad:
      return u64(n) * kernels::dtype_bytes(state.grad);
  }
  return 0;
}

std::uint64_t TierPlan::tile_bytes(SlotKind kind, int unit, std::int64_t t) const {
  return align_up(slot_bytes(kind, tile_numel(unit, t)), 4096);
}

std::uint64_t TierPlan::tile_offset(SlotKind kind, int unit, std::int64_t t) const {
  STRATA_ASSERT(t >= 0 && t <= units[static_cast<std::size_t>(unit)].tiles);
  return u64(t) * align_up(slot_bytes(kind, tile_elements), 4096);
}

std::uint64_t TierPlan::shard_bytes(SlotKind kind, int unit) const {
  const std::int64_t tiles = units[static_cast<std::size_t>(unit)].tiles;
  return tile_offset(kind, unit, tiles - 1) + tile_bytes(kind, unit, tiles - 1);
}

std::uint64_t TierPlan::state_bytes(Tier tier, SlotKind kind) const {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < units.size(); ++i) {
    const UnitPlan& u = units[i];
    if (kind == SlotKind::kParam) {
      if (u.param_home == tier && !u.params_in_master) sum += u64(u.param_numel) * storage_bytes;
    } else if (u.optim_home == tier) {
      if (tier == Tier::kDevice) {  // fp32 (device state is never compressed)
        sum += u64(kind == SlotKind::kGrad ? u.grad_numel : u.shard_numel) * 4;
      } else {
        sum += shard_bytes(kind, static_cast<int>(i));
      }
    }
  }
  return sum;
}

std::uint64_t TierPlan::pipeline_offset(int stage, int array) const {
  STRATA_ASSERT(stage >= 0 && stage < pipeline_depth && array >= 0 && array <= 4);
  // Each stage: master, exp_avg, exp_avg_sq, grad (as stored, a whole tile rounded up to 4 KiB
  // so it can be read from NVMe straight into it), each followed by a stagger; then the copy-out.
  std::uint64_t arrays[4] = {0, 0, 0, 0};
  std::uint64_t state_bytes = 0;
  if (pipeline_state) {
    for (int a = 0; a < 4; ++a) {
      arrays[a] =
          align_up(slot_bytes(static_cast<SlotKind>(a + 1), largest_tile), 4096) + kStaggerBytes;
      state_bytes += arrays[a];
    }
  }
  const std::uint64_t copy =
      pipeline_copy_out ? align_up(u64(largest_tile) * storage_bytes, kStaggerBytes) + kStaggerBytes
                        : 0;
  std::uint64_t at = u64(stage) * (state_bytes + copy);
  for (int a = 0; a < array && a < 4; ++a)
    at += arrays[a];
  return at;
}

std::uint64_t TierPlan::pipeline_bytes() const {
  if (!pipeline_state && !pipeline_copy_out) return 0;
  return pipeline_offset(pipeline_depth - 1, 4) +
         (pipeline_copy_out
              ? align_up(u64(largest_tile) * storage_bytes, kStaggerBytes) + kStaggerBytes
              : 0);
}

UnitRanges unit_ranges(const model::UnitLayout& unit) {
  UnitRanges r;
  if (unit.kind == model::UnitKind::kEmbedding) return r;
  bool joined = false;  // the last range may grow: no matrix since it
  for (const model::TensorSlot& t : unit.tensors) {
    if (t.shape.size() == 2) {
      r.weights_begin.push_back(t.offset);
      r.weights_n.push_back(t.numel);
      joined = false;
    } else if (joined) {
      r.n.back() = t.offset + t.numel - r.begin.back();
    } else {
      r.begin.push_back(t.offset);
      r.n.push_back(t.numel);
      joined = true;
    }
  }
  for (const std::int64_t n : r.n) {
    r.at.push_back(r.apart_numel);
    r.apart_numel += ceil_div(n, 4) * 4;
  }
  return r;
}

bool gradient_stays_on_device(const TierPlan& plan, int unit) {
  return plan.units[static_cast<std::size_t>(unit)].optim_home == Tier::kDevice && plan.world == 1;
}

std::uint64_t grad_frame_bytes(const TierPlan& plan, const SizeClass& k) {
  return u64(k.numel) * (4 + (k.grad_copy ? plan.storage_bytes : 0));
}

Tier home_of(const TierPlan& plan, int unit, SlotKind kind) {
  const UnitPlan& u = plan.units[static_cast<std::size_t>(unit)];
  return kind == SlotKind::kParam ? u.param_home : u.optim_home;
}

std::vector<std::string> describe_plan(const TierPlan& p,
                                       const std::vector<std::string>& swap_dirs) {
  std::vector<std::string> lines;
  int param_units[kTierCount] = {0, 0, 0}, optim_units[kTierCount] = {0, 0, 0};
  for (const UnitPlan& u : p.units) {
    ++param_units[static_cast<int>(u.param_home)];
    ++optim_units[static_cast<int>(u.optim_home)];
  }
  auto homes = [](const int* counts) {
    std::string text;
    for (int t = 0; t < kTierCount; ++t) {
      if (counts[t] == 0) continue;
      text += fmt::format("{}{} ({} units)", text.empty() ? "" : ", ",
                          to_string(static_cast<Tier>(t)), counts[t]);
    }
    return text;
  };
  lines.push_back(
      fmt::format("tiers: {} parameters on {}; master, moments and gradients on {}; "
                  "optimizer tiles of {} elements, {} deep",
                  kernels::to_string(p.storage), homes(param_units), homes(optim_units),
                  p.tile_elements, p.pipeline_depth));
  std::string frames;
  for (const SizeClass& k : p.classes) {
    if (k.param_frames == 0) continue;
    frames +=
        fmt::format("{}{} x {} elements", frames.empty() ? "" : ", ", k.param_frames, k.numel);
  }
  if (!frames.empty()) lines.push_back("parameter frames on the device: " + frames);
  if (!swap_dirs.empty()) {
    std::string dirs;
    for (const std::string& d : swap_dirs)
      dirs += (dirs.empty() ? "" : ", ") + d;
    lines.push_back(fmt::format("nvme swap: {} in {}", format_bytes(p.bytes(Tier::kNvme)), dirs));
  }
  for (const std::string& note : p.notes)
    lines.push_back(note);
  return lines;
}

namespace {

TierPlan build_plan(const PlanInput& in) {
  const PlanSettings& z = in.settings;
  STRATA_ASSERT(in.layout != nullptr && in.world >= 1 && in.rank >= 0 && in.rank < in.world);
  STRATA_ASSERT_MSG(z.pipeline_depth >= 3 && z.pipeline_depth <= 16,
                    "the optimizer pipeline is 3 to 16 tiles deep");
  STRATA_ASSERT_MSG(!in.optimizer_only || in.world == 1, "an optimizer-only plan is one process's");
  const model::ModelLayout& layout = *in.layout;
  if (!in.rounding_ids.empty()) {
    std::vector<int> ids = in.rounding_ids;
    std::sort(ids.begin(), ids.end());
    STRATA_ASSERT_MSG(ids.size() == layout.units.size() && ids.front() >= 0 &&
                          std::adjacent_find(ids.begin(), ids.end()) == ids.end(),
                      "one rounding id per unit, 0 or more and distinct");
  }
  const int stage = in.optimizer_only ? 0 : z.zero_stage;
  TierPlan p;
  p.pipeline_depth = z.pipeline_depth;
  p.rank = in.rank;
  p.world = in.world;
  p.zero_stage = stage;
  p.storage = z.storage;
  p.storage_bytes = kernels::dtype_bytes(p.storage);
  p.state = z.state;
  p.rounding_seed = z.rounding_seed;
  p.tile_elements = static_cast<std::int64_t>(
      align_up(std::max<std::uint64_t>(z.tile_elements, 1), model::kUnitPadElements));
  p.prefetch = z.prefetch;
  p.swap = z.swap;

  const Tier param_tier = in.optimizer_only ? Tier::kHost : z.param_tier;
  const Tier optim_tier = z.optim_tier;
  std::int64_t total = 0;
  for (const model::UnitLayout& unit : layout.units)
    total += ceil_div(unit.padded_numel, in.world);
  const double host_optim_elements =
      optim_tier == Tier::kNvme ? (1.0 - z.optim_nvme_fraction) * static_cast<double>(total)
                                : static_cast<double>(total);
  std::int64_t params_before = 0, in_cpu = 0;
  std::map<std::int64_t, int> class_of;  // padded size -> class
  const int head = layout.head_unit(), emb = layout.embedding_unit();
  for (const model::UnitLayout& unit : layout.units) {
    UnitPlan u;
    u.padded_numel = unit.padded_numel;
    u.rounding_id = in.rounding_ids.empty() ? unit.index
                                            : in.rounding_ids[static_cast<std::size_t>(unit.index)];
    const ShardGeometry shard = shard_of(unit.padded_numel, in.rank, in.world, stage);
    u.shard_begin = shard.begin;
    u.shard_numel = shard.numel;
    u.param_numel = shard.param_numel;
    // Gradients leave the device reduce-scattered at every stage >= 1 (docs/multi-gpu.md), so the
    // accumulator only ever holds the shard; at stage 0 the shard is the whole unit.
    u.grad_numel = u.shard_numel;
    u.param_home = param_tier;
    if (param_tier == Tier::kNvme && u64(in_cpu + u.param_numel) <= z.param_host_elements_max) {
      u.param_home = Tier::kHost;
      in_cpu += u.param_numel;
    }
    if (optim_tier == Tier::kDevice) {
      u.optim_home = Tier::kDevice;
    } else {
      u.optim_home =
          optim_tier == Tier::kNvme &&
                  static_cast<double>(params_before + u.shard_numel) > host_optim_elements
              ? Tier::kNvme
              : Tier::kHost;
    }
    params_before += u.shard_numel;
    // Parameters homed beside a master of their own type and extent (host or device; fp32, or
    // bf16 parameters over a bf16 master): one array.
    u.params_in_master = p.storage == p.state.master && u.param_home == u.optim_home &&
                         u.param_home != Tier::kNvme && u.param_numel == u.shard_numel;
    u.framed =
        !in.optimizer_only && (u.param_home != Tier::kDevice || (stage >= 3 && in.world > 1));
    u.persistent = u.framed && u64(unit.padded_numel) < z.persistence_threshold_elements;
    u.tiles = std::max<std::int64_t>(1, ceil_div(u.shard_numel, p.tile_elements));
    auto [it, added] = class_of.emplace(unit.padded_numel, static_cast<int>(p.classes.size()));
    if (added) {
      SizeClass k;
      k.numel = unit.padded_numel;
      p.classes.push_back(k);
    }
    u.size_class = it->second;
    p.classes[static_cast<std::size_t>(u.size_class)].units.push_back(unit.index);
    p.units.push_back(u);
    p.largest_unit = std::max(p.largest_unit, unit.padded_numel);
    p.largest_shard = std::max(p.largest_shard, u.shard_numel);
  }
  p.largest_tile = std::min(p.tile_elements, p.largest_shard);

  // Base counts: what the runner holds at once within a class (the tied head borrows the
  // embedding while both are acquired).
  const bool shared_head_class =
      layout.tied && p.units[static_cast<std::size_t>(head)].size_class ==
                         p.units[static_cast<std::size_t>(emb)].size_class;
  for (std::size_t i = 0; i < p.classes.size(); ++i) {
    SizeClass& k = p.classes[i];
    const bool holds_pair = shared_head_class && static_cast<int>(i) == p.units[0].size_class;
    int framed = 0;
    for (int u : k.units) {
      const UnitPlan& up = p.units[static_cast<std::size_t>(u)];
      if (up.framed && !up.persistent) ++framed;
    }
    k.param_frames_base = framed == 0 ? 0 : std::min(framed, holds_pair ? 2 : 1);
    k.param_frames = k.param_frames_base;
    // The caller's tensors never pass through the device here: no copies or gradient frames.
    k.compute_slots = p.storage_bytes < 4 && !in.optimizer_only ? (holds_pair ? 2 : 1) : 0;
    k.grad_frames_base = in.optimizer_only ? 0 : holds_pair ? 2 : 1;
    k.grad_frames = k.grad_frames_base;
    k.grad_copy = p.storage_bytes < 4 && !std::all_of(k.units.begin(), k.units.end(), [&](int u) {
                    return gradient_stays_on_device(p, u);
                  });
  }
  // The norm weights and biases kept apart from the compute copies (OffloadStore::widen), one
  // area for every unit: a copy's slot is reused while its unit's other tensors stay widened. Not
  // where the device is the host (the CPU backend's products read fp32 copies widened whole).
  if (p.storage_bytes < 4 && !in.optimizer_only && !in.device_is_host) {
    for (std::size_t u = 0; u < p.units.size(); ++u) {
      const UnitRanges r = unit_ranges(layout.units[u]);
      if (r.weights_n.empty() || r.apart_numel == 0) continue;
      p.units[u].apart_offset = p.apart_numel;
      p.apart_numel += r.apart_numel;
    }
  }
  p.device_minimum_bytes = device_sums(p).total(in.activation_device_bytes);
  if (!in.optimizer_only)
    grow_frames(p, z.prefetch, in.activation_device_bytes, in.device_budget_bytes);

  // Pinned host staging.
  std::int64_t largest_nvme_param = 0;
  bool optim_nvme = false, optim_device = false, params_in_host = true;
  for (const UnitPlan& u : p.units) {
    if (u.param_home == Tier::kNvme)
      largest_nvme_param = std::max(largest_nvme_param, u.param_numel);
    if (u.optim_home == Tier::kNvme) optim_nvme = true;
    if (u.optim_home == Tier::kDevice) optim_device = true;
    // Parameters the CPU Adam writes straight into (host homes); device Adam writes its own.
    if (u.param_home != Tier::kHost && u.optim_home != Tier::kDevice) params_in_host = false;
    for (int k = 0; k < kSlotKinds; ++k) {
      const auto kind = static_cast<SlotKind>(k);
      if (home_of(p, static_cast<int>(&u - p.units.data()), kind) != Tier::kNvme) continue;
      const std::int64_t n = kind == SlotKind::kParam  ? u.param_numel
                             : kind == SlotKind::kGrad ? u.grad_numel
                                                       : u.shard_numel;
      STRATA_ASSERT_MSG(n == u.shard_numel, "NVMe homes hold the rank's shard");
      for (std::int64_t t = 0; t < u.tiles; ++t)
        p.swap_bytes[k] += p.tile_bytes(kind, static_cast<int>(&u - p.units.data()), t);
      if (z.swap.checksum) p.swap_footer_bytes += u64(u.tiles) * 4096;
    }
  }
  if (largest_nvme_param > 0) {
    STRATA_ASSERT_MSG(z.param_staging_buffers >= 1, "NVMe-homed parameters need staging buffers");
    p.param_staging_buffers = z.param_staging_buffers;
    p.param_staging_elements = std::max<std::int64_t>(
        static_cast<std::int64_t>(z.param_staging_elements), largest_nvme_param);
  }
  // Gradients leave the device through staging (only the rank's shard), and NVMe-homed ones are
  // written behind; the caller of an optimizer-only plan writes its gradients into their homes.
  bool grads_leave = false;  // some gradient goes home to the host (not device-homed)
  for (const UnitPlan& u : p.units)
    grads_leave = grads_leave || u.optim_home != Tier::kDevice;
  p.grad_staging_buffers = in.optimizer_only || !grads_leave ? 0 : 2;
  p.grad_staging_elements = p.grad_staging_buffers == 0 ? 0 : p.largest_shard;
  p.pipeline_state = optim_nvme;
  p.pipeline_copy_out = !params_in_host;
  p.grad_write_buffers = optim_nvme && !in.optimizer_only ? 2 : 0;
  // Loading, saving and initialising state that is not in host memory goes through it.
  p.unit_scratch = optim_nvme || optim_device || largest_nvme_param > 0 || p.state.compressed();
  if (p.state.compressed()) {
    for (std::size_t u = 0; u < p.units.size(); ++u) {
      for (int k = 1; k < kSlotKinds; ++k) {
        p.raw_scratch_bytes = std::max(
            p.raw_scratch_bytes, p.shard_bytes(static_cast<SlotKind>(k), static_cast<int>(u)));
      }
    }
  }
  add_items(p, in);
  return p;
}

}  // namespace

TierPlan make_plan_unchecked(const PlanInput& in) {
  if (in.settings.optim_tier != Tier::kDevice) return build_plan(in);
  // The optimizer state asked for on the device (offload_optimizer none): there, Adam runs on the
  // device too. Caller-owned parameters and strata.device_optimizer off keep it on the host; auto
  // does so on the CPU backend (CPU Adam then overlaps the next forward) and where the state does
  // not fit the device budget beside the working set.
  PlanInput host = in;
  host.settings.optim_tier = Tier::kHost;
  const DeviceOptimizer mode = in.settings.device_optimizer;
  if (in.optimizer_only || mode == DeviceOptimizer::kOff ||
      (mode == DeviceOptimizer::kAuto && in.device_is_host)) {
    return build_plan(host);
  }
  if (in.settings.state.compressed()) {
    // AdamW on the device keeps fp32 state; compressed state is CPU Adam's.
    TierPlan p = build_plan(host);
    p.notes.push_back(
        "offload_optimizer none with a compressed strata.optimizer_state: the optimizer state "
        "lives in host memory with CPU Adam, which reads and writes the compressed formats");
    return p;
  }
  if (in.settings.param_tier != Tier::kDevice) {
    // Adam writes the new parameters where it runs: with the parameters offloaded it runs on the
    // CPU beside them.
    TierPlan p = build_plan(host);
    p.notes.push_back(
        "offload_optimizer none with offload_param cpu/nvme: the optimizer state lives in host "
        "memory with CPU Adam, beside the parameters it updates");
    return p;
  }
  TierPlan p = build_plan(in);
  if (mode == DeviceOptimizer::kAuto && in.device_budget_bytes > 0 &&
      p.device_minimum_bytes > in.device_budget_bytes) {
    TierPlan fallback = build_plan(host);
    fallback.notes.push_back(fmt::format(
        "offload_optimizer none: the optimizer state ({}) does not fit the device budget {} "
        "beside the working set, so it lives in host memory with CPU Adam (as with "
        "offload_optimizer cpu); strata.device_optimizer on makes this an error instead",
        format_bytes(p.device_minimum_bytes - fallback.device_minimum_bytes),
        format_bytes(in.device_budget_bytes)));
    return fallback;
  }
  return p;
}

Result<TierPlan> make_plan(const PlanInput& in) {
  TierPlan p = make_plan_unchecked(in);
  if (in.device_budget_bytes > 0 && p.device_minimum_bytes > in.device_budget_bytes) {
    return Status(
        ErrorCode::kOutOfMemory,
        fmt::format("the device budget {} ({} bytes) is below this model's minimum "
                    "working set of {} ({} bytes: the runner's activations {}, one "
                    "frame per unit size for parameters and gradients, and the "
                    "parameters and optimizer state kept on the device); raise it to at least "
                    "{}, or offload more (offload_param, offload_optimizer, activation_offload)",
                    format_bytes(in.device_budget_bytes), in.device_budget_bytes,
                    format_bytes(p.device_minimum_bytes), p.device_minimum_bytes,
                    format_bytes(in.activation_device_bytes), format_bytes(p.device_minimum_bytes)),
        "strata.device_bytes_max");
  }
  return p;
}

}  // namespace strata::offload

// The tiered storage manager (see tier_manager.h): the memory tiers, the slots in any home and the
// staging areas; the NVMe tier (swap spaces, extents, tile I/O) is in tier_swap.cc.
#include "offload/tier_manager.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/units.h"
#include "kernels/cpu/cast.h"
#include "offload/slot_codec.h"

namespace strata::offload {
namespace {

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

}  // namespace

TierManager::TierManager(backend::Backend& backend, const model::ModelLayout& layout, TierPlan plan)
    : backend_(backend), layout_(layout), plan_(std::move(plan)) {}

TierManager::~TierManager() {
  for (auto& space : spaces_) {
    if (space) {
      Status closed = space->close();
      if (!closed.is_ok()) STRATA_LOG_WARN("swap space: {}", closed.to_string());
    }
  }
}

Result<std::unique_ptr<TierManager>> TierManager::create(backend::Backend& backend,
                                                         const model::ModelLayout& layout,
                                                         TierPlan plan,
                                                         const TierOptions& options) {
  STRATA_ASSERT(plan.units.size() == layout.units.size());
  std::unique_ptr<TierManager> m(new TierManager(backend, layout, std::move(plan)));
  m->trace_ = options.trace;
  const TierPlan& p = m->plan_;
  // Host budget: everything pinned is fixed, so the check is exact and happens before anything
  // is allocated.
  const backend::MemoryStats host = backend.pinned_memory();
  if (host.bytes_max > 0 && p.bytes(Tier::kHost) > host.bytes_max - host.bytes_in_use) {
    return Status(ErrorCode::kOutOfMemory,
                  fmt::format("the host tier needs {} ({} bytes) of pinned memory for this model "
                              "and config, but the budget is {} ({} already in use); raise "
                              "strata.host_bytes_max or offload to NVMe (offload_param / "
                              "offload_optimizer device \"nvme\", max_in_cpu, buffer_count x "
                              "buffer_size, sub_group_size)",
                              format_bytes(p.bytes(Tier::kHost)), p.bytes(Tier::kHost),
                              format_bytes(host.bytes_max), format_bytes(host.bytes_in_use)),
                  "strata.host_bytes_max");
  }
  STRATA_TRY(m->check_paths());
  STRATA_TRY(m->allocate_device());
  STRATA_TRY(m->allocate_host());
  STRATA_TRY(m->create_swap(options));
  return m;
}

Result<void*> TierManager::pinned(std::uint64_t bytes, std::uint64_t align,
                                  std::string_view purpose) {
  const std::uint64_t slack = align > 4096 ? align - 4096 : 0;
  STRATA_ASSIGN_OR_RETURN(backend::Buffer b, backend_.allocate_pinned(bytes + slack, purpose));
  auto* base = b.as<char>();
  auto* aligned = reinterpret_cast<char*>(align_up(reinterpret_cast<std::uintptr_t>(base), align));
  // A hint: transparent huge pages make a 1 MiB I/O block one DMA segment (docs/io.md) and spare
  // Adam TLB misses; without THP the memory works the same.
  (void)::madvise(base, b.bytes(), MADV_HUGEPAGE);
  buffers_.push_back(std::move(b));
  return static_cast<void*>(aligned);
}

Status TierManager::allocate_device() {
  const TierPlan& p = plan_;
  auto device = [this](std::uint64_t bytes, std::string_view purpose) -> Result<void*> {
    STRATA_ASSIGN_OR_RETURN(backend::Buffer b, backend_.allocate_device(bytes, purpose, 4096));
    void* data = b.data();
    buffers_.push_back(std::move(b));
    return data;
  };
  device_params_.assign(p.units.size(), nullptr);
  device_state_.assign(p.units.size() * 4, nullptr);
  persistent_.assign(p.units.size(), nullptr);
  const char* state_names[4] = {"fp32 master weights (device home)", "Adam exp_avg (device home)",
                                "Adam exp_avg_sq (device home)",
                                "fp32 accumulated gradients (device home)"};
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    const UnitPlan& up = p.units[u];
    if (up.optim_home == Tier::kDevice) {
      // Zeroed, as the host home is: moments start at zero.
      for (int k = 0; k < 4; ++k) {
        const std::int64_t n = k == 3 ? up.grad_numel : up.shard_numel;
        STRATA_ASSIGN_OR_RETURN(void* a, device(u64(n) * 4, state_names[k]));
        backend_.ops_f32().zero(static_cast<float*>(a), n);
        device_state_[u * 4 + static_cast<std::size_t>(k)] = static_cast<float*>(a);
      }
      if (up.params_in_master) device_params_[u] = device_state_[u * 4];
    }
    if (up.param_home == Tier::kDevice && !up.params_in_master) {
      STRATA_ASSIGN_OR_RETURN(device_params_[u],
                              device(u64(up.param_numel) * p.storage_bytes, "parameters"));
    }
    if (up.persistent) {
      STRATA_ASSIGN_OR_RETURN(persistent_[u], device(u64(up.padded_numel) * p.storage_bytes,
                                                     "persistent parameter frame"));
    }
  }
  if (p.apart_numel > 0) {
    STRATA_ASSIGN_OR_RETURN(
        void* a, device(u64(p.apart_numel) * 4, "fp32 norm weights and biases kept apart"));
    apart_ = static_cast<float*>(a);
  }
  frames_.resize(p.classes.size());
  compute_.resize(p.classes.size());
  grads_.resize(p.classes.size());
  for (std::size_t k = 0; k < p.classes.size(); ++k) {
    const SizeClass& c = p.classes[k];
    for (int i = 0; i < c.param_frames; ++i) {
      STRATA_ASSIGN_OR_RETURN(void* f, device(u64(c.numel) * p.storage_bytes, "parameter frames"));
      frames_[k].push_back(f);
    }
    for (int i = 0; i < c.compute_slots; ++i) {
      STRATA_ASSIGN_OR_RETURN(void* f, device(u64(c.numel) * 4, "fp32 parameter copies"));
      compute_[k].push_back(f);
    }
    const std::uint64_t grad_bytes = grad_frame_bytes(p, c);
    for (int i = 0; i < c.grad_frames; ++i) {
      STRATA_ASSIGN_OR_RETURN(void* f, device(grad_bytes, "gradient frames"));
      backend_.ops_f32().zero(static_cast<float*>(f), c.numel);
      grads_[k].push_back(f);
    }
  }
  return backend_.synchronize(backend::StreamKind::kCompute);
}

Status TierManager::allocate_host() {
  const TierPlan& p = plan_;
  host_params_.assign(p.units.size(), nullptr);
  host_state_.assign(p.units.size() * 4, nullptr);
  std::uint64_t param_bytes = 0, state_bytes = 0;
  for (const UnitPlan& u : p.units) {
    if (u.param_home == Tier::kHost && !u.params_in_master)
      param_bytes += u64(u.param_numel) * p.storage_bytes;
  }
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    if (p.units[u].optim_home != Tier::kHost) continue;
    for (int k = 1; k < kSlotKinds; ++k)
      state_bytes += p.shard_bytes(static_cast<SlotKind>(k), static_cast<int>(u)) + kStaggerBytes;
  }
  if (param_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(void* base, pinned(param_bytes, 4096, "parameters (host home)"));
    auto* at = static_cast<char*>(base);
    for (std::size_t u = 0; u < p.units.size(); ++u) {
      if (p.units[u].param_home != Tier::kHost || p.units[u].params_in_master) continue;
      host_params_[u] = at;
      std::memset(at, 0, u64(p.units[u].param_numel) * p.storage_bytes);
      at += u64(p.units[u].param_numel) * p.storage_bytes;
    }
  }
  if (state_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(void* base,
                            pinned(state_bytes, 4096, "master weights and Adam state (host home)"));
    auto* at = static_cast<char*>(base);
    for (std::size_t u = 0; u < p.units.size(); ++u) {
      if (p.units[u].optim_home != Tier::kHost) continue;
      for (int k = 0; k < 4; ++k) {
        const std::uint64_t bytes =
            p.shard_bytes(static_cast<SlotKind>(k + 1), static_cast<int>(u));
        host_state_[u * 4 + static_cast<std::size_t>(k)] = at;
        std::memset(at, 0, bytes);
        at += bytes + kStaggerBytes;
      }
      if (p.units[u].params_in_master) host_params_[u] = host_state_[u * 4];
    }
  }
  for (int i = 0; i < p.param_staging_buffers; ++i) {
    // One area for all buffers (the plan counts one alignment slack).
    if (i == 0) {
      const std::uint64_t each = align_up(u64(p.param_staging_elements) * p.storage_bytes, 4096);
      STRATA_ASSIGN_OR_RETURN(void* base, pinned(each * u64(p.param_staging_buffers),
                                                 kStagingAlignBytes, "parameter staging"));
      for (int j = 0; j < p.param_staging_buffers; ++j)
        param_staging_.push_back(static_cast<char*>(base) + each * u64(j));
    }
  }
  if (p.grad_staging_buffers > 0) {
    const std::uint64_t each = align_up(u64(p.grad_staging_elements) * p.storage_bytes, 4096);
    STRATA_ASSIGN_OR_RETURN(void* base, pinned(each * u64(p.grad_staging_buffers),
                                               kStagingAlignBytes, "gradient staging"));
    for (int j = 0; j < p.grad_staging_buffers; ++j)
      grad_staging_.push_back(static_cast<char*>(base) + each * u64(j));
  }
  if (p.pipeline_bytes() > 0) {
    STRATA_ASSIGN_OR_RETURN(void* base,
                            pinned(p.pipeline_bytes(), kStagingAlignBytes, "optimizer pipeline"));
    pipeline_ = static_cast<char*>(base);
  }
  if (p.grad_write_buffers > 0) {
    const std::uint64_t each =
        align_up(p.slot_bytes(SlotKind::kGrad, p.largest_tile), 4096) + kStaggerBytes;
    STRATA_ASSIGN_OR_RETURN(void* base, pinned(each * u64(p.grad_write_buffers), kStagingAlignBytes,
                                               "gradient write-behind"));
    for (int j = 0; j < p.grad_write_buffers; ++j)
      grad_write_.push_back(static_cast<char*>(base) + each * u64(j));
  }
  if (p.unit_scratch) {
    STRATA_ASSIGN_OR_RETURN(void* base, pinned(u64(p.largest_unit) * 4, 4096, "unit scratch"));
    unit_scratch_ = static_cast<float*>(base);
  }
  if (p.raw_scratch_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(raw_scratch_, pinned(p.raw_scratch_bytes, 4096, "state scratch"));
  }
  return Status::ok();
}

std::uint64_t TierManager::tile_bytes(SlotKind kind, int unit, std::int64_t tile) const {
  return plan_.tile_bytes(kind, unit, tile);
}

void* TierManager::host_slot(int unit, SlotKind kind) const {
  STRATA_ASSERT(kind != SlotKind::kParam);
  char* p = host_state_[static_cast<std::size_t>(unit) * 4 + static_cast<std::size_t>(kind) - 1];
  STRATA_ASSERT_MSG(p != nullptr, "host_slot of a slot not homed on the host");
  return p;
}

float* TierManager::host_state(int unit, SlotKind kind) const {
  STRATA_ASSERT_MSG(stored_as_fp32(plan_, kind), "host_state of a slot not stored as fp32");
  return static_cast<float*>(host_slot(unit, kind));
}

void* TierManager::host_param(int unit) const {
  void* p = host_params_[static_cast<std::size_t>(unit)];
  STRATA_ASSERT_MSG(p != nullptr, "host_param of a unit not homed on the host");
  return p;
}

float* TierManager::device_state(int unit, SlotKind kind) const {
  STRATA_ASSERT(kind != SlotKind::kParam);
  float* p = device_state_[static_cast<std::size_t>(unit) * 4 + static_cast<std::size_t>(kind) - 1];
  STRATA_ASSERT_MSG(p != nullptr,
                    "device_state of a unit whose optimizer state is not on the device");
  return p;
}

void* TierManager::device_param(int unit) const {
  void* p = device_params_[static_cast<std::size_t>(unit)];
  STRATA_ASSERT_MSG(p != nullptr, "device_param of a unit not homed on the device");
  return p;
}

Status TierManager::read_slot(SlotKind kind, int unit, void* dst) {
  STRATA_ASSERT(kind != SlotKind::kParam);
  const UnitPlan& u = plan_.units[static_cast<std::size_t>(unit)];
  const std::uint64_t bytes = plan_.shard_bytes(kind, unit);
  if (u.optim_home == Tier::kHost) {
    std::memcpy(dst, host_slot(unit, kind), bytes);
    return Status::ok();
  }
  if (u.optim_home == Tier::kDevice) {
    // On the compute stream, after the kernels (Adam) that wrote it.
    STRATA_TRY(
        backend_.copy_async(backend::StreamKind::kCompute, dst, device_state(unit, kind), bytes));
    return backend_.synchronize(backend::StreamKind::kCompute);
  }
  STRATA_ASSERT_MSG(reinterpret_cast<std::uintptr_t>(dst) % 4096 == 0,
                    "read_slot from NVMe needs a 4 KiB-aligned destination");
  for (std::int64_t t = 0; t < u.tiles; ++t) {
    char* at = static_cast<char*>(dst) + plan_.tile_offset(kind, unit, t);
    STRATA_ASSIGN_OR_RETURN(io::SwapHandle h, read_tile(kind, unit, t, at, io::Priority::kDemand));
    STRATA_TRY(wait(kind, h));
  }
  return Status::ok();
}

Status TierManager::write_slot(SlotKind kind, int unit, const void* src) {
  STRATA_ASSERT(kind != SlotKind::kParam);
  const UnitPlan& u = plan_.units[static_cast<std::size_t>(unit)];
  const std::uint64_t bytes = plan_.shard_bytes(kind, unit);
  if (u.optim_home == Tier::kHost) {
    if (src != host_slot(unit, kind)) std::memcpy(host_slot(unit, kind), src, bytes);
    return Status::ok();
  }
  if (u.optim_home == Tier::kDevice) {
    STRATA_TRY(
        backend_.copy_async(backend::StreamKind::kCompute, device_state(unit, kind), src, bytes));
    return backend_.synchronize(backend::StreamKind::kCompute);
  }
  STRATA_ASSERT_MSG(reinterpret_cast<std::uintptr_t>(src) % 4096 == 0,
                    "write_slot to NVMe needs a 4 KiB-aligned source");
  // Up to 32 tiles in flight, then in order.
  constexpr std::int64_t kInFlight = 32;
  io::SwapHandle handles[kInFlight];
  Status first_error;
  for (std::int64_t t = 0; t < u.tiles; ++t) {
    if (t >= kInFlight) {
      Status s = wait(kind, handles[t % kInFlight]);
      if (!s.is_ok() && first_error.is_ok()) first_error = s;
    }
    const char* at = static_cast<const char*>(src) + plan_.tile_offset(kind, unit, t);
    auto h = write_tile(kind, unit, t, at, io::Priority::kDemand);
    if (!h.is_ok()) {
      for (std::int64_t w = std::max<std::int64_t>(0, t - kInFlight + 1); w < t; ++w)
        (void)wait(kind, handles[w % kInFlight]);
      return h.status();
    }
    handles[t % kInFlight] = *h;
  }
  for (std::int64_t w = std::max<std::int64_t>(0, u.tiles - kInFlight); w < u.tiles; ++w) {
    Status s = wait(kind, handles[w % kInFlight]);
    if (!s.is_ok() && first_error.is_ok()) first_error = s;
  }
  return first_error;
}

Status TierManager::refresh_params(int unit) {
  const UnitPlan& u = plan_.units[static_cast<std::size_t>(unit)];
  if (u.params_in_master) return Status::ok();  // the master array is the parameters' home
  const std::uint64_t c = plan_.storage_bytes;
  if (u.optim_home == Tier::kDevice) {
    // Both on the device (the plan keeps the optimizer there only beside device parameters):
    // the same rounding as the host's cast, on the compute stream.
    STRATA_ASSERT(u.param_home == Tier::kDevice);
    float* master = device_state(unit, SlotKind::kMaster);
    char* dst = static_cast<char*>(device_param(unit)) + u64(u.param_shard_offset()) * c;
    if (plan_.storage == kernels::DType::kF32) {
      backend_.ops_f32().copy(reinterpret_cast<float*>(dst), master, u.shard_numel);
    } else {
      backend_.ops_f32().cast_to(dst, plan_.storage, master, u.shard_numel);
    }
    return backend_.synchronize(backend::StreamKind::kCompute);
  }
  // The master as stored (fp32 or bf16; its tiles lie one after the other).
  const char* master = nullptr;
  if (u.optim_home == Tier::kHost) {
    master = static_cast<const char*>(host_slot(unit, SlotKind::kMaster));
  } else {
    void* scratch = raw_scratch_ != nullptr ? raw_scratch_ : unit_scratch_;
    STRATA_TRY(read_slot(SlotKind::kMaster, unit, scratch));
    master = static_cast<const char*>(scratch);
  }
  const kernels::DType master_type = plan_.state.master;
  for (std::int64_t t = 0; t < u.tiles; ++t) {
    const std::int64_t begin = plan_.tile_begin(unit, t), n = plan_.tile_numel(unit, t);
    void* dst = u.param_home == Tier::kHost
                    ? static_cast<char*>(host_param(unit)) + u64(u.param_shard_offset() + begin) * c
                    : static_cast<void*>(pipeline_ + plan_.pipeline_offset(0, 4));
    const char* src = master + plan_.tile_offset(SlotKind::kMaster, unit, t);
    if (dst != src) kernels::cast_array(dst, plan_.storage, src, master_type, n);
    if (u.param_home == Tier::kDevice) {
      STRATA_TRY(backend_.copy_async(
          backend::StreamKind::kHostToDevice,
          static_cast<char*>(device_param(unit)) + u64(u.param_shard_offset() + begin) * c, dst,
          u64(n) * c));
      STRATA_TRY(backend_.synchronize(backend::StreamKind::kHostToDevice));
    } else if (u.param_home == Tier::kNvme) {
      STRATA_ASSIGN_OR_RETURN(io::SwapHandle h,
                              write_tile(SlotKind::kParam, unit, t, dst, io::Priority::kDemand));
      STRATA_TRY(wait(SlotKind::kParam, h));
    }
  }
  return Status::ok();
}

void* TierManager::param_staging(int i) const {
  return param_staging_[static_cast<std::size_t>(i)];
}
void* TierManager::grad_staging(int i) const {
  return grad_staging_[static_cast<std::size_t>(i)];
}
void* TierManager::grad_write_buffer(int i) const {
  return grad_write_[static_cast<std::size_t>(i)];
}
void* TierManager::param_frame(int size_class, int i) const {
  return frames_[static_cast<std::size_t>(size_class)][static_cast<std::size_t>(i)];
}
void* TierManager::persistent_frame(int unit) const {
  void* p = persistent_[static_cast<std::size_t>(unit)];
  STRATA_ASSERT(p != nullptr);
  return p;
}
float* TierManager::compute_slot(int size_class, int i) const {
  return static_cast<float*>(
      compute_[static_cast<std::size_t>(size_class)][static_cast<std::size_t>(i)]);
}
float* TierManager::kept_apart(int unit) const {
  const std::int64_t at = plan_.units[static_cast<std::size_t>(unit)].apart_offset;
  return at < 0 || apart_ == nullptr ? nullptr : apart_ + at;
}
float* TierManager::grad_frame(int size_class, int i) const {
  return static_cast<float*>(
      grads_[static_cast<std::size_t>(size_class)][static_cast<std::size_t>(i)]);
}
void* TierManager::grad_frame_copy(int size_class, int i) const {
  float* f = grad_frame(size_class, i);
  if (plan_.storage_bytes == 4) return f;
  const SizeClass& k = plan_.classes[static_cast<std::size_t>(size_class)];
  return k.grad_copy ? static_cast<void*>(f + k.numel) : nullptr;
}

IoCounters TierManager::io_counters() const {
  IoCounters c;
  for (int k = 0; k < kSlotKinds; ++k) {
    c.read_bytes[k] = read_bytes_[k].load();
    c.write_bytes[k] = write_bytes_[k].load();
  }
  c.reads = reads_.load();
  c.writes = writes_.load();
  return c;
}

TierUsage TierManager::usage() const {
  TierUsage u;
  const backend::MemoryStats d = backend_.device_memory();
  const backend::MemoryStats h = backend_.pinned_memory();
  u.bytes_in_use[0] = d.bytes_in_use;
  u.bytes_peak[0] = d.bytes_peak;
  u.bytes_max[0] = d.bytes_max;
  u.bytes_in_use[1] = h.bytes_in_use;
  u.bytes_peak[1] = h.bytes_peak;
  u.bytes_max[1] = h.bytes_max;
  u.bytes_in_use[2] = nvme_bytes_;
  u.bytes_peak[2] = nvme_bytes_;
  u.bytes_max[2] = nvme_budget_;
  return u;
}

}  // namespace strata::offload

// The gradient path (see grad_path.h).
#include "offload/grad_path.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "common/fault_points.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/nn_ops.h"
#include "kernels/cpu/state_codec.h"

namespace strata::offload {
namespace {

std::uint64_t u64(std::int64_t v) {
  return static_cast<std::uint64_t>(v);
}

}  // namespace

GradPath::GradPath(TierManager& tiers, Sharding* sharding)
    : tiers_(tiers), sharding_(sharding), backend_(tiers.backend()), plan_(tiers.plan()) {}

GradPath::~GradPath() {
  (void)drain();
  for (auto& pool : frames_) {
    for (Frame& f : pool) {
      if (f.left.valid()) backend_.destroy_event(f.left);
    }
  }
  for (backend::Event e : staged_) {
    if (e.valid()) backend_.destroy_event(e);
  }
  if (computed_.valid()) backend_.destroy_event(computed_);
}

Result<std::unique_ptr<GradPath>> GradPath::create(TierManager& tiers, Sharding* sharding) {
  const TierPlan& p = tiers.plan();
  std::unique_ptr<GradPath> g(new GradPath(tiers, sharding));
  backend::Backend& b = tiers.backend();
  g->frames_.resize(p.classes.size());
  for (std::size_t k = 0; k < p.classes.size(); ++k) {
    for (int i = 0; i < p.classes[k].grad_frames; ++i) {
      Frame f;
      f.data = tiers.grad_frame(static_cast<int>(k), i);
      f.copy = tiers.grad_frame_copy(static_cast<int>(k), i);
      STRATA_ASSIGN_OR_RETURN(f.left, b.create_event());
      g->frames_[k].push_back(f);
    }
  }
  STRATA_ASSIGN_OR_RETURN(g->computed_, b.create_event());
  for (int i = 0; i < p.grad_staging_buffers; ++i) {
    STRATA_ASSIGN_OR_RETURN(backend::Event e, b.create_event());
    g->staged_.push_back(e);
  }
  g->staging_busy_.assign(static_cast<std::size_t>(p.grad_staging_buffers), 0);
  // In flight at once: a job per staging buffer, and per frame a reduction (several ranks).
  std::size_t frames = 0;
  for (const SizeClass& k : p.classes)
    frames += static_cast<std::size_t>(k.grad_frames);
  g->jobs_.reserve(static_cast<std::size_t>(p.grad_staging_buffers) + frames);
  g->write_busy_.assign(static_cast<std::size_t>(p.grad_write_buffers), 0);
  g->writes_.reserve(static_cast<std::size_t>(p.grad_write_buffers));
  std::size_t tiles = 0;
  for (const UnitPlan& u : p.units) {
    g->tile_base_.push_back(tiles);
    tiles += static_cast<std::size_t>(u.tiles);
  }
  g->tile_base_.push_back(tiles);
  g->sums_.assign(tiles, 0.0);
  return g;
}

void GradPath::begin_micro_batch(bool first, bool last, std::int64_t sequence) {
  first_ = first;
  last_ = last;
  sequence_ = sequence;
}

GradPath::Frame* GradPath::frame_of(int unit) {
  const int k = plan_.units[static_cast<std::size_t>(unit)].size_class;
  for (Frame& f : frames_[static_cast<std::size_t>(k)]) {
    if (f.unit == unit) return &f;
  }
  return nullptr;
}

Result<float*> GradPath::acquire(int unit) {
  if (Frame* f = frame_of(unit)) return f->data;
  const int k = plan_.units[static_cast<std::size_t>(unit)].size_class;
  Frame* pick = nullptr;
  for (;;) {
    for (Frame& f : frames_[static_cast<std::size_t>(k)]) {
      if (f.unit != kFree) continue;
      if (pick == nullptr || backend_.query(f.left)) pick = &f;
      if (backend_.query(f.left)) break;
    }
    if (pick != nullptr) break;
    // Frames held by reductions in flight come free once their shard has left.
    auto reducing =
        std::find_if(jobs_.begin(), jobs_.end(), [](const Job& j) { return j.frame != nullptr; });
    if (reducing == jobs_.end()) break;
    const auto start = std::chrono::steady_clock::now();
    STRATA_TRY(finish_reduction(*reducing));
    wait_ms_ += ms_since(start);
  }
  if (pick == nullptr) {
    return Status(ErrorCode::kInternal,
                  fmt::format("no gradient frame for unit {}: all are in use",
                              tiers_.layout().units[static_cast<std::size_t>(unit)].name));
  }
  if (!backend_.query(pick->left)) {
    const auto start = std::chrono::steady_clock::now();
    STRATA_TRY(backend_.wait(backend::StreamKind::kCompute, pick->left));
    wait_ms_ += ms_since(start);
  }
  pick->unit = unit;
  backend_.ops_f32().zero(pick->data, plan_.units[static_cast<std::size_t>(unit)].padded_numel);
  return pick->data;
}

Status GradPath::ready(int unit) {
  Frame* f = frame_of(unit);
  STRATA_ASSERT_MSG(f != nullptr, "grads_ready of a unit without a gradient frame");
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(unit)];
  const std::int64_t n = up.padded_numel;
  // A gradient homed on the device never leaves it (offload_optimizer none): on one rank it is
  // added into its home at once, in stream order, rounded as it would have left (add_on_device).
  const bool device = up.optim_home == Tier::kDevice;
  const bool stays = gradient_stays_on_device(plan_, unit);
  // The gradient leaves the device in the parameters' type, as a 16-bit .grad would. On one rank
  // a backend that can round it on the copy stream does, right before the copy, beside the next
  // unit's backward (narrow_async); otherwise it is rounded here, on the compute stream.
  const bool leaves_16 = plan_.storage != kernels::DType::kF32 && !stays;
  const bool narrow_on_copy = leaves_16 && plan_.world == 1 && backend_.narrows_on_copy_streams();
  if (leaves_16 && !narrow_on_copy) backend_.ops_f32().cast_to(f->copy, plan_.storage, f->data, n);
  if (stays) {
    Job job;
    job.unit = unit;
    job.first = first_;
    job.sequence = sequence_;
    job.last = last_;
    job.device = true;
    return send_home(job, f);
  }
  int staging = -1;
  while (!device) {
    for (std::size_t i = 0; i < staging_busy_.size(); ++i) {
      if (!staging_busy_[i]) {
        staging = static_cast<int>(i);
        break;
      }
    }
    if (staging >= 0) break;
    const auto start = std::chrono::steady_clock::now();
    STRATA_TRY(finish_oldest_job());
    wait_ms_ += ms_since(start);
  }
  if (staging >= 0) staging_busy_[static_cast<std::size_t>(staging)] = 1;
  STRATA_TRY(backend_.record(computed_, backend::StreamKind::kCompute));
  Trace* trace = tiers_.trace();
  Job job;
  job.unit = unit;
  job.staging = staging;
  job.first = first_;
  job.sequence = sequence_;
  job.last = last_;
  job.device = device;
  job.begin_us = trace ? trace->now_us() : 0;
  if (plan_.world > 1) {
    STRATA_ASSERT_MSG(sharding_ != nullptr, "gradients on several ranks need their Sharding");
    // Sum the ranks' gradients before they leave (the host waits for the kernels first: the
    // collective reads the frame). The frame stays taken until the reduction is done and its
    // shard has left (finish_reduction()).
    STRATA_TRY(backend_.synchronize(computed_));
    STRATA_ASSIGN_OR_RETURN(job.reduction, sharding_->start_grad_reduction(unit, f->copy));
    job.frame = f;
    f->unit = kReducing;
    jobs_.push_back(job);
    return Status::ok();
  }
  // The copy reads what the backward's kernels and the rounding write.
  if (!planted_race("grad.d2h_waits_for_compute")) {
    STRATA_TRY(backend_.wait(backend::StreamKind::kDeviceToHost, computed_));
  }
  if (narrow_on_copy) {
    STRATA_TRY(backend_.narrow_async(backend::StreamKind::kDeviceToHost, f->copy, plan_.storage,
                                     f->data, n));
  }
  STRATA_TRY(send_home(job, f));
  jobs_.push_back(job);
  return Status::ok();
}

Status GradPath::send_home(const Job& job, Frame* f) {
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(job.unit)];
  if (job.device) {
    add_on_device(job, f);
    f->unit = kFree;  // the next unit's zeroing comes after these ops on the same stream
    return Status::ok();
  }
  // Only this rank's shard leaves the device (the whole unit on one rank, or at stage 0).
  STRATA_TRY(backend_.copy_async(
      backend::StreamKind::kDeviceToHost, tiers_.grad_staging(job.staging),
      static_cast<const char*>(f->copy) + u64(up.shard_begin) * plan_.storage_bytes,
      u64(up.shard_numel) * plan_.storage_bytes));
  STRATA_TRY(backend_.record(f->left, backend::StreamKind::kDeviceToHost));
  STRATA_TRY(backend_.record(staged_[static_cast<std::size_t>(job.staging)],
                             backend::StreamKind::kDeviceToHost));
  f->unit = kFree;
  return Status::ok();
}

void GradPath::add_on_device(const Job& job, Frame* f) {
  // The same arithmetic as the host's accumulate(): the shard rounded to the storage type (as it
  // would have left the device), then assigned or added in fp32; on the last micro-batch each
  // tile's sum of squares, in the same fixed order. On the CPU backend the kernels are the host's
  // own, so the bits are the same whatever the tier.
  const int u = job.unit;
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(u)];
  backend::Ops<float>& ops = backend_.ops_f32();
  float* acc = tiers_.device_state(u, SlotKind::kGrad);
  float* shard = f->data + up.shard_begin;
  if (plan_.storage != kernels::DType::kF32 && plan_.world == 1) {
    // One pass: the fp32 gradient rounded to the storage type and added (ready() left the 16-bit
    // copy unwritten).
    ops.add_rounded(acc, shard, plan_.storage, up.shard_numel, job.first);
  } else {
    if (plan_.storage != kernels::DType::kF32) {
      // The ranks' sum, reduced in the storage type in the frame's 16-bit copy.
      ops.cast_from(shard,
                    static_cast<const char*>(f->copy) + u64(up.shard_begin) * plan_.storage_bytes,
                    plan_.storage, up.shard_numel);
    }
    if (job.first) {
      ops.copy(acc, shard, up.shard_numel);
    } else {
      ops.add(acc, acc, shard, up.shard_numel);
    }
  }
  if (!job.last) return;
  const std::size_t base = tile_base_[static_cast<std::size_t>(u)];
  for (std::int64_t t = 0; t < up.tiles; ++t) {
    sums_[base + static_cast<std::size_t>(t)] =
        ops.sum_squares(acc + plan_.tile_begin(u, t), plan_.tile_numel(u, t));
  }
}

Status GradPath::finish_reduction(Job& job) {
  STRATA_ASSERT(job.frame != nullptr);
  STRATA_TRY(sharding_->wait(job.reduction, "reducing the gradient", job.unit));
  Frame* f = job.frame;
  job.frame = nullptr;
  return send_home(job, f);
}

Result<int> GradPath::free_write_buffer() {
  for (;;) {
    // Reap finished writes first, in order.
    while (!writes_.empty()) {
      std::optional<Status> done = tiers_.poll(SlotKind::kGrad, writes_.front().handle);
      if (!done.has_value()) break;
      write_busy_[static_cast<std::size_t>(writes_.front().buffer)] = 0;
      writes_.erase(writes_.begin());
      STRATA_TRY(*done);
    }
    for (std::size_t i = 0; i < write_busy_.size(); ++i) {
      if (!write_busy_[i]) return static_cast<int>(i);
    }
    STRATA_TRY(finish_oldest_write());
  }
}

Status GradPath::finish_oldest_write() {
  STRATA_ASSERT(!writes_.empty());
  Write w = writes_.front();
  writes_.erase(writes_.begin());
  write_busy_[static_cast<std::size_t>(w.buffer)] = 0;
  return tiers_.wait(SlotKind::kGrad, w.handle)
      .with_context(fmt::format("writing the gradient of {}",
                                tiers_.layout().units[static_cast<std::size_t>(w.unit)].name));
}

Status GradPath::finish_writes_of(int unit, std::int64_t tile) {
  for (std::size_t i = writes_.size(); i-- > 0;) {
    if (writes_[i].unit != unit || writes_[i].tile != tile) continue;
    // Writes complete in order of submission here: finish everything up to this one.
    for (std::size_t j = 0; j <= i; ++j)
      STRATA_TRY(finish_oldest_write());
    return Status::ok();
  }
  return Status::ok();
}

Status GradPath::accumulate(const Job& job) {
  const int u = job.unit;
  const UnitPlan& up = plan_.units[static_cast<std::size_t>(u)];
  const auto* staging = static_cast<const char*>(tiers_.grad_staging(job.staging));
  Trace* trace = tiers_.trace();
  if (trace) {
    trace->add(TraceLane::kDeviceToHost, "grad to host", job.begin_us, trace->now_us(), u,
               u64(up.shard_numel) * plan_.storage_bytes);
  }
  TraceScope scope(trace, TraceLane::kAdam, "grad accumulate", u);
  const std::size_t base = tile_base_[static_cast<std::size_t>(u)];
  const bool bf16 = plan_.state.grad == kernels::DType::kBF16;
  for (std::int64_t t = 0; t < up.tiles; ++t) {
    const std::int64_t b = plan_.tile_begin(u, t), n = plan_.tile_numel(u, t);
    const char* src = staging + u64(b) * plan_.storage_bytes;
    void* acc = nullptr;  // the tile's accumulator as stored
    int buffer = -1;
    if (up.optim_home == Tier::kHost) {
      acc = static_cast<char*>(tiers_.host_slot(u, SlotKind::kGrad)) +
            plan_.tile_offset(SlotKind::kGrad, u, t);
    } else {
      STRATA_ASSIGN_OR_RETURN(buffer, free_write_buffer());
      acc = tiers_.grad_write_buffer(buffer);
      if (!job.first) {
        STRATA_TRY(finish_writes_of(u, t));
        STRATA_ASSIGN_OR_RETURN(
            io::SwapHandle h, tiers_.read_tile(SlotKind::kGrad, u, t, acc, io::Priority::kDemand));
        STRATA_TRY(tiers_.wait(SlotKind::kGrad, h));
      }
    }
    double squares = 0.0;
    if (bf16) {
      const std::uint32_t key =
          job.first ? 0U : kernels::rounding_key(plan_.rounding_seed, job.sequence, up.rounding_id);
      squares = kernels::accumulate_bf16(static_cast<std::uint16_t*>(acc), src, plan_.storage,
                                         static_cast<std::size_t>(n), job.first, key,
                                         static_cast<std::uint32_t>(up.shard_begin + b), job.last);
    } else {
      auto* acc32 = static_cast<float*>(acc);
      kernels::accumulate_from(acc32, src, plan_.storage, n, job.first);
      if (job.last) squares = kernels::sum_squares(acc32, n);
    }
    if (job.last) sums_[base + static_cast<std::size_t>(t)] = squares;
    if (buffer >= 0) {
      STRATA_ASSIGN_OR_RETURN(
          io::SwapHandle h, tiers_.write_tile(SlotKind::kGrad, u, t, acc, io::Priority::kPrefetch));
      write_busy_[static_cast<std::size_t>(buffer)] = 1;
      writes_.push_back(Write{buffer, u, t, h});
    }
  }
  return Status::ok();
}

Status GradPath::finish_oldest_job() {
  STRATA_ASSERT(!jobs_.empty());
  if (jobs_.front().frame != nullptr) STRATA_TRY(finish_reduction(jobs_.front()));
  if (jobs_.front().device) {  // added into its device home by finish_reduction
    jobs_.erase(jobs_.begin());
    return Status::ok();
  }
  const Job job = jobs_.front();
  STRATA_TRY(backend_.synchronize(staged_[static_cast<std::size_t>(job.staging)]));
  jobs_.erase(jobs_.begin());
  Status s = accumulate(job);
  staging_busy_[static_cast<std::size_t>(job.staging)] = 0;
  return s;
}

Status GradPath::poll() {
  // Reductions complete in issue order: send home the shards of those that have.
  for (Job& job : jobs_) {
    if (job.frame == nullptr) continue;
    STRATA_ASSIGN_OR_RETURN(bool done, sharding_->comm()->test(job.reduction));
    if (!done) break;
    STRATA_TRY(finish_reduction(job));
  }
  while (!jobs_.empty() && jobs_.front().frame == nullptr &&
         (jobs_.front().device ||
          backend_.query(staged_[static_cast<std::size_t>(jobs_.front().staging)])))
    STRATA_TRY(finish_oldest_job());
  return Status::ok();
}

Status GradPath::drain() {
  Status first;
  while (!jobs_.empty()) {
    Status s = finish_oldest_job();
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  while (!writes_.empty()) {
    Status s = finish_oldest_write();
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  return first;
}

double GradPath::sum_squares() const {
  double total = 0.0;
  for (double s : sums_)
    total += s;
  return total;
}

}  // namespace strata::offload

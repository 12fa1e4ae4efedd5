// CpuBackend: the device budget is a hard limit with a clear error, pinned memory is counted,
// copies run on their own threads in stream order, events and stream waits follow CUDA's rules;
// in stream-jitter mode the compute stream runs behind the host, a correct record/wait still
// orders a copy after the kernels it needs, and a missing one is seen.
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <latch>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "backend/arena.h"

namespace strata::backend {
namespace {

std::unique_ptr<Backend> make(std::uint64_t device_bytes, std::uint64_t host_bytes = 64 << 20,
                              std::optional<std::uint64_t> jitter = std::nullopt) {
  CpuBackendOptions options;
  options.device_bytes_max = device_bytes;
  options.host_bytes_max = host_bytes;
  options.threads = 2;
  options.stream_jitter = jitter;
  auto backend = make_cpu_backend(options);
  EXPECT_TRUE(backend.is_ok()) << backend.status().to_string();
  return std::move(backend).value();
}

TEST(Arena, FreedBlocksCoalesceSoTheWholeCapacityIsUsableAgain) {
  Arena arena(1 << 20, "test arena", "test.budget");
  std::vector<std::uint64_t> offsets;
  for (int i = 0; i < 4; ++i) {
    auto r = arena.allocate(256 << 10, 4096, "quarter");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    offsets.push_back(*r);
  }
  EXPECT_EQ(arena.bytes_in_use(), 1u << 20);
  EXPECT_FALSE(arena.allocate(1, 256, "one more").is_ok());
  for (std::uint64_t offset : {offsets[1], offsets[3], offsets[0], offsets[2]})
    arena.free(offset);
  EXPECT_EQ(arena.bytes_in_use(), 0u);
  EXPECT_EQ(arena.largest_free_block(), 1u << 20);
  EXPECT_EQ(arena.bytes_peak(), 1u << 20);
  EXPECT_TRUE(arena.allocate(1 << 20, 4096, "everything").is_ok());
}

TEST(Arena, HonoursAlignment) {
  Arena arena(1 << 20, "test arena", "test.budget");
  ASSERT_TRUE(arena.allocate(300, 256, "small").is_ok());
  auto aligned = arena.allocate(100, 4096, "page");
  ASSERT_TRUE(aligned.is_ok());
  EXPECT_EQ(*aligned % 4096, 0u);
}

TEST(CpuBackend, DeviceBudgetIsHardAndTheErrorNamesIt) {
  auto backend = make(1 << 20);
  auto first = backend->allocate_device(768 << 10, "weights");
  ASSERT_TRUE(first.is_ok());
  auto second = backend->allocate_device(512 << 10, "activations of block 3");
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), ErrorCode::kOutOfMemory);
  const std::string message = second.status().to_string();
  EXPECT_NE(message.find("strata.device_bytes_max"), std::string::npos) << message;
  EXPECT_NE(message.find("activations of block 3"), std::string::npos) << message;
  EXPECT_NE(message.find("1.00 MiB"), std::string::npos) << message;
  first->reset();
  EXPECT_TRUE(backend->allocate_device(1 << 20, "all of it").is_ok());
  EXPECT_EQ(backend->device_memory().bytes_peak, 1u << 20);
}

TEST(CpuBackend, PinnedMemoryCountsAgainstTheHostBudget) {
  auto backend = make(1 << 20, 1 << 20);
  auto a = backend->allocate_pinned(600 << 10, "staging");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(backend->pinned_memory().bytes_in_use, 600u << 10);
  auto b = backend->allocate_pinned(600 << 10, "more staging");
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().to_string().find("strata.host_bytes_max"), std::string::npos);
  a->reset();
  EXPECT_EQ(backend->pinned_memory().bytes_in_use, 0u);
}

TEST(CpuBackend, CopiesRunInStreamOrderAndEventsReportCompletion) {
  auto backend = make(16 << 20);
  const std::size_t n = 1 << 20;
  auto host = backend->allocate_pinned(n * 4, "host");
  auto device = backend->allocate_device(n * 4, "device");
  auto back = backend->allocate_pinned(n * 4, "back");
  ASSERT_TRUE(host.is_ok() && device.is_ok() && back.is_ok());
  std::iota(host->as<std::uint32_t>(), host->as<std::uint32_t>() + n, 7u);
  auto uploaded = backend->create_event();
  auto downloaded = backend->create_event();
  ASSERT_TRUE(uploaded.is_ok() && downloaded.is_ok());
  ASSERT_TRUE(
      backend->copy_async(StreamKind::kHostToDevice, device->data(), host->data(), n * 4).is_ok());
  ASSERT_TRUE(backend->record(*uploaded, StreamKind::kHostToDevice).is_ok());
  // The download stream must not start before the upload finished.
  ASSERT_TRUE(backend->wait(StreamKind::kDeviceToHost, *uploaded).is_ok());
  ASSERT_TRUE(
      backend->copy_async(StreamKind::kDeviceToHost, back->data(), device->data(), n * 4).is_ok());
  ASSERT_TRUE(backend->record(*downloaded, StreamKind::kDeviceToHost).is_ok());
  ASSERT_TRUE(backend->synchronize(*downloaded).is_ok());
  EXPECT_TRUE(backend->query(*uploaded));
  EXPECT_EQ(std::memcmp(back->data(), host->data(), n * 4), 0);
}

TEST(CpuBackend, CopyStreamsRunOnTheirOwnThreadWhileTheHostComputes) {
  auto backend = make(1 << 20);
  std::latch gate(1);
  auto done = backend->create_event();
  ASSERT_TRUE(done.is_ok());
  // The copy stream blocks inside this function until the host opens the gate: if copies ran
  // on the calling thread, launch_host_func would never return.
  ASSERT_TRUE(backend
                  ->launch_host_func(
                      StreamKind::kHostToDevice,
                      [](void* arg) { static_cast<std::latch*>(arg)->wait(); }, &gate)
                  .is_ok());
  ASSERT_TRUE(backend->record(*done, StreamKind::kHostToDevice).is_ok());
  EXPECT_FALSE(backend->query(*done));
  // Meanwhile the compute stream runs ops on the host thread.
  std::vector<float> x(1000, 2.0f);
  EXPECT_DOUBLE_EQ(backend->ops_f32().sum_squares(x.data(), 1000), 4000.0);
  EXPECT_FALSE(backend->query(*done));
  gate.count_down();
  ASSERT_TRUE(backend->synchronize(*done).is_ok());
  EXPECT_TRUE(backend->query(*done));
}

TEST(CpuBackend, EventNeverRecordedIsComplete) {
  auto backend = make(1 << 20);
  auto event = backend->create_event();
  ASSERT_TRUE(event.is_ok());
  EXPECT_TRUE(backend->query(*event));
  EXPECT_TRUE(backend->synchronize(*event).is_ok());
  backend->destroy_event(*event);
}

TEST(CpuBackend, EventPoolIsFixedAndExhaustionIsAnError) {
  auto backend = make(1 << 20);
  std::vector<Event> events;
  for (;;) {
    auto event = backend->create_event();
    if (!event.is_ok()) {
      EXPECT_EQ(event.status().code(), ErrorCode::kOutOfMemory);
      break;
    }
    events.push_back(*event);
    ASSERT_LE(events.size(), 100000u);
  }
  EXPECT_GE(events.size(), 1024u);
  backend->destroy_event(events.back());
  EXPECT_TRUE(backend->create_event().is_ok());
}

TEST(CpuBackend, DoublePrecisionOpsAreAvailable) {
  auto backend = make(1 << 20);
  ASSERT_NE(backend->ops<double>(), nullptr);
  std::vector<double> x = {1.0, 2.0, 3.0};
  EXPECT_DOUBLE_EQ(backend->ops<double>()->sum_squares(x.data(), 3), 14.0);
  EXPECT_EQ(backend->compute_threads(), 2);
  EXPECT_NE(backend->description().find("OpenBLAS"), std::string::npos);
}

// add_rounded: the bits of cast_to, cast_from, then copy or add (the gradient path's one-pass
// rounding of a gradient kept on the device), in fp32 and fp64, bf16 and fp16.
template <typename T>
void expect_add_rounded_is_the_round_trip(Ops<T>& ops, Backend& backend) {
  const std::int64_t n = 70001;  // several chunks and blocks, and a rest
  std::vector<T> g(static_cast<std::size_t>(n)), acc(g.size());
  for (std::int64_t i = 0; i < n; ++i) {
    g[static_cast<std::size_t>(i)] = static_cast<T>(std::sin(0.37 * static_cast<double>(i)) * 3e4);
    acc[static_cast<std::size_t>(i)] = static_cast<T>(std::cos(0.11 * static_cast<double>(i)));
  }
  g[0] = static_cast<T>(-0.0);
  g[1] = std::numeric_limits<T>::infinity();
  g[2] = static_cast<T>(1e-40);
  for (const DType type : {DType::kBF16, DType::kF16}) {
    for (const bool assign : {true, false}) {
      std::vector<std::uint16_t> narrow(g.size());
      std::vector<T> wide(g.size()), want = acc, got = acc;
      ops.cast_to(narrow.data(), type, g.data(), n);
      ops.cast_from(wide.data(), narrow.data(), type, n);
      if (assign) {
        ops.copy(want.data(), wide.data(), n);
      } else {
        ops.add(want.data(), want.data(), wide.data(), n);
      }
      ops.add_rounded(got.data(), g.data(), type, n, assign);
      ASSERT_TRUE(backend.synchronize(StreamKind::kCompute).is_ok());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0)
          << sizeof(T) * 8 << "-bit, " << (type == DType::kBF16 ? "bf16" : "fp16")
          << (assign ? ", assigned" : ", added");
    }
  }
}

TEST(CpuBackend, AddRoundedHasTheBitsOfTheRoundTripThroughSixteenBits) {
  auto backend = make(1 << 20);
  expect_add_rounded_is_the_round_trip(backend->ops_f32(), *backend);
  expect_add_rounded_is_the_round_trip(*backend->ops<double>(), *backend);
}

TEST(CpuBackend, RejectsAZeroBudget) {
  CpuBackendOptions options;
  options.device_bytes_max = 0;
  auto backend = make_cpu_backend(options);
  ASSERT_FALSE(backend.is_ok());
  EXPECT_NE(backend.status().to_string().find("strata.device_bytes_max"), std::string::npos);
}

// Fills a device buffer on the compute stream (a copy, then a scale), then copies it to a
// pinned buffer on the device->host stream, with or without the record/wait that orders the copy
// after the ops. Returns how many of `rounds` copies saw the ops' result.
int ordered_copies(Backend& b, bool with_wait, int rounds) {
  constexpr std::int64_t n = 4096;
  auto device = b.allocate_device(n * 4, "data").value();
  auto host = b.allocate_pinned(n * 4, "host").value();
  const Event done = b.create_event().value();
  int right = 0;
  for (int r = 0; r < rounds; ++r) {
    const float value = static_cast<float>(r + 1);
    b.ops_f32().zero(device.as<float>(), n);
    std::vector<float> ones(static_cast<std::size_t>(n), value);
    // From pageable memory on the compute stream: in stream order, complete when it returns.
    EXPECT_TRUE(b.copy_async(StreamKind::kCompute, device.data(), ones.data(), n * 4).is_ok());
    b.ops_f32().scale(device.as<float>(), n, 2.0);
    EXPECT_TRUE(b.record(done, StreamKind::kCompute).is_ok());
    if (with_wait) {
      EXPECT_TRUE(b.wait(StreamKind::kDeviceToHost, done).is_ok());
    }
    EXPECT_TRUE(b.copy_async(StreamKind::kDeviceToHost, host.data(), device.data(), n * 4).is_ok());
    EXPECT_TRUE(b.synchronize(StreamKind::kDeviceToHost).is_ok());
    bool all = true;
    for (std::int64_t i = 0; i < n; ++i)
      all = all && host.as<float>()[i] == 2.0f * value;
    right += all ? 1 : 0;
    EXPECT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
  }
  b.destroy_event(done);
  return right;
}

TEST(CpuBackendJitter, AWaitedCopySeesTheComputeStreamsResultEveryTime) {
  auto backend = make(1 << 20, 64 << 20, 7);
  EXPECT_NE(backend->description().find("stream jitter seed 7"), std::string::npos)
      << backend->description();
  EXPECT_EQ(ordered_copies(*backend, true, 40), 40);
}

TEST(CpuBackendJitter, ACopyMissingItsWaitReadsBeforeTheComputeStreamWrote) {
  // Plain: the compute stream is synchronous, so the missing wait does no harm...
  auto plain = make(1 << 20);
  EXPECT_EQ(ordered_copies(*plain, false, 20), 20);
  // ...under jitter the compute stream runs behind the host and the copy overtakes it.
  auto jittered = make(1 << 20, 64 << 20, 7);
  EXPECT_LT(ordered_copies(*jittered, false, 40), 40);
}

TEST(CpuBackendJitter, ReadBacksWaitForTheComputeStreamAndFreshMemoryIsPoisoned) {
  auto backend = make(1 << 20, 64 << 20, 3);
  auto device = backend->allocate_device(1024 * 4, "data").value();
  // Fresh memory holds all bits set (NaN), as recycled GPU memory holds garbage.
  EXPECT_TRUE(std::isnan(device.as<float>()[0]));
  EXPECT_TRUE(std::isnan(device.as<float>()[1023]));
  backend->ops_f32().zero(device.as<float>(), 1024);
  backend->ops_f32().scale(device.as<float>(), 1024, 3.0);
  // sum() waits for the queued ops, like a GPU read-back.
  EXPECT_EQ(backend->ops_f32().sum(device.as<float>(), 1024), 0.0);
  std::vector<float> values(1024, 0.5f), back(1024, 0.0f);
  ASSERT_TRUE(
      backend->copy_async(StreamKind::kCompute, device.data(), values.data(), 4096).is_ok());
  backend->ops_f32().scale(device.as<float>(), 1024, 4.0);
  ASSERT_TRUE(backend->copy_async(StreamKind::kCompute, back.data(), device.data(), 4096).is_ok());
  // A copy into pageable memory is complete when copy_async returns, after the ops before it.
  EXPECT_EQ(back[0], 2.0f);
  EXPECT_EQ(back[1023], 2.0f);
}

}  // namespace
}  // namespace strata::backend

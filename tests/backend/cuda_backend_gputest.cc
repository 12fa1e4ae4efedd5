// CudaBackend on a GPU: the device budget is hard and its error names the key, pinned memory is
// counted, copies run on their streams and events order them, host functions run in stream
// order, a never-recorded event is complete, the event pool is finite, and an op's failure is
// reported by the next call that returns a Status. Skips without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include "support/gpu_support.h"

namespace strata::backend {
namespace {

TEST(CudaBackend, DescribesTheDeviceAndItsWorkspaces) {
  STRATA_GPU_OR_SKIP(gpu, {});
  EXPECT_EQ(gpu.name(), "cuda:0");
  EXPECT_NE(gpu.description().find("sm_"), std::string::npos) << gpu.description();
  EXPECT_EQ(gpu.ops_f64(), nullptr);
  EXPECT_GT(gpu.device_memory().bytes_in_use, 0u);  // cuBLASLt and reduction workspaces
}

TEST(CudaBackend, DeviceBudgetIsHardAndTheErrorNamesIt) {
  CudaBackendOptions options;
  options.device_bytes_max = 256ull << 20;
  STRATA_GPU_OR_SKIP(gpu, options);
  const std::uint64_t free_bytes = gpu.device_memory().bytes_max - gpu.device_memory().bytes_in_use;
  auto first = gpu.allocate_device(free_bytes / 2 + (1 << 20), "weights");
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto second = gpu.allocate_device(free_bytes / 2 + (1 << 20), "activations of block 3");
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(second.status().to_string().find("strata.device_bytes_max"), std::string::npos);
  EXPECT_NE(second.status().to_string().find("activations of block 3"), std::string::npos);
}

TEST(CudaBackend, ABudgetAboveTheFreeMemoryIsAnError) {
  CudaBackendOptions options;
  options.device_bytes_max = 1ull << 50;
  auto made = make_cuda_backend(options);
  if (!made.is_ok() && made.status().code() == ErrorCode::kUnavailable) {
    GTEST_SKIP() << "no GPU: " << made.status().to_string();
  }
  ASSERT_FALSE(made.is_ok());
  EXPECT_EQ(made.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(made.status().context(), "strata.device_bytes_max");
}

TEST(CudaBackend, PinnedMemoryIsCountedAndReturned) {
  CudaBackendOptions options;
  options.host_bytes_max = 64ull << 20;
  STRATA_GPU_OR_SKIP(gpu, options);
  // The limit is the budget, or `ulimit -l` when that is lower (and binding here).
  const MemoryStats stats = gpu.pinned_memory();
  ASSERT_LE(stats.bytes_max, 64ull << 20);
  const std::uint64_t some = (stats.bytes_max - stats.bytes_in_use) / 4 / 4096 * 4096;
  ASSERT_GT(some, 0u);
  {
    auto a = gpu.allocate_pinned(some, "staging");
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_EQ(gpu.pinned_memory().bytes_in_use, stats.bytes_in_use + some);
    auto too_much = gpu.allocate_pinned(stats.bytes_max, "more staging");
    ASSERT_FALSE(too_much.is_ok());
    EXPECT_EQ(too_much.status().code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(too_much.status().message().find("more staging"), std::string::npos);
  }
  EXPECT_EQ(gpu.pinned_memory().bytes_in_use, stats.bytes_in_use);
}

TEST(CudaBackend, CopiesThroughBothCopyStreamsRoundTrip) {
  STRATA_GPU_OR_SKIP(gpu, {});
  const std::size_t bytes = 8 << 20;
  auto up = gpu.allocate_pinned(bytes, "up");
  auto down = gpu.allocate_pinned(bytes, "down");
  auto device = gpu.allocate_device(bytes, "data");
  ASSERT_TRUE(up.is_ok() && down.is_ok() && device.is_ok());
  auto* src = up->as<std::uint32_t>();
  std::iota(src, src + bytes / 4, 0u);
  std::memset(down->data(), 0, bytes);
  auto copied = gpu.create_event();
  ASSERT_TRUE(copied.is_ok());
  ASSERT_TRUE(gpu.copy_async(StreamKind::kHostToDevice, device->data(), up->data(), bytes).is_ok());
  ASSERT_TRUE(gpu.record(*copied, StreamKind::kHostToDevice).is_ok());
  ASSERT_TRUE(gpu.wait(StreamKind::kDeviceToHost, *copied).is_ok());
  ASSERT_TRUE(
      gpu.copy_async(StreamKind::kDeviceToHost, down->data(), device->data(), bytes).is_ok());
  ASSERT_TRUE(gpu.synchronize(StreamKind::kDeviceToHost).is_ok());
  EXPECT_EQ(std::memcmp(down->data(), up->data(), bytes), 0);
  gpu.destroy_event(*copied);
}

TEST(CudaBackend, PageableCopiesOnTheComputeStreamAreCompleteOnReturn) {
  STRATA_GPU_OR_SKIP(gpu, {});
  std::vector<float> values = testing::random_floats(1 << 20, 5);
  auto device = gpu.allocate_device(values.size() * 4, "data");
  ASSERT_TRUE(device.is_ok());
  ASSERT_TRUE(gpu.copy_async(StreamKind::kCompute, device->data(), values.data(), values.size() * 4)
                  .is_ok());
  const std::vector<float> expected = values;
  std::fill(values.begin(), values.end(), 0.0f);  // the source may be reused at once
  std::vector<float> back(values.size());
  ASSERT_TRUE(
      gpu.copy_async(StreamKind::kCompute, back.data(), device->data(), back.size() * 4).is_ok());
  testing::expect_bitwise_equal("round trip", back, expected);
}

struct Flag {
  std::atomic<int> value{0};
};

TEST(CudaBackend, HostFunctionsRunInStreamOrderAfterWaitedEvents) {
  STRATA_GPU_OR_SKIP(gpu, {});
  Flag gate;
  Flag seen;
  auto event = gpu.create_event();
  ASSERT_TRUE(event.is_ok());
  // The H2D stream blocks in a host function until the test opens the gate; the compute stream
  // waits for an event recorded after it, so its own host function must not run before.
  ASSERT_TRUE(gpu.launch_host_func(
                     StreamKind::kHostToDevice,
                     [](void* p) {
                       auto* f = static_cast<Flag*>(p);
                       while (f->value.load() == 0)
                         std::this_thread::yield();
                     },
                     &gate)
                  .is_ok());
  ASSERT_TRUE(gpu.record(*event, StreamKind::kHostToDevice).is_ok());
  ASSERT_TRUE(gpu.wait(StreamKind::kCompute, *event).is_ok());
  ASSERT_TRUE(
      gpu.launch_host_func(
             StreamKind::kCompute, [](void* p) { static_cast<Flag*>(p)->value.store(1); }, &seen)
          .is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(seen.value.load(), 0);
  EXPECT_FALSE(gpu.query(*event));
  gate.value.store(1);
  ASSERT_TRUE(gpu.synchronize(StreamKind::kCompute).is_ok());
  EXPECT_EQ(seen.value.load(), 1);
  EXPECT_TRUE(gpu.query(*event));
  gpu.destroy_event(*event);
}

TEST(CudaBackend, ANeverRecordedEventIsComplete) {
  STRATA_GPU_OR_SKIP(gpu, {});
  auto event = gpu.create_event();
  ASSERT_TRUE(event.is_ok());
  EXPECT_TRUE(gpu.query(*event));
  EXPECT_TRUE(gpu.synchronize(*event).is_ok());
  EXPECT_TRUE(gpu.wait(StreamKind::kCompute, *event).is_ok());
  gpu.destroy_event(*event);
}

TEST(CudaBackend, TheEventPoolIsFinite) {
  STRATA_GPU_OR_SKIP(gpu, {});
  std::vector<Event> events;
  for (;;) {
    auto event = gpu.create_event();
    if (!event.is_ok()) {
      EXPECT_EQ(event.status().code(), ErrorCode::kOutOfMemory);
      break;
    }
    events.push_back(*event);
    ASSERT_LE(events.size(), 100000u);
  }
  EXPECT_EQ(events.size(), 4096u);
  for (Event e : events)
    gpu.destroy_event(e);
  EXPECT_TRUE(gpu.create_event().is_ok());
}

TEST(CudaBackend, AnOpsFailureIsReportedByTheNextStatus) {
  STRATA_GPU_OR_SKIP(gpu, {});
  auto buffer = gpu.allocate_device(1 << 20, "attention");
  ASSERT_TRUE(buffer.is_ok());
  AttentionShape shape;
  shape.batch = 1;
  shape.seq_len = 4;
  shape.heads = 1;
  shape.kv_heads = 1;
  shape.head_dim = 300;  // beyond the CUDA kernels' 256
  shape.q_stride = shape.kv_stride = shape.out_stride = 300;
  shape.scale = 0.1;
  float* p = buffer->as<float>();
  gpu.ops_f32().attention_forward(p, p, p, p, p, shape);
  const Status status = gpu.synchronize(StreamKind::kCompute);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("head_dim 300"), std::string::npos) << status.to_string();
}

}  // namespace
}  // namespace strata::backend

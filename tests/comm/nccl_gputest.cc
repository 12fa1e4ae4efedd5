// The NCCL Comm on real GPUs: one rank per visible GPU, as threads of this process. Skips with a
// message without CUDA, a GPU or NCCL.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "comm/nccl_comm.h"

#if defined(STRATA_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace strata::comm {
namespace {

TEST(NcclApi, LoadsEveryEntryPointOrSaysWhichIsMissing) {
  Result<const nccl::Api*> api = nccl::load_api();
  if (!api.is_ok()) {
    EXPECT_EQ(api.status().code(), ErrorCode::kUnavailable);
    EXPECT_NE(api.status().message().find("NCCL"), std::string::npos) << api.status().to_string();
    GTEST_SKIP() << api.status().to_string();
  }
  EXPECT_GE((*api)->version, 21200);
  EXPECT_FALSE((*api)->library.empty());
}

#if defined(STRATA_HAVE_CUDA)

// Rank r's input element i.
float value(int rank, std::size_t i) {
  return static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 13) % 64) * 0.5f;
}

// Runs the collectives on `ranks` GPUs (one thread each) and checks the results exactly (the
// inputs are small multiples of 1/2, so sums are exact in any order).
void run_ranks(int ranks) {
  Result<nccl::UniqueId> id = nccl_unique_id();
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  constexpr std::size_t kCount = 1 << 20;  // per rank
  std::vector<std::thread> threads;
  std::vector<std::string> failures(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::string& failure = failures[static_cast<std::size_t>(r)];
      NcclCommConfig config;
      config.rank = r;
      config.world_size = ranks;
      config.device = r;
      config.id = *id;
      config.options.timeout_s = 60;
      Result<std::unique_ptr<Comm>> comm = create_nccl_comm(config);
      if (!comm.is_ok()) {
        failure = comm.status().to_string();
        return;
      }
      Comm& c = **comm;
      const std::size_t w = static_cast<std::size_t>(ranks);
      std::vector<float> host(kCount * w);
      for (std::size_t i = 0; i < kCount * w; ++i)
        host[i] = value(r, i);
      void* send_raw = nullptr;
      void* recv_raw = nullptr;
      cudaSetDevice(r);
      cudaMalloc(&send_raw, kCount * w * sizeof(float));
      cudaMalloc(&recv_raw, kCount * w * sizeof(float));
      auto* send = static_cast<float*>(send_raw);
      auto* recv = static_cast<float*>(recv_raw);
      cudaMemcpy(send, host.data(), kCount * w * sizeof(float), cudaMemcpyHostToDevice);
      // all-reduce of the whole buffer: every element is the sum over ranks.
      Result<Handle> h = c.all_reduce(send, recv, kCount * w, DataType::kF32, ReduceOp::kSum);
      Status s = h.is_ok() ? c.wait(*h) : h.status();
      if (s.is_ok()) {
        std::vector<float> out(kCount * w);
        cudaMemcpy(out.data(), recv, out.size() * sizeof(float), cudaMemcpyDeviceToHost);
        for (std::size_t i = 0; i < out.size() && failure.empty(); ++i) {
          float want = 0;
          for (int k = 0; k < ranks; ++k)
            want += value(k, i);
          if (out[i] != want) failure = "all_reduce element " + std::to_string(i);
        }
      }
      // reduce-scatter then all-gather gives the same.
      if (s.is_ok()) {
        h = c.reduce_scatter(send, recv + static_cast<std::size_t>(r) * kCount, kCount,
                             DataType::kF32, ReduceOp::kSum);
        s = h.is_ok() ? c.wait(*h) : h.status();
      }
      if (s.is_ok()) {
        h = c.all_gather(recv + static_cast<std::size_t>(r) * kCount, recv, kCount, DataType::kF32);
        s = h.is_ok() ? c.wait(*h) : h.status();
      }
      if (s.is_ok()) {
        std::vector<float> out(kCount * w);
        cudaMemcpy(out.data(), recv, out.size() * sizeof(float), cudaMemcpyDeviceToHost);
        for (std::size_t i = 0; i < out.size() && failure.empty(); ++i) {
          float want = 0;
          for (int k = 0; k < ranks; ++k)
            want += value(k, i);
          if (out[i] != want) failure = "reduce_scatter + all_gather element " + std::to_string(i);
        }
        h = c.barrier();
        s = h.is_ok() ? c.wait(*h) : h.status();
      }
      if (!s.is_ok()) failure = s.to_string();
      cudaFree(send);
      cudaFree(recv);
    });
  }
  for (std::thread& t : threads)
    t.join();
  for (int r = 0; r < ranks; ++r) {
    EXPECT_TRUE(failures[static_cast<std::size_t>(r)].empty())
        << "rank " << r << ": " << failures[static_cast<std::size_t>(r)];
  }
}

TEST(NcclComm, OneRankPerGpuGetsExactResults) {
  Status usable = nccl_usable();
  if (!usable.is_ok()) GTEST_SKIP() << usable.to_string();
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  run_ranks(gpus);
}

#else

TEST(NcclComm, OneRankPerGpuGetsExactResults) {
  GTEST_SKIP() << "built without CUDA: no NCCL transport";
}

#endif

}  // namespace
}  // namespace strata::comm

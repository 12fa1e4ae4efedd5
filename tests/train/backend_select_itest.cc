// `strata train` picks its backend from strata.backend: without a GPU, "auto" trains on the CPU
// and says why, and "cuda" is a clear error naming the key.
#include <gtest/gtest.h>

#include "support/run_strata.h"
#include "sys/gpu.h"

namespace strata {
namespace {

using testing::run_strata;
using testing::TempDir;

std::string tiny_config(const std::string& out) {
  return R"({"train_micro_batch_size_per_gpu": 2,
    "strata": {"output_dir": ")" +
         out + R"(", "train_steps": 1, "cpu_threads": 1, "device_bytes_max": "64MiB",
      "host_bytes_max": "64MiB", "eval_batches": 1,
      "model": {"family": "gpt2", "vocab_size": 32, "max_seq_len": 8, "hidden_size": 16,
                "num_layers": 1, "num_heads": 2},
      "data": {"source": "synthetic", "seq_len": 8, "synthetic_vocab_size": 32}}})";
}

TEST(BackendSelect, AutoWithoutAGpuTrainsOnTheCpuAndSaysWhy) {
  if (!sys::probe_cuda().gpus.empty()) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  const std::string config = dir.write_file("c.json", tiny_config(dir.path() + "/out"));
  const auto run = run_strata({"train", "--config", config});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("backend auto: no GPU"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("using the CPU backend"), std::string::npos) << run.err;
}

TEST(BackendSelect, CudaWithoutAGpuIsAClearError) {
  if (!sys::probe_cuda().gpus.empty()) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  const std::string config = dir.write_file("c.json", tiny_config(dir.path() + "/out"));
  const auto run = run_strata({"train", "--config", config, "--set", "strata.backend=cuda"});
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("strata.backend"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("no usable GPU"), std::string::npos) << run.err;
}

}  // namespace
}  // namespace strata

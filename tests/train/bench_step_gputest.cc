// `strata bench step --backend cuda`: training steps on the GPU, the GEMM peak measured on the
// same GPU in the run's GEMM precision, and MFU against it. Skips without a GPU.
#include <gtest/gtest.h>
#include <json/json.h>

#include <memory>

#include "support/run_strata.h"
#include "sys/gpu.h"

namespace strata {
namespace {

TEST(BenchStepCuda, ReportsThroughputAndMfuAgainstTheGpuGemmPeak) {
  const sys::CudaProbe probe = sys::probe_cuda();
  if (probe.gpus.empty()) GTEST_SKIP() << "no GPU: " << probe.error;
  auto r = testing::run_strata(
      {"bench",          "step",
       "--model",        testing::source_path("tests/fixtures/models/gpt2_tied/config.json"),
       "--batch",        "2",
       "--seq-len",      "16",
       "--steps",        "2",
       "--peak-sizes",   "256,512",
       "--peak-repeats", "2",
       "--precision",    "bf16",
       "--backend",      "cuda",
       "--device-bytes", "1GiB",
       "--json"},
      {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::CharReaderBuilder builder;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  Json::Value j;
  std::string errors;
  ASSERT_TRUE(reader->parse(r.out.data(), r.out.data() + r.out.size(), &j, &errors)) << r.out;
  EXPECT_EQ(j["backend"].asString(), "cuda:0");
  EXPECT_FALSE(j.isMember("openblas_threads_gflops"));
  for (const char* key : {"tokens_per_s", "achieved_gflops", "gemm_peak_gflops", "mfu"}) {
    EXPECT_GT(j[key].asDouble(), 0.0) << key;
  }
  EXPECT_NE(j["backend_description"].asString().find("GEMM inputs bf16"), std::string::npos);
}

}  // namespace
}  // namespace strata

// `strata estimate` as users run it.
#include <gtest/gtest.h>

#include "support/run_strata.h"

namespace strata {
namespace {

using testing::parse_json;
using testing::run_strata;
using testing::source_path;

TEST(EstimateCli, JsonHasBytesPerTier) {
  auto r = run_strata({"estimate", "--config", source_path("configs/zero3-nvme-bf16.json"),
                       "--model", source_path("tests/fixtures/hf/llama-2-7b"), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value v = parse_json(r.out);
  EXPECT_EQ(v["params"].asInt64(), 6'738'415'616);
  // Optimizer state on NVMe (16 bytes per parameter, units padded to 4 KiB, a 4 KiB checksum per
  // tile); the parameters too, beyond the first max_in_cpu (1e9) elements, which stay in host
  // memory: 2 bytes per parameter for about 5.7e9 of them.
  const double nvme = static_cast<double>(v["nvme_bytes"].asUInt64());
  EXPECT_GT(nvme, (16.0 + 2.0 * 5.5 / 6.74) * 6'738'415'616);
  EXPECT_LT(nvme, 18.01 * 6'738'415'616);
  EXPECT_GT(v["device_bytes"].asUInt64(), 0u);
  EXPECT_GT(v["host_bytes"].asUInt64(), 0u);
  EXPECT_TRUE(v["items"].isArray());
}

TEST(EstimateCli, MoreGpusShrinkEachRanksShard) {
  const std::string config = source_path("configs/zero3-offload-cpu-bf16.json");
  auto one = run_strata({"estimate", "--config", config, "--params", "1B", "--json"});
  auto four =
      run_strata({"estimate", "--config", config, "--params", "1B", "--gpus", "4", "--json"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(four.exit_code, 0) << four.err;
  const auto host_one = parse_json(one.out)["host_bytes"].asUInt64();
  const auto host_four = parse_json(four.out)["host_bytes"].asUInt64();
  EXPECT_LT(host_four * 3, host_one);
  EXPECT_EQ(parse_json(four.out)["world_size"].asInt64(), 4);
}

TEST(EstimateCli, TooSmallBudgetSaysDoesNotFitAndExitsOne) {
  auto r = run_strata(
      {"estimate", "--config", source_path("configs/demo.json"), "--device-bytes", "1MiB"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("DOES NOT FIT: device"), std::string::npos) << r.out;
}

TEST(EstimateCli, BadArgumentsAreUsageErrorsNamingTheOption) {
  const std::string config = source_path("configs/demo.json");
  auto r = run_strata({"estimate", "--config", config, "--params", "lots"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--params"), std::string::npos) << r.err;
  r = run_strata({"estimate", "--config", config, "--params", "7B", "--model", config});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not both"), std::string::npos) << r.err;
  r = run_strata({"estimate", "--config", config, "--host-bytes", "lots"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--host-bytes"), std::string::npos) << r.err;
  r = run_strata({"estimate", "--config", config, "--model", "/nonexistent/model"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
}

TEST(EstimateCli, ConfigErrorsExitTwo) {
  testing::TempDir dir;
  auto file = dir.write_file("bad.json", R"({"zero_optimization": {"stage": 4}})");
  auto r = run_strata({"estimate", "--config", file, "--params", "1B"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("zero_optimization.stage"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata

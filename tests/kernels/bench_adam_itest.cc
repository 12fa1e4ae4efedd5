// `strata bench adam` as a user runs it: machine-readable output with the fields the issue asks
// for, numbers consistent with each other, and clear usage errors.
#include <gtest/gtest.h>
#include <json/json.h>

#include <memory>
#include <string>

#include "support/run_strata.h"
#include "sys/cpu_features.h"

namespace strata {
namespace {

using testing::parse_json;
using testing::run_strata;

TEST(BenchAdam, JsonReportsBandwidthRooflineAndTheirRatio) {
  auto r = run_strata({"bench", "adam", "--params", "300000", "--threads", "2", "--grad", "bf16",
                       "--copy", "fp16", "--repeats", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value j = parse_json(r.out);
  EXPECT_EQ(j["params"].asUInt64(), 300000u);
  EXPECT_EQ(j["grad"].asString(), "bf16");
  EXPECT_EQ(j["copy"].asString(), "fp16");
  EXPECT_EQ(j["layout"].asString(), "staggered");
  // bf16 gradient + fp16 copy: read 12 + 2, write 12 + 2; the roofline moves 28.
  EXPECT_EQ(j["bytes_per_param"].asUInt64(), 28u);
  EXPECT_EQ(j["bytes_read_per_param"].asUInt64(), 14u);
  EXPECT_EQ(j["roofline_bytes_per_param"].asUInt64(), 28u);
  const double gbps = j["gbps"].asDouble();
  const double roofline_gbps = j["roofline_gbps"].asDouble();
  ASSERT_GT(gbps, 0.0);
  ASSERT_GT(roofline_gbps, 0.0);
  EXPECT_NEAR(j["ratio"].asDouble(), gbps / roofline_gbps, 1e-9);
  EXPECT_NEAR(gbps, 300000.0 * 28 / (j["ms_per_step"].asDouble() * 1e-3) / 1e9, gbps * 1e-9);
  EXPECT_NEAR(j["params_per_s"].asDouble(), 300000.0 / (j["ms_per_step"].asDouble() * 1e-3),
              j["params_per_s"].asDouble() * 1e-9);
  EXPECT_LE(j["ms_per_step_min"].asDouble(), j["ms_per_step"].asDouble());
  EXPECT_GE(j["ms_per_step_max"].asDouble(), j["ms_per_step"].asDouble());
}

TEST(BenchAdam, CheckFiniteCountsTheExtraGradientRead) {
  auto r = run_strata({"bench", "adam", "--params", "100000", "--repeats", "1", "--check-finite",
                       "--simd", "scalar", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value j = parse_json(r.out);
  EXPECT_TRUE(j["check_finite"].asBool());
  EXPECT_EQ(j["simd"].asString(), "scalar");
  EXPECT_EQ(j["bytes_read_per_param"].asUInt64(), 20u);  // 12 state + 4 grad + 4 grad again
}

TEST(BenchAdam, TextOutputNamesBothKernelsAndTheRatio) {
  auto r = run_strata({"bench", "adam", "--params", "70000", "--repeats", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ms/step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("roofline"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ratio"), std::string::npos) << r.out;
}

// --compare times the fp32 step beside the compressed one; the bytes per parameter count the
// 8-bit codes, the bf16 gradient and the absmax of each 2048-element block (read and written).
TEST(BenchAdam, CompareReportsCompressedStateBesideFp32) {
  auto r = run_strata({"bench", "adam", "--params", "300000", "--threads", "2", "--grad", "bf16",
                       "--moments", "8bit", "--compare", "--repeats", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value j = parse_json(r.out);
  EXPECT_EQ(j["params"].asUInt64(), 300000u / 2048 * 2048) << "whole 8-bit blocks";
  EXPECT_EQ(j["moments"].asString(), "8bit");
  EXPECT_EQ(j["master"].asString(), "fp32");
  EXPECT_EQ(j["block"].asUInt64(), 2048u);
  // Read 4 (master) + 1 + 1 (codes) + 2 (grad) + 8 / 2048 (absmax); written the same less grad.
  EXPECT_DOUBLE_EQ(j["bytes_read_per_param"].asDouble(), 8.0 + 8.0 / 2048);
  EXPECT_DOUBLE_EQ(j["bytes_written_per_param"].asDouble(), 6.0 + 8.0 / 2048);
  EXPECT_EQ(j["fp32"]["bytes_per_param"].asUInt64(), 26u);
  const double ms = j["ms_per_step"].asDouble();
  const double fp32_ms = j["fp32"]["ms_per_step"].asDouble();
  ASSERT_GT(ms, 0.0);
  ASSERT_GT(fp32_ms, 0.0);
  EXPECT_NEAR(j["speedup_vs_fp32"].asDouble(), fp32_ms / ms, 1e-9);
  EXPECT_NEAR(j["ns_per_param"].asDouble(), ms * 1e6 / j["params"].asDouble(), 1e-9);
  EXPECT_NEAR(j["ratio"].asDouble(), j["gbps"].asDouble() / j["roofline_gbps"].asDouble(), 1e-9);

  auto text = run_strata({"bench", "adam", "--params", "70000", "--master", "bf16", "--moments",
                          "bf16", "--compare", "--repeats", "1"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("master bf16, moments bf16"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("speedup"), std::string::npos) << text.out;
}

TEST(BenchAdam, BadValuesAreUsageErrorsNamingThem) {
  struct Case {
    std::vector<std::string> args;
    std::string named;
  };
  const Case cases[] = {{{"--grad", "fp8"}, "fp8"},
                        {{"--copy", "fp32"}, "fp32"},
                        {{"--simd", "sse"}, "sse"},
                        {{"--params", "0"}, "--params"},
                        {{"--layout", "diagonal"}, "diagonal"},
                        {{"--moments", "int4"}, "int4"},
                        {{"--master", "fp16"}, "fp16"},
                        {{"--moments", "8bit", "--block", "100"}, "--block 100"},
                        {{"--compare"}, "--compare"}};
  for (const Case& c : cases) {
    std::vector<std::string> args = {"bench", "adam"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = run_strata(args);
    EXPECT_EQ(r.exit_code, 2) << c.named << ": " << r.err;
    EXPECT_NE(r.err.find(c.named), std::string::npos) << r.err;
  }
}

TEST(BenchAdam, StrataSimdEnvironmentChoosesThePathWhenNoneIsGiven) {
  auto r = run_strata({"bench", "adam", "--params", "1000", "--repeats", "1", "--json"},
                      {"STRATA_SIMD=scalar"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_json(r.out)["simd"].asString(), "scalar");
  auto bad = run_strata({"bench", "adam", "--params", "1000", "--repeats", "1", "--json"},
                        {"STRATA_SIMD=mmx"});
  ASSERT_EQ(bad.exit_code, 0) << bad.err;
  EXPECT_NE(bad.err.find("STRATA_SIMD='mmx'"), std::string::npos) << bad.err;
  EXPECT_EQ(parse_json(bad.out)["simd"].asString(), sys::to_string(sys::best_simd_level()));
}

TEST(BenchAdam, UnsupportedSimdPathFailsNamingIt) {
  if (sys::simd_level_supported(sys::SimdLevel::kAvx512)) {
    GTEST_SKIP() << "this CPU runs every path";
  }
  auto r = run_strata({"bench", "adam", "--params", "1000", "--simd", "avx512"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("avx512"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata

// `strata report` as users run it.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "support/run_strata.h"

namespace strata {
namespace {

using testing::run_strata;

TEST(ReportCli, TextNamesEverySection) {
  auto r = run_strata({"report"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* needle :
       {"build\n", "cpu\n", "memory\n", "gpu\n", "storage\n", "AVX2", "AVX-512", "ulimit -l",
        "NCCL", "io_uring", "NUMA node", "Fast paths", "flash_attention: "}) {
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << " missing from\n" << r.out;
  }
}

TEST(ReportCli, JsonDescribesThisMachine) {
  testing::TempDir dir;
  auto r = run_strata({"report", "--json", "--path", dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value v = testing::parse_json(r.out);
  ASSERT_TRUE(v.isObject()) << r.out;
  EXPECT_GT(v["cpu"]["cores"].asInt(), 0);
  EXPECT_GE(v["numa_nodes"].size(), 1u);
  EXPECT_GT(v["memory"]["total_bytes"].asUInt64(), 0u);
  EXPECT_TRUE(v["io_uring"].isMember("available"));
  EXPECT_EQ(v["path"]["path"].asString(), dir.path());
  EXPECT_GE(v["path"]["alignment_bytes"].asUInt(), 4096u);
  EXPECT_GT(v["path"]["free_bytes"].asUInt64(), 0u);
  // Without a GPU the report says so rather than failing.
  if (v["cuda"]["gpus"].empty()) {
    EXPECT_FALSE(v["cuda"]["error"].asString().empty());
  }
  // Every fast path is listed, on or off with why; without a GPU each is off and not checked.
  std::set<std::string> listed;
  for (const Json::Value& path : v["fast_paths"]) {
    EXPECT_FALSE(path["detail"].asString().empty()) << path["name"].asString();
    EXPECT_FALSE(path["replaces"].asString().empty()) << path["name"].asString();
    listed.insert(path["name"].asString());
    if (v["cuda"]["gpus"].empty()) {
      EXPECT_FALSE(path["active"].asBool());
      EXPECT_NE(path["detail"].asString().find("not checked"), std::string::npos);
    }
  }
  for (const char* name :
       {"flash_attention", "cudnn_attention", "gemm_bias_epilogue", "rope_in_attention",
        "logits_16bit", "activations_16bit_alone", "gate_up_16bit", "attention_16bit_alone",
        "attention_grad_16bit", "swiglu_grad_16bit", "norm_grad_16bit", "gate_up_grad_16bit_alone",
        "qkv_grad_16bit_alone", "qkv_16bit", "gelu_16bit", "gelu_grad_16bit_alone"}) {
    EXPECT_EQ(listed.count(name), 1u) << name << ": " << r.out;
  }
}

TEST(ReportCli, MissingPathIsAUsageErrorNamingIt) {
  auto r = run_strata({"report", "--path", "/nonexistent/strata-dir"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/strata-dir"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata

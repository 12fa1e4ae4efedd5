// The quick-start demo (configs/demo.json, about three minutes on 2 cores) ends within 10% of the
// synthetic source's entropy floor (it measured +7.5% final, +7.7% eval, docs/trainer.md), with its
// training state on NVMe several times larger than the device budget it kept to. Slow: not in the
// default suite (ctest -L slow).
#include <gtest/gtest.h>
#include <json/json.h>

#include <cmath>
#include <memory>

#include "support/run_strata.h"

namespace strata {
namespace {

TEST(Demo, EndsNearTheEntropyFloorWithItsStateOnNvmeAboveTheDeviceBudget) {
  testing::TempDir dir;
  auto r = testing::run_strata({"train", "--config", testing::source_path("configs/demo.json"),
                                "--quiet", "--set", "strata.output_dir=" + dir.path() + "/out"},
                               {}, 900);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::CharReaderBuilder builder;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  Json::Value summary;
  std::string errors;
  ASSERT_TRUE(reader->parse(r.out.data(), r.out.data() + r.out.size(), &summary, &errors)) << r.out;
  const double floor = summary["entropy_floor"].asDouble();
  EXPECT_NEAR(floor, std::log(4.0), 1e-9);
  EXPECT_LE(summary["final_loss"].asDouble(), 1.10 * floor) << r.out;
  EXPECT_LE(summary["eval_loss"].asDouble(), 1.10 * floor) << r.out;
  EXPECT_LE(summary["device_bytes_peak"].asUInt64(), 12ull << 20);
  EXPECT_EQ(summary["device_bytes_max"].asUInt64(), 12ull << 20);
  EXPECT_GE(summary["nvme_bytes_peak"].asUInt64(), 3 * summary["device_bytes_max"].asUInt64());
}

}  // namespace
}  // namespace strata

// Offloaded state survives what goes wrong: a checkpoint of NVMe-homed state resumes
// bit-identically; EIO or ENOSPC from the drive in the middle of a run (through the I/O fault
// twin) stops training with an error that names the file and leaves the last checkpoint intact
// and loadable; an unusable nvme_path is refused before training starts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/sim/sim_engine.h"
#include "support/run_strata.h"
#include "train/checkpoint.h"
#include "train/offload_support.h"

namespace strata {
namespace {

using testing::TempDir;
using testing::Tiers;

const Tiers kBothNvme{"both_nvme", 3, "nvme", "nvme", R"(, "sub_group_size": 4096)", ""};

struct Scenario {
  TempDir dir;
  config::Config config;
  io::SimControl* control = nullptr;
  train::TrainerOptions options;

  explicit Scenario(const std::string& family = "gpt2", std::uint64_t sim_capacity = 0) {
    std::filesystem::create_directories(dir.path() + "/nvme");
    config = testing::load(testing::tiny_config(family, "bf16", kBothNvme, dir.path() + "/out",
                                                dir.path() + "/nvme", 8));
    options.quiet = true;
    if (sim_capacity > 0) {
      options.engine_factory =
          [this,
           sim_capacity](const io::EngineOptions& eo) -> Result<std::unique_ptr<io::IoEngine>> {
        io::SimOptions so;
        so.seed = 7;
        so.capacity_bytes = sim_capacity;
        auto engine = io::make_sim_engine(eo, so);
        if (engine.is_ok()) control = io::sim_control(engine->get());
        return engine;
      };
    }
  }
  std::unique_ptr<train::Trainer> trainer(const std::vector<std::string>& overrides = {}) {
    config::Config c = config;
    if (!overrides.empty()) {
      auto loaded = config::load_config_text(config::to_json(config), "test", overrides);
      EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
      c = loaded->config;
    }
    auto t = train::Trainer::create(c, options);
    EXPECT_TRUE(t.is_ok()) << t.status().to_string();
    return t.is_ok() ? std::move(*t) : nullptr;
  }
};

std::vector<double> steps(train::Trainer& t, int n) {
  std::vector<double> losses;
  for (int i = 0; i < n; ++i) {
    auto r = t.train_step();
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) break;
    losses.push_back(r->loss);
  }
  return losses;
}

TEST(OffloadCheckpoint, NvmeStateResumesBitIdentically) {
  for (const char* family : {"gpt2", "llama"}) {
    Scenario straight(family), split(family);
    auto a = straight.trainer();
    ASSERT_NE(a, nullptr);
    const std::vector<double> all = steps(*a, 4);
    const std::vector<float> expected = testing::state_bytes(*a);

    auto b = split.trainer();
    ASSERT_NE(b, nullptr);
    std::vector<double> losses = steps(*b, 2);
    auto dir = b->save_checkpoint();
    ASSERT_TRUE(dir.is_ok()) << dir.status().to_string();
    b.reset();
    auto c = split.trainer({"strata.resume_from=" + *dir});
    ASSERT_NE(c, nullptr);
    const std::vector<double> rest = steps(*c, 2);
    losses.insert(losses.end(), rest.begin(), rest.end());
    EXPECT_EQ(losses, all) << family;
    EXPECT_TRUE(testing::same_bits(testing::state_bytes(*c), expected)) << family;
  }
}

void fault_mid_run(const io::SimFaults& faults, ErrorCode expected) {
  Scenario s("gpt2", 64ull << 20);
  auto t = s.trainer();
  ASSERT_NE(t, nullptr);
  ASSERT_NE(s.control, nullptr);
  steps(*t, 2);
  auto checkpoint = t->save_checkpoint();
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.status().to_string();
  s.control->set_faults(faults);
  Status failed;
  for (int i = 0; i < 3 && failed.is_ok(); ++i) {
    auto r = t->train_step();
    failed = r.is_ok() ? t->finish_step() : r.status();
  }
  ASSERT_FALSE(failed.is_ok()) << "no error surfaced";
  EXPECT_EQ(failed.code(), expected) << failed.to_string();
  EXPECT_NE(failed.to_string().find("strata-"), std::string::npos)
      << "names the swap file: " << failed.to_string();
  // A checkpoint attempt now fails too, without touching the last good one.
  EXPECT_FALSE(t->save_checkpoint().is_ok());
  t.reset();
  const std::string root = s.dir.path() + "/out/checkpoints";
  auto found = train::find_checkpoint(root);
  ASSERT_TRUE(found.is_ok());
  EXPECT_EQ(*found, *checkpoint);

  // It loads, and training from it continues exactly as a run that never failed.
  s.control = nullptr;
  s.options.engine_factory = nullptr;
  auto resumed = s.trainer({"strata.resume_from=" + root});
  ASSERT_NE(resumed, nullptr);
  steps(*resumed, 2);
  Scenario clean("gpt2");
  auto reference = clean.trainer();
  steps(*reference, 4);
  EXPECT_TRUE(testing::same_bits(testing::state_bytes(*resumed), testing::state_bytes(*reference)));
}

TEST(OffloadFaults, EioMidRunStopsTrainingAndKeepsTheLastCheckpoint) {
  io::SimFaults faults;
  faults.eio_rate = 1.0;
  fault_mid_run(faults, ErrorCode::kIo);
}

TEST(OffloadFaults, EnospcMidRunStopsTrainingAndKeepsTheLastCheckpoint) {
  io::SimFaults faults;
  faults.enospc_rate = 1.0;
  fault_mid_run(faults, ErrorCode::kNoSpace);
}

TEST(OffloadFaults, NvmePathWithoutRoomIsRefusedBeforeTraining) {
  Scenario s("gpt2", 256 << 10);  // the twin's disk holds 256 KiB; the swap files need more
  auto t = train::Trainer::create(s.config, s.options);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kNoSpace);
  EXPECT_NE(t.status().to_string().find(".nvme_path"), std::string::npos) << t.status().to_string();
  EXPECT_NE(t.status().message().find("free"), std::string::npos) << t.status().to_string();
}

TEST(OffloadFaults, NvmeBudgetBelowTheSwapFilesIsAConfigError) {
  Scenario s("gpt2");
  auto t = s.trainer();  // fits
  ASSERT_NE(t, nullptr);
  t.reset();
  auto small = train::Trainer::create(
      testing::load(config::to_json(s.config), {"strata.nvme_bytes_max=64KiB"}), s.options);
  ASSERT_FALSE(small.is_ok());
  EXPECT_EQ(small.status().context(), "strata.nvme_bytes_max");
}

TEST(OffloadFaults, MissingNvmePathIsCreatedAndReadOnlyOneRefusedByTheCli) {
  TempDir dir;
  const std::string config =
      dir.write_file("c.json", testing::tiny_config("gpt2", "bf16", kBothNvme, dir.path() + "/out",
                                                    dir.path() + "/nowhere/swap", 2));
  // A missing nvme_path is created for the user, private to them.
  auto missing = testing::run_strata({"train", "--config", config, "--quiet"});
  EXPECT_EQ(missing.exit_code, 0) << missing.err;
  EXPECT_EQ(std::filesystem::status(dir.path() + "/nowhere/swap").permissions(),
            std::filesystem::perms::owner_all);

  // A directory nobody can create files in: chmod 0555 (as root that is not enough, so then a
  // read-only kernel directory).
  std::string read_only = dir.path() + "/ro";
  std::filesystem::create_directories(read_only);
  std::filesystem::permissions(
      read_only, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  if (std::ofstream(read_only + "/probe")) {
    std::filesystem::remove(read_only + "/probe");
    read_only = "/sys/kernel";
    if (std::ofstream(read_only + "/strata-probe")) GTEST_SKIP() << "no read-only directory here";
  }
  auto ro = testing::run_strata({"train", "--config", config, "--quiet", "--set",
                                 "strata.output_dir=" + dir.path() + "/out2", "--set",
                                 "zero_optimization.offload_param.nvme_path=" + read_only, "--set",
                                 "zero_optimization.offload_optimizer.nvme_path=" + read_only});
  EXPECT_EQ(ro.exit_code, 1);
  EXPECT_NE(ro.err.find("nvme_path"), std::string::npos) << ro.err;
  EXPECT_NE(ro.err.find(read_only), std::string::npos) << ro.err;
  std::filesystem::permissions(dir.path() + "/ro", std::filesystem::perms::owner_all);
}

}  // namespace
}  // namespace strata

// Offloaded state survives what goes wrong: a checkpoint of NVMe-homed state resumes
// bit-identically; EIO or ENOSPC from the drive in the middle of a run (through the I/O fault
// twin) stops training with an error that names the file and leaves the last checkpoint intact
// and loadable; an unusable nvme_path is refused before training starts. Swap files fail cleanly
// with the real engines too (common/fault_points.h): a corrupt parameter or optimizer extent,
// ENOSPC or EIO on a .swp file stop the run (in-process and from the CLI: exit 1, no hang) with
// an error naming the file, remove the run's swap folder and leave the last checkpoint loadable.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "checkpoint/checkpoint.h"
#include "common/fault_points.h"
#include "io/sim/sim_engine.h"
#include "support/run_strata.h"
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
  auto found = checkpoint::find_checkpoint(root);
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

// ---- swap files fail cleanly (real engines, fault_points.h) ----------------------------------

constexpr int kFaultSteps = 4;  // a checkpoint after step 2, the fault in the resumed run

// What a failure injected into the run resumed from step 2 looks like.
struct Injection {
  std::string name;
  std::optional<SwapCorruption> corrupt;  // or:
  std::optional<IoFault> io;              // nth is placed by place_io_fault()
  ErrorCode code = ErrorCode::kCorrupt;
  std::vector<std::string> says;  // fragments of the error
};

struct ClearInjection {
  ~ClearInjection() {
    set_swap_corruption(std::nullopt);
    set_io_fault(std::nullopt);
  }
};

// Runs `body` and fails the whole test program if it does not end within `seconds`: a hang is the
// bug these tests guard against, and a hung thread cannot be stopped.
template <typename F>
void within(int seconds, const char* what, F body) {
  auto done = std::async(std::launch::async, body);
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: %s did not end within %d s (hang)\n", what, seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  done.get();
}

std::vector<std::string> swap_folders(const std::string& nvme) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(nvme)) {
    if (e.path().filename().string().rfind("strata-swap-", 0) == 0) found.push_back(e.path());
  }
  return found;
}

// A run of 2 steps with a checkpoint; returns the checkpoint's directory.
std::string checkpointed_run(Scenario& s) {
  auto t = s.trainer();
  if (t == nullptr) return "";
  steps(*t, 2);
  auto checkpoint = t->save_checkpoint();
  EXPECT_TRUE(checkpoint.is_ok()) << checkpoint.status().to_string();
  return checkpoint.is_ok() ? *checkpoint : "";
}

// Engine writes to files matching `text` that a run resumed from `root` makes while it is created,
// and by the end of its first step: an I/O fault between the two strikes mid-step.
std::pair<std::uint64_t, std::uint64_t> writes_of_resume(Scenario& s, const std::string& root,
                                                         const std::string& text) {
  ClearInjection clear;
  set_io_fault(IoFault{text, ~0ull, EIO, false, true});
  auto t = s.trainer({"strata.resume_from=" + root});
  if (t == nullptr) return {0, 0};
  const std::uint64_t created = io_fault_operations();
  steps(*t, 1);
  EXPECT_TRUE(t->finish_step().is_ok());
  return {created, io_fault_operations()};
}

// The checkpoint is still the latest, loads, and training from it goes on.
void expect_checkpoint_intact(Scenario& s, const std::string& checkpoint) {
  const std::string root = s.dir.path() + "/out/checkpoints";
  auto found = checkpoint::find_checkpoint(root);
  ASSERT_TRUE(found.is_ok()) << found.status().to_string();
  EXPECT_EQ(*found, checkpoint);
  auto resumed = s.trainer({"strata.resume_from=" + root});
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(steps(*resumed, 2).size(), 2u);
  EXPECT_TRUE(resumed->finish_step().is_ok());
}

void expect_named(const std::string& text, const Injection& f) {
  for (const std::string& fragment : f.says)
    EXPECT_NE(text.find(fragment), std::string::npos) << f.name << ": no '" << fragment << "' in\n"
                                                      << text;
}

void fail_in_process(Injection f) {
  ClearInjection clear;
  Scenario s;
  const std::string checkpoint = checkpointed_run(s);
  ASSERT_FALSE(checkpoint.empty());
  const std::string root = s.dir.path() + "/out/checkpoints";
  if (f.io) {
    const auto [created, stepped] = writes_of_resume(s, root, f.io->path_contains);
    ASSERT_GT(stepped, created + 1) << f.name;
    f.io->nth = (created + stepped) / 2;
    set_io_fault(f.io);
  } else {
    set_swap_corruption(f.corrupt);
  }
  std::unique_ptr<train::Trainer> t;
  Status failed;
  within(60, "the failing run", [&] {
    auto made = train::Trainer::create(
        testing::load(config::to_json(s.config), {"strata.resume_from=" + root}), s.options);
    if (!made.is_ok()) {
      failed = made.status();
      return;
    }
    t = std::move(*made);
    for (int i = 0; i < kFaultSteps && failed.is_ok(); ++i) {
      auto r = t->train_step();
      failed = r.is_ok() ? t->finish_step() : r.status();
    }
  });
  ASSERT_FALSE(failed.is_ok()) << f.name << ": no error surfaced";
  EXPECT_EQ(failed.code(), f.code) << failed.to_string();
  expect_named(failed.to_string(), f);
  within(30, "tearing down the failed run", [&] { t.reset(); });
  EXPECT_TRUE(swap_folders(s.dir.path() + "/nvme").empty()) << f.name;
  set_swap_corruption(std::nullopt);
  set_io_fault(std::nullopt);
  expect_checkpoint_intact(s, checkpoint);
}

void fail_from_the_cli(Injection f) {
  ClearInjection clear;
  Scenario s;
  const std::string checkpoint = checkpointed_run(s);
  ASSERT_FALSE(checkpoint.empty());
  const std::string root = s.dir.path() + "/out/checkpoints";
  std::string env;
  if (f.io) {
    const auto [created, stepped] = writes_of_resume(s, root, f.io->path_contains);
    ASSERT_GT(stepped, created + 1) << f.name;
    env = "STRATA_TEST_IO_FAULT=" + f.io->path_contains + ":" +
          std::to_string((created + stepped) / 2) + ":" + strerrorname_np(f.io->error) + ":write";
  } else {
    env = "STRATA_TEST_SWAP_CORRUPT=" + f.corrupt->kind + ":" + std::to_string(f.corrupt->nth);
  }
  const std::string config = s.dir.write_file("c.json", config::to_json(s.config));
  auto run = testing::run_strata(
      {"train", "--config", config, "--quiet", "--set", "strata.resume_from=" + root}, {env}, 30);
  EXPECT_EQ(run.exit_code, 1) << f.name << " (" << env << "):\n" << run.err;
  expect_named(run.err, f);
  EXPECT_TRUE(swap_folders(s.dir.path() + "/nvme").empty()) << f.name << "\n" << run.err;
  expect_checkpoint_intact(s, checkpoint);
}

// Written while the checkpoint loads, read in step 3. The second parameter extent is the first
// tile of block.0, a unit of several tiles: its fetch fails with reads of the unit still to wait
// for (the case that once left the fetch in flight forever, hanging teardown).
Injection corrupt(const std::string& kind, std::uint64_t nth) {
  Injection f;
  f.name = "corrupt " + kind;
  f.corrupt = SwapCorruption{kind, nth};
  f.code = ErrorCode::kCorrupt;
  f.says = {"checksum mismatch", "strata-" + kind + "-r0.swp"};
  return f;
}

Injection drive_error(int error) {
  Injection f;
  f.name = strerrorname_np(error);
  f.io = IoFault{"strata-master-r0.swp", 0, error, false, true};  // a write fails
  f.code = error == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIo;
  f.says = {"strata-master-r0.swp", strerrorname_np(error)};
  if (error == ENOSPC) f.says.push_back("no space");
  return f;
}

TEST(SwapFailsCleanly, CorruptOptimizerExtentInProcess) {
  fail_in_process(corrupt("master", 1));
}
TEST(SwapFailsCleanly, CorruptParameterExtentInProcess) {
  fail_in_process(corrupt("param", 2));
}
TEST(SwapFailsCleanly, CorruptOptimizerExtentFromTheCli) {
  fail_from_the_cli(corrupt("master", 1));
}
TEST(SwapFailsCleanly, CorruptParameterExtentFromTheCli) {
  fail_from_the_cli(corrupt("param", 2));
}
TEST(SwapFailsCleanly, EnospcOnASwapFileInProcess) {
  fail_in_process(drive_error(ENOSPC));
}
TEST(SwapFailsCleanly, EnospcOnASwapFileFromTheCli) {
  fail_from_the_cli(drive_error(ENOSPC));
}
TEST(SwapFailsCleanly, EioOnASwapFileInProcess) {
  fail_in_process(drive_error(EIO));
}
TEST(SwapFailsCleanly, EioOnASwapFileFromTheCli) {
  fail_from_the_cli(drive_error(EIO));
}

}  // namespace
}  // namespace strata

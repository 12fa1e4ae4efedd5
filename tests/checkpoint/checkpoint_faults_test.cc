// A checkpoint write that fails — a full disk or an I/O error in a rank file, the manifest or
// `latest` (injected: common/fault_points.h) — is an error naming the file, and the last good
// checkpoint stays where `latest` names it, loadable. The checkpoint root: rotation keeps the
// newest N and never the wrong thing; a hostile `latest` is refused by name.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/root.h"
#include "common/fault_points.h"
#include "tests/support/run_strata.h"
#include "tests/train/rank_state_checks.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr std::uint64_t kSeed = 11;

struct FaultScope {
  explicit FaultScope(FileFault fault) { set_file_fault(std::move(fault)); }
  ~FaultScope() { set_file_fault(std::nullopt); }
};

Result<std::string> checkpoint(const std::string& root, std::int64_t step, int keep_last = 0) {
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  testing::checked_fill_known(*one, static_cast<int>(step));
  CheckpointOptions options;
  options.keep_last = keep_last;
  return write_checkpoint(root, testing::counters_after(step), *one->state, one->shape, "fp32",
                          kSeed, options);
}

void expect_last_good(const std::string& root, std::int64_t step) {
  EXPECT_EQ(testing::read_file(root + "/latest"), fmt::format("step_{:08d}\n", step));
  auto dir = find_checkpoint(root);
  ASSERT_TRUE(dir.is_ok()) << dir.status().to_string();
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  auto counters = read_checkpoint(*dir, *one->state, one->shape, "fp32", kSeed);
  ASSERT_TRUE(counters.is_ok()) << counters.status().to_string();
  EXPECT_EQ(counters->step, step);
  EXPECT_EQ(testing::checked_count_unknown(*one, static_cast<int>(step)), 0);
}

struct Fault {
  const char* file;  // part of the failing file's path
  FileOp op;
  int error;
  ErrorCode code;
  std::uint64_t after_bytes = 100;
};

TEST(CheckpointFaults, AFailedWriteNamesTheFileAndKeepsTheLastCheckpoint) {
  const Fault faults[] = {
      {"state-rank00000-of-00001.safetensors.tmp", FileOp::kWrite, 28, ErrorCode::kNoSpace},
      {"state-rank00000-of-00001.safetensors.tmp", FileOp::kWrite, 5, ErrorCode::kIo},
      {"state-rank00000-of-00001.safetensors.tmp", FileOp::kSync, 5, ErrorCode::kIo},
      {"trainer_state.json.tmp", FileOp::kWrite, 28, ErrorCode::kNoSpace},
      {"trainer_state.json.tmp", FileOp::kSync, 5, ErrorCode::kIo},
      {"step_00000004", FileOp::kRename, 28, ErrorCode::kNoSpace},
      {"latest.tmp", FileOp::kWrite, 28, ErrorCode::kNoSpace, 0},
  };
  for (const Fault& f : faults) {
    testing::TempDir dir;
    ASSERT_TRUE(checkpoint(dir.path(), 2).is_ok());
    Result<std::string> failed = Status(ErrorCode::kInternal, "not run");
    {
      FaultScope scope(FileFault{f.file, f.op, f.error, f.after_bytes});
      failed = checkpoint(dir.path(), 4);
    }
    ASSERT_FALSE(failed.is_ok()) << f.file;
    EXPECT_EQ(failed.status().code(), f.code) << failed.status().to_string();
    EXPECT_NE(failed.status().to_string().find(f.file), std::string::npos)
        << failed.status().to_string();
    expect_last_good(dir.path(), 2);
    // Only a failure of `latest` itself comes after step 4's directory is complete.
    EXPECT_EQ(fs::exists(dir.path() + "/step_00000004/trainer_state.json"),
              std::string(f.file) == "latest.tmp")
        << f.file;
    // The next attempt, with the disk fine again, succeeds.
    ASSERT_TRUE(checkpoint(dir.path(), 4).is_ok()) << f.file;
    expect_last_good(dir.path(), 4);
  }
}

TEST(CheckpointRoot, KeepLastRemovesOnlyOlderCompleteAndTornCheckpoints) {
  testing::TempDir dir;
  for (std::int64_t step : {1, 2, 3})
    ASSERT_TRUE(checkpoint(dir.path(), step).is_ok());
  fs::create_directories(dir.path() + "/step_00000002.tmp");  // torn, older
  fs::create_directories(dir.path() + "/notes");              // not ours
  fs::create_directories(dir.path() + "/step_00000009.tmp");  // torn, newer than the current
  ASSERT_TRUE(checkpoint(dir.path(), 4, 2).is_ok());
  auto steps = list_checkpoints(dir.path());
  ASSERT_TRUE(steps.is_ok());
  EXPECT_EQ(*steps, (std::vector<std::int64_t>{3, 4}));
  EXPECT_FALSE(fs::exists(dir.path() + "/step_00000002.tmp"));
  EXPECT_TRUE(fs::exists(dir.path() + "/notes"));
  EXPECT_TRUE(fs::exists(dir.path() + "/step_00000009.tmp"));
  expect_last_good(dir.path(), 4);
  ASSERT_TRUE(checkpoint(dir.path(), 5, 1).is_ok());
  EXPECT_EQ(*list_checkpoints(dir.path()), (std::vector<std::int64_t>{5}));
}

TEST(CheckpointRoot, AHostileLatestIsRefusedByName) {
  testing::TempDir dir;
  ASSERT_TRUE(checkpoint(dir.path(), 1).is_ok());
  const std::string latest = dir.path() + "/latest";
  for (const std::string& text : {std::string("../../etc\n"), std::string("step_1/../../x\n"),
                                  std::string(5000, 'x'), std::string("")}) {
    fs::remove(latest);
    dir.write_file("latest", text);
    auto found = find_checkpoint(dir.path());
    ASSERT_FALSE(found.is_ok()) << text.substr(0, 20);
    EXPECT_NE(found.status().to_string().find(latest), std::string::npos)
        << found.status().to_string();
  }
  fs::remove(latest);
  ASSERT_EQ(::mkfifo(latest.c_str(), 0600), 0);  // would hang a plain read
  EXPECT_NE(find_checkpoint(dir.path()).status().message().find("FIFO"), std::string::npos);
  fs::remove(latest);
  dir.write_file("latest", "step_00000007\n");  // names a checkpoint that is not there
  EXPECT_EQ(find_checkpoint(dir.path()).status().code(), ErrorCode::kNotFound);
}

TEST(CheckpointRoot, APathComponentTooLongIsAnErrorNotAnException) {
  const std::string path = "/tmp/" + std::string(300, 'c');
  auto found = find_checkpoint(path);
  ASSERT_FALSE(found.is_ok());
  EXPECT_NE(found.status().to_string().find("too long"), std::string::npos)
      << found.status().to_string();
  Status prepared = prepare_checkpoint(path, 1).status();
  EXPECT_FALSE(prepared.is_ok());
}

TEST(CheckpointRoot, AManifestThatIsALinkToDevZeroIsRefusedPromptly) {
  testing::TempDir dir;
  auto written = checkpoint(dir.path(), 1);
  ASSERT_TRUE(written.is_ok());
  fs::remove(*written + "/trainer_state.json");
  fs::create_symlink("/dev/zero", *written + "/trainer_state.json");
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  Status s = read_checkpoint(*written, *one->state, one->shape, "fp32", kSeed).status();
  EXPECT_NE(s.message().find("character device"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace strata::checkpoint

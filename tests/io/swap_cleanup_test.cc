// Stale swap folders: a crashed run's are cleaned by the next run; a live run's, another user's,
// symlinks and files Strata did not make are never touched.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "io/swap_space.h"
#include "support/run_strata.h"

namespace strata::io {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

constexpr std::uint64_t kMiB = 1 << 20;

SwapOptions options_in(const std::string& dir, const std::string& tag) {
  SwapOptions o;
  o.dirs = {dir};
  o.tag = tag;
  o.kinds = {{"master", 2 * kMiB}};
  return o;
}

std::unique_ptr<IoEngine> uring() {
  EngineOptions o;
  o.kind = EngineKind::kUring;
  return std::move(make_engine(o)).value();
}

// A stale-looking run folder made by hand: Strata's lock text, nobody holding the lock.
std::string make_stale(const std::string& dir, const std::string& tag) {
  const std::string run = dir + "/strata-swap-u" + std::to_string(::geteuid()) + "-" + tag;
  fs::create_directory(run);
  std::ofstream(run + "/strata-swap.lock") << "strata-swap v1\nuid=0\npid=1\nhost=x\n";
  std::ofstream(run + "/strata-master-r0.swp") << "STRATA-SWAP v1 kind=master rank=0\n";
  return run;
}

TEST(SwapCleanup, ACrashedRunsFolderIsRemovedByTheNextRun) {
  TempDir dir;
  std::string crashed_run;
  // The child makes a swap space and dies without cleaning up (the process is single-threaded
  // when it forks: no engine is alive in this test yet).
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto engine = uring();
    auto space = SwapSpace::create(engine.get(), options_in(dir.path(), "crashed"));
    ::_exit(space.is_ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  crashed_run = dir.path() + "/strata-swap-u" + std::to_string(::geteuid()) + "-crashed";
  ASSERT_TRUE(fs::exists(crashed_run + "/strata-master-r0.swp"));

  auto engine = uring();
  auto space = SwapSpace::create(engine.get(), options_in(dir.path(), "next"));
  ASSERT_TRUE(space.is_ok()) << space.status().to_string();
  EXPECT_FALSE(fs::exists(crashed_run));
}

TEST(SwapCleanup, ALiveRunsFolderIsLeftAlone) {
  TempDir dir;
  auto engine = uring();
  auto live = SwapSpace::create(engine.get(), options_in(dir.path(), "live"));
  ASSERT_TRUE(live.is_ok());
  StaleCleanup report = clean_stale_swap({dir.path()}, ::geteuid());
  ASSERT_EQ(report.live_dirs.size(), 1u);
  EXPECT_EQ(report.live_dirs[0], (*live)->run_dirs()[0]);
  EXPECT_TRUE(report.removed_dirs.empty());
  EXPECT_TRUE(fs::exists((*live)->kind_paths(0)[0]));
  // The same run name cannot be taken while the run lives.
  auto twin = SwapSpace::create(engine.get(), options_in(dir.path(), "live"));
  ASSERT_FALSE(twin.is_ok());
  EXPECT_NE(twin.status().message().find("a live run holds it"), std::string::npos);
}

TEST(SwapCleanup, FilesStrataDidNotMakeAreKept) {
  TempDir dir;
  const std::string run = make_stale(dir.path(), "old");
  std::ofstream(run + "/notes.txt") << "mine";
  std::ofstream(run + "/strata-exp_avg-r0.swp") << "not a swap header";
  StaleCleanup report = clean_stale_swap({dir.path()}, ::geteuid());
  EXPECT_FALSE(fs::exists(run + "/strata-master-r0.swp"));  // Strata's: removed
  EXPECT_TRUE(fs::exists(run + "/notes.txt"));
  EXPECT_TRUE(fs::exists(run + "/strata-exp_avg-r0.swp"));  // right name, wrong header
  ASSERT_EQ(report.kept.size(), 1u);
  EXPECT_NE(report.kept[0].find("holds files Strata did not make"), std::string::npos);
  EXPECT_NE(report.kept[0].find("notes.txt"), std::string::npos);
}

TEST(SwapCleanup, AFolderWithAForeignLockIsKept) {
  TempDir dir;
  const std::string run = make_stale(dir.path(), "foreign");
  std::ofstream(run + "/strata-swap.lock", std::ios::trunc) << "something else\n";
  StaleCleanup report = clean_stale_swap({dir.path()}, ::geteuid());
  EXPECT_TRUE(fs::exists(run + "/strata-master-r0.swp"));
  ASSERT_EQ(report.kept.size(), 1u);
  EXPECT_NE(report.kept[0].find("lock file is not Strata's"), std::string::npos);
}

TEST(SwapCleanup, AnotherUsersFolderAndSymlinksAreNotTouched) {
  TempDir dir;
  const std::string other = make_stale(dir.path(), "other");
  ASSERT_EQ(::chown(other.c_str(), 12345, 12345), 0);
  TempDir target;
  const std::string victim = make_stale(target.path(), "victim");
  const std::string link = dir.path() + "/strata-swap-u" + std::to_string(::geteuid()) + "-link";
  fs::create_directory_symlink(victim, link);
  StaleCleanup report = clean_stale_swap({dir.path()}, ::geteuid());
  EXPECT_TRUE(fs::exists(other + "/strata-master-r0.swp"));
  EXPECT_TRUE(fs::exists(victim + "/strata-master-r0.swp"));
  EXPECT_TRUE(report.removed_dirs.empty());
  EXPECT_EQ(report.kept.size(), 2u);
}

TEST(SwapCleanup, AStaleFolderOfStrataFilesIsRemovedWhole) {
  TempDir dir;
  const std::string run = make_stale(dir.path(), "whole");
  StaleCleanup report = clean_stale_swap({dir.path()}, ::geteuid());
  ASSERT_EQ(report.removed_dirs.size(), 1u);
  EXPECT_EQ(report.removed_dirs[0], run);
  EXPECT_FALSE(fs::exists(run));
}

TEST(SwapCleanup, AFolderALiveProcessIsMakingIsLeftAlone) {
  // Made under the maker's own name, without its lock yet: the state another rank starting beside
  // it could see (it removed such folders while they were being made, and the maker failed).
  TempDir dir;
  const std::string making = dir.path() + "/.strata-swap-u" + std::to_string(::geteuid()) +
                             "-r1.p" + std::to_string(::getpid());
  fs::create_directory(making);
  StaleCleanup report = clean_stale_swap({dir.path()}, ::geteuid());
  EXPECT_TRUE(fs::exists(making));
  EXPECT_TRUE(report.removed_dirs.empty());
  EXPECT_TRUE(report.kept.empty());
}

TEST(SwapCleanup, AFolderADeadProcessWasMakingIsRemoved) {
  TempDir dir;
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const std::string making = dir.path() + "/.strata-swap-u" + std::to_string(::geteuid()) +
                             "-r1.p" + std::to_string(child);
  fs::create_directory(making);
  StaleCleanup report = clean_stale_swap({dir.path()}, ::geteuid());
  EXPECT_FALSE(fs::exists(making));
  ASSERT_EQ(report.removed_dirs.size(), 1u);
}

TEST(SwapCleanup, RunsStartingTogetherBesideEachOtherAllGetTheirFolders) {
  // Each starting run cleans the folder before it makes its own, as ranks on one node do.
  TempDir dir;
  constexpr int kRuns = 8;
  constexpr int kRounds = 20;
  std::vector<pid_t> children;
  for (int i = 0; i < kRuns; ++i) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto engine = uring();
      for (int round = 0; round < kRounds; ++round) {
        auto space =
            SwapSpace::create(engine.get(), options_in(dir.path(), "r" + std::to_string(i)));
        if (!space.is_ok()) ::_exit(1);
      }
      ::_exit(0);
    }
    children.push_back(child);
  }
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

}  // namespace
}  // namespace strata::io

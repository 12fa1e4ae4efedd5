// The directory lock (common/dir_lock.h): one holder at a time, the holder named to whoever is
// refused, no stale lock after a process dies, and the exclusive-file fallback for file systems
// where flock does not work (forced here with set_flock_disabled).
#include "common/dir_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/fault_points.h"
#include "support/run_strata.h"

namespace strata {
namespace {

using testing::read_file;
using testing::TempDir;

LockRequest request_for(const std::string& dir) {
  LockRequest r;
  r.dir = dir;
  r.context = "test.dir";
  r.advice = "wait for it";
  return r;
}

bool exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

// Runs the tests once with flock and once with the exclusive-file fallback.
class DirLockTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { set_flock_disabled(GetParam()); }
  void TearDown() override { set_flock_disabled(false); }
  LockMode expected_mode() const {
    return GetParam() ? LockMode::kExclusiveFile : LockMode::kFlock;
  }
};

TEST_P(DirLockTest, OneHolderAtATimeAndTheRefusalNamesIt) {
  TempDir dir;
  Result<DirLock> first = DirLock::acquire(request_for(dir.path()));
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_TRUE(first->held());
  EXPECT_EQ(first->mode(), expected_mode());
  EXPECT_EQ(first->path(), dir.path() + "/" + kDirLockName);
  const LockHolder holder = parse_lock_holder(read_file(first->path()));
  EXPECT_EQ(holder.pid, ::getpid());
  EXPECT_EQ(holder.start_ticks, this_process().start_ticks);
  EXPECT_NE(holder.command.find("strata_common_unit_tests"), std::string::npos) << holder.command;

  // A second acquire (a new open file, as another process would make) is refused.
  Result<DirLock> second = DirLock::acquire(request_for(dir.path()));
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), ErrorCode::kConfig);
  const std::string message = second.status().to_string();
  EXPECT_NE(message.find(dir.path() + " is in use by another Strata process: pid " +
                         std::to_string(::getpid()) + " on host " + this_process().host),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(this_process().started), std::string::npos) << message;
  EXPECT_NE(message.find("wait for it"), std::string::npos) << message;
  EXPECT_NE(message.find("test.dir"), std::string::npos) << message;

  // Released: the file goes, and the next one takes it.
  first->release();
  EXPECT_FALSE(first->held());
  EXPECT_FALSE(exists(dir.path() + "/" + kDirLockName));
  Result<DirLock> third = DirLock::acquire(request_for(dir.path()));
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
  // Nothing but the lock is left in the folder (no probe or private files).
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), kDirLockName);
  }
  EXPECT_EQ(files, 1);
}

TEST_P(DirLockTest, ALockIsFreedWhenItsProcessIsKilled) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<DirLock> lock = DirLock::acquire(request_for(dir.path()));
    const char ok = lock.is_ok() ? 'y' : 'n';
    if (::write(ready[1], &ok, 1) != 1) ::_exit(3);
    ::pause();  // killed by the parent, holding the lock
    ::_exit(0);
  }
  ::close(ready[1]);
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(ok, 'y');
  Result<DirLock> while_alive = DirLock::acquire(request_for(dir.path()));
  ASSERT_FALSE(while_alive.is_ok());
  EXPECT_NE(while_alive.status().to_string().find("pid " + std::to_string(child)),
            std::string::npos)
      << while_alive.status().to_string();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // The dead holder's file is still there; it is taken all the same.
  EXPECT_TRUE(exists(dir.path() + "/" + kDirLockName));
  Result<DirLock> after = DirLock::acquire(request_for(dir.path()));
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  EXPECT_EQ(parse_lock_holder(read_file(after->path())).pid, ::getpid());
}

// Processes started together race for one lock: exactly one holds it, every round.
TEST_P(DirLockTest, ExactlyOneOfManyRacingProcessesGetsIt) {
  constexpr int kProcesses = 6;
  constexpr int kRounds = 10;
  for (int round = 0; round < kRounds; ++round) {
    TempDir dir;
    int go[2], results[2], done[2];
    ASSERT_EQ(::pipe(go), 0);
    ASSERT_EQ(::pipe(results), 0);
    ASSERT_EQ(::pipe(done), 0);
    std::vector<pid_t> children;
    for (int i = 0; i < kProcesses; ++i) {
      const pid_t child = ::fork();
      ASSERT_GE(child, 0);
      if (child == 0) {
        ::close(go[1]);
        ::close(done[1]);
        char byte = 0;
        if (::read(go[0], &byte, 1) != 1) ::_exit(3);  // the barrier
        Result<DirLock> lock = DirLock::acquire(request_for(dir.path()));
        const char got =
            lock.is_ok() ? 'y' : (lock.status().code() == ErrorCode::kConfig ? 'n' : 'e');
        if (::write(results[1], &got, 1) != 1) ::_exit(3);
        if (::read(done[0], &byte, 1) < 0) ::_exit(3);  // hold until every process has tried
        ::_exit(0);
      }
      children.push_back(child);
    }
    ::close(go[0]);
    ::close(results[1]);
    ::close(done[0]);
    const std::string release(kProcesses, 'g');
    ASSERT_EQ(::write(go[1], release.data(), release.size()), static_cast<ssize_t>(release.size()));
    int held = 0, refused = 0;
    for (int i = 0; i < kProcesses; ++i) {
      char got = 0;
      ASSERT_EQ(::read(results[0], &got, 1), 1);
      held += got == 'y';
      refused += got == 'n';
    }
    ::close(done[1]);  // every child reads end-of-file and exits
    for (pid_t child : children) {
      int status = 0;
      ASSERT_EQ(::waitpid(child, &status, 0), child);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    ::close(go[1]);
    ::close(results[0]);
    EXPECT_EQ(held, 1) << "round " << round;
    EXPECT_EQ(refused, kProcesses - 1) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(FlockAndExclusiveFile, DirLockTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "ExclusiveFile" : "Flock";
                         });

// A lock file as another process would have written it.
void write_lock_file(const std::string& path, const LockHolder& h) {
  std::ofstream out(path);
  out << "strata-lock v1\npid=" << h.pid << "\nhost=" << h.host << "\nstarted=" << h.started
      << "\nstart_ticks=" << h.start_ticks << "\ncommand=" << h.command << "\n";
}

pid_t a_dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

class ExclusiveFileLock : public ::testing::Test {
 protected:
  void SetUp() override { set_flock_disabled(true); }
  void TearDown() override { set_flock_disabled(false); }
};

TEST_F(ExclusiveFileLock, TakesOverTheLockOfAProcessThatEndedOnThisHost) {
  TempDir dir;
  LockHolder dead = this_process();
  dead.pid = a_dead_pid();
  dead.command = "strata train --config dead.json";
  write_lock_file(dir.path() + "/" + kDirLockName, dead);
  Result<DirLock> lock = DirLock::acquire(request_for(dir.path()));
  ASSERT_TRUE(lock.is_ok()) << lock.status().to_string();
  EXPECT_EQ(lock->mode(), LockMode::kExclusiveFile);
  EXPECT_EQ(parse_lock_holder(read_file(lock->path())).pid, ::getpid());
}

TEST_F(ExclusiveFileLock, TakesOverALockWhosePidWasReused) {
  TempDir dir;
  LockHolder reused = this_process();  // this pid runs, but started at another time
  reused.start_ticks += 12345;
  write_lock_file(dir.path() + "/" + kDirLockName, reused);
  Result<DirLock> lock = DirLock::acquire(request_for(dir.path()));
  ASSERT_TRUE(lock.is_ok()) << lock.status().to_string();
}

TEST_F(ExclusiveFileLock, RefusesALockHeldFromAnotherHostAndSaysHowToClearIt) {
  TempDir dir;
  LockHolder remote = this_process();
  remote.host = "node-17.cluster";
  remote.pid = a_dead_pid();  // dead here, but that says nothing of node-17
  write_lock_file(dir.path() + "/" + kDirLockName, remote);
  Result<DirLock> lock = DirLock::acquire(request_for(dir.path()));
  ASSERT_FALSE(lock.is_ok());
  const std::string message = lock.status().to_string();
  EXPECT_NE(message.find("on host node-17.cluster"), std::string::npos) << message;
  EXPECT_NE(message.find("can be checked only on node-17.cluster; if it has ended, remove " +
                         dir.path() + "/" + kDirLockName),
            std::string::npos)
      << message;
}

TEST_F(ExclusiveFileLock, RefusesAFileItCannotRead) {
  TempDir dir;
  dir.write_file(kDirLockName, "not a lock\n");
  Result<DirLock> lock = DirLock::acquire(request_for(dir.path()));
  ASSERT_FALSE(lock.is_ok());
  EXPECT_NE(lock.status().to_string().find("is not a Strata lock file"), std::string::npos)
      << lock.status().to_string();
}

TEST_F(ExclusiveFileLock, ReleaseLeavesAnotherProcesssLockAlone) {
  TempDir dir;
  Result<DirLock> lock = DirLock::acquire(request_for(dir.path()));
  ASSERT_TRUE(lock.is_ok()) << lock.status().to_string();
  // Someone removed it by hand and another process took it: releasing must not remove theirs.
  LockHolder other = this_process();
  other.pid = 1;
  ASSERT_EQ(::unlink(lock->path().c_str()), 0);
  write_lock_file(lock->path(), other);
  lock->release();
  EXPECT_EQ(parse_lock_holder(read_file(dir.path() + "/" + kDirLockName)).pid, 1);
}

TEST(DirLock, FlockModeTakesAFileLeftBehindWithoutAHolder) {
  TempDir dir;
  dir.write_file(kDirLockName,
                 "strata-lock v1\npid=1\nhost=x\nstarted=?\nstart_ticks=0\ncommand=?\n");
  Result<DirLock> lock = DirLock::acquire(request_for(dir.path()));
  ASSERT_TRUE(lock.is_ok()) << lock.status().to_string();
  EXPECT_EQ(lock->mode(), LockMode::kFlock);
  EXPECT_EQ(parse_lock_holder(read_file(lock->path())).pid, ::getpid());
}

TEST(DirLock, RankFileNamesAndErrorsForAMissingDirectory) {
  EXPECT_EQ(dir_lock_name(0), ".strata.lock");
  EXPECT_EQ(dir_lock_name(3), ".strata.rank3.lock");
  TempDir dir;
  Result<DirLock> lock = DirLock::acquire(request_for(dir.path() + "/missing"));
  ASSERT_FALSE(lock.is_ok());
  EXPECT_EQ(lock.status().code(), ErrorCode::kIo);
  EXPECT_NE(lock.status().to_string().find(dir.path() + "/missing"), std::string::npos);
}

TEST(DirLock, ParsesOnlyCompleteLockFiles) {
  EXPECT_EQ(parse_lock_holder("").pid, 0);
  EXPECT_EQ(parse_lock_holder("strata-lock v1\npid=5\nhost=h\n").pid, 0);  // cut short
  const LockHolder h =
      parse_lock_holder("strata-lock v1\npid=5\nhost=h\nstarted=s\nstart_ticks=9\ncommand=a b\n");
  EXPECT_EQ(h.pid, 5);
  EXPECT_EQ(h.host, "h");
  EXPECT_EQ(h.start_ticks, 9u);
  EXPECT_EQ(h.describe(), "pid 5 on host h, started s: a b");
}

}  // namespace
}  // namespace strata

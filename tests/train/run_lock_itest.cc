// One run per output directory (docs/reliability.md, "One run per directory"): two `strata train`
// processes released at the same instant of their start-up (a FIFO barrier at the point where
// they take the lock, STRATA_TEST_BARRIER) on one output_dir — exactly one trains, with the bits
// of a lone run, and the other exits 2 before its first step naming the holder; a kill -9 leaves
// no stale lock; two resumes of one checkpoint root at once; a resume from a root a live run
// holds; rank 1's own lock on several ranks; `strata convert` into a directory in use.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/dir_lock.h"
#include "support/mpi_run.h"
#include "tests/train/reliability_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::losses_of;
using testing::read_file;
using testing::reliability_config;
using testing::same_bytes;
using testing::TempDir;
using testing::train_with;

// A `strata` process started in the background, its output going to files.
class Spawned {
 public:
  Spawned(const std::vector<std::string>& args, const std::vector<std::string>& env,
          const std::string& log_prefix)
      : out_path_(log_prefix + ".out"), err_path_(log_prefix + ".err") {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    pid_ = testing::spawn_program(STRATA_BINARY, args, env, actions);
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Spawned() {
    if (pid_ > 0 && exit_code_ < 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;

  pid_t pid() const { return pid_; }

  // Waits (at most timeout_s) and returns the exit code (128+N for signal N).
  int finish(int timeout_s = 300) {
    if (pid_ <= 0 || exit_code_ >= 0) return exit_code_;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "pid " << pid_ << " still runs after " << timeout_s << " s";
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_code_;
  }
  std::string err() const { return read_file_or_empty(err_path_); }

 private:
  static std::string read_file_or_empty(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

// The test's side of STRATA_TEST_BARRIER (common/fault_points.h): the FIFOs, the arrivals, the
// release of every process at once.
class Barrier {
 public:
  explicit Barrier(const std::string& dir) : dir_(dir) {
    EXPECT_EQ(::mkfifo((dir + "/arrive").c_str(), 0600), 0);
    EXPECT_EQ(::mkfifo((dir + "/go").c_str(), 0600), 0);
    arrive_ = ::open((dir + "/arrive").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    EXPECT_GE(arrive_, 0);
  }
  ~Barrier() {
    if (arrive_ >= 0) ::close(arrive_);
  }
  Barrier(const Barrier&) = delete;
  Barrier& operator=(const Barrier&) = delete;

  // "NAME:DIR" for STRATA_TEST_BARRIER.
  std::string env(const std::string& point) const {
    return "STRATA_TEST_BARRIER=" + point + ":" + dir_;
  }

  // Waits until `n` processes have arrived (at most 120 s); false when they did not.
  bool wait_arrivals(int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (lines_ < n && std::chrono::steady_clock::now() < deadline) {
      pollfd p{arrive_, POLLIN, 0};
      if (::poll(&p, 1, 100) == 1) {
        char buffer[256];
        const ssize_t got = ::read(arrive_, buffer, sizeof(buffer));
        for (ssize_t i = 0; i < got; ++i)
          lines_ += buffer[i] == '\n';
        // A FIFO with no writer left polls as hung up: wait for the next writer instead.
        if (got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    return lines_ >= n;
  }

  // Releases `n` waiting processes at once.
  void release(int n) {
    const int go = ::open((dir_ + "/go").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    ASSERT_GE(go, 0) << std::strerror(errno);
    const std::string bytes(static_cast<std::size_t>(n), 'g');
    EXPECT_EQ(::write(go, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(go);
  }

 private:
  std::string dir_;
  int arrive_ = -1;
  int lines_ = 0;
};

std::vector<std::string> train_args(const std::string& config,
                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"train", "--config", config, "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string busy_text(pid_t holder) {
  return "is in use by another Strata process: pid " + std::to_string(holder) + " on host ";
}

TEST(RunLock, TwoTrainersStartedAtOnceOnOneOutputDirOneRunsTheOtherIsRefused) {
  TempDir dir;
  const std::string extra = R"("checkpoint_every_steps": 2,)";
  const std::string lone = dir.path() + "/lone";
  ASSERT_EQ(train_with(dir.write_file("lone.json", reliability_config(lone, 4, extra))).exit_code,
            0);
  const std::map<int, double> lone_losses = losses_of(lone);
  ASSERT_EQ(lone_losses.size(), 4u);
  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string tag = "r" + std::to_string(round);
    const std::string out = dir.path() + "/" + tag;
    const std::string config = dir.write_file(tag + ".json", reliability_config(out, 4, extra));
    const std::string barrier_dir = dir.path() + "/" + tag + "-barrier";
    ASSERT_EQ(::mkdir(barrier_dir.c_str(), 0700), 0);
    Barrier barrier(barrier_dir);
    Spawned a(train_args(config), {barrier.env("lock.before")}, barrier_dir + "/a");
    Spawned b(train_args(config), {barrier.env("lock.before")}, barrier_dir + "/b");
    ASSERT_TRUE(barrier.wait_arrivals(2)) << a.err() << b.err();
    barrier.release(2);
    const int code_a = a.finish(), code_b = b.finish();
    ASSERT_TRUE((code_a == 0 && code_b == 2) || (code_a == 2 && code_b == 0))
        << "exit codes " << code_a << " and " << code_b << "\nA: " << a.err() << "\nB: " << b.err();
    const Spawned& winner = code_a == 0 ? a : b;
    const Spawned& loser = code_a == 0 ? b : a;
    const std::string refusal = loser.err();
    EXPECT_NE(refusal.find(out + " " + busy_text(winner.pid())), std::string::npos) << refusal;
    EXPECT_NE(refusal.find("strata.output_dir"), std::string::npos) << refusal;
    EXPECT_NE(refusal.find("train --config " + config), std::string::npos) << refusal;
    // The winner's run is a lone run's, bit for bit; the loser wrote no step.
    EXPECT_EQ(losses_of(out), lone_losses);
    EXPECT_TRUE(same_bytes(lone + "/final/model.safetensors", out + "/final/model.safetensors"));
    EXPECT_TRUE(same_bytes(lone + "/checkpoints/step_00000004/trainer_state.json",
                           out + "/checkpoints/step_00000004/trainer_state.json"));
    EXPECT_FALSE(fs::exists(out + "/" + kDirLockName));  // released at the end
  }
}

TEST(RunLock, AKilledHolderLeavesNoStaleLock) {
  TempDir dir;
  for (const bool resume : {true, false}) {
    SCOPED_TRACE(resume ? "resume_from" : "--overwrite");
    const std::string out = dir.path() + (resume ? "/resumed" : "/overwritten");
    const std::string config =
        dir.write_file(resume ? "r.json" : "o.json",
                       reliability_config(out, 100000, R"("checkpoint_every_steps": 2,)"));
    const testing::RunOutput killed =
        testing::sh_then_strata(testing::signal_after_step(out, 3, "-KILL $$"), train_args(config));
    ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
    ASSERT_TRUE(fs::exists(out + "/" + kDirLockName));  // left behind, but nobody holds it
    // The kill lands after step 3, but on a loaded machine the run may have checkpointed later
    // steps first: the resumed run trains 2 steps past its newest checkpoint (at least to 6).
    int newest = 0;
    if (resume) {
      for (const auto& entry : fs::directory_iterator(out + "/checkpoints")) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("step_", 0) == 0) newest = std::max(newest, std::stoi(name.substr(5)));
      }
    }
    const int steps = std::max(6, newest + 2);
    const std::string again = dir.write_file(
        resume ? "r6.json" : "o6.json",
        reliability_config(
            out, steps,
            resume ? R"("checkpoint_every_steps": 2, "resume_from": ")" + out + R"(/checkpoints",)"
                   : std::string(R"("checkpoint_every_steps": 2,)")));
    const testing::RunOutput ran = train_with(
        again, resume ? std::vector<std::string>{} : std::vector<std::string>{"--overwrite"});
    ASSERT_EQ(ran.exit_code, 0) << ran.err;
    EXPECT_EQ(losses_of(out).rbegin()->first, steps);
    EXPECT_FALSE(fs::exists(out + "/" + kDirLockName));
  }
}

TEST(RunLock, TwoResumesOfOneCheckpointRootAtOnceOneIsRefusedTheOthersCheckpointsVerify) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  ASSERT_EQ(train_with(dir.write_file(
                           "c.json", reliability_config(out, 2, R"("checkpoint_every_steps": 2,)")))
                .exit_code,
            0);
  const std::string resume = dir.write_file(
      "resume.json",
      reliability_config(
          out, 6, R"("checkpoint_every_steps": 2, "resume_from": ")" + out + R"(/checkpoints",)"));
  const std::string barrier_dir = dir.path() + "/barrier";
  ASSERT_EQ(::mkdir(barrier_dir.c_str(), 0700), 0);
  Barrier barrier(barrier_dir);
  Spawned a(train_args(resume), {barrier.env("lock.before")}, barrier_dir + "/a");
  Spawned b(train_args(resume), {barrier.env("lock.before")}, barrier_dir + "/b");
  ASSERT_TRUE(barrier.wait_arrivals(2)) << a.err() << b.err();
  barrier.release(2);
  const int code_a = a.finish(), code_b = b.finish();
  ASSERT_TRUE((code_a == 0 && code_b == 2) || (code_a == 2 && code_b == 0))
      << "exit codes " << code_a << " and " << code_b << "\nA: " << a.err() << "\nB: " << b.err();
  const Spawned& winner = code_a == 0 ? a : b;
  const Spawned& loser = code_a == 0 ? b : a;
  EXPECT_NE(loser.err().find(busy_text(winner.pid())), std::string::npos) << loser.err();
  // Every checkpoint of the root verifies (convert checks every tensor against its digest).
  for (const char* step : {"step_00000002", "step_00000004", "step_00000006"}) {
    const testing::RunOutput converted =
        testing::run_strata({"convert", out + "/checkpoints/" + step, dir.path() + "/hf-" + step});
    EXPECT_EQ(converted.exit_code, 0) << step << ": " << converted.err;
    EXPECT_NE(converted.out.find("checksums verified"), std::string::npos) << converted.out;
  }
  // And the resumed run is an uninterrupted 6-step run, bit for bit.
  const std::string straight = dir.path() + "/straight";
  ASSERT_EQ(
      train_with(dir.write_file("s.json",
                                reliability_config(straight, 6, R"("checkpoint_every_steps": 2,)")))
          .exit_code,
      0);
  EXPECT_TRUE(same_bytes(straight + "/final/model.safetensors", out + "/final/model.safetensors"));
}

TEST(RunLock, AResumeFromARootALiveRunHoldsIsRefused) {
  TempDir dir;
  const std::string first = dir.path() + "/first";
  ASSERT_EQ(train_with(dir.write_file("c.json", reliability_config(
                                                    first, 2, R"("checkpoint_every_steps": 2,)")))
                .exit_code,
            0);
  // A live run holds the first run's checkpoint root (this test process stands in for it).
  LockRequest request;
  request.dir = first + "/checkpoints";
  Result<DirLock> held = DirLock::acquire(request);
  ASSERT_TRUE(held.is_ok()) << held.status().to_string();
  const std::string second = dir.path() + "/second";
  const std::string resume = dir.write_file(
      "resume.json",
      reliability_config(second, 4, R"("resume_from": ")" + first + R"(/checkpoints",)"));
  const testing::RunOutput refused = train_with(resume);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find(first + "/checkpoints " + busy_text(::getpid())), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("strata.resume_from"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(second + "/metrics.jsonl"));
  // Once that run has ended, the resume goes ahead.
  held->release();
  const testing::RunOutput resumed = train_with(resume);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_FALSE(fs::exists(first + "/checkpoints/" + kDirLockName));
}

TEST(RunLock, ACheckpointDirSharedByTwoRunsIsRefused) {
  TempDir dir;
  const std::string shared = dir.path() + "/ckpt";
  const std::string a = dir.write_file(
      "a.json",
      reliability_config(dir.path() + "/a", 2, R"("checkpoint_dir": ")" + shared + R"(",)"));
  const std::string b = dir.write_file(
      "b.json",
      reliability_config(dir.path() + "/b", 2, R"("checkpoint_dir": ")" + shared + R"(",)"));
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  LockRequest request;
  request.dir = shared;
  Result<DirLock> held = DirLock::acquire(request);  // run A, live
  ASSERT_TRUE(held.is_ok()) << held.status().to_string();
  const testing::RunOutput refused = train_with(b);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find(shared + " " + busy_text(::getpid())), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("strata.checkpoint_dir"), std::string::npos) << refused.err;
  held->release();
  EXPECT_EQ(train_with(a).exit_code, 0);
}

TEST(RunLock, EveryRankHoldsItsOwnFileInTheCheckpointRoot) {
  SKIP_WITHOUT_MPIRUN();
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config =
      dir.write_file("c.json", reliability_config(out, 2, R"("checkpoint_every_steps": 2,)"));
  // Rank 1's file is held (by this test process, standing in for rank 1 of another job).
  ASSERT_EQ(::mkdir(out.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((out + "/checkpoints").c_str(), 0700), 0);
  LockRequest request;
  request.dir = out + "/checkpoints";
  request.name = dir_lock_name(1);
  Result<DirLock> held = DirLock::acquire(request);
  ASSERT_TRUE(held.is_ok()) << held.status().to_string();
  const testing::RunOutput refused = testing::run_ranks(
      2, STRATA_BINARY,
      {"train", "--config", config, "--quiet", "--set", "strata.comm_timeout_s=20"}, 300);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find(out + "/checkpoints " + busy_text(::getpid())), std::string::npos)
      << refused.err;
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step_00000002"));
  held->release();
  const testing::RunOutput ran = testing::run_ranks(
      2, STRATA_BINARY,
      {"train", "--config", config, "--quiet", "--set", "strata.comm_timeout_s=20"}, 300);
  EXPECT_EQ(ran.exit_code, 0) << ran.err;
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_00000002"));
  for (const std::string& name : {dir_lock_name(0), dir_lock_name(1)})
    EXPECT_FALSE(fs::exists(out + "/checkpoints/" + name)) << name;
}

TEST(RunLock, ConvertIntoADirectoryInUseIsRefused) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  ASSERT_EQ(train_with(dir.write_file(
                           "c.json", reliability_config(out, 2, R"("checkpoint_every_steps": 2,)")))
                .exit_code,
            0);
  const std::string target = dir.path() + "/hf";
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  LockRequest request;
  request.dir = target;
  Result<DirLock> held = DirLock::acquire(request);  // another convert, writing there
  ASSERT_TRUE(held.is_ok()) << held.status().to_string();
  const testing::RunOutput refused = testing::run_strata({"convert", out + "/checkpoints", target});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find(target + " " + busy_text(::getpid())), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("OUT_DIR"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(target + "/model.safetensors"));
  held->release();
  const testing::RunOutput converted =
      testing::run_strata({"convert", out + "/checkpoints", target});
  EXPECT_EQ(converted.exit_code, 0) << converted.err;
  EXPECT_FALSE(fs::exists(target + "/" + kDirLockName));
}

TEST(RunLock, WithoutFlockTheExclusiveFileKeepsTheSecondRunOut) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config =
      dir.write_file("c.json", reliability_config(out, 4, R"("checkpoint_every_steps": 2,)"));
  const std::string barrier_dir = dir.path() + "/barrier";
  ASSERT_EQ(::mkdir(barrier_dir.c_str(), 0700), 0);
  Barrier barrier(barrier_dir);
  // The first run stops while it holds the lock; the second starts then.
  Spawned first(train_args(config), {barrier.env("lock.held"), "STRATA_TEST_NO_FLOCK=1"},
                barrier_dir + "/first");
  ASSERT_TRUE(barrier.wait_arrivals(1)) << first.err();
  const testing::RunOutput second = train_with(config, {}, {"STRATA_TEST_NO_FLOCK=1"});
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_NE(second.err.find(out + " " + busy_text(first.pid())), std::string::npos) << second.err;
  barrier.release(1);
  EXPECT_EQ(first.finish(), 0) << first.err();
  EXPECT_EQ(losses_of(out).size(), 4u);
  EXPECT_FALSE(fs::exists(out + "/" + kDirLockName));
}

}  // namespace
}  // namespace strata

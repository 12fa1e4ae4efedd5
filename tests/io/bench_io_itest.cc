// `strata bench io` as a user runs it: the JSON it prints, the sweep and the tuned aio section,
// and errors for bad input. Small files only: these check behaviour, not speed.
#include <gtest/gtest.h>
#include <json/json.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "config/config.h"
#include "support/run_strata.h"

namespace strata {
namespace {

using testing::parse_json;
using testing::run_strata;
using testing::TempDir;

TEST(BenchIo, JsonReportsThroughputSettingsAndLatency) {
  TempDir dir;
  auto run = run_strata({"bench", "io", "--path", dir.path(), "--file-size", "16MiB",
                         "--block-size", "1MiB", "--queue-depth", "4", "--threads", "2", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  Json::Value v = parse_json(run.out);
  EXPECT_GT(v["read_gbps"].asDouble(), 0.0);
  EXPECT_GT(v["write_gbps"].asDouble(), 0.0);
  EXPECT_GT(v["copy_gbps"].asDouble(), 0.0);
  EXPECT_EQ(v["block_size"].asUInt64(), 1u << 20);
  EXPECT_EQ(v["queue_depth"].asUInt(), 4u);
  EXPECT_EQ(v["threads"].asUInt(), 2u);
  EXPECT_EQ(v["engine"].asString(), "uring");
  for (const char* pass : {"read_latency_us", "write_latency_us"}) {
    const Json::Value& l = v[pass];
    EXPECT_GT(l["p50"].asDouble(), 0.0) << pass;
    EXPECT_LE(l["p50"].asDouble(), l["p99"].asDouble()) << pass;
    EXPECT_LE(l["p99"].asDouble(), l["max"].asDouble()) << pass;
  }
  // The temporary file is gone, and no progress bar was drawn on a non-terminal.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_EQ(run.err.find('\r'), std::string::npos) << run.err;
}

TEST(BenchIo, ReadOnlyModeOnAGivenFileKeepsTheFile) {
  TempDir dir;
  const std::string file = dir.path() + "/bench.dat";
  auto run = run_strata({"bench", "io", "--file", file, "--file-size", "8MiB", "--mode", "read",
                         "--no-copy-path", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  Json::Value v = parse_json(run.out);
  EXPECT_GT(v["read_gbps"].asDouble(), 0.0);
  EXPECT_TRUE(v["write_gbps"].isNull());
  EXPECT_TRUE(v["copy_gbps"].isNull());
  // A file given with --file is kept, and a second run reads it as it is.
  ASSERT_TRUE(std::filesystem::exists(file));
  EXPECT_EQ(std::filesystem::file_size(file), 8u << 20);
  run = run_strata(
      {"bench", "io", "--file", file, "--file-size", "8MiB", "--mode", "read", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_GT(parse_json(run.out)["copy_gbps"].asDouble(), 0.0);
  EXPECT_TRUE(std::filesystem::exists(file));
}

// Runs strata on a pseudo-terminal and returns what it printed there.
std::string run_on_terminal(const std::vector<std::string>& args) {
  int master = -1;
  pid_t child = ::forkpty(&master, nullptr, nullptr, nullptr);
  if (child == 0) {
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(STRATA_BINARY));
    for (const std::string& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(STRATA_BINARY, argv.data());
    ::_exit(127);
  }
  EXPECT_GT(child, 0);
  std::string out;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(master, buffer, sizeof(buffer));
    if (n <= 0) break;  // EIO once the child has closed the terminal
    out.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(master);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  return out;
}

TEST(BenchIo, DrawsAProgressBarOnATerminal) {
  TempDir dir;
  // Enough passes that the bar is drawn at least at the end of each.
  const std::string out = run_on_terminal(
      {"bench", "io", "--path", dir.path(), "--file-size", "8MiB", "--no-copy-path"});
  EXPECT_NE(out.find("write  ["), std::string::npos) << out;
  EXPECT_NE(out.find("] 100%"), std::string::npos) << out;
  EXPECT_NE(out.find("GB/s"), std::string::npos) << out;
}

TEST(BenchIo, RepeatRunsEveryPassThatManyTimes) {
  TempDir dir;
  auto run = run_strata(
      {"bench", "io", "--path", dir.path(), "--file-size", "8MiB", "--repeat", "3", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  Json::Value v = parse_json(run.out);
  EXPECT_EQ(v["repeat"].asUInt(), 3u);
  EXPECT_GT(v["read_gbps"].asDouble(), 0.0);
  EXPECT_GT(v["write_gbps"].asDouble(), 0.0);
  EXPECT_GT(v["copy_gbps"].asDouble(), 0.0);
}

TEST(BenchIo, SweepCoversTheGridAndTuneWritesAUsableAioSection) {
  TempDir dir;
  const std::string tuned = dir.path() + "/aio.json";
  std::filesystem::create_directory(dir.path() + "/nvme");
  auto run =
      run_strata({"bench", "io", "--path", dir.path() + "/nvme", "--file-size", "8MiB", "--tune",
                  "--json", "--tune-output", tuned, "--sweep-block-sizes", "256KiB", "1MiB",
                  "--sweep-queue-depths", "1", "4", "--sweep-threads", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  Json::Value v = parse_json(run.out);
  ASSERT_EQ(v["sweep"].size(), 4u);
  for (const Json::Value& point : v["sweep"]) {
    EXPECT_GT(point["read_gbps"].asDouble(), 0.0);
    EXPECT_GT(point["write_gbps"].asDouble(), 0.0);
  }
  // The tuned section is a config Strata loads, with values from the grid.
  auto loaded = config::load_config_file(tuned, {}, {});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const config::AioConfig& aio = loaded->config.aio;
  EXPECT_TRUE(aio.block_size == 256 * 1024 || aio.block_size == 1024 * 1024);
  EXPECT_TRUE(aio.queue_depth == 1 || aio.queue_depth == 4);
  EXPECT_EQ(aio.intra_op_parallelism, 1);
  EXPECT_EQ(v["best"]["block_size"].asUInt64(), aio.block_size);
}

TEST(BenchIo, SweepSkipsPointsOverTheMemoryLimit) {
  TempDir dir;
  auto run = run_strata({"bench", "io", "--path", dir.path(), "--file-size", "4MiB", "--sweep",
                         "--memory-max", "1MiB", "--sweep-block-sizes", "1MiB",
                         "--sweep-queue-depths", "1", "2", "--sweep-threads", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("skipped: staging 2.00 MiB > --memory-max 1.00 MiB"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("best: block 1.00 MiB, queue depth 1, threads 1"), std::string::npos)
      << run.out;
}

TEST(BenchIo, MissingDirectoryIsAnErrorNamingIt) {
  TempDir dir;
  auto run = run_strata({"bench", "io", "--path", dir.path() + "/absent"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find(dir.path() + "/absent"), std::string::npos) << run.err;
}

TEST(BenchIo, BadSizesAreUsageErrors) {
  TempDir dir;
  auto run = run_strata({"bench", "io", "--path", dir.path(), "--block-size", "lots"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("--block-size 'lots' is not a positive byte count"), std::string::npos)
      << run.err;
  run = run_strata(
      {"bench", "io", "--path", dir.path(), "--file-size", "3MiB", "--block-size", "2MiB"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("must be a positive multiple of the block size"), std::string::npos)
      << run.err;
}

}  // namespace
}  // namespace strata

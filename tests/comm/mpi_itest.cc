// The MPI transport across real processes: `mpirun -np N` of the test helper (mpi_worker_helper.cc)
// and of `strata bench comm`. Skips when mpirun is missing (tools/setup.sh installs it).
#include <gtest/gtest.h>
#include <json/json.h>
#include <unistd.h>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/mpi_run.h"
#include "support/run_strata.h"

namespace strata::comm {
namespace {

using testing::RunOutput;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

using testing::run_ranks;

std::string helper() {
  return std::string(STRATA_TEST_BINARY_DIR) + "/strata_mpi_worker_helper";
}

// The digest lines rank 0 printed, in order.
std::vector<std::string> digests(const std::string& out) {
  std::vector<std::string> lines;
  std::regex line("digest [^\\n]+");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    lines.push_back(it->str());
  }
  return lines;
}

TEST(MpiComm, TwoRanksGetExactResultsForEveryCollective) {
  SKIP_WITHOUT_MPIRUN();
  RunOutput r = run_ranks(2, helper(), {"collectives", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_CONTAINS(r.out, "collectives ok (2 ranks)");
}

TEST(MpiComm, ThreeRanksSumInRankOrder) {
  // With three ranks the order of a floating-point sum changes its bits; each rank checks every
  // element against a plain left-to-right loop over the ranks.
  SKIP_WITHOUT_MPIRUN();
  RunOutput r = run_ranks(3, helper(), {"collectives", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_CONTAINS(r.out, "collectives ok (3 ranks)");
}

TEST(MpiComm, RunsRepeatBitIdentically) {
  SKIP_WITHOUT_MPIRUN();
  RunOutput first = run_ranks(3, helper(), {"collectives", "3"});
  RunOutput second = run_ranks(3, helper(), {"collectives", "3"});
  RunOutput other_seed = run_ranks(3, helper(), {"collectives", "4"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(second.exit_code, 0) << second.err;
  ASSERT_EQ(other_seed.exit_code, 0) << other_seed.err;
  const std::vector<std::string> a = digests(first.out);
  EXPECT_GT(a.size(), 40u);
  EXPECT_EQ(a, digests(second.out));
  EXPECT_NE(a, digests(other_seed.out));  // the digests do depend on the data
}

TEST(MpiComm, SilentRankIsNamedWithinTheTimeout) {
  SKIP_WITHOUT_MPIRUN();
  // Rank 1 sleeps for 120 s; rank 0 gives up after 2 s without data and names it, and its exit
  // stops rank 1 too (the run ends well before rank 1 would wake up).
  RunOutput r = run_ranks(2, helper(), {"hang", "1", "2"}, 90);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_CONTAINS(r.err, "rank 1 sent nothing for 2 s (strata.comm_timeout_s)");
  EXPECT_CONTAINS(r.err, "all_reduce #1");
}

TEST(MpiComm, KilledRankStopsTheOthersAndIsNamed) {
  SKIP_WITHOUT_MPIRUN();
  // mpirun notices the dead rank, names it, and ends the others.
  RunOutput r = run_ranks(2, helper(), {"die", "1"}, 90);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(std::regex_search(r.out + r.err, std::regex("rank 1 .*(exited|killed|signal)")))
      << r.out << r.err;
}

TEST(MpiComm, RankExitingWithAnErrorStopsTheOthers) {
  SKIP_WITHOUT_MPIRUN();
  // The others wait in a barrier with a 600 s timeout; only the failing rank's MPI_Abort can end
  // them within this test's 90 s.
  RunOutput r = run_ranks(2, helper(), {"exit", "1"}, 90);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_CONTAINS(r.err, "rank 1: failing on purpose");
}

TEST(BenchComm, MeasuresAndChecksUnderMpirun) {
  SKIP_WITHOUT_MPIRUN();
  RunOutput r =
      run_ranks(2, STRATA_BINARY, {"bench", "comm", "--bytes", "2MiB", "--repeats", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Json::Value v;
  Json::CharReaderBuilder builder;
  std::string errors;
  std::istringstream in(r.out);
  ASSERT_TRUE(Json::parseFromStream(builder, in, &v, &errors)) << errors << r.out;
  EXPECT_EQ(v["world_size"].asInt(), 2);
  EXPECT_EQ(v["check"].asString(), "exact");
  ASSERT_EQ(v["ops"].size(), 3u);
  for (const Json::Value& op : v["ops"]) {
    EXPECT_GT(op["busbw_gbps"].asDouble(), 0.0) << op["op"].asString();
    EXPECT_GT(op["mpi_busbw_gbps"].asDouble(), 0.0) << op["op"].asString();
  }
}

TEST(BenchComm, RunsOnOneRankWithoutALauncher) {
  RunOutput r = testing::run_strata(
      {"bench", "comm", "--bytes", "1MiB", "--repeats", "1", "--ops", "all_reduce", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_CONTAINS(r.out, "\"world_size\" : 1");
  EXPECT_CONTAINS(r.out, "\"check\" : \"exact\"");
}

TEST(BenchComm, TorchrunEnvironmentOnTheCpuBackendAsksForMpirun) {
  RunOutput r =
      testing::run_strata({"bench", "comm", "--bytes", "1MiB"},
                          {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29555"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_CONTAINS(r.err, "mpirun -np 2");
}

}  // namespace
}  // namespace strata::comm

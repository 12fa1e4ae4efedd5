// Reading the launcher's environment: each launcher family, precedence, and the errors for values
// that cannot all be true.
#include "comm/launch.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "comm/world.h"
#include "sys/gpu.h"

namespace strata::comm {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

LaunchInfo read_ok(const Env& env) {
  Result<LaunchInfo> info = launch_from_environment(lookup(env));
  EXPECT_TRUE(info.is_ok()) << info.status().to_string();
  return info.is_ok() ? *info : LaunchInfo{};
}

std::string read_error(const Env& env) {
  Result<LaunchInfo> info = launch_from_environment(lookup(env));
  EXPECT_FALSE(info.is_ok());
  if (info.is_ok()) return "";
  EXPECT_EQ(info.status().code(), ErrorCode::kConfig);
  return info.status().to_string();
}

TEST(Launch, NoVariablesIsOneRank) {
  LaunchInfo info = read_ok({});
  EXPECT_EQ(info.launcher, Launcher::kNone);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_FALSE(info.mpi_launched);
}

TEST(Launch, OpenMpiVariables) {
  LaunchInfo info = read_ok({{"OMPI_COMM_WORLD_RANK", "3"},
                             {"OMPI_COMM_WORLD_SIZE", "4"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                             {"PMIX_RANK", "3"}});
  EXPECT_EQ(info.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_TRUE(info.mpi_launched);
}

TEST(Launch, TorchrunVariables) {
  LaunchInfo info = read_ok({{"RANK", "5"},
                             {"WORLD_SIZE", "8"},
                             {"LOCAL_RANK", "1"},
                             {"LOCAL_WORLD_SIZE", "4"},
                             {"MASTER_ADDR", "node0"},
                             {"MASTER_PORT", "29500"}});
  EXPECT_EQ(info.launcher, Launcher::kTorchrun);
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_FALSE(info.mpi_launched);
}

TEST(Launch, DeepSpeedLocalSizeName) {
  LaunchInfo info =
      read_ok({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_SIZE", "2"}});
  EXPECT_EQ(info.local_world_size, 2);
}

TEST(Launch, SlurmStepWithCompressedTaskCounts) {
  // Node 2 of "2(x2),3": the third node runs 3 tasks.
  LaunchInfo info = read_ok({{"SLURM_PROCID", "5"},
                             {"SLURM_STEP_NUM_TASKS", "7"},
                             {"SLURM_NTASKS", "99"},
                             {"SLURM_LOCALID", "1"},
                             {"SLURM_NODEID", "2"},
                             {"SLURM_STEP_TASKS_PER_NODE", "2(x2),3"}});
  EXPECT_EQ(info.launcher, Launcher::kSlurm);
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 7);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_FALSE(info.mpi_launched);
}

TEST(Launch, SlurmWithPmixCanJoinMpi) {
  LaunchInfo info = read_ok({{"SLURM_PROCID", "1"},
                             {"SLURM_STEP_NUM_TASKS", "2"},
                             {"SLURM_LOCALID", "1"},
                             {"PMIX_RANK", "1"}});
  EXPECT_EQ(info.launcher, Launcher::kSlurm);
  EXPECT_TRUE(info.mpi_launched);
}

TEST(Launch, SlurmBatchScriptOutsideSrunIsOneRank) {
  LaunchInfo info = read_ok({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(info.launcher, Launcher::kNone);
  EXPECT_EQ(info.world_size, 1);
}

TEST(Launch, MpirunInsideSlurmIgnoresTheStepOfItsDaemons) {
  // mpirun starts its daemons with srun (one task per node); their SLURM_* leak into the ranks.
  LaunchInfo info = read_ok({{"OMPI_COMM_WORLD_RANK", "6"},
                             {"OMPI_COMM_WORLD_SIZE", "8"},
                             {"SLURM_PROCID", "1"},
                             {"SLURM_STEP_NUM_TASKS", "2"}});
  EXPECT_EQ(info.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(info.rank, 6);
}

TEST(Launch, RankNotBelowWorldSizeIsAnError) {
  std::string e = read_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_CONTAINS(e, "RANK=4 is not below WORLD_SIZE=4");
  EXPECT_CONTAINS(e, "0 to 3");
}

TEST(Launch, RankWithoutWorldSizeIsAnError) {
  EXPECT_CONTAINS(read_error({{"RANK", "1"}}), "WORLD_SIZE is not");
  EXPECT_CONTAINS(read_error({{"OMPI_COMM_WORLD_SIZE", "2"}}), "OMPI_COMM_WORLD_RANK is not");
}

TEST(Launch, WorldSizeOneAloneIsOneRank) {
  EXPECT_EQ(read_ok({{"WORLD_SIZE", "1"}}).world_size, 1);
}

TEST(Launch, NotANumberIsAnError) {
  std::string e = read_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}});
  EXPECT_CONTAINS(e, "RANK='one' is not a whole number");
}

TEST(Launch, LocalRankNotBelowLocalSizeIsAnError) {
  std::string e = read_error(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_CONTAINS(e, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
}

TEST(Launch, LocalSizeLargerThanWorldIsAnError) {
  std::string e = read_error({{"OMPI_COMM_WORLD_RANK", "0"},
                              {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_CONTAINS(e, "larger than the world size 2");
}

TEST(Launch, DisagreeingLaunchersAreAnError) {
  std::string e = read_error({{"OMPI_COMM_WORLD_RANK", "1"},
                              {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"RANK", "0"},
                              {"WORLD_SIZE", "1"}});
  EXPECT_CONTAINS(e, "two launchers disagree");
  EXPECT_CONTAINS(e, "rank 1 of 2");
  EXPECT_CONTAINS(e, "rank 0 of 1");
}

TEST(Launch, AgreeingLaunchersAreFine) {
  LaunchInfo info = read_ok({{"OMPI_COMM_WORLD_RANK", "1"},
                             {"OMPI_COMM_WORLD_SIZE", "2"},
                             {"RANK", "1"},
                             {"WORLD_SIZE", "2"}});
  EXPECT_EQ(info.launcher, Launcher::kOpenMpi);
}

TEST(Launch, PmixRankMustAgree) {
  std::string e = read_error(
      {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMIX_RANK", "0"}});
  EXPECT_CONTAINS(e, "PMIX_RANK=0 disagrees");
}

TEST(Launch, MalformedSlurmTaskListIsAnError) {
  std::string e = read_error({{"SLURM_PROCID", "0"},
                              {"SLURM_STEP_NUM_TASKS", "2"},
                              {"SLURM_NODEID", "0"},
                              {"SLURM_STEP_TASKS_PER_NODE", "2(y2)"}});
  EXPECT_CONTAINS(e, "SLURM_STEP_TASKS_PER_NODE='2(y2)'");
}

TEST(Launch, BadMasterPortIsAnError) {
  EXPECT_CONTAINS(read_error({{"MASTER_PORT", "70000"}}), "MASTER_PORT=70000 is out of range");
}

TEST(Launch, DescribeNamesRankAndLauncher) {
  LaunchInfo info =
      read_ok({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(describe(info), "rank 1 of 2 (local 1 of 2) from torchrun-style environment");
}

TEST(BootstrapPort, MasterPortByDefault) {
  Env env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}};
  Result<int> port = bootstrap_port(read_ok(env), lookup(env));
  ASSERT_TRUE(port.is_ok()) << port.status().to_string();
  EXPECT_EQ(*port, 29500);
}

TEST(BootstrapPort, NextPortUnderTorchrunAgentStore) {
  Env env{{"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  Result<int> port = bootstrap_port(read_ok(env), lookup(env));
  ASSERT_TRUE(port.is_ok());
  EXPECT_EQ(*port, 29501);
}

TEST(BootstrapPort, ExplicitPortWins) {
  Env env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"STRATA_BOOTSTRAP_PORT", "4000"}};
  Result<int> port = bootstrap_port(read_ok(env), lookup(env));
  ASSERT_TRUE(port.is_ok());
  EXPECT_EQ(*port, 4000);
}

TEST(BootstrapPort, MissingPortIsAnError) {
  Env env{{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  Result<int> port = bootstrap_port(read_ok(env), lookup(env));
  ASSERT_FALSE(port.is_ok());
  EXPECT_CONTAINS(port.status().to_string(), "MASTER_PORT is not set");
}

TEST(JoinWorld, CpuBackendUnderTorchrunEnvironmentAsksForMpirun) {
  Env env{
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}};
  WorldOptions options;
  options.device = comm::Device::kCpu;
  Result<World> world = join_world(options, lookup(env));
  ASSERT_FALSE(world.is_ok());
  EXPECT_EQ(world.status().code(), ErrorCode::kConfig);
  EXPECT_CONTAINS(world.status().to_string(), "mpirun -np 2");
  EXPECT_CONTAINS(world.status().to_string(), "RANK, WORLD_SIZE");
}

TEST(JoinWorld, CudaBackendWithoutAGpuSaysSo) {
  // On a machine with a GPU this would go on to the TCP rendezvous; the test is for machines
  // without one (like CI), where the binding must refuse before any rank waits for another.
  if (!sys::probe_cuda().gpus.empty()) GTEST_SKIP() << "a GPU is visible";
  Env env{
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  WorldOptions options;
  options.device = comm::Device::kCuda;
  options.comm.timeout_s = 1;
  Result<World> world = join_world(options, lookup(env));
  ASSERT_FALSE(world.is_ok());
  EXPECT_CONTAINS(world.status().to_string(), "needs a GPU and none is visible");
}

TEST(JoinWorld, NoLauncherGivesTheSingleRankComm) {
  WorldOptions options;
  options.device = comm::Device::kCpu;
  Result<World> world = join_world(options, lookup({}));
  ASSERT_TRUE(world.is_ok()) << world.status().to_string();
  EXPECT_STREQ(world->comm->kind(), "single");
  EXPECT_EQ(world->comm->world_size(), 1);
}

// What a config's batch sizes are derived with (strata train, config check, estimate).
TEST(LaunchEnvironment, WorldSizeComesFromLauncherVariables) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                           "PMIX_RANK", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}) {
    ::unsetenv(name);
  }
  auto world_size = [] {
    Result<std::int64_t> w = world_size_from_environment();
    return w.is_ok() ? *w : -1;
  };
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  EXPECT_EQ(world_size(), 4);
  ::setenv("WORLD_SIZE", "junk", 1);
  Result<std::int64_t> junk = world_size_from_environment();
  ASSERT_FALSE(junk.is_ok());
  EXPECT_EQ(junk.status().exit_code(), 2);
  EXPECT_CONTAINS(junk.status().to_string(), "WORLD_SIZE='junk' is not a whole number");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_STEP_NUM_TASKS", "3", 1);
  EXPECT_EQ(world_size(), 3);
  ::unsetenv("SLURM_STEP_NUM_TASKS");
  ::setenv("SLURM_NTASKS", "3", 1);  // a batch script outside srun is one process
  EXPECT_EQ(world_size(), 1);
  ::unsetenv("SLURM_PROCID");
  ::unsetenv("SLURM_NTASKS");
  EXPECT_EQ(world_size(), 1);
}

}  // namespace
}  // namespace strata::comm

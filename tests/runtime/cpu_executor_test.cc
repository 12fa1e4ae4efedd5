// NUMA placement of the CPU kernels' threads: topology parsing (hwloc synthetic topologies stand
// in for multi-node machines), arena choice, and pinning with the caller's mask restored.
#include "runtime/cpu_executor.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/parallel_for.h>
#include <sched.h>

#include <mutex>
#include <set>
#include <vector>

#include "sys/numa_topology.h"

namespace strata::runtime {
namespace {

std::set<int> affinity_of_this_thread() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  std::set<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) cpus.insert(cpu);
  }
  return cpus;
}

void set_affinity_of_this_thread(const std::set<int>& cpus) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  for (int cpu : cpus)
    CPU_SET(cpu, &mask);
  ASSERT_EQ(sched_setaffinity(0, sizeof(mask), &mask), 0);
}

TEST(NumaTopology, SyntheticTwoNodeMachineListsEachNodesCpus) {
  auto topology = sys::NumaTopology::load_synthetic("node:2 core:2 pu:1");
  ASSERT_TRUE(topology.is_ok()) << topology.status().to_string();
  ASSERT_EQ(topology->node_count(), 2);
  EXPECT_EQ(topology->node_cpus(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(topology->node_cpus(1), (std::vector<int>{2, 3}));
  std::vector<float> buffer(1024, 1.0f);
  EXPECT_EQ(topology->node_of_memory(buffer.data(), buffer.size() * 4), -1)
      << "a synthetic topology cannot locate real memory";
}

TEST(NumaTopology, BadSyntheticDescriptionIsAnErrorQuotingIt) {
  auto topology = sys::NumaTopology::load_synthetic("node:two");
  ASSERT_FALSE(topology.is_ok());
  EXPECT_EQ(topology.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(topology.status().to_string().find("node:two"), std::string::npos);
}

TEST(NumaTopology, ThisMachineHasAtLeastOneNodeAndLocatesTouchedMemory) {
  auto topology = sys::NumaTopology::load_this_machine();
  ASSERT_TRUE(topology.is_ok()) << topology.status().to_string();
  ASSERT_GE(topology->node_count(), 1);
  std::vector<float> buffer(1 << 20, 1.0f);  // touched: every page is placed
  const int node = topology->node_of_memory(buffer.data(), buffer.size() * 4);
  if (node < 0) GTEST_SKIP() << "the OS does not report page locations here (no NUMA support)";
  EXPECT_LT(node, topology->node_count());
}

TEST(CpuExecutor, OnTwoNodesBuildsOneArenaPerNodeSizedToItsCpus) {
  auto topology = sys::NumaTopology::load_synthetic("node:2 core:3 pu:1");
  ASSERT_TRUE(topology.is_ok());
  runtime::CpuExecutor::Options options;
  options.threads = 4;
  auto executor = runtime::CpuExecutor::create_with(options, std::move(topology).value());
  ASSERT_TRUE(executor.is_ok()) << executor.status().to_string();
  EXPECT_EQ((*executor)->numa_nodes(), 2);
  EXPECT_EQ((*executor)->threads(), 4);
  EXPECT_EQ((*executor)->threads_for_node(0), 3);
  EXPECT_EQ((*executor)->threads_for_node(1), 3);
  EXPECT_EQ((*executor)->threads_for_node(-1), 4);
  std::vector<float> buffer(1024, 1.0f);
  EXPECT_EQ((*executor)->node_for(buffer.data(), buffer.size() * 4), -1)
      << "memory on no single known node runs unpinned";
}

TEST(CpuExecutor, FollowMemoryOffNeverPins) {
  auto topology = sys::NumaTopology::load_synthetic("node:2 core:2 pu:1");
  ASSERT_TRUE(topology.is_ok());
  runtime::CpuExecutor::Options options;
  options.follow_memory = false;
  auto executor = runtime::CpuExecutor::create_with(options, std::move(topology).value());
  ASSERT_TRUE(executor.is_ok());
  std::vector<float> buffer(1024, 1.0f);
  EXPECT_EQ((*executor)->node_for(buffer.data(), buffer.size() * 4), -1);
}

TEST(CpuExecutor, NegativeThreadCountIsAnError) {
  runtime::CpuExecutor::Options options;
  options.threads = -1;
  auto executor = runtime::CpuExecutor::create(options);
  ASSERT_FALSE(executor.is_ok());
  EXPECT_EQ(executor.status().code(), ErrorCode::kInvalidArgument);
}

// On this (one-node) machine, pin_single_node exercises the pinning path: every thread that runs
// the work sits on the node's CPUs, and the caller gets its own mask back afterwards.
TEST(CpuExecutor, PinnedArenaRunsOnTheNodesCpusAndRestoresTheCaller) {
  auto topology = sys::NumaTopology::load_this_machine();
  ASSERT_TRUE(topology.is_ok());
  const std::vector<int> node_cpus = topology->node_cpus(0);
  const std::set<int> node_set(node_cpus.begin(), node_cpus.end());
  const std::set<int> original = affinity_of_this_thread();
  const int first_cpu = *original.begin();
  runtime::CpuExecutor::Options options;
  options.threads = 2;
  options.pin_single_node = true;
  auto executor = runtime::CpuExecutor::create_with(options, std::move(topology).value());
  ASSERT_TRUE(executor.is_ok());
  std::vector<float> buffer(1 << 16, 1.0f);
  ASSERT_EQ((*executor)->node_for(buffer.data(), buffer.size() * 4), 0);

  set_affinity_of_this_thread({first_cpu});
  std::mutex mutex;
  std::vector<std::set<int>> seen;
  (*executor)->execute(buffer.data(), buffer.size() * 4, [&] {
    tbb::parallel_for(0, 64, [&](int) {
      std::set<int> mask = affinity_of_this_thread();
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back(std::move(mask));
    });
  });
  EXPECT_EQ(affinity_of_this_thread(), std::set<int>{first_cpu}) << "caller's mask not restored";
  set_affinity_of_this_thread(original);
  ASSERT_EQ(seen.size(), 64u);
  for (const std::set<int>& mask : seen)
    EXPECT_EQ(mask, node_set);
}

}  // namespace
}  // namespace strata::runtime

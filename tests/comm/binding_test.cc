// Planning where ranks run, on made-up machines (two NUMA nodes with hyperthreads, GPUs on each
// node), and on this one.
#include "comm/binding.h"

#include <gtest/gtest.h>

#include <set>

namespace strata::comm {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// Two nodes of 4 cores with 2 hardware threads each: node 0 has CPUs 0-3 and 8-11 (core i: i,
// i+8), node 1 has CPUs 4-7 and 12-15. GPUs 0,1 on node 0 and GPUs 2,3 on node 1.
MachineLayout two_sockets(int gpus) {
  MachineLayout m;
  for (int node = 0; node < 2; ++node) {
    MachineLayout::Node n;
    n.os_index = node;
    for (int c = 0; c < 4; ++c)
      n.cores.push_back({node * 4 + c, node * 4 + c + 8});
    m.nodes.push_back(n);
  }
  m.cpu_count = 16;
  for (int g = 0; g < gpus; ++g)
    m.gpu_numa_nodes.push_back(g < 2 ? 0 : 1);
  return m;
}

std::vector<int> all_cpus(int n) {
  std::vector<int> cpus;
  for (int i = 0; i < n; ++i)
    cpus.push_back(i);
  return cpus;
}

BindingPlan plan_ok(const MachineLayout& m, const BindingRequest& r) {
  Result<BindingPlan> plan = plan_binding(m, r);
  EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
  return plan.is_ok() ? *plan : BindingPlan{};
}

TEST(Binding, GpuRanksGetTheirGpusNodeAndDisjointCores) {
  MachineLayout m = two_sockets(4);
  std::set<int> used;
  for (int rank = 0; rank < 4; ++rank) {
    BindingRequest r;
    r.local_rank = rank;
    r.local_world_size = 4;
    r.use_gpu = true;
    r.allowed_cpus = all_cpus(16);
    BindingPlan plan = plan_ok(m, r);
    EXPECT_EQ(plan.gpu, rank);
    EXPECT_EQ(plan.numa_node, rank < 2 ? 0 : 1);
    // Two ranks share a node of 4 cores: 2 whole cores (4 CPUs) each, all on that node.
    ASSERT_EQ(plan.cpus.size(), 4u);
    for (int cpu : plan.cpus) {
      EXPECT_EQ((cpu % 8) / 4, plan.numa_node) << cpu;
      EXPECT_TRUE(used.insert(cpu).second) << "CPU " << cpu << " given twice";
    }
  }
}

TEST(Binding, MoreRanksThanGpusIsAnErrorForCuda) {
  BindingRequest r;
  r.local_rank = 0;
  r.local_world_size = 3;
  r.use_gpu = true;
  Result<BindingPlan> plan = plan_binding(two_sockets(2), r);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_EQ(plan.status().code(), ErrorCode::kConfig);
  EXPECT_CONTAINS(plan.status().to_string(), "3 ranks run on this node but it has 2 GPUs");
}

TEST(Binding, CpuRanksAreSpreadOverNodesInBlocks) {
  MachineLayout m = two_sockets(0);
  std::set<int> used;
  for (int rank = 0; rank < 4; ++rank) {
    BindingRequest r;
    r.local_rank = rank;
    r.local_world_size = 4;
    r.allowed_cpus = all_cpus(16);
    BindingPlan plan = plan_ok(m, r);
    EXPECT_EQ(plan.gpu, -1);
    EXPECT_EQ(plan.numa_node, rank / 2);
    EXPECT_EQ(plan.cpus.size(), 4u);
    for (int cpu : plan.cpus)
      EXPECT_TRUE(used.insert(cpu).second);
  }
  EXPECT_EQ(used.size(), 16u);
}

TEST(Binding, FewerCpuRanksThanNodesGetWholeNodes) {
  BindingRequest r;
  r.local_rank = 1;
  r.local_world_size = 2;
  r.allowed_cpus = all_cpus(16);
  BindingPlan plan = plan_ok(two_sockets(0), r);
  EXPECT_EQ(plan.numa_node, 1);
  EXPECT_EQ(plan.cpus, (std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15}));
}

TEST(Binding, OneCpuRankOnTheWholeMachineIsNotRestricted) {
  BindingRequest r;
  r.local_rank = 0;
  r.local_world_size = 1;
  r.allowed_cpus = all_cpus(16);
  BindingPlan plan = plan_ok(two_sockets(0), r);
  EXPECT_TRUE(plan.cpus.empty());
}

TEST(Binding, LaunchersBindingIsKept) {
  BindingRequest r;
  r.local_rank = 1;
  r.local_world_size = 2;
  r.allowed_cpus = {5};  // mpirun --bind-to core
  BindingPlan plan = plan_ok(two_sockets(0), r);
  EXPECT_TRUE(plan.cpus.empty());
  EXPECT_CONTAINS(plan.summary, "kept the launcher's binding to CPUs 5");
}

TEST(Binding, RanksOutnumberingCoresShareThem) {
  MachineLayout m;
  m.nodes.push_back({0, {{0}, {1}}});
  m.cpu_count = 2;
  std::vector<int> cpus;
  for (int rank = 0; rank < 4; ++rank) {
    BindingRequest r;
    r.local_rank = rank;
    r.local_world_size = 4;
    r.allowed_cpus = {0, 1};
    BindingPlan plan = plan_ok(m, r);
    ASSERT_EQ(plan.cpus.size(), 1u);
    cpus.push_back(plan.cpus[0]);
  }
  EXPECT_EQ(cpus, (std::vector<int>{0, 1, 0, 1}));
}

TEST(Binding, UnknownLocalWorldLeavesCpusAlone) {
  BindingRequest r;
  r.local_rank = 0;
  r.local_world_size = 0;
  r.allowed_cpus = all_cpus(16);
  BindingPlan plan = plan_ok(two_sockets(0), r);
  EXPECT_TRUE(plan.cpus.empty());
}

TEST(Binding, NvmePathsNearTheRanksNode) {
  BindingRequest r;
  r.local_rank = 2;
  r.local_world_size = 4;
  r.use_gpu = true;
  r.allowed_cpus = all_cpus(16);
  r.nvme_paths = {"/nvme0", "/nvme1", "/nvme2"};
  r.nvme_numa_nodes = {0, 1, 1};
  BindingPlan plan = plan_ok(two_sockets(4), r);
  EXPECT_EQ(plan.nvme_paths, (std::vector<std::string>{"/nvme1", "/nvme2"}));
}

TEST(Binding, NvmePathsOfUnknownLocalityAreAllKept) {
  BindingRequest r;
  r.local_rank = 0;
  r.local_world_size = 2;
  r.allowed_cpus = all_cpus(16);
  r.nvme_paths = {"/a", "/b"};
  r.nvme_numa_nodes = {-1, -1};
  BindingPlan plan = plan_ok(two_sockets(0), r);
  EXPECT_EQ(plan.nvme_paths, r.nvme_paths);
}

TEST(Binding, ThisMachinesLayoutLoads) {
  Result<MachineLayout> m = load_machine_layout();
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_FALSE(m->nodes.empty());
  EXPECT_GE(m->cpu_count, 1);
  std::size_t cpus = 0;
  for (const auto& node : m->nodes)
    for (const auto& core : node.cores)
      cpus += core.size();
  EXPECT_EQ(static_cast<int>(cpus), m->cpu_count);
  EXPECT_FALSE(current_cpus().empty());
}

TEST(Binding, PathOfUnknownDriveHasNoNode) {
  EXPECT_EQ(numa_node_of_path("/definitely/not/a/path"), -1);
}

}  // namespace
}  // namespace strata::comm

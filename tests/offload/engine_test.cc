// offload::Engine, the one builder: what it resolves once (the device budget, Adam's threads, each
// slot's tier through the plan), and that each kind builds what it says — an optimizer-only
// engine allocates exactly its plan (no frames, staging or device bytes), a model engine the
// store with its engines over the same tier manager.
#include "offload/engine.h"

#include <gtest/gtest.h>

#include "offload_fixture.h"

namespace strata::offload {
namespace {

struct Built {
  ::strata::testing::TempDir dir;
  model::ModelLayout layout;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<Engine> engine;
};

// An engine for flat units on a 16 MiB / 64 MiB CPU backend of `threads` threads.
Result<std::unique_ptr<Built>> build(EngineKind kind, kernels::DType storage, Tier param,
                                     Tier optim, int threads = 2, std::uint64_t device_budget = 0,
                                     int adam_threads = 0) {
  auto b = std::make_unique<Built>();
  b->layout = testing::flat_layout({5000, 9000, 3});
  backend::CpuBackendOptions bo;
  bo.device_bytes_max = 16 << 20;
  bo.host_bytes_max = 64 << 20;
  bo.threads = threads;
  STRATA_ASSIGN_OR_RETURN(b->backend, backend::make_cpu_backend(bo));
  EngineSpec spec;
  spec.kind = kind;
  spec.backend = b->backend.get();
  spec.layout = &b->layout;
  spec.settings = testing::flat_settings(storage, param, optim, b->dir.path());
  spec.settings.prefetch = {1 << 20, 1 << 20, 1 << 20};
  spec.device_budget_bytes = device_budget;
  spec.adam = testing::adamw_settings();
  spec.adam_threads = adam_threads;
  spec.tier_options.engine_factory = [](const io::EngineOptions& eo) {
    io::SimOptions so;
    so.capacity_bytes = 64 << 20;
    return io::make_sim_engine(eo, so);
  };
  STRATA_ASSIGN_OR_RETURN(b->engine, Engine::create(spec));
  return b;
}

TEST(Engine, AnOptimizerOnlyEngineAllocatesExactlyItsPlanAndNothingOnTheDevice) {
  for (Tier optim : {Tier::kHost, Tier::kNvme}) {
    for (kernels::DType storage : {kernels::DType::kF32, kernels::DType::kBF16}) {
      // The settings ask for parameters on NVMe and ZeRO-3: neither applies to caller-owned
      // parameters, which the optimizer-only plan homes on the host, whole.
      auto b = build(EngineKind::kOptimizerOnly, storage, Tier::kNvme, optim);
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      Engine& e = *(*b)->engine;
      const TierPlan& plan = e.plan();
      const TierUsage use = e.tiers().usage();
      for (int t = 0; t < kTierCount; ++t) {
        EXPECT_EQ(use.bytes_in_use[t], plan.bytes(static_cast<Tier>(t)))
            << to_string(static_cast<Tier>(t)) << ", " << kernels::to_string(storage);
      }
      EXPECT_EQ(plan.bytes(Tier::kDevice), 0u);
      EXPECT_EQ(plan.param_staging_buffers + plan.grad_staging_buffers + plan.grad_write_buffers,
                0);
      for (const UnitPlan& u : plan.units) {
        EXPECT_EQ(u.param_home, Tier::kHost);
        EXPECT_FALSE(u.framed);
        EXPECT_EQ(u.shard_numel, u.padded_numel);
      }
      for (const SizeClass& k : plan.classes)
        EXPECT_EQ(k.param_frames + k.compute_slots + k.grad_frames, 0);
      EXPECT_EQ(plan.uses(SlotKind::kMaster, Tier::kNvme), optim == Tier::kNvme);
    }
  }
}

TEST(Engine, AModelEngineBuildsTheStoreOverItsTierManager) {
  auto b = build(EngineKind::kModel, kernels::DType::kBF16, Tier::kHost, Tier::kHost);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  Engine& e = *(*b)->engine;
  EXPECT_EQ(&e.store().tiers(), &e.tiers());
  EXPECT_EQ(&e.store().pipeline(), &e.pipeline());
  EXPECT_GT(e.plan().bytes(Tier::kDevice), 0u);  // frames, compute copies, gradient frames
  EXPECT_TRUE(e.plan().units[0].framed);
}

TEST(Engine, TheDeviceBudgetIsTheOneGivenElseTheBackendsArena) {
  auto given =
      build(EngineKind::kModel, kernels::DType::kBF16, Tier::kHost, Tier::kHost, 2, 8 << 20);
  ASSERT_TRUE(given.is_ok()) << given.status().to_string();
  EXPECT_EQ((*given)->engine->device_budget_bytes(), 8u << 20);
  auto automatic = build(EngineKind::kModel, kernels::DType::kBF16, Tier::kHost, Tier::kHost);
  ASSERT_TRUE(automatic.is_ok()) << automatic.status().to_string();
  EXPECT_EQ((*automatic)->engine->device_budget_bytes(),
            (*automatic)->backend->device_memory().bytes_max);
  // Too small for the working set: the plan says so, naming the key.
  auto tiny = build(EngineKind::kModel, kernels::DType::kBF16, Tier::kHost, Tier::kHost, 2, 4096);
  ASSERT_FALSE(tiny.is_ok());
  EXPECT_EQ(tiny.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(tiny.status().to_string().find("strata.device_bytes_max"), std::string::npos);
}

TEST(Engine, AdamsThreadsAreTheOnesAskedForElseTheBackendsLessOneWithStateOnNvme) {
  auto asked =
      build(EngineKind::kOptimizerOnly, kernels::DType::kF32, Tier::kHost, Tier::kNvme, 3, 0, 1);
  ASSERT_TRUE(asked.is_ok()) << asked.status().to_string();
  EXPECT_NE((*asked)->engine->adam().description().find("1 threads"), std::string::npos)
      << (*asked)->engine->adam().description();
  auto host = build(EngineKind::kOptimizerOnly, kernels::DType::kF32, Tier::kHost, Tier::kHost, 3);
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  EXPECT_EQ(adam_threads(0, (*host)->engine->plan(), *(*host)->backend), 3);
  auto nvme = build(EngineKind::kOptimizerOnly, kernels::DType::kF32, Tier::kHost, Tier::kNvme, 3);
  ASSERT_TRUE(nvme.is_ok()) << nvme.status().to_string();
  EXPECT_EQ(adam_threads(0, (*nvme)->engine->plan(), *(*nvme)->backend), 2);
  EXPECT_EQ(adam_threads(5, (*nvme)->engine->plan(), *(*nvme)->backend), 5);
}

}  // namespace
}  // namespace strata::offload

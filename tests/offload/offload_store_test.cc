// The offload store's wiring through the update gate, over flat units without a model: while an
// optimizer step runs, the prefetcher offers frames to the pipeline and the next pass finds those
// units resident with their new parameters; and a store destroyed with hand-offs in flight after
// a failed step tears down in order (the scheduler completes them through a gate that is alive).
#include "offload/offload_store.h"

#include <gtest/gtest.h>

#include "offload/engine.h"

#include <cstring>

#include "offload_fixture.h"

namespace strata::offload {
namespace {

const std::vector<std::int64_t> kUnits = {4096, 4096, 4096, 4096};

struct Store {
  ::strata::testing::TempDir dir;
  model::ModelLayout layout;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<Engine> engine;
  OffloadStore* store = nullptr;
  io::SimControl* sim = nullptr;

  void build() {
    layout = testing::flat_layout(kUnits);
    backend::CpuBackendOptions bo;
    bo.device_bytes_max = 16 << 20;
    bo.host_bytes_max = 64 << 20;
    bo.threads = 1;
    backend = backend::make_cpu_backend(bo).value();
    EngineSpec spec;
    spec.backend = backend.get();
    spec.layout = &layout;
    // fp32 parameters on NVMe, read straight into frames (the CPU backend): the hand-off case.
    spec.settings =
        testing::flat_settings(kernels::DType::kF32, Tier::kNvme, Tier::kNvme, dir.path());
    spec.settings.prefetch = {1 << 20, 1 << 20, 1 << 20};
    spec.adam = testing::adamw_settings();
    spec.adam_threads = 1;
    spec.tier_options.engine_factory =
        [this](const io::EngineOptions& eo) -> Result<std::unique_ptr<io::IoEngine>> {
      io::SimOptions so;
      so.capacity_bytes = 64 << 20;
      STRATA_ASSIGN_OR_RETURN(std::unique_ptr<io::IoEngine> engine, io::make_sim_engine(eo, so));
      sim = io::sim_control(engine.get());
      return engine;
    };
    auto made = Engine::create(spec);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    engine = std::move(*made);
    store = &engine->store();
    for (int u = 0; u < store->units(); ++u) {
      float* master = store->fill_buffer(SlotKind::kMaster, u);
      for (std::int64_t i = 0; i < kUnits[static_cast<std::size_t>(u)]; ++i)
        master[i] = testing::known_value(u, SlotKind::kMaster, i);
      ASSERT_TRUE(store->store(SlotKind::kMaster, u, master).is_ok());
    }
    ASSERT_TRUE(store->refresh(true).is_ok());
  }

  // One micro-batch the way the runner makes it: forward 0..U-1, backward U-1..0.
  Status pass(bool record_grads) {
    store->begin_micro_batch(true, true);
    for (int u = 0; u < store->units(); ++u) {
      STRATA_TRY(store->acquire_params(u).status());
      store->release_params(u);
    }
    if (record_grads) {
      for (int u = store->units() - 1; u >= 0; --u) {
        STRATA_ASSIGN_OR_RETURN(float* g, store->acquire_grads(u));
        // The host stands in for a kernel: it adds once the stream has zeroed the frame.
        STRATA_TRY(backend->synchronize(::strata::backend::StreamKind::kCompute));
        for (std::int64_t i = 0; i < kUnits[static_cast<std::size_t>(u)]; ++i)
          g[i] += 0.25f;
        STRATA_TRY(store->grads_ready(u));
      }
    }
    return store->end_micro_batch();
  }

  static PipelineStep step() {
    PipelineStep s;
    s.lr = 1e-2;
    return s;
  }
};

TEST(OffloadStore, UnitsHandedOffDuringTheStepAreResidentWithTheirNewParameters) {
  Store s;
  s.build();
  ASSERT_TRUE(s.pass(true).is_ok());  // records the order of use
  ASSERT_TRUE(s.store->finish_backward().is_ok());
  // The drive holds the step's reads until the next pass has offered its frames.
  s.sim->set_paused(true);
  ASSERT_TRUE(s.store->start_optimizer(Store::step(), false).is_ok());
  s.store->begin_micro_batch(true, true);
  s.sim->set_paused(false);
  EXPECT_GT(s.store->scheduler().stats().handoffs, 0u);
  std::vector<std::vector<float>> used;
  for (int u = 0; u < s.store->units(); ++u) {
    auto params = s.store->acquire_params(u);
    ASSERT_TRUE(params.is_ok()) << params.status().to_string();
    ASSERT_TRUE(s.backend->synchronize(backend::StreamKind::kCompute).is_ok());
    used.emplace_back(*params, *params + kUnits[static_cast<std::size_t>(u)]);
    s.store->release_params(u);
  }
  ASSERT_TRUE(s.store->end_micro_batch().is_ok());
  ASSERT_TRUE(s.store->finish_optimizer().is_ok());
  // fp32 parameters are the new masters.
  for (int u = 0; u < s.store->units(); ++u) {
    auto master = s.store->view(SlotKind::kMaster, u);
    ASSERT_TRUE(master.is_ok());
    EXPECT_EQ(std::memcmp(used[static_cast<std::size_t>(u)].data(), *master,
                          used[static_cast<std::size_t>(u)].size() * 4),
              0)
        << "unit " << u;
    EXPECT_NE((*master)[0], testing::known_value(u, SlotKind::kMaster, 0)) << "updated";
  }
}

TEST(OffloadStore, TearsDownWithHandOffsInFlightAfterAFailedStep) {
  Store s;
  s.build();
  ASSERT_TRUE(s.pass(true).is_ok());
  ASSERT_TRUE(s.store->finish_backward().is_ok());
  s.sim->set_paused(true);
  ASSERT_TRUE(s.store->start_optimizer(Store::step(), false).is_ok());
  s.store->begin_micro_batch(true, true);  // offers frames for the pending updates
  ASSERT_GT(s.store->scheduler().stats().handoffs, 0u);
  io::SimFaults faults;
  faults.eio_rate = 1.0;
  s.sim->set_faults(faults);
  s.sim->set_paused(false);
  // The step fails; the hand-offs it accepted are never filled. Destroying the store must not
  // touch a destroyed pipeline (the sanitizer build checks the memory).
  EXPECT_EQ(s.store->finish_optimizer().code(), ErrorCode::kIo);
  s.engine.reset();
}

}  // namespace
}  // namespace strata::offload

// The whole CUDA step on the CPU (issue 36, item 2): the trainer on the CUDA backend's own host
// code, its kernels run by the SIMT emulator and Strata's fallback GEMM kernel standing in for
// cuBLASLt (tests/support/emulated_cuda/emulated_cuda.h).
//   - The backend starts with its fast paths checked by the emulated kernels, each attention check
//     once per process.
//   - A tiny GPT-2 and a tiny Llama (grouped KV heads, tied embeddings) train 3 bf16 steps with
//     their parameters on the device, in host memory and on NVMe: the three tiers give the same
//     bits (losses and the whole optimizer state); losses and parameter updates track the CPU
//     backend's (fp32 GEMMs there, bf16 GEMM inputs here): each loss within 2e-2 and the masters'
//     update within 25 % of the CPU's in norm (measured: 4e-4 and 4 %).
//   - The launch log counts each step's kernels by family, and the cast kernels that feed GEMMs.
//   - A fast path refused at start (the fused residual + norm) leaves the run on the two kernels it
//     replaces, with the same bits.
//   - The emulated streams run their work only when the host waits for it, so a missing wait
//     shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/alone_check.h"
#include "backend/apart_check.h"
#include "backend/attention_alone_check.h"
#include "backend/backend_factory.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda_fast_paths.h"
#include "backend/fast_path.h"
#include "backend/gate_up_check.h"
#include "backend/gelu_check.h"
#include "backend/gemm_check.h"
#include "backend/logits_check.h"
#include "backend/norm_check.h"
#include "backend/norm_grad_check.h"
#include "backend/qkv_alone_check.h"
#include "backend/rope_check.h"
#include "common/address_range.h"
#include "common/fault_points.h"
#include "config/config.h"
#include "kernels/cpu/cast.h"
#include "model/runner.h"
#include "tests/model/tiny_models.h"
#include "tests/support/emulated_cuda/emulated_cuda.h"
#include "tests/support/run_strata.h"
#include "tests/train/offload_support.h"
#include "train/trainer.h"

namespace strata::train {
namespace {

#if defined(__SANITIZE_ADDRESS__)
TEST(EmulatedCudaStep, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

namespace emu = testing::emulated_cuda;

// The CUDA backend as the trainer would make it for `request`, on the emulated runtime: no
// cuBLASLt, so every GEMM runs the fallback kernel; workspaces sized for tiny models.
Result<backend::MadeBackend> emulated_cuda_backend(const backend::BackendRequest& request) {
  backend::CudaBackendOptions options = backend::cuda_backend_options(request);
  options.use_cublaslt = false;
  options.gemm_workspace_bytes = 4ull << 20;
  options.cublas_workspace_bytes = 1ull << 20;
  options.reduce_scratch_bytes = 1ull << 20;
  backend::MadeBackend made;
  STRATA_ASSIGN_OR_RETURN(made.backend, backend::make_cuda_backend(options));
  made.note = "the CUDA backend on the SIMT emulator";
  return made;
}

struct Tier {
  const char* name;
  const char* param;      // zero_optimization.offload_param.device
  const char* optimizer;  // zero_optimization.offload_optimizer.device
};
const Tier kTiers[] = {{"device", "none", "none"}, {"host", "cpu", "cpu"}, {"nvme", "nvme", "cpu"}};

// Head size 64 (the flash attention's smallest), two layers, 2 x 32 tokens per micro-batch.
std::string model_keys(const std::string& family) {
  if (family == "gpt2") {
    return R"("family": "gpt2", "vocab_size": 96, "max_seq_len": 32, "hidden_size": 128,
              "num_layers": 2, "num_heads": 2)";
  }
  return R"("family": "llama", "vocab_size": 96, "max_seq_len": 32, "hidden_size": 128,
            "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 256,
            "tie_word_embeddings": true)";
}

std::string config_text(const std::string& family, const Tier& tier, const std::string& backend,
                        const std::string& out, const std::string& nvme) {
  const std::string nvme_path = R"(, "nvme_path": ")" + nvme + R"(")";
  const std::string param = tier.param;
  return R"({"bf16": {"enabled": true},
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
      "offload_param": {"device": ")" +
         param + R"(")" + (param == "nvme" ? nvme_path : "") + R"(,
                        "max_in_cpu": 0, "buffer_count": 2, "buffer_size": 65536},
      "offload_optimizer": {"device": ")" +
         std::string(tier.optimizer) + R"("}},
    "aio": {"block_size": 65536, "queue_depth": 8},
    "strata": {"output_dir": ")" +
         out + R"(", "train_steps": 3, "seed": 5, "cpu_threads": 2, "backend": ")" + backend +
         R"(", "device_bytes_max": "64MiB", "host_bytes_max": "256MiB",
      "model": {)" +
         model_keys(family) + R"(},
      "data": {"source": "synthetic", "seq_len": 32, "synthetic_vocab_size": 96,
               "synthetic_branching": 3}}})";
}

std::unique_ptr<Trainer> make_trainer(const std::string& text, bool emulated) {
  TrainerOptions options;
  options.quiet = true;
  if (emulated) options.backend_factory = emulated_cuda_backend;
  auto trainer = Trainer::create(testing::load(text), options);
  EXPECT_TRUE(trainer.is_ok()) << trainer.status().to_string();
  return trainer.is_ok() ? std::move(trainer).value() : nullptr;
}

// Every unit's fp32 masters, back to back.
std::vector<float> masters(Trainer& trainer) {
  return testing::slot_values(trainer, {offload::SlotKind::kMaster});
}

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> before, after;                 // masters
  std::vector<float> state;                         // masters and moments after the last step
  std::vector<std::vector<std::string> > launches;  // per step (emulated runs)
  std::vector<std::vector<std::string> > compute;   // the same, the compute stream's only
  std::int64_t narrow_logit_rows = -1;              // the logits_16bit path's uses, where it is on
  std::int64_t rotated_attention_calls = -1;        // the rope_in_attention path's, where it is on
  std::int64_t alone_writes = -1;            // the activations_16bit_alone path's, where it is on
  std::int64_t narrow_swiglu_calls = -1;     // the gate_up_16bit path's, where it is on
  std::int64_t narrow_gelu_calls = -1;       // the gelu_16bit path's, where it is on
  std::int64_t gelu_grad_writes = -1;        // the gelu_grad_16bit_alone path's, where it is on
  std::int64_t gelu_grad_bias_reads = -1;    // its bias gradients reading it
  std::int64_t attention_alone_writes = -1;  // the attention_16bit_alone path's, where it is on
  std::int64_t attention_grad_reads = -1;    // the attention_grad_16bit path's, where it is on
  std::int64_t swiglu_grad_reads = -1;       // the swiglu_grad_16bit path's, where it is on
  std::int64_t norm_grad_reads = -1;         // the norm_grad_16bit path's, where it is on
  std::int64_t gate_up_grad_writes = -1;     // the gate_up_grad_16bit_alone path's, where it is on
  std::int64_t qkv_grad_writes = -1;         // the qkv_grad_16bit_alone path's, where it is on
  std::int64_t qkv_grad_bias_reads = -1;     // its bias gradients reading it, likewise
  std::int64_t qkv_alone_reads = -1;         // the qkv_16bit path's, where it is on
  std::int64_t bias_alone_writes = -1;       // its biased products (CudaOps::bias_alone_writes)
  std::int64_t gelu_epilogue_16 = -1;        // gemm_bias_gelu_epilogue_16bit's uses, where it is on
  std::int64_t dgelu_epilogue_16 = -1;       // gemm_dgelu_epilogue_16bit's, likewise
  std::int64_t gelu_epilogues_16_declined = 0;  // both paths' declined calls
  std::uint64_t device_in_use = 0;  // the device arena's bytes in use after the last step
};

TrainedRun train(const std::string& family, const Tier& tier, bool emulated, const std::string& dir,
                 int steps = 3) {
  TrainedRun run;
  auto trainer = make_trainer(
      config_text(family, tier, emulated ? "cuda" : "cpu", dir + "/out", dir + "/nvme"), emulated);
  if (!trainer) return run;
  if (emulated) {
    EXPECT_EQ(trainer->backend().name(), "cuda:0");
  }
  run.before = masters(*trainer);
  for (int step = 0; step < steps; ++step) {
    emu::clear_launch_log();
    auto report = trainer->train_step();
    EXPECT_TRUE(report.is_ok()) << report.status().to_string();
    if (!report.is_ok()) return run;
    EXPECT_TRUE(trainer->finish_step().is_ok());
    run.losses.push_back(report->loss);
    run.launches.push_back(emu::launch_log());
    run.compute.push_back(emu::compute_stream_log());
  }
  run.after = masters(*trainer);
  run.state = testing::state_bytes(*trainer);
  for (const backend::FastPath& p : trainer->backend().fast_paths()) {
    if (p.name == backend::kLogits16Name && p.active) run.narrow_logit_rows = p.uses;
    if (p.name == backend::kRopeAttentionName && p.active) run.rotated_attention_calls = p.uses;
    if (p.name == backend::kActivations16AloneName && p.active) run.alone_writes = p.uses;
    if (p.name == backend::kGateUp16Name && p.active) run.narrow_swiglu_calls = p.uses;
    if (p.name == backend::kGelu16Name && p.active) run.narrow_gelu_calls = p.uses;
    if (p.name == backend::kGeluGradAloneName && p.active) run.gelu_grad_writes = p.uses;
    if (p.name == backend::kAttentionAloneName && p.active) run.attention_alone_writes = p.uses;
    if (p.name == backend::kAttentionGradAloneName && p.active) run.attention_grad_reads = p.uses;
    if (p.name == backend::kSwigluGradAloneName && p.active) run.swiglu_grad_reads = p.uses;
    if (p.name == backend::kNormGradAloneName && p.active) run.norm_grad_reads = p.uses;
    if (p.name == backend::kGateUpGradAloneName && p.active) run.gate_up_grad_writes = p.uses;
    if (p.name == backend::kQkvGradAloneName && p.active) run.qkv_grad_writes = p.uses;
    if (p.name == backend::kQkvAloneName && p.active) run.qkv_alone_reads = p.uses;
    if (p.name == backend::kGemmBiasGelu16Name && p.active) run.gelu_epilogue_16 = p.uses;
    if (p.name == backend::kGemmDgelu16Name && p.active) run.dgelu_epilogue_16 = p.uses;
    if (p.name == backend::kGemmBiasGelu16Name || p.name == backend::kGemmDgelu16Name) {
      run.gelu_epilogues_16_declined += p.declined;
    }
  }
  if (const auto* ops = dynamic_cast<const backend::CudaOps*>(&trainer->backend().ops_f32())) {
    run.qkv_grad_bias_reads = ops->qkv_grad_bias_reads();
    run.bias_alone_writes = ops->bias_alone_writes();
    run.gelu_grad_bias_reads = ops->gelu_grad_bias_reads();
  }
  run.device_in_use = trainer->backend().device_memory().bytes_in_use;
  return run;
}

// train() with the fast path `name` refused at start (the test seam), as a user's run whose check
// failed would have it.
TrainedRun train_refused(const char* name, const std::string& family, const Tier& tier,
                         bool emulated, const std::string& dir, int steps = 3) {
  backend::fail_fast_path_for_test(std::string(name));
  TrainedRun run = train(family, tier, emulated, dir, steps);
  backend::fail_fast_path_for_test(std::nullopt);
  return run;
}

// ||a_after - a_before - (b_after - b_before)|| / ||b_after - b_before||.
double update_difference(const TrainedRun& a, const TrainedRun& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < b.after.size(); ++i) {
    const double ua = static_cast<double>(a.after[i]) - a.before[i];
    const double ub = static_cast<double>(b.after[i]) - b.before[i];
    diff += (ua - ub) * (ua - ub);
    norm += ub * ub;
  }
  return std::sqrt(diff / norm);
}

// A step's kernels without the cast that rounds dO into the attention backward's staging (the
// cast kernel right before each backward's first flash kernel): what the step runs with dO kept
// in 16 bits alone (attention_grad_16bit). *removed counts them.
std::vector<std::string> without_dout_casts(const std::vector<std::string>& log,
                                            std::int64_t* removed) {
  std::vector<std::string> kept;
  for (const std::string& k : log) {
    const bool backward =
        k.rfind("flash_attention", 0) == 0 && k.rfind("flash_attention_forward", 0) != 0;
    if (backward && !kept.empty() && kept.back() == "cast_block_kernel") {
      kept.pop_back();
      ++*removed;
    }
    kept.push_back(k);
  }
  return kept;
}

class EmulatedCudaStep : public ::testing::TestWithParam<std::string> {};

TEST_P(EmulatedCudaStep, EveryTierTracksTheCpuBackendWithTheSameBits) {
  const std::string family = GetParam();
  testing::TempDir dir;
  const TrainedRun cpu = train(family, kTiers[0], false, dir.path() + "/cpu");
  ASSERT_EQ(cpu.losses.size(), 3u);
  std::vector<TrainedRun> runs;
  for (const Tier& tier : kTiers) {
    runs.push_back(train(family, tier, true, dir.path() + "/" + tier.name));
    const TrainedRun& run = runs.back();
    ASSERT_EQ(run.losses.size(), 3u) << tier.name;
    ASSERT_EQ(run.before.size(), cpu.before.size()) << tier.name;
    // The same initial weights (drawn on the host from the seed).
    EXPECT_TRUE(testing::same_bits(run.before, cpu.before)) << tier.name;
    for (int step = 0; step < 3; ++step) {
      EXPECT_NEAR(run.losses[step], cpu.losses[step], 2e-2) << tier.name << " step " << step + 1;
    }
    const double difference = update_difference(run, cpu);
    EXPECT_LT(difference, 0.25) << tier.name;
    std::printf(
        "%s %s: losses %.6f %.6f %.6f (cpu %.6f %.6f %.6f); update differs from the "
        "cpu's by %.4f of its norm\n",
        family.c_str(), tier.name, run.losses[0], run.losses[1], run.losses[2], cpu.losses[0],
        cpu.losses[1], cpu.losses[2], difference);
  }
  // The tiers move bytes, not arithmetic: the same bits whichever tier holds the parameters.
  for (std::size_t t = 1; t < runs.size(); ++t) {
    EXPECT_TRUE(testing::same_bits(runs[t].state, runs[0].state)) << kTiers[t].name;
    for (int step = 0; step < 3; ++step) {
      EXPECT_EQ(runs[t].losses[step], runs[0].losses[step]) << kTiers[t].name << " " << step;
    }
  }
  // The launch log of each step, by family: the same kernels every step, in every tier.
  for (std::size_t step = 0; step < 3; ++step) {
    const std::vector<std::string>& log = runs[0].launches[step];
    const auto families = emu::launches_by_family(log);
    std::string line;
    for (const auto& [f, n] : families)
      line += " " + f + "=" + std::to_string(n);
    const std::int64_t casts = emu::casts_before_gemms(runs[0].compute[step]);
    std::string cast_names;
    for (const auto& [name, n] : emu::casts_before_gemms_by_kernel(runs[0].compute[step]))
      cast_names += " " + name + "=" + std::to_string(n);
    std::printf("%s step %zu: %zu kernels:%s; casts before GEMMs %lld:%s\n", family.c_str(),
                step + 1, log.size(), line.c_str(), static_cast<long long>(casts),
                cast_names.c_str());
    EXPECT_EQ(families, emu::launches_by_family(runs[0].launches[0])) << "step " << step + 1;
    // Host and NVMe hold the parameters apart from the device, with AdamW on the CPU: the same
    // kernels (the device tier's AdamW runs on the device).
    EXPECT_EQ(runs[2].launches[step], runs[1].launches[step]) << "step " << step + 1;
    ASSERT_GT(families.count("gemm"), 0u);
    // Attention runs the flash kernels (head size 64), never the fp32 ones.
    for (const std::string& k : log) {
      EXPECT_TRUE(emu::kernel_family(k) != "attention" || k.rfind("flash_attention", 0) == 0) << k;
    }
    // The weights reach their GEMMs in 16 bits (the parameters they were widened from,
    // Ops::note_widened), and so do the activations written with their 16-bit companions
    // (Ops::pair_narrow): the normalised inputs, the attention's output and its q/k/v gradient
    // (the flash kernels' results, through RoPE's backward), the MLP's activation and its
    // gradient, the residual gradient, the final norm, the logits' gradient (cross-entropy's, in
    // place). No product converts an operand.
    const std::int64_t micro_batches = 2, layers = 2;  // gradient_accumulation_steps, num_layers
    const std::map<int, std::int64_t> narrowed = emu::gemms_by_operands_narrowed(log);
    const std::map<int, std::int64_t> want = {{0, micro_batches * (12 * layers + 3)}};
    EXPECT_EQ(narrowed, want) << "step " << step + 1;
    EXPECT_EQ(families.at("gemm"), micro_batches * (12 * layers + 3)) << "step " << step + 1;
    // The flash kernels write the attention's results into the fp32 activations and their
    // companions themselves: no widening kernel runs after them. The parameter store widens a
    // block's norm weights and biases into their area apart once per step, before the block's
    // first norm, not into its compute copy at every use (the backward's starts with a GEMM):
    // WeightsLeftOutOfTheComputeCopyAreNeverReadFromIt. No cast kernel runs right before a GEMM.
    EXPECT_EQ(casts, 0) << "step " << step + 1;
    // Parameters on the host (or NVMe) send their gradients home in 16 bits, each rounded on the
    // copy stream that sends it (Backend::narrow_async), beside the next unit's backward: the only
    // kernels off the compute stream, one per unit and micro-batch, and none before a GEMM there.
    const std::vector<std::string>& host = runs[1].launches[step];
    const std::vector<std::string>& host_compute = runs[1].compute[step];
    EXPECT_EQ(emu::casts_before_gemms(host_compute), 0) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(host, "cast_kernel") - emu::launches_of(host_compute, "cast_kernel"),
              micro_batches * (layers + 2))
        << "step " << step + 1;
    EXPECT_EQ(host.size() - host_compute.size(),
              static_cast<std::size_t>(micro_batches * (layers + 2)))
        << "step " << step + 1;
    EXPECT_EQ(runs[0].compute[step], log) << "step " << step + 1;
  }
}

// The paths `names` refused at start, with the head's logits, the Llama family's gate and up, the
// norms' output gradient, q, k and v and GPT-2's MLP pre-activation in 16 bits: those paths need
// the weights' and the
// activations' 16-bit paths, and round what the fp32 paths keep, so runs compared bit for bit
// against one without those refuse them too (SwiGLU's output gradient goes with gate and up).
std::string refused_with_logits(const std::string& names) {
  const std::string rounding = std::string(backend::kLogits16Name) + "," + backend::kGateUp16Name +
                               "," + backend::kNormGradAloneName + "," + backend::kQkvAloneName +
                               "," + backend::kGelu16Name;
  return names.empty() ? rounding : names + "," + rounding;
}

// Where the GEMMs read the weights from the 16-bit parameters, a unit's fp32 compute copy holds
// only the tensors other kernels read (norm weights, biases): with the weights left out of it
// filled with NaN (the test seam), training gives the same bits as with every weight widened into
// the copy (the weights' 16-bit path refused at start: the products convert the copy), parameters
// streamed from host memory, over two steps (the second reads the updated parameters).
TEST(EmulatedCudaStep, WeightsLeftOutOfTheComputeCopyAreNeverReadFromIt) {
  testing::TempDir dir;
  for (const std::string family : {"gpt2", "llama"}) {
    set_poison_weights(true);
    backend::fail_fast_path_for_test(refused_with_logits(""));
    const TrainedRun apart = train(family, kTiers[1], true, dir.path() + "/apart_" + family, 2);
    // The norm weights and biases widened into the copy instead (params_kept_apart refused).
    backend::fail_fast_path_for_test(refused_with_logits(backend::kKeptApartName));
    const TrainedRun in_copy = train(family, kTiers[1], true, dir.path() + "/in_copy_" + family, 2);
    backend::fail_fast_path_for_test(std::nullopt);
    set_poison_weights(false);
    // The rounding paths that do not need the weights' path are refused in every run alike.
    const TrainedRun whole =
        train_refused(refused_with_logits(backend::kWeights16Name).c_str(), family, kTiers[1], true,
                      dir.path() + "/whole_" + family, 2);
    ASSERT_EQ(apart.losses.size(), 2u) << family;
    ASSERT_EQ(whole.losses.size(), 2u) << family;
    EXPECT_TRUE(std::isfinite(apart.losses[1])) << family;
    EXPECT_EQ(apart.losses, whole.losses) << family;
    EXPECT_TRUE(testing::same_bits(apart.state, whole.state)) << family;
    EXPECT_EQ(in_copy.losses, whole.losses) << family;
    EXPECT_TRUE(testing::same_bits(in_copy.state, whole.state)) << family;
    const auto ranged = [](const std::vector<std::string>& log) {
      return std::count_if(log.begin(), log.end(), [](const std::string& k) {
        return k.rfind("cast_ranges_from_16_kernel", 0) == 0;
      });
    };
    // Apart, a block's other tensors are widened once per step (at its first use after the
    // update). In the copy, at every use whose slot (one per size class) held another unit: 2L - 1
    // in the first micro-batch (each forward, each backward but the last block's), 2L - 2 in each
    // later one (block 0 is still in the slot from the backward). The copy holding every weight
    // widens none that way.
    const std::int64_t micro_batches = 2, layers = 2;
    EXPECT_EQ(ranged(apart.launches[1]), layers) << family;
    EXPECT_EQ(ranged(in_copy.launches[1]), micro_batches * (2 * layers - 2) + 1) << family;
    EXPECT_EQ(ranged(whole.launches[1]), 0) << family;
  }
}

// The activations' companions refused at start: every activation is converted before its GEMMs
// again (the products with a weight convert one operand, the weight gradients two), with the same
// bits to the last one, as the companions hold exactly what the conversion gives.
TEST(EmulatedCudaStepFallback, ActivationCompanionsRefusedAtStartGiveTheSameBits) {
  testing::TempDir dir;
  backend::fail_fast_path_for_test(refused_with_logits(""));
  const TrainedRun paired = train("gpt2", kTiers[0], true, dir.path() + "/paired", 1);
  const TrainedRun refused = train_refused(backend::kActivations16Name, "gpt2", kTiers[0], true,
                                           dir.path() + "/refused", 1);
  ASSERT_EQ(paired.launches.size(), 1u);
  ASSERT_EQ(refused.launches.size(), 1u);
  EXPECT_TRUE(testing::same_bits(refused.state, paired.state));
  EXPECT_EQ(refused.losses[0], paired.losses[0]);
  const std::int64_t micro_batches = 2, layers = 2;
  const std::int64_t with_weight = micro_batches * (8 * layers + 2);
  const std::map<int, std::int64_t> converted = {{1, with_weight},
                                                 {2, micro_batches * (4 * layers + 1)}};
  EXPECT_EQ(emu::gemms_by_operands_narrowed(refused.launches[0]), converted);
  EXPECT_GT(emu::casts_before_gemms(refused.launches[0]),
            emu::casts_before_gemms(paired.launches[0]));
}

// The head's logits in 16 bits alone (logits_16bit): the loss and its gradient are those of the
// logits rounded to bf16, so against the fp32 logits (the path refused at start) the losses agree
// within 1e-4 of their value and the update within 10 % of its norm (measured: 5e-5 and 3.6 %, the
// first AdamW steps turning small gradient differences into whole-step ones), not to the bit. The
// step launches the same kernels, one cross-entropy per chunk reading the 16-bit logits in place of
// the fp32 one, and the path counts every row of every micro-batch.
TEST(EmulatedCudaStepFallback, LogitsIn16BitsTrackTheFp32Logits) {
  testing::TempDir dir;
  // The norms' output gradient in 16 bits refused in both runs: they differ by the logits' rounding
  // alone (with both roundings, AdamW's first steps carry the two into 1.3e-4 of GPT-2's second
  // loss).
  const std::string norm = backend::kNormGradAloneName;
  const std::string logits = std::string(backend::kLogits16Name) + "," + norm;
  for (const std::string family : {"gpt2", "llama"}) {
    const TrainedRun narrow =
        train_refused(norm.c_str(), family, kTiers[0], true, dir.path() + "/narrow_" + family, 2);
    const TrainedRun wide =
        train_refused(logits.c_str(), family, kTiers[0], true, dir.path() + "/wide_" + family, 2);
    ASSERT_EQ(narrow.losses.size(), 2u) << family;
    ASSERT_EQ(wide.losses.size(), 2u) << family;
    for (int step = 0; step < 2; ++step) {
      EXPECT_NEAR(narrow.losses[step], wide.losses[step], 1e-4 * wide.losses[step])
          << family << " step " << step + 1;
    }
    EXPECT_NE(narrow.losses[0], wide.losses[0]) << family << ": the logits were not rounded";
    const double difference = update_difference(narrow, wide);
    EXPECT_LT(difference, 0.1) << family;
    std::printf(
        "%s: 16-bit logits: losses %.6f %.6f (fp32 logits %.6f %.6f); update differs by "
        "%.4f of its norm\n",
        family.c_str(), narrow.losses[0], narrow.losses[1], wide.losses[0], wide.losses[1],
        difference);
    const std::int64_t micro_batches = 2, rows = 2 * 32;  // one logits chunk per micro-batch
    for (int step = 0; step < 2; ++step) {
      EXPECT_EQ(emu::launches_of(narrow.launches[step], "cross_entropy_16_kernel"), micro_batches)
          << family;
      EXPECT_EQ(emu::launches_of(narrow.launches[step], "cross_entropy_kernel"), 0) << family;
      EXPECT_EQ(emu::launches_of(wide.launches[step], "cross_entropy_kernel"), micro_batches)
          << family;
      EXPECT_EQ(emu::launches_by_family(narrow.launches[step]),
                emu::launches_by_family(wide.launches[step]))
          << family;
      EXPECT_EQ(emu::casts_before_gemms(narrow.compute[step]), 0) << family;
    }
    EXPECT_EQ(narrow.narrow_logit_rows, 2 * micro_batches * rows) << family;
    EXPECT_EQ(wide.narrow_logit_rows, -1) << family;
  }
}

// A fast path whose start-up check fails is off, and the run takes the kernels it replaces: the
// fused residual + norm refused gives the add kernel and the norm kernel, and the same bits.
TEST(EmulatedCudaStepFallback, AResidualNormRefusedAtStartRunsTwoKernelsWithTheSameBits) {
  testing::TempDir dir;
  const TrainedRun fused = train("llama", kTiers[0], true, dir.path() + "/fused", 1);
  const TrainedRun refused = train_refused(backend::kResidualNormName, "llama", kTiers[0], true,
                                           dir.path() + "/refused", 1);
  ASSERT_EQ(fused.launches.size(), 1u);
  ASSERT_EQ(refused.launches.size(), 1u);
  EXPECT_TRUE(testing::same_bits(refused.state, fused.state));
  EXPECT_EQ(refused.losses[0], fused.losses[0]);
  // One step: one more add per block and micro-batch (2 layers x 2 micro-batches).
  EXPECT_EQ(emu::launches_of(refused.launches[0], "add_kernel"),
            emu::launches_of(fused.launches[0], "add_kernel") + 4);
  EXPECT_EQ(refused.launches[0].size(), fused.launches[0].size() + 4);
}

// RoPE fused into the attention's staging (rope_in_attention) gives the bits of the rope kernel
// followed by the staging, and of the widening followed by the rope kernel's backward, so a Llama
// run with it refused at start gives the same losses and state to the bit. With it on, no rope
// kernel runs: each attention call rounds q and k rotated (two rope_block_to_16 kernels in place of
// two of its three casts), the backward widens dq and dk rotated back (two rope_block_from_16) and
// dv (a widening the flash epilogue did itself before: one launch more a block in all), and the
// path counts each attention call, forward and backward. GPT-2 has no RoPE: the path is on and
// unused.
TEST(EmulatedCudaStepFallback, RopeInAttentionRefusedAtStartGivesTheSameBits) {
  testing::TempDir dir;
  // q, k and v in 16 bits (qkv_16bit) need this path and round what the fp32 path keeps: the fused
  // run refuses them.
  const TrainedRun fused =
      train_refused(backend::kQkvAloneName, "llama", kTiers[0], true, dir.path() + "/fused", 2);
  const TrainedRun refused = train_refused(backend::kRopeAttentionName, "llama", kTiers[0], true,
                                           dir.path() + "/refused", 2);
  ASSERT_EQ(fused.launches.size(), 2u);
  ASSERT_EQ(refused.launches.size(), 2u);
  EXPECT_TRUE(testing::same_bits(refused.state, fused.state));
  EXPECT_EQ(refused.losses, fused.losses);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers;
  for (int step = 0; step < 2; ++step) {
    const auto& on = fused.launches[step];
    const auto& off = refused.launches[step];
    EXPECT_EQ(emu::launches_of(on, "rope_kernel"), 0) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(off, "rope_kernel"), 2 * blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(on, "rope_block_to_16_kernel"), 2 * 2 * blocks)
        << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(on, "rope_block_from_16_kernel"), 2 * blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(off, "rope_block_to_16_kernel") +
                  emu::launches_of(off, "rope_block_from_16_kernel"),
              0)
        << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(on, "cast_block_kernel") + 4 * blocks,
              emu::launches_of(off, "cast_block_kernel"))
        << "step " << step + 1;
    // dv widened by a kernel where the flash epilogue wrote it widened itself.
    EXPECT_EQ(emu::launches_of(on, "cast_block_from_16_kernel"),
              emu::launches_of(off, "cast_block_from_16_kernel") + blocks)
        << "step " << step + 1;
    EXPECT_EQ(on.size(), off.size() + blocks) << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(fused.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(fused.rotated_attention_calls, 2 * 2 * blocks);
  EXPECT_EQ(refused.rotated_attention_calls, -1);
  const TrainedRun gpt2 = train("gpt2", kTiers[0], true, dir.path() + "/gpt2", 1);
  EXPECT_EQ(gpt2.rotated_attention_calls, 0);
}

// The activations only GEMMs read kept in 16 bits alone (activations_16bit_alone: each block's two
// norm outputs and MLP activation) against the path refused at start (their fp32 arrays allocated
// beside the companions): the same losses and state to the bit in both families (the products read
// the same companions either way), the same kernels, three writes kept alone per block and
// micro-batch (the two norms', and GELU's kernel for GPT-2, which runs the product and GELU where
// cuBLASLt's epilogue would have had an fp32 array to write, or SwiGLU's for the Llama family), and
// exactly the fp32 arrays' bytes fewer on the device: the attention's output too, whose path
// (attention_16bit_alone) needs this one and is off with it, as is its gradient's
// (attention_grad_16bit: one cast kernel more per block and micro-batch, 2 bytes per element of
// the gradient more). SwiGLU's output gradient in 16 bits (swiglu_grad_16bit) needs this path and
// rounds what the fp32 path keeps, as do the norms' output gradient in 16 bits (norm_grad_16bit)
// and GPT-2's GELU gradient kept alone (gelu_grad_16bit_alone, whose bias sums read it rounded),
// and GELU in GPT-2's 16-bit product epilogue (gemm_bias_gelu_epilogue_16bit, which writes GELU of
// the unrounded pre-activation): both runs refuse them.
TEST(EmulatedCudaStepFallback, ActivationsAloneRefusedAtStartGiveTheSameBits) {
  testing::TempDir dir;
  const std::string rounding = std::string(backend::kSwigluGradAloneName) + "," +
                               backend::kNormGradAloneName + "," + backend::kQkvAloneName + "," +
                               backend::kGeluGradAloneName + "," + backend::kGemmBiasGelu16Name;
  const std::string refused = std::string(backend::kActivations16AloneName) + "," + rounding;
  for (const std::string family : {"gpt2", "llama"}) {
    const TrainedRun alone = train_refused(rounding.c_str(), family, kTiers[0], true,
                                           dir.path() + "/alone-" + family, 2);
    const TrainedRun beside = train_refused(refused.c_str(), family, kTiers[0], true,
                                            dir.path() + "/beside-" + family, 2);
    ASSERT_EQ(alone.launches.size(), 2u) << family;
    ASSERT_EQ(beside.launches.size(), 2u) << family;
    EXPECT_TRUE(testing::same_bits(beside.state, alone.state)) << family;
    EXPECT_EQ(beside.losses, alone.losses) << family;
    const std::int64_t micro_batches = 2, layers = 2, rows = 2 * 32;
    for (int step = 0; step < 2; ++step) {
      // The same kernels, but for the attention gradient's path, off with this one.
      std::int64_t removed = 0;
      EXPECT_EQ(alone.launches[step], without_dout_casts(beside.launches[step], &removed))
          << family << " step " << step + 1;
      EXPECT_EQ(removed, micro_batches * layers) << family << " step " << step + 1;
    }
    EXPECT_EQ(alone.alone_writes, 2 * micro_batches * layers * 3) << family;
    EXPECT_EQ(beside.alone_writes, -1) << family;
    EXPECT_EQ(beside.attention_alone_writes, -1) << family;
    const std::int64_t hidden = 128, inner = family == "gpt2" ? 4 * hidden : 256;
    const std::int64_t attention = 2 * 64;  // heads x head size
    // The Llama family's gradient of gate and up (gate_up_grad_16bit_alone) and both families'
    // gradient of q, k and v (qkv_grad_16bit_alone) are off with this path too: their fp32 arrays
    // beside the companions.
    const std::int64_t gate_up_grad = family == "llama" ? rows * 2 * inner : 0;
    const std::int64_t qkv_grad = rows * (family == "llama" ? (2 + 2 * 1) * 64 : 3 * hidden);
    EXPECT_EQ(beside.device_in_use - alone.device_in_use,
              static_cast<std::uint64_t>(layers * rows * (2 * hidden + inner + attention) +
                                         gate_up_grad + qkv_grad) *
                      sizeof(float) +
                  static_cast<std::uint64_t>(rows * attention) * 2)
        << family;
  }
}

// Each block's attention output in 16 bits alone (attention_16bit_alone) against the path refused
// at start (its fp32 array allocated beside the companion): the same losses and state to the bit in
// both families (the flash forward's epilogue writes the same companion, the backward and the
// output projection read it either way), the same kernels (but for the cast its gradient's path,
// off with this one, runs before each block's backward), one write kept alone per block and
// micro-batch (the forward; the recomputation under checkpointing would add its own), and exactly
// the fp32 array's bytes fewer on the device (and the gradient's 2 bytes per element).
TEST(EmulatedCudaStepFallback, AttentionOutputsAloneRefusedAtStartGiveTheSameBits) {
  testing::TempDir dir;
  for (const std::string family : {"gpt2", "llama"}) {
    const TrainedRun alone = train(family, kTiers[0], true, dir.path() + "/alone-" + family, 2);
    const TrainedRun beside = train_refused(backend::kAttentionAloneName, family, kTiers[0], true,
                                            dir.path() + "/beside-" + family, 2);
    ASSERT_EQ(alone.launches.size(), 2u) << family;
    ASSERT_EQ(beside.launches.size(), 2u) << family;
    EXPECT_TRUE(testing::same_bits(beside.state, alone.state)) << family;
    EXPECT_EQ(beside.losses, alone.losses) << family;
    const std::int64_t micro_batches = 2, layers = 2, rows = 2 * 32;
    for (int step = 0; step < 2; ++step) {
      // The same kernels, but for the attention gradient's path, off with this one.
      std::int64_t removed = 0;
      EXPECT_EQ(alone.launches[step], without_dout_casts(beside.launches[step], &removed))
          << family << " step " << step + 1;
      EXPECT_EQ(removed, micro_batches * layers) << family << " step " << step + 1;
      EXPECT_EQ(emu::casts_before_gemms(alone.compute[step]), 0) << family << " step " << step + 1;
    }
    EXPECT_EQ(alone.attention_alone_writes, 2 * micro_batches * layers) << family;
    EXPECT_EQ(beside.attention_alone_writes, -1) << family;
    EXPECT_EQ(alone.alone_writes, beside.alone_writes) << family;  // the other activations alike
    // The gradient's path (attention_grad_16bit) needs this one: off with it, its gradient in fp32
    // (2 bytes per element more than its companion alone).
    EXPECT_EQ(beside.attention_grad_reads, -1) << family;
    const std::int64_t attention = 2 * 64;  // heads x head size
    EXPECT_EQ(beside.device_in_use - alone.device_in_use,
              static_cast<std::uint64_t>(layers * rows * attention) * sizeof(float) +
                  static_cast<std::uint64_t>(rows * attention) * 2)
        << family;
  }
}

// The gradient of each block's attention output in 16 bits alone (attention_grad_16bit) against
// the path refused at start (the fp32 product, rounded into the staging by the attention's
// backward): the emulated product rounds the same fp32 sums once, so both families give the same
// losses and state to the bit; each block's backward runs one cast kernel fewer per micro-batch
// (dO read in place), with no cast before a GEMM; one product kept alone per block and
// micro-batch; and the device holds 2 bytes per element of the gradient fewer (its companion in
// place of the fp32 array).
TEST(EmulatedCudaStepFallback, AttentionGradientsAloneRefusedAtStartGiveTheSameBits) {
  testing::TempDir dir;
  for (const std::string family : {"gpt2", "llama"}) {
    const TrainedRun alone = train(family, kTiers[0], true, dir.path() + "/alone-" + family, 2);
    const TrainedRun wide = train_refused(backend::kAttentionGradAloneName, family, kTiers[0], true,
                                          dir.path() + "/wide-" + family, 2);
    ASSERT_EQ(alone.launches.size(), 2u) << family;
    ASSERT_EQ(wide.launches.size(), 2u) << family;
    EXPECT_TRUE(testing::same_bits(wide.state, alone.state)) << family;
    EXPECT_EQ(wide.losses, alone.losses) << family;
    const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers;
    for (int step = 0; step < 2; ++step) {
      const auto& on = alone.launches[step];
      const auto& off = wide.launches[step];
      std::int64_t removed = 0;
      EXPECT_EQ(on, without_dout_casts(off, &removed)) << family << " step " << step + 1;
      EXPECT_EQ(removed, blocks) << family << " step " << step + 1;
      EXPECT_EQ(emu::casts_before_gemms(alone.compute[step]), 0) << family << " step " << step + 1;
    }
    EXPECT_EQ(alone.attention_grad_reads, 2 * blocks) << family;
    EXPECT_EQ(wide.attention_grad_reads, -1) << family;
    EXPECT_EQ(alone.attention_alone_writes, wide.attention_alone_writes) << family;
    const std::int64_t rows = 2 * 32, attention = 2 * 64;  // heads x head size
    EXPECT_EQ(wide.device_in_use - alone.device_in_use,
              static_cast<std::uint64_t>(rows * attention) * 2)
        << family;
  }
}

// The Llama family's gate and up in 16 bits alone (gate_up_16bit) against the path refused at
// start (an fp32 product read in fp32 by SwiGLU): the product rounds gate and up as autocast does,
// so the runs differ by that rounding alone: losses within 1e-4 of each other (relative) and
// updates within 10 % of the refused run's norm (the 16-bit logits' bounds). The same number of
// kernels, SwiGLU's 16-bit kernels in place of the fp32 ones (one forward, one backward per block
// and micro-batch), no cast before a GEMM, and exactly 2 bytes per element of gate and up fewer on
// the device (and of SwiGLU's output gradient, whose path, swiglu_grad_16bit, is off with this
// one). GPT-2 has both paths on and unused.
TEST(EmulatedCudaStepFallback, GateUpIn16BitsTrackTheFp32GateUp) {
  testing::TempDir dir;
  const TrainedRun narrow = train("llama", kTiers[0], true, dir.path() + "/narrow", 2);
  const TrainedRun wide =
      train_refused(backend::kGateUp16Name, "llama", kTiers[0], true, dir.path() + "/wide", 2);
  ASSERT_EQ(narrow.launches.size(), 2u);
  ASSERT_EQ(wide.launches.size(), 2u);
  for (int step = 0; step < 2; ++step) {
    EXPECT_NEAR(narrow.losses[step], wide.losses[step], 1e-4 * wide.losses[step])
        << "step " << step + 1;
  }
  const double difference = update_difference(narrow, wide);
  EXPECT_LT(difference, 0.1);
  std::printf(
      "llama: 16-bit gate and up: losses %.6f %.6f (fp32 gate and up %.6f %.6f); update "
      "differs by %.4f of its norm\n",
      narrow.losses[0], narrow.losses[1], wide.losses[0], wide.losses[1], difference);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers, rows = 2 * 32;
  for (int step = 0; step < 2; ++step) {
    const auto& on = narrow.launches[step];
    const auto& off = wide.launches[step];
    EXPECT_EQ(on.size(), off.size()) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(on, "swiglu_forward_16_kernel"), blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(on, "swiglu_backward_16_kernel"), blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(on, "swiglu_forward_kernel") +
                  emu::launches_of(on, "swiglu_backward_kernel"),
              0)
        << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(off, "swiglu_forward_kernel"), blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(off, "swiglu_forward_16_kernel"), 0) << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(narrow.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(narrow.narrow_swiglu_calls, 2 * 2 * blocks);
  EXPECT_EQ(wide.narrow_swiglu_calls, -1);
  EXPECT_EQ(wide.swiglu_grad_reads, -1);
  const std::int64_t inner = 256;
  // With the gradient of gate and up kept alone (off with this path): its fp32 array, 4 bytes per
  // element, too.
  EXPECT_EQ(wide.device_in_use - narrow.device_in_use,
            static_cast<std::uint64_t>(layers * rows * 2 * inner + rows * inner) * 2 +
                static_cast<std::uint64_t>(rows * 2 * inner) * 4);
  const TrainedRun gpt2 = train("gpt2", kTiers[0], true, dir.path() + "/gpt2", 1);
  EXPECT_EQ(gpt2.narrow_swiglu_calls, 0);
  EXPECT_EQ(gpt2.swiglu_grad_reads, 0);
}

// The gradient of the Llama family's SwiGLU output in 16 bits alone (swiglu_grad_16bit) against the
// path refused at start (the down projection's input gradient in fp32, read so by SwiGLU's
// backward): the product rounds that gradient once, as autocast's bf16 product does, so the runs
// differ by that rounding alone: losses within 1e-4 of each other (relative; the first step's loss
// precedes any update, so it is the same to the bit) and updates within 10 % of the refused run's
// norm. The same kernels in the same order (the product writes its 16 bits through the same GEMM
// kernel, SwiGLU's 16-bit backward reads them), no cast before a GEMM, one SwiGLU backward reading
// the gradient kept alone per block and micro-batch, and exactly 2 bytes per element of the
// gradient fewer on the device (its companion in place of the fp32 array).
TEST(EmulatedCudaStepFallback, SwigluGradientsIn16BitsTrackTheFp32Gradients) {
  testing::TempDir dir;
  const TrainedRun narrow = train("llama", kTiers[0], true, dir.path() + "/narrow", 2);
  const TrainedRun wide = train_refused(backend::kSwigluGradAloneName, "llama", kTiers[0], true,
                                        dir.path() + "/wide", 2);
  ASSERT_EQ(narrow.launches.size(), 2u);
  ASSERT_EQ(wide.launches.size(), 2u);
  EXPECT_EQ(narrow.losses[0], wide.losses[0]);
  for (int step = 0; step < 2; ++step) {
    EXPECT_NEAR(narrow.losses[step], wide.losses[step], 1e-4 * wide.losses[step])
        << "step " << step + 1;
  }
  const double difference = update_difference(narrow, wide);
  EXPECT_LT(difference, 0.1);
  EXPECT_GT(difference, 0.0) << "the gradient was not rounded";
  std::printf(
      "llama: SwiGLU's output gradient in 16 bits: losses %.6f %.6f (fp32 gradient %.6f %.6f); "
      "update differs by %.4f of its norm\n",
      narrow.losses[0], narrow.losses[1], wide.losses[0], wide.losses[1], difference);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers, rows = 2 * 32;
  for (int step = 0; step < 2; ++step) {
    EXPECT_EQ(narrow.launches[step], wide.launches[step]) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(narrow.launches[step], "swiglu_backward_16_kernel"), blocks)
        << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(narrow.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(narrow.swiglu_grad_reads, 2 * blocks);
  EXPECT_EQ(wide.swiglu_grad_reads, -1);
  EXPECT_EQ(narrow.narrow_swiglu_calls, wide.narrow_swiglu_calls);
  const std::int64_t inner = 256;
  EXPECT_EQ(wide.device_in_use - narrow.device_in_use,
            static_cast<std::uint64_t>(rows * inner) * 2);
}

// The gradient of the Llama family's gate and up kept in 16 bits alone (gate_up_grad_16bit_alone)
// against the path refused at start (its fp32 array allocated beside the companion): SwiGLU's
// backward writes the same companion, which the products read either way, so the losses and state
// are the same to the bit, the kernels the same, one write kept alone per block and micro-batch,
// and exactly the fp32 array's 4 bytes per element fewer on the device.
TEST(EmulatedCudaStepFallback, GateUpGradientsAloneRefusedAtStartGiveTheSameBits) {
  testing::TempDir dir;
  const TrainedRun alone = train("llama", kTiers[0], true, dir.path() + "/alone", 2);
  const TrainedRun beside = train_refused(backend::kGateUpGradAloneName, "llama", kTiers[0], true,
                                          dir.path() + "/beside", 2);
  ASSERT_EQ(alone.launches.size(), 2u);
  ASSERT_EQ(beside.launches.size(), 2u);
  EXPECT_TRUE(testing::same_bits(beside.state, alone.state));
  EXPECT_EQ(beside.losses, alone.losses);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers, rows = 2 * 32;
  for (int step = 0; step < 2; ++step) {
    EXPECT_EQ(alone.launches[step], beside.launches[step]) << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(alone.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(alone.gate_up_grad_writes, 2 * blocks);
  EXPECT_EQ(beside.gate_up_grad_writes, -1);
  const std::int64_t inner = 256;
  EXPECT_EQ(beside.device_in_use - alone.device_in_use,
            static_cast<std::uint64_t>(rows * 2 * inner) * sizeof(float));
}

// The gradient of q, k and v kept in 16 bits alone (qkv_grad_16bit_alone) against the path refused
// at start (its fp32 array allocated beside the companion), in both families: the attention's
// backward writes the same companion (the Llama family's rotated back by the staging's widening,
// GPT-2's by the flash epilogue), which the qkv projection's two products read either way, and
// GPT-2's bias sums it widened, the values of its fp32 array; so the losses and state are the same
// to the bit, the kernels the same, one write kept alone per block and micro-batch (and for GPT-2
// one bias gradient reading it), and exactly the fp32 array's 4 bytes per element fewer on the
// device.
TEST(EmulatedCudaStepFallback, QkvGradientsAloneRefusedAtStartGiveTheSameBits) {
  testing::TempDir dir;
  for (const std::string family : {"gpt2", "llama"}) {
    const TrainedRun alone = train(family, kTiers[0], true, dir.path() + "/alone-" + family, 2);
    const TrainedRun beside = train_refused(backend::kQkvGradAloneName, family, kTiers[0], true,
                                            dir.path() + "/beside-" + family, 2);
    ASSERT_EQ(alone.launches.size(), 2u) << family;
    ASSERT_EQ(beside.launches.size(), 2u) << family;
    EXPECT_TRUE(testing::same_bits(beside.state, alone.state)) << family;
    EXPECT_EQ(beside.losses, alone.losses) << family;
    const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers;
    const std::int64_t rows = 2 * 32;
    for (int step = 0; step < 2; ++step) {
      EXPECT_EQ(alone.launches[step], beside.launches[step]) << family << " step " << step + 1;
      EXPECT_EQ(emu::casts_before_gemms(alone.compute[step]), 0) << family << " step " << step + 1;
    }
    EXPECT_EQ(alone.qkv_grad_writes, 2 * blocks) << family;
    EXPECT_EQ(beside.qkv_grad_writes, -1) << family;
    EXPECT_EQ(alone.qkv_grad_bias_reads, family == "gpt2" ? 2 * blocks : 0) << family;
    // GPT-2: 3 x 128; the Llama family: q's 2 heads, k's and v's 1, of 64.
    const std::int64_t qkv = family == "gpt2" ? 3 * 128 : (2 + 2 * 1) * 64;
    EXPECT_EQ(beside.device_in_use - alone.device_in_use,
              static_cast<std::uint64_t>(rows * qkv) * sizeof(float))
        << family;
  }
}

// Each block's q, k and v in 16 bits alone (qkv_16bit) against the path refused at start (the
// projection's output in fp32, rounded by the attention's staging after RoPE's rotation): the
// product rounds q, k and v once, as autocast's bf16 projection does, and the staging rotates q and
// k from those 16 bits, so the runs differ by that rounding alone (v's 16 bits are the same either
// way): losses within 1e-4 of each other (relative) and updates within 10 % of the refused run's
// norm. The same kernels in the same order but v's staging, which copies its 16 bits
// (cast_block_16_kernel) where it rounded the fp32 values (cast_block_kernel), in the forward and
// the backward; no cast before a GEMM; two attention calls reading q, k and v kept alone per block
// and micro-batch; and exactly 2 bytes per element of q, k and v fewer on the device, in each
// layer's saved activations.
TEST(EmulatedCudaStepFallback, QkvIn16BitsTrackTheFp32Qkv) {
  testing::TempDir dir;
  const TrainedRun narrow = train("llama", kTiers[0], true, dir.path() + "/narrow", 2);
  const TrainedRun wide =
      train_refused(backend::kQkvAloneName, "llama", kTiers[0], true, dir.path() + "/wide", 2);
  ASSERT_EQ(narrow.launches.size(), 2u);
  ASSERT_EQ(wide.launches.size(), 2u);
  for (int step = 0; step < 2; ++step) {
    EXPECT_NEAR(narrow.losses[step], wide.losses[step], 1e-4 * wide.losses[step])
        << "step " << step + 1;
  }
  const double difference = update_difference(narrow, wide);
  EXPECT_LT(difference, 0.1);
  EXPECT_GT(difference, 0.0) << "q, k and v were not rounded";
  std::printf(
      "llama: q, k and v in 16 bits: losses %.6f %.6f (fp32 q, k, v %.6f %.6f); update differs by "
      "%.4f of its norm\n",
      narrow.losses[0], narrow.losses[1], wide.losses[0], wide.losses[1], difference);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers, rows = 2 * 32;
  for (int step = 0; step < 2; ++step) {
    std::vector<std::string> renamed = narrow.launches[step];
    for (std::string& k : renamed) {
      if (k == "cast_block_16_kernel") k = "cast_block_kernel";
    }
    EXPECT_EQ(renamed, wide.launches[step]) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(narrow.launches[step], "cast_block_16_kernel"), 2 * blocks)
        << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(wide.launches[step], "cast_block_16_kernel"), 0)
        << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(narrow.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(narrow.qkv_alone_reads, 2 * 2 * blocks);
  EXPECT_EQ(wide.qkv_alone_reads, -1);
  const std::int64_t qkv = (2 + 2 * 1) * 64;  // q's 2 heads, k's and v's 1, of 64
  EXPECT_EQ(wide.device_in_use - narrow.device_in_use,
            static_cast<std::uint64_t>(layers * rows * qkv) * 2);
}

// GPT-2's MLP pre-activation in 16 bits (gelu_16bit) against the path refused at start (the
// product and its bias in fp32, read so by GELU's forward and backward): the product rounds the
// pre-activation once, as autocast's bf16 c_fc does, and GELU reads those 16 bits both ways, so the
// runs differ by that rounding alone: the first loss moves by it too (the forward reads the rounded
// values), losses within 1e-4 of each other (relative) and updates within 10 % of the refused run's
// norm. Per block and micro-batch: the forward's bias kernel fewer (the product adds the bias
// before the rounding; the backward's zeroing of GELU's gradient, a memset and no kernel, goes too:
// the 16-bit kernel assigns it), and GELU's two kernels their 16-bit forms; no cast before a GEMM;
// two GELU calls on the 16 bits per block and micro-batch; and exactly 2 bytes per element of each
// layer's pre-activation fewer on the device.
TEST(EmulatedCudaStepFallback, Gpt2GeluInputIn16BitsTracksTheFp32Input) {
  testing::TempDir dir;
  // GELU's gradient kept alone (gelu_grad_16bit_alone) needs this path and rounds what the fp32
  // path keeps: the narrow run refuses it (GeluGradientsAloneTrackTheFp32Gradient), and GELU in the
  // product's epilogue, which computes GELU before the rounding
  // (Gpt2MlpEpiloguesIn16BitsTrackTheUnfusedKernels).
  const TrainedRun narrow = train_refused(
      (std::string(backend::kGeluGradAloneName) + "," + backend::kGemmBiasGelu16Name).c_str(),
      "gpt2", kTiers[0], true, dir.path() + "/narrow", 2);
  const TrainedRun wide =
      train_refused(backend::kGelu16Name, "gpt2", kTiers[0], true, dir.path() + "/wide", 2);
  ASSERT_EQ(narrow.launches.size(), 2u);
  ASSERT_EQ(wide.launches.size(), 2u);
  for (int step = 0; step < 2; ++step) {
    EXPECT_NEAR(narrow.losses[step], wide.losses[step], 1e-4 * wide.losses[step])
        << "step " << step + 1;
  }
  EXPECT_NE(narrow.losses[0], wide.losses[0]) << "the pre-activation was not rounded";
  const double difference = update_difference(narrow, wide);
  EXPECT_LT(difference, 0.1);
  EXPECT_GT(difference, 0.0);
  std::printf(
      "gpt2: GELU's input in 16 bits: losses %.6f %.6f (fp32 input %.6f %.6f); update differs by "
      "%.4f of its norm\n",
      narrow.losses[0], narrow.losses[1], wide.losses[0], wide.losses[1], difference);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers, rows = 2 * 32;
  for (int step = 0; step < 2; ++step) {
    const auto& on = narrow.launches[step];
    const auto& off = wide.launches[step];
    EXPECT_EQ(emu::launches_of(on, "gelu_forward_16_kernel"), blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(on, "gelu_backward_16_kernel"), blocks) << "step " << step + 1;
    EXPECT_EQ(
        emu::launches_of(on, "gelu_forward_kernel") + emu::launches_of(on, "gelu_backward_kernel"),
        0)
        << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(off, "gelu_forward_kernel"), blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(off, "gelu_backward_kernel"), blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(on, "add_bias_kernel") + blocks,
              emu::launches_of(off, "add_bias_kernel"))
        << "step " << step + 1;
    EXPECT_EQ(on.size() + blocks, off.size()) << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(narrow.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(narrow.narrow_gelu_calls, 2 * 2 * blocks);
  EXPECT_EQ(wide.narrow_gelu_calls, -1);
  const std::int64_t inner = 4 * 128;
  EXPECT_EQ(wide.device_in_use - narrow.device_in_use,
            static_cast<std::uint64_t>(layers * rows * inner) * 2);
  const TrainedRun llama = train("llama", kTiers[0], true, dir.path() + "/llama", 1);
  EXPECT_EQ(llama.narrow_gelu_calls, 0);
}

// GPT-2's GELU gradient kept in 16 bits alone (gelu_grad_16bit_alone) against the path refused at
// start (its fp32 array beside the companion): GELU's backward writes the same companion, which
// the fc projection's two products read either way, but the bias's column sums read its values
// rounded where they summed the fp32 ones (as autocast's bias gradient sums its bf16 gradient): the
// first loss the same to the bit (no update yet), losses within 1e-4 of each other (relative),
// updates within 10 % of the refused run's norm. The same kernels, one write kept alone and one
// bias gradient reading it per block and micro-batch, and exactly 4 bytes per element of the
// gradient (one scratch for all blocks) fewer on the device. (GELU's gradient in the product's
// epilogue, which needs the gradient kept alone, is refused for the kernels to compare.)
TEST(EmulatedCudaStepFallback, GeluGradientsAloneTrackTheFp32Gradient) {
  testing::TempDir dir;
  const TrainedRun alone =
      train_refused(backend::kGemmDgelu16Name, "gpt2", kTiers[0], true, dir.path() + "/alone", 2);
  const TrainedRun beside = train_refused(backend::kGeluGradAloneName, "gpt2", kTiers[0], true,
                                          dir.path() + "/beside", 2);
  ASSERT_EQ(alone.launches.size(), 2u);
  ASSERT_EQ(beside.launches.size(), 2u);
  EXPECT_EQ(alone.losses[0], beside.losses[0]);
  EXPECT_NEAR(alone.losses[1], beside.losses[1], 1e-4 * beside.losses[1]);
  const double difference = update_difference(alone, beside);
  EXPECT_LT(difference, 0.1);
  EXPECT_GT(difference, 0.0) << "the bias's sums did not read the rounded gradient";
  std::printf(
      "gpt2: GELU's gradient alone: losses %.6f %.6f (beside its fp32 array %.6f %.6f); update "
      "differs by %.4f of its norm\n",
      alone.losses[0], alone.losses[1], beside.losses[0], beside.losses[1], difference);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers, rows = 2 * 32;
  for (int step = 0; step < 2; ++step) {
    EXPECT_EQ(alone.launches[step], beside.launches[step]) << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(alone.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(alone.gelu_grad_writes, 2 * blocks);
  EXPECT_EQ(alone.gelu_grad_bias_reads, 2 * blocks);
  EXPECT_EQ(beside.gelu_grad_writes, -1);
  EXPECT_EQ(beside.gelu_grad_bias_reads, 0);
  const std::int64_t inner = 4 * 128;
  EXPECT_EQ(beside.device_in_use - alone.device_in_use,
            static_cast<std::uint64_t>(rows * inner) * sizeof(float));
}

// GPT-2's MLP with GELU and its gradient in the product's epilogue, in 16 bits
// (gemm_bias_gelu_epilogue_16bit, gemm_dgelu_epilogue_16bit: the fallback kernel's epilogue
// standing in for cuBLASLt's), against both refused at start (the product written in 16 bits, then
// GELU's 16-bit kernels). The forward takes GELU of the fp32 pre-activation where the unfused
// kernel takes it of the 16-bit rounding, so the first loss moves: losses within 1e-4 of each
// other (relative), updates within 10 % of the refused run's norm. The backward reads the same
// 16 bits and gives the unfused kernels' bits (EmulatedKernels.FallbackGemmGeluEpilogues…). Per
// block and micro-batch, GELU's two 16-bit kernels go (each product does their work): two
// launches fewer, no cast before a GEMM; one fused forward and one fused backward, none declined;
// and the fp32 scratch the unfused backward wrote its product into is not allocated: exactly 4
// bytes per element of it fewer on the device.
TEST(EmulatedCudaStepFallback, Gpt2MlpEpiloguesIn16BitsTrackTheUnfusedKernels) {
  testing::TempDir dir;
  const TrainedRun fused = train("gpt2", kTiers[0], true, dir.path() + "/fused", 2);
  const TrainedRun unfused = train_refused(
      (std::string(backend::kGemmBiasGelu16Name) + "," + backend::kGemmDgelu16Name).c_str(), "gpt2",
      kTiers[0], true, dir.path() + "/unfused", 2);
  ASSERT_EQ(fused.launches.size(), 2u);
  ASSERT_EQ(unfused.launches.size(), 2u);
  for (int step = 0; step < 2; ++step) {
    EXPECT_NEAR(fused.losses[step], unfused.losses[step], 1e-4 * unfused.losses[step])
        << "step " << step + 1;
  }
  EXPECT_NE(fused.losses[0], unfused.losses[0]) << "GELU read the rounded pre-activation";
  const double difference = update_difference(fused, unfused);
  EXPECT_LT(difference, 0.1);
  EXPECT_GT(difference, 0.0);
  std::printf(
      "gpt2: GELU in the 16-bit epilogues: losses %.6f %.6f (unfused %.6f %.6f); update differs by "
      "%.4f of its norm\n",
      fused.losses[0], fused.losses[1], unfused.losses[0], unfused.losses[1], difference);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers;
  for (int step = 0; step < 2; ++step) {
    const auto& on = fused.launches[step];
    const auto& off = unfused.launches[step];
    for (const char* kernel : {"gelu_forward_16_kernel", "gelu_backward_16_kernel"}) {
      EXPECT_EQ(emu::launches_of(on, kernel), 0) << kernel << ", step " << step + 1;
      EXPECT_EQ(emu::launches_of(off, kernel), blocks) << kernel << ", step " << step + 1;
    }
    EXPECT_EQ(emu::launches_of(on, "gemm_fallback_kernel"),
              emu::launches_of(off, "gemm_fallback_kernel"))
        << "step " << step + 1;
    EXPECT_EQ(on.size() + 2 * blocks, off.size()) << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(fused.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(fused.gelu_epilogue_16, 2 * blocks);
  EXPECT_EQ(fused.dgelu_epilogue_16, 2 * blocks);
  EXPECT_EQ(fused.gelu_epilogues_16_declined, 0);
  EXPECT_EQ(unfused.gelu_epilogue_16, -1);
  EXPECT_EQ(unfused.dgelu_epilogue_16, -1);
  EXPECT_EQ(fused.narrow_gelu_calls, unfused.narrow_gelu_calls);
  // No fp32 scratch for the product before GELU's gradient (N x 4C, one for all blocks).
  const std::int64_t rows = 2 * 32, inner = 4 * 128;
  EXPECT_EQ(unfused.device_in_use - fused.device_in_use,
            static_cast<std::uint64_t>(rows * inner) * sizeof(float));
}

// A step's kernels without the bias added to each block's qkv product by a kernel of its own (the
// add_bias_kernel right before the attention's staging, cast_block_kernel): what GPT-2's step runs
// with q, k and v in 16 bits, whose product adds its bias before the rounding. *removed counts
// them.
std::vector<std::string> without_qkv_bias_adds(const std::vector<std::string>& log,
                                               std::int64_t* removed) {
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < log.size(); ++i) {
    if (log[i] == "add_bias_kernel" && i + 1 < log.size() && log[i + 1] == "cast_block_kernel") {
      ++*removed;
      continue;
    }
    kept.push_back(log[i]);
  }
  return kept;
}

// GPT-2's q, k and v in 16 bits alone (qkv_16bit), its projection with a bias, against the path
// refused at start (the product and its bias in fp32, rounded by the attention's staging): the
// product adds the bias to each fp32 result before rounding it once, the bits the staging rounded
// from the fp32 array, and GPT-2's attention does not rotate them, so the losses and state are the
// same to the bit. The same kernels in the same order but the bias kernel after each block's qkv
// product (the product adds it) and the staging copying q, k and v's 16 bits
// (cast_block_16_kernel, three per attention call) where it rounded the fp32 values
// (cast_block_kernel); no cast before a GEMM; one biased product written alone and two attention
// calls reading it per block and micro-batch; and exactly 2 bytes per element of q, k and v fewer
// on the device, in each layer's saved activations.
TEST(EmulatedCudaStepFallback, Gpt2QkvIn16BitsWithTheirBiasGiveTheSameBits) {
  testing::TempDir dir;
  const TrainedRun narrow = train("gpt2", kTiers[0], true, dir.path() + "/narrow", 2);
  const TrainedRun wide =
      train_refused(backend::kQkvAloneName, "gpt2", kTiers[0], true, dir.path() + "/wide", 2);
  ASSERT_EQ(narrow.launches.size(), 2u);
  ASSERT_EQ(wide.launches.size(), 2u);
  EXPECT_TRUE(testing::same_bits(wide.state, narrow.state));
  EXPECT_EQ(wide.losses, narrow.losses);
  const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers, rows = 2 * 32;
  for (int step = 0; step < 2; ++step) {
    std::vector<std::string> renamed = narrow.launches[step];
    for (std::string& k : renamed) {
      if (k == "cast_block_16_kernel") k = "cast_block_kernel";
    }
    std::int64_t removed = 0;
    EXPECT_EQ(renamed, without_qkv_bias_adds(wide.launches[step], &removed)) << "step " << step + 1;
    EXPECT_EQ(removed, blocks) << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(narrow.launches[step], "cast_block_16_kernel"), 3 * 2 * blocks)
        << "step " << step + 1;
    EXPECT_EQ(emu::launches_of(wide.launches[step], "cast_block_16_kernel"), 0)
        << "step " << step + 1;
    EXPECT_EQ(emu::casts_before_gemms(narrow.compute[step]), 0) << "step " << step + 1;
  }
  EXPECT_EQ(narrow.qkv_alone_reads, 2 * 2 * blocks);
  EXPECT_EQ(narrow.bias_alone_writes, 2 * blocks);
  EXPECT_EQ(wide.qkv_alone_reads, -1);
  EXPECT_EQ(wide.bias_alone_writes, 0);
  const std::int64_t qkv = 3 * 128;
  EXPECT_EQ(wide.device_in_use - narrow.device_in_use,
            static_cast<std::uint64_t>(layers * rows * qkv) * 2);
}

// The gradient of the blocks' norm outputs in 16 bits alone (norm_grad_16bit) against the path
// refused at start (the projections' input gradients in fp32, read so by the norms' backwards): the
// products round that gradient once, as autocast's bf16 products do, so in both families the runs
// differ by that rounding alone: the first loss the same to the bit (no update yet), losses within
// 2e-4 of each other (relative; below) and updates within 10 % of the refused run's norm. The same
// kernels in the same order, no cast before a GEMM, two norm backwards reading the gradient kept
// alone per block and micro-batch, and exactly 2 bytes per element of the gradient fewer on the
// device.
TEST(EmulatedCudaStepFallback, NormGradientsIn16BitsTrackTheFp32Gradients) {
  testing::TempDir dir;
  for (const std::string family : {"gpt2", "llama"}) {
    const TrainedRun narrow = train(family, kTiers[0], true, dir.path() + "/narrow-" + family, 2);
    const TrainedRun wide = train_refused(backend::kNormGradAloneName, family, kTiers[0], true,
                                          dir.path() + "/wide-" + family, 2);
    ASSERT_EQ(narrow.launches.size(), 2u) << family;
    ASSERT_EQ(wide.launches.size(), 2u) << family;
    EXPECT_EQ(narrow.losses[0], wide.losses[0]) << family;
    // The second loss within 2e-4: the first AdamW update is m / sqrt(v), whose sign flips with
    // the rounding of a gradient near zero, so the runs' losses differ by more than the rounding
    // (GPT-2, with its MLP's 16-bit paths on too: 1.4e-4); the update's norm is the steadier
    // measure.
    for (int step = 0; step < 2; ++step) {
      EXPECT_NEAR(narrow.losses[step], wide.losses[step], 2e-4 * wide.losses[step])
          << family << " step " << step + 1;
    }
    const double difference = update_difference(narrow, wide);
    EXPECT_LT(difference, 0.1) << family;
    EXPECT_GT(difference, 0.0) << family << ": the gradient was not rounded";
    std::printf(
        "%s: the norms' output gradient in 16 bits: losses %.6f %.6f (fp32 gradient %.6f %.6f); "
        "update differs by %.4f of its norm\n",
        family.c_str(), narrow.losses[0], narrow.losses[1], wide.losses[0], wide.losses[1],
        difference);
    const std::int64_t micro_batches = 2, layers = 2, blocks = micro_batches * layers;
    for (int step = 0; step < 2; ++step) {
      EXPECT_EQ(narrow.launches[step], wide.launches[step]) << family << " step " << step + 1;
      EXPECT_EQ(emu::casts_before_gemms(narrow.compute[step]), 0) << family << " step " << step + 1;
    }
    EXPECT_EQ(narrow.norm_grad_reads, 2 * 2 * blocks) << family;
    EXPECT_EQ(wide.norm_grad_reads, -1) << family;
    const std::int64_t rows = 2 * 32, hidden = 128;
    EXPECT_EQ(wide.device_in_use - narrow.device_in_use,
              static_cast<std::uint64_t>(rows * hidden) * 2)
        << family;
  }
}

// The backend's start: the fast paths are checked by the emulated kernels, each attention check
// once per process (a second backend does not run it again), the cheap residual-norm check every
// time; without cuBLASLt the epilogues are not applicable.
TEST(EmulatedCudaBackend, StartsWithItsFastPathsCheckedAndTheAttentionCheckOnce) {
  backend::CudaBackendOptions options;
  options.device_bytes_max = 64ull << 20;
  options.host_bytes_max = 64ull << 20;
  options.cpu_threads = 2;
  options.use_cublaslt = false;
  options.gemm_precision = cuda::GemmPrecision::kBf16;
  options.gemm_workspace_bytes = 4ull << 20;
  options.attention_head_sizes = {64, 24};
  auto first = backend::make_cuda_backend(options);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  emu::clear_launch_log();
  auto second = backend::make_cuda_backend(options);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  const auto families = emu::launches_by_family(emu::launch_log());
  EXPECT_EQ(families.count("attention"), 0u) << "the attention check ran again";
  EXPECT_GT(families.count("norm"), 0u) << "the residual-norm check did not run";
  std::map<std::string, backend::FastPath> paths;
  for (const backend::FastPath& p : (*second)->fast_paths())
    paths[p.name] = p;
  ASSERT_EQ(paths.count("flash_attention"), 1u);
  EXPECT_TRUE(paths["flash_attention"].active);
  EXPECT_NE(paths["flash_attention"].detail.find("bf16, head sizes 64;"), std::string::npos)
      << paths["flash_attention"].detail;
  EXPECT_TRUE(paths["fused_residual_norm"].active) << paths["fused_residual_norm"].detail;
  EXPECT_TRUE(paths["rope_in_attention"].active) << paths["rope_in_attention"].detail;
  EXPECT_TRUE(paths["activations_16bit_alone"].active) << paths["activations_16bit_alone"].detail;
  EXPECT_TRUE(paths["gate_up_16bit"].active) << paths["gate_up_16bit"].detail;
  EXPECT_TRUE(paths["gelu_16bit"].active) << paths["gelu_16bit"].detail;
  EXPECT_TRUE(paths["gelu_grad_16bit_alone"].active) << paths["gelu_grad_16bit_alone"].detail;
  // Without cuBLASLt the MLP's 16-bit GELU epilogues are the fallback kernel's.
  for (const char* epilogue : {"gemm_bias_gelu_epilogue_16bit", "gemm_dgelu_epilogue_16bit"}) {
    EXPECT_TRUE(paths[epilogue].active) << epilogue << ": " << paths[epilogue].detail;
    EXPECT_NE(paths[epilogue].detail.find("fallback GEMM kernel"), std::string::npos)
        << paths[epilogue].detail;
  }
  EXPECT_TRUE(paths["attention_16bit_alone"].active) << paths["attention_16bit_alone"].detail;
  EXPECT_TRUE(paths["attention_grad_16bit"].active) << paths["attention_grad_16bit"].detail;
  EXPECT_TRUE(paths["swiglu_grad_16bit"].active) << paths["swiglu_grad_16bit"].detail;
  EXPECT_TRUE(paths["norm_grad_16bit"].active) << paths["norm_grad_16bit"].detail;
  EXPECT_TRUE(paths["gate_up_grad_16bit_alone"].active) << paths["gate_up_grad_16bit_alone"].detail;
  EXPECT_TRUE(paths["qkv_grad_16bit_alone"].active) << paths["qkv_grad_16bit_alone"].detail;
  EXPECT_TRUE(paths["qkv_16bit"].active) << paths["qkv_16bit"].detail;
  EXPECT_NE(paths["attention_16bit_alone"].detail.find("head sizes 64"), std::string::npos)
      << paths["attention_16bit_alone"].detail;
  for (const char* epilogue : {"gemm_bias_epilogue", "gemm_bias_gelu_epilogue",
                               "gemm_dgelu_epilogue", "gemm_residual_epilogue"}) {
    ASSERT_EQ(paths.count(epilogue), 1u) << epilogue;
    EXPECT_FALSE(paths[epilogue].active);
    EXPECT_NE(paths[epilogue].detail.find("cuBLASLt is not used"), std::string::npos)
        << paths[epilogue].detail;
  }
  EXPECT_EQ((*second)->name(), "cuda:0");
  EXPECT_NE((*second)->description().find("SIMT emulator"), std::string::npos);
  // What `strata report` lists without a GPU is every path the backend checks, with the same
  // "replaces".
  std::map<std::string, std::string> unchecked;
  for (const backend::FastPath& p : backend::cuda_fast_paths_unchecked("why"))
    unchecked[p.name] = p.replaces;
  std::map<std::string, std::string> checked;
  for (const auto& [name, p] : paths)
    checked[name] = p.replaces;
  EXPECT_EQ(unchecked, checked);
}

// The emulated streams hold their work until the host waits for it, so that a missing wait shows:
// a copy to pinned memory is not there before its stream is synchronized (or an event after it
// is), and is there after; a stream that waits on another's event runs that one's work first.
// A small emulated backend without cuBLASLt (every product the fallback kernel).
// The fast path `name` as the backend lists it, if it does.
std::optional<backend::FastPath> listed_path(const backend::Backend& b, const char* name) {
  for (const backend::FastPath& p : b.fast_paths()) {
    if (p.name == name) return p;
  }
  return std::nullopt;
}

backend::CudaBackendOptions small_options(cuda::GemmPrecision precision) {
  backend::CudaBackendOptions options;
  options.device_bytes_max = 64ull << 20;
  options.host_bytes_max = 64ull << 20;
  options.cpu_threads = 2;
  options.use_cublaslt = false;
  options.gemm_workspace_bytes = 4ull << 20;
  options.gemm_precision = precision;
  return options;
}

// A product's operands on `b`'s device: A (m x k) and a weight W (n x k) with values `value(i)`
// (A's elements first, then W's), W rounded to 16-bit `type` into W16 and widened back into W (so
// W holds exactly W16's values), and room for C (m x n). `ok` is false where an allocation failed.
struct WeightOperands {
  backend::Buffer a, w, w16, c;
  bool ok = false;
};
WeightOperands weight_operands(backend::Backend& b, std::int64_t m, std::int64_t n, std::int64_t k,
                               const std::function<float(std::int64_t)>& value,
                               backend::DType type = backend::DType::kBF16) {
  WeightOperands o;
  auto a = b.allocate_device(m * k * 4, "a");
  auto w = b.allocate_device(n * k * 4, "w");
  auto w16 = b.allocate_device(n * k * 2, "w16");
  auto c = b.allocate_device(m * n * 4, "c");
  auto host = b.allocate_pinned((m * k + n * k) * 4, "operands");
  if (!a.is_ok() || !w.is_ok() || !w16.is_ok() || !c.is_ok() || !host.is_ok()) return o;
  float* h = host->as<float>();
  for (std::int64_t i = 0; i < m * k + n * k; ++i)
    h[i] = value(i);
  o.ok = b.copy_async(backend::StreamKind::kCompute, a->data(), h, m * k * 4).is_ok() &&
         b.copy_async(backend::StreamKind::kCompute, w->data(), h + m * k, n * k * 4).is_ok();
  backend::Ops<float>& ops = b.ops_f32();
  ops.cast_to(w16->data(), type, w->as<float>(), n * k);
  ops.cast_from(w->as<float>(), w16->data(), type, n * k);
  o.ok = o.ok && b.synchronize(backend::StreamKind::kCompute).is_ok();  // before `host` goes
  o.a = std::move(*a);
  o.w = std::move(*w);
  o.w16 = std::move(*w16);
  o.c = std::move(*c);
  return o;
}

TEST(EmulatedCudaBackend, StreamsRunTheirWorkWhenTheHostWaitsForIt) {
  backend::CudaBackendOptions options = small_options(cuda::GemmPrecision::kFp32);
  auto made = backend::make_cuda_backend(options);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  auto device = b.allocate_device(64, "test");
  auto pinned = b.allocate_pinned(64, "test");
  auto back = b.allocate_pinned(64, "test");
  ASSERT_TRUE(device.is_ok() && pinned.is_ok() && back.is_ok());
  auto* in = pinned->as<std::uint32_t>();
  auto* out = back->as<std::uint32_t>();
  for (int i = 0; i < 16; ++i) {
    in[i] = 100u + static_cast<std::uint32_t>(i);
    out[i] = 7;
  }
  using backend::StreamKind;
  ASSERT_TRUE(b.copy_async(StreamKind::kHostToDevice, device->data(), in, 64).is_ok());
  auto uploaded = b.create_event();
  ASSERT_TRUE(uploaded.is_ok());
  ASSERT_TRUE(b.record(*uploaded, StreamKind::kHostToDevice).is_ok());
  ASSERT_TRUE(b.wait(StreamKind::kDeviceToHost, *uploaded).is_ok());
  ASSERT_TRUE(b.copy_async(StreamKind::kDeviceToHost, out, device->data(), 64).is_ok());
  auto downloaded = b.create_event();
  ASSERT_TRUE(downloaded.is_ok());
  ASSERT_TRUE(b.record(*downloaded, StreamKind::kDeviceToHost).is_ok());
  EXPECT_EQ(out[3], 7u) << "the copy ran before anything waited for it";
  EXPECT_FALSE(b.query(*downloaded));
  ASSERT_TRUE(b.synchronize(*downloaded).is_ok());
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(out[i], 100u + static_cast<std::uint32_t>(i)) << i;
  EXPECT_TRUE(b.query(*downloaded));
  b.destroy_event(*uploaded);
  b.destroy_event(*downloaded);
}

// A weight noted as the widening of 16-bit parameters reaches its GEMM in 16 bits: one cast (the
// activation) before the product instead of two, and the same bits. A twin of the other 16-bit
// type, a weight reaching past the noted range, or a forgotten one is converted as before.
TEST(EmulatedCudaBackend, AWeightWidenedFromSixteenBitsIsReadFromThem) {
  backend::CudaBackendOptions options = small_options(cuda::GemmPrecision::kBf16);
  auto made = backend::make_cuda_backend(options);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  backend::Ops<float>& ops = b.ops_f32();
  const std::int64_t m = 24, n = 40, k = 32;
  // The 16-bit weight, and the fp32 one widened from it.
  WeightOperands x = weight_operands(
      b, m, n, k, [](std::int64_t i) { return std::sin(0.37f * static_cast<float>(i)) * 1.7f; });
  auto host = b.allocate_pinned(m * n * 4, "host");
  ASSERT_TRUE(x.ok && host.is_ok());
  float* a = x.a.as<float>();
  float* w = x.w.as<float>();
  float* c = x.c.as<float>();
  float* h = host->as<float>();
  void* w16 = x.w16.data();
  // C = A W^T (the forward's product), read back; with the launch log of the product alone.
  auto product = [&](const float* weight, std::int64_t rows) {
    ASSERT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
    emu::clear_launch_log();
    ops.gemm(false, true, m, rows, k, 1.0f, a, k, weight, k, 0.0f, c, rows);
    ASSERT_TRUE(b.copy_async(backend::StreamKind::kCompute, h, c, m * rows * 4).is_ok());
    ASSERT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
  };
  auto narrowed = [] { return emu::gemms_by_operands_narrowed(emu::launch_log()); };
  const std::map<int, std::int64_t> one = {{1, 1}}, two = {{2, 1}};

  product(w, n);
  ASSERT_EQ(narrowed(), two);
  const std::vector<float> converted(h, h + m * n);
  ops.note_widened(w, w16, backend::DType::kBF16, n * k);
  product(w, n);
  EXPECT_EQ(narrowed(), one);
  EXPECT_EQ(std::memcmp(h, converted.data(), converted.size() * 4), 0) << "not the same bits";
  // Rows 8.. of the weight lie inside the noted range too.
  product(w + 8 * k, n - 8);
  EXPECT_EQ(narrowed(), one);
  // A range that ends before the weight does: converted.
  ops.note_widened(w, w16, backend::DType::kBF16, n * k - 1);
  product(w, n);
  EXPECT_EQ(narrowed(), two);
  // fp16 bits are no bf16 operand.
  ops.note_widened(w, w16, backend::DType::kF16, n * k);
  product(w, n);
  EXPECT_EQ(narrowed(), two);
  ops.note_widened(w, w16, backend::DType::kBF16, n * k);
  ops.forget_widened(w);
  product(w, n);
  EXPECT_EQ(narrowed(), two);
  // Listed as a fast path, on, with the products that took it since the start (2 above).
  const std::optional<backend::FastPath> listed = listed_path(b, backend::kWeights16Name);
  ASSERT_TRUE(listed.has_value());
  EXPECT_TRUE(listed->active) << listed->detail;
  EXPECT_EQ(listed->uses, 2);
}

// A compute copy without its weights (Ops::note_widened_weights_only): a product reads the weight
// from its 16-bit parameters with the bits of the widened copy, though the copy holds NaN, also
// after a write into the copy and 64 other weights noted since; forgotten, the copy is read (NaN).
// The backend says no where it cannot promise it: parameters of the other 16-bit type, 64 such
// copies kept already, fp32 products, the weights' 16-bit path refused at start.
// cast_from_ranges widens its ranges and nothing else.
TEST(EmulatedCudaBackend, ACopyWithoutItsWeightsHasThemReadFromTheirSixteenBits) {
  backend::CudaBackendOptions options = small_options(cuda::GemmPrecision::kBf16);
  auto made = backend::make_cuda_backend(options);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  backend::Ops<float>& ops = b.ops_f32();
  const std::int64_t m = 8, n = 16, k = 32;
  WeightOperands x = weight_operands(
      b, m, n, k, [](std::int64_t i) { return std::cos(0.29f * static_cast<float>(i)) * 1.3f; });
  auto copy_buf = b.allocate_device(n * k * 4, "copy");
  ASSERT_TRUE(x.ok && copy_buf.is_ok());
  float* a = x.a.as<float>();
  float* w = x.w.as<float>();
  float* copy = copy_buf->as<float>();
  float* c = x.c.as<float>();
  void* w16 = x.w16.data();
  ops.copy(copy, w, n * k);
  ops.scale(copy, n * k, std::numeric_limits<double>::quiet_NaN());
  auto product = [&](const float* weight) {
    ops.gemm(false, true, m, n, k, 1.0f, a, k, weight, k, 0.0f, c, n);
    std::vector<float> out(static_cast<std::size_t>(m * n));
    EXPECT_TRUE(b.copy_async(backend::StreamKind::kCompute, out.data(), c, m * n * 4).is_ok());
    EXPECT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
    return out;
  };
  const std::vector<float> converted = product(w);  // the widened weight, converted
  ASSERT_TRUE(ops.note_widened_weights_only(copy, w16, backend::DType::kBF16, n * k));
  EXPECT_EQ(product(copy), converted);
  ops.zero(copy + 5, 7);  // a write into the copy
  for (int i = 0; i < 64; ++i)
    ops.note_widened(w + i, w16, backend::DType::kBF16, 1);
  EXPECT_EQ(product(copy), converted);
  ops.forget_widened(copy);
  EXPECT_TRUE(std::isnan(product(copy)[0]));
  EXPECT_FALSE(ops.note_widened_weights_only(copy, w16, backend::DType::kF16, n * k));
  for (int i = 0; i < 64; ++i) {
    ops.forget_widened(w + i);
    EXPECT_TRUE(ops.note_widened_weights_only(copy + i, w16, backend::DType::kBF16, 1)) << i;
  }
  EXPECT_FALSE(ops.note_widened_weights_only(w, w16, backend::DType::kBF16, n * k));
  for (int i = 0; i < 64; ++i)
    ops.forget_widened(copy + i);

  // Ranges [2, 5), [9, 10) and every other element of [20, 56) of the 16-bit weight into a zeroed
  // copy: 20 ranges (more than one launch takes), and empty ones, which are skipped.
  ops.zero(copy, n * k);
  std::vector<std::int64_t> begin = {2, 9, 12}, count = {3, 1, 0};
  for (std::int64_t i = 20; i < 56; i += 2) {
    begin.push_back(i);
    count.push_back(i == 30 ? 0 : 1);
  }
  ops.cast_from_ranges(copy, w16, backend::DType::kBF16, begin.data(), count.data(),
                       static_cast<int>(begin.size()), begin.data());
  std::vector<float> got(64), widened(64);
  ASSERT_TRUE(b.copy_async(backend::StreamKind::kCompute, got.data(), copy, 256).is_ok());
  ASSERT_TRUE(b.copy_async(backend::StreamKind::kCompute, widened.data(), w, 256).is_ok());
  ASSERT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
  std::vector<float> packed_want(64, 0.0f);
  std::vector<std::int64_t> at;
  std::int64_t packed = 0;
  for (int i = 0; i < 64; ++i) {
    const bool in = (i >= 2 && i < 5) || i == 9 || (i >= 20 && i < 56 && i % 2 == 0 && i != 30);
    EXPECT_EQ(got[static_cast<std::size_t>(i)], in ? widened[static_cast<std::size_t>(i)] : 0.0f)
        << i;
  }
  // The same ranges packed elsewhere, the last first, one element apart (at[i]).
  at.assign(begin.size(), 0);
  for (std::size_t i = begin.size(); i-- > 0;) {
    at[i] = 1 + packed;
    packed += count[i] + 1;
  }
  for (std::size_t i = 0; i < begin.size(); ++i) {
    for (std::int64_t j = 0; j < count[i]; ++j)
      packed_want[static_cast<std::size_t>(at[i] + j)] =
          widened[static_cast<std::size_t>(begin[i] + j)];
  }
  ops.zero(copy, n * k);
  ops.cast_from_ranges(copy, w16, backend::DType::kBF16, begin.data(), count.data(),
                       static_cast<int>(begin.size()), at.data());
  ASSERT_TRUE(b.copy_async(backend::StreamKind::kCompute, got.data(), copy, 256).is_ok());
  ASSERT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
  EXPECT_EQ(got, packed_want);

  for (const bool fp32 : {true, false}) {
    if (!fp32) backend::fail_fast_path_for_test(std::string(backend::kWeights16Name));
    auto other = backend::make_cuda_backend(
        small_options(fp32 ? cuda::GemmPrecision::kFp32 : cuda::GemmPrecision::kBf16));
    backend::fail_fast_path_for_test(std::nullopt);
    ASSERT_TRUE(other.is_ok()) << other.status().to_string();
    auto wide = (*other)->allocate_device(64 * 4, "wide");
    auto narrow = (*other)->allocate_device(64 * 2, "narrow");
    ASSERT_TRUE(wide.is_ok() && narrow.is_ok());
    EXPECT_FALSE((*other)->ops_f32().note_widened_weights_only(wide->as<float>(), narrow->data(),
                                                               backend::DType::kBF16, 64))
        << (fp32 ? "fp32 products" : "the weights' 16-bit path refused");
  }
}

// A copy's norm weights and biases kept apart (Ops::note_kept_apart, the params_kept_apart path):
// every op reading a parameter (LayerNorm and RMSNorm forward, fused with the residual add and
// backward, the heads' RMSNorm both ways, add_bias, the products with a bias) reads it from the
// area apart, with the bits of reading it there directly, though the copy holds NaN; forgotten,
// the copy is read (NaN). A tensor running past the end of its range is an error, not a silent
// read. The backend says no once 64 copies are noted, and when the path was refused at start.
TEST(EmulatedCudaBackend, ParametersKeptApartAreReadFromTheirArea) {
  auto made = backend::make_cuda_backend(small_options(cuda::GemmPrecision::kBf16));
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  backend::Ops<float>& ops = b.ops_f32();
  const std::optional<backend::FastPath> listed = listed_path(b, backend::kKeptApartName);
  ASSERT_TRUE(listed.has_value());
  EXPECT_TRUE(listed->active) << listed->detail;
  const std::int64_t rows = 4, c = 24, heads = 2, hd = 12, inner = 16;
  // The copy: weight and bias of a norm, 32 elements of a matrix, then a bias and a head norm's
  // weight; apart, packed after an 8-element gap.
  const std::int64_t n = 3 * c + 32 + hd;
  const std::vector<std::int64_t> begin = {0, 2 * c + 32}, count = {2 * c, c + hd},
                                  at = {8, 8 + 2 * c};
  std::vector<float> params(static_cast<std::size_t>(8 + 3 * c + hd));
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i] = 0.6f + 0.3f * std::sin(0.7f * static_cast<float>(i));
  std::vector<float> inputs(static_cast<std::size_t>(rows * c * 2 + rows * inner + inner * c));
  for (std::size_t i = 0; i < inputs.size(); ++i)
    inputs[i] = std::cos(0.37f * static_cast<float>(i)) * 1.2f;
  auto copy_buf = b.allocate_device(n * 4, "copy");
  auto apart_buf = b.allocate_device(params.size() * 4, "apart");
  auto in_buf = b.allocate_device(inputs.size() * 4, "inputs");
  const std::int64_t out_n = 20 * rows * c;
  auto out_buf = b.allocate_device(2 * out_n * 4, "outputs");
  ASSERT_TRUE(copy_buf.is_ok() && apart_buf.is_ok() && in_buf.is_ok() && out_buf.is_ok());
  float* copy = copy_buf->as<float>();
  float* apart = apart_buf->as<float>();
  const float* x = in_buf->as<float>();
  const float* dout = x + rows * c;
  const float* a = dout + rows * c;
  const float* w = a + rows * inner;
  ASSERT_TRUE(
      b.copy_async(backend::StreamKind::kCompute, apart, params.data(), params.size() * 4).is_ok());
  ASSERT_TRUE(
      b.copy_async(backend::StreamKind::kCompute, in_buf->data(), inputs.data(), inputs.size() * 4)
          .is_ok());
  ops.zero(copy, n);
  ops.scale(copy, n, std::numeric_limits<double>::quiet_NaN());
  // Every op reading the parameters at norm_w, norm_b, bias and head_w, into out (out_n floats,
  // 17 slices of rows x c).
  const auto run = [&](float* out, const float* norm_w, const float* norm_b, const float* bias,
                       const float* head_w) {
    ops.zero(out, out_n);
    float* o = out;
    const auto next = [&o, rows, c] {
      float* p = o;
      o += rows * c;
      return p;
    };
    float* stats = next();
    ops.layernorm_forward(next(), stats, stats + rows, x, norm_w, norm_b, rows, c, 1e-5);
    float* dx = next();
    float* dw = next();
    float* db = next();
    ops.layernorm_backward(dx, dw, db, dout, x, norm_w, stats, stats + rows, rows, c);
    float* res = next();
    ops.copy(res, x, rows * c);
    ops.add_layernorm_forward(res, dout, next(), stats + 2 * rows, stats + 3 * rows, norm_w, norm_b,
                              rows, c, 1e-5);
    ops.rmsnorm_forward(next(), stats + 4 * rows, x, norm_w, rows, c, 1e-5);
    float* rms_dx = next();
    float* rms_dw = next();
    ops.rmsnorm_backward(rms_dx, rms_dw, dout, x, norm_w, stats + 4 * rows, rows, c);
    float* heads_out = next();
    ops.rmsnorm_heads_forward(heads_out, stats + 5 * rows, x, head_w, rows, heads, hd, c, c, 1e-5);
    float* d = next();
    ops.copy(d, dout, rows * c);
    ops.rmsnorm_heads_backward(d, next(), x, head_w, stats + 5 * rows, rows, heads, hd, c, c);
    float* biased = next();
    ops.copy(biased, x, rows * c);
    ops.add_bias(biased, bias, rows, c);
    ops.gemm_bias(false, false, rows, c, inner, a, inner, w, c, bias, next());
    float* pre = next();
    float* act = next();
    ops.gemm_bias_gelu(false, false, rows, c, inner, a, inner, w, c, bias, pre, act);
  };
  const auto host = [&](const float* out) {
    std::vector<float> v(static_cast<std::size_t>(out_n));
    EXPECT_TRUE(b.copy_async(backend::StreamKind::kCompute, v.data(), out, out_n * 4).is_ok());
    EXPECT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
    return v;
  };
  float* want = out_buf->as<float>();
  float* got = want + out_n;
  run(want, apart + 8, apart + 8 + c, apart + 8 + 2 * c, apart + 8 + 3 * c);
  const std::vector<float> direct = host(want);
  ASSERT_TRUE(ops.note_kept_apart(copy, apart, begin.data(), count.data(), at.data(), 2));
  run(got, copy, copy + c, copy + 2 * c + 32, copy + 3 * c + 32);
  const std::vector<float> through = host(got);
  EXPECT_EQ(std::memcmp(direct.data(), through.data(), direct.size() * 4), 0);
  EXPECT_FALSE(std::isnan(through[static_cast<std::size_t>(rows * c)]));
  ops.forget_widened(copy);
  ops.layernorm_forward(got, got + rows * c, got + 2 * rows * c, x, copy, copy + c, rows, c, 1e-5);
  EXPECT_TRUE(std::isnan(host(got)[0]));
  // 64 copies at once, no more.
  for (int i = 0; i < 64; ++i) {
    EXPECT_TRUE(ops.note_kept_apart(copy + i, apart, begin.data(), count.data(), at.data(), 2))
        << i;
  }
  EXPECT_FALSE(ops.note_kept_apart(got, apart, begin.data(), count.data(), at.data(), 2));
  for (int i = 1; i < 64; ++i)
    ops.forget_widened(copy + i);
  // The norm's weight read one element into its bias's range: past the range's end.
  ops.layernorm_forward(got, got + rows * c, got + 2 * rows * c, x, copy + c + 1, copy, rows, c,
                        1e-5);
  const Status past = b.synchronize(backend::StreamKind::kCompute);
  EXPECT_NE(past.to_string().find("before the end of a range kept apart"), std::string::npos)
      << past.to_string();

  backend::fail_fast_path_for_test(std::string(backend::kKeptApartName));
  auto refused = backend::make_cuda_backend(small_options(cuda::GemmPrecision::kBf16));
  backend::fail_fast_path_for_test(std::nullopt);
  ASSERT_TRUE(refused.is_ok()) << refused.status().to_string();
  const std::optional<backend::FastPath> off = listed_path(**refused, backend::kKeptApartName);
  ASSERT_TRUE(off.has_value());
  EXPECT_FALSE(off->active);
  auto wide = (*refused)->allocate_device(n * 4, "wide");
  ASSERT_TRUE(wide.is_ok());
  EXPECT_FALSE((*refused)->ops_f32().note_kept_apart(wide->as<float>(), apart, begin.data(),
                                                     count.data(), at.data(), 2));
}

// Refused at start (its check made to fail through the seam), the path is listed off and the
// weights are converted as before even where a range is noted.
TEST(EmulatedCudaBackend, WeightsInSixteenBitsRefusedAtStartAreConverted) {
  backend::CudaBackendOptions options = small_options(cuda::GemmPrecision::kBf16);
  backend::fail_fast_path_for_test(std::string(backend::kWeights16Name));
  auto made = backend::make_cuda_backend(options);
  backend::fail_fast_path_for_test(std::nullopt);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  const std::optional<backend::FastPath> listed = listed_path(b, backend::kWeights16Name);
  ASSERT_TRUE(listed.has_value());
  EXPECT_FALSE(listed->active);
  EXPECT_NE(listed->detail.find("check failed"), std::string::npos) << listed->detail;
  const std::int64_t m = 8, n = 16, k = 32;
  WeightOperands x = weight_operands(b, m, n, k, [](std::int64_t) { return 0.0f; });
  ASSERT_TRUE(x.ok);
  backend::Ops<float>& ops = b.ops_f32();
  ops.note_widened(x.w.as<float>(), x.w16.data(), backend::DType::kBF16, n * k);
  ASSERT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
  emu::clear_launch_log();
  ops.gemm(false, true, m, n, k, 1.0f, x.a.as<float>(), k, x.w.as<float>(), k, 0.0f,
           x.c.as<float>(), n);
  ASSERT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
  EXPECT_EQ(emu::gemms_by_operands_narrowed(emu::launch_log()),
            (std::map<int, std::int64_t>{{2, 1}}));
}

// An activation written by a kernel with its 16-bit companion (Ops::pair_narrow) reaches its GEMM
// in 16 bits, with the bits of converting it; any other write, a product reaching past what was
// written, or unpairing, has it converted again.
TEST(EmulatedCudaBackend, AnActivationWrittenWithItsCompanionIsReadFromIt) {
  backend::CudaBackendOptions options = small_options(cuda::GemmPrecision::kBf16);
  auto made = backend::make_cuda_backend(options);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  backend::Ops<float>& ops = b.ops_f32();
  ASSERT_EQ(ops.narrow_type(), backend::DType::kBF16);
  const std::int64_t m = 24, n = 40, k = 32;
  auto x_buf = b.allocate_device(m * k * 4, "x");
  auto pre_buf = b.allocate_device(m * k * 4, "pre");
  auto x16_buf = b.allocate_device(m * k * 2, "x16");
  auto w_buf = b.allocate_device(n * k * 4, "w");
  auto c_buf = b.allocate_device(m * n * 4, "c");
  auto host = b.allocate_pinned((m * k + n * k + m * n) * 4, "host");
  ASSERT_TRUE(x_buf.is_ok() && pre_buf.is_ok() && x16_buf.is_ok() && w_buf.is_ok() &&
              c_buf.is_ok() && host.is_ok());
  float* x = x_buf->as<float>();
  float* pre = pre_buf->as<float>();
  float* w = w_buf->as<float>();
  float* c = c_buf->as<float>();
  float* h = host->as<float>();
  for (std::int64_t i = 0; i < m * k + n * k; ++i)
    h[i] = std::sin(0.37f * static_cast<float>(i)) * 2.3f;
  using backend::StreamKind;
  ASSERT_TRUE(b.copy_async(StreamKind::kCompute, pre, h, m * k * 4).is_ok());
  ASSERT_TRUE(b.copy_async(StreamKind::kCompute, w, h + m * k, n * k * 4).is_ok());
  // Converts of each product: a map {operands converted: products}.
  auto narrowed = [&](std::int64_t rows, const float* a) {
    emu::clear_launch_log();
    ops.gemm(false, true, rows, n, k, 1.0f, a, k, w, k, 0.0f, c, n);
    EXPECT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
    return emu::gemms_by_operands_narrowed(emu::launch_log());
  };
  using Counts = std::map<int, std::int64_t>;
  const Counts one{{1, 1}}, two{{2, 1}};
  ops.gelu_forward(x, pre, m * k);
  EXPECT_EQ(narrowed(m, x), two) << "not paired: converted";
  std::vector<float> converted(static_cast<std::size_t>(m * n));
  ASSERT_TRUE(b.copy_async(StreamKind::kCompute, converted.data(), c, m * n * 4).is_ok());

  ops.pair_narrow(x, x16_buf->data(), m * k);
  ops.gelu_forward(x, pre, m * k);
  EXPECT_EQ(narrowed(m, x), one) << "written with its companion: read from it";
  ASSERT_TRUE(b.copy_async(StreamKind::kCompute, h, c, m * n * 4).is_ok());
  ASSERT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());  // h is pinned: the copy is queued
  EXPECT_EQ(std::memcmp(h, converted.data(), converted.size() * 4), 0) << "not the same bits";
  EXPECT_EQ(narrowed(m - 8, x + 8 * k), one) << "rows inside what was written";
  ops.scale(x + 5 * k, k, 1.0);  // a write without the companion, of one row
  EXPECT_EQ(narrowed(m, x), two) << "written since without its companion";
  ops.gelu_forward(x + 8 * k, pre + 8 * k, (m - 8) * k);  // rows 8.. with their companion
  EXPECT_EQ(narrowed(m - 8, x + 8 * k), one);
  EXPECT_EQ(narrowed(m, x), two) << "rows 0..7 were not written with it";
  ops.unpair_narrow(x);
  ops.gelu_forward(x, pre, m * k);
  EXPECT_EQ(narrowed(m, x), two) << "unpaired";
  // Listed as a fast path, on, with the operands read from companions since the start (3 above).
  const std::optional<backend::FastPath> listed = listed_path(b, backend::kActivations16Name);
  ASSERT_TRUE(listed.has_value());
  EXPECT_TRUE(listed->active) << listed->detail;
  EXPECT_EQ(listed->uses, 3);
}

// The flash attention's output written with its companion (the forward's epilogue rounds it there):
// the backward's 16-bit staging reads out's bits from the companion instead of rounding out again
// (one cast_block_kernel fewer: it rounds dout alone), with the same bits; the activations' path
// counts the read. Written since without its companion, out is rounded again.
TEST(EmulatedCudaBackend, TheAttentionBackwardReadsItsOutputFromItsCompanion) {
  auto made = backend::make_cuda_backend(small_options(cuda::GemmPrecision::kBf16));
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  backend::Ops<float>& ops = b.ops_f32();
  ASSERT_EQ(ops.narrow_type(), backend::DType::kBF16);
  backend::AttentionShape shape;
  shape.batch = 2;
  shape.seq_len = 32;
  shape.heads = 2;
  shape.kv_heads = 1;
  shape.head_dim = 64;
  const std::int64_t rows = 64, width = 128, stride = 256;  // q, k, v side by side
  shape.q_stride = shape.kv_stride = stride;
  shape.out_stride = width;
  shape.scale = 0.125;
  auto qkv_buf = b.allocate_device(rows * stride * 4, "qkv");
  auto out_buf = b.allocate_device(rows * width * 4, "out");
  auto out16_buf = b.allocate_device(rows * width * 2, "out16");
  auto lse_buf = b.allocate_device(rows * 2 * 4, "lse");
  auto dout_buf = b.allocate_device(rows * width * 4, "dout");
  auto d_buf = b.allocate_device(rows * stride * 4, "dqkv");
  ASSERT_TRUE(qkv_buf.is_ok() && out_buf.is_ok() && out16_buf.is_ok() && lse_buf.is_ok() &&
              dout_buf.is_ok() && d_buf.is_ok());
  std::vector<float> host(static_cast<std::size_t>(rows * stride + rows * width));
  for (std::size_t i = 0; i < host.size(); ++i)
    host[i] = std::sin(0.61f * static_cast<float>(i)) * 1.7f;
  using backend::StreamKind;
  float* qkv = qkv_buf->as<float>();
  float* out = out_buf->as<float>();
  float* lse = lse_buf->as<float>();
  float* dout = dout_buf->as<float>();
  float* d = d_buf->as<float>();
  ASSERT_TRUE(b.copy_async(StreamKind::kCompute, qkv, host.data(), rows * stride * 4).is_ok());
  ASSERT_TRUE(
      b.copy_async(StreamKind::kCompute, dout, host.data() + rows * stride, rows * width * 4)
          .is_ok());
  // The backward's launches and its q/k/v gradient, after a forward.
  const auto backward = [&](std::vector<float>* grads) {
    ops.attention_forward(out, lse, qkv, qkv + width, qkv + width + 64, shape);
    emu::clear_launch_log();
    ops.attention_backward(d, d + width, d + width + 64, dout, out, lse, qkv, qkv + width,
                           qkv + width + 64, shape);
    EXPECT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
    const std::vector<std::string> log = emu::launch_log();
    grads->assign(static_cast<std::size_t>(rows * stride), 0.0f);
    EXPECT_TRUE(b.copy_async(StreamKind::kCompute, grads->data(), d, rows * stride * 4).is_ok());
    return log;
  };
  std::vector<float> rounded, read;
  const std::vector<std::string> unpaired = backward(&rounded);
  ASSERT_TRUE(std::any_of(unpaired.begin(), unpaired.end(),
                          [](const std::string& k) { return k.rfind("flash_attention", 0) == 0; }));
  const std::int64_t uses = listed_path(b, backend::kActivations16Name)->uses;
  ops.pair_narrow(out, out16_buf->data(), rows * width);
  const std::vector<std::string> paired = backward(&read);
  EXPECT_EQ(emu::launches_of(paired, "cast_block_kernel") + 1,
            emu::launches_of(unpaired, "cast_block_kernel"))
      << "out was rounded again";
  EXPECT_TRUE(testing::same_bits(read, rounded));
  EXPECT_EQ(listed_path(b, backend::kActivations16Name)->uses - uses, 1);
  // out rewritten without its companion (one row), then the backward alone: rounded again.
  ops.scale(out + width, width, 1.0);
  emu::clear_launch_log();
  ops.attention_backward(d, d + width, d + width + 64, dout, out, lse, qkv, qkv + width,
                         qkv + width + 64, shape);
  EXPECT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
  EXPECT_EQ(emu::launches_of(emu::launch_log(), "cast_block_kernel"),
            emu::launches_of(unpaired, "cast_block_kernel"))
      << "read from a stale companion";
  ops.unpair_narrow(out);
}

// An op rewriting part of an activation in place (RoPE's and the per-head norms' backward on the
// q/k/v gradient) keeps its companion current where it was: the next product reads it, with the
// bits of converting; where it was not, the product converts.
TEST(EmulatedCudaBackend, InPlaceRewritesKeepACompanionCurrent) {
  auto made = backend::make_cuda_backend(small_options(cuda::GemmPrecision::kBf16));
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  backend::Ops<float>& ops = b.ops_f32();
  const std::int64_t m = 16, n = 24, k = 64, heads = 2, head_dim = 16;  // 2 heads of 16 in 64
  // The inputs, back to back: pre (m x k), xin (m x k), w (n x k), rstd (m x heads), norm_w.
  const std::int64_t inputs = 2 * m * k + n * k + m * heads + head_dim;
  auto in = b.allocate_device(inputs * 4, "inputs");
  auto x_buf = b.allocate_device(m * k * 4, "x");
  auto x16 = b.allocate_device(m * k * 2, "companion");
  auto out = b.allocate_device(m * n * 4, "c");
  auto dw = b.allocate_device(head_dim * 4, "dw");
  auto host = b.allocate_pinned(inputs * 4, "host");
  ASSERT_TRUE(in.is_ok() && x_buf.is_ok() && x16.is_ok() && out.is_ok() && dw.is_ok() &&
              host.is_ok());
  float* pre = in->as<float>();
  float* xin = pre + m * k;
  float* w = xin + m * k;
  float* rstd = w + n * k;
  float* norm_w = rstd + m * heads;
  float* x = x_buf->as<float>();
  float* c = out->as<float>();
  float* h = host->as<float>();
  for (std::int64_t i = 0; i < inputs; ++i)
    h[i] = 0.5f + 0.4f * std::sin(0.7f * static_cast<float>(i));
  using backend::StreamKind;
  ASSERT_TRUE(b.copy_async(StreamKind::kCompute, pre, h, inputs * 4).is_ok());
  ASSERT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
  auto product = [&](std::vector<float>* result) {
    emu::clear_launch_log();
    ops.gemm(false, true, m, n, k, 1.0f, x, k, w, k, 0.0f, c, n);
    if (result != nullptr) {
      result->resize(static_cast<std::size_t>(m * n));
      EXPECT_TRUE(b.copy_async(StreamKind::kCompute, result->data(), c, m * n * 4).is_ok());
    }
    EXPECT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
    return emu::gemms_by_operands_narrowed(emu::launch_log());
  };
  auto rewrite = [&] {  // the per-head norm's backward over both heads, in place on x
    ops.rmsnorm_heads_backward(x, dw->as<float>(), xin, norm_w, rstd, m, heads, head_dim, k, k);
  };
  using Counts = std::map<int, std::int64_t>;
  std::vector<float> converted, kept;
  ops.gelu_forward(x, pre, m * k);
  rewrite();
  EXPECT_EQ(product(&converted), (Counts{{2, 1}})) << "not paired";
  ops.pair_narrow(x, x16->data(), m * k);
  ops.gelu_forward(x, pre, m * k);  // with its companion
  rewrite();
  EXPECT_EQ(product(&kept), (Counts{{1, 1}})) << "x read from its companion";
  EXPECT_TRUE(testing::same_bits(kept, converted));
  ops.scale(x, m * k, 1.0);  // written without the companion: no longer current
  rewrite();
  EXPECT_EQ(product(nullptr), (Counts{{2, 1}}));
  ops.unpair_narrow(x);
}

// A product written in 16 bits (the head's logits, the Llama family's gate and up) whose B has no
// 16-bit copy and does not fit the conversion workspace beside A is multiplied in blocks of its n
// columns (a multiple of 8, each over all of k): the bits of the one call a larger workspace makes.
// With a bias (gemm_bias writing an output kept in 16 bits alone, as GPT-2's qkv projection does),
// each block of columns adds its own part of the bias: the same bits each way, and those of the
// fp32 product plus its bias rounded on the host.
TEST(EmulatedCudaBackend, AProductWrittenIn16BitsConvertsALargeBInBlocksOfColumns) {
  const std::int64_t m = 8, n = 200, k = 256;  // B: 51200 elements
  struct Run {
    std::int64_t gemms = 0;
    std::vector<std::uint16_t> c;
    std::vector<std::uint16_t> biased;  // gemm_bias into an output kept alone
    std::vector<float> wide;            // gemm_bias in fp32
  };
  auto product = [&](std::uint64_t workspace_bytes) {
    backend::CudaBackendOptions options = small_options(cuda::GemmPrecision::kBf16);
    options.gemm_workspace_bytes = workspace_bytes;
    auto made = backend::make_cuda_backend(options);
    EXPECT_TRUE(made.is_ok()) << made.status().to_string();
    Run run;
    if (!made.is_ok()) return run;
    backend::Backend& b = **made;
    backend::Ops<float>& ops = b.ops_f32();
    EXPECT_TRUE(ops.keeps_gate_up_narrow());
    std::vector<float> h(static_cast<std::size_t>(m * k + n * k));
    for (std::size_t i = 0; i < h.size(); ++i)
      h[i] = std::sin(0.37f * static_cast<float>(i)) * 2.3f;
    auto device = b.allocate_device(h.size() * 4, "operands");
    auto out = b.allocate_device(static_cast<std::uint64_t>(m * n) * 2, "product");
    EXPECT_TRUE(device.is_ok() && out.is_ok());
    if (!device.is_ok() || !out.is_ok()) return run;
    using backend::StreamKind;
    EXPECT_TRUE(b.copy_async(StreamKind::kCompute, device->data(), h.data(), h.size() * 4).is_ok());
    emu::clear_launch_log();
    const float* x = device->as<float>();
    ops.gemm_to_narrow(false, true, m, n, k, x, k, x + m * k, k, out->data(), n);
    run.c.resize(static_cast<std::size_t>(m * n));
    EXPECT_TRUE(b.copy_async(StreamKind::kCompute, run.c.data(), out->data(), m * n * 2).is_ok());
    EXPECT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
    for (const std::string& kernel : emu::launch_log())
      run.gemms += emu::kernel_family(kernel) == "gemm";
    // The same product plus a bias, written into an output kept alone, and in fp32.
    std::vector<float> bias(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < bias.size(); ++i)
      bias[i] = std::cos(0.21f * static_cast<float>(i)) * 1.7f;
    auto bias_device = b.allocate_device(static_cast<std::uint64_t>(n) * 4, "bias");
    auto wide = b.allocate_device(static_cast<std::uint64_t>(m * n) * 4, "wide");
    auto key = AddressRange::reserve(static_cast<std::uint64_t>(m * n) * 4, "key");
    EXPECT_TRUE(bias_device.is_ok() && wide.is_ok() && key.is_ok());
    if (!bias_device.is_ok() || !wide.is_ok() || !key.is_ok()) return run;
    EXPECT_TRUE(
        b.copy_async(StreamKind::kCompute, bias_device->data(), bias.data(), bias.size() * 4)
            .is_ok());
    auto* alone = static_cast<float*>(key->begin());
    EXPECT_TRUE(ops.pair_narrow_alone(alone, out->data(), m * n));
    ops.gemm_bias(false, true, m, n, k, x, k, x + m * k, k, bias_device->as<float>(), alone);
    ops.gemm_bias(false, true, m, n, k, x, k, x + m * k, k, bias_device->as<float>(),
                  wide->as<float>());
    run.biased.resize(static_cast<std::size_t>(m * n));
    run.wide.resize(static_cast<std::size_t>(m * n));
    EXPECT_TRUE(
        b.copy_async(StreamKind::kCompute, run.biased.data(), out->data(), m * n * 2).is_ok());
    EXPECT_TRUE(
        b.copy_async(StreamKind::kCompute, run.wide.data(), wide->data(), m * n * 4).is_ok());
    EXPECT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
    ops.unpair_narrow(alone);
    return run;
  };
  const Run whole = product(4u << 20);
  const Run blocks = product(64u << 10);  // 32768 elements: A (2048) and 120 columns of B at once
  EXPECT_EQ(whole.gemms, 1);
  EXPECT_EQ(blocks.gemms, 2);  // 120 columns, then 80
  ASSERT_EQ(blocks.c.size(), whole.c.size());
  EXPECT_EQ(blocks.c, whole.c);
  ASSERT_EQ(whole.biased.size(), static_cast<std::size_t>(m * n));
  EXPECT_EQ(blocks.biased, whole.biased);
  std::vector<std::uint16_t> rounded(whole.wide.size());
  kernels::cast_array(rounded.data(), kernels::DType::kBF16, whole.wide.data(),
                      kernels::DType::kF32, static_cast<std::int64_t>(rounded.size()));
  EXPECT_EQ(whole.biased, rounded);
  EXPECT_NE(whole.biased, whole.c) << "the bias was not added";
}

// A product too large for the conversion workspace is cut into blocks; an operand with its 16-bit
// companion is still read in place, block by block, and with both the product is one call: the
// same bits each way.
TEST(EmulatedCudaBackend, ProductsCutIntoBlocksReadTheirSixteenBitOperandsInPlace) {
  backend::CudaBackendOptions options = small_options(cuda::GemmPrecision::kBf16);
  options.gemm_workspace_bytes = 64 << 10;  // 32768 elements: A and B (45056) do not fit
  auto made = backend::make_cuda_backend(options);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  backend::Ops<float>& ops = b.ops_f32();
  const std::int64_t m = 96, n = 80, k = 256;
  auto device = b.allocate_device((2 * m * k + 2 * n * k + m * n) * 4, "operands");
  auto narrow = b.allocate_device((m * k + n * k) * 2, "companions");
  auto host = b.allocate_pinned((m * k + n * k + m * n) * 4, "host");
  ASSERT_TRUE(device.is_ok() && narrow.is_ok() && host.is_ok());
  float* x = device->as<float>();
  float* w = x + m * k;
  float* pre = w + n * k;
  float* c = pre + m * k + n * k;
  float* h = host->as<float>();
  for (std::int64_t i = 0; i < m * k + n * k; ++i)
    h[i] = std::cos(0.11f * static_cast<float>(i)) * 3.1f;
  using backend::StreamKind;
  ASSERT_TRUE(b.copy_async(StreamKind::kCompute, pre, h, (m * k + n * k) * 4).is_ok());
  auto write = [&] {  // x = GELU(pre_x), w = GELU(pre_w): with companions where paired
    ops.gelu_forward(x, pre, m * k);
    ops.gelu_forward(w, pre + m * k, n * k);
  };
  struct Run {
    std::int64_t casts = 0, gemms = 0;
    std::vector<float> c;
  };
  auto product = [&] {
    write();
    EXPECT_TRUE(b.synchronize(StreamKind::kCompute).is_ok());
    emu::clear_launch_log();
    ops.gemm(false, true, m, n, k, 1.0f, x, k, w, k, 0.0f, c, n);
    Run run;
    run.c.resize(static_cast<std::size_t>(m * n));
    EXPECT_TRUE(b.copy_async(StreamKind::kCompute, run.c.data(), c, m * n * 4).is_ok());
    for (const std::string& kernel : emu::launch_log()) {
      run.casts += kernel.find("cast_block_kernel") != std::string::npos;
      run.gemms += emu::kernel_family(kernel) == "gemm";
    }
    return run;
  };
  const Run converted = product();
  EXPECT_GT(converted.gemms, 1) << "the product is not cut into blocks";
  auto* x16 = narrow->as<std::uint16_t>();
  ops.pair_narrow(x, x16, m * k);
  const Run a_read = product();
  EXPECT_LT(a_read.casts, converted.casts);
  EXPECT_GT(a_read.casts, 0) << "B is converted";
  EXPECT_TRUE(testing::same_bits(a_read.c, converted.c));
  ops.pair_narrow(w, x16 + m * k, n * k);
  const Run both_read = product();
  EXPECT_EQ(both_read.casts, 0);
  EXPECT_EQ(both_read.gemms, 1);
  EXPECT_TRUE(testing::same_bits(both_read.c, converted.c));
  ops.unpair_narrow(x);
  const Run b_read = product();
  EXPECT_GT(b_read.casts, 0);
  EXPECT_LT(b_read.casts, converted.casts);
  EXPECT_TRUE(testing::same_bits(b_read.c, converted.c));
  ops.unpair_narrow(w);
}

// A runner whose companions do not fit the device arena beside its other buffers is made without
// them, and says why; with room for them it has them.
TEST(EmulatedCudaBackend, ARunnerWhoseCompanionsDoNotFitIsMadeWithoutThem) {
  auto made = backend::make_cuda_backend(small_options(cuda::GemmPrecision::kBf16));
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  const model::ModelShape shape = testing::tiny_gpt2(false);
  const model::ModelLayout layout = model::build_layout(shape);
  model::RunnerOptions with;
  with.batch = 2;
  with.seq_len = shape.max_seq_len;
  with.narrow_companions = true;
  model::RunnerOptions without = with;
  without.narrow_companions = false;
  const std::uint64_t need = model::ModelRunner<float>::memory_needed(shape, with).device_bytes;
  const std::uint64_t less = model::ModelRunner<float>::memory_needed(shape, without).device_bytes;
  ASSERT_GT(need, less);
  // Fills the arena but for `room` bytes, then makes the runner.
  auto runner_with_room = [&](std::uint64_t room) {
    const backend::MemoryStats device = b.device_memory();
    const std::uint64_t fill = (device.bytes_max - device.bytes_in_use - room) / 4096 * 4096;
    auto filler = b.allocate_device(fill, "filler", 256);
    EXPECT_TRUE(filler.is_ok());
    auto runner = model::ModelRunner<float>::create(b, shape, layout, with);
    EXPECT_TRUE(runner.is_ok()) << runner.status().to_string();
    return runner.is_ok() ? (*runner)->companions_dropped() : std::string("failed");
  };
  const std::string short_of = runner_with_room(less + (need - less) / 2);
  EXPECT_NE(short_of.find("16-bit activation companions"), std::string::npos) << short_of;
  EXPECT_EQ(runner_with_room(need + (64u << 10)), "");
}

// Refused at start (its check made to fail through the seam), the path is listed off, the ops
// say fp32 (so the runner allocates no companions) and pairing does nothing.
TEST(EmulatedCudaBackend, ActivationCompanionsRefusedAtStartAreOff) {
  backend::CudaBackendOptions options = small_options(cuda::GemmPrecision::kBf16);
  backend::fail_fast_path_for_test(std::string(backend::kActivations16Name));
  auto made = backend::make_cuda_backend(options);
  backend::fail_fast_path_for_test(std::nullopt);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  backend::Backend& b = **made;
  const std::optional<backend::FastPath> listed = listed_path(b, backend::kActivations16Name);
  ASSERT_TRUE(listed.has_value());
  EXPECT_FALSE(listed->active);
  EXPECT_NE(listed->detail.find("check failed"), std::string::npos) << listed->detail;
  backend::Ops<float>& ops = b.ops_f32();
  EXPECT_EQ(ops.narrow_type(), backend::DType::kF32);
  const std::int64_t m = 8, n = 16, k = 32;
  auto x = b.allocate_device(m * k * 4, "x");
  auto x16 = b.allocate_device(m * k * 2, "x16");
  auto w = b.allocate_device(n * k * 4, "w");
  auto c = b.allocate_device(m * n * 4, "c");
  ASSERT_TRUE(x.is_ok() && x16.is_ok() && w.is_ok() && c.is_ok());
  ops.zero(w->as<float>(), n * k);
  ops.pair_narrow(x->as<float>(), x16->data(), m * k);
  ops.gelu_forward(x->as<float>(), w->as<float>(), m * k);
  ASSERT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
  emu::clear_launch_log();
  ops.gemm(false, true, m, n, k, 1.0f, x->as<float>(), k, w->as<float>(), k, 0.0f, c->as<float>(),
           n);
  ASSERT_TRUE(b.synchronize(backend::StreamKind::kCompute).is_ok());
  EXPECT_EQ(emu::gemms_by_operands_narrowed(emu::launch_log()),
            (std::map<int, std::int64_t>{{2, 1}}));
}

INSTANTIATE_TEST_SUITE_P(Families, EmulatedCudaStep, ::testing::Values("gpt2", "llama"),
                         [](const auto& info) { return info.param; });

#endif

}  // namespace
}  // namespace strata::train

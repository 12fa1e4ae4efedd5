// A model of one training step's time on a GPU, from the model's shape alone (issue 36, item 3;
// `strata bench step --predict`; docs/benchmarks.md "A model of the step's time"): each kernel
// family's FLOPs and bytes for the bf16 step the CUDA backend is being rebuilt towards (bf16
// activations end to end, no casts before GEMMs, epilogues fused into the GEMMs, flash attention
// on tensor cores, AdamW on the device), and its time at a stated fraction of the card's peak: a
// compute-bound family at `fraction x` dense bf16 FLOP/s, a memory-bound one at `fraction x` HBM
// bytes/s. The step's time is their sum (no overlap between kernels is assumed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_spec.h"

namespace strata::model {

struct Card {
  std::string name;
  double bf16_flops = 0.0;   // dense bf16 tensor-core FLOP/s
  double hbm_bytes_s = 0.0;  // HBM bytes/s
};

// "h100" (SXM: 989 TFLOP/s, 3.35 TB/s), "h200" (989, 4.8), "a100" (312, 2.04); nullptr otherwise.
const Card* find_card(const std::string& name);
// The names find_card knows, comma-separated.
std::string card_names();

// The fraction of peak each kind of family is assumed to reach.
struct Fractions {
  double gemm = 0.5;        // cuBLASLt bf16 GEMMs with fused epilogues
  double attention = 0.25;  // flash attention on mma.sync (FlashAttention-2 design)
  double memory = 0.7;      // bandwidth-bound kernels (norms, activations, loss, Adam)
};

struct FamilyTime {
  std::string family;
  double flops = 0.0;  // per step
  double bytes = 0.0;  // HBM bytes per step (memory-bound families)
  bool compute_bound = true;
  double fraction = 0.0;  // of the card's peak, as assumed
  double ms = 0.0;
  std::string what;  // how the figure is counted
};

struct StepPrediction {
  std::vector<FamilyTime> families;
  double step_ms = 0.0;
  double tokens_per_s = 0.0;
  std::string limiting;  // the family that takes the most time
};

StepPrediction predict_step(const ModelShape& shape, std::int64_t batch, std::int64_t seq_len,
                            const Card& card, const Fractions& fractions);

}  // namespace strata::model

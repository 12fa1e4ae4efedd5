// The model of a step's time (model/step_time.h): each family's count from the shape, by hand.
#include "model/step_time.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace strata::model {
namespace {

ModelShape gpt2_124m() {
  ModelShape s;
  s.family = config::ModelFamily::kGpt2;
  s.vocab_size = 50257;
  s.max_seq_len = 1024;
  s.hidden_size = 768;
  s.num_layers = 12;
  s.num_heads = 12;
  s.num_kv_heads = 12;
  s.head_dim = 64;
  s.intermediate_size = 3072;
  return s;
}

ModelShape llama_1b() {  // configs/models/llama-1b.json
  ModelShape s;
  s.family = config::ModelFamily::kLlama;
  s.vocab_size = 32000;
  s.max_seq_len = 2048;
  s.hidden_size = 2048;
  s.num_layers = 16;
  s.num_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 64;
  s.intermediate_size = 8192;
  s.tie_word_embeddings = false;
  return s;
}

std::map<std::string, FamilyTime> by_family(const StepPrediction& p) {
  std::map<std::string, FamilyTime> out;
  for (const FamilyTime& f : p.families)
    out[f.family] = f;
  return out;
}

TEST(StepTime, GemmAndAttentionFlopsAreTheHandCounts) {
  const Card* h100 = find_card("h100");
  ASSERT_NE(h100, nullptr);
  const StepPrediction p = predict_step(gpt2_124m(), 8, 1024, *h100, Fractions{});
  auto f = by_family(p);
  const double tokens = 8.0 * 1024.0;
  // q, k, v, o (768 x 768 each) and the MLP's 768 x 3072 twice, 12 blocks, and the tied head.
  const double params = 12.0 * (4.0 * 768 * 768 + 2.0 * 768 * 3072) + 50257.0 * 768;
  EXPECT_DOUBLE_EQ(f["gemm"].flops, 6.0 * params * tokens);
  EXPECT_DOUBLE_EQ(f["gemm"].ms, 6.0 * params * tokens / (989e12 * 0.5) * 1e3);
  // 1024 tokens = 16 tiles of 64: 136 of the 256 tile pairs are computed (causal, diagonal whole).
  EXPECT_DOUBLE_EQ(f["attention"].flops,
                   12.0 * 3.5 * 4.0 * 8 * 12 * 1024.0 * 1024.0 * 64 * (136.0 / 256.0));
  EXPECT_TRUE(f["attention"].compute_bound);
  EXPECT_FALSE(f["adamw"].compute_bound);
  EXPECT_EQ(f.count("rope"), 0u);  // GPT-2 has learned positions
  EXPECT_EQ(f.count("gelu-aux"), 1u);
  EXPECT_DOUBLE_EQ(f["casts before GEMMs"].bytes, 0.0);
}

TEST(StepTime, GroupedKvHeadsAndSwiGluAreCountedForLlama) {
  const StepPrediction p = predict_step(llama_1b(), 4, 1024, *find_card("h100"), Fractions{});
  auto f = by_family(p);
  const double tokens = 4.0 * 1024.0;
  // q and o 2048 x 2048, k and v 2048 x 512 (8 KV heads of 64), three 2048 x 8192 MLP matrices.
  const double block = 2.0 * 2048 * 2048 + 2.0 * 2048 * 512 + 3.0 * 2048 * 8192;
  EXPECT_DOUBLE_EQ(f["gemm"].flops, 6.0 * (16.0 * block + 32000.0 * 2048) * tokens);
  EXPECT_DOUBLE_EQ(f["swiglu"].bytes, 16.0 * 8.0 * 8192 * 2.0 * tokens);
  ASSERT_EQ(f.count("rope"), 1u);  // listed, and free: it rides in the attention's staging
  EXPECT_DOUBLE_EQ(f["rope"].bytes, 0.0);
}

TEST(StepTime, TheStepIsTheSumAndTheLimitingFamilyTheLongest) {
  const Card* h200 = find_card("h200");
  ASSERT_NE(h200, nullptr);
  EXPECT_EQ(find_card("v100"), nullptr);
  EXPECT_EQ(card_names(), "h100, h200, a100");
  const StepPrediction p = predict_step(llama_1b(), 4, 1024, *h200, Fractions{});
  double sum = 0.0, longest = 0.0;
  std::string limiting;
  for (const FamilyTime& f : p.families) {
    sum += f.ms;
    if (f.ms > longest) {
      longest = f.ms;
      limiting = f.family;
    }
    EXPECT_GE(f.ms, 0.0) << f.family;
  }
  EXPECT_DOUBLE_EQ(p.step_ms, sum);
  EXPECT_EQ(p.limiting, limiting);
  EXPECT_DOUBLE_EQ(p.tokens_per_s, 4.0 * 1024 / (sum / 1e3));
  // A faster memory system shortens only the memory-bound families.
  const StepPrediction slow = predict_step(llama_1b(), 4, 1024, *find_card("h100"), Fractions{});
  auto a = by_family(p), b = by_family(slow);
  EXPECT_DOUBLE_EQ(a["gemm"].ms, b["gemm"].ms);
  EXPECT_LT(a["adamw"].ms, b["adamw"].ms);
}

TEST(StepTime, ASlidingWindowComputesOnlyTheTilesItSees) {
  ModelShape s = llama_1b();
  const Card& card = *find_card("h100");
  const double full = by_family(predict_step(s, 1, 4096, card, Fractions{}))["attention"].flops;
  s.attention_window = 512;
  const double windowed = by_family(predict_step(s, 1, 4096, card, Fractions{}))["attention"].flops;
  // 64 query tiles; each sees its own and the tiles reaching 511 tokens back: at most 9 tiles.
  EXPECT_LT(windowed, full * 9.0 / 32.0);
  EXPECT_GT(windowed, full * 8.0 / 64.0);
}

}  // namespace
}  // namespace strata::model

// `strata estimate --model` counts every family's config.json, whatever its RoPE variant or
// attention pattern, including settings training would refuse (only the shape matters there).
#include <gtest/gtest.h>

#include "support/run_strata.h"

namespace strata {
namespace {

using testing::parse_json;
using testing::run_strata;
using testing::source_path;
using testing::TempDir;

TEST(EstimateFamilies, CountsEveryFamilyAndRopeVariant) {
  TempDir dir;
  const std::pair<const char*, std::int64_t> cases[] = {
      // Llama 3.1 8B with its llama3 RoPE.
      {R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "rope_theta": 500000.0,
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}})",
       8'030'261'248},
      // Qwen2.5 7B with YaRN.
      {R"({"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
           "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "tie_word_embeddings": false,
           "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                            "type": "yarn"}})",
       7'615'616'512},
      // Phi-3-mini with a RoPE variant Strata does not train: counted all the same.
      {R"({"model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
           "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
           "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "hidden_act": "gelu"})",
       3'821'079'552},
  };
  int n = 0;
  for (const auto& [json, params] : cases) {
    const std::string model = dir.write_file("m" + std::to_string(n++) + ".json", json);
    auto r = run_strata({"estimate", "--config", source_path("configs/zero3-offload-cpu-bf16.json"),
                         "--model", model, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err << "\n" << json;
    EXPECT_EQ(parse_json(r.out)["params"].asInt64(), params) << json;
  }
}

}  // namespace
}  // namespace strata

// Hugging Face config.json of the families people fine-tune (Llama 3.1, Qwen2.5, Qwen3, Mistral,
// Phi-3): transformers' parameter counts, the RoPE variants and attention patterns read as
// transformers reads them, named errors for what Strata does not run (estimates still count
// them), and config.json written back with the keys Strata does not interpret carried through.
#include <gtest/gtest.h>

#include "model/model_spec.h"
#include "support/run_strata.h"

namespace strata::model {
namespace {

using strata::testing::TempDir;

Result<ModelShape> shape_from(const std::string& json, HfRead mode = HfRead::kTrain) {
  STRATA_ASSIGN_OR_RETURN(config::ModelConfig m, parse_hf_config(json, "config.json", mode));
  return resolve_shape(m);
}

// The configs of the released models, as transformers 4.x wrote them (abridged to what matters).
const char* kLlama31_8b = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16", "mlp_bias": false,
  "attention_bias": false, "pretraining_tp": 1, "tie_word_embeddings": false,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}})";
const char* kQwen25_7b = R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
  "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 131072,
  "max_window_layers": 28, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false,
  "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}})";
const char* kQwen3_06b = R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
  "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "attention_bias": false,
  "max_position_embeddings": 40960, "max_window_layers": 28, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000, "rope_scaling": null, "sliding_window": null, "use_sliding_window": false,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16"})";
const char* kMistral7b = R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
  "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";
const char* kPhi3Mini4k = R"({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
  "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
  "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "rope_scaling": null, "sliding_window": 2047, "tie_word_embeddings": false,
  "embd_pdrop": 0.0, "resid_pdrop": 0.0, "bos_token_id": 1, "eos_token_id": 32000,
  "pad_token_id": 32000, "torch_dtype": "bfloat16"})";

TEST(HfConfig, ReleasedModelsHaveTransformersParameterCounts) {
  const std::pair<const char*, std::int64_t> cases[] = {{kLlama31_8b, 8'030'261'248},
                                                        {kQwen25_7b, 7'615'616'512},
                                                        {kQwen3_06b, 596'049'920},
                                                        {kMistral7b, 7'241'732'096},
                                                        {kPhi3Mini4k, 3'821'079'552}};
  for (const auto& [json, params] : cases) {
    auto shape = shape_from(json);
    ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
    EXPECT_EQ(total_params(*shape), params) << hf_model_type(*shape);
  }
}

TEST(HfConfig, ReadsEachFamilysRopeBiasesNormsAndWindow) {
  auto llama = shape_from(kLlama31_8b);
  ASSERT_TRUE(llama.is_ok());
  EXPECT_EQ(llama->arch.rope.type, config::RopeType::kLlama3);
  EXPECT_EQ(llama->arch.rope.original_max_positions, 8192);
  EXPECT_EQ(llama->rope_theta, 500000.0);
  EXPECT_EQ(llama->attention_window, 0);

  auto qwen2 = shape_from(kQwen25_7b);
  ASSERT_TRUE(qwen2.is_ok());
  EXPECT_EQ(qwen2->arch.rope.type, config::RopeType::kYarn);  // the 4.x key "type"
  EXPECT_TRUE(qwen2->arch.qkv_bias);
  EXPECT_FALSE(qwen2->arch.o_bias);
  EXPECT_EQ(qwen2->attention_window, 0);  // use_sliding_window false

  auto qwen3 = shape_from(kQwen3_06b);
  ASSERT_TRUE(qwen3.is_ok());
  EXPECT_TRUE(qwen3->arch.qk_norm);
  EXPECT_EQ(qwen3->head_dim, 128);  // not hidden / heads (64)
  EXPECT_TRUE(qwen3->tie_word_embeddings);

  auto mistral = shape_from(kMistral7b);
  ASSERT_TRUE(mistral.is_ok());
  EXPECT_EQ(mistral->attention_window, 4096);
  EXPECT_EQ(attention_window_of(*mistral, 31), 4096);

  auto phi3 = shape_from(kPhi3Mini4k);
  ASSERT_TRUE(phi3.is_ok());
  EXPECT_EQ(phi3->attention_window, 2047);
  EXPECT_EQ(hf_model_type(*phi3), "phi3");
}

TEST(HfConfig, QwenSlidingWindowCoversTheLayersTransformersPicks) {
  auto by_max_layers = shape_from(R"({"model_type": "qwen2", "num_hidden_layers": 4,
      "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
      "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 3})");
  ASSERT_TRUE(by_max_layers.is_ok()) << by_max_layers.status().to_string();
  EXPECT_EQ(attention_window_of(*by_max_layers, 2), 0);
  EXPECT_EQ(attention_window_of(*by_max_layers, 3), 16);
  auto by_types = shape_from(R"({"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "use_sliding_window": true, "sliding_window": 16,
      "layer_types": ["sliding_attention", "full_attention"]})");
  ASSERT_TRUE(by_types.is_ok()) << by_types.status().to_string();
  EXPECT_EQ(attention_window_of(*by_types, 0), 16);
  EXPECT_EQ(attention_window_of(*by_types, 1), 0);
  // Mistral without the key uses MistralConfig's 4096; null means none.
  auto absent = shape_from(R"({"model_type": "mistral", "hidden_size": 64,
      "num_attention_heads": 4, "num_key_value_heads": 2})");
  ASSERT_TRUE(absent.is_ok()) << absent.status().to_string();
  EXPECT_EQ(absent->attention_window, 4096);
  auto null = shape_from(R"({"model_type": "mistral", "hidden_size": 64,
      "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": null})");
  ASSERT_TRUE(null.is_ok());
  EXPECT_EQ(null->attention_window, 0);
}

TEST(HfConfig, PhiLongRopeReadsTheTopLevelOriginalContextAndPartialRotary) {
  std::string factors = "[";
  for (int i = 0; i < 24; ++i)
    factors += std::string(i ? "," : "") + std::to_string(1.0 + 0.1 * i);
  factors += "]";
  const std::string json = R"({"model_type": "phi3", "hidden_size": 256, "num_attention_heads": 4,
      "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
      "original_max_position_embeddings": 4096,
      "rope_scaling": {"type": "su", "short_factor": )" +
                           factors + R"(, "long_factor": )" + factors + "}}";
  auto shape = shape_from(json);
  ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
  EXPECT_EQ(shape->arch.rope.type, config::RopeType::kLongRope);  // Phi3Config maps "su"
  EXPECT_EQ(shape->arch.rope.original_max_positions, 4096);
  EXPECT_EQ(rotary_dim(*shape), 48);  // 64 * 0.75
  // A factor list of the wrong length names both lengths.
  std::string wrong = json;
  wrong.replace(wrong.find(factors), factors.size(), "[1.0, 2.0]");
  auto bad = shape_from(wrong);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("need 24 values"), std::string::npos)
      << bad.status().to_string();
}

TEST(HfConfig, UnsupportedSettingsAreNamedErrorsButEstimatesCountThem) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model_type": "llama", "rope_scaling": {"rope_type": "proportional", "factor": 2}})",
       "'proportional'"},
      {R"({"model_type": "llama", "hidden_act": "gelu"})", "'gelu'"},
      {R"({"model_type": "llama", "partial_rotary_factor": 0.5})", "partial_rotary_factor is 0.5"},
      {R"({"model_type": "phi3", "rope_scaling": {"rope_type": "llama3", "factor": 8,
          "low_freq_factor": 1, "high_freq_factor": 4}})",
       "Phi-3 models use"},
      {R"({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": true,
          "layer_types": ["full_attention", "chunked_attention"]})",
       "'chunked_attention'"},
  };
  for (const auto& [json, named] : cases) {
    auto strict = parse_hf_config(json, "config.json");
    ASSERT_FALSE(strict.is_ok()) << json;
    EXPECT_EQ(strict.status().code(), ErrorCode::kConfig);
    EXPECT_NE(strict.status().message().find(named), std::string::npos)
        << strict.status().to_string();
    EXPECT_EQ(strict.status().context(), "config.json");
    auto counted = shape_from(json, HfRead::kShapeOnly);
    EXPECT_TRUE(counted.is_ok()) << json << ": " << counted.status().to_string();
  }
  // Dynamic NTK equals plain RoPE up to max_position_embeddings, all Strata runs: accepted.
  EXPECT_TRUE(shape_from(R"({"model_type": "llama",
      "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})")
                  .is_ok());
  // A malformed value is an error even for an estimate.
  EXPECT_FALSE(
      shape_from(R"({"model_type": "llama", "rope_scaling": 3})", HfRead::kShapeOnly).is_ok());
}

TEST(HfConfig, WrittenConfigCarriesUninterpretedKeysAndReadsBackIdentically) {
  for (const char* json : {kLlama31_8b, kQwen25_7b, kQwen3_06b, kMistral7b, kPhi3Mini4k}) {
    auto shape = shape_from(json);
    ASSERT_TRUE(shape.is_ok());
    const std::string text = hf_config_json(*shape, "float32");
    auto again = shape_from(text);
    ASSERT_TRUE(again.is_ok()) << again.status().to_string() << "\n" << text;
    EXPECT_EQ(hf_config_json(*again, "float32"), text);
    EXPECT_EQ(total_params(*again), total_params(*shape));
    EXPECT_EQ(again->attention_window, shape->attention_window);
    EXPECT_EQ(again->arch.rope.type, shape->arch.rope.type);
    // The source's dtype, not the file's, and its token ids.
    EXPECT_NE(text.find(R"("torch_dtype" : "bfloat16")"), std::string::npos) << text;
  }
  auto llama = shape_from(kLlama31_8b);
  const std::string text = hf_config_json(*llama, "float32");
  EXPECT_NE(text.find(R"("bos_token_id" : 128000)"), std::string::npos) << text;
  EXPECT_NE(text.find("128009"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("rope_type" : "llama3")"), std::string::npos) << text;
}

}  // namespace
}  // namespace strata::model

#include "model/model_spec.h"

#include <gtest/gtest.h>

#include "support/run_strata.h"

namespace strata::model {
namespace {

using strata::testing::source_path;
using strata::testing::TempDir;

TEST(ModelSpec, Gpt2SmallHasHuggingFacesParameterCount) {
  auto m = read_hf_config(source_path("tests/fixtures/hf/gpt2/config.json"));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  auto shape = resolve_shape(*m);
  ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
  EXPECT_EQ(shape->intermediate_size, 3072);
  EXPECT_TRUE(shape->tie_word_embeddings);
  // GPT2LMHeadModel("gpt2").num_parameters() with the head tied to wte.
  EXPECT_EQ(total_params(*shape), 124'439'808);
  std::vector<UnitSpec> u = units(*shape);
  ASSERT_EQ(u.size(), 14u);
  EXPECT_EQ(u.front().name, "embedding");
  EXPECT_EQ(u.front().params, 50257 * 768 + 1024 * 768);
  EXPECT_EQ(u[1].params, 7'087'872);
  EXPECT_EQ(u.back().params, 2 * 768);  // ln_f only: the head is the tied embedding
}

TEST(ModelSpec, Llama2SevenBHasHuggingFacesParameterCount) {
  // A directory works as well as its config.json.
  auto m = read_hf_config(source_path("tests/fixtures/hf/llama-2-7b"));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  auto shape = resolve_shape(*m);
  ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
  EXPECT_EQ(total_params(*shape), 6'738'415'616);
  EXPECT_EQ(units(*shape).back().params, 4096 + 32000 * 4096);  // norm + untied lm_head
}

TEST(ModelSpec, GroupedKvHeadsShrinkTheKvProjections) {
  config::ModelConfig m;
  m.family = config::ModelFamily::kLlama;
  m.vocab_size = 100;
  m.hidden_size = 64;
  m.num_layers = 1;
  m.num_heads = 8;
  m.num_kv_heads = 2;
  m.intermediate_size = 128;
  auto shape = resolve_shape(m);
  ASSERT_TRUE(shape.is_ok());
  // norms 2*64, q and o 64*64 each, k and v 64*16 each, MLP 3*64*128.
  EXPECT_EQ(units(*shape)[1].params, 2 * 64 + 2 * 64 * 64 + 2 * 64 * 16 + 3 * 64 * 128);
}

TEST(ModelSpec, LlamaDefaultMlpWidthFollowsTheLlamaRule) {
  EXPECT_EQ(llama_intermediate_size(4096), 11008);
  EXPECT_EQ(llama_intermediate_size(5120), 13824);
}

TEST(ModelSpec, BadShapesNameTheKey) {
  config::ModelConfig m;
  m.hidden_size = 100;
  m.num_heads = 3;
  auto shape = resolve_shape(m);
  ASSERT_FALSE(shape.is_ok());
  EXPECT_EQ(shape.status().code(), ErrorCode::kConfig);
  EXPECT_EQ(shape.status().context(), "strata.model.num_heads");
  m.num_heads = 4;
  m.num_layers = 0;
  shape = resolve_shape(m);
  ASSERT_FALSE(shape.is_ok());
  EXPECT_EQ(shape.status().context(), "strata.model.num_layers");
}

TEST(ModelSpec, HfConfigErrorsNameFileAndKey) {
  TempDir dir;
  auto unknown = read_hf_config(dir.write_file("a.json", R"({"model_type": "bert"})"));
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("gpt2, llama, mistral"), std::string::npos);
  EXPECT_NE(unknown.status().context().find("a.json"), std::string::npos);

  auto scaled = read_hf_config(dir.write_file(
      "b.json", R"({"model_type": "llama", "rope_scaling": {"type": "axial", "factor": 2}})"));
  ASSERT_FALSE(scaled.is_ok());
  EXPECT_NE(scaled.status().message().find("rope_scaling.rope_type is 'axial'"), std::string::npos)
      << scaled.status().to_string();

  auto negative =
      read_hf_config(dir.write_file("c.json", R"({"model_type": "gpt2", "n_layer": -2})"));
  ASSERT_FALSE(negative.is_ok());
  EXPECT_NE(negative.status().message().find("n_layer"), std::string::npos);

  auto broken = read_hf_config(dir.write_file("d.json", R"({"model_type": "gpt2",)"));
  ASSERT_FALSE(broken.is_ok());
  EXPECT_NE(broken.status().message().find("malformed JSON"), std::string::npos);

  auto window = read_hf_config(
      dir.write_file("e.json", R"({"model_type": "mistral", "sliding_window": "wide"})"));
  ASSERT_FALSE(window.is_ok());
  EXPECT_NE(window.status().message().find("sliding_window"), std::string::npos);
  auto windowed = read_hf_config(
      dir.write_file("f.json", R"({"model_type": "mistral", "sliding_window": 4096})"));
  ASSERT_TRUE(windowed.is_ok()) << windowed.status().to_string();
  EXPECT_EQ(windowed.value().attention_window, 4096);

  auto missing = read_hf_config(dir.path() + "/nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kConfig);
}

}  // namespace
}  // namespace strata::model

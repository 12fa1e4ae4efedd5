// Hugging Face directories: config.json <-> ModelShape, save and load of both families (single
// file and sharded index), the names and buffers real checkpoints carry, and clear errors.
#include "model/hf_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "model/init.h"
#include "model/safetensors.h"
#include "support/run_strata.h"

namespace strata::model {
namespace {

ModelShape small(Family family, bool tied) {
  config::ModelConfig c;
  c.family = family;
  c.vocab_size = 37;
  c.max_seq_len = 16;
  c.hidden_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = family == Family::kLlama ? 2 : 0;
  c.tie_word_embeddings = tied;
  c.rope_theta = 12345.0;
  return std::move(resolve_shape(c)).value();
}

std::vector<std::vector<float>> random_units(const ModelShape& spec, const ModelLayout& layout) {
  std::vector<std::vector<float>> units;
  for (const UnitLayout& u : layout.units) {
    units.emplace_back(static_cast<std::size_t>(u.padded_numel));
    init_unit(spec, u, 99, units.back().data());
  }
  return units;
}

std::vector<const float*> cptrs(const std::vector<std::vector<float>>& units) {
  std::vector<const float*> p;
  for (const auto& u : units)
    p.push_back(u.data());
  return p;
}
std::vector<float*> ptrs(std::vector<std::vector<float>>& units) {
  std::vector<float*> p;
  for (auto& u : units)
    p.push_back(u.data());
  return p;
}

TEST(HfIo, SaveThenLoadRoundTripsBothFamiliesTiedAndUntied) {
  for (Family family : {Family::kGpt2, Family::kLlama}) {
    for (bool tied : {true, false}) {
      testing::TempDir dir;
      const ModelShape spec = small(family, tied);
      const ModelLayout layout = build_layout(spec);
      auto units = random_units(spec, layout);
      ASSERT_TRUE(save_hf_model(dir.path() + "/m", spec, layout, cptrs(units), kernels::DType::kF32)
                      .is_ok());
      auto read = read_hf_spec(dir.path() + "/m");
      ASSERT_TRUE(read.is_ok()) << read.status().to_string();
      EXPECT_EQ(read->family, spec.family);
      EXPECT_EQ(read->num_kv_heads, spec.num_kv_heads);
      EXPECT_EQ(read->intermediate_size, spec.intermediate_size);
      EXPECT_EQ(read->tie_word_embeddings, tied);
      if (family == Family::kLlama) {
        EXPECT_EQ(read->rope_theta, spec.rope_theta);
      }
      std::vector<std::vector<float>> loaded(units.size());
      for (std::size_t u = 0; u < units.size(); ++u)
        loaded[u].assign(units[u].size(), -1.0f);
      Status s = load_hf_weights(dir.path() + "/m", layout, ptrs(loaded));
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      EXPECT_EQ(loaded, units);
      auto file = SafetensorsFile::open(dir.path() + "/m/model.safetensors");
      ASSERT_TRUE(file.is_ok());
      EXPECT_EQ(file->find("lm_head.weight") != nullptr, !tied);
      EXPECT_EQ(file->metadata().at("format"), "pt");
    }
  }
}

TEST(HfIo, LoadsAShardedIndexAndRejectsPathsOutsideTheDirectory) {
  testing::TempDir dir;
  const ModelShape spec = small(Family::kLlama, false);
  const ModelLayout layout = build_layout(spec);
  auto units = random_units(spec, layout);
  // Shard 1: the embedding and block 0; shard 2: the rest.
  std::vector<StTensorToWrite> first, second;
  std::string weight_map;
  for (std::size_t u = 0; u < layout.units.size(); ++u) {
    for (const TensorSlot& slot : layout.units[u].tensors) {
      const bool in_first = u < 2;
      (in_first ? first : second)
          .push_back({slot.name, StDType::kF32, slot.shape, units[u].data() + slot.offset});
      weight_map +=
          (weight_map.empty() ? "" : ",") + std::string("\"") + slot.name + "\":\"" +
          (in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") +
          "\"";
    }
  }
  ASSERT_TRUE(
      write_safetensors(dir.path() + "/model-00001-of-00002.safetensors", first, {{"format", "pt"}})
          .is_ok());
  ASSERT_TRUE(write_safetensors(dir.path() + "/model-00002-of-00002.safetensors", second,
                                {{"format", "pt"}})
                  .is_ok());
  dir.write_file("model.safetensors.index.json",
                 "{\"metadata\":{},\"weight_map\":{" + weight_map + "}}");
  std::vector<std::vector<float>> loaded(units.size());
  for (std::size_t u = 0; u < units.size(); ++u)
    loaded[u].resize(units[u].size());
  Status s = load_hf_weights(dir.path(), layout, ptrs(loaded));
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(loaded, units);

  dir.write_file("model.safetensors.index.json",
                 "{\"weight_map\":{\"model.norm.weight\":\"../evil.safetensors\"}}");
  s = load_hf_weights(dir.path(), layout, ptrs(loaded));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("../evil.safetensors"), std::string::npos) << s.to_string();
}

TEST(HfIo, AcceptsGpt2ModelNamesAndMaskBuffersButNotStrangers) {
  testing::TempDir dir;
  const ModelShape spec = small(Family::kGpt2, true);
  const ModelLayout layout = build_layout(spec);
  auto units = random_units(spec, layout);
  std::vector<StTensorToWrite> tensors;
  for (std::size_t u = 0; u < layout.units.size(); ++u) {
    for (const TensorSlot& slot : layout.units[u].tensors) {
      tensors.push_back({slot.name.substr(std::string("transformer.").size()), StDType::kF32,
                         slot.shape, units[u].data() + slot.offset});
    }
  }
  std::vector<float> mask(16 * 16, 1.0f);
  tensors.push_back({"h.0.attn.bias", StDType::kF32, {1, 1, 16, 16}, mask.data()});
  ASSERT_TRUE(write_safetensors(dir.path() + "/model.safetensors", tensors, {}).is_ok());
  std::vector<std::vector<float>> loaded(units.size());
  for (std::size_t u = 0; u < units.size(); ++u)
    loaded[u].resize(units[u].size());
  Status s = load_hf_weights(dir.path(), layout, ptrs(loaded));
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(loaded, units);

  tensors.push_back({"h.0.mystery.weight", StDType::kF32, {16}, mask.data()});
  ASSERT_TRUE(write_safetensors(dir.path() + "/model.safetensors", tensors, {}).is_ok());
  s = load_hf_weights(dir.path(), layout, ptrs(loaded));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("unexpected tensor 'h.0.mystery.weight'"), std::string::npos);

  tensors.erase(tensors.begin() + 3);  // drop a block tensor
  tensors.pop_back();
  ASSERT_TRUE(write_safetensors(dir.path() + "/model.safetensors", tensors, {}).is_ok());
  s = load_hf_weights(dir.path(), layout, ptrs(loaded));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("has no tensor"), std::string::npos) << s.to_string();
}

TEST(HfIo, WrittenConfigReadsBackAsTheSameShape) {
  testing::TempDir dir;
  for (Family family : {Family::kGpt2, Family::kLlama}) {
    for (bool tied : {true, false}) {
      const ModelShape spec = small(family, tied);
      const std::string path = dir.write_file("config.json", hf_config_json(spec, "float32"));
      auto back = read_hf_spec(path);
      ASSERT_TRUE(back.is_ok()) << back.status().to_string();
      EXPECT_EQ(back->family, spec.family);
      EXPECT_EQ(back->vocab_size, spec.vocab_size);
      EXPECT_EQ(back->max_seq_len, spec.max_seq_len);
      EXPECT_EQ(back->hidden_size, spec.hidden_size);
      EXPECT_EQ(back->num_layers, spec.num_layers);
      EXPECT_EQ(back->num_heads, spec.num_heads);
      EXPECT_EQ(back->num_kv_heads, spec.num_kv_heads);
      EXPECT_EQ(back->intermediate_size, spec.intermediate_size);
      EXPECT_EQ(back->norm_eps, spec.norm_eps);
      EXPECT_EQ(back->tie_word_embeddings, tied);
    }
  }
}

TEST(HfIo, ParameterCountMatchesTheLayout) {
  for (Family family : {Family::kGpt2, Family::kLlama}) {
    for (bool tied : {true, false}) {
      const ModelShape spec = small(family, tied);
      const ModelLayout layout = build_layout(spec);
      std::int64_t total = 0;
      for (const UnitLayout& u : layout.units) {
        for (const TensorSlot& t : u.tensors)
          total += t.numel;
        EXPECT_EQ(u.padded_numel % kUnitPadElements, 0);
      }
      EXPECT_EQ(total_params(spec), total);
    }
  }
}

}  // namespace
}  // namespace strata::model

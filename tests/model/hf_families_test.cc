// Hugging Face directories of every family (the fixtures transformers wrote): Strata reads each
// model and writes back a directory with the same tensor names, shapes and values, a config.json
// that reads as the same model with the source's other keys (token ids, dtype), the source's
// tokenizer files and generation_config.json; a directory holding only pytorch_model.bin is
// refused with the way to convert it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/hf_io.h"
#include "model/safetensors.h"
#include "tests/model/fixture_support.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

class HfFamilies : public ::testing::TestWithParam<std::string> {};

std::vector<std::vector<float>> load(const std::string& dir, const ModelLayout& layout) {
  std::vector<std::vector<float>> units;
  std::vector<float*> ptrs;
  for (const UnitLayout& u : layout.units)
    units.emplace_back(static_cast<std::size_t>(u.padded_numel), -1.0f);
  for (auto& u : units)
    ptrs.push_back(u.data());
  const Status s = load_hf_weights(dir, layout, ptrs);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return units;
}

TEST_P(HfFamilies, SavedDirectoryHasTheSourcesTensorsConfigAndSideFiles) {
  const std::string source = testing::fixture_dir(GetParam());
  auto shape = read_hf_spec(source);
  ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
  const ModelLayout layout = build_layout(*shape);
  const auto units = load(source, layout);
  testing::TempDir dir;
  const std::string out = dir.path() + "/saved";
  std::vector<const float*> ptrs;
  for (const auto& u : units)
    ptrs.push_back(u.data());
  ASSERT_TRUE(save_hf_model(out, *shape, layout, ptrs, kernels::DType::kF32).is_ok());

  // The same tensors under the same names (Phi-3's fused ones included) as transformers wrote.
  auto theirs = SafetensorsFile::open(source + "/model.safetensors");
  auto ours = SafetensorsFile::open(out + "/model.safetensors");
  ASSERT_TRUE(theirs.is_ok() && ours.is_ok());
  ASSERT_EQ(ours->tensors().size(), theirs->tensors().size());
  for (const StTensor& t : theirs->tensors()) {
    const StTensor* o = ours->find(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(o->shape, t.shape) << t.name;
  }
  EXPECT_EQ(load(out, layout), units);

  // config.json: the same model, the same text when read and written again.
  auto back = read_hf_spec(out);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(hf_config_json(*back, "float32"), hf_config_json(*shape, "float32"));
  EXPECT_EQ(total_params(*back), total_params(*shape));
  EXPECT_EQ(hf_model_type(*back), hf_model_type(*shape));
  EXPECT_EQ(back->attention_window, shape->attention_window);
  EXPECT_EQ(back->arch.padding_idx, shape->arch.padding_idx);
  for (const char* side : {"generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(fs::exists(out + "/" + side), fs::exists(source + "/" + side)) << side;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFamilies, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

TEST(HfFamilies, ConfigCarriesTheSourcesTokenIdsAndDtype) {
  auto shape = read_hf_spec(testing::fixture_dir("qwen2_tied"));
  ASSERT_TRUE(shape.is_ok());
  const std::string text = hf_config_json(*shape, "bfloat16");
  for (const char* key : {R"("bos_token_id" : 1)", R"("eos_token_id" : 2)", R"("pad_token_id" : 0)",
                          R"("torch_dtype" : "float32")", R"("max_window_layers" : 1)"}) {
    EXPECT_NE(text.find(key), std::string::npos) << key << "\n" << text;
  }
  // The source's dtype (transformers 5's "dtype" key) wins over the saved tensors' bfloat16, and
  // is written once.
  EXPECT_EQ(text.find(R"("dtype")"), std::string::npos) << text;
  EXPECT_EQ(shape->arch.padding_idx, 0);
}

TEST(HfFamilies, PytorchBinOnlyDirectoryNamesTheConversion) {
  testing::TempDir dir;
  fs::copy_file(testing::fixture_dir("phi3") + "/config.json", dir.path() + "/config.json");
  dir.write_file("pytorch_model.bin", "not read");
  EXPECT_TRUE(has_hf_weights(dir.path()));
  auto shape = read_hf_spec(dir.path());
  ASSERT_TRUE(shape.is_ok());
  std::vector<std::vector<float>> units;
  std::vector<float*> ptrs;
  const ModelLayout layout = build_layout(*shape);
  for (const UnitLayout& u : layout.units)
    units.emplace_back(static_cast<std::size_t>(u.padded_numel));
  for (auto& u : units)
    ptrs.push_back(u.data());
  const Status s = load_hf_weights(dir.path(), layout, ptrs);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("pytorch_model.bin"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("tools/convert_pytorch_bin.sh"), std::string::npos) << s.to_string();
}

TEST(HfFamilies, SideFilesAreNotCopiedOntoThemselvesOrFromNowhere) {
  testing::TempDir dir;
  auto none = copy_hf_side_files(dir.path() + "/missing", dir.path());
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->empty());
  dir.write_file("tokenizer.json", "{}");
  auto self = copy_hf_side_files(dir.path(), dir.path());
  ASSERT_TRUE(self.is_ok());
  EXPECT_TRUE(self->empty());
  fs::create_directories(dir.path() + "/out");
  auto copied = copy_hf_side_files(dir.path(), dir.path() + "/out");
  ASSERT_TRUE(copied.is_ok());
  EXPECT_EQ(*copied, std::vector<std::string>{"tokenizer.json"});
}

}  // namespace
}  // namespace strata::model

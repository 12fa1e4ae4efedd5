// Model files from a hostile world: a safetensors header nested 100+ deep, a FIFO or /dev/zero
// in place of a file, config.json values that are absurd (n_layer 1e9, a 2^62 vocabulary, an
// integer beyond int64, a value of the wrong type): each is a named error, promptly, never a
// crash, a hang or gigabytes allocated. And the writer's digests are the reader's.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "model/safetensors.h"
#include "model/shape_limits.h"
#include "support/run_strata.h"

namespace strata::model {
namespace {

using testing::TempDir;

std::string with_length(const std::string& header) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header;
}

TEST(HostileSafetensors, DeeplyNestedHeaderIsCorruptNotACrash) {
  TempDir dir;
  for (int depth : {5, 100, 100000}) {
    const std::string header =
        "{\"__metadata__\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
    const std::string path = dir.write_file("deep.safetensors", with_length(header));
    Status s = SafetensorsFile::open(path).status();
    EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << depth << ": " << s.to_string();
    EXPECT_EQ(s.context(), path);
  }
}

TEST(HostileSafetensors, AFifoIsRefusedWithoutWaiting) {
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  Status s = SafetensorsFile::open(path).status();
  EXPECT_NE(s.message().find("FIFO"), std::string::npos) << s.to_string();
}

TEST(HostileSafetensors, WriterDigestsAreWhatTheReaderComputes) {
  TempDir dir;
  const std::vector<float> a = {1.0f, 2.0f, 3.0f};
  const std::vector<float> b = {-1.0f};
  StDigest digest;
  const std::string path = dir.path() + "/d.safetensors";
  ASSERT_TRUE(write_safetensors(
                  path, {{"a", StDType::kF32, {3}, a.data()}, {"b", StDType::kF32, {1}, b.data()}},
                  {{"format", "pt"}}, {}, &digest)
                  .is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok());
  EXPECT_EQ(digest.file_bytes, file->file_bytes());
  EXPECT_EQ(digest.header_xxh3, file->header_xxh3());
  ASSERT_EQ(digest.tensor_xxh3.size(), 2u);
  EXPECT_EQ(digest.tensor_xxh3[0], file->tensor_xxh3(*file->find("a")));
  EXPECT_EQ(digest.tensor_xxh3[1], file->tensor_xxh3(*file->find("b")));
  EXPECT_NE(digest.tensor_xxh3[0], digest.tensor_xxh3[1]);
}

Status hf_config_status(const std::string& json) {
  Result<config::ModelConfig> m = parse_hf_config(json, "config.json");
  if (!m.is_ok()) return m.status();
  return resolve_shape(*m).status();
}

TEST(HostileConfigJson, AbsurdSizesAreRefusedBeforeAnythingIsAllocated) {
  const auto start = std::chrono::steady_clock::now();
  Status layers = hf_config_status(R"({"model_type": "gpt2", "n_layer": 1e9})");
  EXPECT_EQ(layers.code(), ErrorCode::kConfig);
  EXPECT_EQ(layers.context(), "strata.model.num_layers");
  EXPECT_NE(layers.message().find("n_layer"), std::string::npos) << layers.to_string();
  Status vocab = hf_config_status(R"({"model_type": "llama", "vocab_size": 4611686018427387904})");
  EXPECT_EQ(vocab.context(), "strata.model.vocab_size") << vocab.to_string();
  Status hidden = hf_config_status(R"({"model_type": "gpt2", "n_embd": 4611686018427387904,
                                       "n_head": 1})");
  EXPECT_EQ(hidden.context(), "strata.model.hidden_size") << hidden.to_string();
  // Within every per-dimension limit, but 100000 layers of hidden 2^20 is far too many weights.
  Status total = hf_config_status(R"({"model_type": "gpt2", "n_layer": 100000,
                                      "n_embd": 1048576, "n_head": 16})");
  EXPECT_EQ(total.code(), ErrorCode::kConfig) << total.to_string();
  EXPECT_NE(total.message().find("parameters"), std::string::npos) << total.to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(HostileConfigJson, ValuesOfTheWrongTypeOrRangeAreNamedNotThrown) {
  for (const char* json :
       {R"({"model_type": {}})", R"({"model_type": []})",
        R"({"model_type": "gpt2", "n_layer": 1e19})", R"({"model_type": "gpt2", "n_layer": "12"})",
        // (Llama has no sliding window: transformers' LlamaConfig carries the key unread.)
        R"({"model_type": "mistral", "sliding_window": 1e19})",
        R"({"model_type": "llama", "head_dim": 1e19})",
        R"({"model_type": "llama", "rope_parameters": {"rope_theta": []}})", R"([1, 2])",
        R"("text")"}) {
    Status s = hf_config_status(json);
    EXPECT_EQ(s.code(), ErrorCode::kConfig) << json << ": " << s.to_string();
    EXPECT_EQ(s.context().rfind("config.json", 0) == 0 || s.context().rfind("strata.model", 0) == 0,
              true)
        << json << ": " << s.to_string();
  }
}

TEST(HostileConfigJson, DeepNestingIsRefused) {
  const std::string json =
      R"({"model_type": "gpt2", "x": )" + std::string(1000, '[') + std::string(1000, ']') + "}";
  Status s = hf_config_status(json);
  EXPECT_EQ(s.code(), ErrorCode::kConfig) << s.to_string();
  EXPECT_NE(s.message().find("nested deeper"), std::string::npos) << s.to_string();
}

TEST(HostileConfigJson, AConfigJsonThatIsADeviceIsRefused) {
  TempDir dir;
  std::filesystem::create_symlink("/dev/zero", dir.path() + "/config.json");
  Status s = read_hf_config(dir.path()).status();
  EXPECT_EQ(s.code(), ErrorCode::kConfig) << s.to_string();
  EXPECT_NE(s.message().find("character device"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace strata::model

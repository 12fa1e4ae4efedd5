// tools/prepare_data.py: the token and mask files it writes for chat, prompt/response and text
// data with a model's tokenizer (checked against the fixture and read back by Strata's readers),
// the same output for any number of workers, the validation split, uint32 ids for large
// vocabularies, and bad inputs: each a clear error naming the file and line, with nothing
// half-written left looking complete.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "data/token_mask.h"
#include "support/run_strata.h"
#include "tests/data/prepare_support.h"

namespace strata::data {
namespace {

namespace fs = std::filesystem;
using testing::prepare_data;
using testing::TempDir;

struct Prepared {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> flags;
  TokenFormat format = TokenFormat::kNanoGptU16;
};

// Reads a token file and its mask through Strata's own readers (which check the checksum).
Prepared read_prepared(const std::string& token_path) {
  Prepared p;
  auto tokens = TokenFile::open(token_path, false);
  EXPECT_TRUE(tokens.is_ok()) << tokens.status().to_string();
  if (!tokens.is_ok()) return p;
  auto mask = MaskFile::open_beside(*tokens);
  EXPECT_TRUE(mask.is_ok()) << mask.status().to_string();
  EXPECT_TRUE(mask.is_ok() && mask->has_value()) << "no mask beside " << token_path;
  if (!mask.is_ok() || !mask->has_value()) return p;
  p.format = tokens->format();
  for (std::int64_t i = 0; i < tokens->size(); ++i) {
    p.tokens.push_back(tokens->at(i));
    p.flags.push_back((*mask)->at(i));
  }
  return p;
}

// A copy of the fixture model directory with config.json's vocab_size replaced, or without
// tokenizer.json.
std::string model_copy(const TempDir& dir, const std::string& name, std::int64_t vocab,
                       bool tokenizer = true) {
  const std::string out = dir.path() + "/" + name;
  fs::create_directories(out);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "config.json"}) {
    if (!tokenizer && std::string(f) == "tokenizer.json") continue;
    fs::copy_file(testing::bpe_model_dir() + "/" + f, out + "/" + f);
  }
  std::string config = testing::read_file(out + "/config.json");
  const std::size_t at = config.find("\"vocab_size\": 384");
  EXPECT_NE(at, std::string::npos);
  config.replace(at, 17, "\"vocab_size\": " + std::to_string(vocab));
  std::ofstream(out + "/config.json") << config;
  return out;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(PrepareData, ChatPairsAndTextMatchTheFixtureAndReadBackInStrata) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  TempDir dir;
  auto r = prepare_data({"--model", testing::bpe_model_dir(), "--input", testing::sft_jsonl(),
                         "--output", dir.path() + "/out", "--workers", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json::Value summary = testing::parse_json(r.out);
  EXPECT_EQ(summary["documents"]["chat"].asInt(), 6);
  EXPECT_EQ(summary["documents"]["pair"].asInt(), 3);
  EXPECT_EQ(summary["documents"]["text"].asInt(), 3);
  const Prepared p = read_prepared(dir.path() + "/out/train.bin");
  EXPECT_EQ(p.format, TokenFormat::kLlmcU16);
  // The fixture's references were computed on exactly these tokens: a tokenizers/transformers
  // upgrade that changes them must regenerate the fixture (tools/make_data_fixture.py).
  EXPECT_EQ(p.tokens, testing::reference_ints("tokens"));
  EXPECT_EQ(p.flags, testing::reference_ints("flags"));
  EXPECT_EQ(files_in(dir.path() + "/out"),
            (std::vector<std::string>{"prepare.json", "train.bin", "train.mask.bin"}));
}

TEST(PrepareData, EveryDocumentStartsWithItsFlagAndEndsWithTheEndOfDocumentToken) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  TempDir dir;
  auto r = prepare_data({"--model", testing::bpe_model_dir(), "--input", testing::sft_jsonl(),
                         "--output", dir.path(), "--workers", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::int32_t eos = testing::parse_json(r.out)["eos_id"].asInt();
  const Prepared p = read_prepared(dir.path() + "/train.bin");
  ASSERT_FALSE(p.tokens.empty());
  int documents = 0;
  for (std::size_t i = 0; i < p.tokens.size(); ++i) {
    if (p.flags[i] & kStartsDocument) {
      ++documents;
      if (i > 0) {
        EXPECT_EQ(p.tokens[i - 1], eos) << "before the document at " << i;
      }
    }
  }
  EXPECT_EQ(documents, 12);
  EXPECT_EQ(p.tokens.back(), eos);
}

TEST(PrepareData, WorkersAndTheSplitDoNotChangeWhatIsWritten) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  TempDir dir;
  // One worker with the whole file as one chunk, and three with chunks of about 200 bytes (9
  // of them, which may finish out of order).
  for (const char* workers : {"1", "3"}) {
    auto r = prepare_data({"--model", testing::bpe_model_dir(), "--input", testing::sft_jsonl(),
                           "--output", dir.path() + "/w" + workers, "--workers", workers,
                           "--val-fraction", "0.25", "--chunk-bytes",
                           std::string(workers) == "1" ? "1048576" : "200"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  for (const char* f : {"train.bin", "train.mask.bin", "val.bin", "val.mask.bin"}) {
    EXPECT_EQ(testing::read_file(dir.path() + "/w1/" + f),
              testing::read_file(dir.path() + "/w3/" + f))
        << f;
  }
  const Prepared train = read_prepared(dir.path() + "/w1/train.bin");
  const Prepared val = read_prepared(dir.path() + "/w1/val.bin");
  auto documents = [](const Prepared& p) {
    int n = 0;
    for (std::int32_t f : p.flags)
      n += (f & kStartsDocument) ? 1 : 0;
    return n;
  };
  EXPECT_EQ(documents(train), 9);  // every 4th of 12 documents is held out
  EXPECT_EQ(documents(val), 3);
  EXPECT_EQ(train.tokens.size() + val.tokens.size(), testing::reference_ints("tokens").size());
}

TEST(PrepareData, LargeVocabulariesGetUint32Ids) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  TempDir dir;
  const std::string model = model_copy(dir, "big", 151936);
  auto r = prepare_data(
      {"--model", model, "--input", testing::sft_jsonl(), "--output", dir.path() + "/out"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Prepared p = read_prepared(dir.path() + "/out/train.bin");
  EXPECT_EQ(p.format, TokenFormat::kLlmcU32);
  EXPECT_EQ(p.tokens, testing::reference_ints("tokens"));
}

TEST(PrepareData, TextParagraphsPlainPairsAndNoMask) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  TempDir dir;
  const std::string text =
      dir.write_file("book.txt", "First paragraph,\ntwo lines.\n\n\nSecond.\n");
  auto r = prepare_data({"--model", testing::bpe_model_dir(), "--input", text, "--output",
                         dir.path() + "/text", "--text-docs", "paragraph"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Prepared p = read_prepared(dir.path() + "/text/train.bin");
  ASSERT_FALSE(p.flags.empty());
  int starts = 0;
  for (std::int32_t f : p.flags) {
    EXPECT_TRUE(f & kCountsInLoss);  // text: every token counts
    starts += (f & kStartsDocument) ? 1 : 0;
  }
  EXPECT_EQ(starts, 2);

  const std::string pairs = dir.write_file("p.jsonl", R"({"prompt": "Ask.", "response": "Yes."})");
  r = prepare_data({"--model", testing::bpe_model_dir(), "--input", pairs, "--output",
                    dir.path() + "/plain", "--pairs", "plain"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  p = read_prepared(dir.path() + "/plain/train.bin");
  // <|begin_of_text|> A s k . (prompt, no loss) then Y e s . <|end_of_text|> (loss)
  ASSERT_GE(p.flags.size(), 4u);
  EXPECT_EQ(p.flags.front(), kStartsDocument);
  EXPECT_EQ(p.flags.back(), kCountsInLoss);
  std::size_t first_counted = 0;
  while (first_counted < p.flags.size() && !(p.flags[first_counted] & kCountsInLoss))
    ++first_counted;
  for (std::size_t i = first_counted; i < p.flags.size(); ++i)
    EXPECT_TRUE(p.flags[i] & kCountsInLoss) << i;

  r = prepare_data({"--model", testing::bpe_model_dir(), "--input", testing::sft_jsonl(),
                    "--output", dir.path() + "/all", "--no-mask"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  p = read_prepared(dir.path() + "/all/train.bin");
  for (std::int32_t f : p.flags)
    EXPECT_TRUE(f & kCountsInLoss);
  EXPECT_EQ(p.tokens, testing::reference_ints("tokens"));  // the same tokens, all counted
}

// Runs a preparation expected to fail: exit 1, the message names `where` and says `what`, and
// the output directory holds exactly what it held before (no partial or half-complete file).
void expect_refused(const TempDir& dir, const std::string& model, const std::string& input,
                    const std::string& where, const std::string& what) {
  const std::string out = dir.path() + "/out";
  const std::vector<std::string> before = files_in(out);
  const std::string train_before =
      fs::exists(out + "/train.bin") ? testing::read_file(out + "/train.bin") : "";
  auto r = prepare_data({"--model", model, "--input", input, "--output", out, "--workers", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find(where), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Traceback"), std::string::npos) << r.err;
  EXPECT_EQ(files_in(out), before);
  if (!train_before.empty()) {
    EXPECT_EQ(testing::read_file(out + "/train.bin"), train_before);
  }
}

TEST(PrepareData, BadInputsNameTheFileAndLineAndLeaveNothingHalfWritten) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  TempDir dir;
  const std::string model = testing::bpe_model_dir();
  // A complete earlier preparation stays as it was when a later one fails.
  auto good = prepare_data(
      {"--model", model, "--input", testing::sft_jsonl(), "--output", dir.path() + "/out"});
  ASSERT_EQ(good.exit_code, 0) << good.err;
  const std::string ok_line = R"({"text": "fine"})";
  const std::string bad_json =
      dir.write_file("bad.jsonl", ok_line + "\n" + ok_line + "\n{\"text\": \"unterminated\n");
  expect_refused(dir, model, bad_json, "bad.jsonl:3", "not valid JSON");
  const std::string no_field =
      dir.write_file("missing.jsonl", ok_line + "\n" + R"({"title": "no text here"})" + "\n");
  expect_refused(dir, model, no_field, "missing.jsonl:2", "none of the fields \"text\"");
  const std::string bad_chat = dir.write_file("chat.jsonl", R"({"messages": [{"role": "user"}]})");
  expect_refused(dir, model, bad_chat, "chat.jsonl:1", "message 0 is not an object");
  expect_refused(dir, model_copy(dir, "small", 300), testing::sft_jsonl(), "sft.jsonl:1",
                 "outside the model's vocabulary [0, 300)");
  const std::string no_tokenizer = model_copy(dir, "bare", 384, false);
  expect_refused(dir, no_tokenizer, testing::sft_jsonl(), no_tokenizer + "/tokenizer.json",
                 "no tokenizer.json");
  expect_refused(dir, model, dir.path() + "/absent.jsonl", "absent.jsonl", "not found");
}

}  // namespace
}  // namespace strata::data

// Mask files (a pair that does not belong together is refused), masked stream windows, packed
// windows (positions restart per document, no target crosses a document, long documents cut
// into overlapping pieces, padding), packing in the dataset with its document split, and text
// given as a token file.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/token_file.h"
#include "data/token_mask.h"
#include "data/windows.h"
#include "support/run_strata.h"
#include "tests/train/llmc_tokens.h"

namespace strata::data {
namespace {

std::string le32(std::uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A mask file for `tokens` with these flags; `count`/`checksum` override the header's fields.
std::string mask_bytes(const TokenFile& tokens, const std::vector<std::uint8_t>& flags,
                       std::int64_t count = -1, std::uint64_t checksum = 0) {
  const auto n = static_cast<std::uint64_t>(count < 0 ? tokens.size() : count);
  const std::uint64_t sum = checksum != 0 ? checksum : token_checksum(tokens);
  std::string header = le32(kMaskMagic) + le32(1) + le32(static_cast<std::uint32_t>(n)) +
                       le32(static_cast<std::uint32_t>(n >> 32)) +
                       le32(static_cast<std::uint32_t>(sum)) +
                       le32(static_cast<std::uint32_t>(sum >> 32));
  header.resize(kMaskHeaderBytes, '\0');
  return header + std::string(flags.begin(), flags.end());
}

// Documents of the given token ids, flags: the first token starts a document; tokens count
// unless listed in `prompt_tokens` (a token id that marks a prompt, for readable tests).
struct Corpus {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> flags;
  void add(const std::vector<std::int32_t>& doc, std::int32_t prompt_token = -1) {
    for (std::size_t i = 0; i < doc.size(); ++i) {
      tokens.push_back(doc[i]);
      std::uint8_t f = doc[i] == prompt_token ? 0 : kCountsInLoss;
      if (i == 0) f |= kStartsDocument;
      flags.push_back(f);
    }
  }
};

struct Written {
  std::string tokens;
  std::string mask;
};

Written write_pair(const testing::TempDir& dir, const Corpus& c, const std::string& stem = "d") {
  Written w;
  w.tokens = dir.write_file(stem + ".bin", testing::llmc_file(c.tokens));
  auto file = TokenFile::open(w.tokens, false);
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  w.mask = dir.write_file(stem + ".mask.bin", mask_bytes(*file, c.flags));
  return w;
}

TEST(MaskFile, SiblingPathIsFoundAndItsFlagsCounted) {
  EXPECT_EQ(mask_path_for("/a/train.bin"), "/a/train.mask.bin");
  EXPECT_EQ(mask_path_for("/a/tokens"), "/a/tokens.mask.bin");
  testing::TempDir dir;
  Corpus c;
  c.add({7, 7, 1, 2}, 7);
  c.add({3, 4, 5});
  const Written w = write_pair(dir, c);
  auto tokens = std::move(TokenFile::open(w.tokens, false)).value();
  auto mask = MaskFile::open_beside(tokens);
  ASSERT_TRUE(mask.is_ok()) << mask.status().to_string();
  ASSERT_TRUE(mask->has_value());
  EXPECT_EQ((*mask)->size(), 7);
  EXPECT_EQ((*mask)->counted(), 5);
  EXPECT_EQ((*mask)->documents(), 2);
  EXPECT_EQ((*mask)->at(4), kCountsInLoss | kStartsDocument);
}

TEST(MaskFile, APairThatDoesNotBelongTogetherIsRefused) {
  testing::TempDir dir;
  Corpus c;
  c.add({1, 2, 3, 4});
  const Written w = write_pair(dir, c);
  auto tokens = std::move(TokenFile::open(w.tokens, false)).value();
  auto expect_error = [&](const std::string& bytes, const std::string& what) {
    auto m = MaskFile::open(dir.write_file("m.mask.bin", bytes), tokens);
    ASSERT_FALSE(m.is_ok()) << what;
    EXPECT_NE(m.status().to_string().find(what), std::string::npos) << m.status().to_string();
    EXPECT_NE(m.status().to_string().find("m.mask.bin"), std::string::npos);
  };
  expect_error(mask_bytes(tokens, {1, 1, 1}, 3), "made for a token file of 3 tokens");
  expect_error(mask_bytes(tokens, {1, 1, 1, 1}, -1, 0x1234), "made for other tokens");
  expect_error(mask_bytes(tokens, {1, 1, 8, 1}), "flags byte 0x08 of token 2");
  expect_error(mask_bytes(tokens, {1, 1, 1}), "header says 4 tokens but 3 bytes");
  expect_error("tiny", "shorter than the 1024-byte mask header");
  std::string other = mask_bytes(tokens, {1, 1, 1, 1});
  other[0] = 'X';
  expect_error(other, "not a mask file");
}

TEST(TokenWindows, StreamTargetsTheMaskLeavesOutAreMinusOne) {
  testing::TempDir dir;
  Corpus c;
  c.add({9, 9, 1, 2, 3}, 9);  // 9 = prompt
  c.add({9, 4, 5}, 9);
  const Written w = write_pair(dir, c);
  auto tokens = std::move(TokenFile::open(w.tokens, false)).value();
  auto mask = std::move(MaskFile::open(w.mask, tokens)).value();
  const TokenWindows windows = TokenWindows::stream(tokens, &mask, 3, 0, 2);
  std::vector<std::int32_t> in(3), tg(3), pos(3);
  ASSERT_TRUE(windows.fill(0, 16, in.data(), tg.data(), pos.data()).is_ok());
  EXPECT_EQ(in, (std::vector<std::int32_t>{9, 9, 1}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{-1, 1, 2}));
  EXPECT_EQ(pos, (std::vector<std::int32_t>{0, 1, 2}));
  ASSERT_TRUE(windows.fill(1, 16, in.data(), tg.data(), pos.data()).is_ok());
  EXPECT_EQ(in, (std::vector<std::int32_t>{2, 3, 9}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{3, -1, 4}));  // without packing documents run on
}

TEST(TokenWindows, PackedDocumentsRestartPositionsAndNeverPredictAcrossABoundary) {
  testing::TempDir dir;
  Corpus c;
  c.add({10, 11, 12});          // 3 tokens
  c.add({20, 21, 22, 23, 24});  // 5 tokens
  c.add({30, 31});              // 2 tokens
  const Written w = write_pair(dir, c);
  auto tokens = std::move(TokenFile::open(w.tokens, false)).value();
  auto mask = std::move(MaskFile::open(w.mask, tokens)).value();
  const std::vector<std::int64_t> starts = document_starts(mask);
  EXPECT_EQ(starts, (std::vector<std::int64_t>{0, 3, 8}));
  // seq_len 5: windows hold 6 tokens; best fit puts the 5-token document first, then the
  // 3-token one in a new window with the 2-token one after it.
  const TokenWindows windows = TokenWindows::packed(tokens, mask, 5, starts, 0, 3);
  ASSERT_EQ(windows.count(), 2);
  EXPECT_EQ(windows.stats().documents, 3);
  EXPECT_EQ(windows.stats().split_documents, 0);
  std::vector<std::int32_t> in(5), tg(5), pos(5);
  ASSERT_TRUE(windows.fill(0, 64, in.data(), tg.data(), pos.data()).is_ok());
  EXPECT_EQ(in, (std::vector<std::int32_t>{10, 11, 12, 30, 31}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{11, 12, -1, 31, -1}));
  EXPECT_EQ(pos, (std::vector<std::int32_t>{0, 1, 2, 0, 1}));
  ASSERT_TRUE(windows.fill(1, 64, in.data(), tg.data(), pos.data()).is_ok());
  EXPECT_EQ(in, (std::vector<std::int32_t>{20, 21, 22, 23, 24}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{21, 22, 23, 24, -1}));
  EXPECT_EQ(pos, (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
}

TEST(TokenWindows, PackedPaddingCountsNothingAndStartsItsOwnPositions) {
  testing::TempDir dir;
  Corpus c;
  c.add({5, 6, 7});
  const Written w = write_pair(dir, c);
  auto tokens = std::move(TokenFile::open(w.tokens, false)).value();
  auto mask = std::move(MaskFile::open(w.mask, tokens)).value();
  const auto starts = document_starts(mask);
  const TokenWindows windows = TokenWindows::packed(tokens, mask, 6, starts, 0, 1);
  ASSERT_EQ(windows.count(), 1);
  std::vector<std::int32_t> in(6), tg(6), pos(6);
  ASSERT_TRUE(windows.fill(0, 64, in.data(), tg.data(), pos.data()).is_ok());
  EXPECT_EQ(in, (std::vector<std::int32_t>{5, 6, 7, 0, 0, 0}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{6, 7, -1, -1, -1, -1}));
  EXPECT_EQ(pos, (std::vector<std::int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_NEAR(windows.fill_ratio(), 3.0 / 7.0, 1e-12);
}

TEST(TokenWindows, ALongDocumentIsCutIntoPiecesThatPredictEveryTokenOnce) {
  testing::TempDir dir;
  Corpus c;
  std::vector<std::int32_t> doc;
  for (std::int32_t i = 0; i < 11; ++i)
    doc.push_back(100 + i);
  c.add(doc);
  const Written w = write_pair(dir, c);
  auto tokens = std::move(TokenFile::open(w.tokens, false)).value();
  auto mask = std::move(MaskFile::open(w.mask, tokens)).value();
  const auto starts = document_starts(mask);
  const TokenWindows windows = TokenWindows::packed(tokens, mask, 4, starts, 0, 1);
  EXPECT_EQ(windows.stats().split_documents, 1);
  std::map<std::int32_t, int> predicted;
  std::vector<std::int32_t> in(4), tg(4), pos(4);
  for (std::int64_t k = 0; k < windows.count(); ++k) {
    ASSERT_TRUE(windows.fill(k, 256, in.data(), tg.data(), pos.data()).is_ok());
    EXPECT_EQ(pos[0], 0);
    for (std::int32_t t : tg) {
      if (t >= 0) ++predicted[t];
    }
  }
  ASSERT_EQ(predicted.size(), 10u);  // tokens 101..110, the first has nothing before it
  for (const auto& [token, times] : predicted)
    EXPECT_EQ(times, 1) << token;
}

TEST(TokenWindows, PiecesWithoutACountedTargetAreLeftOut) {
  testing::TempDir dir;
  Corpus c;
  c.add({9, 9, 9, 9}, 9);  // prompt only: nothing to learn
  c.add({1, 2, 3});
  const Written w = write_pair(dir, c);
  auto tokens = std::move(TokenFile::open(w.tokens, false)).value();
  auto mask = std::move(MaskFile::open(w.mask, tokens)).value();
  const auto starts = document_starts(mask);
  const TokenWindows windows = TokenWindows::packed(tokens, mask, 8, starts, 0, 2);
  EXPECT_EQ(windows.count(), 1);
  EXPECT_EQ(windows.stats().pieces_skipped, 1);
  std::vector<std::int32_t> in(8), tg(8), pos(8);
  ASSERT_TRUE(windows.fill(0, 16, in.data(), tg.data(), pos.data()).is_ok());
  EXPECT_EQ(in[0], 1);
}

config::DataConfig packed_config(const std::string& path, std::int64_t seq_len) {
  config::DataConfig c;
  c.source = config::DataSource::kTokens;
  c.path = path;
  c.seq_len = seq_len;
  c.packing = true;
  c.shuffle = false;
  c.val_fraction = 0.25;
  return c;
}

TEST(FileDataset, PackingHoldsOutWholeDocumentsAndMarksTheBatch) {
  testing::TempDir dir;
  Corpus c;
  for (std::int32_t d = 0; d < 8; ++d)
    c.add({40 + d, 1, 2, 3});
  const Written w = write_pair(dir, c);
  auto ds = make_dataset(packed_config(w.tokens, 7), 64, 1);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ((*ds)->train_samples(), 3);  // 6 documents of 4 tokens, two per 8-token window
  Batch b;
  b.resize(3, 7);
  ASSERT_TRUE((*ds)->next_train(b).is_ok());
  EXPECT_TRUE(b.packed);
  EXPECT_FALSE(b.plain());
  EXPECT_EQ(b.counted, 3 * 6);
  ASSERT_TRUE((*ds)->val_batch(0, b).is_ok());
  EXPECT_EQ(b.inputs[0], 46);  // the last two documents
  EXPECT_EQ(b.inputs[4], 47);
  EXPECT_NE((*ds)->describe().find("packed: 8 documents"), std::string::npos) << (*ds)->describe();
}

TEST(FileDataset, PackingWarnsOnceAboutDocumentsItCut) {
  testing::TempDir dir;
  Corpus c;
  c.add({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});  // longer than seq_len + 1 = 5
  c.add({1, 2, 3});
  const Written w = write_pair(dir, c);
  config::DataConfig cfg = packed_config(w.tokens, 4);
  cfg.val_fraction = 0;
  auto ds = std::move(make_dataset(cfg, 64, 1)).value();
  const std::vector<std::string> warnings = ds->warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("1 document(s) are longer than seq_len + 1 = 5 tokens"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find("--max-tokens"), std::string::npos);
}

TEST(FileDataset, AMaskedStreamCountsOnlyWhatTheMaskCounts) {
  testing::TempDir dir;
  Corpus c;
  for (int d = 0; d < 6; ++d)
    c.add({9, 9, 1, 2}, 9);
  const Written w = write_pair(dir, c);
  config::DataConfig cfg = packed_config(w.tokens, 4);
  cfg.packing = false;
  auto ds = std::move(make_dataset(cfg, 64, 1)).value();
  Batch b;
  b.resize(1, 4);
  ASSERT_TRUE(ds->next_train(b).is_ok());
  EXPECT_EQ(b.targets, (std::vector<std::int32_t>{-1, 1, 2, -1}));
  EXPECT_EQ(b.counted, 2);
  EXPECT_FALSE(b.packed);
}

TEST(FileDataset, PackingWithoutAMaskFileSaysHowToMakeOne) {
  testing::TempDir dir;
  const std::string tokens = dir.write_file("plain.bin", testing::llmc_file({1, 2, 3, 4, 5}));
  auto ds = make_dataset(packed_config(tokens, 2), 64, 1);
  ASSERT_FALSE(ds.is_ok());
  EXPECT_NE(ds.status().to_string().find("plain.mask.bin"), std::string::npos)
      << ds.status().to_string();
  EXPECT_NE(ds.status().to_string().find("tools/prepare_data.py"), std::string::npos);
}

TEST(FileDataset, AMismatchedMaskFileStopsTheRun) {
  testing::TempDir dir;
  Corpus c;
  c.add({1, 2, 3, 4, 5, 6});
  const Written w = write_pair(dir, c);
  dir.write_file("d.bin", testing::llmc_file({1, 2, 3, 4, 5, 7}));  // tokens changed after
  auto ds = make_dataset(packed_config(w.tokens, 2), 64, 1);
  ASSERT_FALSE(ds.is_ok());
  EXPECT_NE(ds.status().to_string().find("made for other tokens"), std::string::npos)
      << ds.status().to_string();
}

TEST(TokenFile, TextGivenAsTokensPointsToThePreparationTool) {
  testing::TempDir dir;
  const std::string text = dir.write_file(
      "notes.bin", "Strata trains models larger than GPU memory.\nÜber alles: naïve café.\n");
  auto file = TokenFile::open(text, false);
  ASSERT_FALSE(file.is_ok());
  EXPECT_NE(file.status().to_string().find("looks like text"), std::string::npos)
      << file.status().to_string();
  EXPECT_NE(file.status().to_string().find("tools/prepare_data.py"), std::string::npos);
  // Real uint16 tokens are not text: ids below 256 have a zero byte, larger ones rarely stay
  // printable for long.
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 64; ++i)
    ids.push_back((i * 7919) % 50257);
  std::string raw;
  for (std::int32_t t : ids)
    raw += std::string{static_cast<char>(t & 0xff), static_cast<char>(t >> 8)};
  EXPECT_TRUE(TokenFile::open(dir.write_file("ids.bin", raw), false).is_ok());
}

}  // namespace
}  // namespace strata::data

// Token files (llm.c uint16/uint32, headerless nanoGPT, text), the window split, seeded
// shuffling with exact resume, clear errors for bad files, and the synthetic Markov chain's
// exact entropy floor.
#include "data/dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "data/markov.h"
#include "data/token_file.h"
#include "support/run_strata.h"

namespace strata::data {
namespace {

std::string le32(std::uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::string llmc_file(const std::vector<std::uint32_t>& tokens, int version,
                      std::int64_t declared = -1) {
  std::string header = le32(kLlmcMagic) + le32(static_cast<std::uint32_t>(version)) +
                       le32(static_cast<std::uint32_t>(declared < 0 ? tokens.size() : declared));
  header.resize(kLlmcHeaderBytes, '\0');
  std::string body;
  for (std::uint32_t t : tokens) {
    body += version == 1 ? le32(t).substr(0, 2) : le32(t);
  }
  return header + body;
}

std::string nanogpt_file(const std::vector<std::uint32_t>& tokens) {
  std::string body;
  for (std::uint32_t t : tokens)
    body += le32(t).substr(0, 2);
  return body;
}

std::vector<std::uint32_t> ramp(std::uint32_t n, std::uint32_t mod) {
  std::vector<std::uint32_t> v(n);
  for (std::uint32_t i = 0; i < n; ++i)
    v[i] = i % mod;
  return v;
}

config::DataConfig tokens_config(const std::string& path, std::int64_t seq_len) {
  config::DataConfig c;
  c.source = config::DataSource::kTokens;
  c.path = path;
  c.seq_len = seq_len;
  c.val_fraction = 0.25;
  return c;
}

TEST(TokenFile, ReadsEveryFormat) {
  testing::TempDir dir;
  auto u16 = TokenFile::open(dir.write_file("a.bin", llmc_file({1, 65535, 7}, 1)), false);
  ASSERT_TRUE(u16.is_ok()) << u16.status().to_string();
  EXPECT_EQ(u16->format(), TokenFormat::kLlmcU16);
  EXPECT_EQ(u16->size(), 3);
  EXPECT_EQ(u16->at(1), 65535);
  EXPECT_EQ(u16->byte_offset(2), kLlmcHeaderBytes + 4);
  auto u32 = TokenFile::open(dir.write_file("b.bin", llmc_file({128000, 5}, 2)), false);
  ASSERT_TRUE(u32.is_ok());
  EXPECT_EQ(u32->format(), TokenFormat::kLlmcU32);
  EXPECT_EQ(u32->at(0), 128000);
  auto nano = TokenFile::open(dir.write_file("c.bin", nanogpt_file({3, 50256, 9, 9})), false);
  ASSERT_TRUE(nano.is_ok());
  EXPECT_EQ(nano->format(), TokenFormat::kNanoGptU16);
  EXPECT_EQ(nano->size(), 4);
  EXPECT_EQ(nano->at(1), 50256);
  auto text = TokenFile::open(dir.write_file("d.txt", "hi\xff"), true);
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(text->at(2), 255);
}

TEST(TokenFile, BadFilesAreClearErrors) {
  testing::TempDir dir;
  auto missing = TokenFile::open(dir.path() + "/nope.bin", false);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().to_string().find("nope.bin"), std::string::npos);
  auto empty = TokenFile::open(dir.write_file("e.bin", ""), false);
  EXPECT_NE(empty.status().to_string().find("empty"), std::string::npos);
  auto count = TokenFile::open(dir.write_file("f.bin", llmc_file({1, 2, 3}, 1, 5)), false);
  EXPECT_NE(count.status().to_string().find("header says 5 tokens"), std::string::npos)
      << count.status().to_string();
  auto version = TokenFile::open(dir.write_file("g.bin", llmc_file({1}, 3)), false);
  EXPECT_NE(version.status().to_string().find("version 3 is unknown"), std::string::npos);
  auto truncated = TokenFile::open(dir.write_file("h.bin", le32(kLlmcMagic) + "xxxx"), false);
  EXPECT_NE(truncated.status().to_string().find("less than the 1024-byte header"),
            std::string::npos);
  auto odd = TokenFile::open(dir.write_file("i.bin", "abc"), false);
  EXPECT_NE(odd.status().to_string().find("not a whole number of uint16 tokens"),
            std::string::npos);
}

TEST(FileDataset, WindowsShiftTargetsAndSplitOffValidation) {
  testing::TempDir dir;
  const std::string path = dir.write_file("t.bin", llmc_file(ramp(33, 1000), 1));
  config::DataConfig c = tokens_config(path, 4);  // 8 windows: 6 train, 2 validation
  c.shuffle = false;
  auto ds = make_dataset(c, 1000, 1);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ((*ds)->train_samples(), 6);
  Batch b;
  b.resize(2, 4);
  ASSERT_TRUE((*ds)->next_train(b).is_ok());
  EXPECT_EQ(b.inputs, (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b.targets, (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(b.positions, (std::vector<std::int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_TRUE(b.plain());
  ASSERT_TRUE((*ds)->val_batch(0, b).is_ok());
  EXPECT_EQ(b.inputs[0], 24);  // the held-out tail
  EXPECT_EQ(b.targets[7], 32);
}

TEST(FileDataset, ShuffleIsSeededAndResumesExactly) {
  testing::TempDir dir;
  const std::string path = dir.write_file("t.bin", nanogpt_file(ramp(4001, 500)));
  const config::DataConfig c = tokens_config(path, 10);
  auto a = std::move(make_dataset(c, 500, 42)).value();
  auto b = std::move(make_dataset(c, 500, 42)).value();
  auto other = std::move(make_dataset(c, 500, 43)).value();
  Batch ba, bb;
  ba.resize(3, 10);
  bb.resize(3, 10);
  // Run past an epoch boundary (300 training windows).
  for (int step = 0; step < 110; ++step) {
    ASSERT_TRUE(a->next_train(ba).is_ok());
    ASSERT_TRUE(b->next_train(bb).is_ok());
    ASSERT_EQ(ba.inputs, bb.inputs);
  }
  ASSERT_TRUE(other->next_train(bb).is_ok());
  const DataPosition saved = a->position();
  EXPECT_EQ(saved.epoch, 1);
  std::vector<std::vector<std::int32_t>> expected;
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(a->next_train(ba).is_ok());
    expected.push_back(ba.inputs);
  }
  auto resumed = std::move(make_dataset(c, 500, 42)).value();
  ASSERT_TRUE(resumed->seek(saved).is_ok());
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(resumed->next_train(bb).is_ok());
    EXPECT_EQ(bb.inputs, expected[step]);
  }
}

TEST(FileDataset, TooShortOutOfVocabularyAndMissingFilesAreErrors) {
  testing::TempDir dir;
  auto short_ds =
      make_dataset(tokens_config(dir.write_file("s.bin", nanogpt_file(ramp(5, 9))), 4), 50, 1);
  ASSERT_FALSE(short_ds.is_ok());
  EXPECT_NE(short_ds.status().to_string().find("too few"), std::string::npos)
      << short_ds.status().to_string();
  std::vector<std::uint32_t> tokens = ramp(40, 10);
  tokens[13] = 60000;
  config::DataConfig c = tokens_config(dir.write_file("v.bin", llmc_file(tokens, 1)), 4);
  c.shuffle = false;
  auto ds = std::move(make_dataset(c, 100, 1)).value();
  Batch b;
  b.resize(4, 4);
  Status s = ds->next_train(b);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("token id 60000 at byte offset 1050"), std::string::npos)
      << s.to_string();
  auto missing = make_dataset(tokens_config(dir.path() + "/none.bin", 4), 100, 1);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
}

TEST(MarkovChain, SuccessorsAreDistinctAndEveryStateHasKPredecessors) {
  const MarkovChain chain(97, 5, 123);
  std::map<std::int32_t, int> in_degree;
  for (std::int32_t s = 0; s < 97; ++s) {
    std::set<std::int32_t> succ;
    for (int j = 0; j < 5; ++j) {
      succ.insert(chain.successor(s, j));
      ++in_degree[chain.successor(s, j)];
    }
    EXPECT_EQ(succ.size(), 5u);
  }
  EXPECT_EQ(in_degree.size(), 97u);
  for (const auto& [state, degree] : in_degree)
    EXPECT_EQ(degree, 5) << state;
  EXPECT_DOUBLE_EQ(chain.entropy_nats(), std::log(5.0));
}

TEST(MarkovChain, EmpiricalConditionalEntropyMatchesTheFloor) {
  const MarkovChain chain(16, 3, 7);
  std::map<std::pair<std::int32_t, std::int32_t>, double> pair_count;
  std::map<std::int32_t, double> state_count;
  std::vector<std::int32_t> seq(257);
  for (std::uint64_t i = 0; i < 400; ++i) {
    chain.sequence(0, i, 257, seq.data());
    for (std::size_t t = 0; t + 1 < seq.size(); ++t) {
      pair_count[{seq[t], seq[t + 1]}] += 1;
      state_count[seq[t]] += 1;
    }
  }
  double total = 0, h = 0;
  for (const auto& [state, n] : state_count)
    total += n;
  for (const auto& [pair, n] : pair_count) {
    h -= (n / total) * std::log(n / state_count[pair.first]);
  }
  EXPECT_NEAR(h, std::log(3.0), 0.01);
  // Sequences are deterministic per (stream, index), and streams differ.
  std::vector<std::int32_t> a(50), b(50), c(50);
  chain.sequence(0, 5, 50, a.data());
  chain.sequence(0, 5, 50, b.data());
  chain.sequence(1, 5, 50, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(SyntheticDataset, ReportsItsFloorAndResumes) {
  config::DataConfig c;
  c.seq_len = 8;
  c.synthetic_vocab_size = 32;
  c.synthetic_branching = 4;
  auto ds = std::move(make_dataset(c, 64, 9)).value();
  ASSERT_TRUE(ds->entropy_floor().has_value());
  EXPECT_DOUBLE_EQ(*ds->entropy_floor(), std::log(4.0));
  Batch b, b2;
  b.resize(2, 8);
  b2.resize(2, 8);
  ASSERT_TRUE(ds->next_train(b).is_ok());
  EXPECT_TRUE(b.plain());
  for (int i = 0; i < 15; ++i) {
    if (i % 8 != 7) {
      EXPECT_EQ(b.targets[i], b.inputs[i + 1]);
    }
  }
  const DataPosition p = ds->position();
  ASSERT_TRUE(ds->next_train(b).is_ok());
  auto again = std::move(make_dataset(c, 64, 9)).value();
  ASSERT_TRUE(again->seek(p).is_ok());
  ASSERT_TRUE(again->next_train(b2).is_ok());
  EXPECT_EQ(b.inputs, b2.inputs);
  EXPECT_EQ(b.targets, b2.targets);
  c.synthetic_vocab_size = 100;
  EXPECT_EQ(make_dataset(c, 64, 9).status().code(), ErrorCode::kConfig);
}

}  // namespace
}  // namespace strata::data

// ParamStore (offload/param_store.h), the Python parameter offload's NVMe home, over the fault
// twin and over real files: round trips of odd sizes, direct and bounced buffers and the bytes a
// read may touch, units never written, failed writes, corruption, the budget, the folders' key,
// two threads at once, the counters and close().
#include "offload/param_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "common/units.h"
#include "io/sim/sim_engine.h"
#include "support/run_strata.h"

namespace strata::offload {
namespace {

using strata::testing::TempDir;

std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> v(bytes);
  for (auto& b : v)
    b = static_cast<std::uint8_t>(rng());
  return v;
}

// 4096-aligned memory of `bytes`, filled with `fill`.
struct Aligned {
  explicit Aligned(std::size_t bytes, std::uint8_t fill = 0) : size(bytes) {
    void* raw = nullptr;
    if (::posix_memalign(&raw, 4096, bytes) != 0) std::abort();
    data = static_cast<std::uint8_t*>(raw);
    std::memset(data, fill, bytes);
  }
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  std::uint8_t* data = nullptr;
  std::size_t size = 0;
};

class ParamStoreFixture : public ::testing::Test {
 protected:
  // twin: the fault twin (faults can be injected through sim_), else real files.
  ParamStoreSettings settings_for(bool twin) {
    ParamStoreSettings s;
    s.dirs = {dir_.path()};
    s.swap_tag = "test";
    s.engine.block_size_bytes = 64 * 1024;
    s.engine.threads = 2;
    s.engine.kind = twin ? io::EngineKind::kSim : io::EngineKind::kAuto;
    if (twin) {
      s.engine_factory = [this](const io::EngineOptions& o) {
        auto e = io::make_sim_engine(o, io::SimOptions{});
        if (e.is_ok()) sim_ = io::sim_control(e->get());
        return e;
      };
    }
    return s;
  }
  std::unique_ptr<ParamStore> make(const std::vector<std::uint64_t>& units, ParamStoreSettings s) {
    auto made = ParamStore::create(s, units);
    EXPECT_TRUE(made.is_ok()) << made.status().to_string();
    return made.is_ok() ? std::move(made).value() : nullptr;
  }

  TempDir dir_;
  io::SimControl* sim_ = nullptr;
};

// Every behaviour on both engines (parameter true: the fault twin).
class ParamStoreTest : public ParamStoreFixture, public ::testing::WithParamInterface<bool> {
 protected:
  ParamStoreSettings settings() { return settings_for(GetParam()); }
};

// Injected faults: the twin only.
class ParamStoreFaultTest : public ParamStoreFixture {
 protected:
  ParamStoreSettings settings() { return settings_for(true); }
};

TEST_P(ParamStoreTest, RoundTripsOddSizesDirectAndBounced) {
  const std::vector<std::uint64_t> sizes = {1, 3, 4095, 4096, 4097, 10001, 66666};
  auto store = make(sizes, settings());
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->units(), 7);
  EXPECT_EQ(store->alignment() % 4096, 0u);
  for (int u = 0; u < store->units(); ++u) {
    const std::size_t n = sizes[static_cast<std::size_t>(u)];
    EXPECT_EQ(store->unit_bytes(u), n);
    EXPECT_EQ(store->padded_bytes(u), align_up(n, store->alignment()));
    const std::vector<std::uint8_t> want = pattern(n, static_cast<std::uint32_t>(u));
    if (u % 2 == 0) {  // from a vector: bounced
      ASSERT_TRUE(store->write(u, want.data(), n).is_ok());
    } else {  // aligned, with room for the padding: direct
      Aligned src(store->padded_bytes(u), 0xEE);
      std::memcpy(src.data, want.data(), n);
      ASSERT_TRUE(store->write(u, src.data, src.size).is_ok());
    }
  }
  for (int u = 0; u < store->units(); ++u) {
    const std::size_t n = sizes[static_cast<std::size_t>(u)];
    const std::vector<std::uint8_t> want = pattern(n, static_cast<std::uint32_t>(u));
    // Room for the unit alone: nothing past it changes, even from an aligned buffer.
    Aligned tight(store->padded_bytes(u) + 4096, 0xAB);
    ASSERT_TRUE(store->read(u, tight.data, n).is_ok());
    EXPECT_EQ(std::memcmp(tight.data, want.data(), n), 0) << "unit " << u;
    for (std::size_t i = n; i < tight.size; ++i)
      ASSERT_EQ(tight.data[i], 0xAB) << "unit " << u << " byte " << i;
    // Unaligned, off by one byte.
    std::vector<std::uint8_t> off(n + 1, 0xCD);
    ASSERT_TRUE(store->read(u, off.data() + 1, n).is_ok());
    EXPECT_EQ(std::memcmp(off.data() + 1, want.data(), n), 0);
    EXPECT_EQ(off[0], 0xCD);
    // Aligned with room for the padding: direct, whatever lands in the padding.
    Aligned roomy(store->padded_bytes(u));
    ASSERT_TRUE(store->read(u, roomy.data, roomy.size).is_ok());
    EXPECT_EQ(std::memcmp(roomy.data, want.data(), n), 0);
  }
  const ParamStoreUsage use = store->usage();
  EXPECT_EQ(use.writes, 7u);
  EXPECT_EQ(use.reads, 21u);
  std::uint64_t sum = 0, padded = 0;
  for (int u = 0; u < store->units(); ++u) {
    sum += store->unit_bytes(u);
    padded += store->padded_bytes(u);
  }
  EXPECT_EQ(use.write_bytes, sum);
  EXPECT_EQ(use.read_bytes, 3 * sum);
  EXPECT_EQ(use.io_write_bytes, padded);
  EXPECT_EQ(use.io_read_bytes, 3 * padded);
  EXPECT_TRUE(use.checksums);
  EXPECT_EQ(use.nvme_bytes, padded + 7 * store->alignment());
  // Bounce buffers only for the calls that needed one, and reused: one thread, one buffer.
  EXPECT_EQ(use.bounce_buffers, 1u);
}

TEST_P(ParamStoreTest, DirectCallsNeedNoBounceBuffer) {
  auto store = make({4096, 8192}, settings());
  ASSERT_NE(store, nullptr);
  Aligned a(8192, 1);
  ASSERT_TRUE(store->write(0, a.data, 4096).is_ok());
  ASSERT_TRUE(store->write(1, a.data, 8192).is_ok());
  ASSERT_TRUE(store->read(1, a.data, 8192).is_ok());
  EXPECT_EQ(store->usage().bounce_buffers, 0u);
  ASSERT_TRUE(store->read(0, a.data + 1, 4096).is_ok());
  EXPECT_EQ(store->usage().bounce_buffers, 1u);
}

TEST_P(ParamStoreTest, AUnitNeverWrittenCannotBeRead) {
  auto store = make({100, 100}, settings());
  ASSERT_NE(store, nullptr);
  std::vector<std::uint8_t> out(100);
  Status s = store->read(1, out.data(), out.size());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.to_string().find("unit 1 was never written"), std::string::npos) << s.to_string();
}

TEST_P(ParamStoreTest, ArgumentErrorsNameTheArgument) {
  auto store = make({100}, settings());
  ASSERT_NE(store, nullptr);
  std::vector<std::uint8_t> buf(100);
  Status s = store->read(1, buf.data(), 100);
  EXPECT_EQ(s.context(), "unit");
  EXPECT_NE(s.message().find("valid: 0 to 0"), std::string::npos) << s.to_string();
  s = store->write(0, buf.data(), 99);
  EXPECT_EQ(s.context(), "src");
  EXPECT_NE(s.message().find("at least 100"), std::string::npos) << s.to_string();
  EXPECT_EQ(store->read(0, nullptr, 100).context(), "out");
  EXPECT_EQ(ParamStore::create(settings(), {}).status().context(), "unit_bytes");
  EXPECT_EQ(ParamStore::create(settings(), {5, 0}).status().context(), "unit_bytes");
}

TEST_P(ParamStoreTest, NoFoldersNamesTheKey) {
  ParamStoreSettings s = settings();
  s.dirs.clear();
  Status status = ParamStore::create(s, {100}).status();
  EXPECT_EQ(status.code(), ErrorCode::kConfig);
  EXPECT_EQ(status.context(), "zero_optimization.offload_param.nvme_path");
  s.dirs = {dir_.path() + "/missing/deeper"};
  status = ParamStore::create(s, {100}).status();
  EXPECT_FALSE(status.is_ok());
  EXPECT_NE(status.to_string().find("zero_optimization.offload_param.nvme_path"), std::string::npos)
      << status.to_string();
}

TEST_P(ParamStoreTest, TheBudgetNamesTheKeyAndTheBytesNeeded) {
  ParamStoreSettings s = settings();
  s.bytes_max = 3 * 8192;  // 3 units of 4096 + a checksum block each need 24576: fits
  ASSERT_NE(make({4096, 4096, 4000}, s), nullptr);
  Status status = ParamStore::create(s, {4096, 4096, 4097}).status();
  EXPECT_EQ(status.code(), ErrorCode::kConfig);
  EXPECT_EQ(status.context(), "strata.nvme_bytes_max");
  EXPECT_NE(status.message().find("28672 bytes"), std::string::npos) << status.to_string();
  s.checksum = false;  // no checksum blocks: fits
  auto store = make({4096, 4096, 4097}, s);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->nvme_bytes(), 4u * 4096);
}

TEST_P(ParamStoreTest, CorruptionOnDiskIsReportedWithTheUnitAndTheFile) {
  auto store = make({8192, 100}, settings());
  ASSERT_NE(store, nullptr);
  const auto a = pattern(8192, 1), b = pattern(100, 2);
  ASSERT_TRUE(store->write(0, a.data(), a.size()).is_ok());
  ASSERT_TRUE(store->write(1, b.data(), b.size()).is_ok());
  const std::string path = store->usage().dirs.at(0) + "/strata-param-r0.swp";
  const std::uint64_t offset = 4096 + 777;  // the header block, then unit 0
  if (GetParam()) {
    ASSERT_TRUE(sim_->corrupt_byte(path, offset).is_ok());
  } else {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    const int c = std::fgetc(f);
    ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    std::fputc(c ^ 0x5A, f);
    std::fclose(f);
  }
  std::vector<std::uint8_t> out(8192);
  Status s = store->read(0, out.data(), out.size());
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
  const std::string text = s.to_string();
  EXPECT_NE(text.find("read of parameter unit 0"), std::string::npos) << text;
  EXPECT_NE(text.find(path), std::string::npos) << text;
  EXPECT_NE(text.find("checksum mismatch"), std::string::npos) << text;
  EXPECT_TRUE(store->read(1, out.data(), 100).is_ok());
  EXPECT_EQ(store->usage().reads, 1u);
}

TEST_F(ParamStoreFaultTest, AFailedWriteLeavesTheUnitUnwritten) {
  auto store = make({5000}, settings());
  ASSERT_NE(store, nullptr);
  const auto a = pattern(5000, 1);
  ASSERT_TRUE(store->write(0, a.data(), a.size()).is_ok());
  io::SimFaults faults;
  faults.eio_rate = 1.0;
  sim_->set_faults(faults);
  Status s = store->write(0, a.data(), a.size());
  EXPECT_EQ(s.code(), ErrorCode::kIo);
  EXPECT_NE(s.to_string().find("write of parameter unit 0"), std::string::npos) << s.to_string();
  sim_->set_faults({});
  std::vector<std::uint8_t> out(5000);
  EXPECT_NE(store->read(0, out.data(), out.size()).to_string().find("never written"),
            std::string::npos);
  EXPECT_EQ(store->usage().writes, 1u);
}

TEST_P(ParamStoreTest, ThreadsReadAndWriteAtOnce) {
  constexpr int kUnits = 6, kRounds = 30;
  constexpr std::size_t kBytes = 3 * 4096 + 17;
  auto store = make(std::vector<std::uint64_t>(kUnits, kBytes), settings());
  ASSERT_NE(store, nullptr);
  auto version = [](int u, int v) {
    return pattern(kBytes, static_cast<std::uint32_t>(u * 1000 + v));
  };
  for (int u = 0; u < kUnits; ++u)
    ASSERT_TRUE(store->write(u, version(u, 0).data(), kBytes).is_ok());
  std::atomic<int> failures{0};
  std::thread writer([&] {
    for (int v = 1; v < kRounds; ++v) {
      for (int u = 0; u < kUnits / 2; ++u) {
        if (!store->write(u, version(u, v).data(), kBytes).is_ok()) ++failures;
      }
    }
  });
  auto reader = [&] {
    std::vector<std::uint8_t> out(kBytes);
    for (int v = 0; v < kRounds; ++v) {
      for (int u = 0; u < kUnits; ++u) {
        if (!store->read(u, out.data(), kBytes).is_ok()) {
          ++failures;
          continue;
        }
        bool whole = false;  // some version, whole
        for (int w = 0; w < (u < kUnits / 2 ? kRounds : 1) && !whole; ++w)
          whole = out == version(u, w);
        if (!whole) ++failures;
      }
    }
  };
  std::thread r1(reader), r2(reader);
  writer.join();
  r1.join();
  r2.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store->usage().reads, 2u * kRounds * kUnits);
}

TEST_P(ParamStoreTest, CloseRemovesTheFolderAndLaterCallsFail) {
  auto store = make({100}, settings());
  ASSERT_NE(store, nullptr);
  const std::string folder = store->usage().dirs.at(0);
  EXPECT_EQ(std::filesystem::path(folder).parent_path().string(), dir_.path());
  const auto a = pattern(100, 1);
  ASSERT_TRUE(store->write(0, a.data(), 100).is_ok());
  if (!GetParam()) {
    EXPECT_TRUE(std::filesystem::exists(folder + "/strata-param-r0.swp"));
  }
  ASSERT_TRUE(store->close().is_ok());
  EXPECT_TRUE(store->closed());
  EXPECT_FALSE(std::filesystem::exists(folder));
  std::vector<std::uint8_t> out(100);
  EXPECT_NE(store->read(0, out.data(), 100).to_string().find("closed"), std::string::npos);
  EXPECT_NE(store->write(0, a.data(), 100).to_string().find("closed"), std::string::npos);
  EXPECT_TRUE(store->close().is_ok());
}

INSTANTIATE_TEST_SUITE_P(Engines, ParamStoreTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "sim" : "real");
                         });

}  // namespace
}  // namespace strata::offload

// The parameters-kept-apart fast path's start-up check (backend/apart_check.h) on the CPU
// backend, whose ops read every parameter where its pointer says: a path that widens the ranges
// into the copy when noting them (what a backend without the path does) passes; one that says yes
// but leaves the copy as it is (the ops then read its NaN), one that widens a range one element
// off, and one that refuses all fail, each naming what went wrong. FastPaths then lists the path
// off with one warning naming it.
#include "backend/apart_check.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/fast_path.h"
#include "support/cpu_backend_support.h"

namespace strata::backend {
namespace {

enum class Fault { kNone, kLeftInCopy, kOneOff, kRefused };

// Notes by copying each range apart into the copy (a CPU backend's memory is the host's).
KeptApartPath path(Fault fault, int* forgotten) {
  KeptApartPath p;
  p.note = [fault](const float* wide, const float* apart, const std::int64_t* begin,
                   const std::int64_t* n, const std::int64_t* at, int count) {
    if (fault == Fault::kRefused) return false;
    if (fault == Fault::kLeftInCopy) return true;
    auto* copy = const_cast<float*>(wide);
    for (int i = 0; i < count; ++i) {
      const std::int64_t shift = fault == Fault::kOneOff && i == count - 1 ? 1 : 0;
      for (std::int64_t j = 0; j + shift < n[i]; ++j)
        copy[begin[i] + j] = apart[at[i] + j + shift];
    }
    return true;
  };
  p.forget = [forgotten](const float*) { ++*forgotten; };
  return p;
}

TEST(KeptApartCheck, ReadingTheValuesWidenedGivesTheBitsAndPasses) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  int forgotten = 0;
  const Status s = check_kept_apart(*backend, path(Fault::kNone, &forgotten));
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(forgotten, 1);
}

TEST(KeptApartCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {{Fault::kLeftInCopy,
                "LayerNorm over 3 rows of 40 channels, its parameters kept "
                "apart: output[0] is nan"},
               {Fault::kOneOff, "a product with a bias"},
               {Fault::kRefused, "refused to keep the parameters apart"}};
  for (const auto& c : cases) {
    int forgotten = 0;
    const Status s = check_kept_apart(*backend, path(c.fault, &forgotten));
    ASSERT_FALSE(s.is_ok()) << c.expect;
    EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
  }
}

TEST(KeptApartCheck, AFailingPathIsListedOffWithOneWarning) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  std::vector<std::string> warnings;
  FastPaths paths([&](const std::string& m) { warnings.push_back(m); });
  int forgotten = 0;
  const bool on = paths.adopt(kKeptApartName, kKeptApartReplaces, "apart", [&] {
    return check_kept_apart(*backend, path(Fault::kLeftInCopy, &forgotten));
  });
  EXPECT_FALSE(on);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("fast path params_kept_apart is off"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find(kKeptApartReplaces), std::string::npos);
}

}  // namespace
}  // namespace strata::backend

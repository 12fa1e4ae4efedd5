// rank_state_support.h for gtest tests: the same helpers, failing the calling test on error.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "tests/train/rank_state_support.h"

namespace strata::testing {
inline std::unique_ptr<RankState> checked_rank_state(const std::string& family, int stage, int rank,
                                                     int world,
                                                     const std::string& optimizer = "none",
                                                     const std::string& nvme = "/tmp") {
  auto r = testing::make_rank_state(family, stage, rank, world, optimizer, nvme);
  if (!r.is_ok()) {
    std::fprintf(stderr, "cannot build rank %d of %d: %s\n", rank, world,
                 r.status().to_string().c_str());
    std::abort();
  }
  return std::move(*r);
}

inline void checked_fill_known(RankState& r, int salt = 0) {
  Status s = testing::fill_known(r, salt);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

inline std::int64_t checked_count_unknown(RankState& r, int salt = 0) {
  auto n = testing::count_unknown(r, salt);
  EXPECT_TRUE(n.is_ok()) << n.status().to_string();
  return n.is_ok() ? *n : -1;
}

}  // namespace strata::testing

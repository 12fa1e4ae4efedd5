// The console's progress interval: Strata's own (strata.print_every_steps), about 20 lines per
// run when left at 0, so a Trainer template's steps_per_print: 2000 cannot silence a short run.
#include "train/breakdown.h"

#include <gtest/gtest.h>

namespace strata::train {
namespace {

std::int64_t interval(std::int64_t steps, std::int64_t every) {
  config::Config c;
  c.strata.train_steps = steps;
  c.strata.print_every_steps = every;
  return print_interval(c);
}

TEST(PrintInterval, AutoGivesAboutTwentyLinesPerRun) {
  EXPECT_EQ(interval(30, 0), 1);
  EXPECT_EQ(interval(5, 0), 1);
  EXPECT_EQ(interval(200, 0), 10);
  EXPECT_EQ(interval(1'000'000, 0), 100);  // at least one line every 100 steps
}

TEST(PrintInterval, AGivenIntervalIsKept) {
  EXPECT_EQ(interval(30, 7), 7);
  EXPECT_EQ(interval(30, 1000), 1000);
}

}  // namespace
}  // namespace strata::train

#include <gtest/gtest.h>

#include "support/run_strata.h"

namespace strata {
namespace {

using testing::run_strata;

TEST(Cli, VersionPrintsVersionAndExitsZero) {
  auto r = run_strata({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("strata "), std::string::npos) << r.out;
}

TEST(Cli, NoCommandIsAUsageError) {
  auto r = run_strata({});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(Cli, UnknownCommandIsAUsageError) {
  auto r = run_strata({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("frobnicate"), std::string::npos) << r.err;
}

TEST(Cli, HelpListsCommandsAndExitsZero) {
  auto r = run_strata({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* command : {"config", "report", "estimate", "bench"}) {
    EXPECT_NE(r.out.find(command), std::string::npos) << command << " missing from\n" << r.out;
  }
}

TEST(Cli, EveryCommandHasHelp) {
  for (std::vector<std::string> command :
       {std::vector<std::string>{"config", "check"}, {"report"}, {"estimate"}, {"bench"}}) {
    command.push_back("--help");
    auto r = run_strata(command);
    EXPECT_EQ(r.exit_code, 0) << command[0] << ": " << r.err;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << command[0] << ":\n" << r.out;
  }
}

}  // namespace
}  // namespace strata

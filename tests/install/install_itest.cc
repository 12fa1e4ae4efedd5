// `cmake --install` puts libstrata, the strata program and a CMake package in a prefix, and a
// separate project builds against it with find_package(Strata).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "support/run_strata.h"

namespace strata {
namespace {

// Runs a shell command, returning its exit status and appending its output to `log`.
int shell(const std::string& command, std::string* log) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr)
    *log += buffer;
  int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Install, ConsumerBuildsAgainstInstalledPackage) {
  testing::TempDir dir;
  const std::string build_dir = std::filesystem::path(STRATA_BINARY).parent_path().string();
  const std::string prefix = dir.path() + "/prefix";
  std::string log;
  ASSERT_EQ(shell("cmake --install '" + build_dir + "' --prefix '" + prefix + "'", &log), 0) << log;
  EXPECT_TRUE(std::filesystem::exists(prefix + "/bin/strata"));
  EXPECT_TRUE(std::filesystem::exists(prefix + "/lib/libstrata.a"));
  EXPECT_TRUE(std::filesystem::exists(prefix + "/lib/cmake/Strata/StrataConfig.cmake"));
  EXPECT_TRUE(std::filesystem::exists(prefix + "/include/strata/config/config.h"));

  const std::string consumer_build = dir.path() + "/consumer";
  ASSERT_EQ(shell("cmake -S '" + testing::source_path("tests/install/consumer") + "' -B '" +
                      consumer_build + "' -DCMAKE_PREFIX_PATH='" + prefix +
                      "' -DCMAKE_BUILD_TYPE=Release",
                  &log),
            0)
      << log;
  ASSERT_EQ(shell("cmake --build '" + consumer_build + "' --parallel 2", &log), 0) << log;
  std::string out;
  ASSERT_EQ(shell("'" + consumer_build + "/consumer'", &out), 0) << out;
  EXPECT_NE(out.find("micro_batch=4"), std::string::npos) << out;

  std::string version;
  ASSERT_EQ(shell("'" + prefix + "/bin/strata' --version", &version), 0) << version;
  EXPECT_NE(version.find("strata "), std::string::npos);
}

}  // namespace
}  // namespace strata

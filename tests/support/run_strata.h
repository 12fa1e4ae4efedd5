// Runs the built `strata` program from a test and captures what it printed and its exit code.
#pragma once

#include <json/value.h>
#include <spawn.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace strata::testing {

struct RunOutput {
  int exit_code = -1;  // the program's exit status; 128+N when killed by signal N
  std::string out;     // standard output
  std::string err;     // standard error
};

// Runs STRATA_BINARY with `args` (no shell involved), standard input closed, optional extra
// environment entries ("NAME=value"). Times out (and fails the calling test) after
// `timeout_s` seconds.
RunOutput run_strata(const std::vector<std::string>& args,
                     const std::vector<std::string>& extra_env = {}, int timeout_s = 120);

// The same for any program (an absolute path), e.g. mpirun.
RunOutput run_program(const std::string& program, const std::vector<std::string>& args,
                      const std::vector<std::string>& extra_env = {}, int timeout_s = 120);

// Starts `program` (an absolute path) with `args` and this process's environment plus
// `extra_env`, its standard streams set up by `actions`; returns its pid, or -1 after failing the
// calling test with posix_spawn's reason.
pid_t spawn_program(const std::string& program, const std::vector<std::string>& args,
                    const std::vector<std::string>& extra_env,
                    const posix_spawn_file_actions_t& actions);

// A fresh, empty temporary directory for one test, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `content` to path()/name and returns the full path.
  std::string write_file(const std::string& name, const std::string& content) const;

 private:
  std::string path_;
};

// The repository file at `relative` (e.g. "configs/demo.json"), as an absolute path.
std::string source_path(const std::string& relative);

// Parses JSON text (a command's output); fails the calling test, showing the text, if it is not
// valid JSON.
Json::Value parse_json(const std::string& text);

// Reads a whole file; fails the calling test if it cannot.
std::string read_file(const std::string& path);

}  // namespace strata::testing

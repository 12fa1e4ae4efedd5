// Fast paths: a faster way to run an op (a kernel of our own, a library call, a fused epilogue)
// beside the verified way it replaces. A backend adopts one only after it has checked itself on
// small shapes when the backend starts; one that fails its check, is refused by the device or the
// library, or does not apply to this run is listed as off with the reason, and the verified path
// runs instead. Each one that fails logs one warning naming it and the reason; every one is listed,
// on or off, in `strata report` and `strata bench step --json` (Backend::fast_paths()).
//
// Test seam: STRATA_TEST_FAST_PATH_FAIL=NAME makes every fast path whose name contains NAME fail
// its check as if it had found a mismatch (NAME,NAME2,...: any of them), so that a machine with the
// device shows the fallback (tools/gpu_checks.sh). fail_fast_path_for_test() does the same from a
// test.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace Json {
class Value;
}

namespace strata::backend {

struct FastPath {
  std::string name;      // "flash_attention"
  std::string replaces;  // the verified path that runs when this one is off
  bool active = false;
  // Active: what it covers ("head sizes 64, 80, 96, 128, 256; bf16"). Off: why ("its check
  // failed: ..." / "not applicable: ...").
  std::string detail;
  // Calls that took it since the backend started, and calls of the op that took the verified path
  // instead (a shape it does not cover); -1 where the backend does not count them.
  std::int64_t uses = -1;
  std::int64_t declined = -1;
};

class FastPaths {
 public:
  using Warn = std::function<void(const std::string&)>;
  // `warn` receives each warning (default: the log's warning level).
  explicit FastPaths(Warn warn = {});

  // Runs `check` and adopts the path when it returns ok: listed active with `covers`. Otherwise
  // listed off with the check's error, and one warning "fast path NAME is off: REASON; REPLACES
  // runs instead". Returns whether the path is on.
  bool adopt(const std::string& name, const std::string& replaces, const std::string& covers,
             const std::function<Status()>& check);
  // Lists a path that does not apply to this run (no check runs, no warning): `reason` says why.
  void not_applicable(const std::string& name, const std::string& replaces,
                      const std::string& reason);
  // Turns an adopted path off later (a call it refused at run time), with one warning.
  void disable(const std::string& name, const std::string& reason);

  // A warning about a path that stays on (part of what it covers failed its check).
  void warn(const std::string& message) const { warn_(message); }

  const std::vector<FastPath>& list() const { return paths_; }
  bool active(const std::string& name) const;

 private:
  FastPath* find(const std::string& name);
  void warn_off(const FastPath& path);

  Warn warn_;
  std::vector<FastPath> paths_;
};

// [{"name", "active", "replaces", "detail", "uses", "declined"}, ...] ("uses" and "declined" where
// counted)
Json::Value fast_paths_json(const std::vector<FastPath>& paths);
// One line per path: "  flash_attention: on (head sizes ...)" / "  NAME: off: REASON; REPLACES".
std::string fast_paths_text(const std::vector<FastPath>& paths);

// Makes fast paths whose name contains `name_contains` (or one of its comma-separated parts) fail
// their check (nullopt: none); the
// STRATA_TEST_FAST_PATH_FAIL variable does the same for a whole process.
void fail_fast_path_for_test(std::optional<std::string> name_contains);

}  // namespace strata::backend

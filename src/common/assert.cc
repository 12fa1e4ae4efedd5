#include "common/assert.h"

#include <cstdio>
#include <cstdlib>

namespace strata::detail {

void assert_fail(const char* expr, const char* file, int line, const char* func,
                 const char* message) {
  std::fprintf(stderr, "strata: internal assertion failed: %s\n  at %s:%d in %s()\n%s%s%s", expr,
               file, line, func, message ? "  " : "", message ? message : "", message ? "\n" : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace strata::detail

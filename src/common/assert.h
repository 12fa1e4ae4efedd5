// Always-on assertions for programmer errors (never for results from the OS, CUDA or NCCL:
// those are checked and turned into Status values).
#pragma once

namespace strata::detail {
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const char* func,
                              const char* message);
}  // namespace strata::detail

#define STRATA_ASSERT(cond)                                                        \
  do {                                                                             \
    if (!(cond)) [[unlikely]] {                                                    \
      ::strata::detail::assert_fail(#cond, __FILE__, __LINE__, __func__, nullptr); \
    }                                                                              \
  } while (0)

#define STRATA_ASSERT_MSG(cond, message)                                             \
  do {                                                                               \
    if (!(cond)) [[unlikely]] {                                                      \
      ::strata::detail::assert_fail(#cond, __FILE__, __LINE__, __func__, (message)); \
    }                                                                                \
  } while (0)

// Deterministic parallel loops for the CPU kernels. The split of [0, n) into chunks depends only
// on n and the grain, never on the thread count or on which thread runs a chunk, so a kernel that
// combines per-chunk results in chunk order is bit-identical with 1 or 64 threads.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cstdint>

namespace strata::kernels {

// Calls fn(begin, end) for the chunks [c*grain, min(n, (c+1)*grain)), in parallel on oneTBB.
template <typename Fn>
void parallel_chunks(std::int64_t n, std::int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1) {
    fn(std::int64_t{0}, n);
    return;
  }
  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, chunks, 1),
      [&](const tbb::blocked_range<std::int64_t>& range) {
        for (std::int64_t c = range.begin(); c < range.end(); ++c) {
          fn(c * grain, std::min(n, (c + 1) * grain));
        }
      },
      tbb::simple_partitioner());
}

// Rows per chunk so that a chunk holds at least `elements` elements of `cols` columns.
inline std::int64_t rows_grain(std::int64_t cols, std::int64_t elements = 16384) {
  return std::max<std::int64_t>(1, elements / std::max<std::int64_t>(cols, 1));
}

}  // namespace strata::kernels

// SwapSpace: the nvme tier's on-disk home. One preallocated file per state kind per rank, striped
// RAID-0 style over the configured directories (nvme_path), handing out aligned extents from a
// fixed offset map. Optionally every extent carries an xxHash3 checksum, written with the data
// in a footer block and verified on read, so corrupted state is reported and never trained on.
//
// On disk, for each directory D:
//   D/strata-swap-u<uid>-<tag>/           0700, one per run (tag: the run's name, or its pid)
//       strata-swap.lock                  0600, flock()ed by the live run; says who made it
//       strata-<kind>-r<rank>.swp         0600, header block "STRATA-SWAP v1 ..." then data
// A run removes its folder at normal exit; a later run removes folders of this user that no
// live run holds locked (a crashed run's), and only the files in them that Strata made.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/engine.h"

namespace strata::io {

struct SwapKind {
  std::string name;                  // [a-z0-9_]{1,32}, e.g. "master", "exp_avg"
  std::uint64_t capacity_bytes = 0;  // data plus one footer block per extent with checksums
};

struct SwapOptions {
  std::vector<std::string> dirs;  // nvme_path(s); 1..kStripesMax distinct directories
  std::string tag;                // names the run's folder; "" = "p<pid>"
  std::int32_t rank = 0;
  std::vector<SwapKind> kinds;
  std::uint64_t stripe_bytes = 0;     // 0 = the engine's block size
  bool checksums = true;              // xxHash3 footer per extent
  std::uint32_t operations_max = 64;  // reads/writes outstanding at once
};

struct Extent {
  std::uint32_t kind = 0;
  std::uint64_t offset_bytes = 0;  // in the kind's logical file, aligned
  std::uint64_t length_bytes = 0;  // data bytes, a multiple of the alignment
};

struct SwapHandle {
  std::uint32_t slot = UINT32_MAX;
  std::uint32_t generation = 0;
  bool valid() const { return slot != UINT32_MAX; }
};

struct StaleCleanup {
  std::vector<std::string> removed_dirs;  // stale run folders removed
  std::vector<std::string> live_dirs;     // held by a live run: left alone
  std::vector<std::string> kept;          // not provably Strata's: left alone, with the reason
  std::uint64_t freed_bytes = 0;
};

// Removes the run folders of user `uid` in `dirs` that no live run holds, and in them only the
// files Strata made (name, owner and header all match). Never follows symlinks.
StaleCleanup clean_stale_swap(const std::vector<std::string>& dirs, std::uint32_t uid);

class SwapSpace {
 public:
  // Cleans stale folders, checks free space against what the files need (kNoSpace with the
  // numbers), creates the run folders, lock and files. `engine` outlives the SwapSpace.
  static Result<std::unique_ptr<SwapSpace>> create(IoEngine* engine, const SwapOptions& options);
  // Removes the files and folders (close() without the report).
  ~SwapSpace();
  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;

  // Bytes of a kind's capacity that an extent of `length_bytes` uses.
  std::uint64_t footprint_bytes(std::uint64_t length_bytes) const;
  // Alignment of extents, buffers and lengths (the strictest of the files').
  std::uint32_t alignment_bytes() const;
  // The run folder in each directory.
  const std::vector<std::string>& run_dirs() const;
  // The backing files of `kind`, one per directory.
  std::vector<std::string> kind_paths(std::uint32_t kind) const;

  // An extent of `length_bytes` (rounded up to the alignment) in `kind`'s file; kNoSpace when
  // the kind's capacity has no gap that large.
  Result<Extent> allocate(std::uint32_t kind, std::uint64_t length_bytes);
  // Gives an extent back; no read or write on it may be outstanding.
  Status release(const Extent& extent);

  // Writes `data` (extent.length_bytes, aligned) to the extent, with its checksum footer.
  Result<SwapHandle> write(const Extent& extent, const void* data,
                           Priority priority = Priority::kPrefetch);
  // Reads the extent into `data`; wait() verifies the checksum.
  Result<SwapHandle> read(const Extent& extent, void* data,
                          Priority priority = Priority::kPrefetch);
  // Blocks until the operation is over; for reads with checksums, kCorrupt naming the extent
  // when the data does not match. Consumes the handle.
  Status wait(SwapHandle handle);
  // The result if the operation is over (consuming the handle), else nullopt.
  std::optional<Status> poll(SwapHandle handle);

  // Closes and removes the files and run folders; reports the first failure.
  Status close();

  struct Impl;

 private:
  explicit SwapSpace(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::io

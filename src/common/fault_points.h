// Test seams for the failures a test cannot otherwise make on demand (tests/ and
// docs/reliability.md use them; a normal run never sets them and pays one relaxed atomic load per
// call):
//   - crash points: STRATA_TEST_CRASH_POINT=N kills the process with SIGKILL at the N-th crash
//     point it reaches (1-based), =NAME:N at the N-th point whose name contains NAME, and =trace
//     prints every point it passes ("strata: crash point 7: checkpoint.rename_dir") and goes on.
//     The durable writers (durable_file.h) pass one before and after each write, fsync and
//     rename, so a test can stop a checkpoint write at every step of it;
//   - file faults: set_file_fault() makes the durable writers fail on a file whose path contains
//     a string, as the kernel would (ENOSPC or EIO after some bytes, or at fsync or rename).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace strata {

// Counts a crash point and kills the process (SIGKILL) when STRATA_TEST_CRASH_POINT says so.
// `name` is a string literal ("checkpoint.fsync").
void crash_point(const char* name);

enum class FileOp : std::uint8_t { kWrite, kSync, kRename };

struct FileFault {
  std::string path_contains;  // the fault applies to files whose path contains this
  FileOp op = FileOp::kWrite;
  int error = 28;                 // errno to report (28 = ENOSPC, 5 = EIO)
  std::uint64_t after_bytes = 0;  // kWrite: bytes of the file written before the fault
};

// Installs (or with nullopt removes) the one file fault of this process. For tests.
void set_file_fault(std::optional<FileFault> fault);

// The errno the fault asks `op` on `path` to fail with, or 0. For kWrite, `offset` and `bytes`
// say which bytes the write covers; `*allowed` gets how many of them may be written first.
int injected_file_error(FileOp op, const std::string& path, std::uint64_t offset = 0,
                        std::uint64_t bytes = 0, std::uint64_t* allowed = nullptr);

}  // namespace strata

// Test seams for the failures a test cannot otherwise make on demand (tests/ and
// docs/reliability.md use them; a normal run never sets them and pays one relaxed atomic load per
// call):
//   - crash points: STRATA_TEST_CRASH_POINT=N kills the process with SIGKILL at the N-th crash
//     point it reaches (1-based), =NAME:N at the N-th point whose name contains NAME, and =trace
//     prints every point it passes ("strata: crash point 7: checkpoint.rename_dir") and goes on.
//     The durable writers (durable_file.h) pass one before and after each write, fsync and
//     rename, so a test can stop a checkpoint write at every step of it;
//   - file faults: set_file_fault() makes the durable writers fail on a file whose path contains
//     a string, as the kernel would (ENOSPC or EIO after some bytes, or at fsync or rename);
//   - I/O faults: STRATA_TEST_IO_FAULT=TEXT:N:ERRNO[:read|:write] makes the N-th operation
//     (1-based; only reads or only writes count when the last field says so) of the I/O engines
//     on a file whose path contains TEXT fail with ERRNO (a number or a name: ENOSPC, EIO, ...),
//     as the drive would; set_io_fault() does the same from a test, counting from the call. Every
//     engine (uring, posix, the twin) passes each result through QueueEngine::account, which asks
//     injected_io_error();
//   - swap corruption: STRATA_TEST_SWAP_CORRUPT=KIND:N flips a bit of the stored checksum of the
//     N-th extent written to swap kind KIND (param, master, exp_avg, exp_avg_sq, grad), so reading
//     it back fails with "checksum mismatch" exactly as a flipped data byte would (the data in
//     memory stays right); set_swap_corrupt() does the same from a test, counting from the call;
//   - io_uring calls: set_uring_fault() makes the next io_uring_submit / io_uring_wait_cqe calls
//     of the uring engine fail with an errno (io/uring/uring_engine.cc);
//   - stream jitter: STRATA_TEST_STREAM_JITTER=SEED makes every CPU backend created afterwards run
//     its compute stream on a thread of its own and delay each command of each stream by a random
//     amount drawn from SEED (backend/cpu/cpu_backend.h), so that a missing record or wait changes
//     results; set_stream_jitter() does the same from a test;
//   - planted races: STRATA_TEST_PLANT_RACE=NAME (or set_planted_race()) removes the one stream
//     wait the engine code names NAME (planted_race("grad.d2h_waits_for_compute")), so a test can
//     show that the jitter mode catches a missing wait;
//   - barriers: STRATA_TEST_BARRIER=NAME:DIR makes the process stop at the barrier point whose
//     name contains NAME until a test releases it (test_barrier() says how), so that a test can
//     start two processes at the same instant of their start-up rather than after a sleep;
//   - no flock: STRATA_TEST_NO_FLOCK=1 (or set_flock_disabled()) makes the directory locks
//     (dir_lock.h) behave as on a file system where flock does not work;
//   - poisoned weights: STRATA_TEST_POISON_WEIGHTS=1 (or set_poison_weights()) makes the offload
//     store fill what it leaves out of a unit's fp32 compute copy with NaN: the weights (the GEMMs
//     read them in 16 bits, Ops::note_widened_weights_only) and, kept apart, the norm weights and
//     biases (Ops::note_kept_apart), so any fp32 read of them shows.
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

struct IoFault {
  std::string path_contains;  // the fault applies to operations on files whose path contains this
  std::uint64_t nth = 1;      // the N-th such operation (1-based) fails; later ones succeed
  int error = 5;              // errno to report (5 = EIO, 28 = ENOSPC)
  bool reads = true;          // reads count
  bool writes = true;         // writes count
};

// Installs (or with nullopt removes) the one I/O fault of this process, replacing one read from
// STRATA_TEST_IO_FAULT; its operation count starts at zero. For tests.
void set_io_fault(std::optional<IoFault> fault);

// Whether an I/O fault is installed (one relaxed load: the engines ask before naming the file).
bool io_fault_armed();

// Counts one engine operation (a write when `write`) on `path`; returns the errno it must fail
// with, or 0.
int injected_io_error(const std::string& path, bool write);

// Operations counted against the installed I/O fault so far (tests use it to place a fault).
std::uint64_t io_fault_operations();

struct SwapCorruption {
  std::string kind;       // swap kind name: "param", "master", "exp_avg", ...
  std::uint64_t nth = 1;  // the N-th extent written to that kind (1-based) is corrupted
};

// Installs (or with nullopt removes) the swap corruption of this process, replacing one read from
// STRATA_TEST_SWAP_CORRUPT; its write count starts at zero. For tests.
void set_swap_corruption(std::optional<SwapCorruption> corruption);

// Counts one extent written to swap kind `kind`; true when it is the one to corrupt.
bool swap_write_corrupts(const std::string& kind);

// Extents counted against the installed swap corruption so far.
std::uint64_t swap_corruption_writes();

enum class UringCall : std::uint8_t { kSubmit, kWaitCqe };

// Makes the next `count` calls of `call` in the uring engine fail with `error` (a positive errno)
// before reaching the kernel; count 0 removes the fault. For tests.
void set_uring_fault(UringCall call, int error, std::uint32_t count);

// The errno the next `call` must fail with (consuming one of its count), or 0.
int injected_uring_error(UringCall call);

// The stream-jitter seed new CPU backends take (nullopt: jitter off). From
// STRATA_TEST_STREAM_JITTER at start-up (a decimal seed), or set_stream_jitter().
std::optional<std::uint64_t> stream_jitter_seed();
// Installs (or with nullopt removes) the stream-jitter seed of this process. For tests.
void set_stream_jitter(std::optional<std::uint64_t> seed);

// Whether the wait named `name` is planted out (STRATA_TEST_PLANT_RACE or set_planted_race()).
// One relaxed load when nothing is planted.
bool planted_race(const char* name);
// Plants (or with an empty name removes) the one missing wait of this process. For tests.
void set_planted_race(const std::string& name);

// Stops at a barrier point when STRATA_TEST_BARRIER=NAME:DIR names it: the process opens the
// FIFO DIR/go (read and write, so that it never sees end-of-file), writes its pid and a newline to
// the FIFO DIR/arrive (which the test holds open for reading), and waits until it can read one
// byte from DIR/go. A test that has seen N arrivals writes N bytes to DIR/go and so releases them
// all at once. Never waits more than 120 s; a failure is printed and the process goes on.
void test_barrier(const char* name);

// Whether the directory locks must act as if flock did not work (STRATA_TEST_NO_FLOCK=1 or
// set_flock_disabled()).
bool flock_disabled_for_test();
void set_flock_disabled(bool disabled);

// Whether what is left out of an fp32 compute copy (weights; kept apart, the rest) is filled with
// NaN
// (STRATA_TEST_POISON_WEIGHTS=1 or set_poison_weights()).
bool poison_weights_for_test();
void set_poison_weights(bool poison);

}  // namespace strata

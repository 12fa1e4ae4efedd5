// The asynchronous I/O engine: moves bytes between host buffers and files (NVMe) with a fixed
// number of requests in flight, each request with its own completion handle.
//
// One interface, three implementations behind it: io_uring (io/uring/), a pread/pwrite thread
// pool used where io_uring is unavailable (io/posix/), and a seeded in-memory twin that injects
// faults for tests (io/sim/). make_engine() picks one. docs/io.md explains the design.
//
// Contract shared by every implementation:
// - Buffer addresses, file offsets and lengths are multiples of the file's alignment
//   (FileInfo::alignment_bytes, at least 4096); anything else is rejected at submit().
// - A request is cut into pieces of at most block_size bytes (never crossing a stripe); up to
//   queue_depth pieces per I/O thread are in flight. Queued demand pieces go before queued
//   prefetch pieces; pieces already in flight are not pre-empted.
// - Short transfers are resubmitted for the remainder, EINTR/EAGAIN retried; any other failure
//   completes the request with an error naming the file, offset, length and errno text.
// - Every handle returned by submit() is consumed exactly once by wait(), or by poll() /
//   wait_for() when they return a completion. All maximums are fixed by EngineOptions; submit()
//   does not allocate.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::io {

enum class EngineKind { kAuto, kUring, kPosix, kSim };
const char* engine_kind_name(EngineKind kind);  // "auto", "uring", "posix", "sim"
std::optional<EngineKind> parse_engine_kind(std::string_view text);

// Whether files are opened with O_DIRECT. kAuto falls back to buffered I/O (one warning per
// engine) where the file system refuses O_DIRECT; kRequire makes that an error.
enum class DirectIo { kAuto, kRequire, kOff };

enum class Op : std::uint8_t { kRead, kWrite };
enum class Priority : std::uint8_t { kDemand = 0, kPrefetch = 1 };

inline constexpr std::uint32_t kStripesMax = 8;  // backing files per striped file

struct EngineOptions {
  EngineKind kind = EngineKind::kAuto;
  std::uint64_t block_size_bytes = 1 << 20;  // piece size; multiple of 4096
  std::uint32_t queue_depth = 8;             // pieces in flight per I/O thread
  std::uint32_t threads = 1;                 // I/O threads (one io_uring ring each)
  bool single_submit = false;                // submit each piece alone instead of in batches
  bool overlap_events = true;                // refill as pieces complete (else in lockstep)
  std::uint32_t requests_max = 256;          // handles outstanding at once
  std::uint32_t files_max = 64;              // open files at once
  std::uint32_t buffers_max = 64;            // registered buffers at once
  DirectIo direct_io = DirectIo::kAuto;
};

// Checks the options against their valid ranges; the error names the option and the range.
Status validate(const EngineOptions& options);

// A file as the engine sees it: `size_bytes` of logical data, striped RAID-0 style over one
// backing file per path (stripe k of the data lives in paths[k % paths.size()]).
struct FileSpec {
  std::vector<std::string> paths;  // 1..kStripesMax backing files
  std::uint64_t size_bytes = 0;    // logical data bytes; 0 with create=false: use the file's size
  std::uint64_t stripe_bytes = 0;  // 0 = block_size; a multiple of the alignment
  bool create = true;  // create new files (mode 0600, never an existing one) and preallocate
  // create only: written at offset 0 of every backing file, in its own aligned header block;
  // the data starts after it. Lets a later run recognise the file as Strata's.
  std::string header;
};

struct FileId {
  std::int32_t index = -1;
  bool valid() const { return index >= 0; }
};

struct FileInfo {
  std::vector<std::string> paths;
  std::uint64_t size_bytes = 0;       // logical data bytes
  std::uint64_t stripe_bytes = 0;     // stripe unit
  std::uint64_t header_bytes = 0;     // reserved at the start of each backing file
  std::uint32_t alignment_bytes = 0;  // buffers, offsets and lengths are multiples of this
  bool direct = false;                // O_DIRECT (false: buffered fallback, or the twin)
};

struct IoRequest {
  Op op = Op::kRead;
  FileId file;
  std::uint64_t offset_bytes = 0;  // logical offset in the file's data
  std::uint64_t length_bytes = 0;
  void* buffer = nullptr;  // stays valid and untouched until the request completes
  Priority priority = Priority::kPrefetch;
};

struct IoHandle {
  std::uint32_t slot = UINT32_MAX;
  std::uint32_t generation = 0;
  bool valid() const { return slot != UINT32_MAX; }
};

struct IoCompletion {
  Status status;                 // ok, or what failed (file, offset, length, errno text)
  std::uint64_t bytes_done = 0;  // bytes transferred; == length_bytes when ok
  std::uint64_t latency_ns = 0;  // submit() to the last piece's completion
  std::uint32_t retries = 0;     // short transfers resubmitted plus EINTR/EAGAIN retries
  std::uint64_t sequence = 0;    // engine-wide completion order, from 1
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "uring", "posix" or "sim".
  virtual const char* name() const = 0;
  // The options the engine was started with.
  virtual const EngineOptions& options() const = 0;

  // Opens or creates (and preallocates) a file. Errors name the path: missing directory
  // (kNotFound), read-only or permission (kIo), no room (kNoSpace, with the numbers).
  virtual Result<FileId> open_file(const FileSpec& spec) = 0;
  // What open_file() settled on for `file`; kInvalidArgument for an unknown id.
  virtual Result<FileInfo> file_info(FileId file) const = 0;
  // Closes `file` (and unlinks its backing files when `remove`); fails while requests on it
  // are outstanding.
  virtual Status close_file(FileId file, bool remove) = 0;
  // Bytes a new file in `dir` can still take.
  virtual Result<std::uint64_t> free_bytes(const std::string& dir) = 0;

  // Registers [addr, addr + bytes) so requests inside it use fixed-buffer I/O where the
  // implementation has it. Optional: unregistered buffers work too. The range stays
  // registered until unregister_buffer(addr) or the engine is destroyed.
  virtual Status register_buffer(void* addr, std::uint64_t bytes) = 0;
  // Forgets a buffer registered at `addr`; no request may be using it.
  virtual Status unregister_buffer(void* addr) = 0;

  // Queues a request. kInvalidArgument for a bad file, range or alignment (the message says
  // what is valid); kUnavailable when all requests_max handles are outstanding (back-pressure:
  // wait for one, then submit again).
  virtual Result<IoHandle> submit(const IoRequest& request) = 0;
  // Queues `count` requests together, so that they reach the kernel in one submission (where
  // adjacent ones can merge), and stores their handles. All or nothing: on an error (as for
  // submit(), for any of them) none is queued.
  virtual Status submit_batch(const IoRequest* requests, std::uint32_t count,
                              IoHandle* handles) = 0;
  // Blocks until the request completes; consumes the handle.
  virtual IoCompletion wait(IoHandle handle) = 0;
  // The completion if the request is done (consuming the handle), else nullopt.
  virtual std::optional<IoCompletion> poll(IoHandle handle) = 0;
  // Like wait(), but gives up after `timeout_us` and returns nullopt (handle still live).
  virtual std::optional<IoCompletion> wait_for(IoHandle handle, std::uint64_t timeout_us) = 0;
  // Blocks until any of `handles` completes (entries that are not valid() are skipped; at least
  // one must be), consumes that one, stores its position in `*index` and returns its
  // completion. Lets a caller with many requests in flight reuse whichever finishes first.
  virtual IoCompletion wait_any(const IoHandle* handles, std::uint32_t count,
                                std::uint32_t* index) = 0;
  // Handles submitted and not yet consumed.
  virtual std::uint32_t outstanding() const = 0;
};

// Starts the engine `options.kind` asks for. kAuto: io_uring, or, where it cannot be used,
// the pread/pwrite pool with one warning saying why. kSim: the twin with no faults (see
// io/sim/sim_engine.h to inject some).
Result<std::unique_ptr<IoEngine>> make_engine(const EngineOptions& options);

}  // namespace strata::io

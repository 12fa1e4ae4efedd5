// The part of every IoEngine that does not depend on how bytes reach the disk: the fixed table
// of request slots and their handles, the two priority queues, cutting requests into pieces
// (block_size, never across a stripe), accounting each piece's result (short transfers,
// EINTR/EAGAIN, errors named with file and offset), completion and waiting.
//
// An implementation (io/uring, io/posix, io/sim) derives from QueueEngine, opens its files
// through the open_* hooks and runs worker threads that take pieces with take_piece(), move the
// bytes, call account() with the raw result, and finish_piece() when a piece is over.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "io/engine.h"

namespace strata::io::core {

// One contiguous transfer within one backing file: the unit a worker hands to the OS.
struct Piece {
  std::uint32_t slot = 0;
  std::uint32_t generation = 0;
  std::int32_t file = -1;          // file table index
  std::uint32_t stripe = 0;        // backing file within the file
  std::int32_t buffer_index = -1;  // registered buffer holding the bytes, or -1
  Op op = Op::kRead;
  int fd = -1;                     // backing file descriptor (real files) or -1
  std::uint64_t offset = 0;        // physical offset of the next byte to move
  std::uint8_t* buffer = nullptr;  // next byte to move
  std::uint64_t remaining = 0;     // bytes still to move
  std::uint64_t done = 0;          // bytes moved so far
  std::uint32_t retries = 0;       // resubmissions so far
  std::uint64_t serial = 0;        // the request's submit order, from 1 (for the twin's faults)
};

enum class PieceStep {
  kDone,    // every byte moved: call finish_piece(piece, ok)
  kAgain,   // short transfer or EINTR/EAGAIN: move the remainder (piece already advanced)
  kFailed,  // call finish_piece(piece, error)
};

// What an implementation opened for one FileSpec.
struct OpenedFile {
  FileInfo info;
  std::array<int, kStripesMax> fds{-1, -1, -1, -1, -1, -1, -1, -1};
  std::string buffered_reason;  // why O_DIRECT was refused, when it was and kAuto fell back
};

class QueueEngine : public IoEngine {
 public:
  explicit QueueEngine(const EngineOptions& options);
  ~QueueEngine() override;

  const EngineOptions& options() const final { return options_; }
  Result<FileId> open_file(const FileSpec& spec) final;
  Result<FileInfo> file_info(FileId file) const final;
  Status close_file(FileId file, bool remove) final;
  Status register_buffer(void* addr, std::uint64_t bytes) final;
  Status unregister_buffer(void* addr) final;
  Result<IoHandle> submit(const IoRequest& request) final;
  Status submit_batch(const IoRequest* requests, std::uint32_t count, IoHandle* handles) final;
  IoCompletion wait(IoHandle handle) final;
  std::optional<IoCompletion> poll(IoHandle handle) final;
  std::optional<IoCompletion> wait_for(IoHandle handle, std::uint64_t timeout_us) final;
  IoCompletion wait_any(const IoHandle* handles, std::uint32_t count, std::uint32_t* index) final;
  std::uint32_t outstanding() const final;

 protected:
  // ---- hooks for implementations -------------------------------------------------------------
  // Opens (or creates and preallocates) the backing files of `spec`, whose stripe unit has been
  // settled to `stripe_bytes`.
  virtual Result<OpenedFile> open_backing(const FileSpec& spec, std::uint64_t stripe_bytes) = 0;
  // Closes what open_backing() opened, unlinking the backing files when `remove`.
  virtual Status close_backing(const OpenedFile& file, bool remove) = 0;
  // Called after a file got table index `index` (before any request can use it).
  virtual Status on_file_opened(std::int32_t index, const OpenedFile& file);
  // Called before table index `index` is closed; no request uses it.
  virtual void on_file_closing(std::int32_t index);
  // Called when buffer table entry `index` is set (addr != nullptr) or cleared (nullptr).
  virtual Status on_buffer_changed(std::int32_t index, void* addr, std::uint64_t bytes);
  // New pieces are queued, or shutdown began: wake workers that may be asleep.
  virtual void wake_workers();

  // ---- for worker threads --------------------------------------------------------------------
  // Takes the next piece (demand before prefetch); false when none is queued.
  bool take_piece(Piece* piece);
  // Like take_piece(), but sleeps until a piece is queued; false once shutdown began and the
  // queues are empty.
  bool take_piece_wait(Piece* piece);
  // Folds a raw result (bytes moved, or -errno) into `piece`. On kFailed, `error` says what
  // failed, naming the file, offset and length.
  PieceStep account(Piece* piece, std::int64_t result, Status* error);
  // Ends a piece; the request completes when its last piece ends.
  void finish_piece(const Piece& piece, const Status& error);
  // While held, take_piece() hands out nothing and queued pieces wait (the twin's pause).
  void set_hold(bool held);
  // True once shutdown() began.
  bool stopping() const;
  // Cancels queued requests, marks the engine stopping and wakes the workers. Implementations
  // call it first in their destructor, then join their workers.
  void begin_shutdown();
  // Closes every file still open (without removing it). Implementations call it after joining
  // their workers.
  void close_all_files();

 private:
  struct Slot {
    std::uint32_t generation = 0;
    bool live = false;        // handed out and not yet consumed
    bool all_issued = false;  // no more pieces will be issued
    bool done = false;
    bool failed = false;
    IoRequest request;
    std::uint64_t next_offset = 0;  // logical offset of the next piece to issue
    std::uint32_t pieces_issued = 0;
    std::uint32_t pieces_finished = 0;
    std::uint64_t bytes_done = 0;
    std::uint32_t retries = 0;
    std::uint64_t submit_ns = 0;
    std::uint64_t serial = 0;
    IoCompletion completion;
    std::uint32_t prev = UINT32_MAX;  // queue links
    std::uint32_t next = UINT32_MAX;
  };
  struct Queue {
    std::uint32_t head = UINT32_MAX;
    std::uint32_t tail = UINT32_MAX;
  };
  struct FileEntry {
    bool used = false;
    OpenedFile file;
    std::uint32_t outstanding = 0;  // live requests on it
  };
  struct Buffer {
    std::uint8_t* addr = nullptr;
    std::uint64_t bytes = 0;
  };

  Status check_request(const IoRequest& request) const;  // caller holds mu_
  void enqueue(std::uint32_t slot_index);
  void unlink(std::uint32_t slot_index);
  void complete_if_over(std::uint32_t slot_index);
  Slot& live_slot(IoHandle handle);
  IoCompletion consume(std::uint32_t slot_index);
  std::string file_path(std::int32_t file, std::uint32_t stripe) const;

  const EngineOptions options_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // pieces queued (for workers that sleep on it)
  std::condition_variable done_cv_;  // a request completed
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::array<Queue, 2> queues_;  // by Priority
  std::vector<FileEntry> files_;
  std::vector<Buffer> buffers_;
  std::uint64_t sequence_ = 0;
  std::uint64_t submitted_ = 0;
  bool stopping_ = false;
  bool held_ = false;
  bool warned_buffered_ = false;
};

// errno as "Input/output error (EIO)".
std::string errno_text(int err);

}  // namespace strata::io::core

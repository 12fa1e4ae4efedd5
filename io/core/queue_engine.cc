// The QueueEngine's requests (see queue_engine.h): slots and queues, pieces, accounting, completion
// and shutdown; the file and buffer tables are in queue_engine_tables.cc.
#include "io/core/queue_engine.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/fault_points.h"
#include "common/log.h"
#include "common/units.h"

namespace strata::io::core {
namespace {

constexpr std::uint32_t kNone = UINT32_MAX;
// A piece that keeps coming back short (or EINTR/EAGAIN) this many times is an error, not a
// livelock.
constexpr std::uint32_t kRetriesMax = 1000;

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

const char* op_name(Op op) {
  return op == Op::kRead ? "read" : "write";
}

}  // namespace

std::string errno_text(int err) {
  const char* name = strerrorname_np(err);
  return fmt::format("{} ({})", std::strerror(err), name != nullptr ? name : "?");
}

QueueEngine::QueueEngine(const EngineOptions& options)
    : options_(options),
      slots_(options.requests_max),
      files_(options.files_max),
      buffers_(options.buffers_max) {
  free_slots_.reserve(options.requests_max);
  for (std::uint32_t i = options.requests_max; i > 0; --i)
    free_slots_.push_back(i - 1);
}

QueueEngine::~QueueEngine() {
  // Implementations shut down and join their workers before this runs.
  STRATA_ASSERT(stopping_);
}

void QueueEngine::wake_workers() {
  work_cv_.notify_all();
}

// ---- requests ------------------------------------------------------------------------------

Status QueueEngine::check_request(const IoRequest& request) const {
  if (!request.file.valid() || static_cast<std::size_t>(request.file.index) >= files_.size() ||
      !files_[request.file.index].used || files_[request.file.index].file.info.paths.empty()) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("no open file with id {}", request.file.index));
  }
  const FileInfo& info = files_[request.file.index].file.info;
  const std::uint64_t align = info.alignment_bytes;
  const auto address = reinterpret_cast<std::uintptr_t>(request.buffer);
  // The message is only built on the error path: submit() does not allocate.
  auto bad = [&](const std::string& message) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} of {} bytes at offset {}: {}", op_name(request.op),
                              request.length_bytes, request.offset_bytes, message),
                  info.paths.front());
  };
  if (request.buffer == nullptr) return bad("the buffer is null");
  if (request.length_bytes == 0) return bad("the length is zero");
  if (address % align != 0) {
    return bad(
        fmt::format("buffer address {} is not a multiple of {} (the file's direct-I/O "
                    "alignment)",
                    request.buffer, align));
  }
  if (request.offset_bytes % align != 0) {
    return bad(
        fmt::format("offset is not a multiple of {} (the file's direct-I/O alignment)", align));
  }
  if (request.length_bytes % align != 0) {
    return bad(
        fmt::format("length is not a multiple of {} (the file's direct-I/O alignment)", align));
  }
  if (request.offset_bytes > info.size_bytes ||
      request.length_bytes > info.size_bytes - request.offset_bytes) {
    return bad(fmt::format("the range ends past the file's {} bytes", info.size_bytes));
  }
  return Status::ok();
}

Result<IoHandle> QueueEngine::submit(const IoRequest& request) {
  IoHandle handle;
  STRATA_TRY(submit_batch(&request, 1, &handle));
  return handle;
}

Status QueueEngine::submit_batch(const IoRequest* requests, std::uint32_t count,
                                 IoHandle* handles) {
  STRATA_ASSERT(count == 0 || (requests != nullptr && handles != nullptr));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::uint32_t i = 0; i < count; ++i)
      STRATA_TRY(check_request(requests[i]));
    if (stopping_) return Status(ErrorCode::kUnavailable, "the I/O engine is shutting down");
    if (free_slots_.size() < count) {
      return Status(
          ErrorCode::kUnavailable,
          fmt::format("busy: {} of {} request handles are outstanding (requests_max), "
                      "{} more asked for; wait for some before submitting more",
                      options_.requests_max - free_slots_.size(), options_.requests_max, count));
    }
    const std::uint64_t now = now_ns();
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::uint32_t index = free_slots_.back();
      free_slots_.pop_back();
      Slot& slot = slots_[index];
      const std::uint32_t generation = slot.generation + 1;
      slot = Slot{};
      slot.generation = generation;
      slot.live = true;
      slot.request = requests[i];
      slot.next_offset = requests[i].offset_bytes;
      slot.submit_ns = now;
      slot.serial = ++submitted_;
      files_[requests[i].file.index].outstanding++;
      enqueue(index);
      handles[i] = IoHandle{index, generation};
    }
  }
  if (count != 0) wake_workers();
  return Status::ok();
}

void QueueEngine::enqueue(std::uint32_t index) {
  Queue& q = queues_[static_cast<int>(slots_[index].request.priority)];
  slots_[index].prev = q.tail;
  slots_[index].next = kNone;
  if (q.tail != kNone) {
    slots_[q.tail].next = index;
  } else {
    q.head = index;
  }
  q.tail = index;
}

void QueueEngine::unlink(std::uint32_t index) {
  Slot& slot = slots_[index];
  Queue& q = queues_[static_cast<int>(slot.request.priority)];
  if (slot.prev != kNone) {
    slots_[slot.prev].next = slot.next;
  } else {
    q.head = slot.next;
  }
  if (slot.next != kNone) {
    slots_[slot.next].prev = slot.prev;
  } else {
    q.tail = slot.prev;
  }
  slot.prev = slot.next = kNone;
}

bool QueueEngine::take_piece(Piece* piece) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_) return false;
  for (Queue& q : queues_) {
    if (q.head == kNone) continue;
    const std::uint32_t index = q.head;
    Slot& slot = slots_[index];
    const FileEntry& entry = files_[slot.request.file.index];
    const FileInfo& info = entry.file.info;
    const std::uint64_t logical = slot.next_offset;
    const std::uint64_t end = slot.request.offset_bytes + slot.request.length_bytes;
    const std::uint64_t stripe = info.stripe_bytes;
    const std::uint64_t block = options_.block_size_bytes;
    std::uint64_t length =
        std::min({end - logical, block - logical % block, stripe - logical % stripe});
    const std::uint64_t stripe_index = logical / stripe;
    const std::uint32_t stripes = static_cast<std::uint32_t>(info.paths.size());

    *piece = Piece{};
    piece->slot = index;
    piece->generation = slot.generation;
    piece->serial = slot.serial;
    piece->file = slot.request.file.index;
    piece->stripe = static_cast<std::uint32_t>(stripe_index % stripes);
    piece->op = slot.request.op;
    piece->fd = entry.file.fds[piece->stripe];
    piece->offset = info.header_bytes + (stripe_index / stripes) * stripe + logical % stripe;
    piece->buffer =
        static_cast<std::uint8_t*>(slot.request.buffer) + (logical - slot.request.offset_bytes);
    piece->remaining = length;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      const Buffer& b = buffers_[i];
      if (b.bytes != 0 && piece->buffer >= b.addr && piece->buffer + length <= b.addr + b.bytes) {
        piece->buffer_index = static_cast<std::int32_t>(i);
        break;
      }
    }
    slot.next_offset += length;
    slot.pieces_issued++;
    if (slot.next_offset == end) {
      slot.all_issued = true;
      unlink(index);
    }
    return true;
  }
  return false;
}

bool QueueEngine::take_piece_wait(Piece* piece) {
  for (;;) {
    if (take_piece(piece)) return true;
    std::unique_lock<std::mutex> lock(mu_);
    if (!held_ && (queues_[0].head != kNone || queues_[1].head != kNone)) continue;
    if (stopping_ && !held_) return false;
    work_cv_.wait(lock);
  }
}

PieceStep QueueEngine::account(Piece* piece, std::int64_t result, Status* error) {
  if (io_fault_armed()) {  // a test's injected fault (fault_points.h) replaces the result
    std::string path;
    {
      std::lock_guard<std::mutex> lock(mu_);
      path = file_path(piece->file, piece->stripe);
    }
    if (const int injected = injected_io_error(path, piece->op == Op::kWrite); injected != 0)
      result = -injected;
  }
  auto fail = [&](ErrorCode code, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    *error = Status(code,
                    fmt::format("{} of {} bytes at offset {} failed: {}", op_name(piece->op),
                                piece->remaining, piece->offset, why),
                    file_path(piece->file, piece->stripe));
    return PieceStep::kFailed;
  };
  if (result > 0) {
    const std::uint64_t moved =
        std::min<std::uint64_t>(static_cast<std::uint64_t>(result), piece->remaining);
    piece->done += moved;
    piece->remaining -= moved;
    piece->offset += moved;
    piece->buffer += moved;
    if (piece->remaining == 0) return PieceStep::kDone;
    if (++piece->retries > kRetriesMax) {
      return fail(ErrorCode::kIo, fmt::format("still short after {} resubmissions", kRetriesMax));
    }
    return PieceStep::kAgain;
  }
  if (result == 0) {
    if (piece->op == Op::kRead) return fail(ErrorCode::kIo, "unexpected end of file");
    if (++piece->retries > kRetriesMax) return fail(ErrorCode::kIo, "the write moved no bytes");
    return PieceStep::kAgain;
  }
  const int err = static_cast<int>(-result);
  if (err == EINTR || err == EAGAIN) {
    if (++piece->retries > kRetriesMax) return fail(ErrorCode::kIo, errno_text(err));
    return PieceStep::kAgain;
  }
  if (err == ENOSPC || err == EDQUOT) {
    return fail(ErrorCode::kNoSpace, fmt::format("no space left on the drive{}: {}",
                                                 err == EDQUOT ? " (quota)" : "", errno_text(err)));
  }
  return fail(ErrorCode::kIo, errno_text(err));
}

void QueueEngine::finish_piece(const Piece& piece, const Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[piece.slot];
  STRATA_ASSERT(slot.live && slot.generation == piece.generation);
  slot.pieces_finished++;
  slot.bytes_done += piece.done;
  slot.retries += piece.retries;
  if (!error.is_ok() && !slot.failed) {
    slot.failed = true;
    slot.completion.status = error;
    if (!slot.all_issued) {
      slot.all_issued = true;  // the rest of the request is not issued
      unlink(piece.slot);
    }
  }
  complete_if_over(piece.slot);
}

void QueueEngine::complete_if_over(std::uint32_t index) {
  Slot& slot = slots_[index];
  if (!slot.all_issued || slot.pieces_finished != slot.pieces_issued || slot.done) return;
  slot.done = true;
  slot.completion.bytes_done = slot.bytes_done;
  slot.completion.retries = slot.retries;
  slot.completion.latency_ns = now_ns() - slot.submit_ns;
  slot.completion.sequence = ++sequence_;
  done_cv_.notify_all();
}

QueueEngine::Slot& QueueEngine::live_slot(IoHandle handle) {
  STRATA_ASSERT_MSG(handle.valid() && handle.slot < slots_.size(), "invalid I/O handle");
  Slot& slot = slots_[handle.slot];
  STRATA_ASSERT_MSG(slot.live && slot.generation == handle.generation,
                    "I/O handle already consumed");
  return slot;
}

IoCompletion QueueEngine::consume(std::uint32_t index) {
  Slot& slot = slots_[index];
  IoCompletion completion = std::move(slot.completion);
  slot.live = false;
  files_[slot.request.file.index].outstanding--;
  free_slots_.push_back(index);
  return completion;
}

IoCompletion QueueEngine::wait(IoHandle handle) {
  std::unique_lock<std::mutex> lock(mu_);
  Slot& slot = live_slot(handle);
  done_cv_.wait(lock, [&] { return slot.done; });
  return consume(handle.slot);
}

std::optional<IoCompletion> QueueEngine::poll(IoHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_slot(handle).done) return std::nullopt;
  return consume(handle.slot);
}

std::optional<IoCompletion> QueueEngine::wait_for(IoHandle handle, std::uint64_t timeout_us) {
  std::unique_lock<std::mutex> lock(mu_);
  Slot& slot = live_slot(handle);
  if (!done_cv_.wait_for(lock, std::chrono::microseconds(timeout_us), [&] { return slot.done; })) {
    return std::nullopt;
  }
  return consume(handle.slot);
}

IoCompletion QueueEngine::wait_any(const IoHandle* handles, std::uint32_t count,
                                   std::uint32_t* index) {
  STRATA_ASSERT(handles != nullptr && index != nullptr);
  std::unique_lock<std::mutex> lock(mu_);
  bool any = false;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (handles[i].valid()) {
      live_slot(handles[i]);  // asserts the handle is live
      any = true;
    }
  }
  STRATA_ASSERT_MSG(any, "wait_any needs at least one valid handle");
  for (;;) {
    for (std::uint32_t i = 0; i < count; ++i) {
      if (handles[i].valid() && slots_[handles[i].slot].done) {
        *index = i;
        return consume(handles[i].slot);
      }
    }
    done_cv_.wait(lock);
  }
}

std::uint32_t QueueEngine::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.requests_max - static_cast<std::uint32_t>(free_slots_.size());
}

void QueueEngine::set_hold(bool held) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = held;
  }
  wake_workers();
}

bool QueueEngine::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

void QueueEngine::begin_shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    held_ = false;
    for (Queue& q : queues_) {
      while (q.head != kNone) {
        const std::uint32_t index = q.head;
        unlink(index);
        Slot& slot = slots_[index];
        slot.all_issued = true;
        if (!slot.failed) {
          slot.failed = true;
          slot.completion.status =
              Status(ErrorCode::kUnavailable, "the I/O engine shut down before the request ran");
        }
        complete_if_over(index);
      }
    }
  }
  wake_workers();
}

}  // namespace strata::io::core

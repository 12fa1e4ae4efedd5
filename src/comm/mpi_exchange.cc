// The MPI Comm's exchange engine (mpi_exchange.h).
#if defined(STRATA_HAVE_MPI)

#include "comm/mpi_exchange.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "comm/reduce.h"

namespace strata::comm::detail {
namespace {

constexpr std::uint64_t kSegmentBytesMax = std::uint64_t{4} << 20;
constexpr std::uint64_t kSegmentBytesMin = std::uint64_t{64} << 10;
constexpr std::uint64_t kStagingTargetBytes = std::uint64_t{32} << 20;
// MPI guarantees tags up to 32767; two phases per operation.
constexpr std::uint64_t kTagCycle = 16000;
constexpr std::size_t kStagingAlignment = 4096;

Status mpi_failed(const char* call, int code) {
  return Status(ErrorCode::kUnavailable, fmt::format("{} failed: {}", call, mpi_error_text(code)),
                "mpi");
}

// Element offset of block k when `count` elements are cut into `world` nearly equal blocks.
std::uint64_t block_begin(std::uint64_t count, int world, int k) {
  return count / static_cast<std::uint64_t>(world) * static_cast<std::uint64_t>(k) +
         std::min<std::uint64_t>(static_cast<std::uint64_t>(k),
                                 count % static_cast<std::uint64_t>(world));
}

}  // namespace

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

std::uint64_t segment_bytes_for(int world_size) {
  const std::uint64_t peers = static_cast<std::uint64_t>(std::max(1, world_size - 1));
  std::uint64_t bytes = kSegmentBytesMax;
  while (bytes > kSegmentBytesMin && bytes * peers * kWindow > kStagingTargetBytes)
    bytes /= 2;
  return bytes;
}

Exchange::Exchange(MPI_Comm comm, int rank, int world_size)
    : comm_(comm),
      rank_(rank),
      world_size_(world_size),
      segment_bytes_(segment_bytes_for(world_size)) {
  const auto w = static_cast<std::size_t>(world_size);
  staging_bytes_ = segment_bytes_ * kWindow * w;
  staging_ =
      static_cast<std::byte*>(::operator new(staging_bytes_, std::align_val_t(kStagingAlignment)));
  requests_.assign(static_cast<std::size_t>(kWindow) * w * 2, MPI_REQUEST_NULL);
  indices_.assign(requests_.size(), 0);
  sources_.assign(w, nullptr);
  for (Phase& phase : phases_) {
    phase.send_ptr.assign(w, nullptr);
    phase.send_len.assign(w, 0);
    phase.recv_ptr.assign(w, nullptr);
    phase.recv_len.assign(w, 0);
  }
}

Exchange::~Exchange() {
  ::operator delete(staging_, std::align_val_t(kStagingAlignment));
}

void Exchange::clear_phase(Phase* phase) const {
  std::fill(phase->send_ptr.begin(), phase->send_ptr.end(), nullptr);
  std::fill(phase->send_len.begin(), phase->send_len.end(), 0);
  std::fill(phase->recv_ptr.begin(), phase->recv_ptr.end(), nullptr);
  std::fill(phase->recv_len.begin(), phase->recv_len.end(), 0);
  phase->handshake = false;
  phase->reduce = false;
  phase->out = nullptr;
  phase->own = nullptr;
  phase->reduce_len = 0;
}

// Turns an operation into phases. Blocks are element ranges; every rank computes the same plan.
void Exchange::plan(const CollectiveOp& op, std::uint64_t sequence) {
  const std::uint64_t size = data_type_bytes(op.type);
  const int w = world_size_;
  const int me = rank_;
  const auto* send = static_cast<const std::byte*>(op.send);
  auto* recv = static_cast<std::byte*>(op.recv);
  const int base_tag = static_cast<int>((sequence % kTagCycle) * 2);
  clear_phase(&phases_[0]);
  clear_phase(&phases_[1]);
  phases_[0].tag = base_tag;
  phases_[1].tag = base_tag + 1;
  phases_[0].type = phases_[1].type = op.type;
  phases_[0].op = phases_[1].op = op.op;
  phase_count_ = 1;
  const std::uint64_t count = op.count;
  switch (op.kind) {
    case CollectiveKind::kAllGather: {
      Phase& p = phases_[0];
      for (int k = 0; k < w; ++k) {
        if (k == me) continue;
        p.send_ptr[k] = send;
        p.send_len[k] = count * size;
        p.recv_ptr[k] = recv + static_cast<std::uint64_t>(k) * count * size;
        p.recv_len[k] = count * size;
      }
      break;
    }
    case CollectiveKind::kReduceScatter: {
      Phase& p = phases_[0];
      p.reduce = true;
      p.out = recv;
      p.own = send + static_cast<std::uint64_t>(me) * count * size;
      p.reduce_len = count * size;
      for (int k = 0; k < w; ++k) {
        if (k == me) continue;
        p.send_ptr[k] = send + static_cast<std::uint64_t>(k) * count * size;
        p.send_len[k] = count * size;
        p.recv_len[k] = count * size;
      }
      break;
    }
    case CollectiveKind::kAllReduce: {
      // Phase 0: block k of every rank goes to rank k, which folds it. Phase 1: rank k sends its
      // folded block k to everyone.
      phase_count_ = 2;
      Phase& r = phases_[0];
      Phase& g = phases_[1];
      const std::uint64_t mine = block_begin(count, w, me) * size;
      const std::uint64_t mine_len =
          (block_begin(count, w, me + 1) - block_begin(count, w, me)) * size;
      r.reduce = true;
      r.out = recv + mine;
      r.own = send + mine;
      r.reduce_len = mine_len;
      for (int k = 0; k < w; ++k) {
        if (k == me) continue;
        const std::uint64_t begin = block_begin(count, w, k) * size;
        const std::uint64_t len = (block_begin(count, w, k + 1) - block_begin(count, w, k)) * size;
        r.send_ptr[k] = send + begin;
        r.send_len[k] = len;
        r.recv_len[k] = mine_len;
        g.send_ptr[k] = recv + mine;
        g.send_len[k] = mine_len;
        g.recv_ptr[k] = recv + begin;
        g.recv_len[k] = len;
      }
      break;
    }
    case CollectiveKind::kBroadcast: {
      const int root = op.root;
      const std::uint64_t bytes = count * size;
      if (bytes <= (std::uint64_t{64} << 10) || count < static_cast<std::uint64_t>(w)) {
        Phase& p = phases_[0];
        for (int k = 0; k < w; ++k) {
          if (k == me) continue;
          if (me == root) {
            p.send_ptr[k] = recv;
            p.send_len[k] = bytes;
          } else if (k == root) {
            p.recv_ptr[k] = recv;
            p.recv_len[k] = bytes;
          }
        }
        break;
      }
      // Scatter from the root, then every rank passes its block to every rank but the root.
      phase_count_ = 2;
      Phase& s = phases_[0];
      Phase& g = phases_[1];
      const std::uint64_t mine = block_begin(count, w, me) * size;
      const std::uint64_t mine_len =
          (block_begin(count, w, me + 1) - block_begin(count, w, me)) * size;
      for (int k = 0; k < w; ++k) {
        if (k == me) continue;
        const std::uint64_t begin = block_begin(count, w, k) * size;
        const std::uint64_t len = (block_begin(count, w, k + 1) - block_begin(count, w, k)) * size;
        if (me == root) {
          s.send_ptr[k] = recv + begin;
          s.send_len[k] = len;
        } else if (k == root) {
          s.recv_ptr[k] = recv + mine;
          s.recv_len[k] = mine_len;
        }
        if (k != root) {
          g.send_ptr[k] = recv + mine;
          g.send_len[k] = mine_len;
        }
        if (me != root) {
          g.recv_ptr[k] = recv + begin;
          g.recv_len[k] = len;
        }
      }
      break;
    }
    case CollectiveKind::kBarrier:
      phases_[0].handshake = true;
      break;
  }
  for (int i = 0; i < phase_count_; ++i) {
    Phase& p = phases_[i];
    std::uint64_t longest = p.reduce ? p.reduce_len : 0;
    for (int k = 0; k < w; ++k) {
      longest = std::max({longest, p.send_len[k], p.recv_len[k]});
    }
    p.segments = p.handshake ? 1 : (longest + segment_bytes_ - 1) / segment_bytes_;
  }
}

Status Exchange::start(const CollectiveOp& op, std::uint64_t sequence) {
  // The local part first: an all-gather's own block (unless in place).
  if (op.kind == CollectiveKind::kAllGather) {
    const std::uint64_t bytes = op.count * data_type_bytes(op.type);
    std::byte* own = static_cast<std::byte*>(op.recv) + static_cast<std::uint64_t>(rank_) * bytes;
    if (own != op.send && bytes != 0) std::memcpy(own, op.send, bytes);
  }
  if (world_size_ == 1) {
    // One rank: a reduction over one input is that input, bit for bit.
    if ((op.kind == CollectiveKind::kReduceScatter || op.kind == CollectiveKind::kAllReduce) &&
        op.send != op.recv && op.count != 0) {
      std::memcpy(op.recv, op.send, op.count * data_type_bytes(op.type));
    }
    phase_count_ = 0;
    phase_ = 0;
    return Status::ok();
  }
  plan(op, sequence);
  return begin_phase(0);
}

Status Exchange::begin_phase(int index) {
  phase_ = index;
  head_ = 0;
  next_post_ = 0;
  const Phase& p = phases_[index];
  while (next_post_ < p.segments && next_post_ < static_cast<std::uint64_t>(kWindow)) {
    STRATA_TRY(post_segment(next_post_++));
  }
  return Status::ok();
}

Status Exchange::post_segment(std::uint64_t segment) {
  Phase& p = phases_[phase_];
  const int slot = static_cast<int>(segment % kWindow);
  const std::uint64_t offset = segment * segment_bytes_;
  for (int k = 0; k < world_size_; ++k) {
    if (k == rank_) continue;
    if (p.handshake) {
      int rc = MPI_Irecv(nullptr, 0, MPI_BYTE, k, p.tag, comm_, &request(slot, k, 1));
      if (rc != MPI_SUCCESS) return mpi_failed("MPI_Irecv", rc);
      rc = MPI_Isend(nullptr, 0, MPI_BYTE, k, p.tag, comm_, &request(slot, k, 0));
      if (rc != MPI_SUCCESS) return mpi_failed("MPI_Isend", rc);
      continue;
    }
    if (offset < p.recv_len[k]) {
      const std::uint64_t n = std::min(segment_bytes_, p.recv_len[k] - offset);
      std::byte* into = p.reduce ? staging(slot, k) : p.recv_ptr[k] + offset;
      const int rc =
          MPI_Irecv(into, static_cast<int>(n), MPI_BYTE, k, p.tag, comm_, &request(slot, k, 1));
      if (rc != MPI_SUCCESS) return mpi_failed("MPI_Irecv", rc);
    }
    if (offset < p.send_len[k]) {
      const std::uint64_t n = std::min(segment_bytes_, p.send_len[k] - offset);
      const int rc = MPI_Isend(p.send_ptr[k] + offset, static_cast<int>(n), MPI_BYTE, k, p.tag,
                               comm_, &request(slot, k, 0));
      if (rc != MPI_SUCCESS) return mpi_failed("MPI_Isend", rc);
    }
  }
  return Status::ok();
}

bool Exchange::slot_done(int slot) const {
  for (int k = 0; k < world_size_; ++k) {
    if (request(slot, k, 0) != MPI_REQUEST_NULL || request(slot, k, 1) != MPI_REQUEST_NULL) {
      return false;
    }
  }
  return true;
}

Result<int> Exchange::poll(bool* done) {
  *done = false;
  if (phase_count_ == 0) {
    *done = true;
    return 0;
  }
  int completed = 0;
  const int rc = MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &completed,
                              indices_.data(), MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return mpi_failed("MPI_Testsome", rc);
  if (completed == MPI_UNDEFINED) completed = 0;
  for (;;) {
    Phase& p = phases_[phase_];
    while (head_ < p.segments) {
      const int slot = static_cast<int>(head_ % kWindow);
      if (!slot_done(slot)) break;
      if (p.reduce) {
        // All blocks of this segment are here: fold them in rank order into the output.
        const std::uint64_t offset = head_ * segment_bytes_;
        if (offset < p.reduce_len) {
          const std::uint64_t n = std::min(segment_bytes_, p.reduce_len - offset);
          for (int k = 0; k < world_size_; ++k) {
            sources_[static_cast<std::size_t>(k)] =
                k == rank_ ? static_cast<const void*>(p.own + offset) : staging(slot, k);
          }
          fold_in_order(p.out + offset, sources_.data(), world_size_, n / data_type_bytes(p.type),
                        p.type, p.op);
        }
      }
      ++head_;
      ++completed;  // folding is progress too
      if (next_post_ < p.segments) STRATA_TRY(post_segment(next_post_++));
    }
    if (head_ < p.segments) return completed;
    if (phase_ + 1 >= phase_count_) {
      *done = true;
      return completed;
    }
    STRATA_TRY(begin_phase(phase_ + 1));
  }
}

std::string Exchange::waiting_for() const {
  for (int direction : {1, 0}) {
    std::vector<int> peers;
    for (int k = 0; k < world_size_; ++k) {
      for (int slot = 0; slot < kWindow; ++slot) {
        if (request(slot, k, direction) != MPI_REQUEST_NULL) {
          peers.push_back(k);
          break;
        }
      }
    }
    if (peers.empty()) continue;
    std::string text = peers.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < peers.size(); ++i) {
      text += fmt::format("{}{}", i == 0 ? "" : ", ", peers[i]);
    }
    return text;
  }
  return "no rank (nothing outstanding)";
}

}  // namespace strata::comm::detail

#endif  // STRATA_HAVE_MPI

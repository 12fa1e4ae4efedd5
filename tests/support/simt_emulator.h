// A small SIMT emulator that runs the CUDA kernels' own source (kernels/cuda/*_kernels.cuh) on the
// CPU, so their indexing, masking, tiling, reductions and shuffles are tested on machines without
// a GPU. Include this header FIRST in a test file, then the kernel headers.
//
// Each block runs as one fiber (ucontext) per CUDA thread on the calling thread. A fiber runs until
// it reaches __syncthreads or a warp-level operation (shuffle, ballot), where it waits; a block
// barrier opens when every live thread of the block waits at one, a warp barrier when all 32
// lanes of the warp wait at one. Anything else (a barrier some threads never reach, a shuffle with
// lanes missing) is reported as a deadlock and fails the test. Fibers run in alternating forward
// and reverse order between barriers, and dynamic shared memory starts each block filled with
// 0xff bytes (NaN), so a missing barrier or a read of unwritten shared memory shows up in results.
//
// What it cannot tell: a fiber is never interrupted between two waits, so a read that races with
// another thread's later write (a barrier missing AFTER a read) goes unnoticed; nothing about real
// hardware (memory model, occupancy, register limits, speed) or about cuBLASLt. Blocks run one at
// a time, so code that relied on blocks running concurrently (none here does) would deadlock.
#pragma once

#define STRATA_SIMT_EMULATION 1

#include <gtest/gtest.h>
#include <math.h>
#include <ucontext.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace simt {

inline constexpr std::size_t kStackBytes = 128 * 1024;
inline constexpr int kThreadsMax = 1024;

struct Fiber {
  enum class State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };
  ucontext_t context{};
  uint3 index;
  int warp = 0;
  int lane = 0;
  State state = State::kRunnable;
  int vote = 0;
};

struct Machine {
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  ucontext_t scheduler{};
  int current = -1;
  uint3 block_index, block_dim, grid_dim;
  std::vector<std::max_align_t> shared;
  std::uint64_t slots[kThreadsMax / 32][32] = {};
  int block_vote = 0;
  std::function<void()> body;
  std::string error;
};

inline Machine& machine() {
  static Machine m;
  return m;
}

inline Fiber& fiber() {
  Machine& m = machine();
  return m.fibers[static_cast<std::size_t>(m.current)];
}

template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(machine().shared.data());
}

inline void wait_at(Fiber::State state) {
  Machine& m = machine();
  Fiber& f = fiber();
  f.state = state;
  swapcontext(&f.context, &m.scheduler);
}

inline void entry() {
  machine().body();
  fiber().state = Fiber::State::kDone;  // then back to the scheduler (uc_link)
}

// A warp-level exchange: every lane deposits `v`, all wait, each reads lane `source`'s value, all
// wait again (so a later exchange cannot overwrite a slot before everyone has read it).
template <typename T>
T exchange(T v, int source) {
  static_assert(sizeof(T) <= 8);
  Machine& m = machine();
  const int warp = fiber().warp;
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  m.slots[warp][fiber().lane] = bits;
  wait_at(Fiber::State::kWarpBarrier);
  T result;
  const std::uint64_t got = m.slots[warp][source & 31];
  std::memcpy(&result, &got, sizeof(T));
  wait_at(Fiber::State::kWarpBarrier);
  return result;
}

// Runs the current block to completion; false (and machine().error) on a deadlock.
inline bool run_block() {
  Machine& m = machine();
  const int threads = static_cast<int>(m.block_dim.x * m.block_dim.y * m.block_dim.z);
  if (threads > kThreadsMax) {
    m.error = "block of " + std::to_string(threads) + " threads";
    return false;
  }
  m.fibers.assign(static_cast<std::size_t>(threads), Fiber{});
  while (m.stacks.size() < static_cast<std::size_t>(threads))
    m.stacks.push_back(std::make_unique<char[]>(kStackBytes));
  std::memset(m.shared.data(), 0xff, m.shared.size() * sizeof(std::max_align_t));
  for (int t = 0; t < threads; ++t) {
    Fiber& f = m.fibers[static_cast<std::size_t>(t)];
    f.index.x = static_cast<unsigned>(t) % m.block_dim.x;
    f.index.y = (static_cast<unsigned>(t) / m.block_dim.x) % m.block_dim.y;
    f.index.z = static_cast<unsigned>(t) / (m.block_dim.x * m.block_dim.y);
    f.warp = t / 32;
    f.lane = t % 32;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = m.stacks[static_cast<std::size_t>(t)].get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &m.scheduler;
    makecontext(&f.context, entry, 0);
  }
  using State = Fiber::State;
  for (int pass = 0;; ++pass) {
    for (int i = 0; i < threads; ++i) {
      const int t = pass % 2 == 0 ? i : threads - 1 - i;
      if (m.fibers[static_cast<std::size_t>(t)].state != State::kRunnable) continue;
      m.current = t;
      swapcontext(&m.scheduler, &m.fibers[static_cast<std::size_t>(t)].context);
    }
    int live = 0;
    int at_block = 0;
    int vote = 0;
    for (const Fiber& f : m.fibers) {
      if (f.state == State::kDone) continue;
      ++live;
      if (f.state == State::kBlockBarrier) {
        ++at_block;
        vote |= f.vote;
      }
    }
    if (live == 0) return true;
    bool released = false;
    if (at_block == live) {
      m.block_vote = vote;
      for (Fiber& f : m.fibers) {
        if (f.state == State::kBlockBarrier) f.state = State::kRunnable;
      }
      released = true;
    }
    for (int w = 0; w * 32 < threads; ++w) {
      int warp_live = 0;
      int waiting = 0;
      for (int l = 0; l < 32 && w * 32 + l < threads; ++l) {
        const Fiber& f = m.fibers[static_cast<std::size_t>(w * 32 + l)];
        if (f.state == State::kDone) continue;
        ++warp_live;
        if (f.state == State::kWarpBarrier) ++waiting;
      }
      if (warp_live == 0 || waiting != warp_live) continue;
      if (warp_live != 32) {
        m.error = "a full-warp operation in warp " + std::to_string(w) + " with only " +
                  std::to_string(warp_live) + " live lanes";
        return false;
      }
      for (int l = 0; l < 32; ++l) {
        Fiber& f = m.fibers[static_cast<std::size_t>(w * 32 + l)];
        f.state = State::kRunnable;
      }
      released = true;
    }
    if (!released) {
      m.error = "deadlock: " + std::to_string(at_block) + " of " + std::to_string(live) +
                " live threads wait at __syncthreads, the rest at warp operations";
      return false;
    }
  }
}

// Runs kernel(args...) over the grid, one block at a time; 0 on success, 1 (and a test failure
// naming the block) on a deadlock. Same call shape as CudaLauncher (kernels/cuda/device_math.cuh).
struct Launcher {
  template <typename Kernel, typename... Args>
  int operator()(Kernel kernel, dim3 grid, dim3 block, std::size_t smem, Args... args) const {
    Machine& m = machine();
    m.shared.assign(smem / sizeof(std::max_align_t) + 1, std::max_align_t{});
    m.grid_dim = {grid.x, grid.y, grid.z};
    m.block_dim = {block.x, block.y, block.z};
    m.body = [&] { kernel(args...); };
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          m.block_index = {x, y, z};
          if (!run_block()) {
            ADD_FAILURE() << "SIMT emulator, block (" << x << "," << y << "," << z
                          << "): " << m.error;
            return 1;
          }
        }
      }
    }
    return 0;
  }
};

}  // namespace simt

// ---- CUDA's built-ins, as the kernels use them
// ------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define STRATA_DYNAMIC_SHARED(type, name) type* name = ::simt::dynamic_shared<type>()
#define threadIdx (::simt::fiber().index)
#define blockIdx (::simt::machine().block_index)
#define blockDim (::simt::machine().block_dim)
#define gridDim (::simt::machine().grid_dim)

inline void __syncthreads() {
  simt::wait_at(simt::Fiber::State::kBlockBarrier);
}

inline int __syncthreads_or(int predicate) {
  simt::fiber().vote = predicate != 0;
  simt::wait_at(simt::Fiber::State::kBlockBarrier);
  return simt::machine().block_vote;
}

template <typename T>
T __shfl_sync(unsigned mask, T v, int source) {
  EXPECT_EQ(mask, 0xffffffffu) << "the kernels only use full-warp shuffles";
  return simt::exchange(v, source);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  EXPECT_EQ(mask, 0xffffffffu) << "the kernels only use full-warp shuffles";
  return simt::exchange(v, simt::fiber().lane ^ lane_mask);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  EXPECT_EQ(mask, 0xffffffffu) << "the kernels only use full-warp ballots";
  simt::Machine& m = simt::machine();
  const int warp = simt::fiber().warp;
  m.slots[warp][simt::fiber().lane] = predicate != 0 ? 1 : 0;
  simt::wait_at(simt::Fiber::State::kWarpBarrier);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l)
    bits |= static_cast<unsigned>(m.slots[warp][l] & 1u) << l;
  simt::wait_at(simt::Fiber::State::kWarpBarrier);
  return bits;
}

inline int __popc(unsigned x) {
  return std::popcount(x);
}
inline int __clz(int x) {
  return std::countl_zero(static_cast<unsigned>(x));
}
inline float __uint_as_float(unsigned x) {
  return std::bit_cast<float>(x);
}
inline unsigned __float_as_uint(float x) {
  return std::bit_cast<unsigned>(x);
}
// Each rounds once, as the CUDA intrinsics do (volatile keeps GCC from contracting).
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fdiv_rn(float a, float b) {
  volatile float r = a / b;
  return r;
}
inline float __fsqrt_rn(float x) {
  return std::sqrt(x);
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}

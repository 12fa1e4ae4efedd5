// Tensor-core instructions for the kernels of kernels/cuda: the warp-level multiply-add
// mma.sync m16n8k16 (bf16 or fp16 in, fp32 accumulate), ldmatrix (one, two or four 8x8 matrices of
// 16-bit elements from shared memory, optionally transposed) and cp.async (global to shared memory,
// asynchronous) with its commit/wait groups; and the fragment layouts a kernel needs to move data
// in and out of them.
//
// On the GPU (sm_80 or newer) each function is one inline PTX instruction. Under the SIMT emulator
// (tests/support/simt_emulator.h, included first; it defines STRATA_SIMT_EMULATION) each is the
// emulator's model of the same warp-collective instruction, with the PTX ISA's layouts, so kernels
// written against these functions run on the CPU in tests. mma and ldmatrix are .sync.aligned: all
// 32 lanes of a warp call the same one, never under a lane-dependent condition.
//
// One mma computes D (16x8, M x N) = A (16x16, M x K, "row": row-major) * B (16x8, K x N, "col":
// stored as its transpose, N x K) + C, each matrix spread over the warp as mma_a_element,
// mma_b_element and mma_c_element say (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
// point type"). The emulator keeps its own copy of those layouts, so a wrong helper here fails the
// tests (tests/kernels/tensor_core_emulated_test.cc) instead of agreeing with itself.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/device_math.cuh"

#if !defined(STRATA_SIMT_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/cuda/tensor_core.cuh needs sm_80 or newer (bf16 mma.m16n8k16, cp.async)"
#endif

STRATA_CUDA_NAMESPACE(cuda_kernels) {

// One lane's fragments of an mma.m16n8k16: A is a0..a7 and B b0..b3, two 16-bit elements to a
// register, the lower-numbered in the low half; C and D are c0..c3, one float each.
struct MmaA {
  std::uint32_t reg[4];
};
struct MmaB {
  std::uint32_t reg[2];
};
struct MmaAcc {
  float reg[4];
};

// A position in a matrix.
struct TileIndex {
  int row;
  int col;
};

// Where element i of lane `lane`'s fragment sits in its matrix (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"; groupID = lane >> 2, threadID_in_group = lane % 4).
// A (M x K), 0 <= i < 8: rows groupID (a0, a1, a4, a5) and groupID + 8 (a2, a3, a6, a7); columns
// threadID_in_group * 2 + (i & 1), plus 8 for a4..a7.
__host__ __device__ constexpr TileIndex mma_a_element(int lane, int i) {
  const bool upper = i < 2 || (i >= 4 && i < 6);
  return {(lane >> 2) + (upper ? 0 : 8), (lane % 4) * 2 + (i & 1) + (i < 4 ? 0 : 8)};
}
// B (K x N), 0 <= i < 4: row threadID_in_group * 2 + (i & 1), plus 8 for b2, b3; column groupID.
__host__ __device__ constexpr TileIndex mma_b_element(int lane, int i) {
  return {(lane % 4) * 2 + (i & 1) + (i < 2 ? 0 : 8), lane >> 2};
}
// C and D (M x N), 0 <= i < 4: row groupID (c0, c1) or groupID + 8 (c2, c3); column
// threadID_in_group * 2 + (i & 1).
__host__ __device__ constexpr TileIndex mma_c_element(int lane, int i) {
  return {(lane >> 2) + (i < 2 ? 0 : 8), (lane % 4) * 2 + (i & 1)};
}

// The row start (row, column) that lane `lane` gives ldmatrix.x4 (PTX ISA, "Warp-level matrix load
// instruction: ldmatrix": lanes 8j..8j+7 address the rows of matrix j) to load, from shared memory:
// - ldmatrix_x4_a_row: a 16x16 A tile stored row-major (M x K); registers 0..3 are MmaA's.
// - ldmatrix_x4_b_row: the B fragments of two mma (columns n 0-7 and 8-15) from B's transpose
//   stored row-major (N x K, e.g. K in attention); registers 0, 1 are the first MmaB, 2, 3 the
//   second.
// - ldmatrix_x4_trans_b_row, with ldmatrix_trans: the same from B stored row-major (K x N, e.g. V).
__host__ __device__ constexpr TileIndex ldmatrix_x4_a_row(int lane) {
  return {lane % 16, (lane / 16) * 8};
}
__host__ __device__ constexpr TileIndex ldmatrix_x4_b_row(int lane) {
  return {(lane / 16) * 8 + lane % 8, ((lane / 8) % 2) * 8};
}
__host__ __device__ constexpr TileIndex ldmatrix_x4_trans_b_row(int lane) {
  return {lane % 16, (lane / 16) * 8};
}

// Two 16-bit elements in one register, `lo` in the low half (a fragment's element order).
__host__ __device__ constexpr std::uint32_t pack_16x2(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | static_cast<std::uint32_t>(hi) << 16;
}

#if !defined(STRATA_SIMT_EMULATION)
// A generic pointer into shared memory as the 32-bit .shared address PTX takes.
__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// d = a * b + c: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (d may be c).
__device__ __forceinline__ void mma_m16n8k16_bf16(MmaAcc& d, const MmaA& a, const MmaB& b,
                                                  const MmaAcc& c) {
#if defined(STRATA_SIMT_EMULATION)
  ::simt::mma_m16n8k16(d.reg, a.reg, b.reg, c.reg, true);
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d.reg[0]), "=f"(d.reg[1]), "=f"(d.reg[2]), "=f"(d.reg[3])
      : "r"(a.reg[0]), "r"(a.reg[1]), "r"(a.reg[2]), "r"(a.reg[3]), "r"(b.reg[0]), "r"(b.reg[1]),
        "f"(c.reg[0]), "f"(c.reg[1]), "f"(c.reg[2]), "f"(c.reg[3]));
#endif
}

// d = a * b + c: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (d may be c).
__device__ __forceinline__ void mma_m16n8k16_f16(MmaAcc& d, const MmaA& a, const MmaB& b,
                                                 const MmaAcc& c) {
#if defined(STRATA_SIMT_EMULATION)
  ::simt::mma_m16n8k16(d.reg, a.reg, b.reg, c.reg, false);
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d.reg[0]), "=f"(d.reg[1]), "=f"(d.reg[2]), "=f"(d.reg[3])
      : "r"(a.reg[0]), "r"(a.reg[1]), "r"(a.reg[2]), "r"(a.reg[3]), "r"(b.reg[0]), "r"(b.reg[1]),
        "f"(c.reg[0]), "f"(c.reg[1]), "f"(c.reg[2]), "f"(c.reg[3]));
#endif
}

// ldmatrix.sync.aligned.m8n8.x{kCount}.shared.b16: kCount (1, 2 or 4) 8x8 matrices of 16-bit
// elements; this lane's `row` is the start of row lane % 8 of matrix lane / 8 (16-byte aligned;
// ignored on lanes >= 8 * kCount). Register j receives, of matrix j, row lane / 4, elements
// 2 (lane % 4) and 2 (lane % 4) + 1. Shared-memory writes it reads must be ordered before it by
// __syncthreads or __syncwarp.
template <int kCount>
__device__ __forceinline__ void ldmatrix(std::uint32_t (&r)[kCount], const void* row) {
  static_assert(kCount == 1 || kCount == 2 || kCount == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(STRATA_SIMT_EMULATION)
  ::simt::ldmatrix(r, row, false);
#elif defined(__CUDA_ARCH__)
  if constexpr (kCount == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(shared_address(row))
                 : "memory");
  } else if constexpr (kCount == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row))
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
  }
#endif
}

// ldmatrix.sync.aligned.m8n8.x{kCount}.trans.shared.b16: as ldmatrix, of the transposed matrices:
// register j receives, of matrix j, column lane / 4, rows 2 (lane % 4) and 2 (lane % 4) + 1.
template <int kCount>
__device__ __forceinline__ void ldmatrix_trans(std::uint32_t (&r)[kCount], const void* row) {
  static_assert(kCount == 1 || kCount == 2 || kCount == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(STRATA_SIMT_EMULATION)
  ::simt::ldmatrix(r, row, true);
#elif defined(__CUDA_ARCH__)
  if constexpr (kCount == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(shared_address(row))
                 : "memory");
  } else if constexpr (kCount == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row))
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
  }
#endif
}

// cp.async.ca.shared.global: starts copying kBytes (4, 8 or 16) from global `src` to shared `dst`,
// both aligned to kBytes. The data may be read only after a cp_async_wait_* that covers its group
// (and, by other threads, after a barrier that follows that wait).
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(void* dst, const void* src) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(STRATA_SIMT_EMULATION)
  ::simt::cp_async(dst, src, kBytes, kBytes);
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "n"(kBytes)
               : "memory");
#endif
}

// cp.async.cg.shared.global: as cp_async_ca<16>, cached in L2 only.
__device__ __forceinline__ void cp_async_cg(void* dst, const void* src) {
#if defined(STRATA_SIMT_EMULATION)
  ::simt::cp_async(dst, src, 16, 16);
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src)
               : "memory");
#endif
}

// cp.async.cg.shared.global with src-size, for a tile's edge: copies the first src_bytes (0..16)
// of `src` and fills the rest of the 16 bytes with zeros (none copied when src_bytes is 0).
__device__ __forceinline__ void cp_async_cg_zfill(void* dst, const void* src, int src_bytes) {
#if defined(STRATA_SIMT_EMULATION)
  ::simt::cp_async(dst, src, 16, src_bytes);
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(src_bytes)
               : "memory");
#endif
}

// cp.async.commit_group: this thread's copies since the last commit become one group.
__device__ __forceinline__ void cp_async_commit_group() {
#if defined(STRATA_SIMT_EMULATION)
  ::simt::cp_async_commit_group();
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// cp.async.wait_group kPending: waits until at most the kPending most recent groups of this thread
// are incomplete.
template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  static_assert(kPending >= 0, "wait_group takes a count of groups");
#if defined(STRATA_SIMT_EMULATION)
  ::simt::cp_async_wait_group(kPending);
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// cp.async.wait_all: commits this thread's uncommitted copies and waits for all of them.
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(STRATA_SIMT_EMULATION)
  ::simt::cp_async_wait_all();
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)

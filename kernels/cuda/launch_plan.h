// The host-side launch decisions of the CUDA kernels, kept free of CUDA so that they build and are
// tested on every machine (CMake builds *_plan.cc everywhere): how a GEMM is cut into blocks that
// fit the fixed 16-bit conversion workspace, how column reductions are split over the fixed
// scratch, how the attention kernels are launched for a head size, and grid sizes of element-wise
// kernels and reductions. The kernels in kernels/cuda/ launch exactly what these functions
// return. No CUDA and no Status in here: the .cu files include it too. The backend's own memory
// decisions (workspace sizes, the pinned limit) are in src/backend/cuda/memory_plan.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::cuda {

// ---- GEMM ---------------------------------------------------------------------------------------
// What the GEMM inputs are rounded to before cuBLASLt multiplies them; accumulation and the output
// are always fp32.
//   kFp32: fp32 inputs, fp32 arithmetic (CUBLAS_COMPUTE_32F);
//   kTf32: fp32 inputs, tensor cores round them to TF32 (CUBLAS_COMPUTE_32F_FAST_TF32);
//   kBf16, kFp16: both operands are rounded (nearest even) to bf16 / fp16 into a workspace, then
//     multiplied on tensor cores with fp32 accumulation, as autocast does.
enum class GemmPrecision : std::uint8_t { kFp32 = 0, kTf32 = 1, kBf16 = 2, kFp16 = 3 };
const char* to_string(GemmPrecision precision);
// "fp32", "tf32", "bf16", "fp16"; nullopt otherwise.
std::optional<GemmPrecision> parse_gemm_precision(std::string_view text);
// Whether the operands go through the 16-bit conversion workspace.
constexpr bool converts_operands(GemmPrecision p) {
  return p == GemmPrecision::kBf16 || p == GemmPrecision::kFp16;
}

// Leading dimensions in the conversion workspace are padded to this many elements (16 bytes), so
// every row starts where cuBLASLt's vectorised kernels want it.
inline constexpr std::int64_t kWorkspaceLdAlign = 8;
// Each block in the workspace starts on a 256-byte boundary (128 16-bit elements).
inline constexpr std::int64_t kWorkspaceBlockAlign = 128;

// How a row-major C(m,n) = alpha op(A)(m,k) op(B)(k,n) + beta C is cut so that one block of op(A)
// (m_block x k_block) and one block of op(B) (k_block x n_block), converted to 16 bits, fit in
// `capacity` workspace elements. Blocks split m and n first (each output element keeps its full
// k-sum in one call, as without blocking); k is split only when a single 64 x 64 output block
// cannot hold its whole k range, and then later k blocks accumulate with beta = 1.
struct GemmBlocking {
  std::int64_t m_block = 0;
  std::int64_t n_block = 0;
  std::int64_t k_block = 0;
  bool n_outer = true;  // loop n blocks outside m blocks (else m outside n)
  // Workspace elements of the A and B regions (each a multiple of kWorkspaceBlockAlign).
  std::int64_t a_elements = 0;
  std::int64_t b_elements = 0;
  std::int64_t blocks() const;  // GEMM calls the plan makes
  std::int64_t m = 0, n = 0, k = 0;
};

// Elements one converted block of op(A) (rows x depth) takes, with its padded leading dimension:
// stored as A is (transposed or not), so a transposed block is depth rows of `rows` values.
std::int64_t a_block_elements(bool trans_a, std::int64_t rows, std::int64_t depth);
// The same for a block of op(B) (depth x cols).
std::int64_t b_block_elements(bool trans_b, std::int64_t depth, std::int64_t cols);
// Padded leading dimension of a converted block whose rows hold `cols` values.
std::int64_t padded_ld(std::int64_t cols);

// The blocking for m, n, k >= 1 and a capacity of at least 2 * 64 * 64 + 2 * 128 elements
// (asserted). Depends only on its arguments, so results do not depend on timing.
GemmBlocking plan_gemm_blocking(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                std::int64_t k, std::int64_t capacity);
inline constexpr std::int64_t kGemmWorkspaceMinElements = 2 * 64 * 64 + 2 * kWorkspaceBlockAlign;

// ---- column reductions (parameter gradients of norms and biases) --------------------------------
// dw(C) += sum over N rows, done in two deterministic passes: `chunks` groups of consecutive rows
// each write a partial sum per column (in double) to scratch, then one pass adds the partials in
// chunk order. `arrays` columns are reduced at once (LayerNorm: dw and db).
struct ColumnReducePlan {
  std::int64_t chunks = 0;
  std::int64_t rows_per_chunk = 0;
};
// chunks = 0 when even one chunk does not fit (arrays * cols > scratch_doubles).
ColumnReducePlan plan_column_reduce(std::int64_t rows, std::int64_t cols, int arrays,
                                    std::int64_t scratch_doubles);
inline constexpr std::int64_t kColumnReduceMaxChunks = 512;
inline constexpr std::int64_t kColumnReduceMinRows = 16;

// ---- attention ----------------------------------------------------------------------------------
// The attention kernels give each lane of a warp ceil(D / 32) of a row's D values ("per lane",
// rounded up to 1, 2, 4 or 8, so D <= 256), use 4 warps per block, and hold one 32-key tile of K
// and V in shared memory at a time.
struct AttentionLaunch {
  int per_lane = 0;            // 1, 2, 4 or 8
  int padded_dim = 0;          // per_lane * 32
  int rows_per_warp = 0;       // query rows (forward, dq) or key rows (dk/dv) per warp
  int rows_per_block = 0;      // rows_per_warp * 4
  int forward_smem_bytes = 0;  // Q rows + K tile (padded rows) + V tile
  int dq_smem_bytes = 0;       // Q and dO rows + padded K and V tiles
  int dkv_smem_bytes = 0;      // K and V rows + padded Q and dO tiles + lse and delta
};
inline constexpr int kAttentionWarps = 4;
inline constexpr int kAttentionKeyTile = 32;
inline constexpr int kAttentionHeadDimMax = 256;
// per_lane = 0 for head_dim outside [1, 256].
AttentionLaunch plan_attention(std::int64_t head_dim);

// ---- tensor-core flash attention on fp32 activations (flash_attention_f32.cuh)
// ------------------- The backend's activations are fp32 and the flash kernels take 16-bit q, k, v:
// each call rounds its inputs into the backend's 16-bit workspace (the one the GEMMs round their
// operands into; the two never run at once, both being on the compute stream), laid out compactly,
// and widens the results back. Batch rows are independent, so a call runs in passes of as many
// whole batch rows as the workspace holds. Per batch row, in 16-bit elements (T = seq_len, hd =
// heads * head_dim, kvd = kv_heads * head_dim):
//   forward:  T (hd + 2 kvd) for q, k, v, then T hd for out;
//   backward: 2 T (hd + 2 kvd) for q, k, v and dq, dk, dv, then 2 T hd for out and dO, then 2 heads
//   T
//             for the fp32 rowsum(dO * O) (delta).
// Every piece starts on a multiple of 8 elements (16 bytes, cp.async's row alignment) when head_dim
// is a multiple of 8, as every flash head size is.
struct FlashIoPlan {
  std::int64_t per_batch_row = 0;  // 16-bit elements one batch row needs
  std::int64_t batch_rows = 0;     // batch rows per pass (0: one row does not fit)
  std::int64_t passes = 0;
};
constexpr FlashIoPlan plan_flash_io(std::int64_t batch, std::int64_t seq_len, std::int64_t heads,
                                    std::int64_t kv_heads, std::int64_t head_dim, bool backward,
                                    std::int64_t workspace_elements) {
  FlashIoPlan p;
  const std::int64_t hd = heads * head_dim, kvd = kv_heads * head_dim;
  p.per_batch_row = backward ? 2 * seq_len * (hd + 2 * kvd) + 2 * seq_len * hd + 2 * heads * seq_len
                             : seq_len * (hd + 2 * kvd) + seq_len * hd;
  if (p.per_batch_row <= 0 || batch <= 0) return p;
  p.batch_rows = workspace_elements / p.per_batch_row;
  if (p.batch_rows > batch) p.batch_rows = batch;
  p.passes = p.batch_rows > 0 ? (batch + p.batch_rows - 1) / p.batch_rows : 0;
  return p;
}

// Whether a call of that shape can take the flash path on fp32 arrays: a flash head size (64, 80,
// 96, 128, 256), whole GQA groups and at least one batch row per pass, forward and backward alike
// (so that a forward and its backward take the same path).
constexpr bool flash_io_takes(std::int64_t batch, std::int64_t seq_len, std::int64_t heads,
                              std::int64_t kv_heads, std::int64_t head_dim,
                              std::int64_t workspace_elements) {
  const bool head =
      head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256;
  return head && kv_heads > 0 && heads > 0 && heads % kv_heads == 0 &&
         plan_flash_io(batch, seq_len, heads, kv_heads, head_dim, true, workspace_elements)
                 .batch_rows > 0;
}

// ---- element-wise kernels -----------------------------------------------------------------------
inline constexpr int kElementwiseThreads = 256;
inline constexpr std::int64_t kElementwiseBlocksMax = 1 << 16;
// Blocks of kElementwiseThreads for n elements with grid-stride loops: ceil(n / threads), at
// most kElementwiseBlocksMax, at least 1.
std::int64_t elementwise_blocks(std::int64_t n);

// The fixed grid of the deterministic reductions (sum, sum of squares, gradient statistics): the
// summation order depends only on n, never on the GPU.
inline constexpr int kReduceBlocks = 256;
inline constexpr int kReduceThreads = 256;

}  // namespace strata::cuda

// The CUDA backend's packed sequences and ignored targets (runner_batch_test.cc's checks on the
// GPU): a row of two documents trains what the documents as separate rows train, for GPT-2's
// learned positions and the Llama family's RoPE, windows, norms and biases. Skips without a GPU.
#include <gtest/gtest.h>

#include "tests/model/runner_batch_support.h"
#include "tests/model/tiny_models.h"

namespace strata::model {
namespace {

TEST(RunnerBatchCuda, PackedRowTrainsWhatSeparateRowsTrain) {
  STRATA_GPU_OR_SKIP(gpu, {});
  testing::expect_packed_equals_separate(gpu, testing::tiny_gpt2(true), 5, 7);
  testing::expect_packed_equals_separate(gpu, testing::tiny_llama(false), 9, 4);
  testing::expect_packed_equals_separate(gpu, testing::tiny_qwen_like(), 6, 8);
  testing::expect_packed_equals_separate(gpu, testing::tiny_phi3_like(), 2, 2);
}

}  // namespace
}  // namespace strata::model

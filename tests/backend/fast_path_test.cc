// FastPaths (backend/fast_path.h) and the flash and cuDNN attentions' choice of head sizes
// (backend/attention_check.h), driven by fake checks: a path whose check passes is listed on, one
// whose check fails (or the test seam makes fail) is listed off with the reason and warns once,
// one that does not apply is listed off without a check or a warning.
#include "backend/fast_path.h"

#include <gtest/gtest.h>
#include <json/value.h>

#include <string>
#include <vector>

#include "backend/attention_check.h"

namespace strata::backend {
namespace {

struct Recorder {
  std::vector<std::string> warnings;
  FastPaths::Warn sink() {
    return [this](const std::string& m) { warnings.push_back(m); };
  }
};

TEST(FastPaths, APassingCheckAdoptsThePathWithoutAWarning) {
  Recorder r;
  FastPaths paths(r.sink());
  int calls = 0;
  EXPECT_TRUE(paths.adopt("fused_gelu", "GELU after the GEMM", "bf16 GEMMs", [&] {
    ++calls;
    return Status::ok();
  }));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(paths.active("fused_gelu"));
  ASSERT_EQ(paths.list().size(), 1u);
  EXPECT_EQ(paths.list()[0].detail, "bf16 GEMMs");
  EXPECT_TRUE(r.warnings.empty());
}

TEST(FastPaths, AFailingCheckFallsBackWithOneWarningNamingThePathAndTheReason) {
  Recorder r;
  FastPaths paths(r.sink());
  EXPECT_FALSE(paths.adopt("fused_gelu", "GELU after the GEMM", "bf16 GEMMs", [] {
    return Status(ErrorCode::kInternal, "element 7: got 1.5, want 1.25");
  }));
  EXPECT_FALSE(paths.active("fused_gelu"));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("fast path fused_gelu is off"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("element 7: got 1.5, want 1.25"), std::string::npos);
  EXPECT_NE(r.warnings[0].find("instead: GELU after the GEMM"), std::string::npos);
  EXPECT_NE(paths.list()[0].detail.find("its check failed"), std::string::npos);

  // Listed, off, in the JSON and the text.
  const Json::Value j = fast_paths_json(paths.list());
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["name"].asString(), "fused_gelu");
  EXPECT_FALSE(j[0]["active"].asBool());
  EXPECT_NE(j[0]["detail"].asString().find("got 1.5"), std::string::npos);
  EXPECT_NE(fast_paths_text(paths.list()).find("fused_gelu: off: its check failed"),
            std::string::npos);

  // Counts appear where the backend keeps them.
  std::vector<FastPath> counted = paths.list();
  EXPECT_FALSE(fast_paths_json(counted)[0].isMember("uses"));
  counted[0].uses = 12;
  counted[0].declined = 2;
  EXPECT_EQ(fast_paths_json(counted)[0]["uses"].asInt64(), 12);
  EXPECT_EQ(fast_paths_json(counted)[0]["declined"].asInt64(), 2);

  // Disabling an off path changes nothing and warns no more.
  paths.disable("fused_gelu", "refused at run time");
  EXPECT_EQ(r.warnings.size(), 1u);
}

TEST(FastPaths, ANotApplicablePathRunsNoCheckAndDoesNotWarn) {
  Recorder r;
  FastPaths paths(r.sink());
  paths.not_applicable("flash_attention", "fp32 kernels", "fp32 GEMMs");
  EXPECT_FALSE(paths.active("flash_attention"));
  EXPECT_EQ(paths.list()[0].detail, "not applicable: fp32 GEMMs");
  EXPECT_TRUE(r.warnings.empty());
}

TEST(FastPaths, DisablingAnActivePathWarnsOnce) {
  Recorder r;
  FastPaths paths(r.sink());
  paths.adopt("p", "q", "all", [] { return Status::ok(); });
  paths.disable("p", "cuDNN refused shape 3");
  paths.disable("p", "again");
  EXPECT_FALSE(paths.active("p"));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("cuDNN refused shape 3"), std::string::npos);
}

TEST(FastPaths, TheTestSeamFailsTheNamedPathWithoutRunningItsCheck) {
  Recorder r;
  FastPaths paths(r.sink());
  fail_fast_path_for_test("flash");
  int calls = 0;
  const bool on = paths.adopt("flash_attention", "fp32 kernels", "all", [&] {
    ++calls;
    return Status::ok();
  });
  const bool other = paths.adopt("fused_gelu", "GELU", "all", [] { return Status::ok(); });
  fail_fast_path_for_test(std::nullopt);
  EXPECT_FALSE(on);
  EXPECT_TRUE(other);
  EXPECT_EQ(calls, 0);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("STRATA_TEST_FAST_PATH_FAIL"), std::string::npos);
}

TEST(FastPaths, TheTestSeamFailsEachOfCommaSeparatedNames) {
  Recorder r;
  FastPaths paths(r.sink());
  fail_fast_path_for_test("flash,logits_16");
  const bool flash =
      paths.adopt("flash_attention", "fp32 kernels", "all", [] { return Status::ok(); });
  const bool logits =
      paths.adopt("logits_16bit", "fp32 logits", "all", [] { return Status::ok(); });
  const bool other = paths.adopt("fused_gelu", "GELU", "all", [] { return Status::ok(); });
  fail_fast_path_for_test(",");  // empty parts name nothing
  const bool empty = paths.adopt("gemm_bias", "bias kernel", "all", [] { return Status::ok(); });
  fail_fast_path_for_test(std::nullopt);
  EXPECT_FALSE(flash);
  EXPECT_FALSE(logits);
  EXPECT_TRUE(other);
  EXPECT_TRUE(empty);
  EXPECT_EQ(r.warnings.size(), 2u);
}

TEST(FlashAttentionChoice, EveryHeadSizeThatPassesItsCheckRunsFlash) {
  Recorder r;
  FastPaths paths(r.sink());
  std::vector<std::int64_t> checked;
  const std::vector<std::int64_t> sizes =
      choose_flash_attention(paths, true, true, [&](std::int64_t d) {
        checked.push_back(d);
        return Status::ok();
      });
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{64, 80, 96, 128, 256}));
  EXPECT_EQ(checked, sizes);
  EXPECT_TRUE(paths.active(kFlashAttentionName));
  EXPECT_NE(paths.list()[0].detail.find("bf16, head sizes 64, 80, 96, 128, 256"),
            std::string::npos);
  EXPECT_TRUE(r.warnings.empty());
}

TEST(FlashAttentionChoice, AHeadSizeThatFailsRunsTheFp32KernelsWithOneWarning) {
  Recorder r;
  FastPaths paths(r.sink());
  const std::vector<std::int64_t> sizes =
      choose_flash_attention(paths, true, false, [](std::int64_t d) {
        if (d == 256) return Status(ErrorCode::kUnavailable, "too much shared memory (132 KiB)");
        return Status::ok();
      });
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{64, 80, 96, 128}));
  EXPECT_TRUE(paths.active(kFlashAttentionName));
  EXPECT_NE(paths.list()[0].detail.find("fp16, head sizes 64, 80, 96, 128;"), std::string::npos);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("head size 256"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("132 KiB"), std::string::npos);
}

TEST(FlashAttentionChoice, WhenEveryCheckFailsThePathIsOffWithOneWarning) {
  Recorder r;
  FastPaths paths(r.sink());
  const std::vector<std::int64_t> sizes = choose_flash_attention(
      paths, true, true,
      [](std::int64_t) { return Status(ErrorCode::kInternal, "out row 3: got 2, want 1"); });
  EXPECT_TRUE(sizes.empty());
  EXPECT_FALSE(paths.active(kFlashAttentionName));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("fast path flash_attention is off"), std::string::npos);
  EXPECT_NE(r.warnings[0].find("head size 64: "), std::string::npos);
  EXPECT_NE(r.warnings[0].find(kFlashAttentionReplaces), std::string::npos);
}

TEST(FlashAttentionChoice, OnlyTheRunsHeadSizesAreChecked) {
  Recorder r;
  FastPaths paths(r.sink());
  std::vector<std::int64_t> checked;
  const std::vector<std::int64_t> sizes = choose_flash_attention(paths, true, true,
                                                                 [&](std::int64_t d) {
                                                                   checked.push_back(d);
                                                                   return Status::ok();
                                                                 },
                                                                 {128, 40, 64});
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{64, 128}));
  EXPECT_EQ(checked, sizes);
  EXPECT_NE(paths.list()[0].detail.find("bf16, head sizes 64, 128;"), std::string::npos)
      << paths.list()[0].detail;
  EXPECT_TRUE(r.warnings.empty());
}

TEST(FlashAttentionChoice, HeadSizesWithoutFlashKernelsLeaveItOffWithoutACheck) {
  Recorder r;
  FastPaths paths(r.sink());
  int calls = 0;
  const std::vector<std::int64_t> sizes = choose_flash_attention(paths, true, true,
                                                                 [&](std::int64_t) {
                                                                   ++calls;
                                                                   return Status::ok();
                                                                 },
                                                                 {40});
  EXPECT_TRUE(sizes.empty());
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_FALSE(paths.active(kFlashAttentionName));
  const std::string detail = paths.list()[0].detail;
  EXPECT_NE(detail.find("not applicable: the run's head sizes (40) have no flash kernels (they are "
                        "64, 80, 96, 128, 256)"),
            std::string::npos)
      << detail;
}

TEST(FlashAttentionChoice, Fp32GemmsLeaveItOffWithoutACheck) {
  Recorder r;
  FastPaths paths(r.sink());
  int calls = 0;
  const std::vector<std::int64_t> sizes =
      choose_flash_attention(paths, false, true, [&](std::int64_t) {
        ++calls;
        return Status::ok();
      });
  EXPECT_TRUE(sizes.empty());
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_NE(paths.list()[0].detail.find("not applicable"), std::string::npos);
}

TEST(CudnnAttentionChoice, ItIsCheckedForTheHeadSizesFlashTookAndRunsThere) {
  Recorder r;
  FastPaths paths(r.sink());
  std::vector<std::int64_t> checked;
  const std::vector<std::int64_t> sizes =
      choose_cudnn_attention(paths, {64, 128}, true, Status::ok(), [&](std::int64_t d) {
        checked.push_back(d);
        return Status::ok();
      });
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{64, 128}));
  EXPECT_EQ(checked, sizes);
  ASSERT_TRUE(paths.active(kCudnnAttentionName));
  EXPECT_NE(paths.list()[0].detail.find("bf16, head sizes 64, 128; packed documents"),
            std::string::npos)
      << paths.list()[0].detail;
  EXPECT_TRUE(r.warnings.empty());
}

TEST(CudnnAttentionChoice, AFailingFakeFallsBackToFlashWithOneWarningNamingIt) {
  Recorder r;
  FastPaths paths(r.sink());
  const std::vector<std::int64_t> sizes = choose_cudnn_attention(
      paths, {64, 80, 96, 128, 256}, false, Status::ok(), [](std::int64_t d) {
        if (d == 80) {
          return Status(ErrorCode::kUnavailable,
                        "no cuDNN engine runs the backward attention graph here");
        }
        if (d == 256) return Status(ErrorCode::kInternal, "case ...: lse 3: got 5.1, want 4.2");
        return Status::ok();
      });
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{64, 96, 128}));
  EXPECT_TRUE(paths.active(kCudnnAttentionName));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("fast path cudnn_attention is off for some head sizes"),
            std::string::npos)
      << r.warnings[0];
  EXPECT_NE(r.warnings[0].find(kCudnnAttentionReplaces), std::string::npos);
  EXPECT_NE(r.warnings[0].find("head size 80: "), std::string::npos);
  EXPECT_NE(r.warnings[0].find("head size 256: "), std::string::npos);
}

TEST(CudnnAttentionChoice, WhenEveryCheckFailsFlashRunsEverythingAfterOneWarning) {
  Recorder r;
  FastPaths paths(r.sink());
  const std::vector<std::int64_t> sizes =
      choose_cudnn_attention(paths, {64, 128}, true, Status::ok(), [](std::int64_t) {
        return Status(ErrorCode::kUnavailable, "cudnnCreate failed: CUDNN_STATUS_NOT_INITIALIZED");
      });
  EXPECT_TRUE(sizes.empty());
  EXPECT_FALSE(paths.active(kCudnnAttentionName));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("fast path cudnn_attention is off"), std::string::npos);
  EXPECT_NE(r.warnings[0].find("CUDNN_STATUS_NOT_INITIALIZED"), std::string::npos);
  EXPECT_NE(r.warnings[0].find("flash_attention"), std::string::npos);
}

TEST(CudnnAttentionChoice, WithoutTheLibraryOrTheFlashAttentionNothingIsChecked) {
  for (const bool flash_on : {true, false}) {
    Recorder r;
    FastPaths paths(r.sink());
    int calls = 0;
    const std::vector<std::int64_t> flash =
        flash_on ? std::vector<std::int64_t>{64} : std::vector<std::int64_t>{};
    const Status library =
        flash_on ? Status(ErrorCode::kUnavailable, "cannot load cuDNN: tried libcudnn.so.9")
                 : Status::ok();
    const std::vector<std::int64_t> sizes =
        choose_cudnn_attention(paths, flash, true, library, [&](std::int64_t) {
          ++calls;
          return Status::ok();
        });
    EXPECT_TRUE(sizes.empty());
    EXPECT_EQ(calls, 0);
    EXPECT_TRUE(r.warnings.empty());
    ASSERT_EQ(paths.list().size(), 1u);
    const std::string detail = paths.list()[0].detail;
    EXPECT_NE(detail.find("not applicable"), std::string::npos) << detail;
    EXPECT_NE(detail.find(flash_on ? "libcudnn.so.9" : "flash_attention is off"), std::string::npos)
        << detail;
  }
}

TEST(CudnnAttentionChoice, TheSeamTurnsOnlyTheCudnnPathOff) {
  Recorder r;
  FastPaths paths(r.sink());
  fail_fast_path_for_test("cudnn");
  const std::vector<std::int64_t> flash =
      choose_flash_attention(paths, true, true, [](std::int64_t) { return Status::ok(); });
  const std::vector<std::int64_t> sizes = choose_cudnn_attention(
      paths, flash, true, Status::ok(), [](std::int64_t) { return Status::ok(); });
  fail_fast_path_for_test(std::nullopt);
  EXPECT_EQ(flash.size(), 5u);
  EXPECT_TRUE(sizes.empty());
  EXPECT_TRUE(paths.active(kFlashAttentionName));
  EXPECT_FALSE(paths.active(kCudnnAttentionName));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("cudnn_attention"), std::string::npos) << r.warnings[0];
}

}  // namespace
}  // namespace strata::backend

// The engines under injected faults (common/fault_points.h): an io_uring submit or wait that
// keeps failing ends the request with a named kIo error instead of retrying forever, a few
// EINTR/EBUSY are retried through, and the I/O fault injector fails the N-th operation on a file
// in every engine.
#include <gtest/gtest.h>

#include <cerrno>
#include <optional>

#include "common/fault_points.h"
#include "io/engine.h"
#include "io_test_util.h"
#include "support/run_strata.h"

namespace strata::io {
namespace {

using testing::AlignedBuffer;
using testing::TempDir;

constexpr std::uint64_t kBytes = 256 * 1024;

struct ClearFaults {
  ~ClearFaults() {
    set_uring_fault(UringCall::kSubmit, 0, 0);
    set_uring_fault(UringCall::kWaitCqe, 0, 0);
    set_io_fault(std::nullopt);
  }
};

struct Rig {
  TempDir dir;
  std::unique_ptr<IoEngine> engine;
  FileId file;
  AlignedBuffer buffer{kBytes};
  std::string skipped;  // why the engine cannot run here, if it cannot

  explicit Rig(EngineKind kind) {
    EngineOptions o;
    o.kind = kind;
    o.block_size_bytes = 64 * 1024;
    o.queue_depth = 4;
    o.threads = 1;
    auto made = make_engine(o);
    if (!made.is_ok()) {
      skipped = made.status().to_string();
      return;
    }
    engine = std::move(made).value();
    FileSpec spec;
    spec.paths = {dir.path() + "/data.swp"};
    spec.size_bytes = 4 * kBytes;
    auto opened = engine->open_file(spec);
    EXPECT_TRUE(opened.is_ok()) << opened.status().to_string();
    if (opened.is_ok()) file = *opened;
  }
  Status write(std::uint64_t offset = 0) {
    auto h = engine->submit({Op::kWrite, file, offset, kBytes, buffer.data(), Priority::kDemand});
    if (!h.is_ok()) return h.status();
    return engine->wait(*h).status;
  }
};

#define SKIP_WITHOUT(rig) \
  if (!(rig).skipped.empty()) GTEST_SKIP() << "io_uring is not available here: " << (rig).skipped

TEST(UringFaults, FailingSubmitEndsTheRequestWithANamedError) {
  ClearFaults clear;
  Rig rig(EngineKind::kUring);
  SKIP_WITHOUT(rig);
  ASSERT_TRUE(rig.write().is_ok());
  set_uring_fault(UringCall::kSubmit, EIO, 1000);
  Status failed = rig.write();
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.code(), ErrorCode::kIo);
  const std::string text = failed.to_string();
  EXPECT_NE(text.find("io_uring_submit"), std::string::npos) << text;
  EXPECT_NE(text.find("EIO"), std::string::npos) << text;
  EXPECT_NE(text.find("uring"), std::string::npos) << text;
  // The engine stays failed, and says so, instead of hanging later requests.
  set_uring_fault(UringCall::kSubmit, 0, 0);
  Status again = rig.write(kBytes);
  EXPECT_EQ(again.code(), ErrorCode::kIo) << again.to_string();
}

TEST(UringFaults, SubmitBusyForeverIsBoundedNotALivelock) {
  ClearFaults clear;
  Rig rig(EngineKind::kUring);
  SKIP_WITHOUT(rig);
  set_uring_fault(UringCall::kSubmit, EBUSY, 1u << 30);
  Status failed = rig.write();
  ASSERT_FALSE(failed.is_ok());
  EXPECT_NE(failed.to_string().find("EBUSY"), std::string::npos) << failed.to_string();
  EXPECT_NE(failed.to_string().find("attempts"), std::string::npos) << failed.to_string();
}

TEST(UringFaults, AFewInterruptedSubmitsAreRetriedThrough) {
  ClearFaults clear;
  Rig rig(EngineKind::kUring);
  SKIP_WITHOUT(rig);
  set_uring_fault(UringCall::kSubmit, EINTR, 3);
  Status written = rig.write();
  EXPECT_TRUE(written.is_ok()) << written.to_string();
}

TEST(UringFaults, FailingWaitEndsLaterRequestsWithANamedError) {
  ClearFaults clear;
  Rig rig(EngineKind::kUring);
  SKIP_WITHOUT(rig);
  // The worker may be in a wait already: the fault hits its next one. Within a few requests one
  // fails, naming the call; none hangs.
  set_uring_fault(UringCall::kWaitCqe, EBADF, 1);
  Status failed;
  for (int i = 0; i < 3 && failed.is_ok(); ++i)
    failed = rig.write(static_cast<std::uint64_t>(i % 4) * kBytes);
  ASSERT_FALSE(failed.is_ok()) << "no request failed after the wait did";
  EXPECT_EQ(failed.code(), ErrorCode::kIo);
  EXPECT_NE(failed.to_string().find("io_uring_wait_cqe"), std::string::npos) << failed.to_string();
  EXPECT_NE(failed.to_string().find("EBADF"), std::string::npos) << failed.to_string();
}

// STRATA_TEST_IO_FAULT's programmatic twin: the N-th operation on a matching file fails with the
// errno, in each real engine (they all account results in QueueEngine::account).
TEST(IoFaultInjector, NthOperationOnAMatchingFileFails) {
  for (EngineKind kind : {EngineKind::kUring, EngineKind::kPosix}) {
    ClearFaults clear;
    Rig rig(kind);
    if (!rig.skipped.empty()) continue;
    set_io_fault(IoFault{"data.swp", 1000, ENOSPC});
    EXPECT_TRUE(rig.write(0).is_ok());
    EXPECT_EQ(io_fault_operations(), 4u);  // 64 KiB blocks: four pieces
    set_io_fault(IoFault{"data.swp", 2, ENOSPC});
    Status failed = rig.write(0);
    EXPECT_EQ(failed.code(), ErrorCode::kNoSpace) << failed.to_string();
    EXPECT_NE(failed.to_string().find("data.swp"), std::string::npos) << failed.to_string();
    EXPECT_NE(failed.to_string().find("ENOSPC"), std::string::npos) << failed.to_string();
    // Another file's operations neither count nor fail.
    set_io_fault(IoFault{"other.swp", 1, EIO});
    EXPECT_TRUE(rig.write(0).is_ok());
    EXPECT_EQ(io_fault_operations(), 0u);
  }
}

}  // namespace
}  // namespace strata::io

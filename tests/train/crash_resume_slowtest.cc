// The long variant of crash_resume_itest.cc: a kill -9 at every crash point of a whole run (each
// write, fsync and rename of three checkpoints and the final model), and 20 timed kills.
#include "tests/train/crash_resume_support.h"

namespace strata {
namespace {

TEST(CrashResumeSlow, KilledAtEveryCrashPointRecoversBitIdentically) {
  testing::crash_everywhere(0x5eed18, 0, 20);
}

}  // namespace
}  // namespace strata

// kill -9 at random (seeded, printed) points of checkpoint writes and of training, then recovery:
// bit-identical to an uninterrupted run, a torn checkpoint never loaded. The long variant, every
// crash point and more timed kills, is crash_resume_slowtest.cc.
#include "tests/train/crash_resume_support.h"

namespace strata {
namespace {

TEST(CrashResume, KilledAtRandomPointsRecoversBitIdentically) {
  testing::crash_everywhere(0x5eed17, 4, 2);
}

}  // namespace
}  // namespace strata

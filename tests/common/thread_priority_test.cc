// ServiceThreadPriority: threads started while it is alive get one real-time level above their
// creator under SCHED_FIFO, and nothing changes under the ordinary policy.
#include "common/thread_priority.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <thread>

namespace strata {
namespace {

struct Policy {
  int policy = -1;
  int priority = -1;
};

Policy policy_of_this_thread() {
  Policy p;
  sched_param param{};
  if (pthread_getschedparam(pthread_self(), &p.policy, &param) == 0) {
    p.priority = param.sched_priority;
  }
  return p;
}

Policy policy_of_a_new_thread() {
  Policy p;
  std::thread t([&p] { p = policy_of_this_thread(); });
  t.join();
  return p;
}

// Runs `body` on a thread of its own under `policy` / `priority`; false when not permitted.
template <typename Body>
bool run_under(int policy, int priority, Body body) {
  bool permitted = false;
  std::thread t([&] {
    sched_param param{};
    param.sched_priority = priority;
    permitted = pthread_setschedparam(pthread_self(), policy, &param) == 0;
    if (permitted) body();
  });
  t.join();
  return permitted;
}

TEST(ServiceThreadPriority, ThreadsStartedUnderFifoGetOneLevelMore) {
  Policy creator, created, after;
  const bool permitted = run_under(SCHED_FIFO, 5, [&] {
    {
      ServiceThreadPriority service;
      creator = policy_of_this_thread();
      created = policy_of_a_new_thread();
    }
    after = policy_of_this_thread();
  });
  if (!permitted) GTEST_SKIP() << "SCHED_FIFO not permitted here (needs CAP_SYS_NICE or rtprio)";
  EXPECT_EQ(created.policy, SCHED_FIFO);
  EXPECT_EQ(created.priority, 6);
  EXPECT_EQ(creator.priority, 6);  // raised while the guard lives ...
  EXPECT_EQ(after.policy, SCHED_FIFO);
  EXPECT_EQ(after.priority, 5);  // ... and restored when it goes
}

TEST(ServiceThreadPriority, AtTheHighestLevelNothingChanges) {
  const int top = sched_get_priority_max(SCHED_FIFO);
  Policy created, after;
  const bool permitted = run_under(SCHED_FIFO, top, [&] {
    {
      ServiceThreadPriority service;
      created = policy_of_a_new_thread();
    }
    after = policy_of_this_thread();
  });
  if (!permitted) GTEST_SKIP() << "SCHED_FIFO not permitted here (needs CAP_SYS_NICE or rtprio)";
  EXPECT_EQ(created.priority, top);
  EXPECT_EQ(after.priority, top);
}

TEST(ServiceThreadPriority, OrdinaryPolicyIsLeftAlone) {
  Policy created, after;
  ASSERT_TRUE(run_under(SCHED_OTHER, 0, [&] {
    {
      ServiceThreadPriority service;
      created = policy_of_a_new_thread();
    }
    after = policy_of_this_thread();
  }));
  EXPECT_EQ(created.policy, SCHED_OTHER);
  EXPECT_EQ(created.priority, 0);
  EXPECT_EQ(after.policy, SCHED_OTHER);
}

}  // namespace
}  // namespace strata

// Service threads above compute threads under a real-time policy (see thread_priority.h).
#include "common/thread_priority.h"

#include <pthread.h>
#include <sched.h>

namespace strata {

ServiceThreadPriority::ServiceThreadPriority() {
  sched_param param{};
  if (pthread_getschedparam(pthread_self(), &policy_, &param) != 0) return;
  if (policy_ != SCHED_FIFO && policy_ != SCHED_RR) return;
  priority_ = param.sched_priority;
  if (priority_ >= sched_get_priority_max(policy_)) return;
  sched_param raised{};
  raised.sched_priority = priority_ + 1;
  // Failure (no permission) leaves the priority as it was: a hint, not a requirement.
  raised_ = pthread_setschedparam(pthread_self(), policy_, &raised) == 0;
}

ServiceThreadPriority::~ServiceThreadPriority() {
  if (!raised_) return;
  sched_param param{};
  param.sched_priority = priority_;
  (void)pthread_setschedparam(pthread_self(), policy_, &param);
}

}  // namespace strata

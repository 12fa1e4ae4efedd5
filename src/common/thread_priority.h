// Service threads above compute threads under a real-time policy.
//
// Benchmarks here run under `chrt -f` (SCHED_FIFO) to keep other work on the machine from
// skewing them. A SCHED_FIFO thread is never time-sliced against threads of the same priority,
// so busy compute threads would starve the threads that reap I/O completions and run the
// optimizer pipeline until compute happened to block. While a ServiceThreadPriority is alive,
// the calling thread runs one real-time priority level higher, so threads it creates then start
// there (threads inherit their creator's policy; io_uring's kernel io-wq workers inherit from the
// thread that first submits). Its destructor restores the caller's level. With an ordinary policy,
// at the highest level, or without permission it does nothing. Measured effect: docs/tiers.md.
#pragma once

namespace strata {

class ServiceThreadPriority {
 public:
  ServiceThreadPriority();
  ~ServiceThreadPriority();
  ServiceThreadPriority(const ServiceThreadPriority&) = delete;
  ServiceThreadPriority& operator=(const ServiceThreadPriority&) = delete;

 private:
  int policy_ = 0;
  int priority_ = 0;
  bool raised_ = false;
};

}  // namespace strata

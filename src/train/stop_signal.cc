// SIGINT / SIGTERM handling (see stop_signal.h).
#include "train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace strata::train {
namespace {

std::atomic<int> g_stop{0};

// Async-signal-safe: an atomic store and write(2) only.
void on_signal(int signal) {
  int expected = 0;
  if (!g_stop.compare_exchange_strong(expected, signal)) {
    // The second signal: stop now, as if no handler were installed.
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  static const char kMessage[] =
      "\nstrata: stop requested: finishing the step and writing a checkpoint (signal again to "
      "stop at once, losing the steps since the last checkpoint)\n";
  const ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  static_cast<void>(ignored);  // nothing can be done about a failed write in a signal handler
}

}  // namespace

Status install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGINT, SIGTERM}) {
    // A shell starts background jobs with SIGINT ignored, so that Ctrl-C at the terminal does not
    // reach them; that choice stands (as nohup's does).
    struct sigaction current {};
    if (signal == SIGINT && ::sigaction(SIGINT, nullptr, &current) == 0 &&
        current.sa_handler == SIG_IGN) {
      continue;
    }
    if (::sigaction(signal, &action, nullptr) != 0) {
      return Status(ErrorCode::kInternal, fmt::format("cannot install the {} handler: {}",
                                                      signal_name(signal), std::strerror(errno)));
    }
  }
  return Status::ok();
}

int stop_requested() {
  return g_stop.load(std::memory_order_relaxed);
}

void request_stop(int signal) {
  int expected = 0;
  g_stop.compare_exchange_strong(expected, signal);
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

}  // namespace strata::train

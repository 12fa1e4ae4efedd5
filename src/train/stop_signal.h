// Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (what Slurm, Kubernetes and container
// runtimes send before they kill): the first signal only sets a flag that the trainer reads at a
// safe point (once per step, folded into the step's existing collective so that every rank stops
// after the same step); the run then writes a checkpoint and says how to resume. A second signal
// stops the process at once (the signal's default action).
#pragma once

#include "common/status.h"

namespace strata::train {

// Installs the handlers for SIGINT and SIGTERM (the program calls it once, before training); a
// SIGINT the parent set to be ignored (a shell's background job) stays ignored.
Status install_stop_handlers();

// The signal that asked this process to stop (SIGINT or SIGTERM), or 0.
int stop_requested();

// Asks this process to stop as `signal` would (tests, helper programs).
void request_stop(int signal);

// "SIGINT", "SIGTERM", or "signal N".
const char* signal_name(int signal);

}  // namespace strata::train

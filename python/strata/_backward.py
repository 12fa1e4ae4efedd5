"""Which backward hands its gradients over, for the hooks that act during the backward (the
overlapped hand-off of ``strata._overlap`` and the across-ranks reduction of ``strata._shard``).

Gradients are final only in the last backward before ``step()``: not under ``opt.no_sync()``, and
only every ``accumulation_steps``-th one. The first gradient of a backward queues a callback for
the backward's end, which counts the backward and lets its owner send what no hook sent.
"""

import torch


class BackwardGate:
    """no_sync() depth, the backward count since the last step, and the end-of-backward callback
    of one owner; every method is called with the owner's lock held (`lock`, an RLock), or takes
    it."""

    def __init__(self, lock, accumulation_steps, on_end):
        if int(accumulation_steps) < 1:
            raise ValueError(f"accumulation_steps {accumulation_steps}: valid: 1 or more")
        self.lock = lock
        self.accumulation_steps = int(accumulation_steps)
        self.on_end = on_end  # called under the lock at the end of each backward, after counting
        self.count = 0  # backward passes since the last step()
        self.in_backward = False
        self.no_sync_depth = 0

    def no_sync(self):
        gate = self

        class _NoSync:
            def __enter__(self):
                with gate.lock:
                    gate.no_sync_depth += 1

            def __exit__(self, *exc):
                with gate.lock:
                    gate.no_sync_depth -= 1
                return False

        return _NoSync()

    def gradient_arrived(self):
        """A hook saw a final gradient (lock held): True when this backward hands over."""
        if not self.in_backward:
            self.in_backward = True
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._end)
            except (AttributeError, RuntimeError):
                pass  # no end-of-backward callback here: step() sends what is left
        return self.no_sync_depth == 0 and \
            self.count % self.accumulation_steps == self.accumulation_steps - 1

    def _end(self):
        with self.lock:
            self.in_backward = False
            self.count += 1
            self.on_end()

    def stepped(self):
        """step() ran: the next backward is the first of a new accumulation."""
        self.count = 0

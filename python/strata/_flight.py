"""One optimizer step of ``OffloadAdamW(overlap=True)`` in flight (``strata._overlap``): what has
been handed over, landed and run, the step's outcome once it is decided, and the events the
caller's thread, the hooks and the worker wait on.
"""

import threading


class _Flight:
    """One optimizer step in flight: from the first hand-off (or step()) to its last upload."""

    def __init__(self, t, lrs, scaled, scale, clip, keys):
        self.t = t  # Adam's step count if the step is not skipped
        self.lrs = lrs  # per engine index
        self.scaled = scaled
        self.scale = scale
        self.clip = clip
        self.need_norm = clip > 0 or scaled
        self.multiplier = None if self.need_norm else 1.0
        self.skip = False
        self.norm = None
        self.keys = keys  # every (engine, unit), in forward order
        self.handed = set()  # keys handed over
        self.fired = set()  # id() of the slots whose hook fired
        self.remaining = {}  # key -> slots still to fire
        self.order = []  # parameter indices in the order their gradients were handed over
        self.versions = []  # (slot, gradient tensor, its _version at the hand-off)
        self.norms = {}  # key -> per-tensor norms (floats), once landed
        self.landed = []  # keys landed, in landing order
        self.ran = set()  # keys whose Adam ran (or that a skip left as they were)
        self.closed = False  # every key is handed over (the hooks' and step()'s side)
        self.closed_by_step = False  # the worker has seen step()'s "close"
        self.settled = False  # the caller's thread applied the outcome to the counters
        self.decided = threading.Event()  # multiplier or skip known
        self.done = threading.Event()  # every unit's Adam ran and its upload is enqueued
        self.ready = {k: threading.Event() for k in keys}  # the unit's new parameters are home
        self.grads_final = {}  # key -> CUDA event after the unit's last backward kernels
        self.uploads = {}  # key -> CUDA event after the unit's parameters went up
        self.error = None
        if not self.need_norm:
            self.decided.set()

"""The overlapped hand-off of ``OffloadAdamW(overlap=True)`` (docs/python.md, "Overlap").

Without overlap, ``step()`` runs after the whole backward: every gradient is copied to the host,
Adam runs, every parameter is copied back, and the GPU waits for all of it. With overlap, the
step is spread over the backward and the next forward:

- the backward: each parameter's ``post_accumulate_grad_hook`` counts it; when every parameter of
  a unit (the optimizer's flat units are the buckets) has its final gradient, the unit is handed
  over: an event on the stream that produced the gradients, then, on a side stream, the
  gradients copied into a pinned staging buffer and their per-tensor norms (fp32) computed;
- a worker thread lands each unit (the staging buffer into the optimizer's gradient home, in the
  home's format: fp32, bf16, or the NVMe swap files) and, as soon as the step's multiplier is
  known, runs Strata's pipelined CPU Adam on it. Without clipping or loss scaling the multiplier
  is 1 from the start and Adam starts on each unit as it lands, during the backward; with them,
  it needs the global norm: the per-tensor norms are summed when the last unit has landed, the
  step is decided (skipped on a non-finite norm) and Adam runs over every unit in forward order;
- each unit's new 16-bit parameters go back on another side stream (an H2D copy from the
  registered host home, ordered after the unit's last backward kernels), and the next forward
  waits for them unit by unit: a forward pre-hook on each module makes the current stream wait on
  the upload event of the units its own parameters belong to. Without a module, step() waits for
  all of them before it returns.

The arithmetic is the non-overlapped step's: the same per-unit gradient values, per-tensor norms
computed by the same call on the same lists and summed in the same order, and Adam's tiles
(optimizer_pipeline.h: a step split into parts gives the whole step's bits), so the parameters
are the same bit for bit.

Threads: the hooks run on autograd's threads, step() and the forward pre-hooks on the caller's,
the landings, Adam and uploads on the worker. Shared state is under one lock; the worker is the
only caller of the engines between a flight's first hand-off and its end. A step in flight is a
``_Flight`` (``strata._flight``); what the hand-off shares with the plain step (landing gradients,
copying parameters out, the norms) is in ``strata._engine``.
"""

import collections
import math
import queue
import threading
import time

import torch

from ._core import StrataError, gradient_multiplier
from ._engine import global_norm, unit_norms
from ._backward import BackwardGate
from ._flight import _Flight

_POLL_S = 0.05  # waits wake this often to notice a failed worker


class Overlap:
    """The hooks, streams, staging buffers and worker of one OffloadAdamW(overlap=True)."""

    def __init__(self, opt, module, accumulation_steps, buffers, trace):
        if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
            raise StrataError("OffloadAdamW(overlap=True): this torch has no "
                              "Tensor.register_post_accumulate_grad_hook; valid: torch 2.1 or "
                              "newer, or overlap=False")
        self.lock = threading.RLock()
        self.gate = BackwardGate(self.lock, accumulation_steps, self._backward_ended)
        if buffers < 1:
            raise ValueError(f"overlap_buffers {buffers}: valid: 1 or more")
        self.opt = opt
        self.trace_on = bool(trace)
        self.trace = []  # (lane, label, begin_s, end_s)
        self.t0 = time.perf_counter()
        devices = {s.param.device for e in opt._engines for s in e.slots}
        cuda = [d for d in devices if d.type == "cuda"]
        if len(devices) > 1:
            names = ", ".join(sorted(str(d) for d in devices))
            raise StrataError(f"OffloadAdamW(overlap=True): the parameters are on {names}; "
                              f"valid: every parameter on one device (one optimizer per GPU)")
        self.device = cuda[0] if cuda else None
        self.cuda = self.device is not None
        self.keys = [(ei, u) for ei, e in enumerate(opt._engines) for u in range(len(e.by_unit))]
        self.slot_of = {}
        self.key_of_slot = {}
        for ei, e in enumerate(opt._engines):
            for u, slots in enumerate(e.by_unit):
                for s in slots:
                    self.slot_of[id(s.param)] = (ei, s)
                    self.key_of_slot[id(s)] = (ei, u)
        # Staging: `buffers` per engine, each the size of its largest unit, in the gradients'
        # dtype (a gradient has its parameter's dtype); pinned with a GPU.
        self.free = []
        self.staging_bytes = 0
        for e in opt._engines:
            n = max(max((s.offset + s.numel for s in slots), default=0) for slots in e.by_unit)
            pool = queue.Queue()
            for _ in range(buffers):
                buf = torch.empty(max(n, 1), dtype=e.dtype, pin_memory=self.cuda)
                self.staging_bytes += buf.numel() * buf.element_size()
                pool.put(buf)
            self.free.append(pool)
        self.registered = []
        self.notes = []
        if self.cuda:
            self.d2h = torch.cuda.Stream(self.device)
            self.h2d = torch.cuda.Stream(self.device)
            self._register_homes()
        self.last_upload = {}  # key -> the CUDA event of its latest upload
        self.flight = None  # the step whose hand-off is open (hooks may still fire)
        self.flights = collections.deque()  # steps handed to the worker, oldest first
        self.pending = {}  # key -> the flight whose upload the next forward has yet to wait for
        self.last_order = []
        self.handles = []
        self.hooked = set()  # id() of the slots whose parameter has the hook (requires grad)
        for e in opt._engines:
            for s in e.slots:
                if s.param.requires_grad:
                    self.handles.append(s.param.register_post_accumulate_grad_hook(self._on_grad))
                    self.hooked.add(id(s))
        self.module = module
        if module is not None:
            self._hook_modules(module)
        self.queue = queue.Queue()
        self.worker_error = None
        self.worker = threading.Thread(target=self._work, name="strata-overlap", daemon=True)
        self.worker.start()

    # ---- set-up ------------------------------------------------------------------------------

    def _register_homes(self):
        """Pins the engines' parameter homes (cudaHostRegister) so the uploads are asynchronous
        copies; a home that cannot be registered is copied from pageable memory (a note says so)."""
        cudart = torch.cuda.cudart()
        for e in self.opt._engines:
            for u in range(len(e.by_unit)):
                view = e.param_view(u)
                nbytes = view.numel() * view.element_size()
                if nbytes == 0:
                    continue
                err = cudart.cudaHostRegister(view.data_ptr(), nbytes, 0)
                if int(err) == 0:
                    self.registered.append(view.data_ptr())
                else:
                    self.notes.append(f"overlap: the parameter home of unit {u} could not be "
                                      f"registered with CUDA (error {int(err)}); its uploads are "
                                      f"copies from pageable memory")

    def _hook_modules(self, module):
        import torch.nn as nn
        if not isinstance(module, nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        owned = set()
        for m in module.modules():
            keys = []
            for p in m.parameters(recurse=False):
                hit = self.slot_of.get(id(p))
                if hit is None:
                    continue
                owned.add(id(p))
                key = self.key_of_slot[id(hit[1])]
                if key not in keys:
                    keys.append(key)
            if keys:
                self.handles.append(m.register_forward_pre_hook(self._forward_waiter(keys)))
        # Parameters the module does not hold: the module's own forward waits for them.
        rest = []
        for pid, (ei, s) in self.slot_of.items():
            if pid not in owned:
                key = self.key_of_slot[id(s)]
                if key not in rest:
                    rest.append(key)
        if rest:
            self.handles.append(module.register_forward_pre_hook(self._forward_waiter(rest)))

    def _forward_waiter(self, keys):
        def wait(_module, _args):
            if self.pending:
                for key in keys:
                    self.wait_key(key)
        return wait

    # ---- the backward ------------------------------------------------------------------------

    def no_sync(self):
        return self.gate.no_sync()

    def _backward_ended(self):
        """The gate's end-of-backward callback (lock held): every gradient of this backward is
        final, so units with parameters that got none (unused, or frozen mid-run) go now, as
        step() would send them."""
        fl = self.flight
        if fl is not None and not fl.closed:
            for key in self.keys:
                if key not in fl.handed:
                    self._hand_off(fl, key)
            fl.closed = True

    def _on_grad(self, param):
        with self.lock:
            if not self.gate.gradient_arrived():
                return
            ei, slot = self.slot_of[id(param)]
            self.opt._check_param(slot)
            key = self.key_of_slot[id(slot)]
            if key in self.pending:
                raise StrataError(
                    f"OffloadAdamW(overlap=True): parameter {slot.index} got a gradient, but the "
                    f"forward never waited for its last update (no forward of a module holding it "
                    f"ran, so it was read before its new values had landed); valid: "
                    f"module=<the model> holding every parameter where it is used, or module=None "
                    f"(step() then waits for every update)")
            fl = self.flight
            if fl is None:
                fl = self.flight = self._begin()
            if fl.closed or id(slot) in fl.fired:
                raise StrataError(
                    f"OffloadAdamW(overlap=True): parameter {slot.index} got a second gradient "
                    f"after its hand-off and before step(); valid: step() after each backward, or "
                    f"the earlier micro-batches' backward under opt.no_sync() (or "
                    f"accumulation_steps=N)")
            fl.fired.add(id(slot))
            fl.remaining[key] -= 1
            if fl.remaining[key] == 0:
                self._hand_off(fl, key)

    def _begin(self):
        """A new step's flight: its hyperparameters as they are now (the hand-off starts during
        the backward, so a scheduler's lr must be set before it, as torch's schedulers do)."""
        opt = self.opt
        for older in list(self.flights):
            if older.need_norm:
                self._wait(older.decided, older)
        self._settle_decided()
        scaled = opt._scaled
        scale = opt._ctx.loss_scale() if scaled else 1.0
        lrs = [float(opt.param_groups[e.group_index]["lr"]) for e in opt._engines]
        fl = _Flight(opt._steps + 1, lrs, scaled, scale, opt._clip, self.keys)
        for ei, e in enumerate(opt._engines):
            for u, slots in enumerate(e.by_unit):
                fl.remaining[(ei, u)] = sum(1 for s in slots if id(s) in self.hooked)
        return fl

    def _hand_off(self, fl, key):
        """Sends unit `key`'s gradients to the worker (the caller holds the lock)."""
        ei, u = key
        e = self.opt._engines[ei]
        slots = e.by_unit[u]
        fl.handed.add(key)
        present = []
        for s in slots:
            g = self.opt._dense_grad(s)
            if g is None:
                continue
            present.append((s, g))
            fl.order.append(s.index)
            if s.offload is None:
                fl.versions.append((s, g, g._version))
        begin = time.perf_counter()
        buf = self._take(self.free[ei], fl)
        grads = [g for _, g in present]
        norms = None
        landed = None
        if self.cuda:
            produced = torch.cuda.current_stream(self.device)
            final = torch.cuda.Event()
            final.record(produced)
            fl.grads_final[key] = final
            with torch.cuda.stream(self.d2h):
                self.d2h.wait_event(final)
                for s, g in present:
                    buf[s.offset:s.offset + s.numel].copy_(g.reshape(-1), non_blocking=True)
                    g.record_stream(self.d2h)
                if grads:  # the norms decide clipping and scaling, and catch a non-finite one
                    on_device = unit_norms(grads)
                    norms = torch.empty(len(grads), dtype=torch.float32, pin_memory=True)
                    norms.copy_(on_device, non_blocking=True)
                landed = torch.cuda.Event()
                landed.record(self.d2h)
        else:
            for s, g in present:
                buf[s.offset:s.offset + s.numel].copy_(g.reshape(-1))
            if grads:
                norms = unit_norms(grads)
        for s, _ in present:
            if s.offload is not None:
                s.param.grad = None  # an offloaded model keeps no gradient once handed over
        self._note("hand-off", f"unit {u}", begin)
        self.queue.put(("land", fl, key, buf, [s for s, _ in present], landed, norms))

    def _take(self, pool, fl):
        while True:
            try:
                return pool.get(timeout=_POLL_S)
            except queue.Empty:
                self._raise_if_failed(fl)

    # ---- step() and the forward --------------------------------------------------------------

    def step(self):
        """Hands over what the backward has not, then returns once the step is decided: with
        clipping or loss scaling, when the global norm is known (the last unit landed); Adam and
        the uploads go on behind (module given) or are waited for (module None)."""
        opt = self.opt
        with self.lock:
            opt._check_params()
            fl = self.flight
            if fl is None:
                fl = self._begin()  # no hook handed anything over (gradients set by hand)
            for key in self.keys:
                if key not in fl.handed:
                    self._hand_off(fl, key)
            fl.closed = True
            self._reap()
            for s, g, version in fl.versions:
                if s.param.grad is not g or g._version != version:
                    fl.error = fl.error or StrataError(
                        f"OffloadAdamW(overlap=True): the gradient of parameter {s.index} changed "
                        f"after it was handed over during the backward (clip_grad_norm_, a "
                        f"GradScaler's unscale_ or an in-place edit); valid: give clipping to the "
                        f"optimizer (max_grad_norm=, config gradient_clipping) and fp16 loss "
                        f"scaling (scale_loss()), or overlap=False")
            fl.versions = []  # drop the references: the gradients may be freed now
            self.flight = None
            self.gate.stepped()
            self.last_order = list(fl.order)
            self.flights.append(fl)
            for key in self.keys:
                self.pending[key] = fl  # the next forward waits for each unit's new parameters
            self.queue.put(("close", fl))
        if self.cuda:
            # Later writes to the gradients (zero_grad, the next backward) wait for their copies.
            torch.cuda.current_stream(self.device).wait_stream(self.d2h)
        if fl.error is not None:
            self.synchronize()
        self._wait(fl.decided, fl)
        self._settle_decided()
        if self.module is None:
            self.synchronize()

    def _reap(self):
        """Forgets the steps that are over (the caller holds the lock)."""
        while self.flights and self.flights[0].done.is_set() and \
                self.flights[0].settled:
            self.flights.popleft()

    def _settle_decided(self):
        """Applies the decided steps' outcome to the optimizer's counters and loss scaler, oldest
        first (the caller's thread)."""
        opt = self.opt
        with self.lock:
            for fl in self.flights:
                if fl.settled or not fl.decided.is_set() or fl.error is not None:
                    continue
                fl.settled = True
                opt._last_norm = fl.norm
                opt._record_step(fl.t, fl.skip, fl.scaled)

    def wait_params(self, params):
        """Waits for the pending updates of these parameters (an offloaded unit's fetch)."""
        keys = []
        for p in params:
            hit = self.slot_of.get(id(p))
            if hit is not None:
                key = self.key_of_slot[id(hit[1])]
                if key not in keys:
                    keys.append(key)
        for key in keys:
            self.wait_key(key)

    def updates_landed(self, params):
        """Whether the pending updates of these parameters have landed (no wait)."""
        with self.lock:
            for p in params:
                hit = self.slot_of.get(id(p))
                if hit is None:
                    continue
                fl = self.pending.get(self.key_of_slot[id(hit[1])])
                if fl is not None and not fl.ready[self.key_of_slot[id(hit[1])]].is_set():
                    return False
        return True

    def wait_key(self, key):
        """The next forward's wait for unit `key`'s new parameters (a forward pre-hook)."""
        with self.lock:
            fl = self.pending.get(key)
        if fl is None:
            return
        self._wait(fl.ready[key], fl)
        with self.lock:
            if self.pending.get(key) is fl:
                del self.pending[key]
                if self.cuda and key in fl.uploads:
                    torch.cuda.current_stream(self.device).wait_event(fl.uploads[key])

    def synchronize(self):
        """Waits for every step in flight: Adam ran, the new parameters are in place (the current
        stream waits for their uploads), and raises a failed step's error."""
        while True:
            with self.lock:
                if not self.flights:
                    break
                fl = self.flights[0]
            self._wait(fl.done, fl)
            with self.lock:
                if self.flights and self.flights[0] is fl:
                    self.flights.popleft()
        self._settle_decided()
        with self.lock:
            if self.cuda:
                stream = torch.cuda.current_stream(self.device)
                for key, fl in self.pending.items():
                    if key in fl.uploads:
                        stream.wait_event(fl.uploads[key])
                self.h2d.synchronize()
            self.pending.clear()
        self._raise_if_failed(None)

    def open_hand_off(self):
        """Whether gradients were handed over and step() has not come yet."""
        return self.flight is not None

    def _wait(self, event, fl):
        while not event.wait(_POLL_S):
            self._raise_if_failed(fl)
        self._raise_if_failed(fl)

    def _raise_if_failed(self, fl):
        error = (fl.error if fl is not None else None) or self.worker_error
        if error is not None:
            raise error
        if not self.worker.is_alive():
            raise StrataError("OffloadAdamW(overlap=True): the optimizer's worker thread has "
                              "stopped; valid: create a new optimizer")

    def _note(self, lane, label, begin):
        if self.trace_on:
            self.trace.append((lane, label, begin - self.t0, time.perf_counter() - self.t0))

    # ---- the worker --------------------------------------------------------------------------

    def _work(self):
        if self.cuda:
            torch.cuda.set_device(self.device)
        while True:
            item = self.queue.get()
            if item is None:
                return
            batch = [item]
            while True:
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.queue.put(None)
                    break
                batch.append(more)
            flights = []
            for it in batch:
                fl = it[1]
                if fl not in flights:
                    flights.append(fl)
                if fl.error is not None:
                    if it[0] == "land":
                        self.free[it[2][0]].put(it[3])
                    continue
                try:
                    if it[0] == "land":
                        self._land(*it[1:])
                    else:
                        fl.closed_by_step = True
                except BaseException as ex:  # reported to the caller's thread
                    fl.error = ex if isinstance(ex, StrataError) else StrataError(
                        f"OffloadAdamW(overlap=True): the step failed in the worker: {ex!r}")
            for fl in flights:
                if fl.error is None:
                    try:
                        self._advance(fl)
                    except BaseException as ex:
                        fl.error = ex if isinstance(ex, StrataError) else StrataError(
                            f"OffloadAdamW(overlap=True): the step failed in the worker: {ex!r}")
                if fl.error is not None:
                    self.worker_error = self.worker_error or fl.error
                    fl.decided.set()
                    for ev in fl.ready.values():
                        ev.set()
                    fl.done.set()

    def _land(self, fl, key, buf, present, landed, norms):
        begin = time.perf_counter()
        ei, u = key
        e = self.opt._engines[ei]
        if landed is not None:
            landed.synchronize()
        handed = {id(s) for s in present}
        unit_norms_list = norms.tolist() if norms is not None else []
        if not fl.need_norm:
            # Adam starts on each unit as it lands: a non-finite gradient cannot skip the whole
            # step any more (earlier units may be updated), so the step is refused, loudly. The
            # per-tensor norms (computed beside the copy) tell, without another pass here.
            for s, n in zip(present, unit_norms_list):
                if not math.isfinite(n):
                    raise StrataError(
                        f"OffloadAdamW(overlap=True): parameter {s.index} has a non-finite "
                        f"gradient; without clipping Adam had started on the units that landed "
                        f"before it, so this step is refused rather than skipped and the "
                        f"optimizer cannot step again; valid: gradient_clipping (or "
                        f"max_grad_norm=), which decides the step on the global norm first and "
                        f"skips a non-finite one, or overlap=False (which skips it)")
        e.store_grads(u, lambda s: buf[s.offset:s.offset + s.numel] if id(s) in handed else None)
        self.free[ei].put(buf)
        fl.norms[key] = unit_norms_list
        fl.landed.append(key)
        self._note("land", f"unit {u}", begin)

    def _advance(self, fl):
        """Runs what the flight allows now: Adam on landed units (multiplier known), or the
        decision once every unit has landed."""
        if fl.need_norm and not fl.decided.is_set():
            if not (fl.closed_by_step and len(fl.landed) == len(fl.keys)):
                return
            fl.norm = global_norm(fl.norms[key] for key in fl.keys)
            if not math.isfinite(fl.norm):
                fl.skip = True
            else:
                fl.multiplier = gradient_multiplier(fl.norm, fl.scale, fl.clip)
            fl.decided.set()
            todo = list(fl.keys)  # forward order: the next forward needs the first units first
        else:
            todo = [k for k in fl.landed if k not in fl.ran]
        if fl.skip:
            for key in todo:
                fl.ran.add(key)
                fl.ready[key].set()
        else:
            self._run_adam(fl, todo)
        if fl.closed_by_step and len(fl.ran) == len(fl.keys):
            fl.done.set()

    def _run_adam(self, fl, keys):
        by_engine = collections.OrderedDict()
        for ei, u in keys:
            by_engine.setdefault(ei, []).append(u)
        for ei, units in by_engine.items():
            e = self.opt._engines[ei]
            for u in units:
                previous = self.last_upload.get((ei, u))
                if previous is not None:
                    previous.synchronize()  # the last upload has read the home Adam rewrites
            begin = time.perf_counter()
            e.core.start(fl.lrs[ei], fl.multiplier, fl.t, units)
            for u in units:
                e.core.wait_params(u)
                self._note("adam", f"unit {u}", begin)
                begin = time.perf_counter()
                self._upload(fl, (ei, u))
                self._note("upload", f"unit {u}", begin)
                begin = time.perf_counter()
            e.core.finish()

    def _upload(self, fl, key):
        ei, u = key
        e = self.opt._engines[ei]
        if self.cuda:
            with torch.cuda.stream(self.h2d):
                final = fl.grads_final.get(key)
                if final is not None:
                    self.h2d.wait_event(final)  # the backward's last reads of these parameters
                e.scatter_params(u, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.h2d)
            fl.uploads[key] = event
            self.last_upload[key] = event
        else:
            e.scatter_params(u)  # a parameter that is the home was updated in place
        fl.ran.add(key)
        fl.ready[key].set()

    # ---- shutdown ----------------------------------------------------------------------------

    def close(self):
        try:
            self.synchronize()
        finally:
            for h in self.handles:
                h.remove()
            self.handles = []
            self.queue.put(None)
            self.worker.join()
            if self.cuda:
                cudart = torch.cuda.cudart()
                for ptr in self.registered:
                    cudart.cudaHostUnregister(ptr)
                self.registered = []

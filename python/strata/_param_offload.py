"""Parameter offload for ``strata.torch`` (ZeRO-3 ``offload_param``; docs/python.md "Parameter
offload"): the 16-bit parameters of a PyTorch model live in host memory or on NVMe, and each
unit of the model is materialised on the compute device only while it runs.

Units. A unit is a module subtree: every module whose class is listed in the model's
``_no_split_modules`` (Hugging Face's decoder layers) or in ``unit_modules=`` is one unit with the
parameters of its subtree; the parameters left over (embeddings, the final norm, the head, tied
weights) form the root unit. Parameters with fewer elements than
``stage3_param_persistence_threshold`` are not offloaded: they stay on the device as ordinary
parameters (DeepSpeed's meaning of the key).

Materialising without copies in autograd. An offloaded parameter keeps its ``Parameter`` object
and its storage; releasing it resizes the storage to 0 bytes, materialising resizes it back and
copies the bytes in (through an alias, so the parameter's version counter does not move). Saved
tensors of autograd that are the parameter or views of it see the refilled bytes, so the backward
needs no copy of its own (FSDP2 frees its unsharded parameters the same way).

When. A unit's forward pre-hook materialises it; its forward hook releases it (unless its next
use, in the order recorded by the first iteration, is within ``stage3_max_reuse_distance``
elements) and puts a hook on its outputs that materialises it again just before its backward.
The backward releases it when the gradients of its inputs are final, when every gradient of its
trainable parameters has been accumulated, or at the end of the backward at the latest. The root
unit stays materialised through the root module's forward and through the backward.

Read-ahead. The first iteration (root forward to root forward) records the order in which units
are fetched. Later iterations read ahead along it: NVMe reads on a thread into host staging
(at most ``offload_param.buffer_count`` units staged ahead, ``stage3_prefetch_bucket_size``
elements ahead); the window (``stage3_max_live_parameters`` elements, ``strata.device_bytes_max``
bytes) bounds what is materialised at once, evicting the unit whose next use is farthest. A fetch
that departs from the recorded order is served on demand and counted. With CUDA the copies from
pinned homes are asynchronous on the compute stream.

The optimizer. ``OffloadAdamW`` given the parameters of an offloaded model reads their values
from the homes and writes each step's new values back (host memory: in place; NVMe: one write of
each unit's trainable part); with ``overlap=True`` a unit's gradients are released as soon as they
are handed over, and a unit waits for its pending update before it is materialised.
"""

import collections
import concurrent.futures
import contextlib
import threading
import time
import weakref

import torch

from . import _core
from ._core import StrataError
from ._param_state import _HomesAndReports
from ._param_units import (_REGISTRY, _Entry, _Unit, _aligned, _alias,  # noqa: F401
                           _forget_dead, _tensors, lookup, unit_roots, unit_structure)


class ParamOffload(_HomesAndReports):
    """The offloaded parameters of one model (made by ``strata.torch.offload_parameters``)."""

    def __init__(self, model, ctx, settings, device, unit_modules, trace=False, group=None):
        import torch.nn as nn
        if not isinstance(model, nn.Module):
            raise TypeError(f"offload_parameters: expected a torch.nn.Module, got "
                            f"{type(model).__name__}")
        if getattr(model, "_strata_param_offload", None) is not None:
            raise StrataError("offload_parameters: this model's parameters are offloaded "
                              "already; valid: offload a model once")
        self.model = model
        self.ctx = ctx
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # Tensors report cuda:N: compare with the device they will be on.
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cuda = self.device.type == "cuda"
        self.kind = settings["offload_param"]
        self.persistence = int(settings["stage3_param_persistence_threshold"])
        self.max_live = int(settings["stage3_max_live_parameters"])
        self.bucket = int(settings["stage3_prefetch_bucket_size"])
        self.reuse = int(settings["stage3_max_reuse_distance"])
        self.device_bytes_max = int(settings.get("device_bytes_max", 0))
        self.buffer_count = max(1, int(settings["offload_param_buffer_count"]))
        self.max_in_cpu = int(settings["offload_param_max_in_cpu"])
        self.lock = threading.RLock()
        self.units = []
        self.store = None
        self.counters = collections.Counter()
        self.materialised_bytes = 0
        self.peak_bytes = 0
        self.persistent_bytes = 0
        self.total_bytes = 0
        self.recorded = None  # the first iteration's fetch order (unit indices)
        self.recording = []
        self.cursor = 0
        self.iterations = 0
        self.in_backward = False
        self.before_fetch = None  # set by OffloadAdamW(overlap=True): waits for pending updates
        self.updates_landed = None  # ... and tells, without waiting, whether they have landed
        # Copies to the device ahead of use, on a side stream (CUDA; a test may force it on the
        # CPU, where the copy is simply made earlier).
        self.device_ahead = self.cuda
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.handles = []
        self.pool = None
        self.closed = False
        self._values_cache = None  # (unit, parts) of the last NVMe unit values() read
        self.trace_on = bool(trace)
        self.events = []  # (lane, label, begin_s, end_s) with trace=True
        self.t0 = time.perf_counter()
        self._build(model, unit_modules)
        # ZeRO stage 3 across ranks: each unit has one owner rank, the only one with its home.
        self.ranks = None
        if group is not None:
            from ._param_ranks import UnitRanks
            self.ranks = UnitRanks(group, self.units, float(settings["comm_timeout_s"]))
            self.device_ahead = False  # (a copy ahead would broadcast out of order)
        self._place_homes()
        self.peak_bytes = self.persistent_bytes
        self._hook()
        model._strata_param_offload = self

    # ---- set-up --------------------------------------------------------------------------------

    def _build(self, model, unit_modules):
        roots = unit_roots(model, unit_modules)
        owner = unit_structure(model, unit_modules, roots)
        self.structure = owner
        root = _Unit(0, "<root>", model)
        self.units = [root] + [_Unit(i + 1, name, m) for i, (name, m) in enumerate(roots)]
        by_name = {u.name: u for u in self.units[1:]}
        names = collections.defaultdict(list)
        for pname, p in model.named_parameters(remove_duplicate=False):
            names[id(p)].append(pname)
        # The parameters this offload registers, forgotten when it is collected without close().
        registered = []
        weakref.finalize(self, _forget_dead, registered)
        seen = set()
        for pname, p in model.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise StrataError(f"offload_parameters: parameter '{pname}' has dtype {p.dtype}; "
                                  f"valid: float32, bfloat16, float16")
            self.total_bytes += p.numel() * p.element_size()
            if p.numel() < self.persistence:
                # Persistent: an ordinary parameter on the device (stage3_param_persistence_
                # threshold), never released.
                with torch.no_grad():
                    p.data = p.data.to(self.device)
                self.persistent_bytes += p.numel() * p.element_size()
                continue
            unit = by_name.get(owner[id(p)], root)
            part = 0 if p.requires_grad else 1
            entry = _Entry(p, names[id(p)], unit.part_bytes[part], part)
            unit.part_bytes[part] = _aligned(unit.part_bytes[part] + entry.nbytes)
            unit.entries.append(entry)
        for b_name, b in model.named_buffers():
            mod_name, _, leaf = b_name.rpartition(".")
            mod = model.get_submodule(mod_name) if mod_name else model
            mod._buffers[leaf] = b.to(self.device)
        self.units = [u for u in self.units if u.entries or u is root]
        for i, u in enumerate(self.units):
            u.index = i
            # Nothing of the model's strongly (the units' final places): the registry must not keep
            # a model's offload (its store, swap files, process group) alive once the model is gone.
            for j, e in enumerate(u.entries):
                _REGISTRY[id(e.param)] = (weakref.ref(e.param), weakref.ref(self), i, j)
                registered.append(id(e.param))
        limit_elements = self.max_live
        for u in self.units[1:]:
            if u.numel + root.numel > limit_elements:
                raise StrataError(
                    f"offload_parameters: unit '{u.name}' ({u.numel} elements) and the root unit "
                    f"({root.numel}) do not fit zero_optimization.stage3_max_live_parameters "
                    f"({limit_elements}); valid: at least {u.numel + root.numel}")
            if self.device_bytes_max and u.nbytes + root.nbytes > self.device_bytes_max:
                raise StrataError(
                    f"offload_parameters: unit '{u.name}' ({u.nbytes} bytes) and the root unit "
                    f"({root.nbytes}) do not fit strata.device_bytes_max "
                    f"({self.device_bytes_max}); valid: at least {u.nbytes + root.nbytes}")

    def _place_homes(self):
        """Copies every offloaded parameter into its unit's home and releases it."""
        pin = self.cuda
        nvme = self.kind == "nvme"
        host_elements = 0
        store_sizes = []
        for u in self.units:
            if not self._owns(u):
                continue  # another rank's: its bytes come from there at each fetch
            in_cpu = not nvme or host_elements + u.numel <= self.max_in_cpu
            if in_cpu:
                host_elements += u.numel
            for part in (0, 1):
                if u.part_bytes[part] == 0:
                    continue
                if in_cpu:
                    u.homes[part] = torch.empty(u.part_bytes[part], dtype=torch.uint8,
                                                pin_memory=pin)
                else:
                    u.store_ids[part] = len(store_sizes)
                    store_sizes.append(u.part_bytes[part])
        if store_sizes:
            self.store = _core.ParamStore(self.ctx, store_sizes)
            self.pool = concurrent.futures.ThreadPoolExecutor(1, "strata-param-read")
        for u in self.units:
            images = [self._blank(u, part) if self._owns(u) else None for part in (0, 1)]
            with torch.no_grad():
                for e in u.entries:
                    if images[e.part] is None:
                        continue
                    src = e.param.detach().reshape(-1).to("cpu")
                    images[e.part][e.offset:e.offset + e.nbytes].copy_(src.view(torch.uint8))
            for part in (0, 1):
                if images[part] is not None and u.store_ids[part] is not None:
                    self.store.write(u.store_ids[part], images[part].numpy())
            for e in u.entries:
                p = e.param
                with torch.no_grad():
                    p.data = torch.empty(e.shape, dtype=e.dtype, device=self.device)
                p.untyped_storage().resize_(0)

    def _owns(self, u):
        return self.ranks is None or self.ranks.owns(u)

    def _unit_bytes(self, u, staged=True):
        """The unit's bytes to materialise from: its home (or read-ahead), or across ranks the
        owner's, broadcast to every rank (each rank calls this for the same units in order)."""
        mine = (self._staged_parts(u) if staged else self._read_parts(u)) if self._owns(u) \
            else None
        return mine if self.ranks is None else self.ranks.gather(u, mine)

    def drop_stale(self):
        """Across ranks, after a step: units this rank does not own that are still materialised
        hold the old values (the owner updated its home); released, the next fetch gathers."""
        with self.lock:
            for u in self.units:
                if not self._owns(u) and u.materialised and u.active == 0:
                    self._release(u)

    def _blank(self, u, part):
        if u.part_bytes[part] == 0:
            return None
        if u.homes[part] is not None:
            return u.homes[part]
        return torch.from_numpy(_core.aligned_buffer(u.part_bytes[part]))

    def _hook(self):
        for u in self.units[1:]:
            self.handles.append(u.module.register_forward_pre_hook(
                self._pre_forward(u), with_kwargs=True))
            self.handles.append(u.module.register_forward_hook(self._post_forward(u)))
        self.handles.append(self.model.register_forward_pre_hook(self._root_pre, prepend=True))
        self._wrap_root_forward()
        self.handles.append(self.model.register_forward_hook(self._root_post))
        for u in self.units:
            for e in u.entries:
                if e.trainable and hasattr(e.param, "register_post_accumulate_grad_hook"):
                    self.handles.append(e.param.register_post_accumulate_grad_hook(
                        self._grad_hook(u)))
        self.handles.append(self.model._register_state_dict_hook(self._state_dict_hook))
        self.handles.append(self.model._register_load_state_dict_pre_hook(
            self._load_pre_hook, with_module=True))
        self.handles.append(self.model.register_load_state_dict_post_hook(self._load_post_hook))
        self._loaded_keys = []

    # ---- fetch and release ---------------------------------------------------------------------

    def _read_parts(self, u):
        """The unit's bytes in host memory: its homes, or NVMe read into staging."""
        parts = []
        for part in (0, 1):
            if u.part_bytes[part] == 0:
                parts.append(None)
            elif u.homes[part] is not None:
                parts.append(u.homes[part])
            else:
                begin = time.perf_counter()
                buf = self._blank(u, part)
                self.store.read(u.store_ids[part], buf.numpy())
                self.counters["nvme_read_bytes"] += u.part_bytes[part]
                parts.append(buf)
                self._note("nvme", f"read {u.name}", begin)
        return parts

    def _note(self, lane, label, begin):
        if self.trace_on:
            self.events.append((lane, label, begin - self.t0, time.perf_counter() - self.t0))

    def trace(self):
        """With trace=True: [(lane, label, begin_s, end_s)] of the fetches (lane "fetch"), NVMe
        reads and writes ("nvme") and releases ("release") since the offload was made."""
        return list(self.events)

    def _check_entry(self, e):
        p = e.param
        if p.requires_grad != e.trainable:
            raise StrataError(f"offloaded parameter '{e.name}': requires_grad changed from "
                              f"{e.trainable} to {p.requires_grad} after offload_parameters(); "
                              f"valid: set requires_grad before offloading the model")
        if p.dtype != e.dtype or tuple(p.shape) != e.shape or p.device != self.device:
            raise StrataError(f"offloaded parameter '{e.name}' is now {p.dtype} {tuple(p.shape)} "
                              f"on {p.device}; it was {e.dtype} {e.shape} on {self.device} when "
                              f"offloaded; valid: cast and move the model before "
                              f"offload_parameters()")

    def _fits(self, live, u):
        """Whether u fits the window beside the materialised units `live`."""
        return (sum(v.numel for v in live) + u.numel <= self.max_live and
                (not self.device_bytes_max or
                 sum(v.nbytes for v in live) + u.nbytes <= self.device_bytes_max))

    def _make_room(self, need, keep):
        live = [v for v in self.units if v.materialised]
        while live:
            if self._fits(live, need):
                return
            # Never a running unit, the root, or one whose backward may still read it.
            victims = [v for v in live if v.active == 0 and v is not keep and v.index != 0
                       and not v.backward_open]
            if not victims:
                return
            victim = max(victims, key=self._next_use)
            self._release(victim)
            self.counters["evictions"] += 1
            live.remove(victim)

    def _next_use(self, u):
        if not self.recorded:
            return 0
        rest = self.recorded[self.cursor:]
        return rest.index(u.index) if u.index in rest else len(rest) + 1

    def fetch(self, u):
        """Materialises unit u on the device (the caller's stream waits for it)."""
        with self.lock:
            if self.closed:
                raise StrataError("offload_parameters: the offload was closed")
            self._record(u)
            if not u.materialised:
                for e in u.entries:
                    self._check_entry(e)
        if self.before_fetch is not None:
            # Outside the lock: the optimizer's worker takes it to write this unit's update.
            # (A unit copied ahead had its update landed; this only clears it as waited for.)
            self.before_fetch([e.param for e in u.entries if e.trainable])
        with self.lock:
            if u.materialised:
                self._wait_ready(u)
                self.counters["hits"] += 1
                self._prefetch()
                return
            begin = time.perf_counter()
            self._make_room(u, u)
            staged_ready = u.staged is not None and u.staged.done() or u.in_host
            self._materialise(u, self._unit_bytes(u), ahead=False)
            self.counters["fetches"] += 1
            self._note("fetch", f"{u.name}{'' if staged_ready else ' (waited for its read)'}"
                       if self.store is not None else u.name, begin)
            self._prefetch()

    def _materialise(self, u, parts, ahead):
        """Refills u's storages from its host bytes: on the compute stream, or ahead of use on
        the side stream (the compute stream then waits for ready_event at the fetch, and the
        storages are recorded as used by it, so their release waits for its kernels)."""
        side = self.copy_stream if ahead and self.cuda else None
        compute = torch.cuda.current_stream(self.device) if self.cuda else None
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            for e in u.entries:
                p = e.param
                p.untyped_storage().resize_(e.nbytes)
                src = parts[e.part][e.offset:e.offset + e.nbytes].view(e.dtype).view(e.shape)
                with torch.no_grad():
                    _alias(p, e).copy_(src, non_blocking=self.cuda)
                if side is not None:
                    p.record_stream(compute)
            if self.cuda:
                u.copy_event = torch.cuda.Event()
                u.copy_event.record(side if side is not None else compute)
                u.ready_event = u.copy_event if side is not None else None
        u.materialised = True
        self.materialised_bytes += u.nbytes
        self.peak_bytes = max(self.peak_bytes, self.materialised_bytes + self.persistent_bytes)

    def _wait_ready(self, u):
        if u.ready_event is not None:
            torch.cuda.current_stream(self.device).wait_event(u.ready_event)
            u.ready_event = None

    def _host_written(self, u):
        """Before the host homes of u are rewritten: the copies out of them are done."""
        if u.copy_event is not None:
            u.copy_event.synchronize()
            u.copy_event = None

    def _staged_parts(self, u):
        staged, u.staged = u.staged, None
        if staged is not None:
            if staged.done():
                self.counters["prefetch_hits"] += 1
            return staged.result()
        return self._read_parts(u)

    def _release(self, u):
        if not u.materialised:
            return
        for e in u.entries:
            e.param.untyped_storage().resize_(0)
        if self.trace_on:
            self._note("release", u.name, time.perf_counter())
        u.materialised = False
        u.backward_open = False
        u.ready_event = None
        self.materialised_bytes -= u.nbytes
        self.counters["releases"] += 1

    def _record(self, u):
        if self.recorded is None:
            if not self.recording or self.recording[-1] != u.index:
                self.recording.append(u.index)
            return
        if self.cursor > 0 and self.recorded[self.cursor - 1] == u.index:
            return  # the same unit again (another output's backward hook)
        if self.cursor < len(self.recorded) and self.recorded[self.cursor] == u.index:
            self.cursor += 1
            return
        rest = self.recorded[self.cursor:]
        if u.index in rest:
            self.cursor += rest.index(u.index) + 1
        self.counters["order_departures"] += 1

    def _prefetch(self):
        """Reads ahead along the recorded order (NVMe reads on the thread), and copies to the
        device ahead the units whose bytes are in host memory and fit the window."""
        if self.recorded and self.device_ahead:
            self._device_ahead()
        if not self.recorded or self.store is None:
            return
        ahead = 0
        staged = sum(1 for v in self.units if v.staged is not None)
        for index in self.recorded[self.cursor:]:
            v = self.units[index]
            if ahead >= self.bucket or staged >= self.buffer_count:
                break
            ahead += v.numel
            if v.materialised or v.staged is not None or v.in_host or not self._owns(v):
                continue
            v.staged = self.pool.submit(self._read_parts, v)
            staged += 1
            self.counters["prefetches"] += 1

    def _device_ahead(self):
        ahead = 0
        for index in self.recorded[self.cursor:]:
            v = self.units[index]
            if ahead >= self.bucket:
                break
            ahead += v.numel
            if v.materialised:
                continue
            if not v.in_host and not (v.staged is not None and v.staged.done()):
                break  # its read is not done: later units would only jump the queue
            if self.updates_landed is not None and not self.updates_landed(
                    [e.param for e in v.entries if e.trainable]):
                break  # its new values are still being computed
            if not self._fits([w for w in self.units if w.materialised], v):
                break  # the window is full
            for e in v.entries:
                self._check_entry(e)
            self._materialise(v, self._staged_parts(v), ahead=True)
            self.counters["device_prefetches"] += 1

    # ---- hooks ---------------------------------------------------------------------------------

    def _pre_forward(self, u):
        def hook(module, args, kwargs):
            self.fetch(u)
            u.active += 1
            grad = torch.is_grad_enabled()
            if not self.in_backward:
                u.forward_hooked = grad
                u.pending_inputs = 0
            elif u.forward_hooked:
                # A non-reentrant checkpoint's recomputation: its graph is not differentiated,
                # the first forward's input hooks are the ones that fire.
                grad = False
            if grad:
                for t in _tensors((args, kwargs)):
                    if t.requires_grad:
                        u.pending_inputs += 1
                        t.register_hook(lambda g, u=u: self._input_grad(u) or g)
            return None
        return hook

    def _post_forward(self, u):
        def hook(module, args, output):
            u.active -= 1
            outs = [t for t in _tensors(output) if t.requires_grad] \
                if torch.is_grad_enabled() else []
            for t in outs:
                t.register_hook(lambda g, u=u: self._before_backward(u) or g)
            # In the backward (a checkpointed block's recomputation) its backward comes next.
            if u.active == 0 and not self.in_backward and not self._reused_soon(u):
                with self.lock:
                    self._release(u)
            return None
        return hook

    def _reused_soon(self, u):
        if not self.recorded or self.reuse <= 0:
            return False
        distance = 0
        for index in self.recorded[self.cursor:]:
            if index == u.index:
                return True
            distance += self.units[index].numel
            if distance > self.reuse:
                return False
        return False

    def _root_pre(self, module, args):
        with self.lock:
            if self.units[0].active == 0 and not self.in_backward:
                self.iterations += 1
                if self.recorded is None and self.iterations == 2:
                    self.recorded = self.recording
                self.cursor = 0
        self.fetch(self.units[0])
        self.units[0].active += 1

    def _root_post(self, module, args, output):
        root = self.units[0]
        root.active -= 1
        outs = [t for t in _tensors(output) if t.requires_grad] if torch.is_grad_enabled() else []
        for t in outs:
            t.register_hook(lambda g: self._before_backward(root) or g)
        if root.active == 0 and not (outs and self._reused_soon(root)):
            with self.lock:
                self._release(root)

    def _before_backward(self, u):
        with self.lock:
            if not self.in_backward:
                self.in_backward = True
                try:
                    torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
                except (AttributeError, RuntimeError):
                    self.in_backward = False
            if u.pending_grads == 0:
                u.pending_grads = sum(1 for e in u.entries if e.trainable)
            u.backward_open = True
        self.fetch(u)

    def _input_grad(self, u):
        """The gradient of one of u's inputs is final: every node of u's backward on the way to
        it has run (a frozen parameter is read only by such nodes)."""
        with self.lock:
            u.pending_inputs = max(0, u.pending_inputs - 1)
            self._release_after_backward(u)

    def _grad_hook(self, u):
        # The parameter keeps its hooks where Python's collector does not look: the hook reaches
        # the offload (and the unit, through it) weakly, or a model dropped without close() would
        # never be freed.
        ref = weakref.ref(self)
        index = u.index

        def hook(param):
            off = ref()
            if off is None:
                return
            unit = off.units[index]
            with off.lock:
                if unit.pending_grads > 0:
                    unit.pending_grads -= 1
                    off._release_after_backward(unit)
        return hook

    def _release_after_backward(self, u):
        # Every trainable parameter's gradient accumulated (its nodes ran) and every input's
        # gradient final (the nodes reading frozen parameters ran): u's backward is over.
        if u.pending_grads == 0 and u.pending_inputs == 0 and u.index != 0 and u.active == 0:
            self._release(u)

    def _end_backward(self):
        with self.lock:
            self.in_backward = False
            for u in self.units:
                # Counts left over (a mixture-of-experts expert that got no tokens has no
                # gradient) must not hold the unit through the next backward.
                u.pending_grads = 0
                u.pending_inputs = 0
                if u.active == 0:
                    self._release(u)

    def close(self):
        """Gives every offloaded parameter its values back on the device and removes the hooks
        and swap files."""
        if self.closed:
            return
        with self.lock:
            for u in self.units:
                parts = self._unit_bytes(u, staged=False)
                for e in u.entries:
                    p = e.param
                    with torch.no_grad():
                        p.data = parts[e.part][e.offset:e.offset + e.nbytes].view(e.dtype).view(
                            e.shape).clone().to(self.device)
                    _REGISTRY.pop(id(p), None)
                u.materialised = False
            # Nothing is gathered across ranks after close(): the group goes with the ranks.
            self.ranks = None
            for h in self.handles:
                h.remove()
            self.handles = []
            if self.model.__dict__.get("forward") is not None:
                del self.model.forward
            if self.pool is not None:
                self.pool.shutdown()
            if self.store is not None:
                self.store.close()
            self.closed = True
            self.model._strata_param_offload = None

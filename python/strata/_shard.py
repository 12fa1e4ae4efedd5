"""ZeRO stages 1-3 for ``OffloadAdamW`` across the ranks of a torch.distributed process group
(``OffloadAdamW(..., process_group=...)``; docs/python.md "Across ranks").

The optimizer's flat units (the layout one process would make) are split into contiguous runs of
about equal size, one per rank (at stage 3 a unit holding an offloaded model unit's parameters
goes to that unit's owner); a rank keeps the master weights, moments and gradient home of its
own units only (in its own tier: host memory, or NVMe under ``nvme_path``), so its state is 1/N of
the whole. A step, with communication only through torch.distributed (gloo on the CPU, NCCL on
GPUs):

1. unit by unit, in a fixed order (the last unit first), the gradients go to the unit's owner (a
   ``gather`` of the values and one presence flag per parameter) — at stages 2 and 3 during the
   backward, as each unit's gradients become final (the rank then drops them), at stage 1 at
   ``step()``. The owner sums them in a **fixed order**: per parameter, the first rank that has a
   gradient, then the others in rank order, each added in the parameter's dtype — the left fold
   by which autograd accumulates micro-batches in ``.grad``, so N ranks with micro-batch b give
   the bits of one rank accumulating N micro-batches of b, run after run
   (``strata.gradient_sum: "backend"`` uses the backend's reduce instead);
2. each owner computes its units' per-tensor norms, one all-reduce of them gives every rank the
   global norm (summed in unit order, as one process does), and the step is decided there
   (clipping, loss scaling, a non-finite norm skips it on every rank);
3. each owner runs Strata's CPU Adam on its units, then every unit's new 16-bit parameters are
   broadcast from its owner (at stage 3 the offloaded ones are written to the owner's home
   only: the next fetch broadcasts them, ``strata._param_ranks``).
"""

import datetime
import threading

import torch

from ._backward import BackwardGate
from ._core import StrataError
from ._engine import _Engine, _Slot, global_norm, unit_norms
from ._param_ranks import owners as _owners
from ._param_ranks import wait_work
from ._param_units import lookup


def sharding_for(opt, group, gradients, overlap, settings, specs, accumulation_steps):
    """The Sharding of OffloadAdamW(process_group=group), or None without a group; the
    arguments checked against each other."""
    if group is None:
        if gradients != "local":
            raise StrataError(f"OffloadAdamW: gradients={gradients!r} is for process_group=; "
                              f"valid: 'local' without a process group")
        for _gi, _dtype, slots, _units, _hyper in specs:
            for s in slots:
                hit = lookup(s.param)
                if hit is not None and hit[0].ranks is not None:
                    raise StrataError("OffloadAdamW: the model's parameters are sharded over "
                                      "ranks (offload_parameters(process_group=...)); valid: "
                                      "OffloadAdamW(..., process_group=<the same group>)")
        return None
    if overlap:
        raise StrataError("OffloadAdamW(process_group=...): overlap=True (Adam during the "
                          "backward) across ranks is not built yet (ZeRO stage 2 already sends "
                          "each unit's gradients to its owner during the backward); valid: "
                          "overlap=False with process_group")
    if gradients not in ("local", "averaged"):
        raise StrataError(f"OffloadAdamW: gradients={gradients!r}; valid: 'local' or "
                          f"'averaged'")
    return Sharding(opt, group, int(settings["zero_stage"]), specs,
                    averaged=gradients == "averaged",
                    timeout_s=float(settings["comm_timeout_s"]),
                    accumulation_steps=accumulation_steps,
                    gradient_sum=settings["gradient_sum"])


class _ShardUnit:
    """One flat unit of the whole layout: its owner and parameters (global numbering)."""
    __slots__ = ("key", "owner", "slots", "numel", "dtype", "engine", "local", "replicated")

    def __init__(self, key, owner, slots, numel, dtype):
        self.key = key
        self.owner = owner
        self.slots = slots
        self.numel = numel
        self.dtype = dtype
        self.engine = None  # this rank's _Engine holding it, if this rank owns it
        self.local = None  # its unit index in that engine
        # its parameters that every rank keeps (all but a stage-3 offloaded model's)
        self.replicated = [s for s in slots if lookup(s.param) is None]


class _HandOff:
    """One step's gradients on their way to their owners."""
    __slots__ = ("remaining", "fired", "ready", "issued", "reduced", "next", "closed", "sent")

    def __init__(self, hooked):
        self.remaining = list(hooked)  # per unit: hooked parameters yet to get their gradient
        self.fired = set()  # id() of the slots whose final gradient came
        self.ready = set()  # units whose gradients may go
        self.issued = {}  # unit -> (work, the owner's receive buffers or the sent flat)
        self.reduced = {}  # unit -> {parameter index: summed gradient or None} (owner only)
        self.next = len(hooked) - 1  # the next unit to send: the last first
        self.closed = False  # the backward ended: every unit has gone
        self.sent = 0


class Sharding:
    """The ranks, the ownership of the units and the sharded step of one OffloadAdamW."""

    def __init__(self, opt, group, stage, specs, averaged=False, timeout_s=300.0,
                 accumulation_steps=1, gradient_sum="ordered"):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise StrataError("OffloadAdamW(process_group=...): torch.distributed is not "
                              "initialized; valid: torch.distributed.init_process_group(...) "
                              "first (torchrun sets its environment)")
        if stage not in (1, 2, 3):
            raise StrataError(f"OffloadAdamW(process_group=...): zero_optimization.stage is "
                              f"{stage}; valid across ranks: 1, 2 or 3 (stage 0 keeps a whole "
                              f"replica per rank: use DDP and no process_group)")
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.stage = stage
        # DDP (the HF Trainer's wrapper) has already averaged the gradients over the ranks: every
        # rank holds the same values, so each owner takes its units' gradients as they are.
        self.averaged = bool(averaged)
        # Every collective of a step waits at most this long (strata.comm_timeout_s): a rank that
        # stopped makes the others fail with an error that says so, never hang.
        self.timeout_s = float(timeout_s)
        self.timeout = datetime.timedelta(seconds=self.timeout_s)
        self.nccl = dist.get_backend(group) == "nccl"
        self.global_rank = [dist.get_global_rank(group, r) for r in range(self.world)]
        self.comm_device = torch.device("cuda", torch.cuda.current_device()) if self.nccl \
            else torch.device("cpu")
        if gradient_sum not in ("ordered", "backend"):
            raise StrataError(f"strata.gradient_sum {gradient_sum!r}; valid: 'ordered' or "
                              f"'backend'")
        self.ordered = gradient_sum == "ordered"
        self.opt = opt
        self.lock = threading.RLock()
        self.gate = BackwardGate(self.lock, accumulation_steps, self._backward_ended)
        self.hand = None  # the step whose gradients are on their way (a _HandOff)
        self.handles = []
        self.unit_of = {}  # id(parameter) -> (unit index, its slot)
        self.bytes_sent = 0
        self.last_step_bytes_sent = 0
        self._check_same_parameters(opt)
        keys, sizes = [], []
        for li, (_gi, _dtype, _slots, units, _hyper) in enumerate(specs):
            for u, n in enumerate(units):
                keys.append((li, u))
                sizes.append(n)
        # Stage 3: a unit holding offloaded parameters belongs to the rank that keeps them
        # (offload_parameters(process_group=...)); the others are split as at stages 1 and 2.
        self.offloads, fixed = self._offloads(opt, specs, stage)
        free = [k for k in keys if k not in fixed]
        owner_of = dict(zip(free, _owners([sizes[keys.index(k)] for k in free], self.world)))
        owner_of.update(fixed)
        self.units = []
        self.engines = []
        for li, (gi, dtype, slots, units, hyper) in enumerate(specs):
            by_unit = [[] for _ in units]
            for s in slots:
                by_unit[s.unit].append(s)
            mine = [u for u in range(len(units)) if owner_of[(li, u)] == self.rank]
            engine = None
            if mine:
                local = {u: k for k, u in enumerate(mine)}
                own_slots = [_Slot(s.param, s.index, local[s.unit], s.offset, s.numel)
                             for s in slots if s.unit in local]
                # The rounding of compressed state is keyed by the unit's index in the whole
                # layout, so a shard rounds as the one process holding every unit does.
                engine = _Engine(opt._ctx, gi, dtype, own_slots, [units[u] for u in mine],
                                 hyper, opt._adamw, unit_ids=mine)
                self.engines.append(engine)
            for u in range(len(units)):
                su = _ShardUnit((li, u), owner_of[(li, u)], by_unit[u], units[u], dtype)
                if engine is not None and u in mine:
                    su.engine, su.local = engine, mine.index(u)
                self.units.append(su)
        # Every parameter of the layout in unit order, and its place in that order (the masks'
        # and the norm vector's index).
        self.params = [s for su in self.units for s in su.slots]
        self.index_of = {id(s): i for i, s in enumerate(self.params)}
        self.hooked = [0] * len(self.units)
        # Stages 2 and 3 reduce during the backward; stage 1 (and gradients DDP has averaged) at
        # step().
        self.reduce_in_backward = stage >= 2 and not self.averaged
        if self.reduce_in_backward:
            if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
                raise StrataError("OffloadAdamW(process_group=...): ZeRO stage 2 reduces "
                                  "gradients during the backward and needs "
                                  "Tensor.register_post_accumulate_grad_hook (torch 2.1 or "
                                  "newer); valid: a newer torch, or zero_optimization.stage 1")
            self._hook(opt)

    # ---- set-up checks -------------------------------------------------------------------------

    def _offloads(self, opt, specs, stage):
        """The offloaded models among the parameters, checked against the stage and the group,
        and {unit key: owner} for the units holding their parameters."""
        offloads, fixed = [], {}
        for li, (_gi, _dtype, slots, _units, _hyper) in enumerate(specs):
            for s in slots:
                hit = lookup(s.param)
                if hit is None:
                    continue
                off, unit = hit[0], hit[1]
                if off not in offloads:
                    offloads.append(off)
                if off.ranks is None or off.ranks.world != self.world:
                    how = "without a process group" if off.ranks is None else "over another group"
                    raise StrataError(
                        f"OffloadAdamW(process_group=...): parameter {s.index} belongs to a model "
                        f"given to offload_parameters() {how}; valid: "
                        f"offload_parameters(model, config, process_group=<this group>)")
                fixed[(li, s.unit)] = unit.owner
        if stage == 3 and self.averaged:
            raise StrataError("OffloadAdamW(process_group=..., gradients='averaged'): stage 3 "
                              "shards the parameters, which DDP cannot wrap; valid: "
                              "gradients='local' (no DDP) at stage 3")
        if stage == 3 and not offloads:
            raise StrataError("OffloadAdamW(process_group=...): zero_optimization.stage 3 across "
                              "ranks shards the 16-bit parameters through "
                              "offload_parameters(model, config, process_group=...); valid: that "
                              "first, or stage 1 or 2")
        if offloads and stage != 3:
            raise StrataError(f"OffloadAdamW(process_group=...): zero_optimization.stage is "
                              f"{stage} but the model's parameters are offloaded (stage 3); "
                              f"valid: stage 3 in both configs")
        return offloads, fixed

    def _check_same_parameters(self, opt):
        mine = [[f"shape {tuple(p.shape)} {str(p.dtype).replace('torch.', '')}"
                 for p in g["params"]] for g in opt.param_groups]
        every = [None] * self.world
        self.dist.all_gather_object(every, mine, group=self.group)
        ref = every[0]
        for r, other in enumerate(every[1:], start=1):
            if len(other) != len(ref):
                raise StrataError(f"OffloadAdamW(process_group=...): rank {r} has {len(other)} "
                                  f"param groups, rank 0 has {len(ref)}; valid: the same "
                                  f"parameters on every rank, in the same order")
            for gi, (a, b) in enumerate(zip(ref, other)):
                for i in range(max(len(a), len(b))):
                    x = a[i] if i < len(a) else "missing"
                    y = b[i] if i < len(b) else "missing"
                    if x != y:
                        raise StrataError(
                            f"OffloadAdamW(process_group=...): param group {gi}, parameter {i} "
                            f"is {y} on rank {r} and {x} on rank 0; valid: the same parameters "
                            f"(shape, dtype, order) on every rank")

    # ---- the step ------------------------------------------------------------------------------

    def _wait(self, work, what):
        wait_work(work, what, self.rank, self.world, self.timeout, self.timeout_s)

    def _comm(self, t):
        return t.cuda() if self.nccl and not t.is_cuda else t

    # ---- the gradients' way to their owners -----------------------------------------------------

    def _hook(self, opt):
        """Stage 2: each parameter's post-accumulate hook; a unit goes to its owner as soon as every
        parameter of it has its final gradient (and every unit after it has gone: the fixed
        order), and the rank drops those gradients."""
        for i, su in enumerate(self.units):
            for s in su.slots:
                if s.param.requires_grad:
                    self.unit_of[id(s.param)] = (i, s)
                    self.hooked[i] += 1
                    self.handles.append(
                        s.param.register_post_accumulate_grad_hook(self._on_grad))

    def no_sync(self):
        return self.gate.no_sync()

    def _on_grad(self, param):
        with self.lock:
            if not self.gate.gradient_arrived():
                return
            i, slot = self.unit_of[id(param)]
            h = self.hand if self.hand is not None else self._open()
            if h.closed or i in h.issued or id(slot) in h.fired:
                raise StrataError(
                    f"OffloadAdamW(process_group=...): parameter {slot.index} got a second "
                    f"gradient after its unit went to its owner (ZeRO stage 2 reduces each unit "
                    f"during the backward) and before step(); valid: step() after each backward, "
                    f"or the earlier micro-batches' backward under opt.no_sync() (or "
                    f"accumulation_steps=N)")
            h.fired.add(id(slot))
            h.remaining[i] -= 1
            if h.remaining[i] == 0:
                h.ready.add(i)
                self._issue_ready(opt_free=True)

    def _backward_ended(self):
        """The gate's end-of-backward callback (lock held): every gradient of this backward is
        final, so units with parameters that got none go now, in the same order on every rank."""
        h = self.hand
        if h is not None and not h.closed:
            h.ready.update(range(len(self.units)))
            self._issue_ready(opt_free=True)
            h.closed = True

    def _open(self):
        self.hand = _HandOff([self.hooked[i] for i in range(len(self.units))])
        self.hand.ready.update(i for i, n in enumerate(self.hooked) if n == 0)  # all frozen
        return self.hand

    def _issue_ready(self, opt_free):
        """Sends the ready units in the fixed order (last unit first, as a backward makes them),
        stopping at the first that is not ready: every rank issues the same collectives in the
        same order, whatever order its gradients came in."""
        h = self.hand
        while h.next >= 0 and h.next in h.ready:
            self._issue(h, h.next, opt_free)
            h.next -= 1
        if opt_free:
            self._fold_done(h)

    def _issue(self, h, i, free):
        """Unit i's gradients (and which of them this rank has: one flag per parameter after the
        values, 1 or 0 in the gradients' dtype) to the unit's owner."""
        su = self.units[i]
        flat = torch.zeros(su.numel + len(su.slots), dtype=su.dtype, device=self.comm_device)
        for j, s in enumerate(su.slots):
            g = self.opt._dense_grad(s)
            if g is not None:
                flat[s.offset:s.offset + s.numel].copy_(g.reshape(-1))
                flat[su.numel + j] = 1
                if free:
                    s.param.grad = None  # stage 2: the owner has it now
        mine = su.owner == self.rank
        if self.ordered:
            parts = [torch.empty_like(flat) for _ in range(self.world)] if mine else None
            work = self.dist.gather(flat, parts, dst=self.global_rank[su.owner],
                                    group=self.group, async_op=True)
            if not mine:
                h.sent += flat.numel() * flat.element_size()
        else:
            parts = flat
            work = self.dist.reduce(flat, dst=self.global_rank[su.owner], op=self.dist.ReduceOp.SUM,
                                    group=self.group, async_op=True)
            if not mine:  # (what a tree reduce sends; a ring sends (N-1)/N of it)
                h.sent += flat.numel() * flat.element_size()
        h.issued[i] = (work, parts if mine else flat)

    def _fold_done(self, h):
        """The owner folds the units whose gather has arrived, so it holds N copies of a unit's
        gradients only while they are in flight."""
        for i, (work, parts) in list(h.issued.items()):
            if i not in h.reduced and self.units[i].owner == self.rank and work.is_completed():
                self._receive(h, i)

    def _receive(self, h, i):
        su = self.units[i]
        work, parts = h.issued[i]
        self._wait(work, f"the {'gather' if self.ordered else 'reduce'} of unit {su.key}'s "
                         f"gradients")
        if su.owner != self.rank:
            h.issued[i] = (None, None)
            return
        h.reduced[i] = self._fold(su, parts) if self.ordered else self._summed(su, parts)
        h.issued[i] = (None, None)

    def _fold(self, su, parts):
        """{parameter index: its gradient summed over the ranks in rank order, or None}: per
        parameter the first rank that has a gradient, then the others in rank order, each added in
        the parameter's dtype (autograd's left fold over micro-batches)."""
        parts = [p.cpu() for p in parts]
        out = {}
        for j, s in enumerate(su.slots):
            ranks = [r for r in range(self.world) if float(parts[r][su.numel + j]) != 0.0]
            if not ranks:
                out[s.index] = None
                continue
            acc = parts[ranks[0]][s.offset:s.offset + s.numel].clone()
            for r in ranks[1:]:
                acc.add_(parts[r][s.offset:s.offset + s.numel])
            out[s.index] = acc.view(s.param.shape)
        return out

    def _summed(self, su, flat):
        """strata.gradient_sum "backend": the collective's own sum (its order is the backend's)."""
        flat = flat.cpu()
        return {s.index: (flat[s.offset:s.offset + s.numel].clone().view(s.param.shape)
                          if float(flat[su.numel + j]) != 0.0 else None)
                for j, s in enumerate(su.slots)}

    # ---- the step ------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, opt):
        """One sharded step; returns (decided, norm): decided False when it was skipped."""
        params, index_of = self.params, self.index_of
        with self.lock:
            h = self.hand if self.hand is not None else self._open()
            self.hand = None
            self.gate.stepped()
        reduced = {}
        if self.averaged:
            for su in self.units:
                if su.owner == self.rank:
                    reduced[su.key] = {s.index: (g.detach().clone() if (g := opt._dense_grad(s))
                                                 is not None else None) for s in su.slots}
        else:
            # Stage 1, or what a stage-2 backward has not sent (all of it when the gradients
            # came some other way than a backward): sent now, in the same order.
            h.ready.update(range(len(self.units)))
            with self.lock:
                self.hand = h
                self._issue_ready(opt_free=False)
                self.hand = None
            for i in sorted(h.issued, reverse=True):
                if i not in h.reduced:
                    self._receive(h, i)
            for i, r in h.reduced.items():
                reduced[self.units[i].key] = r
        sent = h.sent
        # The global norm: per unit, the fp32 norms of its present gradients (each a tensor of
        # its own, as .grad is), computed by the owner; one all-reduce of a vector that holds
        # each norm at its parameter's place and 0 elsewhere (x + 0 is x) gives them to every
        # rank, which sums their squares in unit order, as one process does. A parameter is
        # present when its norm slot says so (a second vector: 1 where some rank had a gradient).
        norms = torch.zeros(2 * len(params), dtype=torch.float32)
        for su in self.units:
            if su.owner != self.rank:
                continue
            present_slots = [s for s in su.slots if reduced[su.key][s.index] is not None]
            if present_slots:
                # (each gradient is a tensor of its own already: the fold's or the copy's)
                values = unit_norms([reduced[su.key][s.index] for s in present_slots])
                for s, v in zip(present_slots, values):
                    norms[index_of[id(s)]] = v
                    norms[len(params) + index_of[id(s)]] = 1.0
        norms = self._comm(norms)
        self._wait(self.dist.all_reduce(norms, group=self.group, async_op=True),
                   "the all-reduce of the gradient norms")
        sent += norms.numel() * 4
        norms = norms.cpu().tolist()
        lists = []
        for su in self.units:
            unit = [norms[index_of[id(s)]] for s in su.slots
                    if norms[len(params) + index_of[id(s)]] != 0.0]
            if unit:
                lists.append(unit)
        norm = global_norm(lists)
        decided, multiplier = opt._decide(norm)
        if decided:
            t = opt._steps + 1
            for su in self.units:
                if su.owner == self.rank:
                    spans = reduced[su.key]
                    su.engine.store_grads(su.local, lambda s, spans=spans: spans.get(s.index))
            for e in self.engines:
                e.core.step(float(opt.param_groups[e.group_index]["lr"]), multiplier, t)
            for su in self.units:
                sent += self._broadcast_params(su)
            for off in self.offloads:
                off.drop_stale()  # a copy materialised here has the old values
            opt._record_step(t, False, opt._scaled_now)
        self.last_step_bytes_sent = sent
        self.bytes_sent += sent
        return decided, norm

    def _broadcast_params(self, su):
        """The owner's new 16-bit parameters of unit su to every rank; returns bytes sent. At
        stage 3 the offloaded ones only go to the owner's home (the next fetch gathers them);
        the rest (persistent parameters) are broadcast like every parameter at stages 1-2."""
        if su.owner == self.rank:
            e = su.engine
            sent = 0
            if su.replicated:
                # (the home may be padded past the unit's elements)
                buf = self._comm(e.param_view(su.local)[:su.numel].clone())
                self._wait(self.dist.broadcast(buf, src=self.global_rank[su.owner],
                                               group=self.group, async_op=True),
                           f"the broadcast of unit {su.key}'s parameters")
                sent = buf.numel() * buf.element_size() * (self.world - 1)
            e.scatter_params(su.local)
            return sent
        if not su.replicated:
            return 0
        buf = self._comm(torch.empty(su.numel, dtype=su.dtype))
        self._wait(self.dist.broadcast(buf, src=self.global_rank[su.owner], group=self.group,
                                       async_op=True),
                   f"the broadcast of unit {su.key}'s parameters")
        buf = buf.cpu()
        for s in su.replicated:
            s.param.data.copy_(buf[s.offset:s.offset + s.numel].view(s.param.shape))
        return 0

    # ---- checkpoints ---------------------------------------------------------------------------

    def consolidated_state(self, opt, state, dst):
        """Every rank's state entries, gathered on rank `dst` (None elsewhere)."""
        gathered = [None] * self.world if self.rank == dst else None
        self.dist.gather_object(state, gathered, dst=self.global_rank[dst], group=self.group)
        if self.rank != dst:
            return None
        merged = {}
        for d in gathered:
            merged.update(d)
        return merged

    def broadcast_all(self):
        """Every unit's parameters from its owner (after load_state_dict)."""
        for su in self.units:
            self._broadcast_params(su)
        for off in self.offloads:
            off.drop_stale()

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles = []
        # The optimizer and the shard refer to each other (a cycle only the garbage collector
        # frees): the group goes now, so that destroying it after close() ends its gloo threads
        # before the interpreter's exit, where one still running can abort the process.
        self.group = None
        self.opt = None
        self.hand = None

    def usage(self):
        return {"rank": self.rank, "world": self.world, "stage": self.stage,
                "units_owned": sum(1 for su in self.units if su.owner == self.rank),
                "units": len(self.units),
                "reduce": ("during the backward" if self.reduce_in_backward else "at step()"),
                "gradient_sum": "ordered" if self.ordered else "backend",
                "bytes_sent": self.bytes_sent,
                "last_step_bytes_sent": self.last_step_bytes_sent}

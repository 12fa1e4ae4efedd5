"""ZeRO stages 1 and 2 for ``OffloadAdamW`` across the ranks of a torch.distributed process group
(``OffloadAdamW(..., process_group=...)``; docs/python.md "Across ranks").

The optimizer's flat units (the layout one process would make) are split into contiguous runs of
about equal size, one per rank; a rank keeps the master weights, moments and gradient home of its
own units only (in its own tier: host memory, or NVMe under ``nvme_path``), so its state is 1/N of
the whole. A step, with communication only through torch.distributed (gloo on the CPU, NCCL on
GPUs):

1. every rank tells which of its parameters have a gradient (one all-gather of a mask);
2. unit by unit, in order, the gradients go to the unit's owner (``gather``), who sums them in a
   **fixed order**: per parameter, the first rank that has a gradient, then the others in rank
   order, each added in the parameter's dtype — the left fold by which autograd accumulates
   micro-batches in ``.grad``, so N ranks with micro-batch b give the bits of one rank
   accumulating N micro-batches of b, run after run;
3. each owner computes its units' per-tensor norms, one all-gather of them gives every rank the
   global norm (summed in unit order, as one process does), and the step is decided there
   (clipping, loss scaling, a non-finite norm skips it on every rank);
4. each owner runs Strata's CPU Adam on its units, then every unit's new 16-bit parameters are
   broadcast from its owner.

Stage 1 and stage 2 run the same step here: the gradients are reduced at ``step()``, not unit by
unit during the backward (the overlapped hand-off across ranks is not built yet), so a rank holds
its whole ``.grad`` until then.
"""

import datetime

import torch

from ._core import StrataError
from ._engine import _Engine, _Slot, global_norm, unit_norms


def _owners(sizes, world):
    """A contiguous split of the units, about equal in elements: unit k goes to the rank whose
    share holds the unit's middle element."""
    total = float(sum(sizes)) or 1.0
    owners, before = [], 0
    for n in sizes:
        owners.append(min(world - 1, int((before + n / 2.0) / total * world)))
        before += n
    return owners


class _ShardUnit:
    """One flat unit of the whole layout: its owner and parameters (global numbering)."""
    __slots__ = ("key", "owner", "slots", "numel", "dtype", "engine", "local")

    def __init__(self, key, owner, slots, numel, dtype):
        self.key = key
        self.owner = owner
        self.slots = slots
        self.numel = numel
        self.dtype = dtype
        self.engine = None  # this rank's _Engine holding it, if this rank owns it
        self.local = None  # its unit index in that engine


class Sharding:
    """The ranks, the ownership of the units and the sharded step of one OffloadAdamW."""

    def __init__(self, opt, group, stage, specs, averaged=False, timeout_s=300.0):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise StrataError("OffloadAdamW(process_group=...): torch.distributed is not "
                              "initialized; valid: torch.distributed.init_process_group(...) "
                              "first (torchrun sets its environment)")
        if stage not in (1, 2):
            raise StrataError(f"OffloadAdamW(process_group=...): zero_optimization.stage is "
                              f"{stage}; valid across ranks: 1 or 2 (stage 3 across ranks is not "
                              f"built yet; stage 0 keeps a whole replica per rank: use DDP and no "
                              f"process_group)")
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
        self.bytes_sent = 0
        self.last_step_bytes_sent = 0
        self._check_same_parameters(opt)
        keys, sizes = [], []
        for li, (_gi, _dtype, _slots, units, _hyper) in enumerate(specs):
            for u, n in enumerate(units):
                keys.append((li, u))
                sizes.append(n)
        owner_of = dict(zip(keys, _owners(sizes, self.world)))
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

    # ---- set-up checks -------------------------------------------------------------------------

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
        try:
            done = work.wait(timeout=self.timeout)
        except RuntimeError as ex:
            raise StrataError(
                f"OffloadAdamW(process_group=...): rank {self.rank} of {self.world}: {what} "
                f"failed: {str(ex).splitlines()[0]}; another rank stopped or is stuck (each "
                f"collective waits at most strata.comm_timeout_s = {self.timeout_s:g} s); valid: "
                f"every rank alive and calling step() together") from ex
        if done is False:
            raise StrataError(
                f"OffloadAdamW(process_group=...): rank {self.rank} of {self.world}: {what} got "
                f"no data within strata.comm_timeout_s = {self.timeout_s:g} s; another rank "
                f"stopped or is stuck; valid: every rank alive and calling step() together")

    def _comm(self, t):
        return t.cuda() if self.nccl and not t.is_cuda else t

    @torch.no_grad()
    def step(self, opt):
        """One sharded step; returns (decided, norm): decided False when it was skipped."""
        sent = 0
        params, index_of = self.params, self.index_of
        # (NCCL moves only device tensors: every collective's buffers go through _comm)
        mask = self._comm(torch.tensor([s.param.grad is not None for s in params],
                                       dtype=torch.int32))
        masks = [torch.empty_like(mask) for _ in range(self.world)]
        self._wait(self.dist.all_gather(masks, mask, group=self.group, async_op=True),
                   "the all-gather of the gradient masks")
        sent += mask.numel() * 4 * (self.world - 1)
        present = torch.stack(masks).bool().cpu()  # [rank, parameter]
        reduced = {}
        for su in self.units:
            if self.averaged:
                if su.owner == self.rank:
                    reduced[su.key] = {s.index: (g.detach().clone() if (g := opt._dense_grad(s))
                                                 is not None else None) for s in su.slots}
                continue
            flat = torch.zeros(max(su.numel, 1), dtype=su.dtype)
            for s in su.slots:
                g = opt._dense_grad(s)
                if g is not None:
                    flat[s.offset:s.offset + s.numel].copy_(g.reshape(-1))
            flat = self._comm(flat)
            if su.owner == self.rank:
                parts = [torch.empty_like(flat) for _ in range(self.world)]
                self._wait(self.dist.gather(flat, parts, dst=su.owner, group=self.group,
                                            async_op=True), f"the gather of unit {su.key}")
                parts = [p.cpu() for p in parts]
                reduced[su.key] = self._fold(su, parts, present, index_of)
            else:
                self._wait(self.dist.gather(flat, None, dst=su.owner, group=self.group,
                                            async_op=True), f"the gather of unit {su.key}")
                sent += flat.numel() * flat.element_size()
        # The global norm: per unit, the fp32 norms of its present gradients (each a tensor of
        # its own, as .grad is), computed by the owner; one all-reduce of a vector that holds
        # each norm at its parameter's place and 0 elsewhere (x + 0 is x) gives them to every
        # rank, which sums their squares in unit order, as one process does.
        norms = torch.zeros(len(params), dtype=torch.float32)
        for su in self.units:
            if su.owner != self.rank:
                continue
            present_slots = [s for s in su.slots if reduced[su.key][s.index] is not None]
            if present_slots:
                # (each gradient is a tensor of its own already: the fold's or the copy's)
                values = unit_norms([reduced[su.key][s.index] for s in present_slots])
                for s, v in zip(present_slots, values):
                    norms[index_of[id(s)]] = v
        norms = self._comm(norms)
        self._wait(self.dist.all_reduce(norms, group=self.group, async_op=True),
                   "the all-reduce of the gradient norms")
        sent += norms.numel() * 4
        norms = norms.cpu().tolist()
        any_present = present.any(dim=0).tolist()
        lists = []
        for su in self.units:
            unit = [norms[index_of[id(s)]] for s in su.slots if any_present[index_of[id(s)]]]
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
            opt._record_step(t, False, opt._scaled_now)
        self.last_step_bytes_sent = sent
        self.bytes_sent += sent
        return decided, norm

    def _fold(self, su, parts, present, index_of):
        """{parameter index: its gradient summed over the ranks in rank order, or None}."""
        out = {}
        for s in su.slots:
            ranks = [r for r in range(self.world) if bool(present[r, index_of[id(s)]])]
            if not ranks:
                out[s.index] = None
                continue
            acc = parts[ranks[0]][s.offset:s.offset + s.numel].clone()
            for r in ranks[1:]:
                acc.add_(parts[r][s.offset:s.offset + s.numel])
            out[s.index] = acc.view(s.param.shape)
        return out

    def _broadcast_params(self, su):
        """The owner's new 16-bit parameters of unit su to every rank; returns bytes sent."""
        if su.owner == self.rank:
            e = su.engine
            # (the home may be padded past the unit's elements)
            buf = self._comm(e.param_view(su.local)[:su.numel].clone())
            self._wait(self.dist.broadcast(buf, src=su.owner, group=self.group, async_op=True),
                       f"the broadcast of unit {su.key}'s parameters")
            e.scatter_params(su.local)
            return buf.numel() * buf.element_size() * (self.world - 1)
        buf = self._comm(torch.empty(su.numel, dtype=su.dtype))
        self._wait(self.dist.broadcast(buf, src=su.owner, group=self.group, async_op=True),
                   f"the broadcast of unit {su.key}'s parameters")
        buf = buf.cpu()
        for s in su.slots:
            values = buf[s.offset:s.offset + s.numel]
            if s.offload is not None:
                s.offload.update(s.param, values)
            else:
                s.param.data.copy_(values.view(s.param.shape))
        return 0

    # ---- checkpoints ---------------------------------------------------------------------------

    def consolidated_state(self, opt, state, dst):
        """Every rank's state entries, gathered on rank `dst` (None elsewhere)."""
        gathered = [None] * self.world if self.rank == dst else None
        self.dist.gather_object(state, gathered, dst=dst, group=self.group)
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

    def usage(self):
        return {"rank": self.rank, "world": self.world, "stage": self.stage,
                "units_owned": sum(1 for su in self.units if su.owner == self.rank),
                "units": len(self.units), "bytes_sent": self.bytes_sent,
                "last_step_bytes_sent": self.last_step_bytes_sent}

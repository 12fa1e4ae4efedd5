"""ZeRO stage 3 across ranks for the parameter offload (``offload_parameters(...,
process_group=...)``; docs/python.md "Across ranks"): each unit of the model has one owner rank,
the only one that keeps its 16-bit parameters (in its host memory or on its NVMe); a fetch is a
broadcast of the unit's bytes from its owner, so every rank materialises the whole unit while it
runs and keeps 1/N of the model otherwise.

Every rank must fetch the same units in the same order (the same model, forward and backward on
every rank), since a broadcast pairs with the other ranks' next broadcast. Each broadcast carries
the unit's index and the fetch's sequence number after the bytes: a rank whose fetches departed
from the owner's fails with an error naming both units instead of materialising another unit's
bytes. Read-ahead is local: an owner reads its NVMe units ahead on its thread; copies ahead to the
device, which would broadcast out of order, are off across ranks.
"""

import torch

from ._core import StrataError


def owners(sizes, world):
    """A contiguous split of the units, about equal in elements: unit k goes to the rank whose
    share holds the unit's middle element."""
    total = float(sum(sizes)) or 1.0
    out, before = [], 0
    for n in sizes:
        out.append(min(world - 1, int((before + n / 2.0) / total * world)))
        before += n
    return out


def wait_work(work, what, rank, world, timeout, timeout_s, who="OffloadAdamW(process_group=...)"):
    """Waits for a collective at most timeout: a rank that stopped makes the others fail with an
    error that says so (strata.comm_timeout_s), never hang."""
    try:
        done = work.wait(timeout=timeout)
    except RuntimeError as ex:
        raise StrataError(
            f"{who}: rank {rank} of {world}: {what} failed: {str(ex).splitlines()[0]}; another "
            f"rank stopped or is stuck (each collective waits at most strata.comm_timeout_s = "
            f"{timeout_s:g} s); valid: every rank alive and calling together") from ex
    if done is False:
        raise StrataError(
            f"{who}: rank {rank} of {world}: {what} got no data within strata.comm_timeout_s = "
            f"{timeout_s:g} s; another rank stopped or is stuck; valid: every rank alive and "
            f"calling together")


class UnitRanks:
    """The owners of an offloaded model's units and the broadcast that gathers one."""

    def __init__(self, group, units, timeout_s):
        import datetime

        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise StrataError("offload_parameters(process_group=...): torch.distributed is not "
                              "initialized; valid: torch.distributed.init_process_group(...) "
                              "first (torchrun sets its environment)")
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.global_rank = [dist.get_global_rank(group, r) for r in range(self.world)]
        self.nccl = dist.get_backend(group) == "nccl"
        self.comm_device = torch.device("cuda", torch.cuda.current_device()) if self.nccl \
            else torch.device("cpu")
        self.timeout_s = float(timeout_s)
        self.timeout = datetime.timedelta(seconds=self.timeout_s)
        for u, o in zip(units, owners([max(u.numel, 1) for u in units], self.world)):
            u.owner = o
        self.seq = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        shapes = [[(e.name, e.shape, str(e.dtype)) for e in u.entries] for u in units]
        every = [None] * self.world
        dist.all_gather_object(every, shapes, group=group)
        for r, other in enumerate(every):
            if other != shapes:
                first = next((i for i, (a, b) in enumerate(zip(shapes, other)) if a != b),
                             min(len(shapes), len(other)))
                theirs = other[first] if first < len(other) else "missing"
                mine = shapes[first] if first < len(shapes) else "missing"
                raise StrataError(
                    f"offload_parameters(process_group=...): unit {first} of rank {r} differs "
                    f"from rank {self.rank}'s ({theirs} against {mine}); valid: the same model on "
                    f"every rank")

    def owns(self, u):
        return u.owner == self.rank

    def gather(self, u, local):
        """Unit u's bytes on every rank ([part 0, part 1], uint8 on the collective's device):
        broadcast from its owner, whose own bytes (`local`) go out."""
        p0, p1 = u.part_bytes
        buf = torch.empty(p0 + p1 + 16, dtype=torch.uint8, device=self.comm_device)
        self.seq += 1
        tag = torch.tensor([u.index, self.seq], dtype=torch.int64)
        if self.owns(u):
            for part, at, n in ((0, 0, p0), (1, p0, p1)):
                if n:
                    buf[at:at + n].copy_(local[part])
            buf[p0 + p1:].copy_(tag.view(torch.uint8))
            self.bytes_sent += buf.numel() * (self.world - 1)
        else:
            self.bytes_received += buf.numel()
        work = self.dist.broadcast(buf, src=self.global_rank[u.owner], group=self.group,
                                   async_op=True)
        wait_work(work, f"the gather of unit {u.index} ('{u.name}')", self.rank, self.world,
                  self.timeout, self.timeout_s, "offload_parameters(process_group=...)")
        got = buf[p0 + p1:].cpu().view(torch.int64).tolist()
        if got != tag.tolist():
            raise StrataError(
                f"offload_parameters(process_group=...): rank {self.rank} fetched unit "
                f"{u.index} ('{u.name}') as its fetch #{self.seq}, while rank {u.owner} sent unit "
                f"{got[0]} as its fetch #{got[1]}: the ranks ran different forwards or backwards; "
                f"valid: the same model run the same way on every rank")
        return [buf[:p0] if p0 else None, buf[p0:p0 + p1] if p1 else None]

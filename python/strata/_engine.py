"""The engine side of ``strata.torch.OffloadAdamW``: one ``strata._core.Group`` per param group and
dtype (``_Engine``: its views, landing a unit's gradients, copying its new parameters out), where
each parameter lives in it (``_Slot``), and the gradient norms that the plain step and the
overlapped hand-off (``strata._overlap``) both compute with the same calls, so that their bits
agree.
"""

import math

import torch

from . import _core

_STORAGE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def unit_norms(grads):
    """The fp32 norms of one unit's gradients, one torch._foreach_norm over its list: the plain
    step() and the hand-off call this on the same lists, so their norms have the same bits."""
    return torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32))


def global_norm(norm_lists):
    """The global gradient norm from per-unit norms: squares summed in double, in order."""
    total = 0.0
    for norms in norm_lists:
        for n in norms:
            total += n * n
    return math.sqrt(total)


class _Slot:
    """Where one parameter lives in its engine."""
    __slots__ = ("param", "index", "unit", "offset", "numel", "bound_param", "bound_grad",
                 "device", "dtype", "offload")

    def __init__(self, param, index, unit, offset, numel):
        self.param = param
        self.device = param.device  # what the parameter must stay on, and be
        self.dtype = param.dtype
        self.index = index  # the parameter's number in state_dict(), as torch numbers them
        self.unit = unit
        self.offset = offset
        self.numel = numel
        self.bound_param = None  # the engine's tensor that param.data was rebound to
        self.bound_grad = None  # the engine's gradient view given to param.grad
        self.offload = None  # the ParamOffload whose home holds the parameter, if offloaded


class _Engine:
    """One strata._core.Group: the parameters of one param group with one dtype."""

    def __init__(self, ctx, group_index, dtype, slots, units, hyper, adamw, unit_ids=None):
        self.group_index = group_index
        self.dtype = dtype
        self.slots = slots
        beta1, beta2 = hyper["betas"]
        extra = {} if unit_ids is None else {"unit_ids": list(unit_ids)}
        self.core = _core.Group(ctx, units, _STORAGE[dtype], float(hyper["weight_decay"]),
                                float(beta1), float(beta2), float(hyper["eps"]), adamw, **extra)
        self.nvme = self.core.nvme()
        # Whether the gradient view is the gradient's home (host memory, fp32): else it is a
        # scratch that store_state() encodes (bf16 gradients) or writes (NVMe) from.
        self.grad_home = self.core.view_is_home("grad")
        self.by_unit = [[] for _ in units]
        for s in slots:
            self.by_unit[s.unit].append(s)

    def view(self, kind, unit):
        return torch.from_numpy(self.core.state_view(kind, unit))

    def param_view(self, unit):
        t = torch.from_numpy(self.core.param_view(unit))
        return t if self.dtype == torch.float32 else t.view(self.dtype)

    def store_grads(self, u, grad_of):
        """Writes unit u's gradients into their home: grad_of(slot) gives a slot's gradient
        (None: zeros); one that is the home itself (backward accumulated there) stays."""
        grad = self.view("grad", u)
        if not self.grad_home:
            grad.zero_()
        for s in self.by_unit[u]:
            g = grad_of(s)
            span = grad[s.offset:s.offset + s.numel]
            if g is None:
                if self.grad_home:
                    span.zero_()
            elif s.bound_grad is None or g.data_ptr() != s.bound_grad.data_ptr():
                span.copy_(g.reshape(-1))
        self.core.store_state("grad", u)

    def scatter_params(self, u, non_blocking=False):
        """Copies unit u's new parameters from their home into every parameter that is not the
        home itself (CUDA tensors; non_blocking on the caller's stream)."""
        params = None
        for s in self.by_unit[u]:
            p = s.param
            if s.bound_param is not None and p.data.data_ptr() == s.bound_param.data_ptr():
                continue  # the parameter is the home: already updated
            if params is None:
                params = self.param_view(u)
            if s.offload is not None:
                s.offload.update(p, params[s.offset:s.offset + s.numel], non_blocking)
                continue
            p.data.copy_(params[s.offset:s.offset + s.numel].view(p.shape),
                         non_blocking=non_blocking)

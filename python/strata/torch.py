"""``OffloadAdamW``: Strata's offloaded Adam/AdamW as a ``torch.optim.Optimizer``.

Where the state lives comes from a DeepSpeed-style config (a path, a dict, or None):

- ``zero_optimization.offload_optimizer.device``: ``"nvme"`` puts the fp32 master weights, both
  Adam moments and the gradient accumulator in swap files under ``nvme_path`` (io_uring, O_DIRECT,
  checksummed tiles); ``"cpu"`` or ``"none"`` keeps them in host memory (Strata's Adam runs on the
  CPU, so there is no GPU home for them);
- ``aio``: the swap files' I/O engine; ``strata.host_bytes_max`` / ``strata.nvme_bytes_max``:
  the budgets (an optimizer that does not fit fails with Strata's message naming the key);
  ``zero_optimization.sub_group_size``: the tile; ``strata.optimizer_pipeline_depth``,
  ``strata.optimizer_threads``, ``strata.nvme_checksum``;
- ``strata.optimizer_state``: compressed state (bf16 or 8-bit moments, bf16 master, bf16
  gradient accumulator), decoded, updated and re-encoded by the CPU Adam in one pass;
- ``gradient_clipping`` (when the config gives it; ``max_grad_norm=`` wins) and ``fp16`` with
  dynamic loss scaling (``scale_loss()``/``loss_scale``), with DeepSpeed's semantics.

The step: gradients are copied into the optimizer's gradient home (or were accumulated there: a
CPU fp32 parameter's ``.grad`` is a view of it), the pipeline streams every tile through
read || Adam || write, and the new parameters land in the optimizer's parameter home, which *is*
the tensor of a CPU parameter of the same dtype (``param.data`` is rebound to it, zero-copy), and
is copied into any other parameter (CUDA tensors, or dtypes the group stores otherwise).

Parameters are packed, whole, into flat units of about ``unit_elements`` elements per param
group and dtype (a larger tensor is a unit of its own); each unit's state is tiled by the config's
``sub_group_size``.
"""

import json
import math
import os
import time

import torch

from . import _core, _param_offload
from ._checkpoint import _STATE_KINDS, _Checkpoints, _value
from ._core import StrataError
from ._engine import _STORAGE, _Engine, _Slot, global_norm, unit_norms

__all__ = ["OffloadAdamW", "StrataError", "offload_parameters"]

_TORCH_OF = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_ALIGN = 64  # elements: every tensor starts 256 bytes into fp32 state at least


def _warn_skipped(opt, norm):
    """One warning per optimizer for steps skipped on a non-finite gradient (summary() counts
    them all)."""
    if getattr(opt, "_warned_nonfinite", False):
        return
    opt._warned_nonfinite = True
    import warnings
    warnings.warn(f"OffloadAdamW: step {opt._steps + 1} skipped: the gradient norm is {norm} "
                  f"(a non-finite gradient); the parameters were not changed. Later skips are "
                  f"counted in summary()['skipped_steps'] without a warning", RuntimeWarning,
                  stacklevel=3)


def _config_text(config):
    if config is None:
        return "{}", "<no config>"
    if isinstance(config, dict):
        return json.dumps(config), "<config dict>"
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(), path
        except OSError as e:
            raise StrataError(f"{path}: cannot read the config: {e.strerror}; valid: a readable "
                              f"DeepSpeed-style JSON file, a dict, or None") from None
    raise TypeError(f"config: expected a path, a dict or None, got {type(config).__name__}")


_PARAM_SETTINGS = ("offload_param", "offload_param_buffer_count", "offload_param_buffer_size",
                   "offload_param_max_in_cpu", "stage3_prefetch_bucket_size",
                   "stage3_max_live_parameters", "stage3_max_reuse_distance",
                   "stage3_param_persistence_threshold", "device_bytes_max", "zero_stage")


def offload_parameters(model, config=None, *, device=None, unit_modules=None, trace=False,
                       process_group=None):
    """Moves the model's parameters into Strata's tiers (ZeRO-3 ``offload_param``) and returns
    the model, whose forward and backward now materialise each unit on ``device`` only while it
    runs (module ``strata._param_offload``; docs/python.md "Parameter offload").

    Args:
        model: a ``torch.nn.Module`` with its parameters in their training dtype (cast it first).
        config: the DeepSpeed-style config (path, dict) that OffloadAdamW reads too:
            ``zero_optimization.stage`` 3 with ``offload_param.device`` cpu or nvme
            (``nvme_path``, ``buffer_count``, ``buffer_size``, ``max_in_cpu``), the ``stage3_*``
            keys with DeepSpeed's meanings and ``strata.device_bytes_max``.
        device: the compute device (default: CUDA when there is one, else the CPU).
        unit_modules: module classes (or class names) whose instances are units, added to the
            model's ``_no_split_modules``; the rest of the parameters form the root unit.
        trace: record a timeline of fetches, NVMe reads and writes, releases
            (``model.strata_offload.trace()``).
        process_group: ZeRO stage 3 across the ranks of a ``torch.distributed`` group: each unit
            is kept by one rank and broadcast from it at each fetch (``strata._param_ranks``);
            give ``OffloadAdamW`` the same group. ``model.state_dict()`` is then collective.

    ``model.strata_offload`` is the handle: ``summary()``, ``close()``. Give ``OffloadAdamW`` the
    model's parameters (and ``overlap=True, module=model`` to free each unit's gradients as they
    are handed over)."""
    text, source = _config_text(config)
    ctx = _core.Context(text, source)
    settings = ctx.settings()
    missing = [k for k in _PARAM_SETTINGS if k not in settings]
    if missing:
        raise StrataError(f"offload_parameters: this strata._core lacks {missing}; rebuild it")
    if settings["offload_param"] not in ("cpu", "nvme"):
        raise StrataError(f"{source}: zero_optimization.offload_param.device is "
                          f"'{settings['offload_param']}'; valid for offload_parameters(): cpu or "
                          f"nvme")
    if int(settings["zero_stage"]) != 3:
        raise StrataError(f"{source}: zero_optimization.stage is {settings['zero_stage']}; "
                          f"offload_param needs stage 3 (DeepSpeed offloads parameters at stage 3 "
                          f"only); valid: 3")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    offload = _param_offload.ParamOffload(model, ctx, settings, device, unit_modules, trace,
                                          process_group)
    model.strata_offload = offload
    return model


class OffloadAdamW(_Checkpoints, torch.optim.Optimizer):
    """AdamW (or Adam with ``adamw_mode=False``) with Strata's offloaded state and pipeline.

    Args:
        params: parameters or param groups (each group may set lr, betas, eps, weight_decay).
        lr, betas, eps, weight_decay: as ``torch.optim.AdamW`` (defaults included).
        config: a DeepSpeed-style config (path or dict) saying where the state lives and under
            which budgets; None keeps it in host memory with Strata's defaults.
        max_grad_norm: clip the global gradient norm to this (None: the config's
            ``gradient_clipping`` when it gives one, else no clipping).
        adamw_mode: decoupled weight decay (AdamW); False is Adam with L2 decay (DeepSpeed's
            ``adam_w_mode``).
        unit_elements: the packing target of the flat units.
        bind_params: let CPU parameters of the stored dtype live in the optimizer's parameter
            home (zero-copy); False copies the new values into them after each step.
        overlap: hand each unit's gradients over during the backward, as they become final, and
            run Adam on it there (module ``strata._overlap``, docs/python.md "Overlap"): the same
            parameters bit for bit as ``overlap=False``. Every backward outside ``no_sync()`` (or
            the last of ``accumulation_steps``) must then be followed by ``step()``.
        module: with overlap, the model: the next forward waits, module by module, for the new
            values of the parameters each module holds; None: ``step()`` waits for all of them.
        accumulation_steps: with overlap (or stage 2 across ranks), only every N-th backward
            hands gradients over (the others accumulate), like the first N-1 under ``no_sync()``.
        overlap_buffers: with overlap, staging buffers per dtype (each the size of the largest
            unit; pinned with a GPU); a hand-off waits for a free one.
        overlap_trace: with overlap, record a timeline (``overlap_trace()``).
        process_group: a ``torch.distributed`` process group (e.g. ``dist.group.WORLD``) to
            shard the state over, ZeRO stage 1/2 as the config's ``zero_optimization.stage``
            says (module ``strata._shard``): each rank keeps 1/N of the state, gradients are
            summed in a fixed order (at stage 2 unit by unit during the backward, which then
            leaves ``.grad`` None), new parameters are broadcast. Do not wrap the model in
            DDP as well (it would average the gradients first) — unless ``gradients=``
            says so.
        gradients: with process_group, "local" (each rank's own; they are summed in a fixed
            order) or "averaged" (already averaged over the ranks by DDP, as under the HF
            Trainer with torchrun: each rank takes its units' gradients as they are).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 config=None, max_grad_norm=None, adamw_mode=True, unit_elements=1 << 23,
                 bind_params=True, overlap=False, module=None, accumulation_steps=1,
                 overlap_buffers=3, overlap_trace=False, process_group=None,
                 gradients="local"):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")
        if unit_elements < 2048:
            raise ValueError(f"unit_elements {unit_elements}: valid: 2048 or more")
        self._built = False
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        text, source = _config_text(config)
        self._ctx = _core.Context(text, source)
        settings = self._ctx.settings()
        self.config_source = source
        self.offload_device = settings["offload_optimizer"]
        self.notes = list(settings["notes"])
        self._clip = float(max_grad_norm) if max_grad_norm is not None else float(
            settings["gradient_clipping"])
        if self._clip < 0:
            raise ValueError(f"max_grad_norm {max_grad_norm}: valid: 0 (no clipping) or more")
        self._fp16 = bool(settings["fp16"])
        self._scaled = False  # scale_loss() was used for the gradients of the next step
        self._adamw = bool(adamw_mode)
        self._bind = bool(bind_params)
        self._steps = 0  # Adam's t: steps applied
        self._skipped = 0  # steps skipped (non-finite gradients)
        self._last_step_s = 0.0
        self._last_norm = None
        self._engines = []
        self._overlap = None
        self._overlap_wanted = bool(overlap)
        self._shard = None
        self._scaled_now = False
        if module is not None and not overlap:
            raise StrataError("OffloadAdamW: module= is for overlap=True; valid: overlap=True "
                              "with module=<the model>, or no module")
        structure = {}
        for group in self.param_groups:
            for p in group["params"]:
                hit = _param_offload.lookup(p)
                if hit is not None:
                    structure.update(hit[0].structure)
        if not structure and module is not None:
            structure = _param_offload.unit_structure(module)
        index = 0
        seen = {}
        specs = []  # (param group, dtype, slots, unit sizes, the group): the whole layout
        for gi, group in enumerate(self.param_groups):
            by_dtype = {}
            for p in group["params"]:
                if id(p) in seen:
                    raise StrataError(f"param group {gi}, parameter {index} is parameter "
                                      f"{seen[id(p)]} again (the same tensor); valid: each "
                                      f"parameter once (model.parameters() lists a tied weight "
                                      f"once)")
                seen[id(p)] = index
                if p.dtype not in _STORAGE:
                    raise StrataError(f"param group {gi}, parameter {index}: dtype {p.dtype} "
                                      f"cannot be trained; valid: float32, bfloat16, float16")
                by_dtype.setdefault(p.dtype, []).append((p, index))
                index += 1
            for dtype, members in by_dtype.items():
                slots, units, fill, home = [], [], 0, None
                for p, i in members:
                    n = p.numel()
                    at = -(-fill // _ALIGN) * _ALIGN
                    # The model's units (an offloaded model's, or module='s blocks) split the
                    # optimizer's: Adam on a block and its write-back start as soon as the
                    # block's gradients are handed over, and an offloaded model lays its state
                    # out as the same model in memory given module= does.
                    unit_of = structure.get(id(p)) if structure else None
                    if fill > 0 and (at + n > unit_elements or unit_of != home):
                        units.append(fill)
                        fill, at = 0, 0
                    home = unit_of
                    slots.append(_Slot(p, i, len(units), at, n))
                    fill = at + n
                units.append(fill)
                if sum(units) == 0:
                    continue  # only empty tensors: nothing to optimize
                units = [max(u, 1) for u in units]
                specs.append((gi, dtype, slots, units, group))
        from ._shard import sharding_for
        self._shard = sharding_for(self, process_group, gradients, overlap, settings, specs,
                                   accumulation_steps)
        if self._shard is not None:
            self._engines = list(self._shard.engines)
        else:
            for gi, dtype, slots, units, group in specs:
                self._engines.append(_Engine(self._ctx, gi, dtype, slots, units, group,
                                             self._adamw))
        self._built = True
        self._offloads = []
        mine = {id(p) for g in self.param_groups for p in g["params"]}
        for e in self._engines:
            for s in e.slots:
                hit = _param_offload.lookup(s.param)
                s.offload = hit[0] if hit is not None else None
                if hit is not None and hit[0] not in self._offloads:
                    self._offloads.append(hit[0])
        for off in self._offloads:
            for u in off.units:
                for entry in u.entries:
                    if entry.trainable and id(entry.param) not in mine:
                        raise StrataError(
                            f"OffloadAdamW: offloaded parameter '{entry.name}' requires grad but "
                            f"is not in this optimizer (its new values would never reach its "
                            f"home); valid: every trainable parameter of the offloaded model, or "
                            f"requires_grad=False before offload_parameters()")
        for e in self._engines:
            self._load_from_params(e)
            self._bind_engine(e)
        if overlap and self._engines:
            from ._overlap import Overlap
            self._overlap = Overlap(self, module, accumulation_steps, overlap_buffers,
                                    overlap_trace)
            self.notes.extend(self._overlap.notes)
            for off in self._offloads:
                off.before_fetch = self._overlap.wait_params
                off.updates_landed = self._overlap.updates_landed

    # ---- set-up --------------------------------------------------------------------------------

    def add_param_group(self, param_group):
        if getattr(self, "_built", False):
            raise StrataError("OffloadAdamW.add_param_group: the optimizer's state was laid out "
                              "when it was created; valid: pass every param group to the "
                              "constructor")
        super().add_param_group(param_group)

    @staticmethod
    def _write_unit(e, u, source):
        """Writes master, exp_avg and exp_avg_sq of unit u: source(slot, kind) gives each slot's
        values (None: zeros); then rounds the new master into the unit's parameters."""
        for kind in _STATE_KINDS:
            view = e.view(kind, u)
            view.zero_()
            for s in e.by_unit[u]:
                values = source(s, kind)
                if values is not None:
                    view[s.offset:s.offset + s.numel].copy_(values.reshape(-1))
            e.core.store_state(kind, u)
        e.core.refresh_params(u)

    @torch.no_grad()
    def _load_from_params(self, e):
        """Master weights from the parameters, zero moments, parameters rounded from the master."""
        for u in range(len(e.by_unit)):
            self._write_unit(e, u, lambda s, kind: _value(s) if kind == "master" else None)

    @torch.no_grad()
    def _bind_engine(self, e):
        for u, slots in enumerate(e.by_unit):
            params = e.param_view(u)
            grads = e.view("grad", u) if e.grad_home else None
            for s in slots:
                p = s.param
                if s.offload is not None:
                    continue  # its home is the offload's; step() writes the new values there
                if self._bind and p.device.type == "cpu" and p.dtype == e.dtype:
                    home = params[s.offset:s.offset + s.numel].view(p.shape)
                    p.data = home
                    s.bound_param = home
                # With overlap, the hand-off copies each gradient (a bound one would be written
                # by the next backward while Adam may still read it).
                if (grads is not None and self._bind and p.device.type == "cpu"
                        and p.dtype == torch.float32 and not self._overlap_wanted
                        and self._shard is None):
                    s.bound_grad = grads[s.offset:s.offset + s.numel].view(p.shape)

    def _check_open(self):
        if self._ctx is None:
            raise StrataError("OffloadAdamW: the optimizer was closed; valid: create a new one")

    @staticmethod
    def _check_param(s):
        """A parameter must keep the device and dtype it had when the optimizer laid out its
        state (its copies, uploads and gradient buffers were made for them)."""
        p = s.param
        if p.device != s.device or p.dtype != s.dtype:
            raise StrataError(
                f"parameter {s.index} ({tuple(p.shape)}) is now {p.dtype} on {p.device}; it was "
                f"{s.dtype} on {s.device} when the optimizer was created; valid: move and cast "
                f"the model (model.to(...)) before creating OffloadAdamW, or create a new one")

    def _check_params(self):
        for e in self._engines:
            for s in e.slots:
                self._check_param(s)

    def _synchronize(self):
        if self._overlap is not None:
            self._overlap.synchronize()

    def _record_step(self, t, skipped, scaled):
        """A decided step: counted as Adam's t or as skipped, and the dynamic loss scale moved."""
        if skipped:
            self._skipped += 1
        else:
            self._steps = t
        if scaled:
            self._ctx.update_loss_scale(skipped)

    # ---- the step ------------------------------------------------------------------------------

    def _total_norm(self):
        """The global gradient norm as the overlapped hand-off computes it: per unit, the fp32
        norms of its gradients (one torch._foreach_norm over the unit's list), then their
        squares summed in double, units in order; so both give the same bits."""
        lists = []
        for e in self._engines:
            for slots in e.by_unit:
                grads = [s.param.grad for s in slots if s.param.grad is not None]
                if grads:
                    lists.append(unit_norms(grads).tolist())
        return global_norm(lists)

    @staticmethod
    def _dense_grad(s):
        g = s.param.grad
        if g is not None and g.is_sparse:
            raise StrataError(f"parameter {s.index}: sparse gradients are not supported; "
                              f"valid: dense gradients")
        return g

    @torch.no_grad()
    def _gather_grads(self, e):
        for u in range(len(e.by_unit)):
            e.store_grads(u, self._dense_grad)

    @torch.no_grad()
    def _scatter_params(self, e):
        for u in range(len(e.by_unit)):
            e.scatter_params(u)

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step. Returns the closure's loss, if given.

        The global gradient norm decides the step: it clips (max_grad_norm / gradient_clipping),
        unscales fp16 loss scaling, and a non-finite norm skips the step (and, with a dynamic
        loss scale, lowers the scale)."""
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        begin = time.perf_counter()
        try:
            self._step()
        finally:
            self._last_step_s = time.perf_counter() - begin
        return loss

    def _step(self):
        if self._overlap is not None:
            self._scaled = False  # the hand-off took it at the step's first gradient
            self._overlap.step()
            return
        self._check_params()
        # The loss scale applies to gradients of a loss that went through scale_loss() (a
        # torch.amp.GradScaler, as the HF Trainer's fp16 uses, unscales them itself).
        self._scaled_now = self._scaled
        self._scaled = False
        if self._shard is not None:
            self._shard.step(self)
            return
        decided, multiplier = self._decide(self._total_norm())
        if not decided:
            return
        t = self._steps + 1
        for e in self._engines:
            self._gather_grads(e)
            e.core.step(float(self.param_groups[e.group_index]["lr"]), multiplier, t)
            self._scatter_params(e)
        self._record_step(t, False, self._scaled_now)

    def _decide(self, norm):
        """The step's fate from the global gradient norm: (False, None) when it is skipped
        (recorded), else (True, the gradient multiplier). The norm decides clipping and loss
        scaling, and a non-finite one skips the step in every case: never NaN parameters (the
        CLI's engine checks every tile likewise)."""
        scaled = self._scaled_now
        scale = self._ctx.loss_scale() if scaled else 1.0
        self._last_norm = norm
        if not math.isfinite(norm):
            if not (self._clip > 0 or scaled):
                _warn_skipped(self, norm)
            self._record_step(self._steps + 1, True, scaled)
            return False, None
        if self._clip > 0 or scaled:
            return True, _core.gradient_multiplier(norm, scale, self._clip)
        return True, 1.0 / scale

    def zero_grad(self, set_to_none=True):
        """Clears the gradients as torch does. With ``set_to_none=False`` a CPU fp32 parameter's
        gradient becomes a zeroed view of the optimizer's gradient home, so the next backward
        accumulates straight into it and step() copies nothing."""
        if self._overlap is not None and self._overlap.open_hand_off():
            raise StrataError("OffloadAdamW.zero_grad: a backward has already handed its "
                              "gradients over (overlap=True) and step() has not run; valid: "
                              "step() first, or that backward under opt.no_sync()")
        # Every parameter: across ranks, this rank's engines hold only the units it owns.
        slots = [s for e in self._engines for s in e.slots] if self._shard is None else \
            [s for su in self._shard.units for s in su.slots]
        for s in slots:
            p = s.param
            if set_to_none:
                p.grad = None
            elif s.bound_grad is not None and (p.grad is None or
                                               p.grad.data_ptr() == s.bound_grad.data_ptr()):
                s.bound_grad.zero_()
                p.grad = s.bound_grad
            elif p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()

    # ---- overlap --------------------------------------------------------------------------------

    def no_sync(self):
        """With overlap or stage 2 across ranks: a context for the backward of a micro-batch that
        only accumulates (its gradients stay in ``.grad``; the next backward outside it hands them
        over). Otherwise it does nothing (gradients are read at step())."""
        if self._overlap is not None:
            return self._overlap.no_sync()
        if self._shard is not None and self._shard.reduce_in_backward:
            return self._shard.no_sync()
        import contextlib
        return contextlib.nullcontext()

    def synchronize(self):
        """With overlap: waits until the last step's Adam ran and its new parameters are in place
        (the current CUDA stream waits for their uploads); raises a failed step's error."""
        self._check_open()
        self._synchronize()

    @property
    def last_handoff_order(self):
        """With overlap: the parameter indices (as state_dict() numbers them) in the order the
        last step handed their gradients over (the backward's order, then what step() sent)."""
        return [] if self._overlap is None else list(self._overlap.last_order)

    def overlap_trace(self):
        """With ``overlap_trace=True``: [(lane, label, begin_s, end_s)] of the hand-offs (the
        backward's hooks), landings, Adam and uploads (the worker) since the optimizer was made."""
        return [] if self._overlap is None else list(self._overlap.trace)

    # ---- fp16 loss scaling ---------------------------------------------------------------------

    @property
    def loss_scale(self):
        """The current loss scale (1 unless the config enables fp16)."""
        return self._ctx.loss_scale() if self._fp16 else 1.0

    def scale_loss(self, loss):
        """``loss * loss_scale``: call ``backward()`` on this with fp16 loss scaling; the next
        step() then unscales the gradients, skips the step on an overflow and moves the scale as
        DeepSpeed's dynamic loss scaler does (config ``fp16``)."""
        self._scaled = self._fp16
        return loss * self.loss_scale

    # ---- reporting and shutdown ----------------------------------------------------------------

    def summary(self):
        """Steps, skipped steps, the loss scale, the last step's seconds, and per engine the
        tiers' bytes (plan, in use, peak, budget), NVMe bytes moved and the plan's lines."""
        self._check_open()
        self._synchronize()
        engines = []
        tiers = {"device": 0, "host": 0, "nvme": 0}
        for e in self._engines:
            u = e.core.usage()
            u["param_group"] = e.group_index
            u["dtype"] = str(e.dtype).replace("torch.", "")
            u["parameters"] = len(e.slots)
            for t in tiers:
                tiers[t] += u[t]["bytes"]
            engines.append(u)
        return {
            "offload_optimizer": self.offload_device,
            "config": self.config_source,
            "steps": self._steps,
            "skipped_steps": self._skipped,
            "loss_scale": self.loss_scale,
            "last_grad_norm": self._last_norm,
            "last_step_s": self._last_step_s,
            "bytes": tiers,
            "engines": engines,
            "ranks": None if self._shard is None else self._shard.usage(),
            "overlap": None if self._overlap is None else {
                "module_waits": self._overlap.module is not None,
                "accumulation_steps": self._overlap.gate.accumulation_steps,
                "staging_bytes": self._overlap.staging_bytes,
                "device": str(self._overlap.device or "cpu"),
            },
            "notes": self.notes,
        }

    @torch.no_grad()
    def close(self):
        """Gives the parameters their own memory again and frees the state (the swap files are
        removed). The optimizer cannot step afterwards."""
        if self._ctx is None:
            return
        if self._overlap is not None:
            overlap, self._overlap = self._overlap, None
            overlap.close()
        if self._shard is not None:
            self._shard.close()
        for e in self._engines:
            for s in e.slots:
                p = s.param
                if s.bound_param is not None and p.data.data_ptr() == s.bound_param.data_ptr():
                    p.data = p.data.clone()
                if s.bound_grad is not None and p.grad is not None and \
                        p.grad.data_ptr() == s.bound_grad.data_ptr():
                    p.grad = p.grad.clone()
                s.bound_param = None
                s.bound_grad = None
        for off in self._offloads:
            off.before_fetch = None
            off.updates_landed = None
        self._offloads = []
        self._engines = []
        self._ctx = None

    def __repr__(self):
        return (f"OffloadAdamW(offload_optimizer={self.offload_device!r}, "
                f"groups={len(self.param_groups)}, steps={self._steps})")

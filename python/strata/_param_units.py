"""The pieces of ``strata._param_offload`` that describe a model's units: which modules are units
(``unit_roots``, ``unit_structure``, also the optimizer's packing), the entries and units
themselves, the registry of offloaded parameters, and small tensor helpers."""


import torch

_ALIGN_BYTES = 256
# id(Parameter) -> (weakref to it, weakref to its ParamOffload, its unit's index, its entry's index
# in the unit). Keyed by id, not by the tensor: a WeakKeyDictionary compares colliding keys with ==,
# which reads a released parameter. Nothing is held strongly, so that a model dropped without
# close() frees its offload (its store, swap files and process group); _forget_dead then drops its
# entries.
_REGISTRY = {}


def lookup(param):
    """(offload, unit, entry) of an offloaded parameter, else None."""
    hit = _REGISTRY.get(id(param))
    if hit is None or hit[0]() is not param:
        return None
    offload = hit[1]()
    if offload is None:
        return None
    unit = offload.units[hit[2]]
    return offload, unit, unit.entries[hit[3]]


def _forget_dead(ids):
    """Drops the registry's entries among `ids` whose offload is gone (a ParamOffload's finalizer;
    an id a later offload took over is left alone)."""
    for key in ids:
        hit = _REGISTRY.get(key)
        if hit is not None and hit[1]() is None:
            del _REGISTRY[key]


class _Entry:
    """One offloaded parameter inside its unit's home."""
    __slots__ = ("param", "name", "names", "shape", "dtype", "numel", "nbytes", "offset",
                 "trainable", "part")

    def __init__(self, param, names, offset, part):
        self.param = param
        self.name = names[0]
        self.names = names  # every name the model gives it (a tied weight has several)
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.numel = param.numel()
        self.nbytes = self.numel * param.element_size()
        self.offset = offset  # bytes into its part's home
        self.trainable = param.requires_grad
        self.part = part  # 0: trainable, 1: frozen


class _Unit:
    """A module subtree whose offloaded parameters are materialised together."""

    def __init__(self, index, name, module):
        self.index = index
        self.name = name
        self.module = module
        self.entries = []
        self.part_bytes = [0, 0]  # trainable, frozen
        self.homes = [None, None]  # host uint8 tensors (cpu home), or None (on NVMe)
        self.store_ids = [None, None]  # the ParamStore unit of each part (nvme)
        self.materialised = False
        self.active = 0  # forwards of this unit running (nested calls)
        self.pending_grads = 0  # trainable parameters whose gradient this backward awaits
        self.pending_inputs = 0  # inputs requiring grad whose gradient this backward awaits
        self.forward_hooked = False  # the last forward outside the backward put input hooks
        self.backward_open = False  # materialised for its backward, which may still read it
        self.staged = None  # NVMe read-ahead: future of [host tensors per part]
        self.copy_event = None  # CUDA: the last host-to-device copy out of the homes
        self.ready_event = None  # CUDA: a copy made ahead on the side stream is complete
        self.write_buf = None  # NVMe write-back of the trainable part being assembled
        self.write_left = 0

    @property
    def nbytes(self):
        return sum(e.nbytes for e in self.entries)

    @property
    def in_host(self):
        """Whether every part of the unit is homed in host memory (none on NVMe)."""
        return all(h is not None for h, n in zip(self.homes, self.part_bytes) if n)

    @property
    def numel(self):
        return sum(e.numel for e in self.entries)


def _aligned(n):
    return -(-n // _ALIGN_BYTES) * _ALIGN_BYTES


def unit_roots(model, unit_modules=None):
    """[(name, module)] of the unit modules: instances of the classes named by the model's
    ``_no_split_modules`` or given in unit_modules (classes or names), outermost only."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = tuple(c for c in (unit_modules or []) if isinstance(c, type))
    names |= {c for c in (unit_modules or []) if isinstance(c, str)}
    roots = []
    for name, m in model.named_modules():
        if m is model:
            continue
        if type(m).__name__ in names or (classes and isinstance(m, classes)):
            if not any(name.startswith(r + ".") for r, _ in roots):
                roots.append((name, m))
    return roots


def unit_structure(model, unit_modules=None, roots=None):
    """id(parameter) -> the name of its unit ("<root>" for the rest), every parameter of the
    model: the packing OffloadAdamW follows (an offloaded model's units, or module='s blocks),
    so that an offloaded model and the same model in memory lay their state out alike."""
    if roots is None:
        roots = unit_roots(model, unit_modules)
    owner = {}
    for name, m in roots:
        for p in m.parameters():
            owner.setdefault(id(p), name)
    for p in model.parameters():
        owner.setdefault(id(p), "<root>")
    return owner


def _alias(param, e):
    """A tensor over the parameter's storage with its own version counter: copies into it do
    not count as in-place edits of the parameter that autograd saved."""
    alias = torch.empty(0, dtype=e.dtype, device=param.device)
    alias.set_(param.untyped_storage(), 0, e.shape)
    return alias


def _tensors(obj):
    """The tensors in a module's inputs or outputs (tuples, lists, dicts, ModelOutputs)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)
    elif hasattr(obj, "to_tuple"):
        yield from _tensors(obj.to_tuple())

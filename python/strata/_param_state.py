"""What ``strata._param_offload.ParamOffload`` does besides fetching and releasing: the values and
updates the optimizer reads and writes, the state_dict / load_state_dict hooks, the forward
wrapper that names a parameter read outside its unit, and the summary."""

import functools
import time

import torch

from ._core import StrataError
from ._param_units import _alias, lookup


class _HomesAndReports:
    """Mixed into ParamOffload (which owns every attribute used here)."""

    def _wrap_root_forward(self):
        """A forward that reads a released parameter (one used outside its unit) fails in torch
        with a storage-size message; this names the cause and what is valid."""
        model = self.model
        inner = model.forward

        @functools.wraps(inner)
        def forward(*args, **kwargs):
            try:
                return inner(*args, **kwargs)
            except RuntimeError as ex:
                if "storage of size 0" not in str(ex) or self.closed:
                    raise
                released = [e.name for u in self.units if not u.materialised for e in u.entries]
                raise StrataError(
                    f"offload_parameters: the forward read an offloaded parameter while its unit "
                    f"was not materialised (a parameter used by a module outside its unit; "
                    f"released now: {', '.join(released[:8])}{' ...' if len(released) > 8 else ''}"
                    f"); torch said: {ex}; valid: list the module that uses it in unit_modules= "
                    f"so that one unit holds both, or keep it on the device with fewer elements "
                    f"than zero_optimization.stage3_param_persistence_threshold") from ex

        model.forward = forward
        self._inner_forward = inner

    # ---- values, updates and checkpoints -------------------------------------------------------

    def _check_owned(self, u, what):
        if not self._owns(u):
            raise StrataError(f"offload_parameters(process_group=...): rank {self.ranks.rank} "
                              f"cannot {what} unit '{u.name}' on its own: rank {u.owner} owns it; "
                              f"valid: OffloadAdamW(process_group=<the same group>)")

    def values(self, param):
        """A host tensor with the parameter's current values (from its home)."""
        _, u, e = lookup(param)
        self._check_owned(u, "read")
        with self.lock:
            if u.homes[e.part] is not None:
                parts = u.homes
            elif self._values_cache is not None and self._values_cache[0] is u:
                parts = self._values_cache[1]  # the optimizer reads a unit's parameters in a row
            else:
                parts = self._read_parts(u)
                self._values_cache = (u, parts)
            return parts[e.part][e.offset:e.offset + e.nbytes].view(e.dtype).view(e.shape).clone()

    def update(self, param, values, non_blocking=False):
        """Writes new values of a trainable parameter into its home (NVMe: the unit's trainable
        part is written once all of its parameters have new values) and into its device storage
        when it is materialised."""
        _, u, e = lookup(param)
        self._check_owned(u, "update")
        flat = values.reshape(-1).view(torch.uint8)
        with self.lock:
            self._values_cache = None
            self._host_written(u)
            if u.homes[e.part] is not None:
                u.homes[e.part][e.offset:e.offset + e.nbytes].copy_(flat)
            else:
                if u.write_buf is None:
                    u.write_buf = self._blank(u, e.part)
                    u.write_left = sum(1 for x in u.entries if x.part == e.part)
                u.write_buf[e.offset:e.offset + e.nbytes].copy_(flat)
                u.write_left -= 1
                if u.write_left == 0:
                    begin = time.perf_counter()
                    self.store.write(u.store_ids[e.part], u.write_buf.numpy())
                    self._note("nvme", f"write {u.name}", begin)
                    self.counters["nvme_write_bytes"] += u.part_bytes[e.part]
                    u.write_buf = None
                    u.staged = None  # a read-ahead that may predate this write
            if u.materialised:
                with torch.no_grad():
                    _alias(param, e).copy_(values.view(e.shape), non_blocking=non_blocking)

    def _state_dict_hook(self, module, state_dict, prefix, local_metadata):
        for u in self.units:
            parts = None
            for e in u.entries:
                for key in (prefix + n for n in e.names):
                    if key not in state_dict:
                        continue
                    if parts is None:
                        with self.lock:  # (across ranks: a gather every rank makes)
                            parts = self._unit_bytes(u, staged=False)
                    state_dict[key] = parts[e.part][e.offset:e.offset + e.nbytes].view(
                        e.dtype).view(e.shape).to("cpu", copy=True)
        return state_dict

    def _load_pre_hook(self, module, state_dict, prefix, local_metadata, strict, missing,
                       unexpected, errors):
        for u in self.units:
            for e in u.entries:
                for key in (prefix + n for n in e.names):
                    if key not in state_dict:
                        continue
                    value = state_dict.pop(key)
                    self._loaded_keys.append(key)
                    if tuple(value.shape) != e.shape:
                        errors.append(f"size mismatch for {key}: copying a param with shape "
                                      f"{tuple(value.shape)}, the offloaded parameter has "
                                      f"{e.shape}")
                        continue
                    self._load_value(u, e, value.detach().to("cpu", e.dtype))

    def _load_value(self, u, e, value):
        if not self._owns(u):  # across ranks: the owner keeps it; a stale copy goes
            with self.lock:
                self._release(u)
            return
        with self.lock:
            self._values_cache = None
            self._host_written(u)
            flat = value.reshape(-1).contiguous().view(torch.uint8)
            if u.homes[e.part] is not None:
                u.homes[e.part][e.offset:e.offset + e.nbytes].copy_(flat)
            else:
                parts = self._read_parts(u)
                parts[e.part][e.offset:e.offset + e.nbytes].copy_(flat)
                self.store.write(u.store_ids[e.part], parts[e.part].numpy())
                u.staged = None
            if u.materialised:
                self._release(u)

    def _load_post_hook(self, module, incompatible):
        for key in self._loaded_keys:
            if key in incompatible.missing_keys:
                incompatible.missing_keys.remove(key)
        self._loaded_keys = []

    # ---- reporting -----------------------------------------------------------------------------

    def summary(self):
        c = self.counters
        out = {
            "offload_param": self.kind,
            "device": str(self.device),
            "units": len(self.units),
            "unit_bytes": [u.nbytes for u in self.units],
            "parameter_bytes": self.total_bytes,
            "persistent_bytes": self.persistent_bytes,
            "materialised_bytes": self.materialised_bytes + self.persistent_bytes,
            "materialised_bytes_peak": self.peak_bytes,
            "window_elements": self.max_live,
            "fetches": c["fetches"],
            "prefetches": c["prefetches"], "prefetch_hits": c["prefetch_hits"],
            "device_prefetches": c["device_prefetches"],
            "hits": c["hits"], "releases": c["releases"],
            "evictions": c["evictions"], "order_departures": c["order_departures"],
            "recorded_order": list(self.recorded or []),
            "nvme_read_bytes": c["nvme_read_bytes"], "nvme_write_bytes": c["nvme_write_bytes"],
            "host_bytes": sum(h.numel() for u in self.units for h in u.homes if h is not None),
        }
        if self.store is not None:
            out["store"] = self.store.usage()
        if self.ranks is not None:
            r = self.ranks
            out["ranks"] = {"rank": r.rank, "world": r.world,
                            "units_owned": sum(1 for u in self.units if r.owns(u)),
                            "owned_bytes": sum(u.nbytes for u in self.units if r.owns(u)),
                            "gather_bytes_sent": r.bytes_sent,
                            "gather_bytes_received": r.bytes_received}
        return out

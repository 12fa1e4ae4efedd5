"""OffloadAdamW's checkpoints (``state_dict`` / ``load_state_dict``, torch's layout), mixed into
``strata.torch.OffloadAdamW``, which owns every attribute used here."""

import torch

from ._core import StrataError

_STATE_KINDS = ("master", "exp_avg", "exp_avg_sq")
_FORMAT = 1  # of state_dict()["strata"]


def _value(s):
    """A parameter's current values: from its offload home when it is offloaded."""
    if getattr(s, "offload", None) is not None:
        return s.offload.values(s.param)
    return s.param.detach()


class _Checkpoints:
    """state_dict() and load_state_dict() of OffloadAdamW."""

    @torch.no_grad()
    def state_dict(self):
        """torch's layout ({"state": {index: {...}}, "param_groups": [...]}) with tensors only, so
        ``torch.load(weights_only=True)`` reads it: per parameter ``step``, ``exp_avg``,
        ``exp_avg_sq`` and, for 16-bit parameters, the fp32 ``master`` weights; plus a
        "strata" entry (steps, skipped steps, loss scaler)."""
        self._check_open()
        self._synchronize()
        state = {}
        for e in self._engines:
            kinds = _STATE_KINDS if e.dtype != torch.float32 else _STATE_KINDS[1:]
            for u, slots in enumerate(e.by_unit):
                for kind in kinds:
                    e.core.load_state(kind, u)
                    view = e.view(kind, u)
                    for s in slots:
                        entry = state.setdefault(s.index, {
                            "step": torch.tensor(float(self._steps), dtype=torch.float32)})
                        entry[kind] = view[s.offset:s.offset + s.numel].clone().view(
                            s.param.shape)
        groups = []
        index = 0
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = list(range(index, index + len(g["params"])))
            index += len(g["params"])
            groups.append(packed)
        scaler = self._ctx.scaler_state()
        return {
            "state": state,
            "param_groups": groups,
            "strata": {"format": _FORMAT, "steps": self._steps, "skipped_steps": self._skipped,
                       "loss_scaler": [scaler["scale"], scaler["iteration"],
                                       scaler["last_overflow_iteration"], scaler["hysteresis"]]},
        }

    @torch.no_grad()
    def load_state_dict(self, state_dict):
        """Restores what state_dict() saved (the same parameters, in the same groups)."""
        self._check_open()
        self._synchronize()
        if not isinstance(state_dict, dict) or "state" not in state_dict or \
                "param_groups" not in state_dict:
            raise StrataError("load_state_dict: valid: a dict with 'state' and 'param_groups', "
                              "as state_dict() returns")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise StrataError(f"load_state_dict: {len(groups)} param groups saved, "
                              f"{len(self.param_groups)} in this optimizer; valid: the same")
        for gi, (saved, mine) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(mine["params"]):
                raise StrataError(f"load_state_dict: param group {gi} saved "
                                  f"{len(saved['params'])} parameters, has "
                                  f"{len(mine['params'])}; valid: the same")
        state = state_dict["state"]
        steps = None
        for e in self._engines:
            for s in e.slots:
                entry = state.get(s.index, state.get(str(s.index)))
                if entry is None:
                    raise StrataError(f"load_state_dict: no state for parameter {s.index}; "
                                      f"valid: a state_dict() of this optimizer")
                for kind in _STATE_KINDS[1:]:
                    t = entry.get(kind)
                    if t is None or t.numel() != s.numel:
                        raise StrataError(
                            f"load_state_dict: parameter {s.index}: '{kind}' has "
                            f"{None if t is None else t.numel()} elements, the parameter "
                            f"{s.numel}; valid: the same")
                    if not bool(torch.isfinite(t).all()):
                        raise StrataError(f"load_state_dict: parameter {s.index}: '{kind}' "
                                          f"holds non-finite values; refusing to train on them")
                m = entry.get("master")
                if m is not None and (m.numel() != s.numel or not bool(torch.isfinite(m).all())):
                    raise StrataError(f"load_state_dict: parameter {s.index}: 'master' has "
                                      f"{m.numel()} elements or non-finite values; valid: "
                                      f"{s.numel} finite values")
                step = int(float(entry.get("step", 0)))
                if steps is None:
                    steps = step
                elif step != steps:
                    raise StrataError(f"load_state_dict: parameter {s.index} is at step {step}, "
                                      f"others at {steps}; valid: one step for all")
        for e in self._engines:
            # fp32 parameters saved no master: it is the parameter, whose memory may be the
            # master array itself, so it is read before that array is rewritten.
            current = {s.index: _value(s).clone() for s in e.slots
                       if "master" not in state.get(s.index, state.get(str(s.index)))}

            def saved(s, kind):
                values = state.get(s.index, state.get(str(s.index))).get(kind)
                # fp32 parameters: the master is the parameter
                return current[s.index] if values is None else values

            for u in range(len(e.by_unit)):
                self._write_unit(e, u, saved)
            self._scatter_params(e)
        for saved, mine in zip(groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    mine[k] = v
        extra = state_dict.get("strata", {})
        self._steps = int(extra.get("steps", steps or 0))
        self._skipped = int(extra.get("skipped_steps", 0))
        if "loss_scaler" in extra:
            scale, iteration, last_overflow, hysteresis = extra["loss_scaler"]
            self._ctx.restore_scaler(float(scale), int(iteration), int(last_overflow),
                                     int(hysteresis))
        if getattr(self, "_shard", None) is not None:
            self._shard.broadcast_all()  # the parameters of the units other ranks own

    def consolidated_state_dict(self, dst=0):
        """With process_group: the whole state gathered on rank `dst` (None on the others), in
        state_dict()'s layout, loadable at any world size (each rank takes its own units); one
        process: state_dict()."""
        sd = self.state_dict()
        shard = getattr(self, "_shard", None)
        if shard is None:
            return sd
        merged = shard.consolidated_state(self, sd["state"], dst)
        if merged is None:
            return None
        sd["state"] = dict(sorted(merged.items()))
        return sd

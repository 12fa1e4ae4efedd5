"""Strata from Python.

- ``strata.torch.OffloadAdamW``: a ``torch.optim.Optimizer`` whose fp32 master weights and Adam
  moments live where a DeepSpeed config's ``offload_optimizer`` says (host memory or NVMe through
  Strata's swap files, under Strata's budgets) and whose step runs Strata's tile pipeline.
- ``strata.train(config_path, **overrides)``: ``strata train`` in this process; returns the
  run's summary.
- ``strata.estimate(config_path, ...)``: ``strata estimate --json`` as a dict.

Errors from the engine arrive as ``strata.StrataError`` (a ``RuntimeError``) carrying Strata's
message: the file, key or value at fault and what would be valid. See docs/python.md.
"""

import json as _json
import os as _os
import tempfile as _tempfile

from . import _core
from ._core import StrataError, __version__, git_commit

__all__ = ["StrataError", "train", "estimate", "__version__", "git_commit"]


def _override_strings(overrides, kwargs):
    """Dotted key paths with values, as `--set KEY=VALUE` strings (values written as JSON)."""
    items = dict(overrides or {})
    for key, value in kwargs.items():
        # Python names cannot hold dots: strata__train_steps=5 is strata.train_steps=5.
        items[key.replace("__", ".")] = value
    out = []
    for key, value in items.items():
        if not isinstance(key, str) or not key:
            raise StrataError(f"override key {key!r}: valid: a dotted key path such as "
                              f"'strata.train_steps'")
        text = value if isinstance(value, str) else _json.dumps(value)
        out.append(f"{key}={text}")
    return out


class _ConfigFile:
    """A config given as a path, or as a dict written to a private temporary file."""

    def __init__(self, config):
        self._tmp = None
        if isinstance(config, dict):
            fd, path = _tempfile.mkstemp(prefix="strata-config-", suffix=".json")
            with _os.fdopen(fd, "w") as f:
                _json.dump(config, f)
            self._tmp = path
            self.path = path
        elif isinstance(config, (str, _os.PathLike)):
            self.path = _os.fspath(config)
        else:
            raise TypeError(f"config: expected a path or a dict, got {type(config).__name__}")

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        if self._tmp is not None:
            _os.unlink(self._tmp)


def train(config_path, overrides=None, *, quiet=False, **kwargs):
    """Runs ``strata train --config config_path`` in this process.

    ``overrides`` maps dotted key paths to values (``{"strata.train_steps": 20}``); keyword
    arguments do the same with ``__`` for the dots (``strata__train_steps=20``). Ctrl-C or
    SIGTERM during the run stops it after the step in flight with a checkpoint, as the CLI does.
    Returns ``{"summary": {...}, "stopped_by": None | "SIGINT" | ..., "step": int,
    "last_checkpoint": str, "output_dir": str}``.
    """
    with _ConfigFile(config_path) as path:
        return _core.train(path, _override_strings(overrides, kwargs), quiet)


def estimate(config_path, *, params=None, model=None, gpus=0, nodes=1, device_bytes=None,
             host_bytes=None, nvme_bytes=None, overrides=None, **kwargs):
    """``strata estimate --json`` as a dict: bytes per tier per rank, items, assumptions and the
    verdicts against the budgets (``"fits"``: whether every tier fits)."""
    def text(v):
        return "" if v is None else str(v)
    with _ConfigFile(config_path) as path:
        return _core.estimate(path, _override_strings(overrides, kwargs), text(params),
                              text(model and _os.fspath(model)), int(gpus), int(nodes),
                              text(device_bytes), text(host_bytes), text(nvme_bytes))

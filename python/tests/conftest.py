"""Shared helpers of the strata Python tests.

Run them with the venv of tools/py_venv.sh and the built extension on the path:
    PYTHONPATH=build/python "$(tools/py_venv.sh)" -m pytest python/tests
Tests that need the `strata` module skip, naming the reason, when it cannot be imported; with
STRATA_REQUIRE_PYTHON=1 they fail instead (for the runs that are meant to test the binding).
"""
import importlib
import os

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def require(module_name):
    """Imports a module the test needs, or skips (fails with STRATA_REQUIRE_PYTHON=1) naming why."""
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        message = (f"{module_name} is not importable ({e}); build the strata Python extension "
                   f"(build/python/strata) and run with PYTHONPATH=build/python in the venv of "
                   f"tools/py_venv.sh")
        if os.environ.get("STRATA_REQUIRE_PYTHON") == "1":
            pytest.fail(message + " [STRATA_REQUIRE_PYTHON=1]", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def strata():
    require("torch")
    module = require("strata")
    require("strata.torch")
    return module


@pytest.fixture(scope="session")
def OffloadAdamW(strata):
    return require("strata.torch").OffloadAdamW


def offload_config(device, nvme_path=None, strata_section=None):
    """A DeepSpeed-style configuration for OffloadAdamW: offload_optimizer on `device`
    (none|cpu|nvme; nvme needs nvme_path) and an optional "strata" section."""
    offload = {"device": device}
    if nvme_path is not None:
        offload["nvme_path"] = str(nvme_path)
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": offload}}
    if strata_section:
        config["strata"] = dict(strata_section)
    return config

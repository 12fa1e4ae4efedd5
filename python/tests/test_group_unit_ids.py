"""strata._core.Group(unit_ids=...): each unit's id among all units keys its stochastic rounding
(src/offload/optimizer_pipeline.cc, kernels::rounding_key), so a rank of a sharded optimizer that
holds some of the units, re-indexed from 0, gets the bits of one process holding them all.

Compressed state (8-bit moments, bf16 master and gradients: stochastically rounded) and bf16
parameters: a group of three units and a group of the middle one alone with unit_ids=[1] give it
bit-identical parameters and state after three steps of the same gradients; keyed 0 (the default
ids) it differs. And the constructor's refusals of bad ids.
"""
import json

import pytest

from conftest import require

np = require("numpy")
core = require("strata._core")

UNITS = [3000, 5000, 2500]  # elements; the middle one spans three 2048-element tiles
STEPS = 3
STATE = {"moments": "8bit", "master": "bf16", "gradients": "bf16"}


def context():
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
              "strata": {"optimizer_state": dict(STATE)}}
    return core.Context(json.dumps(config), "test_group_unit_ids.json")


def group(ctx, units, **kwargs):
    return core.Group(ctx, units, "bf16", 0.01, 0.9, 0.999, 1e-8, True, **kwargs)


def values(global_id, what, n):
    """The same numbers for a unit wherever it is held: seeded by its global id and `what`."""
    return np.random.default_rng([global_id, what]).standard_normal(n).astype(np.float32)


def store(g, kind, u, data):
    view = g.state_view(kind, u)
    view[:] = 0.0
    view[:data.size] = data
    g.store_state(kind, u)


def run(units, global_ids, **kwargs):
    """Three steps over `units` (unit u is global unit global_ids[u]); returns, per unit, its
    parameters' bits and its decoded master and moments."""
    ctx = context()
    g = group(ctx, units, **kwargs)
    for u, (n, gid) in enumerate(zip(units, global_ids)):
        store(g, "master", u, values(gid, 0, n))
        store(g, "exp_avg", u, np.zeros(n, np.float32))
        store(g, "exp_avg_sq", u, np.zeros(n, np.float32))
        g.refresh_params(u)
    for t in range(1, STEPS + 1):
        for u, (n, gid) in enumerate(zip(units, global_ids)):
            store(g, "grad", u, values(gid, t, n) * np.float32(0.1))
        g.step(1e-2, 1.0, t)
    out = []
    for u in range(len(units)):
        unit = {"param": g.param_view(u).copy()}
        for kind in ("master", "exp_avg", "exp_avg_sq"):
            g.load_state(kind, u)
            unit[kind] = g.state_view(kind, u).copy()
        out.append(unit)
    return out


def same_bits(a, b):
    return all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def test_a_unit_held_alone_with_its_global_id_gets_the_bits_of_the_whole_group():
    whole = run(UNITS, [0, 1, 2])
    alone = run(UNITS[1:2], [1], unit_ids=[1])
    assert whole[1]["param"].dtype == np.uint16  # bf16 bits
    assert same_bits(alone[0], whole[1])
    # The state did change, and was rounded (8-bit moments, bf16 master): not a trivial match.
    assert whole[1]["exp_avg"].any() and whole[1]["exp_avg_sq"].any()
    assert not np.array_equal(whole[1]["master"][:UNITS[1]], values(1, 0, UNITS[1]))


def test_keyed_by_its_position_the_lone_unit_rounds_differently():
    whole = run(UNITS, [0, 1, 2])
    default_ids = run(UNITS[1:2], [1])  # keyed 0, as the first unit of its group
    assert not same_bits(default_ids[0], whole[1])
    explicit_zero = run(UNITS[1:2], [1], unit_ids=[0])
    assert same_bits(explicit_zero[0], default_ids[0])


def test_unit_ids_are_checked():
    ctx = context()
    with pytest.raises(core.StrataError, match=r"unit_ids.*2 ids for 3 units; valid: one id per"):
        group(ctx, UNITS, unit_ids=[0, 1])
    with pytest.raises(core.StrataError, match=r"unit_ids.*0 ids for 3 units"):
        group(ctx, UNITS, unit_ids=[])
    with pytest.raises(core.StrataError, match=r"unit_ids.*unit 1 has id -4; valid: 0 to"):
        group(ctx, UNITS, unit_ids=[0, -4, 2])
    with pytest.raises(core.StrataError, match=r"unit_ids.*unit 0 has id 4294967296; valid: 0 to"):
        group(ctx, UNITS, unit_ids=[2**32, 1, 2])
    with pytest.raises(core.StrataError,
                       match=r"unit_ids.*units 0 and 2 both have id 7; valid: distinct ids"):
        group(ctx, UNITS, unit_ids=[7, 1, 7])
    # Any distinct ids of 0 or more, in any order, are valid; None is the default.
    assert group(ctx, UNITS, unit_ids=[9, 0, 4]).units() == 3
    assert group(ctx, UNITS, unit_ids=None).units() == 3

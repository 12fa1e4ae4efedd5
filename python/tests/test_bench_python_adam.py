"""Tests of tools/bench_python_adam.py's own parts: the parameter shapes, the memory estimates of
--dry-run and the --json schema of a tiny run of the torch variants. DeepSpeed and the strata
module are not needed (their variants must then be reported as skipped, with the reason)."""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "tools", "bench_python_adam.py")
GIB = 1 << 30


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_python_adam", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load_bench()


def run_script(*args):
    proc = subprocess.run([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("total", [1, 255, 4095, 4096, 4097, 16777216, 16777217, 10**8,
                                   202383360, 202383361, 10**9, 7 * 10**9])
def test_shapes_sum_exactly_to_params(total):
    shapes = bench.llama7b_shapes(total)
    assert sum(bench.numel(s) for s in shapes) == total
    assert all(bench.numel(s) > 0 for s in shapes)


def test_shapes_follow_llama7b_layers():
    layer = bench.LAYER_SHAPES
    per_layer = sum(bench.numel(s) for s in layer)
    assert per_layer == 4 * 4096 * 4096 + 3 * 11008 * 4096 + 2 * 4096
    # Three whole layers and then the start of a fourth, cut to whole rows plus a remainder.
    total = 3 * per_layer + 4096 * 4096 + 5 * 4096 + 7
    shapes = bench.llama7b_shapes(total)
    assert shapes[:3 * len(layer)] == layer * 3
    assert shapes[3 * len(layer):] == [(4096, 4096), (5, 4096), (7,)]
    # 1e8 elements: q, k, v, o and a part of the gate projection.
    assert bench.llama7b_shapes(10**8)[:4] == [(4096, 4096)] * 4


def test_parse_count():
    assert bench.parse_count("1e9") == 10**9
    assert bench.parse_count("123") == 123
    for bad in ["0", "1.5", "-3", "lots"]:
        with pytest.raises(Exception):
            bench.parse_count(bad)


def test_dry_run_estimates():
    n = 10**9
    fp32 = {v: bench.bytes_per_element(v, "fp32") for v in bench.VARIANTS}
    assert fp32["torch-fused"] == (16, 0)  # parameter, gradient, exp_avg, exp_avg_sq
    assert fp32["deepspeed-cpu-adam"] == (16, 0)
    assert fp32["torch-foreach"] == (20, 0)  # + sqrt(exp_avg_sq) of every tensor at once
    assert fp32["strata-nvme"][1] > 0 and fp32["strata-cpu"][1] == 0
    # bf16 parameters: the torch variants add an fp32 master and its gradient.
    assert bench.bytes_per_element("torch-fused", "bf16") == (2 + 2 + 4 + 4 + 8, 0)

    fits = bench.plan("torch-fused", n, "fp32", "/nonexistent", host_available=64 * GIB)
    assert fits["fits"] and fits["host_bytes"] == 16 * n and fits["reason"] == ""
    short = bench.plan("torch-fused", n, "fp32", "/nonexistent", host_available=8 * GIB)
    assert not short["fits"] and "memory" in short["reason"] and "8.0 GiB" in short["reason"]
    # The slack counts: exactly the estimate is not enough.
    edge = bench.plan("torch-fused", n, "fp32", "/x", host_available=16 * n)
    assert not edge["fits"]
    no_disk = bench.plan("strata-nvme", n, "fp32", "/data/nvme", host_available=64 * GIB,
                         disk_available=1 * GIB)
    assert not no_disk["fits"] and "/data/nvme" in no_disk["reason"]
    disk_ok = bench.plan("strata-nvme", n, "fp32", "/data/nvme", host_available=64 * GIB,
                         disk_available=64 * GIB)
    assert disk_ok["fits"] and disk_ok["disk_bytes"] == 16 * n


def test_dry_run_cli_prints_every_variant(tmp_path):
    proc = run_script("--dry-run", "--json", "--params", "1e9", "--param-dtype", "bf16",
                      "--nvme-dir", str(tmp_path / "not-yet"))
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["variant"] for r in records] == bench.VARIANTS
    for r in records:
        assert r["params"] == 10**9 and r["dtype"] == "bf16"
        assert isinstance(r["fits"], bool)
        assert r["host_bytes"] == bench.bytes_per_element(r["variant"], "bf16")[0] * 10**9
    text = run_script("--dry-run", "--params", "1e3", "--variants", "torch-fused").stdout
    assert "torch-fused" in text and "fits" in text and "strata" not in text


def test_unknown_variant_is_refused():
    proc = subprocess.run([sys.executable, SCRIPT, "--variants", "torch-foreach,adam9000"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.returncode != 0 and "adam9000" in proc.stderr


REQUIRED = {"variant", "params", "dtype", "median_s", "min_s", "rounds", "repeats",
            "ratio_vs_torch_foreach",
            "status"}


def test_json_schema_of_a_tiny_run(tmp_path):
    pytest.importorskip("torch")
    variants = ["torch-foreach", "torch-fused", "deepspeed-cpu-adam", "strata-nvme"]
    proc = run_script("--params", "5000", "--rounds", "3", "--json",
                      "--variants", ",".join(variants), "--nvme-dir", str(tmp_path))
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["variant"] for r in records] == variants
    for r in records:
        assert REQUIRED <= set(r), r
        assert r["params"] == 5000 and r["dtype"] == "fp32" and r["rounds"] == 3
        assert r["status"] in ("ok", "skipped", "failed")
        if r["status"] == "ok":
            assert len(r["times_s"]) == 3
            assert r["min_s"] == min(r["times_s"]) and 0 < r["min_s"] <= r["median_s"]
            assert r["finite"]
        else:
            assert r["reason"] and r["median_s"] is None and r["ratio_vs_torch_foreach"] is None
    foreach, fused = records[0], records[1]
    assert foreach["status"] == "ok" and foreach["ratio_vs_torch_foreach"] == 1.0
    if fused["status"] == "ok":
        assert fused["ratio_vs_torch_foreach"] == pytest.approx(
            fused["median_s"] / foreach["median_s"])
    # A missing package is a skip with its reason, never a crash.
    if importlib.util.find_spec("deepspeed") is None:
        assert records[2]["status"] == "skipped" and "deepspeed" in records[2]["reason"]
    if importlib.util.find_spec("strata") is None:
        assert records[3]["status"] == "skipped" and "strata" in records[3]["reason"]
    assert os.listdir(tmp_path) == []  # strata-nvme's swap folder is removed


def test_bf16_worker_in_process(tmp_path):
    """The worker itself (what each subprocess runs), bf16, without a subprocess."""
    pytest.importorskip("torch")
    args = argparse.Namespace(worker="torch-foreach", params=3000, rounds=2, param_dtype="bf16",
                              nvme_dir=str(tmp_path))
    out = bench.run_worker(args)
    assert out["status"] == "ok", out
    assert len(out["times_s"]) == 2 and out["median_s"] > 0 and out["finite"]
    args.worker = "strata-cpu"
    out = bench.run_worker(args)
    if importlib.util.find_spec("strata") is None:
        assert out == {"status": "skipped", "reason": out["reason"]} and "strata" in out["reason"]
    else:
        assert out["status"] == "ok", out


def test_bf16_masters_are_copied_back():
    """The bf16 torch variants step fp32 masters and round them into the bf16 parameters."""
    torch = pytest.importorskip("torch")
    params = []
    for shape in [(3, 5), (7,)]:
        # Small values: an Adam step of lr 1e-3 is then many bf16 ulps (at ~1 it is below one).
        p = (torch.randn(shape) * 1e-3).to(torch.bfloat16).requires_grad_(True)
        p.grad = torch.randn(shape).to(torch.bfloat16)
        params.append(p)
    before_values = [p.detach().clone() for p in params]
    opt, before, after, close = bench.build_variant("torch-fused", params, "bf16", None)
    masters = opt.param_groups[0]["params"]
    assert all(m.dtype == torch.float32 for m in masters)
    before()
    assert all(torch.equal(m.grad, p.grad.float()) for m, p in zip(masters, params))
    opt.step()
    after()
    close()
    for p, m, old in zip(params, masters, before_values):
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))
        assert not torch.equal(p.detach(), old)


def test_repeats_pool_every_timed_step():
    runs = [
        {"status": "ok", "median_s": 2.0, "min_s": 1.0, "times_s": [1.0, 2.0, 3.0],
         "first_step_s": 5.0, "setup_s": 1.0, "finite": True, "threads": 2},
        {"status": "ok", "median_s": 5.0, "min_s": 4.0, "times_s": [4.0, 5.0, 6.0],
         "first_step_s": 7.0, "setup_s": 3.0, "finite": True, "threads": 2},
    ]
    pooled = bench.pool_runs(runs)
    assert pooled["median_s"] == 3.5 and pooled["min_s"] == 1.0
    assert pooled["times_s"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert pooled["process_medians_s"] == [2.0, 5.0]
    assert pooled["first_step_s"] == 6.0 and pooled["setup_s"] == 2.0
    assert bench.pool_runs(runs[:1]) == runs[0]

"""tools/bench_torch_offload.py runs on the CPU (the tiny preset, what CI can run): every variant
reports ok with sane figures, or is skipped naming why (FSDP2's CPU offload and DeepSpeed's
ZeRO-3 offload_param need a GPU, DeepSpeed may not be installed); none fails. The Strata
variants, optimizer offload and parameter offload (offload_parameters, cpu and nvme), end at the
same loss."""
import json
import os
import subprocess
import sys

from conftest import REPO_ROOT, require

BENCH = os.path.join(REPO_ROOT, "tools", "bench_torch_offload.py")


def test_bench_torch_offload_runs_every_variant_on_the_cpu(strata, tmp_path):
    require("transformers")
    env = dict(os.environ)
    # --jobs 2: two variants at a time (the imports dominate on the tiny model); the losses do not
    # depend on it, the timings here are not measurements anyway.
    proc = subprocess.run(
        [sys.executable, BENCH, "--preset", "tiny", "--steps", "2", "--warmup", "1", "--json",
         "--jobs", "2", "--nvme-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["variant"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(results) == {"torch-fused", "strata-cpu", "strata-cpu-sync", "strata-nvme",
                            "fsdp2-cpu-offload", "deepspeed-zero2", "strata-param-cpu",
                            "strata-param-nvme", "deepspeed-zero3-offload-param"}
    for name in ("torch-fused", "strata-cpu", "strata-cpu-sync", "strata-nvme",
                 "strata-param-cpu", "strata-param-nvme"):
        r = results[name]
        assert r["status"] == "ok", r
        assert r["tokens_per_s"] > 0 and 0 < r["busy"] <= 1.0 and r["step_s"] > 0, r
        assert r["loss"] == r["loss"] and r["loss"] > 0, r  # finite
        assert r["ratio_vs_torch_fused"] > 0 and r["largest_params"] > 0, r
    # The same model, seed and batch: the Strata variants train the same parameters (the overlap
    # gives the bits of the plain step; every one has bf16 parameters computed on the CPU, and
    # offload_parameters materialises the same bf16 bytes), so their losses after the timed steps
    # agree bit for bit.
    for name in ("strata-cpu", "strata-nvme", "strata-param-cpu", "strata-param-nvme"):
        assert results[name]["loss"] == results["strata-cpu-sync"]["loss"], name
    assert results["strata-nvme"]["nvme_bytes_per_param"] >= 12, results["strata-nvme"]
    assert results["strata-cpu"]["host_bytes_per_param"] >= 12, results["strata-cpu"]
    # Parameter offload: the bf16 model (2 B/param) is offloaded but for the norms (under the tiny
    # preset's persistence threshold); each offloaded byte is read from NVMe at least once a step
    # and written once (the optimizer's new values); host memory holds the cpu variant's homes.
    for name in ("strata-param-cpu", "strata-param-nvme"):
        r = results[name]
        assert r["parameter_bytes"] == 2 * r["params"], r
        assert 0 < r["persistent_bytes"] < r["parameter_bytes"] // 100, r
        assert 0 < r["materialised_bytes_peak"] <= r["parameter_bytes"], r
        assert r["units"] == 3 and r["fetches_per_step"] >= 3, r  # two layers and the root
    offloaded = r["parameter_bytes"] - r["persistent_bytes"]
    cpu, nvme = results["strata-param-cpu"], results["strata-param-nvme"]
    assert cpu["nvme_read_bytes_per_step"] == cpu["nvme_write_bytes_per_step"] == 0, cpu
    assert cpu["host_bytes_per_param"] >= 14 and cpu["nvme_bytes_per_param"] == 0, cpu
    assert nvme["nvme_read_bytes_per_step"] >= offloaded, nvme
    assert nvme["nvme_write_bytes_per_step"] == offloaded, nvme
    assert nvme["nvme_bytes_per_param"] >= 14, nvme
    for name in ("fsdp2-cpu-offload", "deepspeed-zero2", "deepspeed-zero3-offload-param"):
        assert results[name]["status"] in ("ok", "skipped"), results[name]
        if results[name]["status"] == "skipped":
            assert results[name]["reason"], results[name]

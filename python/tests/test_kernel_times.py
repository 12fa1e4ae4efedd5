"""tools/kernel_times.py (the per-family kernel times of tools/gpu_checks.sh --bench): the step is
the difference of two ncu runs, each kernel lands in the step-time model's family, units are read,
and a file that is not ncu's CSV is refused with its name."""
import json
import os
import subprocess
import sys

from conftest import REPO_ROOT

TOOL = os.path.join(REPO_ROOT, "tools", "kernel_times.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"\n')


def ncu_csv(path, launches):
    lines = ["==PROF== Connected to process 1 (strata)\n", "step 1 loss 4.6\n", HEADER]
    for i, (name, value, unit) in enumerate(launches):
        lines.append(f'"{i}","1","strata","h","{name}","1","7","(256, 1, 1)","(8, 1, 1)","0",'
                     f'"9.0","Command line profiler metrics","gpu__time_duration.sum","{unit}",'
                     f'"{value}"\n')
    path.write_text("".join(lines))
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True,
                          timeout=60)


def test_one_step_is_the_difference_of_the_two_runs_by_family(tmp_path):
    start = [("flash_attention_forward_kernel", "1000", "nsecond"),  # a start-up check
             ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "500", "nsecond")]
    step = [("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "2", "msecond"),
            ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "1,500", "usecond"),
            ("cast_block_kernel", "250", "usecond"),
            ("flash_attention_dq_kernel", "400", "usecond"),
            ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma", "100", "usecond"),
            ("layernorm_forward_kernel", "50", "usecond"),
            ("gelu_forward_kernel", "30", "usecond"),
            ("cross_entropy_kernel", "70", "usecond"),
            ("adam_kernel", "300", "usecond"),
            ("reduce_partials_kernel", "20", "usecond"),
            ("some_new_kernel", "5", "usecond")]
    short = ncu_csv(tmp_path / "a.csv", start + step)
    long = ncu_csv(tmp_path / "b.csv", start + step + step + step)
    predict = tmp_path / "p.json"
    predict.write_text("strata bench step --predict\n" + json.dumps(
        {"families": [{"family": "gemm", "ms": 1.25}, {"family": "attention", "ms": 0.5},
                      {"family": "swiglu", "ms": 0.1}],
         "predicted_step_ms": 1.85}) + "\n")
    proc = run("--short", short, "--long", long, "--steps", "2", "--predict", str(predict),
               "--json", "--label", "gpt2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout)
    rows = {r["family"]: r for r in got["families"]}
    assert rows["gemm"]["measured_ms"] == 3.5 and rows["gemm"]["launches"] == 2
    assert rows["gemm"]["predicted_ms"] == 1.25
    assert rows["attention"]["measured_ms"] == 0.5 and rows["attention"]["launches"] == 2
    assert rows["cast"]["measured_ms"] == 0.25
    assert rows["norm+residual"]["measured_ms"] == 0.05
    assert rows["gelu-aux"]["measured_ms"] == 0.03
    assert rows["cross-entropy"]["measured_ms"] == 0.07
    assert rows["adamw"]["measured_ms"] == 0.3
    assert rows["reduce"]["measured_ms"] == 0.02
    assert rows["other"]["measured_ms"] == 0.005
    # A family only the model has is listed with nothing measured.
    assert rows["swiglu"]["measured_ms"] == 0.0 and rows["swiglu"]["predicted_ms"] == 0.1
    assert abs(got["measured_kernel_ms"] - 4.725) < 1e-9
    assert got["predicted_step_ms"] == 1.85
    table = run("--short", short, "--long", long, "--steps", "2", "--predict", str(predict))
    assert table.returncode == 0 and "all kernels" in table.stdout and "4.725" in table.stdout


def test_a_file_that_is_not_ncus_csv_is_refused_by_name(tmp_path):
    bad = tmp_path / "log.txt"
    bad.write_text("==PROF== Connected\nno csv here\n")
    proc = run("--short", str(bad), "--long", str(bad))
    assert proc.returncode != 0 and "log.txt" in proc.stderr and "no CSV rows" in proc.stderr
    odd = ncu_csv(tmp_path / "odd.csv", [("adam_kernel", "3", "furlong")])
    proc = run("--short", odd, "--long", odd)
    assert proc.returncode != 0 and "furlong" in proc.stderr
    proc = run("--short", odd, "--long", odd, "--steps", "0")
    assert proc.returncode != 0 and "--steps 0" in proc.stderr

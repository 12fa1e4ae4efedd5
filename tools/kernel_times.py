#!/usr/bin/env python3
"""The measured GPU time of one training step per kernel family, beside the model's prediction.

Nsight Compute (`ncu --csv --metrics gpu__time_duration.sum`) times every kernel of two runs of
`strata bench step`, one with S steps and one with S + K. The difference is K steps' kernels and
nothing else: the backend's start-up checks, the GEMM peak and any set-up launch the same kernels
in both runs. Each kernel is put in the family `strata bench step --predict` names, and the table
prints the measured milliseconds per step beside the predicted ones.

Usage (tools/gpu_checks.sh --bench does this for both rows of issue 36):
  tools/kernel_times.py --short A.csv --long B.csv --steps K [--predict PREDICT.json] [--json]
    A.csv, B.csv   ncu's CSV of the shorter and the longer run (`--log-file`)
    --steps K      how many more steps the longer run has (default 1)
    --predict F    `strata bench step --predict --json` for the same shape (its last line is read)
    --json         print one JSON line instead of the table
"""
import argparse
import csv
import json
import sys

# Kernel names to families, first match wins. The families are those of the step-time model
# (src/model/step_time.cc), plus "cast" (zero in the model: casts before GEMMs are what issue 36
# removes), "reduce" (gradient norms, column sums, a device-homed gradient's rounded accumulation)
# and "other".
FAMILIES = [
    ("attention", ("attention", "flash", "sdpa", "fmha", "cudnn")),
    ("cast", ("cast",)),
    ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "splitkreduce", "matmul")),
    ("cross-entropy", ("cross_entropy", "loss", "softmax")),
    ("rope", ("rope",)),
    ("swiglu", ("swiglu",)),
    ("gelu-aux", ("gelu", "add_bias")),
    ("norm+residual", ("norm", "add_kernel", "residual")),
    ("embedding", ("embedding",)),
    ("adamw", ("adam",)),
    ("reduce", ("reduce", "column", "partials", "add_rounded")),
]


def family(kernel):
    k = kernel.lower()
    for name, parts in FAMILIES:
        if any(p in k for p in parts):
            return name
    return "other"


def read_ncu_csv(path):
    """Per kernel launch: (name, nanoseconds). ncu's CSV starts at its header; other lines
    (==PROF== messages, the program's own output when no --log-file was given) are skipped."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    if not lines:
        raise SystemExit(f"kernel_times: {path}: no CSV rows from ncu (was --csv given?)")
    rows = list(csv.DictReader(lines))
    need = {"Kernel Name", "Metric Name", "Metric Unit", "Metric Value"}
    if not need.issubset(rows[0].keys()):
        raise SystemExit(f"kernel_times: {path}: ncu's CSV lacks the columns {sorted(need)}")
    scale = {"ns": 1.0, "nsecond": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
             "second": 1e9, "s": 1e9}
    out = []
    for r in rows:
        if r["Metric Name"] != "gpu__time_duration.sum":
            continue
        unit = r["Metric Unit"].strip().lower()
        if unit not in scale:
            raise SystemExit(f"kernel_times: {path}: unknown time unit '{r['Metric Unit']}'")
        value = float(r["Metric Value"].replace(",", ""))
        out.append((r["Kernel Name"], value * scale[unit]))
    return out


def by_family(launches):
    ns, count = {}, {}
    for name, t in launches:
        f = family(name)
        ns[f] = ns.get(f, 0.0) + t
        count[f] = count.get(f, 0) + 1
    return ns, count


def step_families(short, long, steps):
    """Per family: (ms per step, launches per step), from the difference of the two runs."""
    ns_a, n_a = by_family(short)
    ns_b, n_b = by_family(long)
    out = {}
    for f in set(ns_a) | set(ns_b):
        ms = (ns_b.get(f, 0.0) - ns_a.get(f, 0.0)) / steps / 1e6
        launches = (n_b.get(f, 0) - n_a.get(f, 0)) / steps
        out[f] = (ms, launches)
    return out


def read_predict(path):
    with open(path) as f:
        lines = [line for line in f if line.strip().startswith("{")]
    if not lines:
        raise SystemExit(f"kernel_times: {path}: no JSON line from `strata bench step --predict --json`")
    return json.loads(lines[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", required=True)
    ap.add_argument("--long", required=True)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--predict")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.steps < 1:
        raise SystemExit(f"kernel_times: --steps {a.steps}: the longer run's extra steps, at least 1")
    measured = step_families(read_ncu_csv(a.short), read_ncu_csv(a.long), a.steps)
    predicted = {}
    predict = None
    if a.predict:
        predict = read_predict(a.predict)
        predicted = {r["family"]: r["ms"] for r in predict.get("families", [])}
    names = [f for f, _ in FAMILIES] + ["other"]
    rows = []
    for f in names:
        if f not in measured and f not in predicted:
            continue
        ms, launches = measured.get(f, (0.0, 0.0))
        rows.append({"family": f, "measured_ms": round(ms, 4), "launches": launches,
                     "predicted_ms": predicted.get(f)})
    total = sum(r["measured_ms"] for r in rows)
    result = {"label": a.label, "measured_kernel_ms": round(total, 4), "families": rows}
    if predict:
        result["predicted_step_ms"] = predict.get("predicted_step_ms")
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"kernel times per step{' (' + a.label + ')' if a.label else ''}, from Nsight Compute")
    print(f"{'family':<16} {'launches':>9} {'measured ms':>12} {'predicted ms':>13}")
    for r in rows:
        p = "" if r["predicted_ms"] is None else f"{r['predicted_ms']:.3f}"
        print(f"{r['family']:<16} {r['launches']:>9.0f} {r['measured_ms']:>12.3f} {p:>13}")
    p = "" if not predict else f"{predict.get('predicted_step_ms', 0.0):.3f}"
    print(f"{'all kernels':<16} {'':>9} {total:>12.3f} {p:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

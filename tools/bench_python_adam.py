#!/usr/bin/env python3
"""Times one optimizer step over a Llama-7B-shaped parameter set, in Python, for five optimizers:

  torch-foreach       torch.optim.AdamW(foreach=True)            (the reference of the ratios)
  torch-fused         torch.optim.AdamW(fused=True) on the CPU    (torch >= 2.4)
  deepspeed-cpu-adam  deepspeed.ops.adam.DeepSpeedCPUAdam         (its op is JIT-built with g++)
  strata-cpu          strata.torch.OffloadAdamW, offload_optimizer.device cpu
  strata-nvme         strata.torch.OffloadAdamW, offload_optimizer.device nvme (--nvme-dir)

The parameter set repeats the tensors of one Llama-7B decoder layer ([4096x4096] x4 for q/k/v/o,
[11008x4096] x2 and [4096x11008] for the MLP, two [4096] norms) until the element count reaches
--params exactly (the last tensor is cut short). Every variant runs in its own subprocess (so that
one's memory is returned before the next starts) with the same hyperparameters (lr 1e-3, betas
0.9/0.999, eps 1e-8, weight decay 0.01), the same random gradients, one warm-up step, then
--rounds timed steps; the median and the minimum are reported, and the ratio of the median to
torch-foreach's (below 1 = faster).

--param-dtype bf16: the model's parameters and gradients are bf16 and every variant keeps fp32
master weights. The torch and DeepSpeed variants hold an fp32 master copy themselves, and a timed
step is: bf16 gradients -> fp32 master gradients, optimizer step on the masters, masters -> bf16
parameters (what a mixed-precision training loop does around these optimizers). The Strata
variants are handed the bf16 parameters directly (Strata keeps the fp32 masters itself).

A variant whose package cannot be imported (no strata module, no deepspeed) or whose optimizer
cannot be built is reported as skipped with the reason; one that needs more memory or disk than is
free is skipped unless --force; one whose worker process dies is reported as failed. --dry-run
prints what each variant would need and whether it fits.

--json prints one object per variant: variant, params, dtype, median_s, min_s, rounds, repeats,
ratio_vs_torch_foreach (median_s over torch-foreach's median_s; null without it), status ("ok",
"skipped", "failed"), reason (not "ok"), and with "ok": times_s, first_step_s (the warm-up step),
setup_s (building the optimizer: DeepSpeed's JIT build, Strata's swap files), init_s, threads,
torch.

--repeats R runs each variant in R processes, the order of the variants alternating, and pools
their timed steps (median and minimum over all R x --rounds steps; process_medians_s lists each
process's median): on a machine shared with other work, one process can be slowed for its whole
life, and a single process per variant then misleads.

Usage: bench_python_adam.py [--params 1e9] [--rounds 5] [--repeats 1] [--param-dtype fp32|bf16]
                            [--variants torch-foreach,torch-fused,...] [--nvme-dir DIR]
                            [--dry-run] [--json] [--force]
tools/bench_python_adam.sh sets up a virtual environment with deepspeed and runs this.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = ["torch-foreach", "torch-fused", "deepspeed-cpu-adam", "strata-cpu", "strata-nvme"]
REFERENCE = "torch-foreach"
RESULT_PREFIX = "BENCH_PYTHON_ADAM_RESULT "
HIDDEN = 4096
INTERMEDIATE = 11008
# One Llama-7B decoder layer: attention q, k, v, o; MLP gate, up, down; two RMSNorm weights.
LAYER_SHAPES = ([(HIDDEN, HIDDEN)] * 4 + [(INTERMEDIATE, HIDDEN)] * 2 + [(HIDDEN, INTERMEDIATE)] +
                [(HIDDEN,)] * 2)
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
# Slack on top of the estimates below before a variant is said to fit (allocator, interpreter,
# torch's own buffers).
HOST_SLACK_BYTES = 1 << 30
GIB = float(1 << 30)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def llama7b_shapes(total):
    """Shapes of Llama-7B layer tensors, repeated until their element count is exactly `total`.

    The tensor that would overshoot is cut to the whole rows that fit, and what is left after
    those rows becomes a last 1-D tensor.
    """
    if total < 1:
        raise ValueError(f"--params must be at least 1, got {total}")
    shapes = []
    left = total
    while left > 0:
        for shape in LAYER_SHAPES:
            n = numel(shape)
            if n <= left:
                shapes.append(shape)
                left -= n
            else:
                cols = shape[-1]
                rows = left // cols
                if rows > 0 and len(shape) == 2:
                    shapes.append((rows, cols))
                    left -= rows * cols
                if left > 0:
                    shapes.append((left,))
                    left = 0
            if left == 0:
                break
    return shapes


def parse_count(text):
    """Parses an element count written as an integer or in floating-point notation (1e9)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--params: {text!r} is not a number (e.g. 1e9)")
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"--params: {text!r} must be a whole number >= 1")
    return int(value)


def bytes_per_element(variant, dtype):
    """Estimated (host, disk) bytes per parameter element of one variant, step included.

    fp32: the parameter and its gradient (8 B) plus the optimizer's state. torch and DeepSpeed keep
    exp_avg and exp_avg_sq (8 B); torch's foreach AdamW also materialises sqrt(exp_avg_sq) for
    every tensor at once (4 B). Strata's home tier holds the fp32 master, both moments and an fp32
    gradient accumulator (16 B, docs/config.md, offload_optimizer.device): in host memory with
    `cpu`, in the swap files with `nvme`; with `cpu`, an fp32 parameter lives in its master and its
    gradient in the accumulator (docs/python.md), so fp32 needs no more.
    bf16: the bf16 parameter and gradient (4 B); torch and DeepSpeed add the fp32 master and its
    fp32 gradient (8 B) to their state; Strata's 16 B already include its master.
    """
    model = 8 if dtype == "fp32" else 4
    master = 0 if dtype == "fp32" else 8
    if variant == "torch-foreach":
        return model + master + 8 + 4, 0
    if variant in ("torch-fused", "deepspeed-cpu-adam"):
        return model + master + 8, 0
    if variant == "strata-cpu":
        # fp32: the parameter is the master and its gradient the accumulator (bench: gradients
        # accumulated in the home), so the 16 B hold the model too.
        return (16 if dtype == "fp32" else model + 16), 0
    if variant == "strata-nvme":
        return model, 16
    raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")


def mem_available():
    """MemAvailable from /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def disk_free(path):
    """Free bytes of the file system that holds `path` (or its nearest existing parent)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return shutil.disk_usage(probe).free


def plan(variant, params, dtype, nvme_dir, host_available=None, disk_available=None):
    """What a variant needs and whether it fits: a dict (the --dry-run record)."""
    host_per, disk_per = bytes_per_element(variant, dtype)
    host = host_per * params
    disk = disk_per * params
    if host_available is None:
        host_available = mem_available()
    if disk and disk_available is None:
        disk_available = disk_free(nvme_dir)
    reasons = []
    if host_available is not None and host + HOST_SLACK_BYTES > host_available:
        reasons.append(f"needs {host / GIB:.1f} GiB of memory (+{HOST_SLACK_BYTES / GIB:.0f} GiB "
                       f"slack), {host_available / GIB:.1f} GiB available")
    if disk and disk_available is not None and disk > disk_available:
        reasons.append(f"needs {disk / GIB:.1f} GiB of disk under {nvme_dir}, "
                       f"{disk_available / GIB:.1f} GiB free")
    return {
        "variant": variant,
        "params": params,
        "dtype": dtype,
        "host_bytes": host,
        "disk_bytes": disk,
        "host_available_bytes": host_available,
        "disk_available_bytes": disk_available if disk else None,
        "fits": not reasons,
        "reason": "; ".join(reasons),
    }


# ---------------------------------------------------------------------------------------------
# Worker: one variant, in its own process.


class Skip(Exception):
    pass


def strata_config(device, nvme_dir):
    offload = {"device": device}
    if device == "nvme":
        offload["nvme_path"] = nvme_dir
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": offload}}
    available = mem_available()
    if device == "cpu" and available:
        # Strata's default pinned budget is 80 % of the memory available when the optimizer is
        # created, and the model already holds its share by then: give it what is left, less 1 GiB.
        config["strata"] = {"host_bytes_max": int(max(available - GIB, GIB))}
    return config


def build_variant(variant, model_params, dtype, nvme_dir):
    """Returns (optimizer, before_step, after_step, close) for one variant.

    before_step/after_step are the master-weight copies of the bf16 torch/DeepSpeed variants (no-ops
    otherwise); they are part of the timed step.
    """
    import torch

    def nothing():
        pass

    if variant.startswith("strata-"):
        try:
            import strata  # noqa: F401
            from strata.torch import OffloadAdamW
        except ImportError as e:
            raise Skip(f"strata is not importable ({e}); build it and put build/python on "
                       f"PYTHONPATH")
        device = variant.split("-", 1)[1]
        config = strata_config(device, nvme_dir)
        try:
            opt = OffloadAdamW(model_params, lr=LR, betas=BETAS, eps=EPS,
                               weight_decay=WEIGHT_DECAY, config=config)
        except strata.StrataError as e:
            raise Skip(f"OffloadAdamW refused the configuration: {e}")
        if device == "cpu" and dtype == "fp32":
            # A training loop that calls opt.zero_grad(set_to_none=False) has backward accumulate
            # into the optimizer's gradient home, so the step copies nothing: the worker made no
            # gradients yet, and draws them there, as backward would have (not timed, like the
            # other variants' backward).
            opt.zero_grad(set_to_none=False)
        return opt, nothing, nothing, opt.close

    if dtype == "bf16":
        masters = []
        for p in model_params:
            m = p.detach().float().requires_grad_(True)
            m.grad = torch.empty_like(m)
            masters.append(m)

        @torch.no_grad()
        def before_step():
            torch._foreach_copy_([m.grad for m in masters], [p.grad for p in model_params])

        @torch.no_grad()
        def after_step():
            torch._foreach_copy_(model_params, masters)
        opt_params = masters
    else:
        opt_params = model_params
        before_step = after_step = nothing

    if variant == "torch-foreach":
        opt = torch.optim.AdamW(opt_params, lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WEIGHT_DECAY, foreach=True)
    elif variant == "torch-fused":
        try:
            opt = torch.optim.AdamW(opt_params, lr=LR, betas=BETAS, eps=EPS,
                                    weight_decay=WEIGHT_DECAY, fused=True)
        except (RuntimeError, ValueError) as e:
            raise Skip(f"torch {torch.__version__} has no fused AdamW on the CPU ({e})")
    elif variant == "deepspeed-cpu-adam":
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
        except ImportError as e:
            raise Skip(f"deepspeed is not importable ({e}); tools/bench_python_adam.sh "
                       f"installs it")
        opt = DeepSpeedCPUAdam(opt_params, lr=LR, betas=BETAS, eps=EPS,
                               weight_decay=WEIGHT_DECAY, adamw_mode=True)
    else:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    return opt, before_step, after_step, nothing


def run_worker(args):
    try:
        import torch
    except ImportError as e:
        return {"status": "skipped", "reason": f"torch is not importable ({e})"}
    dtype = torch.float32 if args.param_dtype == "fp32" else torch.bfloat16
    gen = torch.Generator().manual_seed(1234)
    t0 = time.perf_counter()
    params = []
    # strata-cpu fp32 draws its gradients in the optimizer's gradient home (build_variant).
    late_grads = args.worker == "strata-cpu" and args.param_dtype == "fp32"
    for shape in llama7b_shapes(args.params):
        p = torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)
        p = p.to(dtype).requires_grad_(True)
        if not late_grads:
            g = torch.empty(shape, dtype=torch.float32).normal_(0.0, 1e-3, generator=gen)
            p.grad = g.to(dtype)
        params.append(p)
    init_s = time.perf_counter() - t0
    nvme_dir = None
    if args.worker == "strata-nvme":
        os.makedirs(args.nvme_dir, exist_ok=True)
        nvme_dir = tempfile.mkdtemp(prefix="bench-python-adam-", dir=args.nvme_dir)
    try:
        t0 = time.perf_counter()
        try:
            opt, before, after, close = build_variant(args.worker, params, args.param_dtype,
                                                      nvme_dir)
        except Skip as e:
            return {"status": "skipped", "reason": str(e)}
        setup_s = time.perf_counter() - t0
        if late_grads:
            for p in params:
                p.grad.normal_(0.0, 1e-3, generator=gen)
        try:
            times = []
            for r in range(args.rounds + 1):
                t0 = time.perf_counter()
                before()
                opt.step()
                after()
                elapsed = time.perf_counter() - t0
                if r == 0:
                    first_step_s = elapsed
                else:
                    times.append(elapsed)
            finite = all(bool(torch.isfinite(p).all()) for p in params[:2])
        finally:
            close()
    finally:
        if nvme_dir:
            shutil.rmtree(nvme_dir, ignore_errors=True)
    return {
        "status": "ok",
        "median_s": statistics.median(times),
        "min_s": min(times),
        "times_s": times,
        "first_step_s": first_step_s,
        "setup_s": setup_s,
        "init_s": init_s,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "finite": finite,
    }


# ---------------------------------------------------------------------------------------------
# Driver.


def run_variant(variant, args):
    """Runs one variant in a subprocess; returns its result record (never raises)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant,
           "--params", str(args.params), "--rounds", str(args.rounds),
           "--param-dtype", args.param_dtype, "--nvme-dir", args.nvme_dir]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    record = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            record = json.loads(line[len(RESULT_PREFIX):])
    if proc.returncode != 0 or record is None:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"status": "failed",
                "reason": f"worker exited with status {proc.returncode}: {tail}"}
    return record


def pool_runs(runs):
    """One outcome from the --repeats processes of a variant: the median and minimum over all
    their timed steps; the per-process medians are kept (process_medians_s)."""
    if len(runs) == 1:
        return runs[0]
    times = [t for r in runs for t in r["times_s"]]
    pooled = dict(runs[0])
    pooled.update({
        "median_s": statistics.median(times),
        "min_s": min(times),
        "times_s": times,
        "process_medians_s": [r["median_s"] for r in runs],
        "first_step_s": statistics.median(r["first_step_s"] for r in runs),
        "setup_s": statistics.median(r["setup_s"] for r in runs),
        "finite": all(r["finite"] for r in runs),
    })
    return pooled


def result_record(variant, args, outcome, reference_median):
    record = {
        "variant": variant,
        "params": args.params,
        "dtype": args.param_dtype,
        "median_s": None,
        "min_s": None,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "ratio_vs_torch_foreach": None,
    }
    record.update(outcome)
    if outcome["status"] != "ok":
        return record
    if reference_median:
        record["ratio_vs_torch_foreach"] = outcome["median_s"] / reference_median
    return record


def format_bytes(n):
    return "-" if not n else f"{n / GIB:.1f} GiB"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=parse_count, default=10**9,
                        help="parameter elements (default 1e9)")
    parser.add_argument("--rounds", type=int, default=5, help="timed steps after one warm-up")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every variant in this many processes, in alternating order, "
                             "and pool their timed steps (for a machine shared with others)")
    parser.add_argument("--param-dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated subset of " + ",".join(VARIANTS))
    parser.add_argument("--nvme-dir", default=os.path.join(tempfile.gettempdir(),
                                                           "strata-bench-nvme"),
                        help="where strata-nvme puts its swap files (a fresh folder inside)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what each variant needs and whether it fits; run nothing")
    parser.add_argument("--json", action="store_true", help="one JSON object per variant")
    parser.add_argument("--force", action="store_true",
                        help="run variants that the estimate says do not fit")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")

    if args.worker:
        outcome = run_worker(args)
        print(RESULT_PREFIX + json.dumps(outcome), flush=True)
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"--variants: unknown variant {v!r}; valid: {', '.join(VARIANTS)}")
    plans = {v: plan(v, args.params, args.param_dtype, args.nvme_dir) for v in variants}

    if args.dry_run:
        for v in variants:
            p = plans[v]
            if args.json:
                print(json.dumps(p))
            else:
                print(f"{v:20s} memory {format_bytes(p['host_bytes']):>10s} "
                      f"(available {format_bytes(p['host_available_bytes'])})  "
                      f"disk {format_bytes(p['disk_bytes']):>10s}  "
                      f"{'fits' if p['fits'] else 'does not fit: ' + p['reason']}")
        return 0

    shapes = llama7b_shapes(args.params)
    print(f"bench_python_adam: {args.params} {args.param_dtype} elements in {len(shapes)} tensors, "
          f"median of {args.rounds} steps after 1 warm-up"
          f"{f' in each of {args.repeats} processes' if args.repeats > 1 else ''}", file=sys.stderr)
    outcomes = {}
    for v in variants:
        if not plans[v]["fits"] and not args.force:
            outcomes[v] = {"status": "skipped",
                           "reason": plans[v]["reason"] + " (--force runs it)"}
    runnable = [v for v in variants if v not in outcomes]
    runs = {v: [] for v in runnable}
    for repeat in range(args.repeats):
        # Alternate the order, so that a drift of the machine does not favour one variant.
        for v in (runnable if repeat % 2 == 0 else runnable[::-1]):
            if v in outcomes:
                continue  # skipped or failed in an earlier repeat
            print(f"bench_python_adam: {v} (repeat {repeat + 1}/{args.repeats}) ...",
                  file=sys.stderr, flush=True)
            o = run_variant(v, args)
            print(f"bench_python_adam: {v}: " +
                  (f"{o['status']}: {o['reason']}" if o["status"] != "ok"
                   else f"median {o['median_s']:.3f} s, min {o['min_s']:.3f} s"),
                  file=sys.stderr, flush=True)
            if o["status"] != "ok":
                outcomes[v] = o
            else:
                runs[v].append(o)
    for v in runnable:
        if v not in outcomes:
            outcomes[v] = pool_runs(runs[v])
    ref = outcomes.get(REFERENCE)
    reference_median = ref["median_s"] if ref and ref["status"] == "ok" else None
    records = [result_record(v, args, outcomes[v], reference_median) for v in variants]

    if args.json:
        for r in records:
            print(json.dumps(r))
    else:
        print(f"| variant | median s | min s | ratio vs torch foreach | notes |")
        print(f"|---|---|---|---|---|")
        for r in records:
            if r["status"] != "ok":
                print(f"| {r['variant']} | - | - | - | {r['status']}: {r['reason']} |")
            else:
                ratio = ("-" if r["ratio_vs_torch_foreach"] is None
                         else f"{r['ratio_vs_torch_foreach']:.3f}")
                print(f"| {r['variant']} | {r['median_s']:.3f} | {r['min_s']:.3f} | {ratio} | "
                      f"{r['threads']} threads, setup {r['setup_s']:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

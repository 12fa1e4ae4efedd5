#!/usr/bin/env python3
"""One training step of a Hugging Face Llama-shaped model (random init, SDPA attention, bf16
compute) with its optimizer on the GPU, on the CPU, or on NVMe; one variant per process:

  torch-fused        fp32 parameters, autocast bf16, torch.optim.AdamW(fused=True): every byte of
                     state on the device (the reference; where it fits)
  strata-cpu         bf16 parameters, strata.torch.OffloadAdamW(overlap=True, module=model),
                     offload_optimizer cpu: fp32 masters and moments in host memory, the
                     gradients handed over during the backward (docs/python.md, "Overlap")
  strata-cpu-sync    the same with overlap=False: step() after the backward (the before)
  strata-nvme        strata-cpu with offload_optimizer nvme under --nvme-dir
  fsdp2-cpu-offload  torch.distributed.fsdp.fully_shard per decoder layer and on the model, one
                     rank, CPUOffloadPolicy, MixedPrecisionPolicy bf16, torch.optim.AdamW on the
                     CPU-resident shards
  deepspeed-zero2    deepspeed.initialize, ZeRO-2, offload_optimizer cpu (pinned), bf16, its
                     DeepSpeedCPUAdam (where deepspeed installs)
  strata-param-cpu   ZeRO-3 offload_param: the bf16 model built on the CPU, then
                     strata.torch.offload_parameters(model, config, device=<the bench's device>)
                     with offload_param cpu (each decoder layer, and the root, materialised on
                     the device only while it runs) and OffloadAdamW(overlap=True, module=model)
                     with offload_optimizer cpu: the whole model never sits on the GPU
  strata-param-nvme  the same with offload_param nvme (max_in_cpu 0) and offload_optimizer nvme
                     under --nvme-dir
  deepspeed-zero3-offload-param
                     deepspeed.initialize, ZeRO-3, offload_param cpu and offload_optimizer cpu
                     (pinned), the model built under deepspeed.zero.Init (partitioned onto the
                     host as it is built), bf16 (where deepspeed installs; needs a GPU)

Per variant (one JSON object with --json): tokens_per_s; step_s (median wall time per training
step: forward, backward and optimizer, over --steps steps after --warmup, the device synchronized
at the end of each); compute_s (median of the forward + backward alone, the same batch, no
optimizer: the GPU's own time); busy (compute_s / step_s: the fraction of a step the GPU spends
on the model, 1.0 = the optimizer costs nothing); ratio_vs_torch_fused (step_s / torch-fused's);
peak_device_bytes (torch.cuda.max_memory_allocated), peak_host_bytes (ru_maxrss);
device/host/nvme bytes per parameter and largest_params: the largest model of this shape's family
that fits the machine (GPU memory, host memory, free space under --nvme-dir), extrapolated
linearly from the bytes per parameter measured here (an estimate: activations do not grow with
the parameter count). A variant that cannot run here is "skipped" with the reason. The param
variants add, from model.strata_offload.summary(): materialised_bytes_peak (the most parameter
bytes on the device at once), parameter_bytes (the model's), persistent_bytes (the parameters
under stage3_param_persistence_threshold, kept on the device), nvme_read/write_bytes_per_step and
fetches/prefetches/order_departures per step (over the timed steps). Their
stage3_param_persistence_threshold is DeepSpeed's default 1e5 elements, 1000 in the tiny preset
(where every matrix is under 1e5 elements, so 1e5 would offload nothing); --persistence-threshold
sets it.

On the CPU (no GPU) everything runs on the CPU: --preset tiny is what CI runs; "device" then means
the parameters' device, and busy is compute / step on the same cores.

Usage: bench_torch_offload.py [--preset tiny|1b|8b] [--batch B] [--seq S] [--steps N]
                              [--warmup W] [--variants a,b,...] [--nvme-dir DIR]
                              [--offload-ratio R] [--persistence-threshold N] [--jobs J]
                              [--json]
The 8B shape on one 80 GB GPU with a 128 GiB host and a 64 GiB disk (tools/gpu_checks.sh):
  --preset 8b --variants strata-nvme --offload-ratio 0.45 --batch 4
(bf16 weights and gradients on the GPU, 16 B/param of state: 55 % in host memory, 45 % on NVMe).
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = ["torch-fused", "strata-cpu", "strata-cpu-sync", "strata-nvme", "fsdp2-cpu-offload",
            "deepspeed-zero2", "strata-param-cpu", "strata-param-nvme",
            "deepspeed-zero3-offload-param"]
REFERENCE = "torch-fused"
RESULT_PREFIX = "BENCH_TORCH_OFFLOAD_RESULT "
SKIP_PREFIX = "BENCH_TORCH_OFFLOAD_SKIP "
# Llama shapes: hidden, layers, heads, kv heads, intermediate, vocab.
PRESETS = {
    "tiny": (64, 2, 4, 2, 172, 512),
    "1b": (2048, 16, 32, 8, 8192, 128256),  # Llama-3.2-1B: 1.24B parameters
    "8b": (4096, 32, 32, 8, 14336, 128256),  # Llama-3.1-8B: 8.03B parameters
}
# stage3_param_persistence_threshold of the ZeRO-3 variants: DeepSpeed's default, except in the
# tiny preset, whose largest matrix has 32,768 elements (1000 keeps only the norms on the device).
PERSISTENCE = {"tiny": 1000, "1b": 100000, "8b": 100000}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--nvme-dir", default=None)
    ap.add_argument("--offload-ratio", type=float, default=1.0,
                    help="strata-nvme: offload_optimizer.ratio, the fraction of the state on "
                         "NVMe (the rest in host memory)")
    ap.add_argument("--persistence-threshold", type=int, default=None,
                    help="the ZeRO-3 variants' stage3_param_persistence_threshold (default: 1e5, "
                         "1000 in the tiny preset)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="variants run at once (default 1): more than 1 is for checks such as "
                         "CI's, their timings then share the machine and compare with nothing")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for v in args.variants.split(","):
        if v not in VARIANTS:
            ap.error(f"--variants: '{v}' is not a variant; valid: {', '.join(VARIANTS)}")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps: 1 or more; --warmup: 0 or more")
    if args.jobs < 1:
        ap.error("--jobs: 1 or more")
    if args.persistence_threshold is None:
        args.persistence_threshold = PERSISTENCE[args.preset]
    elif args.persistence_threshold < 0:
        ap.error("--persistence-threshold: 0 or more")
    return args


# ---- the worker: one variant in this process --------------------------------------------------

def build_model(torch, preset, dtype, device):
    """dtype None: as built (fp32); device None: the current default (deepspeed.zero.Init's)."""
    import contextlib
    import transformers
    hidden, layers, heads, kv, inter, vocab = PRESETS[preset]
    config = transformers.LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
        max_position_embeddings=4096, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = transformers.LlamaForCausalLM(config)
    return model.to(dtype) if dtype is not None else model


def worker(args):
    variant = args.worker
    if variant.startswith("deepspeed"):
        import importlib.util
        if importlib.util.find_spec("deepspeed") is None:  # before torch: a quick skip in CI
            print(SKIP_PREFIX + "deepspeed is not importable here (No module named 'deepspeed')",
                  flush=True)
            return
    import torch
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    batch = args.batch or (8 if cuda else 2)
    seq = args.seq or (2048 if cuda else 32)
    vocab = PRESETS[args.preset][5]
    host_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    engine = None
    nvme_per_param = 0.0
    host_state = None
    nvme = None
    threshold = args.persistence_threshold

    if variant == "torch-fused":
        model = build_model(torch, args.preset, torch.float32, device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    elif variant.startswith("strata-param"):
        from strata.torch import OffloadAdamW, offload_parameters
        # Built on the CPU in bf16: the whole model is never on the device; offload_parameters
        # moves only the persistent parameters (under the threshold) there.
        model = build_model(torch, args.preset, torch.bfloat16, "cpu")
        zero = {"stage": 3, "stage3_param_persistence_threshold": threshold,
                "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
        if variant == "strata-param-nvme":
            nvme = tempfile.mkdtemp(prefix="bench-torch-offload-", dir=args.nvme_dir)
            zero["offload_param"] = {"device": "nvme", "nvme_path": os.path.join(nvme, "param"),
                                     "max_in_cpu": 0}
            zero["offload_optimizer"] = {"device": "nvme", "ratio": args.offload_ratio,
                                         "nvme_path": os.path.join(nvme, "optimizer")}
        config = {"zero_optimization": zero}
        offload_parameters(model, config, device=device)
        opt = OffloadAdamW(model.parameters(), lr=1e-4, config=config, overlap=True,
                           module=model)
    elif variant.startswith("strata"):
        from strata.torch import OffloadAdamW
        model = build_model(torch, args.preset, torch.bfloat16, device)
        config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
        if variant == "strata-nvme":
            nvme = tempfile.mkdtemp(prefix="bench-torch-offload-", dir=args.nvme_dir)
            config["zero_optimization"]["offload_optimizer"] = {
                "device": "nvme", "nvme_path": nvme, "ratio": args.offload_ratio}
        overlap = variant != "strata-cpu-sync"
        opt = OffloadAdamW(model.parameters(), lr=1e-4, config=config, overlap=overlap,
                           module=model if overlap else None)
    elif variant == "fsdp2-cpu-offload":
        if not cuda:
            print(SKIP_PREFIX + "needs a GPU: CPUOffloadPolicy keeps the shards on the CPU and "
                  "gathers them onto the GPU for compute", flush=True)
            return
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
        model = build_model(torch, args.preset, torch.float32, device)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, offload_policy=CPUOffloadPolicy(), mp_policy=mp)
        fully_shard(model, offload_policy=CPUOffloadPolicy(), mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        autocast = torch.autocast(device.type, enabled=False)
    elif variant == "deepspeed-zero2":
        try:
            import deepspeed
        except ImportError as e:
            print(SKIP_PREFIX + f"deepspeed is not importable here ({e})", flush=True)
            return
        model = build_model(torch, args.preset, torch.float32, device)
        ds_config = {"train_micro_batch_size_per_gpu": batch, "bf16": {"enabled": True},
                     "zero_optimization": {"stage": 2, "offload_optimizer": {
                         "device": "cpu", "pin_memory": True}},
                     "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
        engine, opt, _, _ = deepspeed.initialize(model=model, config=ds_config,
                                                 model_parameters=model.parameters())
        autocast = torch.autocast(device.type, enabled=False)
    elif variant == "deepspeed-zero3-offload-param":
        if not cuda:
            print(SKIP_PREFIX + "needs a GPU: offload_param gathers each layer from host memory "
                  "onto the GPU", flush=True)
            return
        try:
            import deepspeed
        except ImportError as e:
            print(SKIP_PREFIX + f"deepspeed is not importable here ({e})", flush=True)
            return
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                           ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", str(29500 + os.getpid() % 1000))):
            os.environ.setdefault(key, value)
        deepspeed.init_distributed()
        ds_config = {"train_micro_batch_size_per_gpu": batch, "bf16": {"enabled": True},
                     "zero_optimization": {
                         "stage": 3, "stage3_param_persistence_threshold": threshold,
                         "offload_param": {"device": "cpu", "pin_memory": True},
                         "offload_optimizer": {"device": "cpu", "pin_memory": True}},
                     "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
        # Partitioned (onto pinned host memory, in bf16) as each module is built: the whole
        # model is never on the GPU.
        with deepspeed.zero.Init(config_dict_or_path=ds_config, remote_device="cpu",
                                 pin_memory=True):
            model = build_model(torch, args.preset, None, None)
        engine, opt, _, _ = deepspeed.initialize(model=model, config=ds_config,
                                                 model_parameters=model.parameters())
        autocast = torch.autocast(device.type, enabled=False)
    nparams = sum(getattr(p, "ds_numel", None) or p.numel() for p in model.parameters())
    offload = getattr(model, "strata_offload", None)
    if variant == "fsdp2-cpu-offload":
        nparams = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                      for p in model.parameters())

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def forward_backward():
        with autocast:
            out = (engine or model)(input_ids=ids, labels=ids)
        if engine is not None:
            engine.backward(out.loss)
        else:
            out.loss.backward()
        return out.loss

    def train_step():
        loss = forward_backward()
        if engine is not None:
            engine.step()
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        train_step()
    sync()
    if offload is not None:
        opt.synchronize()
        before = offload.summary()
    steps = []
    for _ in range(args.steps):
        begin = time.perf_counter()
        loss = train_step()
        if hasattr(opt, "synchronize"):
            opt.synchronize()  # the step's uploads are part of it
        sync()
        steps.append(time.perf_counter() - begin)
    loss = float(loss.detach())
    if offload is not None:
        after = offload.summary()
        per_step = {f"{k}_per_step": (after[k] - before[k]) / args.steps
                    for k in ("nvme_read_bytes", "nvme_write_bytes", "fetches", "prefetches",
                              "prefetch_hits", "hits", "order_departures")}
    # The GPU's own time: forward + backward of the same batch, no optimizer (an overlapped
    # OffloadAdamW is told these backward passes only accumulate).
    import contextlib
    quiet = opt.no_sync() if hasattr(opt, "no_sync") and engine is None else \
        contextlib.nullcontext()
    compute = []
    for _ in range(args.steps):
        begin = time.perf_counter()
        with quiet:
            forward_backward()
        sync()
        compute.append(time.perf_counter() - begin)
        if engine is None:
            model.zero_grad(set_to_none=True)
    if variant.startswith("strata"):
        summary = opt.summary()
        host_state = summary["bytes"]["host"]
        nvme_state = summary["bytes"]["nvme"]
        if offload is not None:  # the parameters' own homes and swap files
            params = offload.summary()
            host_state += params["host_bytes"]
            nvme_state += (params.get("store") or {}).get("nvme_bytes", 0)
        nvme_per_param = nvme_state / nparams
    step_s = statistics.median(steps)
    compute_s = statistics.median(compute)
    peak_device = torch.cuda.max_memory_allocated() if cuda else 0
    peak_host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    host_used = host_state if host_state is not None else max(peak_host - host_before, 0)
    result = {
        "variant": variant, "status": "ok", "preset": args.preset, "params": nparams,
        "batch": batch, "seq": seq, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "loss": loss, "steps_s": steps, "step_s": step_s,
        "compute_s": compute_s, "busy": min(compute_s / step_s, 1.0),
        "tokens_per_s": batch * seq / step_s, "peak_device_bytes": peak_device,
        "peak_host_bytes": peak_host,
        "device_bytes_per_param": peak_device / nparams if cuda else None,
        "host_bytes_per_param": host_used / nparams, "nvme_bytes_per_param": nvme_per_param,
        "device_total_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
    }
    if offload is not None:
        result.update({k: params[k] for k in ("materialised_bytes_peak", "parameter_bytes",
                                              "persistent_bytes", "units")})
        result.update(per_step)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    if nvme is not None:
        shutil.rmtree(nvme, ignore_errors=True)


# ---- the driver --------------------------------------------------------------------------------

def machine(nvme_dir):
    """Host memory and free NVMe space (the GPU's memory comes with each worker's result: the
    driver does not import torch)."""
    total_host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    free_nvme = shutil.disk_usage(nvme_dir or tempfile.gettempdir()).free
    return total_host, free_nvme


def largest(result, total_host, free_nvme):
    """Parameters that fit: each tier's capacity over its measured bytes per parameter."""
    device = result.get("device_total_bytes")
    limits = []
    if device and result.get("device_bytes_per_param"):
        limits.append(0.95 * device / result["device_bytes_per_param"])
    if result["host_bytes_per_param"] > 0:
        limits.append(0.9 * total_host / result["host_bytes_per_param"])
    if result["nvme_bytes_per_param"] > 0:
        limits.append(0.9 * free_nvme / result["nvme_bytes_per_param"])
    return int(min(limits)) if limits else None


def run_variant(args, variant):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--preset", args.preset,
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    for flag, value in (("--batch", args.batch), ("--seq", args.seq),
                        ("--nvme-dir", args.nvme_dir), ("--offload-ratio", args.offload_ratio),
                        ("--persistence-threshold", args.persistence_threshold)):
        if value is not None:
            cmd += [flag, str(value)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
        if line.startswith(SKIP_PREFIX):
            return {"variant": variant, "status": "skipped", "reason": line[len(SKIP_PREFIX):]}
    text = (proc.stderr or proc.stdout).strip().splitlines()
    last = text[-1] if text else f"exit status {proc.returncode}"
    return {"variant": variant, "status": "failed", "reason": last[-400:]}


def main(argv):
    args = parse(argv)
    if args.worker:
        worker(args)
        return 0
    total_host, free_nvme = machine(args.nvme_dir)
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda v: run_variant(args, v), args.variants.split(",")))
    reference = next((r for r in results if r["variant"] == REFERENCE and r["status"] == "ok"),
                     None)
    for r in results:
        if r["status"] != "ok":
            continue
        r["ratio_vs_torch_fused"] = r["step_s"] / reference["step_s"] if reference else None
        r["largest_params"] = largest(r, total_host, free_nvme)
    for r in results:
        if args.json:
            print(json.dumps(r))
        elif r["status"] != "ok":
            print(f"{r['variant']:18s} {r['status']}: {r['reason']}")
        elif "materialised_bytes_peak" in r:
            print(f"{r['variant']:18s} step {r['step_s'] * 1e3:9.1f} ms  "
                  f"{r['tokens_per_s']:10.0f} tok/s  busy {r['busy']:.2f}  "
                  f"loss {r['loss']:.6f}  "
                  f"materialised peak {r['materialised_bytes_peak'] / 2**20:.2f} of "
                  f"{r['parameter_bytes'] / 2**20:.2f} MiB  "
                  f"nvme read {r['nvme_read_bytes_per_step'] / 2**20:.2f} "
                  f"write {r['nvme_write_bytes_per_step'] / 2**20:.2f} MiB/step  "
                  f"device {r['peak_device_bytes'] / 2**30:6.2f} GiB  "
                  f"host {r['peak_host_bytes'] / 2**30:6.2f} GiB  "
                  f"largest {r['largest_params'] / 1e9 if r['largest_params'] else 0:.3f}B")
        else:
            ratio = r["ratio_vs_torch_fused"]
            print(f"{r['variant']:18s} step {r['step_s'] * 1e3:9.1f} ms  "
                  f"{r['tokens_per_s']:10.0f} tok/s  busy {r['busy']:.2f}  "
                  f"x{'-' if ratio is None else f'{ratio:.3f}'} torch-fused  "
                  f"loss {r['loss']:.6f}  device {r['peak_device_bytes'] / 2**30:6.2f} GiB  "
                  f"host {r['peak_host_bytes'] / 2**30:6.2f} GiB  "
                  f"largest {r['largest_params'] / 1e9 if r['largest_params'] else 0:.3f}B")
    return 0 if all(r["status"] != "failed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

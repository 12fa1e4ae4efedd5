"""OffloadAdamW sharded across ranks (ZeRO stages 1-3, `process_group=`, python/strata/_shard.py):
the bytes each rank sends per step, measured by the optimizer (summary()["ranks"]), beside two
theories, and the step time. CPU ranks over gloo (torch.multiprocessing); one JSON line per rank
with --json.

  theory_strata: what this design sends — every unit's gradients that another rank owns, with one
      presence flag per parameter tensor (a gather to the owner, or with --gradient-sum backend a
      reduce, counted as a tree sends it), the per-parameter norm and presence vector once (an
      all-reduce of 2 fp32 per tensor, counted once), and the rank's own units' new parameters to
      N-1 ranks (a broadcast from the owner).
      At stage 3 (offload_parameters(process_group=...), python/strata/_param_ranks.py) the rank
      also broadcasts each unit it owns at its two fetches (forward and backward: the bench sets
      no reuse distance), its bytes plus a 16-byte tag to N-1 ranks, and the optimizer broadcasts
      only the units holding replicated (persistent) parameters.
  theory_ring: a plain ZeRO exchange with ring collectives: (N-1)/N of the gradient bytes
      (reduce-scatter) plus (N-1)/N of the parameter bytes (all-gather); at stage 3 the offloaded
      parameters' all-gather twice (forward and backward, DeepSpeed's ZeRO-3) and the persistent
      ones' once.

The gather-to-owner and broadcast-from-owner send the same bytes per rank on average as a ring
reduce-scatter and all-gather; what they add is the fixed summation order (the bits of one rank
accumulating N micro-batches), at the price of one message per unit instead of a pipelined ring.

At stage 2 the gradients leave during the backward (unit by unit, last first); at stage 1 at
step(). --gradient-sum backend (strata.gradient_sum) replaces the gather and ordered fold by the
backend's reduce: compare the step times of the two in one run of this script each.

Usage: bench_shard.py [--ranks N] [--stage 1|2|3] [--gradient-sum ordered|backend] [--hidden H]
                      [--layers L] [--steps S] [--warmup W] [--json]
"""
import argparse
import faulthandler
import gc
import json
import os
import statistics
import sys
import tempfile
import time


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--stage", type=int, default=2, choices=(1, 2, 3))
    ap.add_argument("--gradient-sum", default="ordered", choices=("ordered", "backend"))
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.ranks < 1 or args.hidden < 8 or args.layers < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--ranks, --layers, --steps: 1 or more; --hidden: 8 or more; --warmup: 0 or more")
    return args


def _worker(rank, args, init, out):
    # A rank that dies on a signal (an abort in native code) prints every thread's Python stack to
    # stderr first, which the caller shows: where it was is the first thing to know.
    faulthandler.enable(all_threads=True)
    import torch
    import torch.distributed as dist
    from strata.torch import OffloadAdamW, offload_parameters
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks)
    try:
        # Every object of the run is gone before the group is destroyed (a gloo group outliving
        # them, or left to the interpreter's exit, can abort the process): _run's locals go when it
        # returns, and the reference cycles among them (the optimizer and its shard, the parameters'
        # hooks) with the collection below. Left to the interpreter's exit, a cycle still holding
        # the group kept its worker threads running into finalization, where one releasing a
        # finished collective's tensors aborted the process ("terminate called without an active
        # exception", ProcessGroupGloo::runLoop taking the GIL).
        _run(rank, args, out, torch, dist, OffloadAdamW, offload_parameters)
    finally:
        gc.collect()
        dist.destroy_process_group()


def _run(rank, args, out, torch, dist, OffloadAdamW, offload_parameters):
    torch.manual_seed(0)
    h = args.hidden
    layers = [torch.nn.Embedding(256, h)]
    for _ in range(args.layers):  # (a block: one unit of the parameter offload at stage 3)
        layers.append(torch.nn.Sequential(torch.nn.Linear(h, 4 * h), torch.nn.GELU(),
                                          torch.nn.Linear(4 * h, h)))
    model = torch.nn.Sequential(*layers, torch.nn.Linear(h, 256)).to(torch.bfloat16)
    config = {"zero_optimization": {"stage": args.stage,
                                    "offload_optimizer": {"device": "cpu"}},
              "strata": {"gradient_sum": args.gradient_sum}}
    if args.stage == 3:
        # Every unit fetched once for its forward and once for its backward (no reuse
        # distance), the biases kept on every rank (under the persistence threshold).
        config["zero_optimization"].update(
            offload_param={"device": "cpu"}, stage3_max_reuse_distance=0,
            stage3_param_persistence_threshold=4 * h + 1)
        offload_parameters(model, config, device="cpu", unit_modules=[torch.nn.Sequential],
                           process_group=dist.group.WORLD)
    off = getattr(model, "strata_offload", None)
    opt = OffloadAdamW(model.parameters(), lr=1e-3, config=config,
                       unit_elements=max(2048, 4 * h * h), process_group=dist.group.WORLD)
    gen = torch.Generator().manual_seed(rank)
    times, sent = [], []
    for i in range(args.warmup + args.steps):
        x = torch.randint(0, 256, (4, 32), generator=gen)
        begin = time.perf_counter()
        gathered = off.ranks.bytes_sent if off is not None else 0
        logits = model(x).float()
        torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
        if i >= args.warmup:
            times.append(time.perf_counter() - begin)
            sent.append(opt.summary()["ranks"]["last_step_bytes_sent"] +
                        (off.ranks.bytes_sent - gathered if off is not None else 0))
    shard = opt._shard
    n = args.ranks
    tensors = sum(len(su.slots) for su in shard.units)
    esize = torch.finfo(torch.bfloat16).bits // 8
    own = sum(su.numel * esize for su in shard.units if su.owner == rank)
    other = sum(su.numel * esize for su in shard.units if su.owner != rank)
    flags = sum(len(su.slots) * esize for su in shard.units if su.owner != rank)
    if off is not None:
        # stage 3: the optimizer broadcasts only units with replicated (persistent)
        # parameters; each owned model unit is broadcast at its two fetches
        broadcast = sum(su.numel * esize for su in shard.units
                        if su.owner == rank and su.replicated)
        gathers = 2 * sum(u.nbytes + 16 for u in off.units if off.ranks.owns(u))
        offloaded = sum(u.nbytes for u in off.units)
    else:
        gathers, broadcast = 0, own
    total = own + other
    result = {
        "rank": rank, "ranks": n, "stage": args.stage, "gradient_sum": args.gradient_sum,
        "units": len(shard.units),
        "units_owned": sum(1 for su in shard.units if su.owner == rank),
        "state_bytes": opt.summary()["bytes"]["host"],
        "step_s": statistics.median(times),
        "bytes_sent_per_step": sent,
        "theory_strata": (other + flags if n > 1 else 0) + 2 * tensors * 4 +
        (broadcast + gathers) * (n - 1),
        "theory_ring": (n - 1) * (total + (total + offloaded if off is not None else total))
        // n if n > 1 else 0,
    }
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    opt.close()


def main(argv):
    args = parse(argv)
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        mp.spawn(_worker, args=(args, f"file://{tmp}/rendezvous", out), nprocs=args.ranks)
        results = []
        for r in range(args.ranks):
            with open(f"{out}.{r}") as f:
                results.append(json.load(f))
    for r in results:
        if args.json:
            print(json.dumps(r))
        else:
            print(f"rank {r['rank']}/{r['ranks']} stage {r['stage']} {r['gradient_sum']}: "
                  f"units {r['units_owned']}/"
                  f"{r['units']}, state {r['state_bytes']} B, step {r['step_s'] * 1e3:.1f} ms, "
                  f"sent {r['bytes_sent_per_step'][-1]} B/step (theory: this design "
                  f"{r['theory_strata']}, ring reduce-scatter + all-gather {r['theory_ring']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

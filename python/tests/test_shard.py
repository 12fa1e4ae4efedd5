"""OffloadAdamW across ranks (ZeRO stages 1-3 over torch.distributed, gloo, CPU processes):
N ranks with one micro-batch each give, bit for bit, the parameters and optimizer state of one
rank accumulating the N micro-batches (2 and 3 ranks, stages 1, 2 and 3, host and NVMe state,
fp32 and bf16 parameters, 8-bit moments, with clipping); each rank holds about 1/N of the state
(and at stage 3 of the parameters) and, at stages 2-3, no .grad at step(); no_sync() accumulation
at stage 2 gives stage 1's bits; a consolidated state dict taken at 2 ranks continues at 3 ranks
and at 1 rank with the bits of an uninterrupted run; ranks whose parameters differ, or whose
stage-3 fetches depart from each other, fail naming the first difference.

Skipped, with the reason, when `strata` cannot be imported; STRATA_REQUIRE_PYTHON=1 makes that a
failure."""
import gc
import json
import os

import pytest

from conftest import require

torch = require("torch")
dist = require("torch.distributed")
mp = require("torch.multiprocessing")
nn = torch.nn
F = torch.nn.functional

VOCAB, WIDTH = 64, 32
STEPS = 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 64),
                                                  nn.GELU(), nn.Linear(64, WIDTH))
                                    for _ in range(3))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


def make(dtype):
    torch.manual_seed(0)
    return Net().to(dtype)


def micro_batches(step, n):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randint(0, VOCAB, (2, 8), generator=gen) for _ in range(n)]


def loss_of(model, x):
    return F.cross_entropy(model(x).float().reshape(-1, VOCAB), x.roll(-1, 1).reshape(-1))


def config(stage, kind, path, moments="fp32", fp16=False):
    offload = {"device": kind}
    if kind == "nvme":
        offload["nvme_path"] = str(path)
    c = {"zero_optimization": {"stage": stage, "offload_optimizer": offload},
         "gradient_clipping": 0.5, "strata": {"optimizer_state": {"moments": moments}}}
    if fp16:
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    if stage == 3:
        # the blocks' and the embedding's and head's matrices offloaded (the norms, biases stay)
        z = c["zero_optimization"]
        z["offload_param"] = dict(offload, nvme_path=os.path.join(str(path), "param")) \
            if kind == "nvme" else {"device": kind}
        z["stage3_param_persistence_threshold"] = 100
    return c


def offload(st, model, cfg, group=None):
    """Stage 3: the model's parameters into the tiers, one unit per block (and the root)."""
    return st.offload_parameters(model, cfg, device="cpu", unit_modules=[nn.Sequential],
                                 process_group=group)


def run_steps(opt, model, steps, n_micro, rank=None, overflow=None, accum=1, record=None,
              no_sync=True):
    """Each step: micro-batches of that step (all of them on one rank; on N, rank r's are
    r*accum .. r*accum+accum-1, all but the last under no_sync()). With fp16 the loss goes
    through scale_loss(); overflow=(step, micro-batch) makes that one inf. record: a list that
    gets, per step, how many parameters still had a .grad after the last backward."""
    import contextlib
    for step in steps:
        mbs = micro_batches(step, n_micro)
        mine = [i for i in range(len(mbs)) if rank is None or i // accum == rank]
        for i in mine:
            x = mbs[i]
            quiet = opt.no_sync() if no_sync and rank is not None and i != mine[-1] else \
                contextlib.nullcontext()
            with quiet:
                loss = loss_of(model, x)
                if overflow == (step, i):
                    loss = loss * float("inf")
                if opt.loss_scale != 1.0:
                    loss = opt.scale_loss(loss)
                loss.backward()
        if record is not None:
            record.append(sum(p.grad is not None for p in model.parameters()))
        opt.step()
        opt.zero_grad()


def _worker(rank, world, init, args, out):
    backend = args.get("backend", "gloo")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        # Every object of the run is gone when _rank_run returns, before the group is destroyed (a
        # gloo group outliving them, or left to the interpreter's exit, can abort the process).
        _rank_run(rank, world, args, out)
    except Exception as ex:  # reported to the test through a file
        with open(f"{out}.error{rank}", "w") as f:
            f.write(repr(ex))
        raise
    finally:
        gc.collect()  # the run's reference cycles, and the group they hold (bench_shard.py)
        dist.destroy_process_group()


def _rank_run(rank, world, args, out):
    st = require("strata.torch")
    dtype = getattr(torch, args["dtype"])
    model = make(dtype)
    # Stage 3 runs give every rank the same nvme_path, as DeepSpeed configs do (each rank's
    # run folder under it is its own); the others one folder per rank.
    path = args["path"] if args["stage"] == 3 else os.path.join(args["path"], f"r{rank}")
    cfg = config(args["stage"], args["kind"], path, args["moments"], args.get("fp16", False))
    if args.get("diverge") and rank == 1:
        args["diverge_model"] = True
    if args.get("timeout"):
        cfg["strata"]["comm_timeout_s"] = args["timeout"]
    if args.get("gradient_sum"):
        cfg["strata"]["gradient_sum"] = args["gradient_sum"]
    if args.get("mismatch") and rank == 1:
        model.head = nn.Linear(WIDTH, VOCAB + 1, bias=False).to(dtype)
    if args["stage"] == 3:
        offload(st, model, cfg, dist.group.WORLD)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, config=cfg, unit_elements=2048,
                          process_group=dist.group.WORLD)
    first, last = args["steps"]
    if args.get("load"):
        saved = torch.load(args["load"], weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
    if args.get("diverge_model"):
        with torch.no_grad():  # rank 1 alone runs a block: its fetches depart from rank 0's
            model.blocks[1](torch.zeros(1, WIDTH, dtype=dtype))
    if args.get("die"):
        run_steps(opt, model, range(0, 1), world, rank)
        if rank == 1:
            os._exit(3)  # a rank that stops mid-run, without a word
    accum, left = args.get("accum", 1), []
    run_steps(opt, model, range(first, last), world * accum, rank, args.get("overflow"),
              accum, left, args.get("no_sync", True))
    full = opt.consolidated_state_dict(dst=0)
    summary = opt.summary()
    weights = model.state_dict()  # (collective at stage 3: every rank gathers)
    if rank == 0:
        torch.save({"model": weights, "optimizer": full}, out)
    params = getattr(model, "strata_offload", None)
    torch.save({"bytes": summary["bytes"], "ranks": summary["ranks"], "grads_left": left,
                "params": params.summary() if params is not None else None},
               f"{out}.rank{rank}")
    opt.close()


def spawn(tmp_path, world, name, **args):
    out = str(tmp_path / name)
    init = f"file://{tmp_path}/{name}.rendezvous"
    args.setdefault("path", str(tmp_path / f"{name}-nvme"))
    try:
        mp.spawn(_worker, args=(world, init, args, out), nprocs=world, join=True)
    except Exception as ex:
        errors = [open(f"{out}.error{r}").read() for r in range(world)
                  if os.path.exists(f"{out}.error{r}")]
        raise AssertionError(f"ranks failed: {errors or ex}") from ex
    ranks = [torch.load(f"{out}.rank{r}", weights_only=False) for r in range(world)]
    return torch.load(out, weights_only=True), ranks


def reference(tmp_path, phases, dtype, stage, kind, moments, start=None, fp16=False,
              overflow=None):
    """One rank, uninterrupted: phases [((first step, end), micro-batches per step)]."""
    st = require("strata.torch")
    model = make(dtype)
    cfg = config(stage, kind, tmp_path / "ref-nvme", moments, fp16)
    if stage == 3:
        offload(st, model, cfg)  # the same units, in one process
    else:
        cfg["zero_optimization"]["stage"] = 2  # one process: nothing to shard
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, config=cfg, unit_elements=2048)
    if start is not None:
        model.load_state_dict(start["model"])
        opt.load_state_dict(start["optimizer"])
    for steps, n_micro in phases:
        run_steps(opt, model, range(*steps), n_micro, overflow=overflow)
    params = getattr(model, "strata_offload", None)
    result = {"model": model.state_dict(), "optimizer": opt.state_dict(),
              "bytes": opt.summary()["bytes"],
              "params": params.summary() if params is not None else None}
    opt.close()
    return result


def same(a, b):
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sorted(sa) == sorted(sb)
    for i in sa:
        for k in sa[i]:
            assert torch.equal(sa[i][k], sb[i][k]), (i, k)
    assert a["optimizer"]["strata"] == b["optimizer"]["strata"]


@pytest.mark.parametrize("world,stage,kind,dtype,moments", [
    (2, 1, "cpu", "float32", "fp32"),
    (2, 2, "nvme", "bfloat16", "fp32"),
    (3, 2, "cpu", "bfloat16", "8bit"),
    (3, 1, "nvme", "float32", "8bit"),
    (2, 3, "cpu", "bfloat16", "fp32"),
    (3, 3, "nvme", "bfloat16", "8bit"),
])
def test_ranks_give_the_bits_of_one_rank_accumulating(strata, tmp_path, world, stage, kind,
                                                      dtype, moments):
    got, ranks = spawn(tmp_path, world, "run", stage=stage, kind=kind, dtype=dtype,
                       moments=moments, steps=(0, STEPS))
    ref = reference(tmp_path, [((0, STEPS), world)], getattr(torch, dtype), stage, kind, moments)
    same(got, ref)
    # each rank holds its share of the state: about 1/N of the one-rank figure
    tier = "nvme" if kind == "nvme" else "host"
    whole = ref["bytes"][tier]
    shares = [r["bytes"][tier] for r in ranks]
    assert all(r["ranks"]["units_owned"] > 0 for r in ranks)
    # the shares add up to the one-rank figure (exactly, for fp32 state; 8-bit state has a small
    # fixed part per rank's groups, under a unit's bytes), each within a unit or two of 1/N of it
    # (units are whole: the split rounds to them; a unit holds about whole/units bytes)
    units = ranks[0]["ranks"]["units"]
    if moments == "fp32":
        assert sum(shares) == whole, (shares, whole)
    assert whole <= sum(shares) <= whole + (world - 1) * whole / units, (shares, whole, units)
    assert all(abs(s - whole / world) <= 2 * whole / units for s in shares), (shares, whole, units)
    assert all(r["ranks"]["last_step_bytes_sent"] > 0 for r in ranks)
    # stage 2 sends each unit to its owner during the backward and drops it: no rank holds a
    # .grad at step(); stage 1 keeps them until then
    if stage == 3:
        # each rank keeps its units' 16-bit parameters only, and gathers the others at each use
        whole = ref["params"]["parameter_bytes"] - ref["params"]["persistent_bytes"]
        owned = [r["params"]["ranks"]["owned_bytes"] for r in ranks]
        assert sum(owned) == whole and max(owned) < whole, (owned, whole)
        assert all(r["params"]["ranks"]["gather_bytes_received"] > 0 for r in ranks)
    if stage >= 2:
        assert all(r["grads_left"] == [0] * STEPS for r in ranks), [r["grads_left"] for r in ranks]
        assert all(r["ranks"]["reduce"] == "during the backward" for r in ranks)
    else:
        assert all(min(r["grads_left"]) > 0 for r in ranks)


def test_stage_3_ranks_that_run_different_forwards_fail_clearly(strata, tmp_path):
    """Stage 3 pairs each rank's fetch of a unit with its owner's broadcast: a rank that runs a
    block the others do not fails with an error (the units named, or within
    strata.comm_timeout_s), never computing with another unit's bytes or hanging."""
    with pytest.raises(AssertionError, match=r"ran different forwards or backwards|another rank "
                                             r"stopped or is stuck"):
        spawn(tmp_path, 2, "diverge", stage=3, kind="cpu", dtype="float32", moments="fp32",
              steps=(0, 1), diverge=True, timeout=10)


def test_stage_2_accumulation_under_no_sync_equals_stage_1(strata, tmp_path):
    """Two micro-batches per rank, the first under no_sync(): stage 2 sends the units during the
    second backward only, and gives the bits of stage 1 (which sums the accumulated .grad at
    step()), with no .grad left at step()."""
    args = dict(kind="cpu", dtype="float32", moments="fp32", steps=(0, STEPS), accum=2)
    two, ranks = spawn(tmp_path, 2, "stage2", stage=2, **args)
    one, _ = spawn(tmp_path, 2, "stage1", stage=1, **args)
    same(two, one)
    assert all(r["grads_left"] == [0] * STEPS for r in ranks)


def test_a_second_backward_without_no_sync_is_refused(strata, tmp_path):
    """Stage 2: a second backward after the units went to their owners (no no_sync(), no
    accumulation_steps) is an error naming the parameter and what is valid."""
    with pytest.raises(AssertionError, match=r"got a second gradient after its unit went to its "
                                             r"owner.*opt.no_sync\(\)"):
        spawn(tmp_path, 2, "twice", stage=2, kind="cpu", dtype="float32", moments="fp32",
              steps=(0, 1), accum=2, no_sync=False)


@pytest.mark.parametrize("world", [2, 3])
def test_gradient_sum_backend(strata, tmp_path, world):
    """strata.gradient_sum "backend": the backend's reduce instead of the ordered fold. With two
    ranks a + b is b + a, so the bits are one rank's; with three the order is gloo's: close."""
    got, ranks = spawn(tmp_path, world, "backend", stage=2, kind="cpu", dtype="float32",
                       moments="fp32", steps=(0, STEPS), gradient_sum="backend")
    ref = reference(tmp_path, [((0, STEPS), world)], torch.float32, 2, "cpu", "fp32")
    assert all(r["ranks"]["gradient_sum"] == "backend" for r in ranks)
    if world == 2:
        same(got, ref)
    for k, v in ref["model"].items():
        torch.testing.assert_close(got["model"][k], v, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_checkpoint_at_two_ranks_continues_at_three_and_at_one(strata, tmp_path, stage):
    args = dict(stage=stage, kind="cpu", dtype="bfloat16", moments="fp32")
    first, _ = spawn(tmp_path, 2, "first", steps=(0, 2), **args)
    path = str(tmp_path / "ckpt.pt")
    torch.save(first, path)
    # at 3 ranks: steps 2..4 with 3 micro-batches each, against one rank that ran steps 0..2 with
    # 2 micro-batches and then 2..4 with 3 (the same run, uninterrupted)
    at3, _ = spawn(tmp_path, 3, "at3", steps=(2, 4), load=path, **args)
    same(at3, reference(tmp_path, [((0, 2), 2), ((2, 4), 3)], torch.bfloat16, stage, "cpu",
                        "fp32"))
    # at 1 rank (no process group): the consolidated checkpoint loads as a one-process one
    at1 = reference(tmp_path, [((2, 4), 1)], torch.bfloat16, stage, "cpu", "fp32",
                    start=torch.load(path, weights_only=True))
    same(at1, reference(tmp_path, [((0, 2), 2), ((2, 4), 1)], torch.bfloat16, stage, "cpu",
                        "fp32"))


def test_ranks_with_different_parameters_are_refused(strata, tmp_path):
    expected = r"parameter 19 is shape \(65, 32\) float32 on rank 1 and shape \(64, 32\)"
    with pytest.raises(AssertionError, match=expected):
        spawn(tmp_path, 2, "mismatch", stage=1, kind="cpu", dtype="float32", moments="fp32",
              steps=(0, 1), mismatch=True)


def test_hf_trainer_under_torchrun_equals_one_rank_accumulating(strata, tmp_path):
    """torchrun --nproc_per_node 2, the HF Trainer (its DDP wrapper averages the gradients), a
    tiny Llama, optimizer state on NVMe sharded over the ranks: the logged losses and final
    weights equal one process's with gradient_accumulation_steps 2, bit for bit (a sum of two is
    order-free and DDP's halving exact)."""
    require("transformers")
    require("accelerate")
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shard_trainer_run.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(strata.__file__)), os.environ.get("PYTHONPATH", "")]))
    runs = {}
    for name, launcher, accumulation in (
            ("two", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc_per_node", "2"], 1),
            ("one", [sys.executable], 2)):
        out = str(tmp_path / name)
        proc = subprocess.run(launcher + [script, out, str(tmp_path / f"{name}-nvme"),
                                          str(accumulation)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(out + ".json") as f:
            runs[name] = json.load(f)
        runs[name]["model"] = torch.load(out + ".pt", weights_only=True)
    two, one = runs["two"], runs["one"]
    assert len(one["losses"]) == 4 and two["losses"] == one["losses"]
    for k, v in one["model"].items():
        assert torch.equal(two["model"][k], v), k
    assert two["ranks"]["world"] == 2 and 0 < two["nvme_bytes"] < one["nvme_bytes"]


def test_a_rank_that_stops_makes_the_others_fail_clearly(strata, tmp_path):
    """Rank 1 exits after the first step; rank 0's next step fails within strata.comm_timeout_s
    with an error that says a rank stopped — it never hangs."""
    import time
    out = str(tmp_path / "dies")
    args = dict(stage=1, kind="cpu", dtype="float32", moments="fp32", steps=(1, 3), die=True,
                timeout=10, path=str(tmp_path / "dies-nvme"))
    begin = time.monotonic()
    ctx = mp.start_processes(_worker, args=(2, f"file://{tmp_path}/dies.rendezvous", args, out),
                             nprocs=2, join=False, start_method="spawn")
    for p in ctx.processes:
        p.join(timeout=120)
    elapsed = time.monotonic() - begin
    assert all(not p.is_alive() for p in ctx.processes), "a rank hangs"
    assert ctx.processes[1].exitcode == 3
    assert ctx.processes[0].exitcode != 0
    message = open(f"{out}.error0").read()
    assert "rank 0 of 2" in message and "another rank stopped or is stuck" in message, message
    assert elapsed < 100


@pytest.mark.parametrize("stage", [2, 3])
def test_nccl_one_rank_per_gpu_gives_the_bits_of_one_process(strata, tmp_path, stage):
    """The NCCL path (tensors moved to the GPU for the collectives, the stage-3 gathers made on
    it): one rank per GPU, with the CPU parameters of the other tests; tools/gpu_checks.sh runs
    it where there is a GPU."""
    if not torch.cuda.is_available():
        pytest.skip("NCCL needs a GPU (none here): tools/gpu_checks.sh --only torch runs it")
    world = torch.cuda.device_count()
    got, _ = spawn(tmp_path, world, "nccl", stage=stage, kind="cpu", dtype="bfloat16",
                   moments="fp32", steps=(0, STEPS), backend="nccl")
    same(got, reference(tmp_path, [((0, STEPS), world)], torch.bfloat16, stage, "cpu", "fp32"))


def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(strata, tmp_path):
    """fp16 loss scaling: rank 1's micro-batch of step 1 overflows; every rank skips that step and
    moves its loss scaler, as one rank accumulating both micro-batches does (state, skipped steps
    and the loss scaler equal)."""
    got, _ = spawn(tmp_path, 2, "fp16", stage=2, kind="cpu", dtype="float16", moments="fp32",
                   steps=(0, STEPS), fp16=True, overflow=(1, 1))
    ref = reference(tmp_path, [((0, STEPS), 2)], torch.float16, 2, "cpu", "fp32", fp16=True,
                    overflow=(1, 1))
    same(got, ref)
    assert got["optimizer"]["strata"]["skipped_steps"] == 1
    # [scale, iteration, last overflow iteration, hysteresis]: the overflow was seen (DeepSpeed's
    # hysteresis of 2 spends one before the scale drops)
    assert got["optimizer"]["strata"]["loss_scaler"][2] >= 0


def test_a_bad_gradient_sum_is_refused_naming_the_key(strata):
    st = require("strata.torch")
    cfg = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
           "strata": {"gradient_sum": "fast"}}
    with pytest.raises(strata.StrataError, match=r"strata.gradient_sum: 'fast' is not valid; "
                                                 r"valid values: ordered, backend"):
        st.OffloadAdamW(nn.Linear(4, 4).parameters(), config=cfg)


def test_stage_3_needs_the_offload_over_the_same_group(strata, tmp_path):
    """Stage 3 across ranks without offload_parameters(process_group=), an offloaded model given
    without a group, an offloaded model at stage 2, a sharded model given to OffloadAdamW without
    a group, DDP-averaged gradients at stage 3, gradients= without a group or unknown, overlap
    with a group: each refused naming what is valid (one rank)."""
    st = require("strata.torch")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/one.rendezvous", rank=0,
                            world_size=1)
    try:
        group = dist.group.WORLD
        cfg3 = config(3, "cpu", tmp_path)
        with pytest.raises(strata.StrataError, match=r"stage 3 across ranks shards the 16-bit "
                                                     r"parameters through offload_parameters"):
            st.OffloadAdamW(make(torch.float32).parameters(), config=cfg3, process_group=group)
        alone = offload(st, make(torch.float32), cfg3)
        with pytest.raises(strata.StrataError, match=r"given to offload_parameters\(\) without a "
                                                     r"process group"):
            st.OffloadAdamW(alone.parameters(), config=cfg3, process_group=group)
        sharded = offload(st, make(torch.float32), cfg3, group)
        with pytest.raises(strata.StrataError, match=r"stage is 2 but the model's parameters "
                                                     r"are offloaded"):
            st.OffloadAdamW(sharded.parameters(), config=config(2, "cpu", tmp_path),
                            process_group=group)
        with pytest.raises(strata.StrataError, match=r"sharded over ranks .*valid: "
                                                     r"OffloadAdamW\(\.\.\., process_group="):
            st.OffloadAdamW(sharded.parameters(), config=cfg3)
        with pytest.raises(strata.StrataError, match=r"stage 3 shards the parameters, which DDP "
                                                     r"cannot wrap"):
            st.OffloadAdamW(sharded.parameters(), config=cfg3, process_group=group,
                            gradients="averaged")
        plain, cfg2 = make(torch.float32), config(2, "cpu", tmp_path)
        with pytest.raises(strata.StrataError, match=r"gradients='averaged' is for "
                                                     r"process_group=; valid: 'local'"):
            st.OffloadAdamW(plain.parameters(), config=cfg2, gradients="averaged")
        with pytest.raises(strata.StrataError, match=r"gradients='mean'; valid: 'local' or "
                                                     r"'averaged'"):
            st.OffloadAdamW(plain.parameters(), config=cfg2, process_group=group,
                            gradients="mean")
        with pytest.raises(strata.StrataError, match=r"overlap=True \(Adam during the backward\)"
                                                     r" across ranks is not built yet"):
            st.OffloadAdamW(plain.parameters(), config=cfg2, process_group=group, overlap=True)
    finally:
        gc.collect()  # the run's reference cycles, and the group they hold (bench_shard.py)
        dist.destroy_process_group()

"""strata.torch.offload_parameters (ZeRO-3 offload_param) on the CPU as the compute device: a model
whose parameters live in host memory or on NVMe and are materialised unit by unit trains to the
bits of the same model kept whole in memory (fp32 and bf16, with and without gradient
checkpointing, overlap on and off, compressed optimizer state), within a window of materialised
bytes, with the NVMe traffic of two reads and one write-back per step; frozen parameters stream
without optimizer state; state_dict / load_state_dict go through the tiers; and the misuses are
refused with the parameter or key named.

Skipped, with the reason, when `strata` cannot be imported; STRATA_REQUIRE_PYTHON=1 makes that a
failure."""
import contextlib
import copy

import pytest

from conftest import require

torch = require("torch")
nn = torch.nn
F = torch.nn.functional
checkpoint = require("torch.utils.checkpoint")

VOCAB, WIDTH, HIDDEN = 96, 32, 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH, bias=False)

    def forward(self, h):
        return h + self.down(F.gelu(self.up(self.norm(h))))


class Net(nn.Module):
    """Embedding, blocks, final norm and a head tied to the embedding."""

    _no_split_modules = ["Block"]  # the units, as Hugging Face models declare theirs

    def __init__(self, blocks=3, ckpt=None):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight
        self.ckpt = ckpt  # None, "reentrant" or "non-reentrant"

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            if self.ckpt is not None and torch.is_grad_enabled():
                h = checkpoint.checkpoint(b, h, use_reentrant=self.ckpt == "reentrant")
            else:
                h = b(h)
        return self.head(self.norm(h))


def make(dtype=torch.float32, blocks=3, ckpt=None):
    torch.manual_seed(0)
    return Net(blocks, ckpt).to(dtype)


def batches(n, device="cpu"):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (4, 16), generator=gen).to(device) for _ in range(n)]


def need(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("the CUDA compute device needs a GPU (none here): tools/gpu_checks.sh runs it")
    return device


def loss_of(model, x):
    logits = model(x)
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), x.roll(-1, 1).reshape(-1))


def config(kind=None, nvme=None, strata_section=None, **zero):
    z = {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    if kind is not None:
        z["offload_param"] = {"device": kind}
        if nvme is not None:
            z["offload_param"]["nvme_path"] = str(nvme)
    z.update(zero)
    c = {"zero_optimization": z}
    if strata_section:
        c["strata"] = strata_section
    return c


def train(model, cfg, steps=3, overlap=False, lrs=(1e-2, 5e-3, 2e-3), device="cpu"):
    st = require("strata.torch")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = st.OffloadAdamW(params, lr=lrs[0], config=cfg, overlap=overlap,
                          module=model if overlap else None)
    losses = []
    for i, x in enumerate(batches(steps, device)):
        for g in opt.param_groups:
            g["lr"] = lrs[i % len(lrs)]
        loss = loss_of(model, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    opt.synchronize()
    return losses, opt


def same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].cpu(), b[k].cpu()), k


def same_opt_state(a, b):
    for i, entry in a["state"].items():
        for k, v in entry.items():
            assert torch.equal(v.cpu(), b["state"][i][k].cpu()), (i, k)
    assert a["strata"] == b["strata"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("kind", ["cpu", "nvme"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ckpt", [None, "reentrant", "non-reentrant"])
@pytest.mark.parametrize("overlap", [False, True])
def test_offloaded_model_trains_to_the_in_memory_bits(strata, tmp_path, kind, dtype, ckpt,
                                                      overlap, device):
    st = require("strata.torch")
    need(device)
    ref = make(dtype, ckpt=ckpt).to(device)
    ref_losses, ref_opt = train(ref, config(), overlap=overlap, device=device)
    model = make(dtype, ckpt=ckpt)  # built on the CPU: offload_parameters moves it
    cfg = config(kind, tmp_path, stage3_param_persistence_threshold=0)
    if kind == "nvme":
        cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    st.offload_parameters(model, cfg, device=device, unit_modules=[Block])
    losses, opt = train(model, cfg, overlap=overlap, device=device)
    assert losses == ref_losses
    same_state(model.state_dict(), ref.state_dict())
    same_opt_state(opt.state_dict(), ref_opt.state_dict())
    s = model.strata_offload.summary()
    assert s["units"] == 4 and s["fetches"] > 0
    if kind == "nvme":
        assert s["nvme_read_bytes"] > 0 and s["nvme_write_bytes"] > 0
    opt.close()
    model.strata_offload.close()


def test_compressed_state_and_nvme_optimizer_match_in_memory(strata, tmp_path):
    st = require("strata.torch")
    section = {"optimizer_state": {"moments": "8bit", "gradients": "bf16"}}
    ref = make(torch.bfloat16)
    ref_cfg = config(strata_section=section)
    ref_losses, ref_opt = train(ref, ref_cfg, overlap=True)
    model = make(torch.bfloat16)
    cfg = config("nvme", tmp_path / "p", strata_section=section,
                 stage3_param_persistence_threshold=0)
    cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "nvme",
                                                     "nvme_path": str(tmp_path / "o")}
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    losses, opt = train(model, cfg, overlap=True)
    assert losses == ref_losses
    same_state(model.state_dict(), ref.state_dict())
    same_opt_state(opt.state_dict(), ref_opt.state_dict())


def test_window_bounds_materialised_bytes_and_nvme_traffic_is_two_reads_and_a_write(
        strata, tmp_path):
    st = require("strata.torch")
    model = make(torch.bfloat16, blocks=12)
    block = sum(p.numel() for p in model.blocks[0].parameters() if p.numel() >= 64)
    root = VOCAB * WIDTH  # the tied embedding/head; the norms stay (persistence threshold)
    cfg = config("nvme", tmp_path, stage3_param_persistence_threshold=64,
                 stage3_max_live_parameters=root + 2 * block, stage3_max_reuse_distance=0)
    cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    off = model.strata_offload
    s0 = off.summary()
    offloaded = s0["parameter_bytes"] - s0["persistent_bytes"]
    trainable = offloaded  # every offloaded parameter is trained here
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, config=cfg)
    reads, writes = [], []
    for x in batches(3):
        before = off.summary()
        loss_of(model, x).backward()
        opt.step()
        opt.zero_grad()
        after = off.summary()
        reads.append(after["nvme_read_bytes"] - before["nvme_read_bytes"])
        writes.append(after["nvme_write_bytes"] - before["nvme_write_bytes"])
    s = off.summary()
    window = (root + 2 * block) * 2 + s["persistent_bytes"]
    print(f"model {s['parameter_bytes']} B, persistent {s['persistent_bytes']} B, window "
          f"{window} B, peak materialised {s['materialised_bytes_peak']} B; per step NVMe "
          f"reads {reads} (2 x {_store_bytes(off)}: the {offloaded} offloaded bytes, each unit "
          f"part padded to 256), writes {writes} (the {trainable} trainable ones, padded)")
    assert s["materialised_bytes_peak"] <= window
    assert s["materialised_bytes_peak"] < s["parameter_bytes"] / 3
    # Two reads of every offloaded byte (forward, backward) and one write-back per step (the
    # units' parts are padded to 256 bytes: the counters count what moved).
    padded = sum(s["unit_bytes"])
    assert reads == [2 * _store_bytes(off)] * 3
    assert writes == [_store_bytes(off)] * 3
    assert padded == offloaded
    assert s["order_departures"] == 0 and s["recorded_order"]


def _store_bytes(off):
    return sum(n for u in off.units for n in u.part_bytes)


def test_frozen_base_streams_without_optimizer_state(strata, tmp_path):
    """A LoRA-style fine-tune: the base is frozen and offloaded, small adapters train."""
    st = require("strata.torch")

    def lora(model):
        for p in model.parameters():
            p.requires_grad_(False)
        for b in model.blocks:
            b.adapter = nn.Linear(WIDTH, 4, bias=False)
            b.adapter_out = nn.Linear(4, WIDTH, bias=False)
            nn.init.zeros_(b.adapter_out.weight)
            inner = b.forward

            def forward(h, b=b, inner=inner):
                return inner(h) + b.adapter_out(b.adapter(h))
            b.forward = forward
        return model

    torch.manual_seed(0)
    ref = lora(make())
    torch.manual_seed(0)
    model = lora(make())
    model.load_state_dict(ref.state_dict())
    ref_losses, _ = train(ref, config(), overlap=False)
    # offload, with adapters
    cfg = config("nvme", tmp_path, stage3_param_persistence_threshold=0)
    cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    trainable = [p for p in model.parameters() if p.requires_grad]
    losses, opt = train(model, cfg)
    assert losses == ref_losses
    same_state(model.state_dict(), ref.state_dict())
    s = opt.summary()
    assert sum(e["parameters"] for e in s["engines"]) == len(trainable)


def test_state_dict_round_trip_and_resume_is_exact(strata, tmp_path):
    st = require("strata.torch")
    cfg = config("cpu", stage3_param_persistence_threshold=0)
    ref = make(torch.bfloat16)
    st.offload_parameters(ref, copy.deepcopy(cfg), device="cpu", unit_modules=[Block])
    opt = st.OffloadAdamW(ref.parameters(), lr=1e-2, config=cfg)
    xs = batches(4)
    for x in xs:
        loss_of(ref, x).backward()
        opt.step()
        opt.zero_grad()
    # a run interrupted after 2 steps, saved and restored into a new model and optimizer
    a = make(torch.bfloat16)
    st.offload_parameters(a, copy.deepcopy(cfg), device="cpu", unit_modules=[Block])
    opt_a = st.OffloadAdamW(a.parameters(), lr=1e-2, config=cfg)
    for x in xs[:2]:
        loss_of(a, x).backward()
        opt_a.step()
        opt_a.zero_grad()
    saved_model = a.state_dict()
    saved_opt = opt_a.state_dict()
    assert all(v.numel() > 0 for v in saved_model.values())
    b = Net(3).to(torch.bfloat16)
    st.offload_parameters(b, copy.deepcopy(cfg), device="cpu", unit_modules=[Block])
    b.load_state_dict(saved_model)
    opt_b = st.OffloadAdamW(b.parameters(), lr=1e-2, config=cfg)
    opt_b.load_state_dict(saved_opt)
    for x in xs[2:]:
        loss_of(b, x).backward()
        opt_b.step()
        opt_b.zero_grad()
    same_state(b.state_dict(), ref.state_dict())
    same_opt_state(opt_b.state_dict(), opt.state_dict())
    with torch.no_grad():
        assert torch.equal(b(xs[0]), ref(xs[0]))


def test_misuses_are_refused_with_the_name(strata, tmp_path):
    st = require("strata.torch")
    with pytest.raises(strata.StrataError, match="offload_param.device"):
        st.offload_parameters(make(), config())
    bad = config("cpu")
    bad["zero_optimization"]["stage"] = 2
    with pytest.raises(strata.StrataError, match="stage"):
        st.offload_parameters(make(), bad)
    with pytest.raises(strata.StrataError, match="nvme_path"):
        st.offload_parameters(make(), _nvme_without_path_config(), device="cpu",
                              unit_modules=[Block])
    model = make()
    cfg = config("cpu", stage3_param_persistence_threshold=0)
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    with pytest.raises(strata.StrataError, match="already"):
        st.offload_parameters(model, cfg)
    with pytest.raises(strata.StrataError, match="blocks.0.up.weight"):
        st.OffloadAdamW([p for n, p in model.named_parameters() if n != "blocks.0.up.weight"],
                        config=cfg)
    model.blocks[1].up.weight.requires_grad_(False)
    with pytest.raises(strata.StrataError, match="requires_grad changed"):
        loss_of(model, batches(1)[0])
    small = config("cpu", stage3_param_persistence_threshold=0, stage3_max_live_parameters=100)
    with pytest.raises(strata.StrataError, match="stage3_max_live_parameters"):
        st.offload_parameters(make(), small, device="cpu", unit_modules=[Block])


def _nvme_without_path_config():
    cfg = config("nvme", stage3_param_persistence_threshold=0)
    cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    return cfg


def test_eval_and_generation_under_no_grad_release_every_unit(strata):
    st = require("strata.torch")
    ref = make()
    model = make()
    cfg = config("cpu", stage3_param_persistence_threshold=0)
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    model.eval()
    ref.eval()
    x = batches(1)[0]
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
    s = model.strata_offload.summary()
    assert s["materialised_bytes"] == s["persistent_bytes"]


def test_a_non_finite_gradient_never_reaches_the_parameters(strata, tmp_path):
    st = require("strata.torch")
    model = make()
    cfg = config("nvme", tmp_path, stage3_param_persistence_threshold=0)
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, config=cfg)
    loss = loss_of(model, batches(1)[0])
    loss.backward()
    model.blocks[1].up.weight.grad[0, 0] = float("nan")
    with pytest.warns(RuntimeWarning, match="skipped"):
        opt.step()
    assert opt.summary()["skipped_steps"] == 1
    same_state(model.state_dict(), before)
    # with overlap and no clipping, the step is refused naming the parameter
    model2 = make()
    st.offload_parameters(model2, config("cpu", stage3_param_persistence_threshold=0),
                          device="cpu", unit_modules=[Block])
    opt2 = st.OffloadAdamW(model2.parameters(), lr=1e-2, config=cfg, overlap=True,
                           module=model2)
    model2.blocks[0].up.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    loss_of(model2, batches(1)[0]).backward()
    with pytest.raises(strata.StrataError, match="parameter 3 has a non-finite gradient"):
        opt2.step()  # with module=, the error may come at the next wait for the worker
        opt2.synchronize()


def test_a_parameter_used_outside_its_unit_is_named(strata):
    st = require("strata.torch")

    class Borrower(Block):
        def forward(self, h):
            return super().forward(h) + h @ self.lender.up.weight[:, :WIDTH].t()

    model = make(blocks=2)
    model.blocks[1] = Borrower()
    object.__setattr__(model.blocks[1], "lender", model.blocks[0])  # not a submodule
    st.offload_parameters(model, config("cpu", stage3_param_persistence_threshold=0),
                          device="cpu", unit_modules=[Block])
    with pytest.raises(strata.StrataError, match="outside its unit.*blocks.0.up.weight"):
        loss_of(model, batches(1)[0])


def test_trace_and_read_ahead_on_nvme(strata, tmp_path):
    st = require("strata.torch")
    model = make(torch.bfloat16, blocks=6)
    cfg = config("nvme", tmp_path, stage3_param_persistence_threshold=0,
                 stage3_max_reuse_distance=0)
    cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block], trace=True)
    losses, _ = train(model, cfg, steps=3, overlap=True)
    s = model.strata_offload.summary()
    events = model.strata_offload.trace()
    lanes = {lane for lane, *_ in events}
    assert {"fetch", "nvme", "release"} <= lanes
    # after the first iteration recorded the order, the reads go ahead of the fetches
    assert s["prefetches"] > 0 and s["order_departures"] == 0
    assert len(s["recorded_order"]) == 2 * 7  # forward and backward of 6 blocks and the root


def test_close_gives_the_parameters_back(strata, tmp_path):
    st = require("strata.torch")
    ref = make()
    model = make()
    cfg = config("nvme", tmp_path, stage3_param_persistence_threshold=0)
    cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    dirs = model.strata_offload.summary()["store"]["dirs"]
    model.strata_offload.close()
    assert model.strata_offload is None or model.strata_offload.closed
    import os
    assert not any(os.path.exists(d) for d in dirs)
    same_state(model.state_dict(), ref.state_dict())
    x = batches(1)[0]
    assert torch.equal(loss_of(model, x), loss_of(ref, x))  # plain parameters again, no hooks


def test_a_model_dropped_without_close_frees_its_offload(strata, tmp_path):
    """Nothing the library keeps holds an offloaded model: the registry of offloaded parameters
    holds them and their offload weakly, and the parameters' gradient hooks (which Python's
    collector cannot see through) reach the offload weakly. So a trained model dropped without
    close() frees its offload, its store and its swap files, and the registry forgets its entries;
    another model's parameters are still found."""
    import gc
    import os
    import weakref
    st = require("strata.torch")
    from strata import _param_units
    cfg = config("nvme", tmp_path, stage3_param_persistence_threshold=0)
    cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    model = make()
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    train(model, cfg, steps=1)
    kept = make()
    st.offload_parameters(kept, config("cpu", stage3_param_persistence_threshold=0),
                          device="cpu", unit_modules=[Block])
    offload = weakref.ref(model.strata_offload)
    dirs = model.strata_offload.summary()["store"]["dirs"]
    ids = [id(p) for p in model.parameters()]
    assert all(i in _param_units._REGISTRY for i in ids)
    del model
    gc.collect()
    assert offload() is None, "the offload outlived its model"
    assert not any(i in _param_units._REGISTRY for i in ids)
    assert not any(os.path.exists(d) for d in dirs), "its swap files outlived it"
    assert all(_param_units.lookup(p) is not None for p in kept.parameters())
    kept.strata_offload.close()


def test_the_window_evicts_units_kept_for_reuse(strata, tmp_path):
    """stage3_max_reuse_distance keeps units for their backward; the window still holds: the unit
    used farthest ahead is evicted, and the run keeps the in-memory bits."""
    st = require("strata.torch")
    ref = make(torch.bfloat16, blocks=6)
    ref_losses, _ = train(ref, config())
    model = make(torch.bfloat16, blocks=6)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    root = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks."))
    cfg = config("cpu", stage3_param_persistence_threshold=0,
                 stage3_max_live_parameters=root + 2 * block)
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    losses, _ = train(model, cfg)
    s = model.strata_offload.summary()
    assert losses == ref_losses
    assert s["evictions"] > 0
    assert s["materialised_bytes_peak"] <= (root + 2 * block) * 2


@pytest.mark.parametrize("how", ["no_sync", "accumulation_steps"])
def test_gradient_accumulation_with_overlap_matches_in_memory(strata, tmp_path, how):
    """Two micro-batches per step, the first only accumulating (opt.no_sync(), or
    accumulation_steps=2): the offloaded model keeps the in-memory bits."""
    st = require("strata.torch")

    def run(model, cfg):
        opt = st.OffloadAdamW(model.parameters(), lr=1e-2, config=cfg, overlap=True,
                              module=model, max_grad_norm=1.0,
                              accumulation_steps=2 if how == "accumulation_steps" else 1)
        losses = []
        xs = batches(6)
        for step in range(3):
            for i in range(2):
                ctx = opt.no_sync() if how == "no_sync" and i == 0 else contextlib.nullcontext()
                with ctx:
                    loss = loss_of(model, xs[2 * step + i])
                    loss.backward()
                losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        opt.synchronize()
        return losses, opt

    ref = make(torch.bfloat16)
    ref_losses, ref_opt = run(ref, config())
    model = make(torch.bfloat16)
    cfg = config("nvme", tmp_path, stage3_param_persistence_threshold=0)
    cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    losses, opt = run(model, cfg)
    assert losses == ref_losses
    same_state(model.state_dict(), ref.state_dict())
    same_opt_state(opt.state_dict(), ref_opt.state_dict())


@pytest.mark.parametrize("kind", ["cpu", "nvme"])
def test_copies_ahead_of_use_keep_the_bits_and_the_window(strata, tmp_path, kind):
    """The device copies made ahead along the recorded order (a side stream with CUDA; forced
    here on the CPU, where they are made earlier): same bits, within the window, and never
    before a unit's update has landed (overlap with module=)."""
    st = require("strata.torch")
    ref = make(torch.bfloat16, blocks=6)
    ref_losses, ref_opt = train(ref, config(), steps=4, overlap=True)
    model = make(torch.bfloat16, blocks=6)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    root = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks."))
    cfg = config(kind, tmp_path, stage3_param_persistence_threshold=0,
                 stage3_max_live_parameters=root + 3 * block, stage3_max_reuse_distance=0)
    if kind == "nvme":
        cfg["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    st.offload_parameters(model, cfg, device="cpu", unit_modules=[Block])
    model.strata_offload.device_ahead = True
    losses, opt = train(model, cfg, steps=4, overlap=True)
    s = model.strata_offload.summary()
    assert losses == ref_losses
    same_state(model.state_dict(), ref.state_dict())
    same_opt_state(opt.state_dict(), ref_opt.state_dict())
    assert s["device_prefetches"] > 0 and s["hits"] > 0
    assert s["materialised_bytes_peak"] <= (root + 3 * block) * 2

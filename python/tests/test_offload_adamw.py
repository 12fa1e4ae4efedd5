"""strata.torch.OffloadAdamW against torch.optim.AdamW on a small model (CPU): the same
parameters on every offload tier, parameter groups, bf16 parameters with fp32 masters, state_dict
round trips, budgets that are too small, gradient-norm clipping, closures, zero_grad, and the
plain-training-loop example (python/examples/train_loop.py).

Skipped, with the reason, when `strata` cannot be imported; STRATA_REQUIRE_PYTHON=1 makes that a
failure."""
import copy
import importlib.util
import json
import os

import pytest

from conftest import REPO_ROOT, offload_config, require

torch = require("torch")
nn = torch.nn

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
# fp32: Strata's CPU Adam and torch's AdamW evaluate the same formula in fp32 with a different
# order of operations (and possibly fused multiply-adds), so each element of an update may differ
# in its last bits; over 5 steps the parameters of every tensor must agree to 1e-6 of the tensor's
# norm: ||strata - torch|| <= 1e-6 * ||torch||. (A wrong element, a skipped tail or a missed bias
# correction moves a tensor by ~1e-3 relative, far outside.)
REL_TOL = 1e-6
STEPS = 5


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
    return model.to(dtype)


def make_batches(n, dtype=torch.float32, scales=None):
    gen = torch.Generator().manual_seed(1)
    batches = []
    for i in range(n):
        x = torch.randn(4, 16, generator=gen)
        y = torch.randn(4, 8, generator=gen)
        if scales:
            x = x * scales[i % len(scales)]
        batches.append((x.to(dtype), y.to(dtype)))
    return batches


def loss_of(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x).float(), y.float())


def train(model, opt, batches, clip=None):
    """One optimizer step per batch: zero_grad, forward, backward, (clip), step."""
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, batch)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def torch_adamw(params, **kw):
    args = dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, foreach=False)
    args.update(kw)
    return torch.optim.AdamW(params, **args)


class MasterAdamW:
    """torch AdamW over fp32 masters of bf16 parameters (what a mixed-precision loop does): the
    bf16 gradients are widened into the masters' gradients, the masters step, and the bf16
    parameters receive the masters rounded to bf16."""

    def __init__(self, params, **kw):
        self.params = list(params)
        self.masters = [p.detach().float().requires_grad_(True) for p in self.params]
        self.opt = torch_adamw(self.masters, **kw)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.masters):
            m.grad = p.grad.float()
        self.opt.step()
        for p, m in zip(self.params, self.masters):
            p.copy_(m)


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm()).item()


def assert_close_to(model, reference, tol=REL_TOL):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        err = rel_err(p, q)
        assert err <= tol, f"{name}: relative difference {err:.3g} > {tol:g}"


def assert_equal_params(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), f"{name} differs"


def nvme(tmp_path, name):
    path = tmp_path / name
    path.mkdir()
    return path


# --- (a) fp32 against torch, and the same bits on every tier -----------------------------------

def test_is_a_torch_optimizer(OffloadAdamW, strata, tmp_path):
    assert issubclass(strata.StrataError, RuntimeError)
    model = make_model()
    opt = OffloadAdamW(model.parameters(), config=offload_config("cpu"))
    try:
        assert isinstance(opt, torch.optim.Optimizer)
        group = opt.param_groups[0]
        assert group["lr"] == LR and tuple(group["betas"]) == BETAS
        assert group["eps"] == EPS and group["weight_decay"] == WEIGHT_DECAY
        assert isinstance(opt.summary(), dict) and opt.summary()
    finally:
        opt.close()


@pytest.mark.parametrize("config_form", ["dict", "path"])
def test_matches_torch_adamw_fp32(OffloadAdamW, tmp_path, config_form):
    batches = make_batches(STEPS)
    config = offload_config("cpu")
    if config_form == "path":
        path = tmp_path / "ds_config.json"
        path.write_text(json.dumps(config))
        config = str(path)
    model, reference = make_model(), make_model()
    opt = OffloadAdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                       weight_decay=WEIGHT_DECAY, config=config)
    try:
        losses = train(model, opt, batches)
    finally:
        opt.close()
    ref_losses = train(reference, torch_adamw(reference.parameters()), batches)
    assert_close_to(model, reference)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    # The parameters did move (the comparison is not between two idle optimizers).
    assert rel_err(next(model.parameters()), next(make_model().parameters())) > 1e-3


def test_every_tier_gives_the_same_bits(OffloadAdamW, tmp_path):
    batches = make_batches(STEPS)
    configs = {"default": None, "none": offload_config("none"), "cpu": offload_config("cpu"),
               "nvme": offload_config("nvme", nvme(tmp_path, "swap"))}
    models = {}
    for name, config in configs.items():
        model = make_model()
        opt = OffloadAdamW(model.parameters(), config=config)
        try:
            train(model, opt, batches)
        finally:
            opt.close()
        models[name] = model
    reference = make_model()
    train(reference, torch_adamw(reference.parameters()), batches)
    assert_close_to(models["cpu"], reference)
    for name, model in models.items():
        for (pname, p), q in zip(model.named_parameters(), models["cpu"].parameters()):
            assert torch.equal(p, q), f"{pname} differs between tiers {name} and cpu"


# --- (b) parameter groups ------------------------------------------------------------------------

def groups_of(model):
    return [
        {"params": model[0].parameters(), "lr": 1e-2, "weight_decay": 0.0},
        {"params": model[2].parameters()},  # the defaults below
    ]


def test_param_groups_match_torch(OffloadAdamW, tmp_path):
    batches = make_batches(STEPS)
    model, reference = make_model(), make_model()
    opt = OffloadAdamW(groups_of(model), lr=3e-3, weight_decay=0.1,
                       config=offload_config("nvme", nvme(tmp_path, "swap")))
    try:
        assert [g["lr"] for g in opt.param_groups] == [1e-2, 3e-3]
        assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 0.1]
        train(model, opt, batches)
    finally:
        opt.close()
    train(reference, torch_adamw(groups_of(reference), lr=3e-3, weight_decay=0.1), batches)
    assert_close_to(model, reference)
    # The groups' settings matter here: one optimizer over both layers with the defaults differs.
    uniform = make_model()
    train(uniform, torch_adamw(uniform.parameters(), lr=3e-3, weight_decay=0.1), batches)
    assert rel_err(next(uniform.parameters()), next(reference.parameters())) > 100 * REL_TOL


def test_lr_changed_between_steps_is_used(OffloadAdamW):
    """A scheduler (as the Hugging Face Trainer's) writes param_groups[i]["lr"] before each step."""
    batches = make_batches(STEPS)
    model, reference = make_model(), make_model()
    opt = OffloadAdamW(model.parameters(), config=offload_config("cpu"))
    ref_opt = torch_adamw(reference.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda step: 1.0 / (1 + step))
    try:
        for batch in batches:
            for o, m in ((opt, model), (ref_opt, reference)):
                o.zero_grad()
                loss_of(m, batch).backward()
                o.step()
            sched.step()
            ref_sched.step()
    finally:
        opt.close()
    assert_close_to(model, reference)


# --- (c) bf16 parameters -------------------------------------------------------------------------

def test_bf16_params_match_torch_with_fp32_master(OffloadAdamW, tmp_path):
    batches = make_batches(STEPS, dtype=torch.bfloat16)
    model = make_model(dtype=torch.bfloat16)
    reference = make_model(dtype=torch.bfloat16)
    opt = OffloadAdamW(model.parameters(), config=offload_config("nvme", nvme(tmp_path, "swap")))
    try:
        train(model, opt, batches)
    finally:
        opt.close()
    train(reference, MasterAdamW(reference.parameters()), batches)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.dtype == torch.bfloat16
        # Both keep fp32 masters that agree to ~1e-7; the bf16 parameters are those masters
        # rounded to 8 significant bits. Where a master lies next to a rounding boundary the two
        # may round to neighbouring bf16 values (one ulp = 2^-7 relative at most), and the next
        # gradients then differ a little. Tolerance: two bf16 ulps relative (2^-6), plus 1e-5
        # absolute for values near zero (where an ulp is tiny); one step moves a parameter by up
        # to lr = 1e-3, so a missed or wrong update still fails.
        torch.testing.assert_close(p.float(), q.float(), rtol=2**-6, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")
    # Rounding the same masters gives the same bf16 values except next to a rounding boundary
    # (masters agreeing to ~1e-7 relative straddle one with a chance of ~1e-7 / 2^-8 per element
    # and step, and then the next gradients differ a little): require 95 % of the elements to be
    # bit-identical. Stepping the bf16 values without fp32 masters loses every sub-ulp part of
    # the updates and leaves ~60 % identical here; narrowing by truncation leaves ~55 %.
    equal = sum(int((p == q).sum()) for p, q in zip(model.parameters(), reference.parameters()))
    total = sum(p.numel() for p in model.parameters())
    assert equal >= 0.95 * total, f"only {equal} of {total} bf16 values equal torch's"
    # The bf16 parameters did move.
    moved = sum(int((p != q).sum()) for p, q in zip(model.parameters(),
                                                    make_model(dtype=torch.bfloat16).parameters()))
    assert moved > 0


# --- (d) state_dict round trips ------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "nvme"])
@pytest.mark.parametrize("through_file", [False, True])
def test_state_dict_resume_is_bit_identical(OffloadAdamW, tmp_path, device, through_file):
    batches = make_batches(STEPS + 3)

    def config(name):
        return offload_config(device, nvme(tmp_path, name) if device == "nvme" else None)

    uninterrupted = make_model()
    opt = OffloadAdamW(uninterrupted.parameters(), config=config("a"))
    try:
        train(uninterrupted, opt, batches)
    finally:
        opt.close()

    first = make_model()
    opt = OffloadAdamW(first.parameters(), config=config("b"))
    try:
        train(first, opt, batches[:STEPS])
        state = opt.state_dict()
        # The torch.optim.Optimizer layout, which torch, accelerate and the Trainer rely on.
        assert {"state", "param_groups"} <= set(state)
        model_state = copy.deepcopy(first.state_dict())
    finally:
        opt.close()
    if through_file:
        path = tmp_path / "checkpoint.pt"
        torch.save({"optimizer": state, "model": model_state}, path)
        del state, model_state
        loaded = torch.load(path, weights_only=True)
        state, model_state = loaded["optimizer"], loaded["model"]

    resumed = make_model(seed=7)  # other weights, replaced by the checkpoint's
    resumed.load_state_dict(model_state)
    opt = OffloadAdamW(resumed.parameters(), config=config("c"))
    try:
        opt.load_state_dict(state)
        train(resumed, opt, batches[STEPS:])
    finally:
        opt.close()
    assert_equal_params(resumed, uninterrupted)


# --- (e) budgets ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device,key", [("nvme", "nvme_bytes_max"), ("cpu", "host_bytes_max")])
def test_too_small_budget_names_the_key(OffloadAdamW, strata, tmp_path, device, key):
    model = make_model()
    config = offload_config(device, nvme(tmp_path, "swap") if device == "nvme" else None,
                            {key: 4096})
    opt = None
    with pytest.raises(strata.StrataError) as info:
        # Refused when the optimizer is built or, at the latest, at its first step.
        opt = OffloadAdamW(model.parameters(), config=config)
        loss_of(model, make_batches(1)[0]).backward()
        opt.step()
    if opt is not None:
        opt.close()
    assert isinstance(info.value, RuntimeError)
    assert key in str(info.value), str(info.value)


# --- (f) gradient-norm clipping ------------------------------------------------------------------

def test_max_grad_norm_matches_clip_grad_norm(OffloadAdamW, tmp_path):
    # Inputs of very different scales, so that the clipping coefficient changes from step to step
    # (Adam is blind to a constant gradient scale, not to a varying one).
    batches = make_batches(STEPS, scales=[1.0, 30.0, 0.1, 10.0, 0.3])
    max_norm = 0.05
    model, reference, unclipped = make_model(), make_model(), make_model()
    opt = OffloadAdamW(model.parameters(), config=offload_config("cpu"), max_grad_norm=max_norm)
    try:
        train(model, opt, batches)
    finally:
        opt.close()
    train(reference, torch_adamw(reference.parameters()), batches, clip=max_norm)
    train(unclipped, torch_adamw(unclipped.parameters()), batches)
    assert_close_to(model, reference)
    # Clipping changes the result by far more than the tolerance, so it is being tested.
    assert max(rel_err(p, q) for p, q in zip(unclipped.parameters(), reference.parameters())) \
        > 100 * REL_TOL


# --- step(closure), zero_grad --------------------------------------------------------------------

def test_step_with_closure_and_zero_grad(OffloadAdamW):
    batches = make_batches(2)
    model, reference = make_model(), make_model()
    opt = OffloadAdamW(model.parameters(), config=offload_config("cpu"))
    ref_opt = torch_adamw(reference.parameters())
    try:
        for batch in batches:
            def closure():
                opt.zero_grad()
                loss = loss_of(model, batch)
                loss.backward()
                return loss

            loss = opt.step(closure)
            ref_opt.zero_grad()
            ref_loss = loss_of(reference, batch)
            ref_loss.backward()
            ref_opt.step()
            assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
        assert_close_to(model, reference)
        opt.zero_grad(set_to_none=False)
        assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
        opt.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in model.parameters())
    finally:
        opt.close()


# --- (h) the plain training loop example ---------------------------------------------------------

def test_plain_training_loop_example(OffloadAdamW, tmp_path):
    path = os.path.join(REPO_ROOT, "python", "examples", "train_loop.py")
    spec = importlib.util.spec_from_file_location("train_loop", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--steps", "40", "--nvme-dir", str(tmp_path / "swap"),
                           "--checkpoint", str(tmp_path / "ckpt.pt")])
    losses = result["losses"]
    assert len(losses) == 40
    assert losses[-1] < 0.5 * losses[0], losses
    assert isinstance(result["summary"], dict)
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert {"model", "optimizer", "step"} <= set(saved) and saved["step"] == 40


# --- (h) compressed optimizer state (strata.optimizer_state) -------------------------------------

COMPRESSED = {
    "moments_8bit": {"moments": "8bit", "block_size": 64},
    "all_compressed": {"moments": "8bit", "block_size": 64, "master": "bf16",
                       "gradients": "bf16"},
}


@pytest.mark.parametrize("name", sorted(COMPRESSED))
def test_compressed_state_trains_like_torch_on_every_tier(OffloadAdamW, tmp_path, name):
    """The config's strata.optimizer_state reaches the Python optimizer: the state is stored
    compressed (so the parameters are not fp32 AdamW's bits), the training follows torch's AdamW
    closely, and host memory and NVMe give the same bits."""
    batches = make_batches(40)
    state = {"optimizer_state": COMPRESSED[name]}
    runs = {}
    for device in ("cpu", "nvme"):
        model = make_model()
        config = offload_config(device, nvme(tmp_path, device) if device == "nvme" else None,
                                state)
        opt = OffloadAdamW(model.parameters(), config=config)
        try:
            runs[device] = (model, train(model, opt, batches))
            summary = opt.summary()
        finally:
            opt.close()
    reference = make_model()
    ref_losses = train(reference, torch_adamw(reference.parameters()), batches)
    model, losses = runs["cpu"]
    assert_equal_params(runs["nvme"][0], model)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters()))
    assert abs(losses[-1] - ref_losses[-1]) <= 0.02 * ref_losses[-1], (losses[-1], ref_losses[-1])
    assert "8bit" in json.dumps(summary)


def test_compressed_state_dict_resumes_bit_identically(OffloadAdamW, tmp_path):
    """state_dict() holds torch's fp32 layout (decoded); loading it re-encodes the same bytes."""
    batches = make_batches(STEPS + 3)
    state = {"optimizer_state": COMPRESSED["all_compressed"]}
    uninterrupted = make_model()
    opt = OffloadAdamW(uninterrupted.parameters(), config=offload_config("cpu", None, state))
    try:
        train(uninterrupted, opt, batches)
    finally:
        opt.close()
    first = make_model()
    opt = OffloadAdamW(first.parameters(), config=offload_config("cpu", None, state))
    try:
        train(first, opt, batches[:STEPS])
        saved = opt.state_dict()
        model_state = copy.deepcopy(first.state_dict())
    finally:
        opt.close()
    assert saved["state"][0]["exp_avg"].dtype == torch.float32
    resumed = make_model(seed=7)
    resumed.load_state_dict(model_state)
    opt = OffloadAdamW(resumed.parameters(), config=offload_config("cpu", None, state))
    try:
        opt.load_state_dict(saved)
        train(resumed, opt, batches[STEPS:])
    finally:
        opt.close()
    assert_equal_params(resumed, uninterrupted)

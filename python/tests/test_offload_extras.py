"""OffloadAdamW beyond the plain step: fp16 loss scaling with DeepSpeed's dynamic scaler, the
zero-copy parameter home, close(), and errors that name what is at fault."""
import os

import pytest

if os.environ.get("STRATA_REQUIRE_PYTHON"):
    import strata  # noqa: F401  (must import: the suite requires the package)
    import torch
else:
    strata = pytest.importorskip("strata")
    torch = pytest.importorskip("torch")
from strata.torch import OffloadAdamW  # noqa: E402


def fp16_config(power=4, hysteresis=1):
    return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": power,
                     "hysteresis": hysteresis, "loss_scale_window": 2},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def test_scaled_losses_give_the_unscaled_update_and_overflows_skip_and_halve():
    torch.manual_seed(0)
    w = torch.randn(3000)
    x = torch.randn(3000)
    p_ref = torch.nn.Parameter(w.clone())
    p = torch.nn.Parameter(w.clone())
    ref = torch.optim.AdamW([p_ref], lr=1e-2)
    opt = OffloadAdamW([p], lr=1e-2, config=fp16_config())
    assert opt.loss_scale == 16.0
    for _ in range(3):
        ref.zero_grad()
        (p_ref * x).square().sum().backward()
        ref.step()
        opt.zero_grad()
        opt.scale_loss((p * x).square().sum()).backward()
        opt.step()
    torch.testing.assert_close(p.detach(), p_ref.detach(), rtol=0, atol=2e-6)
    # Two clean steps in a window of 2 double the scale, as DeepSpeed's scaler does.
    assert opt.loss_scale == 32.0
    before = p.detach().clone()
    opt.zero_grad()
    opt.scale_loss((p * x).square().sum()).backward()
    p.grad[7] = float("inf")
    opt.step()
    assert torch.equal(p.detach(), before), "an overflow must skip the step"
    assert opt.loss_scale == 16.0
    s = opt.summary()
    assert s["skipped_steps"] == 1 and s["steps"] == 3
    # The scaler's state travels with the checkpoint.
    sd = opt.state_dict()
    p2 = torch.nn.Parameter(before.clone())
    opt2 = OffloadAdamW([p2], lr=1e-2, config=fp16_config())
    opt2.load_state_dict(sd)
    assert opt2.loss_scale == 16.0 and opt2.summary()["skipped_steps"] == 1


def test_gradients_not_scaled_through_the_optimizer_are_not_unscaled():
    # A GradScaler (the HF Trainer's fp16) unscales itself; the optimizer must not divide again.
    w = torch.linspace(-1, 1, 4096)
    p_ref, p = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    ref = torch.optim.AdamW([p_ref], lr=1e-3, weight_decay=0.0)
    opt = OffloadAdamW([p], lr=1e-3, weight_decay=0.0, config=fp16_config(power=10))
    g = torch.linspace(1e-3, 2e-3, 4096)
    p_ref.grad = g.clone()
    p.grad = g.clone()
    ref.step()
    opt.step()
    torch.testing.assert_close(p.detach(), p_ref.detach(), rtol=0, atol=1e-7)


def test_cpu_parameters_live_in_the_optimizer_and_get_their_memory_back_on_close():
    lin = torch.nn.Linear(100, 50)
    opt = OffloadAdamW(lin.parameters(), lr=1e-2)
    ptr = lin.weight.data_ptr()
    lin(torch.randn(4, 100)).sum().backward()
    opt.step()
    assert lin.weight.data_ptr() == ptr, "updated in place, in the optimizer's parameter home"
    values = lin.weight.detach().clone()
    opt.zero_grad(set_to_none=False)
    lin(torch.randn(4, 100)).sum().backward()
    opt.step()
    after = lin.weight.detach().clone()
    assert not torch.equal(after, values)
    opt.close()
    assert lin.weight.data_ptr() != ptr and torch.equal(lin.weight.detach(), after)
    with pytest.raises(strata.StrataError, match="closed"):
        opt.step()
    lin.weight.sum().backward()  # the model stays usable


def test_a_model_that_changed_its_tensors_still_gets_the_update():
    p = torch.nn.Parameter(torch.ones(5000))
    opt = OffloadAdamW([p], lr=0.1, weight_decay=0.0)
    p.data = p.data.clone()  # e.g. model.to(...) moved it
    p.grad = torch.ones(5000)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((5000,), 0.9))


def test_bad_inputs_are_named():
    p = torch.nn.Parameter(torch.zeros(10))
    with pytest.raises(strata.StrataError, match="offload_optimizer.device"):
        OffloadAdamW([p], config={"zero_optimization": {"stage": 2,
                                                        "offload_optimizer": {"device": "gpu"}}})
    with pytest.raises(strata.StrataError, match="cannot read the config"):
        OffloadAdamW([p], config="/nonexistent/ds_config.json")
    with pytest.raises(strata.StrataError, match="int64"):
        OffloadAdamW([torch.zeros(3, dtype=torch.int64)])
    opt = OffloadAdamW([p])
    with pytest.raises(strata.StrataError, match="add_param_group"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    with pytest.raises(strata.StrataError, match="param groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    sd = opt.state_dict()
    sd["state"][0]["exp_avg"] = torch.full((10,), float("nan"))
    with pytest.raises(strata.StrataError, match="non-finite"):
        opt.load_state_dict(sd)


def test_zero_grad_without_none_lets_backward_accumulate_in_the_gradient_home():
    torch.manual_seed(1)
    w = torch.randn(64, 32)
    a, b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    opt_a = OffloadAdamW([a], lr=1e-2, config={"zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}})
    opt_b = OffloadAdamW([b], lr=1e-2, bind_params=False)
    xs = [torch.randn(8, 32) for _ in range(3)]
    for x in xs:
        opt_a.zero_grad(set_to_none=False)
        opt_b.zero_grad()
        (x @ a.t()).square().sum().backward()
        (x @ b.t()).square().sum().backward()
        opt_a.step()
        opt_b.step()
    home = a.grad.data_ptr()
    opt_a.zero_grad(set_to_none=False)
    assert a.grad.data_ptr() == home and not a.grad.any()
    assert torch.equal(a.detach(), b.detach()), "zero-copy and copied gradients: the same update"
    opt_a.zero_grad()
    assert a.grad is None


@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), ("cpu", torch.bfloat16),
                                          ("nvme", torch.float32), ("nvme", torch.float16)])
def test_the_plan_is_exactly_what_the_tier_manager_allocates(device, dtype, tmp_path):
    # The engine is built by offload::Engine::create in its optimizer-only kind: the plan lists
    # the homes, the pipeline's stages and the unit scratch, and nothing for a model runner, so
    # every tier's planned bytes are the bytes in use, and the device holds nothing.
    params = [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in (5000, 70000, 3)]
    offload = {"device": device}
    if device == "nvme":
        offload["nvme_path"] = str(tmp_path)
    opt = OffloadAdamW(params, lr=1e-3, config={
        "zero_optimization": {"stage": 2, "offload_optimizer": offload}})
    for engine in opt.summary()["engines"]:
        for tier in ("device", "host", "nvme"):
            assert engine[tier]["bytes"] == engine[tier]["bytes_in_use"], (tier, engine["items"])
        assert engine["device"]["bytes"] == 0
        assert (engine["nvme"]["bytes"] > 0) == (device == "nvme")
        assert not any("staging" in what or "frame" in what for _, what, _ in engine["items"])
    opt.close()


def test_nvme_paths_pass_the_checks_strata_train_makes(tmp_path):
    # The swap files must not sit where another user could replace them: a folder every user may
    # write to without the sticky bit is refused, naming the folder and the key, as `strata train`
    # refuses it; a missing folder is created for this user alone (0700).
    def nvme_config(path):
        return {"zero_optimization": {"stage": 2, "offload_optimizer": {
            "device": "nvme", "nvme_path": str(path)}}}

    p = torch.nn.Parameter(torch.zeros(100))
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    with pytest.raises(strata.StrataError) as refused:
        OffloadAdamW([p], config=nvme_config(open_to_all))
    assert str(open_to_all) in str(refused.value)
    assert "zero_optimization.offload_optimizer.nvme_path" in str(refused.value)
    assert "sticky bit" in str(refused.value)
    assert not list(open_to_all.iterdir()), "no swap file may be made before the refusal"

    fresh = tmp_path / "fresh" / "swap"
    opt = OffloadAdamW([p], config=nvme_config(fresh))
    assert fresh.is_dir()
    assert fresh.stat().st_mode & 0o777 == 0o700
    assert (fresh.parent.stat().st_mode & 0o777) == 0o700
    opt.close()

"""OffloadAdamW(overlap=True) on the CPU: the hand-off during the backward gives the parameters of
the non-overlapped step() bit for bit (several steps, gradient accumulation by no_sync() and by
accumulation_steps, clipping, fp16 loss scaling with a skipped step, bf16 parameters, NVMe and
compressed state, a changing lr); a tied weight is handed over once, after its last use; Adam runs
in landing order without clipping and in forward order with it; and the misuses that would
silently train on other values are refused with a message naming the parameter: a parameter that
changes device or dtype, a gradient edited after its hand-off, a second backward before step(),
zero_grad() between a backward and its step(), a parameter listed twice.

Skipped, with the reason, when `strata` cannot be imported; STRATA_REQUIRE_PYTHON=1 makes that a
failure."""
import contextlib

import pytest

from conftest import offload_config, require

torch = require("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB, WIDTH = 64, 32


class TiedNet(nn.Module):
    """An embedding whose weight is also the output projection (tied, as LM heads often are),
    an MLP with a residual and a LayerNorm: parameters of several sizes, one used twice."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.up = nn.Linear(WIDTH, 48)
        self.down = nn.Linear(48, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x):
        h = self.emb(x)
        h = self.norm(self.down(torch.relu(self.up(h))) + h)
        return h @ self.emb.weight.t()


def make(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    return TiedNet().to(dtype).to(device)


def batches(n, device="cpu"):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (4, 8), generator=gen).to(device) for _ in range(n)]


def need(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA parameters need a GPU (none here): tools/gpu_checks.sh runs these")
    return device


def loss_of(model, x, scale=1.0):
    return F.cross_entropy(model(x).float().reshape(-1, VOCAB), x.reshape(-1)) * scale


def bits(t):
    t = t.detach()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def train(OffloadAdamW, overlap, *, steps=3, accum=2, dtype=torch.float32, clip=0.0,
          config=None, by_count=False, module=True, fp16_scale=None, device="cpu", **kw):
    """`steps` steps of `accum` micro-batches; the lr changes every step (a scheduler)."""
    model = make(dtype, device)
    extra = {}
    if overlap:
        extra = dict(overlap=True, module=model if module else None,
                     accumulation_steps=accum if by_count else 1)
    opt = OffloadAdamW(model.parameters(), lr=1e-2, max_grad_norm=clip, config=config,
                       unit_elements=2048, **extra, **kw)
    data = batches(steps * accum, device)
    for step in range(steps):
        opt.param_groups[0]["lr"] = 1e-2 / (step + 1)
        for mb in range(accum):
            quiet = overlap and not by_count and mb < accum - 1
            with opt.no_sync() if quiet else contextlib.nullcontext():
                loss = loss_of(model, data[step * accum + mb],
                               fp16_scale[step] if fp16_scale else 1.0)
                if fp16_scale:
                    loss = opt.scale_loss(loss)
                loss.backward()
        opt.step()
        opt.zero_grad()
    state = opt.state_dict()
    result = [bits(p).cpu() for p in model.parameters()], opt._steps, opt._skipped, \
        opt.loss_scale, state
    opt.close()
    return result


def assert_same(a, b):
    pa, sa, ka, la, da = a
    pb, sb, kb, lb, db = b
    for i, (x, y) in enumerate(zip(pa, pb)):
        assert torch.equal(x, y), f"parameter {i} differs"
    assert (sa, ka, la) == (sb, kb, lb)
    for index, entry in da["state"].items():
        for kind, t in entry.items():
            assert torch.equal(bits(t), bits(db["state"][index][kind])), f"{index} {kind}"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("clip", [0.0, 0.05], ids=["no-clip", "clip"])
def test_overlap_gives_the_steps_bits(OffloadAdamW, dtype, clip, device):
    kw = dict(dtype=dtype, clip=clip, device=need(device))
    plain = train(OffloadAdamW, False, **kw)
    assert_same(plain, train(OffloadAdamW, True, **kw))
    assert_same(plain, train(OffloadAdamW, True, by_count=True, **kw))
    assert_same(plain, train(OffloadAdamW, True, module=False, **kw))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_overlap_gives_the_steps_bits_on_nvme_with_compressed_state(OffloadAdamW, tmp_path,
                                                                   device):
    config = offload_config("nvme", tmp_path,
                            {"optimizer_state": {"moments": "8bit", "gradients": "bf16"}})
    kw = dict(dtype=torch.bfloat16, clip=0.05, config=config, device=need(device))
    plain = train(OffloadAdamW, False, **kw)
    assert_same(plain, train(OffloadAdamW, True, **kw))


def test_overlap_with_fp16_loss_scaling_skips_the_same_step(OffloadAdamW):
    config = {"fp16": {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2}}
    scale = [1.0, float("inf"), 1.0, 1.0]  # step 2's gradients overflow
    plain = train(OffloadAdamW, False, steps=4, config=config, fp16_scale=scale)
    over = train(OffloadAdamW, True, steps=4, config=config, fp16_scale=scale)
    assert plain[2] == 1, "one step skipped"
    assert_same(plain, over)


def test_overlap_stays_close_to_torch_adamw(OffloadAdamW):
    model, ref = make(), make()
    opt = OffloadAdamW(model.parameters(), lr=1e-3, unit_elements=2048, overlap=True,
                       module=model)
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=1e-2, foreach=False)
    for x in batches(5):
        for m, o in ((model, opt), (ref, topt)):
            loss_of(m, x).backward()
            o.step()
            o.zero_grad()
    opt.synchronize()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert float((p - q).detach().norm()) <= 1e-6 * float(q.detach().norm())
    opt.close()


def test_a_tied_weight_is_handed_over_once_after_its_last_use(OffloadAdamW):
    model = make()
    opt = OffloadAdamW(model.parameters(), lr=1e-3, unit_elements=2048, overlap=True,
                       module=model, overlap_trace=True)
    names = [n for n, _ in model.named_parameters()]
    fired = []
    for n, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, n=n: fired.append(n))
    for x in batches(2):
        fired.clear()
        loss_of(model, x).backward()
        opt.step()
        opt.zero_grad()
        order = [names[i] for i in opt.last_handoff_order]
        assert fired.count("emb.weight") == 1, fired
        assert sorted(order) == sorted(names), "each parameter once"
        # The backward's order: the output projection uses emb.weight first, but its gradient
        # is final only after the embedding's backward, the last node: so it goes last.
        assert order[-1] == "emb.weight", order
        # The hooks fire in the backward's order; a unit (up: unit 1; down and norm: unit 2) goes
        # when its last parameter's hook fired.
        assert fired.index("norm.weight") < fired.index("down.weight") < \
            fired.index("up.weight") < fired.index("emb.weight"), fired
        assert order.index("norm.weight") < order.index("up.weight"), order
    # Without clipping Adam runs on the units in the order they landed.
    opt.synchronize()
    lands = [label for lane, label, _, _ in opt.overlap_trace() if lane == "land"]
    adams = [label for lane, label, _, _ in opt.overlap_trace() if lane == "adam"]
    assert adams == lands
    opt.close()


def test_with_clipping_adam_runs_in_forward_order(OffloadAdamW):
    model = make()
    opt = OffloadAdamW(model.parameters(), lr=1e-3, unit_elements=2048, overlap=True,
                       module=model, max_grad_norm=1.0, overlap_trace=True)
    loss_of(model, batches(1)[0]).backward()
    opt.step()
    opt.synchronize()
    adams = [label for lane, label, _, _ in opt.overlap_trace() if lane == "adam"]
    units = [int(label.split()[1]) for label in adams]
    assert units == sorted(units) and len(units) > 1, adams
    lands = [int(label.split()[1]) for lane, label, _, _ in opt.overlap_trace() if lane == "land"]
    assert lands[-1] == 0, "the embedding's unit lands last"
    assert opt.summary()["last_grad_norm"] is not None
    opt.close()


@pytest.mark.parametrize("overlap", [False, True], ids=["step", "overlap"])
def test_a_parameter_that_changes_dtype_is_refused(OffloadAdamW, overlap):
    model = make()
    opt = OffloadAdamW(model.parameters(), lr=1e-3, overlap=overlap,
                       module=model if overlap else None)
    loss_of(model, batches(1)[0]).backward()
    opt.step()
    opt.zero_grad()
    model.to(torch.float64)
    with pytest.raises(require("strata").StrataError, match=r"parameter \d \(\(\d+(, \d+)?,?\)\) "
                       r"is now torch.float64 on cpu; it was torch.float32 on cpu"):
        loss_of(model, batches(1)[0].clone()).backward()
        opt.step()


@pytest.mark.parametrize("overlap", [False, True], ids=["step", "overlap"])
def test_a_parameter_that_changes_device_is_refused(OffloadAdamW, overlap):
    if not torch.cuda.is_available():
        pytest.skip("moving a parameter to another device needs a GPU (none here)")
    model = make().cuda()
    opt = OffloadAdamW(model.parameters(), lr=1e-3, overlap=overlap,
                       module=model if overlap else None)
    model.cpu()
    with pytest.raises(require("strata").StrataError, match=r"is now torch.float32 on cpu; it "
                       r"was torch.float32 on cuda:0 when the optimizer was created; valid: move"):
        loss_of(model, batches(1)[0]).backward()
        opt.step()


def test_a_gradient_edited_after_its_hand_off_is_refused(OffloadAdamW):
    StrataError = require("strata").StrataError
    model = make()
    opt = OffloadAdamW(model.parameters(), lr=1e-3, overlap=True, module=model)
    loss_of(model, batches(1)[0]).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with pytest.raises(StrataError, match="changed after it was handed over.*max_grad_norm="):
        opt.step()


def test_a_second_backward_before_step_and_zero_grad_between_are_refused(OffloadAdamW):
    StrataError = require("strata").StrataError
    model = make()
    opt = OffloadAdamW(model.parameters(), lr=1e-3, overlap=True, module=model)
    x = batches(1)[0]
    loss_of(model, x).backward()
    with pytest.raises(StrataError, match="zero_grad: a backward has already handed"):
        opt.zero_grad()
    with pytest.raises(StrataError, match="second gradient after its hand-off.*no_sync"):
        loss_of(model, x).backward()


def test_a_parameter_listed_twice_is_refused(OffloadAdamW):
    model = make()
    params = list(model.parameters())
    with pytest.raises(require("strata").StrataError, match="parameter 7 is parameter 0 again"):
        OffloadAdamW(params + [params[0]], lr=1e-3)


def test_a_parameter_read_outside_its_module_is_caught(OffloadAdamW):
    """A forward that reads a weight without running the module holding it would read it before
    its update landed: the next hand-off names it."""

    class Outside(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(64, 64)  # a unit of its own
            self.other = nn.Linear(8, 64)

        def forward(self, x):
            return F.linear(self.other(x), self.inner.weight)  # inner's forward never runs

    model = Outside()
    opt = OffloadAdamW(model.parameters(), lr=1e-3, overlap=True, module=model,
                       unit_elements=2048)
    x = torch.randn(2, 8)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    with pytest.raises(require("strata").StrataError, match="forward never waited for its last "
                       "update"):
        model(x).sum().backward()

"""strata.torch.offload_parameters with Hugging Face models on the CPU: a tiny Llama (tied
embeddings, GQA) and a tiny Qwen2 with their parameters and optimizer on NVMe train to the bits of
the in-memory run, with and without HF gradient checkpointing, and so do a tiny GPT-2 (tied) and a
tiny Mixtral (a mixture-of-experts block); generate() after training gives
the in-memory model's tokens; save_pretrained() writes the trained weights from the tiers; the HF
Trainer's losses equal the in-memory Trainer's; and a PEFT LoRA fine-tune whose frozen base is
offloaded ends with the in-memory run's adapters.

Skipped, with the reason, when `strata` (or transformers, or peft for its test) cannot be
imported; STRATA_REQUIRE_PYTHON=1 makes a missing `strata` a failure."""
import pytest

from conftest import require

torch = require("torch")
transformers = require("transformers")

STEPS, BATCH, SEQ, VOCAB = 3, 4, 16, 128


def tiny(family="llama", tie=True):
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  tie_word_embeddings=tie)
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    if family == "mixtral":  # a mixture-of-experts block: 4 experts, 2 per token
        return transformers.MixtralForCausalLM(transformers.MixtralConfig(
            num_local_experts=4, num_experts_per_tok=2, **common))
    if family == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64,
            tie_word_embeddings=tie))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))


def config(tmp_path=None, param=None):
    z = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if tmp_path is not None:
        z["offload_optimizer"] = {"device": "nvme", "nvme_path": str(tmp_path / "optim")}
    else:
        z["offload_optimizer"] = {"device": "cpu"}
    if param is not None:
        z["offload_param"] = {"device": param, "max_in_cpu": 0}
        if param == "nvme":
            z["offload_param"]["nvme_path"] = str(tmp_path / "params")
    return {"zero_optimization": z}


def data(steps=STEPS):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(steps)]


def run(model, cfg, ckpt=False):
    st = require("strata.torch")
    if ckpt:
        model.gradient_checkpointing_enable()
    model.train()
    opt = st.OffloadAdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2,
                          config=cfg, overlap=True, module=model)
    losses = []
    for x in data():
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    opt.synchronize()
    return losses, opt


@pytest.mark.parametrize("family,ckpt", [("llama", False), ("llama", True), ("qwen2", False),
                                         ("gpt2", False), ("mixtral", False)])
def test_hf_model_on_nvme_trains_to_the_in_memory_bits(strata, tmp_path, family, ckpt):
    st = require("strata.torch")
    ref = tiny(family)
    ref_losses, ref_opt = run(ref, config(tmp_path / "ref"), ckpt)
    model = tiny(family)
    cfg = config(tmp_path, "nvme")
    st.offload_parameters(model, cfg, device="cpu")
    s0 = model.strata_offload.summary()
    assert s0["units"] == 4  # three decoder layers (_no_split_modules) and the root
    losses, opt = run(model, cfg, ckpt)
    assert losses == ref_losses
    a, b = model.state_dict(), ref.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    s = model.strata_offload.summary()
    assert s["nvme_read_bytes"] > 0 and s["materialised_bytes"] == s["persistent_bytes"]
    # generation after training: the same tokens as the in-memory model
    model.eval()
    ref.eval()
    prompt = data(1)[0][:1, :4]
    with torch.no_grad():
        assert torch.equal(model.generate(prompt, max_new_tokens=6, do_sample=False),
                           ref.generate(prompt, max_new_tokens=6, do_sample=False))
    opt.close()


def test_save_pretrained_writes_the_trained_weights(strata, tmp_path):
    st = require("strata.torch")
    model = tiny()
    cfg = config(tmp_path, "nvme")
    st.offload_parameters(model, cfg, device="cpu")
    run(model, cfg)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    model.save_pretrained(tmp_path / "saved")
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "saved")
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, expected[k]), k


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        gen = torch.Generator().manual_seed(2)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=gen)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_losses(tmp_path, offload, accumulation=1):
    require("accelerate")
    st = require("strata.torch")
    model = tiny()
    cfg = config(tmp_path / ("o" if offload else "r"), "nvme" if offload else None)
    if offload:
        st.offload_parameters(model, cfg, device="cpu")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / ("out-o" if offload else "out-r")), max_steps=4,
        per_device_train_batch_size=BATCH, learning_rate=1e-3, logging_steps=1,
        report_to="none", use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0,
        disable_tqdm=True, save_strategy="no", gradient_accumulation_steps=accumulation)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, config=cfg)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(16 * accumulation),
                                   optimizers=(opt, None))
    trainer.train()
    opt.close()
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_hf_trainer_with_offloaded_parameters_equals_in_memory(strata, tmp_path, accumulation):
    offloaded = trainer_losses(tmp_path, True, accumulation)
    in_memory = trainer_losses(tmp_path, False, accumulation)
    assert len(offloaded) == 4 and offloaded == in_memory


def test_peft_lora_with_offloaded_frozen_base(strata, tmp_path):
    peft = require("peft")
    st = require("strata.torch")

    def lora_model():
        lcfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                               lora_dropout=0.0, task_type="CAUSAL_LM")
        torch.manual_seed(3)
        return peft.get_peft_model(tiny(), lcfg)

    ref = lora_model()
    ref_losses, _ = run(ref, config(tmp_path / "ref"))
    model = lora_model()
    cfg = config(tmp_path, "nvme")
    st.offload_parameters(model, cfg, device="cpu")
    losses, _ = run(model, cfg)
    assert losses == ref_losses
    adapters = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    expected = {k: v for k, v in ref.state_dict().items() if "lora_" in k}
    assert adapters and adapters.keys() == expected.keys()
    for k in adapters:
        assert torch.equal(adapters[k], expected[k]), k
    s = model.strata_offload.summary()
    frozen = sum(p.numel() * p.element_size() for p in ref.parameters() if not p.requires_grad)
    assert s["parameter_bytes"] - s["persistent_bytes"] >= frozen  # the base is offloaded

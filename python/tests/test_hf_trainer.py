"""The Hugging Face Trainer with strata.torch.OffloadAdamW (optimizer state on NVMe): a tiny random
Llama trains for 6 steps, saves checkpoint-4 and checkpoint-6 with optimizer.pt, and a run resumed
from checkpoint-4 ends with the same loss as the uninterrupted run.

The same harness runs once with torch.optim.AdamW (no strata needed): it shows that the Trainer's
own resume is exact here, so that a difference with OffloadAdamW is the optimizer's.
Skipped, with the reason, when `strata` cannot be imported; STRATA_REQUIRE_PYTHON=1 makes that a
failure."""
import os

import pytest

from conftest import offload_config, require

torch = require("torch")
transformers = require("transformers")
require("accelerate")

MAX_STEPS, SAVE_STEPS, BATCH, SEQ = 6, 4, 4, 16
# Resumed and uninterrupted runs do the same fp32 arithmetic; the final losses must agree to 1e-6.
LOSS_TOL = 1e-6


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq), generator=gen)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def run_trainer(output_dir, make_optimizer, resume_from=None):
    model = tiny_llama()
    args = transformers.TrainingArguments(
        output_dir=str(output_dir), max_steps=MAX_STEPS, save_steps=SAVE_STEPS,
        save_strategy="steps", per_device_train_batch_size=BATCH, learning_rate=1e-3,
        logging_steps=1, report_to="none", use_cpu=True, seed=0, data_seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    optimizer = make_optimizer(model)
    try:
        trainer = transformers.Trainer(model=model, args=args,
                                       train_dataset=RandomTokens(BATCH * MAX_STEPS, SEQ, 128),
                                       optimizers=(optimizer, None))
        trainer.train(resume_from_checkpoint=resume_from)
    finally:
        close = getattr(optimizer, "close", None)
        if close:
            close()
    losses = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    return losses, model


def check_resume(tmp_path, make_optimizer):
    losses, model = run_trainer(tmp_path / "run", make_optimizer)
    assert sorted(losses) == list(range(1, MAX_STEPS + 1))
    for step in (SAVE_STEPS, MAX_STEPS):
        checkpoint = tmp_path / "run" / f"checkpoint-{step}"
        assert (checkpoint / "optimizer.pt").is_file(), os.listdir(checkpoint)
    # Training did something: the loss fell from ln(128) ~ 4.85 at the start.
    assert losses[MAX_STEPS] < losses[1]

    resumed_losses, resumed_model = run_trainer(
        tmp_path / "resumed", make_optimizer,
        resume_from=str(tmp_path / "run" / f"checkpoint-{SAVE_STEPS}"))
    assert set(resumed_losses) >= {SAVE_STEPS + 1, MAX_STEPS}
    assert abs(resumed_losses[MAX_STEPS] - losses[MAX_STEPS]) <= LOSS_TOL, \
        (resumed_losses, losses)
    for (name, p), q in zip(model.named_parameters(), resumed_model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=lambda m: f"{name}: {m}")


def test_trainer_resume_is_exact_with_torch_adamw(tmp_path):
    check_resume(tmp_path, lambda model: torch.optim.AdamW(model.parameters(), lr=1e-3))


def test_trainer_with_offload_adamw_on_nvme(OffloadAdamW, tmp_path):
    swap = tmp_path / "swap"

    def make_optimizer(model):
        # A fresh swap folder per run: the resumed run must not read the first run's files.
        path = swap / f"run{len(os.listdir(swap)) if swap.exists() else 0}"
        path.mkdir(parents=True)
        return OffloadAdamW(model.parameters(), lr=1e-3,
                            config=offload_config("nvme", nvme_path=path))

    check_resume(tmp_path, make_optimizer)

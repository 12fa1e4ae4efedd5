"""Loss parity of the Python optimizer (docs/benchmarks.md, "Compressed optimizer state").

Trains the Llama-shaped model of tools/loss_parity.sh (its config.json, 10.1M parameters) from
the same seed on the same token file (tools/prepare_data.sh output) in a plain PyTorch loop,
once with torch.optim.AdamW and once per strata.torch.OffloadAdamW choice of
strata.optimizer_state, the same batches in the same order, and prints one JSON line per run
(final train loss = mean of the last 20 steps, validation loss) and a summary with the ratio of
each to torch's AdamW.

Usage: PYTHONPATH=build/python "$(tools/py_venv.sh)" tools/loss_parity_torch.py WORK [STEPS]
(WORK is tools/loss_parity.sh's work folder: WORK/model/config.json, WORK/data/{train,val}.bin)
"""
import json
import math
import sys
import time

import numpy as np
import torch
import transformers

from strata.torch import OffloadAdamW

HEADER_BYTES = 256 * 4  # the llm.c token file header (tools/prepare_data.py)
MICRO, ACCUM, SEQ = 4, 2, 128  # as tools/loss_parity.sh's runs
LR, BETAS, WEIGHT_DECAY, WARMUP, CLIP = 1e-3, (0.9, 0.95), 0.1, 30, 1.0


def tokens(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
        if header[0] != 20240520 or header[1] != 1:
            sys.exit(f"{path}: not a 16-bit llm.c token file (tools/prepare_data.sh writes one)")
        data = np.frombuffer(f.read(), dtype="<u2")
    if len(data) != header[2]:
        sys.exit(f"{path}: header says {header[2]} tokens, file holds {len(data)}")
    return torch.from_numpy(data.astype(np.int64))


def lr_at(step, steps):  # linear warm-up, cosine decay to 0 (DeepSpeed's WarmupCosineLR shape)
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    return LR * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, steps - WARMUP)))


def run(name, work, steps, train, val, make_optimizer):
    torch.manual_seed(1)
    config = transformers.LlamaConfig.from_pretrained(f"{work}/model")
    model = transformers.LlamaForCausalLM(config)
    opt = make_optimizer(model)
    gen = torch.Generator().manual_seed(2)
    losses = []
    start = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps)
        total = 0.0
        for _ in range(ACCUM):
            at = torch.randint(0, len(train) - SEQ - 1, (MICRO,), generator=gen)
            batch = torch.stack([train[i:i + SEQ + 1] for i in at.tolist()])
            # HF shifts the labels itself: SEQ + 1 tokens give SEQ predictions.
            loss = model(input_ids=batch, labels=batch).loss
            (loss / ACCUM).backward()
            total += loss.item() / ACCUM
        if isinstance(opt, torch.optim.AdamW):
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    with torch.no_grad():
        n = (len(val) - 1) // SEQ
        batch = torch.stack([val[i * SEQ:(i + 1) * SEQ] for i in range(min(n, 64))])
        eval_loss = model(input_ids=batch, labels=batch).loss.item()
    close = getattr(opt, "close", None)
    if close:
        close()
    return {"run": name, "steps": steps, "first_loss": losses[0],
            "final_loss": sum(losses[-20:]) / len(losses[-20:]), "eval_loss": eval_loss,
            "seconds": round(time.time() - start, 1)}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    work, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300
    torch.set_num_threads(max(1, torch.get_num_threads()))
    train, val = tokens(f"{work}/data/train.bin"), tokens(f"{work}/data/val.bin")

    def torch_adamw(model):
        return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS,
                                 weight_decay=WEIGHT_DECAY)

    def strata(state):
        def make(model):
            config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                      "strata": {"optimizer_state": state}}
            return OffloadAdamW(model.parameters(), lr=LR, betas=BETAS,
                                weight_decay=WEIGHT_DECAY, config=config, max_grad_norm=CLIP)
        return make

    runs = [("torch_adamw", torch_adamw), ("offload_fp32", strata({})),
            ("offload_8bit", strata({"moments": "8bit"}))]
    if len(sys.argv) > 3:
        runs = [r for r in runs if r[0] in sys.argv[3].split(",")]
    rows = []
    for name, make in runs:
        row = run(name, work, steps, train, val, make)
        print(json.dumps(row), flush=True)
        rows.append(row)
    base = rows[0]
    for r in rows:
        r["final_vs_torch"] = r["final_loss"] / base["final_loss"]
        r["eval_vs_torch"] = r["eval_loss"] / base["eval_loss"]
    print(json.dumps({"loss_parity_python": rows}, indent=1))


if __name__ == "__main__":
    main()

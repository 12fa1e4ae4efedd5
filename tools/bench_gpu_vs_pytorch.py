#!/usr/bin/env python3
"""The PyTorch side of tools/bench_gpu_vs_pytorch.sh: trains a model shape (a Hugging Face
config.json, e.g. configs/models/gpt2-124m.json) in plain PyTorch with everything on the GPU and
prints one JSON line with the median step time and tokens/s, comparable with
`strata bench step --json` on the same machine:

  - the same work per step: forward, loss over every position (inputs/targets windows of random
    token ids, as Strata's synthetic source), backward, global-norm clipping at 1.0, AdamW;
  - torch.optim.AdamW(fused=True) on fp32 parameters, autocast to bf16 or fp16 for the compute
    (fp16 with a GradScaler), or plain fp32 (TF32 matmuls off, as Strata's fp32 GEMMs);
  - dropout off (Strata has none); attention through SDPA (FlashAttention where available);
  - torch.cuda.synchronize() around every timed step; the median of --steps after --warmup.

Usage: bench_gpu_vs_pytorch.py --model CONFIG.json [--batch 8] [--seq-len 1024] [--steps 20]
                               [--warmup 5] [--precision bf16|fp16|fp32] [--seed 1]
Needs torch with CUDA and transformers (the .sh sets up a virtual environment).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import transformers


def build_model(config_path):
    with open(config_path) as f:
        raw = json.load(f)
    for key in ("attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout",
                "attention_dropout", "hidden_dropout"):
        if key in raw:
            raw[key] = 0.0
    config = transformers.AutoConfig.for_model(**raw)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model, config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu_vs_pytorch.py: no CUDA device visible to PyTorch")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    model, config = build_model(args.model)
    model.to(device).train()
    vocab = config.vocab_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[args.precision]
    scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" else None
    generator = torch.Generator(device=device).manual_seed(args.seed)

    def step():
        tokens = torch.randint(0, vocab, (args.batch, args.seq_len + 1), device=device,
                               generator=generator)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.float().view(-1, vocab), targets.reshape(-1))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    times_ms = []
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) * 1e3
        if i >= args.warmup:
            times_ms.append(elapsed)
    median_ms = statistics.median(times_ms)
    tokens = args.batch * args.seq_len
    print(json.dumps({
        "framework": "pytorch",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0),
        "model": config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "seq_len": args.seq_len,
        "precision": args.precision,
        "optimizer": "torch.optim.AdamW(fused=True)",
        "step_ms": times_ms,
        "step_ms_median": median_ms,
        "tokens_per_s": tokens / (median_ms / 1e3),
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
    }))


if __name__ == "__main__":
    main()

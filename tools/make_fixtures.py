#!/usr/bin/env python3
"""Reference fixtures from PyTorch + Hugging Face transformers for Strata's model tests.

For each tiny random model (GPT-2 and Llama with grouped KV heads, tied and untied embeddings)
it writes tests/fixtures/models/<name>/:
  config.json, model.safetensors   the model as save_pretrained writes it
  fixture.safetensors              tokens (a stream of B*T+1 ids: window b is inputs
                                   tokens[bT:bT+T] and targets tokens[bT+1:bT+T+1]), logits (B,T,V),
                                   loss (mean cross-entropy), grad.<name> for every parameter, and
                                   after3.<name>: the weights after 3 AdamW steps on that batch
                                   (hyper-parameters in the file's metadata)
Everything is computed in float64 and stored as float32, so the references carry no float32
rounding of their own. The default tests read these files; they never need PyTorch.

  tools/make_fixtures.sh                    regenerate the fixtures
  tools/make_fixtures.sh --check-hf DIR --tokens FILE
                                            load a model Strata saved with transformers and print
                                            its loss on an llm.c token file (a compatibility check)
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

BATCH, SEQ = 2, 16
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-6, "weight_decay": 0.1}

MODELS = {
    "gpt2_tied": ("gpt2", dict(vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                               tie_word_embeddings=True)),
    "gpt2_untied": ("gpt2", dict(vocab_size=53, n_positions=24, n_embd=24, n_layer=2, n_head=2,
                                 n_inner=40, layer_norm_epsilon=1e-6, tie_word_embeddings=False)),
    "llama_gqa_tied": ("llama", dict(vocab_size=67, hidden_size=32, intermediate_size=48,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=64,
                                     rope_theta=500.0, rms_norm_eps=1e-5,
                                     tie_word_embeddings=True)),
    "llama_gqa_untied": ("llama", dict(vocab_size=59, hidden_size=32, intermediate_size=40,
                                       num_hidden_layers=2, num_attention_heads=8,
                                       num_key_value_heads=2, max_position_embeddings=32,
                                       rope_theta=10000.0, rms_norm_eps=1e-6,
                                       tie_word_embeddings=False)),
}


def build(family, kwargs, seed):
    torch.manual_seed(seed)
    if family == "gpt2":
        config = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         activation_function="gelu_new", **kwargs)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(hidden_act="silu", attention_bias=False,
                                          mlp_bias=False, **kwargs)
        model = transformers.LlamaForCausalLM(config)
    model.config._attn_implementation = "eager"
    # Spread the weights beyond the default init so every path carries signal.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "bias" not in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    return model


def loss_of(model, tokens):
    inputs = tokens[:-1].view(BATCH, SEQ)
    targets = tokens[1:].view(BATCH, SEQ)
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))
    return logits, loss


def make(name, out_root, seed):
    family, kwargs = MODELS[name]
    model = build(family, kwargs, seed)
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    model = model.double()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (BATCH * SEQ + 1,), generator=generator)

    tensors = {"tokens": tokens.to(torch.int32)}
    model.zero_grad()
    logits, loss = loss_of(model, tokens)
    loss.backward()
    tensors["logits"] = logits.detach().float().contiguous()
    tensors["loss"] = loss.detach().float().reshape(1)
    for pname, p in model.named_parameters():
        tensors["grad." + pname] = p.grad.detach().float().contiguous()

    optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"],
                                  betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                                  weight_decay=ADAMW["weight_decay"])
    for _ in range(3):
        optimizer.zero_grad()
        _, step_loss = loss_of(model, tokens)
        step_loss.backward()
        optimizer.step()
    for pname, p in model.named_parameters():
        tensors["after3." + pname] = p.detach().float().contiguous()
    metadata = {k: repr(v) for k, v in ADAMW.items()}
    metadata.update(batch=str(BATCH), seq_len=str(SEQ), torch=torch.__version__,
                    transformers=transformers.__version__)
    save_file(tensors, os.path.join(out, "fixture.safetensors"), metadata=metadata)
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"loss {loss.item():.6f} -> {out}")


def check_hf(directory, token_file, seq):
    """Loads a model directory with transformers unchanged and prints its mean loss."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    model.eval()
    with open(token_file, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240520, "expected an llm.c token file"
        dtype = np.uint16 if header[1] == 1 else np.uint32
        ids = np.frombuffer(f.read(), dtype=dtype).astype(np.int64)
    windows = (len(ids) - 1) // seq
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(windows):
            chunk = torch.from_numpy(ids[w * seq:w * seq + seq + 1])
            logits = model(input_ids=chunk[:-1].unsqueeze(0)).logits[0]
            total += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
            count += seq
    print(json.dumps({"architecture": type(model).__name__, "loss": total / count,
                      "tokens": count}))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                      "fixtures", "models"))
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--check-hf", metavar="DIR")
    parser.add_argument("--tokens", metavar="FILE")
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.check_hf:
        if not args.tokens:
            sys.exit("--check-hf needs --tokens FILE")
        check_hf(args.check_hf, args.tokens, args.seq_len)
        return
    for index, name in enumerate(MODELS):
        make(name, os.path.abspath(args.out), args.seed + 100 * index)


if __name__ == "__main__":
    main()

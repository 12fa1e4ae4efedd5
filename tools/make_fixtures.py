#!/usr/bin/env python3
"""Reference fixtures from PyTorch + Hugging Face transformers for Strata's model tests.

For each tiny random model (GPT-2 and Llama with grouped KV heads, tied and untied embeddings;
Llama 3 RoPE, linear RoPE, Qwen2 with biases / YaRN / a per-layer sliding window, Qwen3 with q/k
norms, Mistral with a sliding window shorter than the sequence, Phi-3 with fused projections,
partial rotary and LongRoPE) it writes tests/fixtures/models/<name>/:
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
                                            load a model Strata saved with transformers (and its
                                            tokenizer, when the directory has one) and print its
                                            loss on an llm.c token file (a compatibility check)
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

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)

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
    # Llama 3.1's RoPE: with an original context of 8 the 4 frequencies of an 8-wide head fall in
    # all three bands (kept, smoothed, divided by factor). Attention and MLP biases too.
    "llama3_rope": ("llama", dict(SMALL, tie_word_embeddings=True, attention_bias=True,
                                  mlp_bias=True,
                                  rope_parameters={"rope_type": "llama3", "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 8,
                                                   "rope_theta": 500000.0})),
    # Linear RoPE scaling, and head_dim 12 != hidden / heads.
    "llama_linear_rope": ("llama", dict(SMALL, head_dim=12, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                         "rope_theta": 10000.0})),
    # q/k/v biases, tied; layer 1 of 2 uses a sliding window of 5 (max_window_layers 1).
    "qwen2_tied": ("qwen2", dict(SMALL, tie_word_embeddings=True, use_sliding_window=True,
                                 sliding_window=5, max_window_layers=1, bos_token_id=1,
                                 eos_token_id=2, pad_token_id=0), {"tokenizer": True}),
    # Untied, with YaRN over an original context of 8.
    "qwen2_untied_yarn": ("qwen2", dict(SMALL, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 8,
                                                         "rope_theta": 10000.0})),
    # Per-head q/k RMSNorm, head_dim 16 != hidden / heads.
    "qwen3": ("qwen3", dict(SMALL, head_dim=16, tie_word_embeddings=False)),
    # A sliding window of 6 over sequences of 16.
    "mistral_window": ("mistral", dict(SMALL, sliding_window=6, tie_word_embeddings=False)),
    # Fused qkv_proj and gate_up_proj.
    "phi3": ("phi3", dict(SMALL, tie_word_embeddings=False, pad_token_id=None, eos_token_id=2)),
    # Half of each head rotated, LongRoPE past an original context of 8 (the long factors apply
    # to sequences of 16), a sliding window of 12.
    "phi3_partial_longrope": ("phi3", dict(SMALL, tie_word_embeddings=True, pad_token_id=None,
                                           eos_token_id=2, partial_rotary_factor=0.5,
                                           original_max_position_embeddings=8, sliding_window=12,
                                           rope_parameters={"rope_type": "longrope",
                                                            "short_factor": [1.0, 1.25],
                                                            "long_factor": [1.5, 3.0]})),
}

CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
           "mistral": "MistralConfig", "phi3": "Phi3Config"}


def build(family, kwargs, seed):
    torch.manual_seed(seed)
    if family == "gpt2":
        config = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         activation_function="gelu_new", **kwargs)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = getattr(transformers, CONFIGS[family])(hidden_act="silu", **kwargs)
        model = transformers.AutoModelForCausalLM.from_config(config)
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


def save_tokenizer(out, vocab_size):
    """A word-level tokenizer over the model's vocabulary ("t0" ... and the special tokens), so
    that a copy of the directory can be checked with AutoTokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    specials = ["<pad>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for i in range(len(specials), vocab_size):
        vocab[f"t{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)


def make(name, out_root, seed):
    family, kwargs = MODELS[name][:2]
    extras = MODELS[name][2] if len(MODELS[name]) > 2 else {}
    model = build(family, kwargs, seed)
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if extras.get("tokenizer"):
        save_tokenizer(out, model.config.vocab_size)
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
    """Loads a model directory with transformers unchanged and prints its mean loss (in float32,
    whatever dtype config.json names), and what AutoTokenizer finds there."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    tokenizer = None
    if os.path.exists(os.path.join(directory, "tokenizer_config.json")):
        tok = transformers.AutoTokenizer.from_pretrained(directory)
        tokenizer = {"class": type(tok).__name__, "vocab": len(tok),
                     "bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
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
                      "tokens": count, "tokenizer": tokenizer,
                      "generation_config": os.path.exists(
                          os.path.join(directory, "generation_config.json")),
                      "eos_token_id": model.config.eos_token_id}))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                      "fixtures", "models"))
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--check-hf", metavar="DIR")
    parser.add_argument("--tokens", metavar="FILE")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--only", nargs="*", metavar="NAME",
                        help="regenerate only these fixtures (the others keep their seeds)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.check_hf:
        if not args.tokens:
            sys.exit("--check-hf needs --tokens FILE")
        check_hf(args.check_hf, args.tokens, args.seq_len)
        return
    for index, name in enumerate(MODELS):
        if args.only and name not in args.only:
            continue
        make(name, os.path.abspath(args.out), args.seed + 100 * index)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The fixture model directory and PyTorch references for Strata's data-preparation tests.

Writes tests/fixtures/models/llama_bpe/:
  tokenizer.json, tokenizer_config.json   a byte-level BPE tokenizer (vocabulary 384) trained on
                                          tests/fixtures/data/sft.jsonl, with a ChatML-style chat
                                          template and <|end_of_text|> as the end of a document
  config.json, model.safetensors          a tiny random Llama whose vocabulary matches
  sft_reference.safetensors               what tools/prepare_data.py makes of sft.jsonl (tokens,
                                          flags) and, from the same start, the loss and the
                                          weights after 3 AdamW steps (float64) of
                                            stream.*  masked windows of SEQ tokens over the stream
                                            packed.*  every document on its own (what packing with
                                                      attention kept inside documents computes)
                                          each step over the whole file: one step sees every
                                          window, so how packing arranges documents in windows
                                          does not matter.

  tools/make_fixtures.sh is not needed: run this with tools/py_venv.sh's python,
  "$(tools/py_venv.sh)" tools/make_data_fixture.py
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "models", "llama_bpe")
DATA = os.path.join(ROOT, "tests", "fixtures", "data", "sft.jsonl")
SEQ = 32
ADAMW = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                 "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def make_tokenizer():
    with open(DATA, encoding="utf-8") as f:
        corpus = [s for line in f for s in strings(json.loads(line))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 4, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    os.makedirs(OUT, exist_ok=True)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
              "eos_token": "<|end_of_text|>", "pad_token": "<|pad|>",
              "model_max_length": 128, "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return tok


def make_model(vocab, tok):
    torch.manual_seed(4321)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu",
        bos_token_id=tok.token_to_id("<|begin_of_text|>"),
        eos_token_id=tok.token_to_id("<|end_of_text|>"))
    model = transformers.LlamaForCausalLM(config)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if p.dim() == 1 else 0.08 * torch.randn_like(p))
    model.save_pretrained(OUT, safe_serialization=True)
    return model


def prepare():
    python = os.path.join(os.environ.get("STRATA_DATA_VENV",
                                         os.path.expanduser("~/.cache/strata/data-venv")),
                          "bin", "python")
    out = tempfile.mkdtemp()
    subprocess.run([python, os.path.join(ROOT, "tools", "prepare_data.py"), "--model", OUT,
                    "--input", DATA, "--output", out, "--quiet", "--workers", "1"], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "train.bin"), "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        tokens = np.frombuffer(f.read(), dtype="<u2" if header[1] == 1 else "<u4")
    with open(os.path.join(out, "train.mask.bin"), "rb") as f:
        flags = np.frombuffer(f.read()[1024:], dtype=np.uint8)
    return tokens.astype(np.int64), flags


def stream_items(tokens, flags):
    """Strata's stream windows: (inputs, targets) with -100 where the mask does not count."""
    items = []
    for w in range((len(tokens) - 1) // SEQ):
        chunk = tokens[w * SEQ:w * SEQ + SEQ + 1]
        counts = flags[w * SEQ + 1:w * SEQ + SEQ + 1] & 1
        items.append((chunk[:-1], np.where(counts == 1, chunk[1:], -100)))
    return items


def packed_items(tokens, flags):
    """Documents (pieces of SEQ + 1 tokens overlapping by one for longer ones), each alone."""
    starts = [i for i in range(len(tokens)) if i == 0 or flags[i] & 2] + [len(tokens)]
    items = []
    for begin, end in zip(starts[:-1], starts[1:]):
        for at in range(begin, end - 1, SEQ):
            piece = tokens[at:min(at + SEQ + 1, end)]
            counts = flags[at + 1:at + len(piece)] & 1
            if counts.any():
                items.append((piece[:-1], np.where(counts == 1, piece[1:], -100)))
    return items


def loss_of(model, items):
    total, counted = 0.0, 0
    for inputs, targets in items:
        logits = model(input_ids=torch.from_numpy(inputs).unsqueeze(0)).logits[0]
        t = torch.from_numpy(targets)
        total = total + torch.nn.functional.cross_entropy(logits, t, ignore_index=-100,
                                                          reduction="sum")
        counted += int((t != -100).sum())
    return total / counted


def train(model, items, prefix, tensors):
    model = model.double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"],
                                  betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                                  weight_decay=ADAMW["weight_decay"])
    for step in range(3):
        optimizer.zero_grad()
        loss = loss_of(model, items)
        if step == 0:
            tensors[prefix + "loss"] = loss.detach().float().reshape(1)
        loss.backward()
        optimizer.step()
    for name, p in model.named_parameters():
        tensors[prefix + "after3." + name] = p.detach().float().contiguous()
    print(f"{prefix}: {len(items)} items, first loss {tensors[prefix + 'loss'].item():.6f}")


def main():
    torch.set_num_threads(2)
    tok = make_tokenizer()
    vocab = tok.get_vocab_size()
    make_model(vocab, tok)
    tokens, flags = prepare()
    tensors = {"tokens": torch.from_numpy(tokens.astype(np.int32)),
               "flags": torch.from_numpy(flags.astype(np.int32))}
    for prefix, items in (("stream.", stream_items(tokens, flags)),
                          ("packed.", packed_items(tokens, flags))):
        model = transformers.AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float64)
        model.config._attn_implementation = "eager"
        train(model, items, prefix, tensors)
    metadata = {k: repr(v) for k, v in ADAMW.items()}
    metadata.update(seq_len=str(SEQ), torch=torch.__version__,
                    transformers=transformers.__version__)
    save_file(tensors, os.path.join(OUT, "sft_reference.safetensors"), metadata=metadata)
    print(f"{OUT}: vocabulary {vocab}, {len(tokens)} tokens, {int((flags & 1).sum())} count, "
          f"{int(((flags & 2) > 0).sum())} documents")


if __name__ == "__main__":
    sys.exit(main())

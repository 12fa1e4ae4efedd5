#!/usr/bin/env python3
"""Converts a Hugging Face model directory whose weights are PyTorch pickle files
(pytorch_model.bin, or pytorch_model.bin.index.json and its shards) to safetensors in place:
model.safetensors, or model-0000i-of-0000n.safetensors shards with model.safetensors.index.json.
Strata reads only safetensors (unpickling a file can run code; this tool loads with
torch.load(weights_only=True), which refuses anything but tensors). The .bin files are left alone.

  tools/convert_pytorch_bin.sh DIR
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file


def shards_of(directory):
    index = os.path.join(directory, "pytorch_model.bin.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return sorted(set(weight_map.values()))
    if os.path.exists(os.path.join(directory, "pytorch_model.bin")):
        return ["pytorch_model.bin"]
    sys.exit(f"{directory}: no pytorch_model.bin or pytorch_model.bin.index.json")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir")
    args = parser.parse_args()
    shards = shards_of(args.dir)
    for name in shards:
        if "/" in name or name in (".", ".."):
            sys.exit(f"{args.dir}: shard name '{name}' is not a file in the directory")
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for shard, out in zip(shards, names):
        state = torch.load(os.path.join(args.dir, shard), map_location="cpu", weights_only=True)
        # Tied weights share storage, which safetensors refuses: each tensor gets its own copy.
        tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
        save_file(tensors, os.path.join(args.dir, out), metadata={"format": "pt"})
        for k in tensors:
            weight_map[k] = out
        print(f"{shard} -> {out}: {len(tensors)} tensors")
    if len(names) > 1:
        with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()

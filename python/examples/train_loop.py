#!/usr/bin/env python3
"""A plain PyTorch training loop with Strata's OffloadAdamW: the optimizer state (fp32 masters,
Adam moments) lives in swap files under --nvme-dir, everything else is ordinary PyTorch.

  PYTHONPATH=build/python "$(tools/py_venv.sh)" python/examples/train_loop.py \\
      --nvme-dir /mnt/nvme/strata-swap --steps 200

Any DeepSpeed-style configuration works in place of the dict below (a path to a JSON file too):
offload_optimizer.device none|cpu|nvme, its nvme_path, the "aio" section and the "strata"
budgets (docs/config.md).
"""
import argparse
import os
import tempfile

import torch
import torch.nn as nn

from strata.torch import OffloadAdamW


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--nvme-dir", default=os.path.join(tempfile.gettempdir(), "strata-swap"))
    parser.add_argument("--checkpoint", default=None, help="torch.save the model and optimizer "
                        "state here at the end")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.makedirs(args.nvme_dir, exist_ok=True)

    torch.manual_seed(args.seed)
    # A regression task the model can learn: y = tanh(x A) B.
    a, b = torch.randn(32, 64) / 32**0.5, torch.randn(64, 8) / 8
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 8))
    config = {
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "nvme", "nvme_path": args.nvme_dir},
        },
    }
    optimizer = OffloadAdamW(model.parameters(), lr=3e-3, weight_decay=0.01, config=config,
                             max_grad_norm=1.0)
    losses = []
    try:
        for step in range(args.steps):
            x = torch.randn(64, 32)
            y = torch.tanh(x @ a) @ b
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if step % 20 == 0 or step == args.steps - 1:
                print(f"step {step + 1:4d}  loss {loss.item():.5f}")
        if args.checkpoint:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": args.steps}, args.checkpoint)
        summary = optimizer.summary()
        print("strata:", summary)
    finally:
        optimizer.close()
    return {"losses": losses, "summary": summary}


if __name__ == "__main__":
    main()

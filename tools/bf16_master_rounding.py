"""Which rounding keeps a bf16 master weight training (docs/benchmarks.md, "Compressed optimizer
state"): AdamW on a noisy quadratic whose optimum sits at weights of magnitude ~1 (where a bf16
ulp is 2^-8 to 2^-7, far above the late updates of lr 1e-3 -> 1e-5), the master stored as
  fp32            the reference;
  bf16 nearest    round to nearest even after each update (what a plain bf16 cast does);
  bf16 stochastic Strata's rule: 16 random bits added below the mantissa, then truncated;
  bf16 + Kahan    bf16 weight plus a bf16 compensation buffer holding what the last rounding
                  lost (2 more bytes per parameter), added back before the next rounding.
Moments and the update are fp32 in every run, so only the master's rounding differs. Prints the
final loss of each relative to the fp32 run (mean of 5 seeds) as JSON.

Usage: "$(tools/py_venv.sh)" tools/bf16_master_rounding.py [STEPS] [PARAMS]
"""
import json
import math
import sys

import torch


def sr_bf16(x, gen):
    bits = x.view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, generator=gen, dtype=torch.int32)
    return ((bits + noise) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def train(mode, steps, n, seed):
    gen = torch.Generator().manual_seed(seed)
    h = torch.logspace(-3, 0, n)                      # curvatures over three decades
    target = torch.randn(n, generator=gen)            # optimum, |w*| ~ 1
    w = torch.zeros(n)                                # fp32 value of the master
    comp = torch.zeros(n, dtype=torch.bfloat16)       # Kahan's lost low part
    m = torch.zeros(n)
    v = torch.zeros(n)
    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.0
    rounding = torch.Generator().manual_seed(seed + 1000)
    for t in range(1, steps + 1):
        lr = 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + math.cos(math.pi * t / steps))
        g = h * (w - target) + 0.01 * torch.randn(n, generator=gen)
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        step = lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps) + lr * wd * w
        if mode == "fp32":
            w = w - step
        elif mode == "bf16_nearest":
            w = (w - step).to(torch.bfloat16).float()
        elif mode == "bf16_stochastic":
            w = sr_bf16(w - step, rounding).float()
        elif mode == "bf16_kahan":
            y = -step + comp.float()       # the update plus what was lost last time
            new = (w + y).to(torch.bfloat16).float()
            comp = (y - (new - w)).to(torch.bfloat16)
            w = new
    return float((0.5 * h * (w - target) ** 2).sum() / n)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 16
    modes = ["fp32", "bf16_nearest", "bf16_stochastic", "bf16_kahan"]
    losses = {mode: [train(mode, steps, n, seed) for seed in range(5)] for mode in modes}
    base = sum(losses["fp32"]) / 5
    rows = [{"master": mode, "bytes_per_param": 4 if mode in ("fp32", "bf16_kahan") else 2,
             "final_loss": sum(l) / 5, "vs_fp32": sum(l) / 5 / base} for mode, l in losses.items()]
    print(json.dumps({"steps": steps, "params": n, "bf16_master_rounding": rows}, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Draws the timeline of OffloadAdamW(overlap=True) from its trace (overlap_trace=True) as an SVG:
two training steps of a stack of linear layers on the CPU, once without clipping (Adam starts on
each unit as it lands, during the backward) and once with max_grad_norm (Adam waits for the
global norm, then runs in forward order while the next forward waits unit by unit). Lanes: the
caller's forward and backward, the hooks' hand-offs, and the worker's landings, Adam and uploads.

Usage: PYTHONPATH=build/python python tools/plot_overlap_trace.py OUT.svg [--width 1024]
"""
import argparse
import time

import torch
import torch.nn as nn

from strata.torch import OffloadAdamW

LANES = ["forward", "backward", "hand-off", "land", "adam", "upload"]
COLORS = {"forward": "#4c78a8", "backward": "#72b7b2", "hand-off": "#f58518", "land": "#e45756",
          "adam": "#54a24b", "upload": "#b279a2"}


def run(clip):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)])
    opt = OffloadAdamW(model.parameters(), lr=1e-4, unit_elements=1 << 20, overlap=True,
                       module=model, max_grad_norm=clip, overlap_trace=True)
    x = torch.randn(512, 1024)
    spans = []
    t0 = opt._overlap.t0
    for _ in range(3):
        begin = time.perf_counter()
        loss = model(x).square().mean()
        mid = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        opt.step()
        opt.zero_grad()
        spans += [("forward", "", begin - t0, mid - t0), ("backward", "", mid - t0, end - t0)]
    opt.synchronize()
    trace = spans + opt.overlap_trace()
    opt.close()
    first = min(b for lane, _, b, _ in trace if lane == "forward" and b > spans[1][3])
    return [(lane, label, b - first, e - first) for lane, label, b, e in trace if b >= first]


def panel(trace, title, y0, width):
    end = max(e for _, _, _, e in trace)
    scale = (width - 110) / end
    out = [f'<text x="4" y="{y0 + 14}" font-weight="bold">{title}</text>']
    for i, lane in enumerate(LANES):
        y = y0 + 24 + i * 20
        out.append(f'<text x="4" y="{y + 13}">{lane}</text>')
        for lane2, label, b, e in trace:
            if lane2 != lane:
                continue
            w = max((e - b) * scale, 1.0)
            out.append(f'<rect x="{100 + b * scale:.1f}" y="{y}" width="{w:.1f}" height="16" '
                       f'fill="{COLORS[lane]}"><title>{lane} {label} {b * 1e3:.1f}-'
                       f'{e * 1e3:.1f} ms</title></rect>')
    y = y0 + 24 + len(LANES) * 20
    for ms in range(0, int(end * 1e3) + 1, max(int(end * 1e3) // 8, 1)):
        x = 100 + ms / 1e3 * scale
        out.append(f'<line x1="{x:.1f}" y1="{y0 + 22}" x2="{x:.1f}" y2="{y}" stroke="#ccc"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 12}" font-size="10">{ms} ms</text>')
    return out, y + 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--width", type=int, default=1024)
    args = ap.parse_args()
    body, y = [], 0
    for clip, title in ((0.0, "no clipping: Adam on each unit as it lands, during the backward"),
                        (1.0, "max_grad_norm=1.0: the norm first, then Adam in forward order "
                              "while the next forward waits unit by unit")):
        lines, y = panel(run(clip), title, y, args.width)
        body += lines
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{args.width}" height="{y}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{args.width}" height="{y}" fill="white"/>'] + body + ["</svg>"]
    with open(args.out, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

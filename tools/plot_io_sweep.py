#!/usr/bin/python3
"""Turns `strata bench io --sweep --json` output into a PNG chart.

Usage: strata bench io --path DIR --sweep --json > sweep.json
       tools/plot_io_sweep.py sweep.json sweep.png

(Runs with /usr/bin/python3 so the Debian package python3-matplotlib is found.)
One panel per pass (read, write) and thread count; x = queue depth (log scale), one line per
block size, y = GB/s. Skipped points are left out. Needs matplotlib (Debian: python3-matplotlib).
"""
import json
import sys


def size_label(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_io_sweep: matplotlib is missing; apt-get install python3-matplotlib",
              file=sys.stderr)
        return 2
    source = sys.stdin if argv[1] == "-" else open(argv[1])
    data = json.load(source)
    points = [p for p in data.get("sweep", []) if "skipped" not in p]
    if not points:
        print("plot_io_sweep: no measured points in the input", file=sys.stderr)
        return 1
    threads = sorted({p["threads"] for p in points})
    blocks = sorted({p["block_size"] for p in points})
    passes = [name for name in ("read", "write") if any(p.get(name + "_gbps") for p in points)]
    fig, axes = plt.subplots(len(passes), len(threads), squeeze=False, sharey="row",
                             figsize=(4 * len(threads), 3.5 * len(passes)))
    for row, name in enumerate(passes):
        for col, t in enumerate(threads):
            ax = axes[row][col]
            for b in blocks:
                series = sorted((p["queue_depth"], p[name + "_gbps"]) for p in points
                                if p["threads"] == t and p["block_size"] == b
                                and p.get(name + "_gbps") is not None)
                if series:
                    ax.plot([q for q, _ in series], [g for _, g in series], marker="o",
                            label=size_label(b))
            ax.set_xscale("log", base=2)
            ax.set_title(f"{name}, {t} thread{'s' if t > 1 else ''}")
            ax.set_xlabel("queue depth")
            if col == 0:
                ax.set_ylabel("GB/s")
            ax.grid(True, alpha=0.3)
    axes[0][-1].legend(title="block size", fontsize="small")
    best = data.get("best")
    if best:
        fig.suptitle(f"strata bench io --sweep (best: block {size_label(best['block_size'])}, "
                     f"queue depth {best['queue_depth']}, threads {best['threads']})")
    fig.tight_layout()
    fig.savefig(argv[2], dpi=90)
    print(f"plot_io_sweep: wrote {argv[2]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""PyTorch's scaled_dot_product_attention at the two rows' shapes of issue 35, for comparison with
the tensor-core flash attention's TFLOP/s (tests/kernels/flash_attention_gputest.cc prints
`flash_forward_tflops` / `flash_backward_tflops` lines in the same format; tools/gpu_checks.sh runs
both and shows them together).

Shapes: GPT-2 124M (B=8, T=1024, H=12, d=64) and the Llama-1.1B shape (B=4, T=1024, H=32, KV=8,
d=64), causal, bf16. FLOPs: forward 4*B*H*T^2*d/2 (the causal half), backward 2.5x that (the
convention FlashAttention's papers use). Median of --repeats timed calls after --warmup.

Usage: bench_sdpa.py [--repeats N] [--warmup W] [--dtype bf16|fp16]
Prints one line per shape and pass; without a CUDA device, one `sdpa: skipped: ...` line, exit 0.
"""
import argparse
import statistics
import sys

SHAPES = {"gpt2-124m": (8, 1024, 12, 12, 64), "llama-1.1b": (4, 1024, 32, 8, 64)}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        ap.error("--repeats: 1 or more; --warmup: 0 or more")
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as ex:
        print(f"sdpa: skipped: torch does not import ({ex})")
        return 0
    if not torch.cuda.is_available():
        print("sdpa: skipped: no CUDA device")
        return 0
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    for name, (b, t, h, kv, d) in SHAPES.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
        k = torch.randn(b, kv, t, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
        v = torch.randn(b, kv, t, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
        dout = torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=gen)

        def attend():
            if kv == h:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            # grouped KV heads: each KV head serves h/kv query heads
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(h // kv, 1), v.repeat_interleave(h // kv, 1),
                is_causal=True)

        def timed(fn):
            times = []
            for i in range(args.warmup + args.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                if i >= args.warmup:
                    times.append(start.elapsed_time(end))
            return statistics.median(times)

        forward_ms = timed(lambda: attend())
        out = attend()

        def backward():
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        backward_ms = timed(backward)
        flops = 4.0 * b * h * t * t * d / 2.0
        for kind, ms, f in (("forward", forward_ms, flops), ("backward", backward_ms, 2.5 * flops)):
            print(f"sdpa_{kind}_tflops shape={name} dtype={args.dtype} B={b} T={t} H={h} "
                  f"KV={kv} D={d} median_ms={ms:.3f} tflops={f / (ms / 1e3) / 1e12:.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

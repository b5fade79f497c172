"""Eager overhead of the neuron device against CPU, measured in one run.

Small ops measure per-op latency (dispatch + aliasing + output adoption); large ops
measure throughput (the kernels are ATen's CPU kernels on device memory, so the ratio
shows what the device layer costs). Prints a table of neuron/CPU ratios.

    python benchmarks/eager_overhead.py [--repeat 5] [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SMALL_TARGET = 1.25
LARGE_TARGET = 1.02


def timeit(fn, iters: int, repeat: int) -> float:
    """Median seconds per call over `repeat` runs of `iters` calls."""
    for _ in range(max(1, iters // 10)):
        fn()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        runs.append((time.perf_counter() - t0) / iters)
    return statistics.median(runs)


def cases():
    g = torch.Generator().manual_seed(0)
    small = torch.randn(8, 8, generator=g)
    small_b = torch.randn(8, 8, generator=g)
    vec = torch.randn(64, generator=g)
    mm32 = torch.randn(2048, 2048, generator=g)
    mm16 = mm32.to(torch.bfloat16)
    big = torch.randn(64 * 2**20, generator=g)
    big_b = torch.randn(64 * 2**20, generator=g)
    return [
        # name, kind, make args, op, iters
        ("add 8x8", "small", (small, small_b), lambda a, b: a + b, 20000),
        ("mul_ 8x8 (in-place)", "small", (small, small_b), lambda a, b: a.mul_(1.0), 20000),
        ("mm 8x8", "small", (small, small_b), lambda a, b: a @ b, 20000),
        ("relu 64", "small", (vec,), lambda a: torch.relu(a), 20000),
        ("sum 64", "small", (vec,), lambda a: a.sum(), 20000),
        ("softmax 8x8", "small", (small,), lambda a: torch.softmax(a, -1), 20000),
        ("view+t 8x8", "small", (small,), lambda a: a.view(64).view(8, 8).t(), 20000),
        ("mm 2048^2 fp32", "large", (mm32, mm32), lambda a, b: a @ b, 3),
        ("mm 2048^2 bf16", "large", (mm16, mm16), lambda a, b: a @ b, 3),
        ("add 64M fp32", "large", (big, big_b), lambda a, b: a + b, 5),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per round (median)")
    ap.add_argument("--rounds", type=int, default=4, help="alternating CPU/neuron rounds (best)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; neuron = {torch.neuron.get_device_name()}")
    print(f"{'case':<22}{'cpu':>12}{'neuron':>12}{'ratio':>8}  target")
    for name, kind, cpu_args, op, iters in cases():
        dev_args = tuple(a.to("neuron") for a in cpu_args)
        # alternate CPU and neuron rounds so both see the same machine noise; best round each
        t_cpu = t_dev = float("inf")
        for _ in range(args.rounds):
            t_cpu = min(t_cpu, timeit(lambda: op(*cpu_args), iters, args.repeat))
            t_dev = min(t_dev, timeit(lambda: op(*dev_args), iters, args.repeat))
        ratio = t_dev / t_cpu
        target = SMALL_TARGET if kind == "small" else LARGE_TARGET
        unit, scale = ("us", 1e6) if kind == "small" else ("ms", 1e3)
        ok = "ok" if ratio <= target else "OVER"
        print(f"{name:<22}{t_cpu * scale:>10.2f}{unit}{t_dev * scale:>10.2f}{unit}{ratio:>8.3f}  <= {target} {ok}")
        rows.append({"case": name, "kind": kind, "cpu_s": t_cpu, "neuron_s": t_dev, "ratio": ratio, "target": target})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

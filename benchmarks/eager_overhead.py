"""Eager overhead of the neuron device against CPU, measured in one run.

Small ops measure per-op latency (dispatch + aliasing + output adoption); large ops
measure throughput (the kernels are ATen's CPU kernels on device memory, so the ratio
shows what the device layer costs). Prints a table of neuron/CPU ratios.

    python benchmarks/eager_overhead.py [--pairs 30] [--cases TEXT] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SMALL_TARGET = 1.10
LARGE_TARGET = 1.02


def run_time(fn, iters: int, clock) -> float:
    """Seconds per call over one run of `iters` calls."""
    t0 = clock()
    for _ in range(iters):
        fn()
    return (clock() - t0) / iters


def paired(cpu_fn, dev_fn, kind: str, iters: int, pairs: int) -> tuple[float, float, float]:
    """Median CPU time, median neuron time and median of the per-pair ratios.

    CPU and neuron runs alternate, a pair at a time, so both see the same machine noise,
    and the ratio of each pair is taken before the median: on a shared 2-core machine
    this is far steadier than comparing separately taken bests. Small ops are timed in
    thread CPU time (a run preempted by another process is not charged the wait); large
    ops in wall time (their kernels use every thread)."""
    clock = time.thread_time if kind == "small" else time.perf_counter
    t0 = time.perf_counter()
    cpu_fn(), dev_fn()
    first = (time.perf_counter() - t0) / 2
    if first > 0.5:  # bf16 matmuls on CPUs without native bf16 GEMMs take seconds
        iters, pairs = 1, max(2, min(pairs, int(30.0 / first)))
    for _ in range(max(0, iters // 10 - 1)):  # warm caches and the allocators
        cpu_fn(), dev_fn()
    cpu, dev, ratios = [], [], []
    for _ in range(pairs):
        c = run_time(cpu_fn, iters, clock)
        d = run_time(dev_fn, iters, clock)
        cpu.append(c), dev.append(d), ratios.append(d / c)
    return statistics.median(cpu), statistics.median(dev), statistics.median(ratios)


def cases():
    g = torch.Generator().manual_seed(0)
    tiny = torch.randn(16, generator=g)
    tiny_b = torch.randn(16, generator=g)
    small = torch.randn(8, 8, generator=g)
    small_b = torch.randn(8, 8, generator=g)
    vec = torch.randn(64, generator=g)
    mm32 = torch.randn(2048, 2048, generator=g)
    mm16 = mm32.to(torch.bfloat16)
    mm16_512 = mm32[:512, :512].to(torch.bfloat16)
    # A vocoder-sized 1-d convolution in bf16 (Conv1d, 256 channels, kernel 7).
    conv_x = torch.randn(4, 256, 2048, generator=g).to(torch.bfloat16)
    conv_w = (torch.randn(256, 256, 7, generator=g) / 40).to(torch.bfloat16)
    # One token through a linear layer (a decode step): the device's matrix-vector path.
    tok = torch.randn(1, 512, generator=g)
    w_up = torch.randn(1376, 512, generator=g)
    w_head = torch.randn(8000, 512, generator=g)
    big = torch.randn(64 * 2**20, generator=g)
    big_b = torch.randn(64 * 2**20, generator=g)
    return [
        # name, kind, make args, op, iters
        ("add 16 (sub-us)", "small", (tiny, tiny_b), lambda a, b: torch.add(a, b), 5000),
        ("add 8x8", "small", (small, small_b), lambda a, b: a + b, 2000),
        ("mul_ 8x8 (in-place)", "small", (small, small_b), lambda a, b: a.mul_(1.0), 2000),
        ("mm 8x8", "small", (small, small_b), lambda a, b: a @ b, 2000),
        ("relu 64", "small", (vec,), lambda a: torch.relu(a), 2000),
        ("sum 64", "small", (vec,), lambda a: a.sum(), 2000),
        ("softmax 8x8", "small", (small,), lambda a: torch.softmax(a, -1), 2000),
        ("view+t 8x8", "small", (small,), lambda a: a.view(64).view(8, 8).t(), 2000),
        ("mm 2048^2 fp32", "large", (mm32, mm32), lambda a, b: a @ b, 3),
        ("mm 2048^2 bf16", "large", (mm16, mm16), lambda a, b: a @ b, 3),
        ("mm 512^2 bf16", "large", (mm16_512, mm16_512), lambda a, b: a @ b, 10),
        ("conv1d 256ch bf16", "large", (conv_x, conv_w),
         lambda x, w: torch.nn.functional.conv1d(x, w, padding=3), 3),
        ("add 64M fp32", "large", (big, big_b), lambda a, b: a + b, 5),
        ("mv 1376x512 fp32", "large", (tok, w_up), lambda x, w: x @ w.t(), 200),
        ("mv 8000x512 fp32", "large", (tok, w_head), lambda x, w: x @ w.t(), 50),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=30, help="alternating CPU/neuron timed runs per case")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--cases", default="", help="only cases whose name contains this text")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; neuron = {torch.neuron.get_device_name()}")
    print(f"{'case':<22}{'cpu':>12}{'neuron':>12}{'ratio':>8}  target")
    for name, kind, cpu_args, op, iters in cases():
        if args.cases not in name:
            continue
        dev_args = tuple(a.to("neuron") for a in cpu_args)
        t_cpu, t_dev, ratio = paired(lambda: op(*cpu_args), lambda: op(*dev_args), kind, iters, args.pairs)
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

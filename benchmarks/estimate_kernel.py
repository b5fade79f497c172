"""make bench-estimate (second part): nki.estimate of a kernel of over 100k instructions — the shipped
tiled matmul of a [8192, 8192] by a [8192, 12288] fp32 matrix (64 x 24 blocks of 64 accumulated
matmuls) on trn2. Prints the instruction count, the time of the first call (trace, verify and model:
what a user waits for; the fastest of three, each tracing afresh) and of a later call (the engine model
on the traced program), and fails when the first call exceeds 2 s or the kernel has fewer than 100k
instructions (docs/estimate.md). The host's CPU is named: numbers from another machine are not comparable."""

from __future__ import annotations

import platform
import sys
import time

LIMIT_S = 2.0
REPEATS = 3


def main() -> int:
    import nki
    from torch_neuronx.kernels import nki_kernels as K

    m = k = 8192
    n = 12288
    args = (nki.TensorSpec((m, k), "float32"), nki.TensorSpec((k, n), "float32"))
    est = nki.estimate(K.matmul_kernel, platform="trn2")
    # A first call traces; the kernel's program cache is emptied before each, and the fastest of
    # REPEATS is the figure (this VM's speed moves by up to 2x between seconds; all are printed).
    firsts = []
    for _ in range(REPEATS):
        K.matmul_kernel._cache.clear()
        t0 = time.perf_counter()
        first = est(*args)
        firsts.append(time.perf_counter() - t0)
    t1 = time.perf_counter()
    report = est(*args)
    model_s = time.perf_counter() - t1
    counts = report.metrics
    instructions = sum(v for k, v in counts.items() if k.endswith("_instruction_count"))
    print(f"matmul [{m}, {k}] x [{k}, {n}] float32 on trn2: {instructions:,} instructions, estimated "
          f"{report.latency_us / 1e3:.1f} ms on one NeuronCore")
    print(f"first call (trace + verify + model): {min(firsts):.2f} s, the fastest of "
          f"{', '.join(f'{t:.2f}' for t in firsts)} s (limit {LIMIT_S:.0f} s); engine model alone: {model_s:.2f} s; "
          f"on {platform.processor() or platform.machine()}", flush=True)
    assert first.latency_us == report.latency_us, "the estimate is not deterministic"
    ok = min(firsts) <= LIMIT_S and instructions >= 100_000
    if not ok:
        print("bench-estimate (kernel): FAILED the limits", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

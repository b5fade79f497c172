"""make bench-estimate (second part): nki.estimate of a kernel of about 100k instructions — the shipped
tiled matmul at 8192 x 8192 x 8192 (fp32: 64 x 64 x 16 stationary/moving tiles) on trn2. Prints the
instruction count, the time to trace and verify it (first call) and the time the engine model takes on
its own (a second call, which reuses the traced program), and fails when the model exceeds 2 s
(docs/estimate.md). The host's CPU is named: numbers from another machine are not comparable."""

from __future__ import annotations

import platform
import sys
import time

LIMIT_S = 2.0


def main() -> int:
    import nki
    from torch_neuronx.kernels import nki_kernels as K

    n = 8192
    args = (nki.TensorSpec((n, n), "float32"), nki.TensorSpec((n, n), "float32"))
    est = nki.estimate(K.matmul_kernel, platform="trn2")
    t0 = time.perf_counter()
    first = est(*args)
    t1 = time.perf_counter()
    report = est(*args)
    t2 = time.perf_counter()
    counts = report.metrics
    instructions = sum(v for k, v in counts.items() if k.endswith("_instruction_count"))
    print(f"matmul {n}x{n}x{n} float32 on trn2: {instructions:,} instructions, estimated "
          f"{report.latency_us / 1e3:.1f} ms on one NeuronCore")
    print(f"trace + verify + model: {t1 - t0:.2f} s; engine model alone: {t2 - t1:.2f} s (limit {LIMIT_S:.0f} s) "
          f"on {platform.processor() or platform.machine()}")
    assert first.latency_us == report.latency_us, "the estimate is not deterministic"
    ok = (t2 - t1) <= LIMIT_S and instructions >= 90_000
    if not ok:
        print("bench-estimate (kernel): FAILED the limits", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

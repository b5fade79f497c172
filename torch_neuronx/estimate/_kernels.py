"""The time of one of our shipped NKI kernels (torch_neuronx/kernels/nki_kernels.py: matmul, softmax,
rmsnorm, flash attention forward and backward) at a shape: ``nki.estimate``'s engine model of the
kernel, traced at the shape or, for large shapes, at smaller probe shapes on the kernel's own tiling
and extrapolated. The step model costs matmuls, attention, norms and softmax with it (``kernel_cost``
in _costs.py). These are torch-neuronx's kernels, so this lives here and not in ``nki``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import nki
from nki._dtypes import itemsize, normalize_dtype
from torch_neuronx.estimate import _facts


@dataclass(frozen=True)
class KernelTime:
    seconds: float
    flops: float
    hbm_read_bytes: int
    hbm_write_bytes: int
    engines: dict
    bound: str
    instructions: int
    assumptions: tuple


_KERNELS = {"matmul": "matmul_kernel", "softmax": "softmax_kernel", "rmsnorm": "rmsnorm_kernel",
            "flash_attention_fwd": "flash_attention_fwd_kernel", "flash_attention_bwd": "flash_attention_bwd_kernel"}


def _shipped(name):
    if name not in _KERNELS:
        raise ValueError(f"unknown shipped kernel {name!r}; expected one of {', '.join(_KERNELS)}")
    from torch_neuronx.kernels import nki_kernels  # imports only nki

    return getattr(nki_kernels, _KERNELS[name])


def _platform(name) -> str:
    """The platform model's name of a chip ("gen3" -> "trn2"); ValueError if it has none."""
    try:
        return _facts._core().target_facts(str(name))["platform"]
    except ValueError:
        raise ValueError(f"unknown platform {name!r}: kernel_time models trn1 (gen2), inf2, trn2 (gen3) and trn3 "
                         "(gen4)") from None


def _run_shipped(name, shapes, dtype, platform, causal):
    specs = [nki.TensorSpec(tuple(s), "float32" if (name == "flash_attention_bwd" and i == 5) else dtype)
             for i, s in enumerate(shapes)]
    if name == "rmsnorm":
        args = specs + [1e-6]
    elif name.startswith("flash_attention"):
        args = specs + [1.0 / math.sqrt(shapes[0][-1]), causal]
    else:
        args = specs
    return nki.estimate(_shipped(name), platform=platform)(*args)


def _probe_sizes(full, small):
    """Two probe sizes below `full` (multiples of the kernel's tile) for a linear fit, or None to trace it
    whole."""
    if full <= 2 * small:
        return None
    return small, 2 * small


def _lin(x, x1, y1, x2, y2):
    return y1 + (y2 - y1) * (x - x1) / (x2 - x1)


@functools.lru_cache(maxsize=4096)
def _kernel_time(name, shapes, dtype, platform, causal) -> KernelTime:
    from torch_neuronx.kernels.nki_kernels import B_RESIDENT_BYTES

    tile = _facts._core().target_facts(platform)["partitions"]  # the kernels' row / key block (nl.tile_size.pmax)

    def up(x):
        return max(tile, -(-x // tile) * tile)

    notes = []
    if name == "matmul":
        (M, K), (_, N) = shapes
        size = itemsize(dtype)
        n_k = -(-K // tile)
        resident = n_k * N * size <= B_RESIDENT_BYTES

        def n_probe_ok(n):  # probes stay on the kernel's path (b resident in SBUF or not)
            return (n_k * n * size <= B_RESIDENT_BYTES) == resident

        pm = _probe_sizes(M, 2 * tile)
        n_small = 1024
        while not n_probe_ok(n_small) and n_small < N:
            n_small *= 2
        pn = _probe_sizes(N, n_small) if n_probe_ok(2 * n_small) else None
        ms = pm or (M,)
        ns = pn or (N,)
        runs = {(m, n): _run_shipped(name, ((m, K), (K, n)), dtype, platform, causal) for m in ms for n in ns}
        t = {key: r.latency_ns for key, r in runs.items()}
        if pm and pn:
            (m1, m2), (n1, n2) = pm, pn
            lo = _lin(M, m1, t[m1, n1], m2, t[m2, n1])
            hi = _lin(M, m1, t[m1, n2], m2, t[m2, n2])
            total = _lin(N, n1, lo, n2, hi)
        elif pm:
            total = _lin(M, pm[0], t[pm[0], N], pm[1], t[pm[1], N])
        elif pn:
            total = _lin(N, pn[0], t[M, pn[0]], pn[1], t[M, pn[1]])
        else:
            total = t[M, N]
        if pm or pn:
            notes.append(f"modelled at M in {ms}, N in {ns} and extrapolated linearly in the row / column blocks")
        ref = runs[ms[-1], ns[-1]]
        scale = (M * N) / (ms[-1] * ns[-1])
        flops = 2.0 * M * N * K
        rd = int(ref.metrics["hbm_read_bytes"] * scale)
        wr = M * N * size
    elif name in ("softmax", "rmsnorm"):
        (R, C) = shapes[0]
        pr = _probe_sizes(R, 2 * tile)
        rs = pr or (R,)
        runs = {r: _run_shipped(name, ((r, C),) + tuple(shapes[1:]), dtype, platform, causal) for r in rs}
        total = _lin(R, pr[0], runs[pr[0]].latency_ns, pr[1], runs[pr[1]].latency_ns) if pr else runs[R].latency_ns
        if pr:
            notes.append(f"modelled at {rs} rows and extrapolated linearly")
        ref = runs[rs[-1]]
        scale = R / rs[-1]
        flops = 0.0
        rd = int(ref.metrics["hbm_read_bytes"] * scale)
        wr = int(ref.metrics["hbm_write_bytes"] * scale)
    elif name in ("flash_attention_fwd", "flash_attention_bwd"):
        BH, S, D = shapes[0]
        Sk = shapes[1][1]
        longest = max(S, Sk)
        if longest <= 8 * tile:
            lams = (1.0,)
        else:  # 3 probes with S and Sk scaled together: blocks grow quadratically
            lams = tuple(x * tile / longest for x in (2, 4, 8))

        def at(bh, lam):
            s, sk = up(int(S * lam)), up(int(Sk * lam))
            shp = [(bh, s, D), (bh, sk, D), (bh, sk, D)]
            if name == "flash_attention_bwd":
                shp += [(bh, s, D), (bh, s, D), (bh, s)]
            return _run_shipped(name, tuple(shp), dtype, platform, causal)

        one = [at(1, lam).latency_ns for lam in lams]
        if len(lams) == 1:
            per_head = one[0]
        else:  # quadratic through the three probes, evaluated at the full length
            (x1, x2, x3), (y1, y2, y3) = lams, one
            per_head = (y1 * (1 - x2) * (1 - x3) / ((x1 - x2) * (x1 - x3)) + y2 * (1 - x1) * (1 - x3) /
                        ((x2 - x1) * (x2 - x3)) + y3 * (1 - x1) * (1 - x2) / ((x3 - x1) * (x3 - x2)))
            notes.append(f"modelled at sequence lengths x{lams} of ({S}, {Sk}) and fitted quadratically")
        total = per_head
        if BH > 1:  # heads overlap at their boundaries: the increment of a second head, per head
            two = at(2, lams[-1]).latency_ns
            total = per_head * (1 + (BH - 1) * (two - one[-1]) / one[-1])
            notes.append(f"{BH} heads from the increment of a second head at the largest probe")
        ref = at(1, lams[-1])
        scale = BH / (lams[-1] ** 2)
        pairs = S * Sk / (2 if causal else 1)
        flops = BH * pairs * D * 2.0 * (2 if name == "flash_attention_fwd" else 5)
        rd = int(ref.metrics["hbm_read_bytes"] * scale)
        wr = int(ref.metrics["hbm_write_bytes"] * BH / lams[-1])
    else:  # pragma: no cover (checked by _shipped)
        raise AssertionError(name)
    return KernelTime(seconds=total * 1e-9, flops=flops, hbm_read_bytes=rd, hbm_write_bytes=wr,
                      engines={e: v["active_time_percent"] for e, v in ref.engines.items()}, bound=ref.bound,
                      instructions=sum(v["instruction_count"] for v in ref.engines.values()),
                      assumptions=ref.assumptions + tuple(notes))


def kernel_time(kernel: str, shapes, dtype: str = "bfloat16", platform: str = "trn2", causal: bool = False
                ) -> KernelTime:
    """The estimated time of one of torch-neuronx's shipped NKI kernels (torch_neuronx/kernels/
    nki_kernels.py) at the given tensor-argument shapes, on one NeuronCore of `platform`. Cached."""
    _shipped(kernel)
    plat = _platform(platform)
    dt = normalize_dtype(dtype)
    shp = tuple(tuple(int(d) for d in s) for s in shapes)
    return _kernel_time(kernel, shp, dt, plat, bool(causal))

"""Element-wise ops and reductions, costed by the engine model too: small NKI kernels that stream a
[rows, cols] tensor through SBUF one tile of partitions (128 rows) at a time (DMA in, one VectorE /
ScalarE instruction per input tile, DMA out) are modelled by ``nki.estimate`` at two sizes, giving a
fixed time and a time per element for each (platform, dtype, kind). An op of N elements costs fixed + N x
per-element: the engine rates, VectorE's performance mode, DMA and HBM limits and their overlap are the
engine model's."""

from __future__ import annotations

import functools

import nki
import nki.isa as nisa
import nki.language as nl
from torch_neuronx.estimate import _facts

COLS = 2048  # free size of one tile: 4-8 KiB per partition, as a streaming kernel uses


@nki.jit
def _unary(x):
    """VectorE: one tensor input (tensor_scalar), e.g. x * c, x + c, casts."""
    R, C = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        t = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + P, :])
        y = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[r0:r0 + P, :], src=y)
    return out


@nki.jit
def _binary(x, z):
    """VectorE: two tensor inputs (tensor_tensor), e.g. x + y, x * y."""
    R, C = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        t = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        u = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + P, :])
        nisa.dma_copy(dst=u, src=z[r0:r0 + P, :])
        y = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=t, data2=u, op=nl.add)
        nisa.dma_copy(dst=out[r0:r0 + P, :], src=y)
    return out


@nki.jit
def _activation(x):
    """ScalarE: a transcendental function (exp, silu, rsqrt, ...) of one input."""
    R, C = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        t = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + P, :])
        y = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.exp, data=t)
        nisa.dma_copy(dst=out[r0:r0 + P, :], src=y)
    return out


@nki.jit
def _reduce(x):
    """VectorE: a reduction along the free axis."""
    R, C = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((R, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        t = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + P, :])
        y = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=y, op=nl.add, data=t, axis=1)
        nisa.dma_copy(dst=out[r0:r0 + P, :], src=y)
    return out


_KERNELS = {"unary": (_unary, 1), "binary": (_binary, 2), "activation": (_activation, 1), "reduce": (_reduce, 1)}


@nki.jit
def _chain(x, kind, n):
    """One tile of x in SBUF, ``n`` dependent instructions of ``kind`` on it, one store: the inside of a
    fused element-wise kernel, whose intermediates never leave SBUF."""
    R, C = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        t = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + P, :])
        for _ in range(n):
            y = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
            if kind == "activation":
                nisa.activation(dst=y, op=nl.exp, data=t)
            elif kind == "binary":
                nisa.tensor_tensor(dst=y, data1=t, data2=t, op=nl.add)
            elif kind == "reduce":
                y = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=y, op=nl.add, data=t, axis=1)
                continue
            else:
                nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=2.0)
            t = y
        nisa.dma_copy(dst=out[r0:r0 + P, :], src=t)
    return out


@functools.lru_cache(maxsize=None)
def rate(kind: str, dtype: str, platform: str) -> tuple[float, float]:
    """(fixed seconds, seconds per element) on one NeuronCore, from the engine model at 2 and 8 tiles."""
    kernel, n_inputs = _KERNELS[kind]
    P = _facts.chip(platform)["partitions"]  # the kernels' tile rows (nl.tile_size.pmax)
    times = {}
    for tiles in (2, 8):
        spec = nki.TensorSpec((tiles * P, COLS), dtype)
        times[tiles] = nki.estimate(kernel, platform=platform)(*([spec] * n_inputs)).latency_us * 1e-6
    per_element = (times[8] - times[2]) / (6 * P * COLS)
    return max(0.0, times[2] - 2 * P * COLS * per_element), per_element


@functools.lru_cache(maxsize=None)
def engine_rate(kind: str, dtype: str, platform: str) -> float:
    """Seconds per element of one instruction of ``kind`` on data already in SBUF (one NeuronCore): what
    each op of a fused element-wise kernel adds to its engine's time. From the engine model: a tile
    through 4 and through 8 dependent instructions, the difference per instruction and element."""
    P = _facts.chip(platform)["partitions"]
    spec = nki.TensorSpec((8 * P, COLS), dtype)
    t = {n: nki.estimate(_chain, platform=platform)(spec, kind, n).latency_us * 1e-6 for n in (4, 8)}
    return max(0.0, (t[8] - t[4]) / (4 * 8 * P * COLS))

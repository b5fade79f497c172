"""Comparing results on ``neuron`` with the same computation on CPU.

One place for the tolerances, the tree walk and the exact CPU copies used by the
coverage sweeps, ``torch_neuronx.check`` and the tests: outputs may be tensors or any
nesting of tuples, lists, dicts and Hugging Face ``ModelOutput`` objects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

# (rtol, atol) for one op, as torch.testing.assert_close uses by default.
_OP_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def op_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing one op's result in ``dtype`` with CPU; exact for integers and bool."""
    return _OP_TOLERANCES.get(dtype, (0.0, 0.0))


def model_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for a whole model's outputs or gradients: rounding differences of a few
    ulps (a different attention or reduction kernel) grow through the layers."""
    if dtype in (torch.float16, torch.bfloat16):
        return (5e-2, 5e-2)
    if dtype in (torch.float32, torch.complex64):
        return (1e-4, 1e-4)
    return op_tolerance(dtype)


@dataclass
class Diff:
    """Largest difference between two results. ``ok`` is False on any mismatch, including
    a structural one (types, shapes, dtypes, devices not as expected)."""

    ok: bool = True
    max_abs: float = 0.0
    max_rel: float = 0.0
    where: str = ""  # path of the worst leaf, e.g. "logits" or "[1].grad"
    message: str = ""  # the first structural problem or the worst numeric mismatch
    compared: int = 0  # tensor leaves compared
    mismatched: list[str] = field(default_factory=list)

    def _fail(self, path: str, message: str) -> None:
        if self.ok:
            self.message = f"{path or 'result'}: {message}"
        self.ok = False
        self.mismatched.append(path or "result")

    def summary(self) -> str:
        if self.ok:
            return f"ok ({self.compared} tensors, max abs diff {self.max_abs:.3g})"
        return self.message


class UnsupportedLayout(Exception):
    """A tensor the device does not take by design (sparse, quantized, nested)."""


def _is_neuron_device(v: Any) -> bool:
    return (isinstance(v, str) and v.split(":")[0] == "neuron") or (isinstance(v, torch.device) and v.type == "neuron")


class CPUCopy:
    """Copies arguments made on ``neuron`` to CPU with the exact storage layout (storage
    size, offset, strides, conj/neg bits); tensors sharing a storage share the copy, so
    aliasing between arguments is kept (``tensor.cpu()`` keeps none of this). Device
    arguments become ``cpu``. One instance per set of arguments that may alias."""

    def __init__(self) -> None:
        self._storages: dict[int, torch.Tensor] = {}

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise UnsupportedLayout(f"{t.layout} tensors")
        with torch.no_grad():
            st = t.untyped_storage()
            key = st._cdata  # the StorageImpl: equal for every tensor over this storage
            raw = self._storages.get(key)
            if raw is None:
                raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(st).to("cpu", copy=True)
                self._storages[key] = raw
            c = torch.empty(0, dtype=t.dtype).set_(raw.untyped_storage(), t.storage_offset(), t.size(), t.stride())
            if t.is_conj():
                c = c.conj()
            if t.is_neg():
                c = c._neg_view()
        if t.requires_grad:
            c.requires_grad_(True)
        return c

    def __call__(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self(v) for v in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self(v) for v in obj)
        if isinstance(obj, dict):
            return {k: self(v) for k, v in obj.items()}
        if _is_neuron_device(obj):
            return "cpu" if isinstance(obj, str) else torch.device("cpu")
        return obj


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor moved to CPU (structure kept)."""
    return map_tensors(obj, lambda t: t.detach().cpu())


def to_device(obj: Any, device: torch.device | str) -> Any:
    """``obj`` with every tensor moved to ``device`` (structure kept)."""
    return map_tensors(obj, lambda t: t.to(device))


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor in it (tuples, named tuples, lists, dicts
    and ``ModelOutput`` kept as they are)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple (torch.return_types)
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn) for k, v in obj.items()}
        if type(obj) is dict:
            return items
        try:  # ModelOutput and other dataclass-like mappings
            return type(obj)(**items)
        except TypeError:
            return items
    return obj


def tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in ``obj`` (nested sequences and mappings), in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in tensors(v)]
    return []


def compare(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    tolerance: Callable[[torch.dtype], tuple[float, float]] = op_tolerance,
    device_type: str | None = "neuron",
    equal_nan: bool = True,
    values: bool = True,
) -> Diff:
    """Compare ``actual`` (computed on ``device_type``) with ``expected`` (computed on CPU).

    Tensor leaves must match in shape and dtype; when ``device_type`` is given, each
    tensor of ``actual`` must live on that device type (a result that silently came
    back on the CPU is a mismatch). Values are compared with ``rtol``/``atol``, or the
    tolerance the dtype gets from ``tolerance``; ``values=False`` compares only that
    metadata (for uninitialized outputs such as ``torch.empty``). Non-tensor leaves must
    be equal (floats within the same tolerance).
    """
    diff = Diff()
    _walk(actual, expected, "", diff, _Options(rtol, atol, tolerance, device_type, equal_nan, values))
    return diff


@dataclass(frozen=True)
class _Options:
    rtol: float | None
    atol: float | None
    tolerance: Callable[[torch.dtype], tuple[float, float]]
    device_type: str | None
    equal_nan: bool
    values: bool

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        r, t = self.tolerance(dtype)
        return (r if self.rtol is None else self.rtol), (t if self.atol is None else self.atol)


def _walk(a, e, path: str, diff: Diff, o: _Options) -> None:
    if isinstance(e, torch.Tensor):
        if not isinstance(a, torch.Tensor):
            diff._fail(path, f"expected a tensor, got {type(a).__name__}")
            return
        _compare_tensor(a, e, path, diff, o)
        return
    if isinstance(e, Mapping):
        if not isinstance(a, Mapping):
            diff._fail(path, f"expected a mapping, got {type(a).__name__}")
            return
        if set(a.keys()) != set(e.keys()):
            diff._fail(path, f"keys differ: {sorted(map(str, a.keys()))} vs {sorted(map(str, e.keys()))}")
            return
        for k in e.keys():
            _walk(a[k], e[k], f"{path}.{k}" if path else str(k), diff, o)
        return
    if isinstance(e, (list, tuple)):
        if not isinstance(a, (list, tuple)) or len(a) != len(e):
            diff._fail(path, f"expected a sequence of {len(e)}, got {type(a).__name__}"
                       + (f" of {len(a)}" if isinstance(a, (list, tuple)) else ""))
            return
        for i, (x, y) in enumerate(zip(a, e)):
            _walk(x, y, f"{path}[{i}]", diff, o)
        return
    if isinstance(e, float) and isinstance(a, (float, int)):
        if math.isnan(e) and math.isnan(a) and o.equal_nan:
            return
        r, t = o.tolerances(torch.float64)
        if abs(a - e) > t + r * abs(e) and not (math.isinf(a) and a == e):
            diff._fail(path, f"{a!r} != {e!r}")
        return
    if isinstance(e, (bool, int, str, type(None), torch.dtype, torch.Size)):
        if a != e:
            diff._fail(path, f"{a!r} != {e!r}")
        return
    # Other objects (key-value caches, configs) are not compared.


def _compare_tensor(a, e, path: str, diff: Diff, o: _Options) -> None:
    if o.device_type is not None and a.device.type != o.device_type:
        diff._fail(path, f"result is on {a.device}, expected a {o.device_type} tensor")
        return
    if a.dtype != e.dtype:
        diff._fail(path, f"dtype {a.dtype} != {e.dtype}")
        return
    if a.shape != e.shape:
        diff._fail(path, f"shape {tuple(a.shape)} != {tuple(e.shape)}")
        return
    if a.layout != e.layout or a.is_quantized or e.is_quantized:
        diff._fail(path, f"layout {a.layout} vs {e.layout}")
        return
    diff.compared += 1
    if not o.values:
        return
    a = a.detach().cpu().resolve_conj().resolve_neg()
    e = e.detach().resolve_conj().resolve_neg()
    if a.numel() == 0:
        return
    r, t = o.tolerances(e.dtype)
    if e.dtype == torch.bool or not (e.is_floating_point() or e.is_complex()):
        neq = a != e
        if bool(neq.any()):
            bad = int(neq.sum())
            ae = (a.to(torch.float64) - e.to(torch.float64)).abs().max().item() if e.dtype != torch.bool else 1.0
            diff.max_abs = max(diff.max_abs, ae)
            diff._fail(path, f"{bad} of {e.numel()} elements differ (exact dtype {e.dtype})")
        return
    wide = torch.complex128 if e.is_complex() else torch.float64
    a64, e64 = a.to(wide), e.to(wide)
    both_nan = a64.isnan() & e64.isnan() if o.equal_nan else torch.zeros_like(a64, dtype=torch.bool)
    same_inf = (a64 == e64) & a64.isinf()
    absdiff = (a64 - e64).abs()
    absdiff = torch.where(both_nan | same_inf, torch.zeros_like(absdiff), absdiff)
    absdiff = torch.where(absdiff.isnan(), torch.full_like(absdiff, math.inf), absdiff)  # nan vs number
    bad = absdiff > (t + r * e64.abs())
    max_abs = float(absdiff.max())
    denom = e64.abs().clamp_min(1e-30)
    max_rel = float((absdiff / denom).max())
    if max_abs > diff.max_abs:
        diff.max_abs = max_abs
        if diff.ok:
            diff.where = path
    diff.max_rel = max(diff.max_rel, max_rel)
    if bool(bad.any()):
        diff._fail(path, f"{int(bad.sum())} of {e.numel()} elements differ; max abs diff {max_abs:.3g} "
                   f"(rtol={r:g}, atol={t:g}, dtype {e.dtype})")


def compare_with_float64(actual: Any, expected: Any, reference: Any, *, multiplier: float = 2.0) -> Diff:
    """Whether ``actual`` (computed on the device) is as accurate as ``expected`` (the same
    computation on CPU, in the same dtype), judged against ``reference`` (the computation in
    float64 on CPU).

    A fixed tolerance cannot know how ill-conditioned a computation is: a deep network with
    large activations cancelling in its gradients can leave two correct float32 results
    further apart than any sensible tolerance. Which one is wrong is then decided by float64,
    as PyTorch's own accuracy checks decide it (``torch._dynamo.utils.same`` with
    ``fp64_ref``): for every floating leaf, the device's root-mean-square error against
    float64 may be at most ``multiplier`` times CPU's (1.5 times that for 16-bit dtypes, 2.5
    times for tensors of at most 500 elements, whose errors are noisier), and its largest
    error twice that, so that one wrong element is not averaged away; each plus a tenth of the
    dtype's absolute tolerance (``model_tolerance``). The structure must match as ``compare``
    requires it; other leaves must be equal; non-finite values must sit where CPU has them."""
    diff = compare(actual, expected, values=False)
    if not diff.ok:
        return diff
    leaves = tensors(actual), tensors(expected), tensors(reference)
    if len(leaves[2]) != len(leaves[1]):
        diff._fail("", f"the float64 reference has {len(leaves[2])} tensors, CPU {len(leaves[1])}")
        return diff
    for i, (a, e, r) in enumerate(zip(*leaves)):
        a = a.detach().cpu()
        where = f"tensor {i} ({e.dtype}, {tuple(e.shape)})"
        if not (e.is_floating_point() or e.is_complex()):
            if not torch.equal(a, e):
                diff._fail(where, "differs from CPU")
            continue
        if r.shape != e.shape:
            diff._fail(where, f"the float64 reference has shape {tuple(r.shape)}")
            continue
        wide = torch.complex128 if e.is_complex() else torch.float64
        a64, e64, r64 = a.to(wide), e.detach().to(wide), r.detach().to(wide)
        if not torch.equal(a64.isfinite(), e64.isfinite()):
            diff._fail(where, "non-finite where CPU is finite, or the reverse")
            continue
        keep = a64.isfinite() & r64.isfinite()
        if not bool(keep.any()):
            continue
        err_a, err_e = (a64 - r64)[keep].abs(), (e64 - r64)[keep].abs()
        m = multiplier * (1.5 if e.element_size() <= 2 else 1.0) * (2.5 if e.numel() <= 500 else 1.0)
        floor = model_tolerance(e.dtype)[1] / 10
        for name, da, de, bound in (("RMS", err_a.pow(2).mean().sqrt(), err_e.pow(2).mean().sqrt(), m),
                                    ("largest", err_a.max(), err_e.max(), 2 * m)):
            da, de = float(da), float(de)
            if name == "largest" and da > diff.max_abs:
                diff.max_abs, diff.where = da, where
            if da > bound * de + floor:
                diff._fail(where, f"{name} error against float64 {da:.3g}, CPU's {de:.3g}")
    return diff

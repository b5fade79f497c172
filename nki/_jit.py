"""``nki.jit`` and ``nki.simulate``: trace once per signature, verify, run in C++.

A call is keyed by its tensors' shapes and dtypes, its other arguments, the target (trn1 /
inf2 / trn2 / trn3) and the launch grid. The first call with a key traces the kernel (Python
runs the body, recording instructions), the verifier checks the program against the target's
limits, and the program is cached: later calls only bind memory and run C++.

Tensors may be numpy arrays (host memory), CPU torch tensors, or ``neuron`` torch tensors
(device memory, used in place: no copies). Outputs are allocated where the inputs live.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import threading
from dataclasses import dataclass

from ._trace import (MemoryRegion, NKIObject, NkiTensor, NkiValidationError, Trace, _core, normalize_dtype,
                     set_current, tensors_in, tracing)

from ._dtypes import NUMPY_DTYPES as _NUMPY_DTYPES
from ._dtypes import numpy_dtype as _numpy_dtype
from ._dtypes import torch_dtype as _torch_dtype


def _target_from_env() -> str:
    """The NeuronCore generation kernels are traced for: AWS's NEURON_PLATFORM_TARGET_OVERRIDE if
    set, else the simulated device's NEURON_PLATFORM (default trn2). The platform model parses both
    (trn1 / inf2 / trn2 / trn3, or gen2 / gen3 / gen4); an unknown name raises ValueError."""
    return _core.target_from_env()


# ---- arguments -------------------------------------------------------------------------------
@dataclass
class _Arg:
    """A tensor argument: its NKI dtype, shape, where it lives, and how to get its address."""

    value: object
    kind: str  # "numpy" | "torch"
    dtype: str
    shape: tuple

    @property
    def device(self):
        return self.value.device if self.kind == "torch" else None


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument by shape and NKI dtype only, for nki.estimate / nki.benchmark: traced and
    modelled, never run."""

    shape: tuple
    dtype: str


def _classify(x):
    if isinstance(x, TensorSpec):
        return _Arg(x, "spec", x.dtype, tuple(x.shape))
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None
    if np is not None and isinstance(x, np.ndarray):
        name = x.dtype.name
        if name not in _NUMPY_DTYPES:
            raise TypeError(f"numpy arrays of dtype {name} cannot be passed to an NKI kernel; NKI has no 64-bit "
                            "types: convert to float32/int32 first")
        return _Arg(x, "numpy", _NUMPY_DTYPES[name], tuple(x.shape))
    # A torch tensor means torch is loaded: `import nki` and numpy kernels never load it.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        try:
            dt = normalize_dtype(x.dtype)
        except TypeError:
            raise TypeError(f"torch tensors of dtype {x.dtype} cannot be passed to an NKI kernel; NKI has no 64-bit "
                            "types: convert to float32/bfloat16/int32 first") from None
        if x.device.type not in ("cpu", "neuron"):
            raise ValueError(f"NKI kernels run on neuron (or CPU) tensors, got a tensor on {x.device}")
        return _Arg(x, "torch", dt, tuple(x.shape))
    return None


def _static_key(x):
    if isinstance(x, (tuple, list)):
        return (type(x).__name__,) + tuple(_static_key(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple(sorted((k, _static_key(v)) for k, v in x.items()))
    if (isinstance(x, NKIObject) or dataclasses.is_dataclass(x)) and not isinstance(x, type) and hasattr(x, "__dict__"):
        # Configuration objects specialize the kernel by value, not identity.
        return (type(x).__qualname__,) + tuple(sorted((k, _static_key(v)) for k, v in vars(x).items()))
    try:
        hash(x)
        return (type(x).__name__, x)
    except TypeError:
        return (type(x).__name__, repr(x))


# ---- compiled instances ------------------------------------------------------------------------
@dataclass
class _Compiled:
    programs: list           # one C++ Program per SPMD instance
    outputs: list            # (shape, dtype) per output slot
    structure: object        # how the kernel returned its outputs: None, "single", or a tuple length
    num_inputs: int
    constants: list          # per program: the nl.shared_constant arrays bound after the outputs
    scratch: list            # per program: bytes of each shared-HBM tensor it allocates, bound after those
    share_scratch: bool      # the programs allocate the same shared-HBM tensors: one copy serves them all


class Kernel:
    """A ``@nki.jit`` kernel. ``kernel(*args)`` runs it; ``kernel[grid]`` launches an SPMD grid
    (``kernel[2]``: two programs, as on a logical NeuronCore of two physical cores)."""

    def __init__(self, func, **options):
        functools.update_wrapper(self, func)
        self.func = func
        self.options = options
        self._cache: dict = {}
        self._lock = threading.Lock()

    def __getitem__(self, grid) -> "_Launch":
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        if not grid or not all(isinstance(g, int) and g >= 1 for g in grid):
            raise ValueError(f"launch grid must be positive ints, got {grid!r}")
        return _Launch(self, grid)

    def __call__(self, *args, **kwargs):
        return _Launch(self, ())(*args, **kwargs)

    def with_schedule(self, edges) -> "Kernel":
        return self  # scheduling hints do not change results

    # The cached program for a signature, tracing it on first use.
    def _compiled(self, args, kwargs, grid, target) -> tuple[_Compiled, list]:
        tensors = []
        key = [target, grid]
        for a in list(args) + list(kwargs.values()):
            c = _classify(a)
            if c is not None:
                tensors.append(c)
                key.append(("T", c.shape, c.dtype))
            else:
                key.append(_static_key(a))
        key.append(tuple(kwargs))
        key = tuple(key)
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is None:
                compiled = self._trace(args, kwargs, grid, target)
                self._cache[key] = compiled
        return compiled, tensors

    def _trace(self, args, kwargs, grid, target) -> _Compiled:
        instances = [()] if not grid else list(_grid_points(grid))
        programs, outputs, structure, constants, scratch = [], None, None, [], []
        for pid in instances:
            trace = Trace(target, pid, grid)
            prev = set_current(trace)
            try:
                slot = 0
                in_buffer = MemoryRegion.shared_hbm if grid else MemoryRegion.private_hbm

                input_slot = {}  # tensor id -> argument slot

                def wrap(x, name):
                    nonlocal slot
                    c = _classify(x)
                    if c is None:
                        return x
                    t = NkiTensor.declare(c.shape, c.dtype, in_buffer, name, external=slot)
                    input_slot[t._tid] = slot
                    slot += 1
                    return t

                names = _param_names(self.func, len(args))
                targs = [wrap(a, n) for a, n in zip(args, names)]
                tkw = {k: wrap(v, k) for k, v in kwargs.items()}
                n_in = slot
                ret = self.func(*targs, **tkw)
            finally:
                set_current(prev)
            outs = tensors_in(ret)
            if ret is not None and not isinstance(ret, (NkiTensor, tuple, list)):
                raise TypeError(f"an NKI kernel returns tensors (or a tuple of them), got {type(ret).__name__}")
            inst_outputs = []
            for j, o in enumerate(outs):
                if o._tid in input_slot and o.shape == o._base_shape and o.offset == 0:
                    # A kernel that wrote a tensor argument may return it: the caller gets the argument.
                    inst_outputs.append(("input", input_slot[o._tid]))
                    continue
                if o.buffer is not MemoryRegion.shared_hbm:
                    raise NkiValidationError(
                        f"kernel output {j} ({o.name or 'unnamed'}, {o.shape}) is in {o.buffer!r}; kernel outputs "
                        "are allocated with nl.ndarray(..., buffer=nl.shared_hbm)", "kernel-output",
                        *trace.decl_loc.get(o._tid, ("", 0)))
                # A reshape of the whole tensor is the tensor (same bytes, in order); other views are not.
                if o.offset != 0 or o.size != math.prod(o._base_shape) or not o.is_contiguous():
                    raise NkiValidationError(f"kernel output {j} is a view {o.shape} of a tensor {o._base_shape}; "
                                             "return the whole tensor (or a reshape of it)", "kernel-output",
                                             *trace.decl_loc.get(o._tid, ("", 0)))
                trace.builder.set_external(o._tid, n_in + j)
                inst_outputs.append((o.shape, o.dtype))
            if outputs is None:
                outputs = inst_outputs
                structure = None if ret is None else ("single" if isinstance(ret, NkiTensor) else len(outs))
            elif inst_outputs != outputs:
                raise NkiValidationError("SPMD programs of one launch return different outputs "
                                         f"({outputs} vs {inst_outputs})", "kernel-output")
            for c, (tid, _) in enumerate(trace.constants):
                trace.builder.set_external(tid, n_in + len(outs) + c)
            constants.append([data for _, data in trace.constants])
            # Shared HBM is one memory for the programs of a launch (the cores of a logical
            # NeuronCore): each shared-HBM tensor a program allocates is bound at run time.
            taken = {o._tid for o in outs} | {tid for tid, _ in trace.constants}
            own = [(tid, n) for tid, n in trace.shared if tid not in taken]
            for k, (tid, _) in enumerate(own):
                trace.builder.set_external(tid, n_in + len(outs) + len(trace.constants) + k)
            scratch.append([n for _, n in own])
            programs.append(trace.builder.build(NkiValidationError))
        # Programs that allocate the same shared tensors (the usual SPMD kernel) share them.
        share = all(s == scratch[0] for s in scratch)
        return _Compiled(programs, outputs, structure, n_in, constants, scratch, share)


def _grid_points(grid):
    for flat in range(math.prod(grid)):
        pid, rem = [], flat
        for g in reversed(grid):
            pid.append(rem % g)
            rem //= g
        yield tuple(reversed(pid))


def _param_names(func, n):
    code = getattr(func, "__code__", None)
    names = list(code.co_varnames[:code.co_argcount]) if code is not None else []
    return (names + [f"arg{i}" for i in range(len(names), n)])[:n]


class _Launch:
    def __init__(self, kernel: Kernel, grid: tuple):
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args, **kwargs):
        if tracing():  # a kernel called from a kernel being traced is part of it (inlined)
            return self.kernel.func(*args, **kwargs)
        target = _target_from_env()
        compiled, tensors = self.kernel._compiled(args, kwargs, self.grid, target)
        return _run(compiled, tensors)


def _run(compiled: _Compiled, tensors: list):
    import numpy as np

    kinds = {t.kind for t in tensors}
    if len(kinds) > 1:
        raise TypeError("an NKI kernel takes either numpy arrays or torch tensors, not both")
    kind = kinds.pop() if kinds else "numpy"
    addresses, keep, writeback = [], [], []
    device = None
    if kind == "torch":
        import torch

        devices = {t.value.device for t in tensors}
        if len(devices) > 1:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                               + " and ".join(sorted(str(d) for d in devices)) + " (NKI kernel arguments)")
        device = devices.pop() if devices else torch.device("cpu")
        if _symbolic(tensors):
            # FakeTensorMode (torch.compile, a custom op's fake implementation): the kernel is
            # traced and verified; results have its output shapes and are never computed.
            outs = [tensors[dtype].value if shape == "input" else
                    torch.empty(shape, dtype=_torch_dtype(dtype), device=device) for shape, dtype in compiled.outputs]
            return _structured(compiled, outs)
        for t in tensors:
            x = t.value
            if not x.is_contiguous():
                c = x.contiguous()
                writeback.append((x, c))
                x = c
            keep.append(x)
            addresses.append(x.data_ptr())
        outs = []
        for shape, dtype in compiled.outputs:
            if shape == "input":  # the argument itself (written in place); its slot address is unused
                outs.append(tensors[dtype].value)
                addresses.append(addresses[dtype])
                continue
            outs.append(torch.empty(shape, dtype=_torch_dtype(dtype), device=device))
            o = outs[-1]
            addresses.append(o.data_ptr())
        if device.type == "neuron":
            torch.neuron.synchronize(device)
    else:
        for t in tensors:
            x = t.value
            if not x.flags.c_contiguous or not x.flags.writeable:
                c = np.ascontiguousarray(x).copy()
                if x.flags.writeable:
                    writeback.append((x, c))
                x = c
            keep.append(x)
            addresses.append(x.ctypes.data)
        outs = []
        for shape, dtype in compiled.outputs:
            if shape == "input":
                outs.append(tensors[dtype].value)
                addresses.append(addresses[dtype])
                continue
            o = np.empty(shape, dtype=_numpy_dtype(dtype))
            outs.append(o)
            addresses.append(o.ctypes.data)
    # Per run: a fresh copy of each constant (a kernel that writes one does not change the next
    # run) and fresh shared-HBM scratch, one set for the launch when its programs share it.
    fresh, per_program = [], []
    shared = [np.zeros(n, np.uint8) for n in compiled.scratch[0]] if compiled.share_scratch else None
    for consts, sizes in zip(compiled.constants, compiled.scratch):
        mine = [c.copy() for c in consts] + (shared if shared is not None else [np.zeros(n, np.uint8) for n in sizes])
        fresh.append(mine)
        per_program.append(addresses + [m.ctypes.data for m in mine])
    _core.run_launch(compiled.programs, per_program)
    for orig, c in writeback:
        orig[...] = c
    return _structured(compiled, outs)


def _structured(compiled: _Compiled, outs: list):
    if compiled.structure is None:
        return None
    if compiled.structure == "single":
        return outs[0]
    return tuple(outs)


def _symbolic(tensors) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return any(t.value.is_meta or is_fake(t.value) for t in tensors)


def jit(func=None, **options):
    """``@nki.jit`` / ``@nki.jit(...)``: make ``func`` an NKI kernel. ``mode=`` is accepted and
    ignored (as in NKI 0.3+); ``platform_target=`` was removed from NKI and is refused."""
    if "platform_target" in options:
        raise TypeError("nki.jit(platform_target=...) was removed in NKI 0.3; set NEURON_PLATFORM_TARGET_OVERRIDE "
                        "(trn1 / inf2 / trn2 / trn3) instead")
    if func is None:
        return lambda f: Kernel(f, **options)
    return Kernel(func, **options)


def simulate(kernel):
    """``nki.simulate(kernel)(*numpy_arrays)``: run a kernel on the simulator, returning numpy
    arrays. A plain function is wrapped with ``nki.jit`` first; ``kernel[2]`` launches work too."""
    if isinstance(kernel, (Kernel, _Launch)):
        return kernel
    return Kernel(kernel)

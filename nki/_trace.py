"""Tracing: the kernel body runs once per signature and records into a C++ KernelBuilder.

``NkiTensor`` is a strided view of a declared tensor (HBM, SBUF or PSUM). Views are pure
metadata, computed here; instructions are recorded with the view's access pattern and the
kernel source line that issued them, which is what the verifier's errors point at.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import sys
import threading
from typing import Sequence

from . import _core  # the C++ core (csrc/python/nki_core.cpp); links no torch
from ._dtypes import DTYPE_CODE, DTYPES, MX_DTYPES, is_integer, itemsize, normalize_dtype  # noqa: F401 - re-exported

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


class NkiValidationError(ValueError):
    """A kernel breaks a NeuronCore rule. ``rule`` names it; ``filename``/``lineno`` locate it."""

    def __init__(self, message: str, rule: str = "", filename: str = "", lineno: int = 0):
        self.rule, self.filename, self.lineno = rule, filename, lineno
        where = f"{filename}:{lineno}: " if filename else ""
        super().__init__(f"{where}[{rule}] {message}" if rule else f"{where}{message}")


class MemoryRegion(enum.Enum):
    # codes from the C++ core (csrc/nki/ir.h, Buffer; nl.hbm is its "hbm", private HBM)
    private_hbm = _core.BUFFERS["hbm"]
    shared_hbm = _core.BUFFERS["shared_hbm"]
    sbuf = _core.BUFFERS["sbuf"]
    psum = _core.BUFFERS["psum"]

    def __repr__(self) -> str:
        return f"nl.{self.name}"


ON_CHIP = (MemoryRegion.sbuf, MemoryRegion.psum)

# The op table (csrc/nki/ir.h): per op name, its code and its int / float attributes as
# (name, arity, group) in the order an instruction stores them.
_OPS = {row["name"]: (row["code"], [(p["name"], p["arity"]) for p in row["ints"]],
                      [(p["name"], p["arity"]) for p in row["floats"]]) for row in _core.OP_TABLE}


def _layout_plan(op: str, params, names: tuple) -> tuple:
    """Which of ``names`` (attributes given, in any order) an instruction stores, in the op table's
    order, each with whether it is variadic; checked once per op and set of names."""
    known = {n for n, _ in params}
    if not known.issuperset(names):
        raise TypeError(f"nki: {op} has no attribute(s) {sorted(set(names) - known)}")
    plan = []
    for name, arity in params:
        if name not in names:
            if arity == "one":
                raise TypeError(f"nki: {op} needs its attribute {name!r}")
            break  # optional ones left out stop the list
        plan.append((name, arity == "variadic"))
    return tuple(plan)


_LAYOUT_PLANS: dict = {}  # (op, int or float, attribute names given) -> _layout_plan


def _layout(op: str, params, values: dict, conv) -> list:
    """Attribute values in the order the op table stores them; a variadic one is a sequence."""
    key = (op, conv, tuple(values))
    plan = _LAYOUT_PLANS.get(key)
    if plan is None:
        plan = _LAYOUT_PLANS[key] = _layout_plan(op, params, key[2])
    out = []
    for name, variadic in plan:
        if variadic:
            out.extend(conv(v) for v in values[name])
        else:
            out.append(conv(values[name]))
    return out


_IN_PKG: dict[str, bool] = {}  # code file name -> whether it is in the nki package (asked per instruction)


def _in_pkg(filename: str) -> bool:
    inside = _IN_PKG.get(filename)
    if inside is None:
        inside = _IN_PKG[filename] = os.path.abspath(filename).startswith(_PKG_DIR + os.sep)
    return inside


def source_location() -> tuple[str, int]:
    """The innermost frame outside the nki package: the kernel line being traced."""
    f = sys._getframe(1)
    while f is not None and _in_pkg(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "", 0
    return f.f_code.co_filename, f.f_lineno


class Trace:
    """State of one kernel instance being traced."""

    def __init__(self, target: str, program_id: tuple[int, ...], grid: tuple[int, ...]):
        self.builder = _core.KernelBuilder(target)
        self.target = target
        self.facts = _core.target_facts(target)  # the platform model's facts of the target chip
        self.nc_version = self.facts["nc_version"]
        self.program_id = program_id
        self.grid = grid
        self.n_tensors = 0
        self.decl_loc: dict[int, tuple[str, int]] = {}  # tensor id -> where the kernel declared it
        self.constants: list = []  # (tensor id, numpy array) of nl.shared_constant, bound after the outputs
        self.shared: list = []  # (tensor id, bytes) of shared-HBM tensors the kernel allocates
        self.aliases: dict = {}  # (tensor id, dtype) -> the alias tensor reinterpreting its bytes
        self.constant_tiles: dict = {}  # key -> an on-chip tile nl functions fill once and reuse

    def declare(self, shape, dtype: str, buffer: MemoryRegion, name: str, external: int = -1) -> int:
        file, line = source_location()
        tid = self.builder.tensor(buffer.value, DTYPE_CODE[dtype], list(shape), name or "", file, line, external)
        self.decl_loc[tid] = (file, line)
        if buffer is MemoryRegion.shared_hbm and external < 0:
            self.shared.append((tid, itemsize(dtype) * math.prod(shape)))
        return tid

    def emit(self, op: str, args: Sequence, ints: dict | None = None, floats: dict | None = None,
             text: str = "") -> None:
        """Records instruction ``op`` (its nki.isa name): operands in the op table's order (None:
        absent), attributes by their names in the op table."""
        code, int_params, float_params = _OPS[op]
        file, line = source_location()
        accesses = [_NO_ACCESS if a is None else a._access() for a in args]
        self.builder.instr(code, accesses, _layout(op, int_params, ints or {}, int),
                           _layout(op, float_params, floats or {}, float), file, line, text)


_NO_ACCESS = (-1, 0, [], -1, 0, 0, 0, False)  # an absent operand
_local = threading.local()


def current() -> Trace:
    t = getattr(_local, "trace", None)
    if t is None:
        raise RuntimeError("this NKI call is only valid inside a kernel being traced by @nki.jit / nki.simulate")
    return t


def tracing() -> bool:
    """Whether a kernel is being traced on this thread."""
    return getattr(_local, "trace", None) is not None


def set_current(t: Trace | None) -> Trace | None:
    prev = getattr(_local, "trace", None)
    _local.trace = t
    return prev


_new_tensor = object.__new__


def _contiguous_strides(shape) -> tuple[int, ...]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return tuple(reversed(out))


class ds:
    """``nl.ds(start, size)``: the slice ``start:start + size``."""

    __slots__ = ("start", "size")

    def __init__(self, start: int, size: int):
        self.start, self.size = int(start), int(size)

    def as_slice(self) -> slice:
        return slice(self.start, self.start + self.size)


class NKIObject:
    """Base class of user objects a kernel may take as arguments and use while tracing
    (configuration classes, dataclasses): compared by type and attribute values."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Keep the permissive constructor below under @dataclass too (which adds an __init__ only
        # to a class without one): AWS's kernels build NKIObject dataclasses leaving fields out
        # and passing attributes they did not annotate.
        if cls.__init__ is NKIObject.__init__:
            cls.__init__ = NKIObject.__init__

    def __init__(self, *args, **kwargs):
        """Dataclass fields from ``args`` in order, then from ``kwargs``, else their defaults (None
        when a field has none); other keyword arguments become attributes too."""
        fields = dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes {len(fields)} positional arguments, got {len(args)}")
        for f, v in zip(fields, args):
            if f.name in kwargs:
                raise TypeError(f"{type(self).__name__}() got multiple values for argument {f.name!r}")
            kwargs[f.name] = v
        for f in fields:
            if f.name not in kwargs:
                if f.default is not dataclasses.MISSING:
                    kwargs[f.name] = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    kwargs[f.name] = f.default_factory()
                else:
                    kwargs[f.name] = None
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)  # frozen dataclasses too
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()


class NkiTensor(NKIObject):
    """A tensor in HBM, SBUF or PSUM, or a view of one. Dimension 0 of an on-chip tensor is
    its partition dimension."""

    __slots__ = ("_tid", "_base_shape", "shape", "strides", "offset", "dtype", "buffer", "name", "_index")

    def __init__(self, tid: int, base_shape, shape, strides, offset: int, dtype: str, buffer: MemoryRegion,
                 name: str = "", index=None):
        self._tid = tid
        self._base_shape = tuple(base_shape)
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        # A run-time offset: (SBUF index tensor, elements per index unit, one index per row of dim 0)
        self._index = index

    @classmethod
    def declare(cls, shape, dtype, buffer: MemoryRegion, name: str = "", external: int = -1) -> "NkiTensor":
        if not isinstance(buffer, MemoryRegion):
            raise TypeError(f"buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm, got {buffer!r}")
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if any(s <= 0 for s in shape):
            raise ValueError(f"tensor shape {shape} has a non-positive dimension")
        dtype = normalize_dtype(dtype)
        tid = current().declare(shape, dtype, buffer, name, external)
        return cls(tid, shape, shape, _contiguous_strides(shape), 0, dtype, buffer, name)

    # ---- attributes ------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def on_chip(self) -> bool:
        return self.buffer in ON_CHIP

    def __repr__(self) -> str:
        return f"NkiTensor(shape={self.shape}, dtype={self.dtype}, buffer={self.buffer!r}, name={self.name!r})"

    def _access(self):
        dims = list(zip(self.strides, self.shape))
        if self._index is None:
            return (self._tid, self.offset, dims, -1, 0, 0, 0, False)
        index, stride, vector = self._index
        return (self._tid, self.offset, dims, index._tid, index.offset, index.strides[0] if vector else 0, stride,
                vector)

    def _view(self, shape, strides, offset) -> "NkiTensor":
        """A view of the same tensor; ``shape``, ``strides`` and ``offset`` are ints already (tracing
        a large kernel makes millions of views: no conversions here)."""
        index = self._index
        if index is not None and index[2] and (not shape or shape[0] != self.shape[0]):
            raise ValueError("the first dimension of a vector_offset / vector_select view is indexed at run time: "
                             "it cannot be sliced, selected or reshaped")
        t = _new_tensor(NkiTensor)
        t._tid, t._base_shape, t.shape, t.strides, t.offset = self._tid, self._base_shape, tuple(shape), \
            tuple(strides), offset
        t.dtype, t.buffer, t.name, t._index = self.dtype, self.buffer, self.name, index
        return t

    def is_indirect(self) -> bool:
        """Whether this view carries a run-time (SBUF) index."""
        return self._index is not None

    def _indexed(self, index, stride: int, vector: bool, what: str) -> "NkiTensor":
        if self._index is not None:
            raise ValueError(f"{what}: this view already has a run-time index; only one is allowed per view")
        if not isinstance(index, NkiTensor):
            raise NotImplementedError(f"{what}: the run-time index must be an SBUF tensor (virtual registers are "
                                      "not supported by this simulator)")
        if index.buffer is not MemoryRegion.sbuf:
            raise ValueError(f"{what}: the run-time index is in {index.buffer!r}; it must be an SBUF tensor")
        if index.dtype not in ("int32", "uint32", "int16", "uint16", "int8", "uint8"):
            raise TypeError(f"{what}: the run-time index is {index.dtype}; use an int32 / uint32 tensor")
        if vector:
            if index.ndim < 1 or index.size != index.shape[0]:
                raise ValueError(f"{what}: vector offsets are an (n, 1) SBUF tensor, one per partition, got "
                                 f"shape {index.shape}")
        elif index.size != 1:
            raise ValueError(f"{what}: a scalar offset is a (1, 1) SBUF tensor, got shape {index.shape}")
        t = self._view(self.shape, self.strides, self.offset)
        t._index = (index, int(stride), vector)
        return t

    def vector_select(self, dim: int, offsets) -> "NkiTensor":
        """Row ``offsets[p]`` of dim 0 for each partition ``p``: a gather (or, as a DMA destination, a
        scatter) through an (n, 1) SBUF tensor of indices read at run time. The view has shape
        ``(n,) + shape[1:]``."""
        if dim != 0:
            raise ValueError(f"vector_select: only dim 0 can be indexed per partition, got dim {dim}")
        if self.on_chip:
            raise ValueError("vector_select: the indexed tensor must be in HBM")
        n = offsets.shape[0] if isinstance(offsets, NkiTensor) else 0
        base = NkiTensor(self._tid, self._base_shape, (n,) + self.shape[1:], self.strides, self.offset, self.dtype,
                         self.buffer, self.name)
        return base._indexed(offsets, self.strides[0], True, "vector_select")

    def get_pattern(self):
        return [[st, sz] for st, sz in zip(self.strides, self.shape)]

    def is_contiguous(self) -> bool:
        start = 1 if self.on_chip else 0
        return self.strides[start:] == _contiguous_strides(self.shape[start:])

    # ---- indexing ----------------------------------------------------------------------------
    def __getitem__(self, key) -> "NkiTensor":
        # Tracing a large kernel indexes millions of times: one pass, no intermediate lists.
        if type(key) is not tuple:
            key = (key,)
        shape_in, strides_in = self.shape, self.strides
        nd = len(shape_in)
        for i, k in enumerate(key):
            if k is Ellipsis:
                key = key[:i] + (slice(None),) * (nd - (len(key) - 1)) + key[i + 1:]
                break
        nk = len(key)
        if nk > nd:
            raise IndexError(f"too many indices ({nk}) for a {nd}-D tensor of shape {shape_in}")
        on_chip = self.buffer in ON_CHIP
        shape, strides, offset = [], [], self.offset
        last_drop = -1  # where in the view the last dimension indexed away was
        for d in range(nd):
            n, st = shape_in[d], strides_in[d]
            if d >= nk:
                shape.append(n)
                strides.append(st)
                continue
            k = key[d]
            if type(k) is slice:  # slice cannot be subclassed
                start, stop, step = k.start, k.stop, k.step
                step = 1 if step is None else int(step)
                if step < 1:
                    raise IndexError(f"slice step must be >= 1, got {step}")
                start = 0 if start is None else int(start)
                stop = n if stop is None else int(stop)
            elif isinstance(k, ds):
                start, stop, step = k.start, k.start + k.size, 1
            else:
                try:
                    i = int(k)
                except (TypeError, ValueError):  # a tensor, a string, None
                    raise TypeError(f"index {k!r} is not an int, a slice or nl.ds") from None
                if i < 0:
                    i += n
                if not 0 <= i < n:
                    raise IndexError(f"index {k} is out of range for dimension {d} (size {n}) of shape {shape_in}")
                offset += i * st
                if on_chip and d == 0:  # the partition dimension stays, with size 1
                    shape.append(1)
                    strides.append(st)
                else:
                    last_drop = len(shape)
                continue
            if start < 0:
                start += n
            if stop < 0:
                stop += n
            if not (0 <= start < stop <= n):
                raise IndexError(f"slice {start}:{stop} of dimension {d} (size {n}) of a tensor of shape "
                                 f"{shape_in} is out of range or empty")
            shape.append((stop - start + step - 1) // step if step != 1 else stop - start)
            strides.append(st * step)
            offset += start * st
        if on_chip and len(shape) < 2 and last_drop >= 0:
            # On-chip views stay at least 2-D: keep the last indexed free dimension as size 1.
            shape.insert(last_drop, 1)
            strides.insert(last_drop, 1)
        if not shape:
            shape, strides = [1], [1]
        return self._view(shape, strides, offset)

    def __setitem__(self, key, value):
        """``t[key] = value``: nisa.tensor_copy on chip, nisa.dma_copy to or from HBM, nisa.memset for a number."""
        dst = self[key]
        if isinstance(value, NkiTensor):
            current().emit("tensor_copy" if dst.on_chip and value.on_chip else "dma_copy", [dst, value])
        else:
            current().emit("memset", [dst], floats={"value": memset_value(dst, value)})

    # ---- view methods ------------------------------------------------------------------------
    def _check_free(self, dim: int, what: str) -> int:
        dim = dim + self.ndim if dim < 0 else dim
        if not 0 <= dim < self.ndim:
            raise IndexError(f"{what}: dimension {dim} out of range for shape {self.shape}")
        if self.on_chip and dim == 0:
            raise ValueError(f"{what}: the partition dimension 0 of an on-chip tensor cannot be changed this way")
        return dim

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index) -> "NkiTensor":
        if isinstance(index, NkiTensor):  # a run-time index, read from SBUF when the instruction runs
            if self.on_chip and dim == 0:
                raise ValueError("select: a run-time index cannot select along the partition dimension (dim 0) "
                                 "of an on-chip tensor")
            if not 0 <= dim < self.ndim:
                raise IndexError(f"select: dim {dim} out of range for shape {self.shape}")
            shape = self.shape[:dim] + self.shape[dim + 1:]
            strides = self.strides[:dim] + self.strides[dim + 1:]
            return self._view(shape, strides, self.offset)._indexed(index, self.strides[dim], False, "select")
        dim = self._check_free(dim, "select")
        if not 0 <= index < self.shape[dim]:
            raise IndexError(f"select: index {index} out of range for dimension {dim} of shape {self.shape}")
        shape = self.shape[:dim] + self.shape[dim + 1:]
        strides = self.strides[:dim] + self.strides[dim + 1:]
        return self._view(shape, strides, self.offset + index * self.strides[dim])

    def permute(self, dims) -> "NkiTensor":
        dims = [d + self.ndim if d < 0 else d for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError(f"permute: {dims} is not a permutation of {self.ndim} dimensions")
        if self.on_chip and dims[0] != 0:
            raise ValueError("permute: the partition dimension of an on-chip tensor stays first (dims[0] == 0)")
        return self._view([self.shape[d] for d in dims], [self.strides[d] for d in dims], self.offset)

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        dim = self._check_free(dim, "broadcast")
        if self.shape[dim] != 1:
            raise ValueError(f"broadcast: dimension {dim} has size {self.shape[dim]}, not 1")
        shape = list(self.shape)
        strides = list(self.strides)
        shape[dim], strides[dim] = int(size), 0
        return self._view(shape, strides, self.offset)

    def expand_dim(self, dim: int) -> "NkiTensor":
        dim = dim + self.ndim + 1 if dim < 0 else dim
        if self.on_chip and dim == 0:
            raise ValueError("expand_dim: cannot insert before the partition dimension of an on-chip tensor")
        return self._view(self.shape[:dim] + (1,) + self.shape[dim:], self.strides[:dim] + (1,) + self.strides[dim:],
                          self.offset)

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        dim = self._check_free(dim, "squeeze_dim")
        if self.shape[dim] != 1:
            raise ValueError(f"squeeze_dim: dimension {dim} has size {self.shape[dim]}, not 1")
        return self._view(self.shape[:dim] + self.shape[dim + 1:], self.strides[:dim] + self.strides[dim + 1:],
                          self.offset)

    def reshape(self, shape) -> "NkiTensor":
        shape = [int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,))]
        if -1 in shape:
            known = 1
            for s in shape:
                if s != -1:
                    known *= s
            shape[shape.index(-1)] = self.size // known
        n = 1
        for s in shape:
            n *= s
        if n != self.size:
            raise ValueError(f"reshape: cannot view shape {self.shape} ({self.size} elements) as {tuple(shape)}")
        if self.on_chip:
            if shape[0] != self.shape[0]:
                raise ValueError(f"reshape: an on-chip tensor keeps its partition dimension ({self.shape[0]}); "
                                 f"got {tuple(shape)}")
            if not self.is_contiguous():
                raise ValueError("reshape: the view's free dimensions are not contiguous; copy it first")
            strides = (self.strides[0],) + _contiguous_strides(shape[1:])
        else:
            if not self.is_contiguous():
                raise ValueError("reshape: the view is not contiguous; copy it first")
            strides = _contiguous_strides(shape)
        return self._view(shape, strides, self.offset)

    def flatten_dims(self, start_dim: int, end_dim: int) -> "NkiTensor":
        shape = list(self.shape)
        merged = 1
        for s in shape[start_dim:end_dim + 1]:
            merged *= s
        for d in range(start_dim, end_dim):
            if self.strides[d] != self.strides[d + 1] * self.shape[d + 1]:
                raise ValueError(f"flatten_dims: dimensions {start_dim}..{end_dim} are not contiguous")
        if self.on_chip and start_dim == 0:
            raise ValueError("flatten_dims: the partition dimension cannot be merged")
        return self._view(shape[:start_dim] + [merged] + shape[end_dim + 1:],
                          list(self.strides[:start_dim]) + [self.strides[end_dim]] + list(self.strides[end_dim + 1:]),
                          self.offset)

    def reshape_dim(self, dim: int, shape) -> "NkiTensor":
        dim = dim + self.ndim if dim < 0 else dim
        shape = [int(s) for s in shape]
        if -1 in shape:
            known = 1
            for s in shape:
                if s != -1:
                    known *= s
            shape[shape.index(-1)] = self.shape[dim] // known
        n = 1
        for s in shape:
            n *= s
        if n != self.shape[dim]:
            raise ValueError(f"reshape_dim: dimension {dim} of size {self.shape[dim]} cannot become {tuple(shape)}")
        if self.on_chip and dim == 0 and len(shape) > 1:
            raise ValueError("reshape_dim: the partition dimension cannot be split")
        sub = [st * self.strides[dim] for st in _contiguous_strides(shape)]
        return self._view(self.shape[:dim] + tuple(shape) + self.shape[dim + 1:],
                          self.strides[:dim] + tuple(sub) + self.strides[dim + 1:], self.offset)

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """A raw access pattern over the storage: ``[[stride, count], ...]`` (outermost first)."""
        if scalar_offset is not None and vector_offset is not None:
            raise ValueError("ap(): give at most one of scalar_offset and vector_offset")
        if dtype is not None and normalize_dtype(dtype) != self.dtype:
            # pattern and offset count elements of the new dtype over the same storage
            new = self._reinterpreted(normalize_dtype(dtype))
            sizes = itemsize(self.dtype), itemsize(new.dtype)
            rescaled = NkiTensor(new._tid, new._base_shape, self.shape, [st * sizes[0] // sizes[1] for st in self.strides],
                                 0, new.dtype, self.buffer, self.name)
            return rescaled.ap(pattern, 0 if offset is None else offset, scalar_offset, vector_offset, indirect_dim)
        pattern = [[int(st), int(n)] for st, n in pattern]
        if self.on_chip:
            per_partition = 1
            for s in self._base_shape[1:]:
                per_partition *= s
            if pattern[0][0] != per_partition and pattern[0][1] > 1:
                raise ValueError(f"ap(): the first (partition) pair's stride must be the storage's elements per "
                                 f"partition ({per_partition}), got {pattern[0][0]}")
        off = self.offset if offset is None else int(offset)
        view = NkiTensor(self._tid, self._base_shape, [n for _, n in pattern], [st for st, _ in pattern], off,
                         self.dtype, self.buffer, self.name)
        if scalar_offset is None and vector_offset is None:
            return view
        indirect_dim = int(indirect_dim)
        if not 0 <= indirect_dim < self.ndim:
            raise IndexError(f"ap(): indirect_dim {indirect_dim} out of range for a tensor of shape {self.shape}")
        # An index counts elements of indirect_dim of the tensor .ap() is called on, not of the pattern.
        stride = self.strides[indirect_dim]
        if vector_offset is not None:
            if indirect_dim != 0:
                raise ValueError("ap(): vector_offset supports indirect_dim=0 only")
            if self.on_chip:
                raise ValueError("ap(): vector_offset indexes an HBM tensor")
            if isinstance(vector_offset, NkiTensor) and vector_offset.shape[0] != pattern[0][1]:
                raise ValueError(f"ap(): vector_offset has {vector_offset.shape[0]} offsets but the pattern's first "
                                 f"dimension has {pattern[0][1]} elements")
            return view._indexed(vector_offset, stride, True, "ap(vector_offset=)")
        return view._indexed(scalar_offset, stride, False, "ap(scalar_offset=)")

    def _reinterpreted(self, dtype: str) -> "NkiTensor":
        """The whole storage as ``dtype`` (an alias tensor: same bytes, no copy): (P, bytes per
        partition / itemsize) on chip, (bytes / itemsize,) in HBM."""
        if self._index is not None:
            raise ValueError("view(dtype) / ap(dtype=): not after a run-time (dynamic) select")
        old, new = itemsize(self.dtype), itemsize(dtype)
        if self.on_chip:
            per_partition = math.prod(self._base_shape[1:]) * old
            if per_partition % new:
                raise ValueError(f"cannot reinterpret {per_partition} bytes per partition as {dtype}")
            shape = (self._base_shape[0], per_partition // new)
        else:
            total = math.prod(self._base_shape) * old
            if total % new:
                raise ValueError(f"cannot reinterpret {total} bytes as {dtype}")
            shape = (total // new,)
        tr = current()
        key = (self._tid, dtype)
        tid = tr.aliases.get(key)
        if tid is None:
            file, line = source_location()
            tid = tr.builder.alias(self._tid, DTYPE_CODE[dtype], list(shape), self.name or "", file, line)
            tr.aliases[key] = tid
        return NkiTensor(tid, shape, shape, _contiguous_strides(shape), 0, dtype, self.buffer, self.name)

    def view(self, dtype) -> "NkiTensor":
        """The same elements' bytes as ``dtype`` (no copy); the last dimension (contiguous) scales by
        the ratio of the dtype sizes."""
        dtype = normalize_dtype(dtype)
        if dtype == self.dtype:
            return self
        old, new = itemsize(self.dtype), itemsize(dtype)
        if self.ndim == 0 or (self.strides[-1] != 1 and self.shape[-1] != 1):
            raise ValueError(f"view({dtype}): the last dimension must be contiguous, got strides {self.strides}")
        byte_strides = [st * old for st in self.strides[:-1]]
        byte_offset, last_bytes = self.offset * old, self.shape[-1] * old
        if any(b % new for b in byte_strides + [byte_offset, last_bytes]):
            raise ValueError(f"view({dtype}): {self.dtype} view of shape {self.shape} (offset {self.offset}, strides "
                             f"{self.strides}) does not fall on {dtype} boundaries")
        base = self._reinterpreted(dtype)
        return NkiTensor(base._tid, base._base_shape, self.shape[:-1] + (last_bytes // new,),
                         [b // new for b in byte_strides] + [1], byte_offset // new, dtype, self.buffer, self.name)

    reinterpret_cast = view


def memset_value(dst: NkiTensor, value) -> float:
    """The value a memset of ``dst`` writes: a whole float (AWS's kernels fill integer tiles with
    0.0) is that integer for an integer dtype; a fraction is an error."""
    if isinstance(value, float) and is_integer(dst.dtype) and value == value and value not in (float("inf"),
                                                                                                float("-inf")):
        if not value.is_integer():
            raise NkiValidationError(f"memset: value {value!r} is not a whole number but dst is {dst.dtype}; pass "
                                     "an int", "dtype", *source_location())
        value = int(value)
    return float(value)


def tensors_in(obj) -> list[NkiTensor]:
    if isinstance(obj, NkiTensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in tensors_in(o)]
    return []

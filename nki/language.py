"""``nki.language``: memories, dtypes, tile sizes, tensor creation, SPMD queries, loops, and the
convenience operations (``nl.load``, ``nl.add``, ``nl.matmul``, ``nl.softmax``, ...), each built
from ``nki.isa`` instructions. The math functions double as operator codes (``op=nl.add``)."""

from __future__ import annotations

import builtins
import math
import os

from . import _ops
from . import isa as nisa
from ._dtypes import NUMPY_DTYPES, is_integer
from ._trace import MemoryRegion, NKIObject, NkiTensor, _core, current, ds, normalize_dtype

# ---- memories --------------------------------------------------------------------------------
sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm
hbm = private_hbm


def is_hbm(buffer) -> bool:
    return buffer in (private_hbm, shared_hbm)


def is_on_chip(buffer) -> bool:
    return buffer in (sbuf, psum)


def is_psum(buffer) -> bool:
    return buffer is psum


def is_sbuf(buffer) -> bool:
    return buffer is sbuf


# ---- dtypes ----------------------------------------------------------------------------------
DType = str
float32 = "float32"
bfloat16 = "bfloat16"
float16 = "float16"
tfloat32 = "tfloat32"
float8_e4m3 = "float8_e4m3"
float8_e4m3fn = "float8_e4m3fn"
float8_e5m2 = "float8_e5m2"
# The packed MX types: names only (declaring a tensor of one raises NotImplementedError).
float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4, float8_e8m0fnu = (
    "float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4", "float8_e8m0fnu")
int8, uint8, int16, uint16, int32, uint32 = "int8", "uint8", "int16", "uint16", "int32", "uint32"
bool_ = "bool_"


# ---- tile sizes ------------------------------------------------------------------------------
class _TileSize:
    """Tile limits of the target chip (the one being traced for, else the environment's), read
    from the platform model that the verifier enforces."""

    bn_stats_fmax = _core.BN_STATS_FMAX  # the same on every generation (csrc/nki/ir.h)
    psum_min_align = 4
    sbuf_min_align = 1

    @property
    def pmax(self) -> int:
        return _facts()["partitions"]

    @property
    def psum_bank_fmax_bytes(self) -> int:
        return _facts()["psum_bank_bytes"]

    @property
    def psum_bank_fmax(self) -> int:
        return self.psum_bank_fmax_bytes // 4  # fp32 elements

    @property
    def psum_fmax(self) -> int:
        return self.psum_bank_fmax

    @property
    def psum_num_banks(self) -> int:
        return _facts()["psum_banks"]

    @property
    def gemm_stationary_fmax(self) -> int:
        return _facts()["pe_cols"]

    @property
    def gemm_moving_fmax(self) -> int:
        return self.psum_bank_fmax  # one PSUM bank on every generation (NeuronCore-v4 allows more)

    @property
    def sbuf_fmax_bytes(self) -> int:
        return _facts()["sbuf_partition_bytes"]

    @property
    def sbuf_fmax(self) -> int:
        return self.sbuf_fmax_bytes // 4

    @property
    def total_available_sbuf_size(self) -> int:
        return self.sbuf_fmax_bytes

    @property
    def sbuf_size_bytes(self) -> int:
        return self.sbuf_fmax_bytes * self.pmax


tile_size = _TileSize()


def _facts() -> dict:
    from ._trace import _local

    t = getattr(_local, "trace", None)
    return t.facts if t is not None else _core.target_facts(_core.target_from_env())


# ---- creation --------------------------------------------------------------------------------
def ndarray(shape, dtype, buffer=sbuf, name: str = "", address=None) -> NkiTensor:
    """An uninitialized tensor in ``buffer`` (on-chip: dimension 0 is the partition dimension)."""
    return NkiTensor.declare(shape, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    t = ndarray(shape, dtype, buffer, name)
    nisa.memset(dst=t, value=fill_value)
    return t


def zeros(shape, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    t = ndarray(shape, dtype, buffer, name)
    nisa.memset(dst=t, value=0 if is_integer(normalize_dtype(dtype)) else 0.0)
    return t


def ones(shape, dtype, buffer=sbuf, name: str = "") -> NkiTensor:
    t = ndarray(shape, dtype, buffer, name)
    nisa.memset(dst=t, value=1 if is_integer(normalize_dtype(dtype)) else 1.0)
    return t


def zeros_like(x: NkiTensor, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    return zeros(x.shape, dtype or x.dtype, buffer or sbuf, name)


def empty_like(x: NkiTensor, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def shared_identity_matrix(n, dtype="uint8", dst=None) -> NkiTensor:
    """An (n, n) identity matrix in SBUF (into ``dst`` if given): 1 where partition == column."""
    n = int(n)
    out = dst if dst is not None else ndarray((n, n), dtype, sbuf)
    diff = ndarray((n, n), int32, sbuf)
    nisa.iota(dst=diff, pattern=[[-1, n]], offset=0, channel_multiplier=1)  # p - j
    nisa.tensor_scalar(dst=out, data=diff, op0=equal, operand0=0.0)
    return out


def shared_constant(constant) -> NkiTensor:
    """A shared-HBM tensor holding ``constant`` (a numpy array, or the path of a ``.npy`` file),
    as the compiler embeds it in the kernel. Each run starts from the constant's values."""
    import numpy as np

    if isinstance(constant, (str, os.PathLike)):
        try:
            constant = np.load(os.fspath(constant), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ValueError(f"shared_constant: cannot load {os.fspath(constant)!r} as a .npy array: {e}") from None
    if not isinstance(constant, np.ndarray):
        raise TypeError(f"shared_constant takes a numpy array or a .npy path, got {type(constant).__name__}")
    if constant.dtype.name not in NUMPY_DTYPES:
        raise TypeError(f"shared_constant: numpy dtype {constant.dtype.name} has no NKI type; NKI has no 64-bit "
                        "types: convert to float32/int32 first")
    data = np.ascontiguousarray(constant).copy()
    data.setflags(write=False)
    tr = current()
    t = NkiTensor.declare(data.shape, NUMPY_DTYPES[data.dtype.name], shared_hbm, "shared_constant")
    tr.constants.append((t._tid, data))
    return t


# ---- SPMD ------------------------------------------------------------------------------------
def program_id(axis: int = 0) -> int:
    t = current()
    if not t.grid:
        return 0
    if not 0 <= axis < len(t.grid):
        raise ValueError(f"program_id: axis {axis} out of range for a {len(t.grid)}-D launch grid {t.grid}")
    return t.program_id[axis]


def num_programs(axes: int = 0) -> int:
    t = current()
    if not t.grid:
        return 1
    if isinstance(axes, (tuple, list)):
        return math.prod(t.grid[a] for a in axes)
    return t.grid[axes]


def program_ndim() -> int:
    return len(current().grid)


# ---- loops (all unrolled at trace time, as Python range) ---------------------------------------
def affine_range(start, stop=None, step=1):
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = affine_range
static_range = affine_range


def fori_loop(lower, upper, body_fun, step=1):
    """Runs ``body_fun(i)`` for i in range(lower, upper, step) (unrolled: bounds are trace-time ints)."""
    if not all(isinstance(v, int) for v in (lower, upper, step)):
        raise NotImplementedError("fori_loop: run-time (register) bounds are not supported by this simulator yet")
    for i in range(lower, upper, step):
        body_fun(i)


class no_reorder:
    """Instructions run in program order in the simulator; the block changes nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def device_print(print_prefix: str, tensor) -> None:
    """Prints ``print_prefix`` and ``tensor``'s values (SBUF, PSUM or HBM) when the kernel runs, in
    program order: the values it holds at that point. In a launch of several programs each prints,
    labelled ``[program i of n]``. Output goes to ``sys.stdout`` as ``print(prefix, array)`` shows a
    numpy array (numpy's print options apply: long tensors are summarized); bf16 / fp16 / fp8
    values are shown as the exact float32 numbers they are."""
    t = current()
    if not isinstance(print_prefix, str):
        raise TypeError(f"device_print: print_prefix must be a constant string, got {type(print_prefix).__name__}")
    if not isinstance(tensor, NkiTensor):
        raise TypeError(f"device_print: tensor must be a tensor (nl.ndarray or a view of one), got "
                        f"{type(tensor).__name__}")
    label = print_prefix
    if math.prod(t.grid) > 1:
        pid, grid = (t.program_id[0], t.grid[0]) if len(t.grid) == 1 else (t.program_id, t.grid)
        label = f"[program {pid} of {grid}] {print_prefix}"
    t.emit("device_print", [tensor], text=label)


def _write_device_print(label: str, dtype: str, shape, values: bytes) -> None:
    """The executor's device_print output (fp32 or int64 bytes): through sys.stdout, so pytest's capture
    and notebooks see it, and flushed, so it stays in order with the program's own prints."""
    import numpy as np

    array = np.frombuffer(values, np.float32 if dtype.startswith(("float", "bfloat", "tfloat")) else np.int64)
    array = array.reshape(shape)
    print(label, array.astype(bool) if dtype == bool_ else array, flush=True)


_core.set_print_handler(_write_device_print)


# ---- operators (functions that are also op codes) ----------------------------------------------
def _result_like(x: NkiTensor, dtype) -> NkiTensor:
    return ndarray(x.shape, normalize_dtype(dtype) if dtype is not None else x.dtype, sbuf)


def _binary(op_fn, x, y, dtype):
    xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
    if not xt and not yt:
        raise TypeError(f"nl.{op_fn.__name__}: at least one operand must be a tensor")
    if xt and yt:
        if x.shape == y.shape:
            out = _result_like(x, dtype)
            nisa.tensor_tensor(dst=out, data1=x, data2=y, op=op_fn)
            return out
        # A (P, 1) column against a (P, F) tile: a per-partition scalar operand.
        for big, col, rev in ((x, y, False), (y, x, True)):
            if col.shape[0] == big.shape[0] and col.size == col.shape[0] and big.size != big.shape[0]:
                col32 = col if col.dtype == float32 else copy(col, dtype=float32)
                out = _result_like(big, dtype)
                nisa.tensor_scalar(dst=out, data=big, op0=op_fn, operand0=col32, reverse0=rev)
                return out
        raise ValueError(f"nl.{op_fn.__name__}: shapes {x.shape} and {y.shape} do not match (binary operations "
                         "take equal shapes, or a (P, 1) column with a (P, F) tile)")
    big, imm, rev = (x, y, False) if xt else (y, x, True)
    out = _result_like(big, dtype)
    nisa.tensor_scalar(dst=out, data=big, op0=op_fn, operand0=float(imm), reverse0=rev)
    return out


def _define_binary(name: str):
    """``nl.<name>``: the element-wise function, and as an ``op`` the ALU operator of that name."""
    def fn(x, y, dtype=None):
        return _binary(fn, x, y, dtype)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Element-wise ``{name}(x, y)`` in fp32; the result is a new SBUF tile."
    return _ops.register(fn, alu=name)


add = _define_binary("add")
subtract = _define_binary("subtract")
multiply = _define_binary("multiply")
divide = _define_binary("divide")
maximum = _define_binary("maximum")
minimum = _define_binary("minimum")
power = _define_binary("power")
abs_max = _define_binary("abs_max")
abs_min = _define_binary("abs_min")
equal = _define_binary("equal")
not_equal = _define_binary("not_equal")
greater = _define_binary("greater")
greater_equal = _define_binary("greater_equal")
less = _define_binary("less")
less_equal = _define_binary("less_equal")
logical_and = _define_binary("logical_and")
logical_or = _define_binary("logical_or")
logical_xor = _define_binary("logical_xor")
bitwise_and = _define_binary("bitwise_and")
bitwise_or = _define_binary("bitwise_or")
bitwise_xor = _define_binary("bitwise_xor")
left_shift = _define_binary("left_shift")
right_shift = _define_binary("right_shift")


def _define_unary(name: str):
    """``nl.<name>``: the element-wise function, and as an ``op`` the activation function of that
    name (and the unary ALU operator, where there is one: abs, square, relu, rsqrt, reciprocal)."""
    def fn(x, dtype=None):
        out = _result_like(x, dtype)
        nisa.activation(dst=out, op=fn, data=x)
        return out

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Element-wise ``{name}(x)`` on the Scalar engine; the result is a new SBUF tile."
    return _ops.register(fn, alu=name if name in _ops.ALU_CODE else None, act=name)


exp = _define_unary("exp")
log = _define_unary("log")
tanh = _define_unary("tanh")
sigmoid = _define_unary("sigmoid")
relu = _define_unary("relu")
gelu = _define_unary("gelu")
gelu_apprx_tanh = _define_unary("gelu_apprx_tanh")
gelu_apprx_sigmoid = _define_unary("gelu_apprx_sigmoid")
gelu_dx = _define_unary("gelu_dx")
silu = _define_unary("silu")
silu_dx = _define_unary("silu_dx")
sqrt = _define_unary("sqrt")
rsqrt = _define_unary("rsqrt")
reciprocal = _define_unary("reciprocal")
square = _define_unary("square")
abs = _define_unary("abs")  # noqa: A001 - NKI's name
sign = _define_unary("sign")
sin = _define_unary("sin")
cos = _define_unary("cos")
arctan = _define_unary("arctan")
softplus = _define_unary("softplus")
mish = _define_unary("mish")
erf = _define_unary("erf")
erf_dx = _define_unary("erf_dx")
negative = _define_unary("negative")
bypass = _ops.register(lambda x: x, alu="bypass")
bypass.__name__ = "bypass"
average = _ops.register(lambda x: x, alu="average")
average.__name__ = "average"


def copy(x: NkiTensor, dtype=None) -> NkiTensor:
    """A new SBUF tile with ``x``'s values (from SBUF or PSUM); as an op code, the identity."""
    out = _result_like(x, dtype)
    nisa.tensor_copy(dst=out, src=x)
    return out


_ops.register(copy, act="copy")


# ---- reductions --------------------------------------------------------------------------------
def _reduce(op_fn, x: NkiTensor, axis, dtype, keepdims):
    axes = sorted(a + x.ndim if a < 0 else a for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    kept = [x.shape[d] for d in range(x.ndim) if d not in axes]
    shape = [x.shape[d] if d not in axes else 1 for d in range(x.ndim)] if keepdims else kept
    if len(shape) < 2:
        shape = shape + [1]
    out = ndarray(shape, normalize_dtype(dtype) if dtype else x.dtype, sbuf)
    nisa.tensor_reduce(dst=out, op=op_fn, data=x, axis=axes, keepdims=keepdims)
    return out, math.prod(x.shape[a] for a in axes)


def _define_reduce(name: str, op_fn):
    def fn(x, axis, dtype=None, keepdims=False):
        return _reduce(op_fn, x, axis, dtype, keepdims)[0]

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``{name}`` over the trailing free ``axis`` (int or tuple); the result is a new SBUF tile."
    return fn


sum = _define_reduce("sum", add)  # noqa: A001 - NKI's name
prod = _define_reduce("prod", multiply)
max = _define_reduce("max", maximum)  # noqa: A001
min = _define_reduce("min", minimum)  # noqa: A001
_ops.register(max, alu="maximum")
_ops.register(min, alu="minimum")
all = _define_reduce("all", logical_and)  # noqa: A001


def mean(x: NkiTensor, axis, dtype=None, keepdims=False) -> NkiTensor:
    s, n = _reduce(add, x, axis, float32, keepdims)
    out = _result_like(s, dtype or x.dtype)
    nisa.tensor_scalar(dst=out, data=s, op0=multiply, operand0=1.0 / n)
    return out


def var(x: NkiTensor, axis, dtype=None, keepdims=False) -> NkiTensor:
    """Population variance over ``axis`` (the result keeps the reduced dims as size 1)."""
    m = mean(x, axis, dtype=float32, keepdims=True)
    d = ndarray(x.shape, float32, sbuf)
    if m.size == m.shape[0]:  # one value per partition: a column operand
        nisa.tensor_scalar(dst=d, data=x, op0=subtract, operand0=m.reshape((m.shape[0], 1)), op1=square,
                           operand1=None)
    else:  # the mean repeated over the reduced (trailing free) dims by a stride-0 view
        nisa.tensor_tensor(dst=d, data1=x, data2=_spread(m, x.shape), op=subtract)
        nisa.tensor_tensor(dst=d, data1=d, data2=d, op=multiply)
    return mean(d, axis, dtype=dtype or x.dtype, keepdims=True)


# ---- data movement and matmul ------------------------------------------------------------------
def load(src: NkiTensor, dtype=None) -> NkiTensor:
    """HBM -> a new SBUF tile of the same shape (dimension 0 becomes the partition dimension)."""
    shape = src.shape if len(src.shape) >= 2 else (1,) + tuple(src.shape)
    out = ndarray(shape, normalize_dtype(dtype) if dtype else src.dtype, sbuf)
    nisa.dma_copy(dst=out, src=src if len(src.shape) >= 2 else src.reshape(shape))
    return out


def store(dst: NkiTensor, value: NkiTensor) -> None:
    """An SBUF tile -> HBM ``dst``."""
    nisa.dma_copy(dst=dst, src=value)


def load_transpose2d(src: NkiTensor, dtype=None) -> NkiTensor:
    tile = load(src, dtype)
    return copy(transpose(tile))


def transpose(x: NkiTensor, dtype=None) -> NkiTensor:
    """2-D partition/free transpose on the Tensor engine; the result is in PSUM."""
    out = ndarray((x.size // x.shape[0], x.shape[0]), normalize_dtype(dtype) if dtype else x.dtype, psum)
    src = x if x.buffer is sbuf else copy(x)
    nisa.nc_transpose(dst=out, data=src)
    return out


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False) -> NkiTensor:
    """``x.T @ y`` with ``transpose_x=True`` (x is [K, M]), else ``x @ y``; fp32 result in PSUM."""
    if not transpose_x:
        xt = transpose(x)
        x = copy(xt)
    out = ndarray((x.size // x.shape[0], y.size // y.shape[0]), float32, psum)
    nisa.nc_matmul(dst=out, stationary=x, moving=y)
    return out


def broadcast_to(x: NkiTensor, shape, dtype=None) -> NkiTensor:
    """Broadcast size-1 dimensions (including the partition dimension) to ``shape``."""
    shape = tuple(int(s) for s in shape)
    if tuple(x.shape) == shape and dtype is None:
        return x
    if len(shape) != x.ndim:
        raise ValueError(f"broadcast_to: {x.shape} -> {shape} changes the rank")
    view = x
    for d in range(1, x.ndim):
        if x.shape[d] != shape[d]:
            if x.shape[d] != 1:
                raise ValueError(f"broadcast_to: dimension {d} of {x.shape} is not 1 and differs from {shape}")
            view = view.broadcast(d, shape[d])
    dt = normalize_dtype(dtype) if dtype else x.dtype
    if x.shape[0] == shape[0]:
        out = ndarray(shape, dt, sbuf)
        nisa.tensor_copy(dst=out, src=view)
        return out
    if x.shape[0] != 1:
        raise ValueError(f"broadcast_to: the partition dimension {x.shape[0]} is not 1 and differs from {shape[0]}")
    # Partition broadcast on the Tensor engine: ones[1, P].T @ row[1, F], a PSUM bank of columns
    # (gemm_moving_fmax) at a time (AWS's architecture guide: what NKI does for broadcast_to).
    # The ones row is filled once per kernel instance; the Scalar engine moves a float result from
    # PSUM to SBUF, as Neuron's compiler evacuates matmul results, leaving the Vector engine to the
    # element-wise work a broadcast feeds.
    P, F = shape[0], math.prod(shape[1:])
    if P > tile_size.pmax:
        raise ValueError(f"broadcast_to: {shape} has {P} partitions; an on-chip tile has at most "
                         f"nl.tile_size.pmax = {tile_size.pmax}")
    ones_dtype = bfloat16 if x.dtype in (bfloat16, float16) else float32
    consts = current().constant_tiles
    ones_row = consts.get(("ones_row", ones_dtype))
    if ones_row is None:
        ones_row = consts[("ones_row", ones_dtype)] = full((1, tile_size.pmax), 1.0, ones_dtype)
    ones_row = ones_row[:, 0:P]
    row = view if view.buffer is sbuf else copy(view)
    row = row.reshape((1, F)) if row.is_contiguous() else copy(row).reshape((1, F))
    if ones_row.dtype != row.dtype and (row.dtype in (float32, tfloat32)) != (ones_row.dtype == float32):
        row = copy(row, dtype=float32)
    out = ndarray((P, F), dt, sbuf)
    step = tile_size.gemm_moving_fmax
    for f0 in range(0, F, step):
        n = builtins.min(step, F - f0)
        acc = ndarray((P, n), float32, psum)
        nisa.nc_matmul(dst=acc, stationary=ones_row, moving=row[:, f0:f0 + n], is_stationary_onezero=True)
        if is_integer(dt):
            nisa.tensor_copy(dst=out[:, f0:f0 + n], src=acc)
        else:
            nisa.activation(dst=out[:, f0:f0 + n], op=copy, data=acc)
    return out.reshape(shape)


def _is_int(dtype) -> bool:
    return normalize_dtype(dtype).startswith(("int", "uint", "bool"))


def _trailing_axes(x: NkiTensor, axis, what: str) -> list:
    """``axis`` (int or sequence) as sorted trailing free axes of ``x``."""
    axes = sorted(a + x.ndim if a < 0 else a for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    if not axes or axes[0] < 1 or axes != list(range(x.ndim - len(axes), x.ndim)):
        raise ValueError(f"{what}: axis {axis} of a {x.ndim}-D tile must be trailing free axes (never axis 0)")
    return axes


def _spread(t: NkiTensor, shape) -> NkiTensor:
    """A stride-0 view of ``t`` repeated along its size-1 free dims to ``shape``."""
    for d in range(1, t.ndim):
        if t.shape[d] != shape[d]:
            t = t.broadcast(d, shape[d])
    return t


def where(condition: NkiTensor, x, y, dtype=None) -> NkiTensor:
    """``x`` where condition != 0 else ``y`` (x a tile or scalar; y a tile, scalar or (P, 1) column)."""
    if not isinstance(x, NkiTensor):
        ref = y if isinstance(y, NkiTensor) and y.shape == condition.shape else condition
        dt = normalize_dtype(dtype) if dtype else ref.dtype
        x = full(condition.shape, int(x) if _is_int(dt) else float(x), dt)
    out = _result_like(x, dtype)
    if isinstance(y, NkiTensor) and y.shape == out.shape:
        # Both tiles: x where c, else y == y + c * (x - y) would round; select twice instead.
        nisa.select(dst=out, predicate=condition, on_true=x, on_false=0.0)
        inv = ndarray(condition.shape, float32, sbuf)
        nisa.tensor_scalar(dst=inv, data=condition, op0=equal, operand0=0.0)
        tmp = ndarray(out.shape, out.dtype, sbuf)
        nisa.select(dst=tmp, predicate=inv, on_true=y, on_false=0.0)
        nisa.tensor_tensor(dst=out, data1=out, data2=tmp, op=add)
        return out
    nisa.select(dst=out, predicate=condition, on_true=x, on_false=y)
    return out


def softmax(x: NkiTensor, axis=-1, dtype=None) -> NkiTensor:
    """Softmax over trailing free ``axis`` (default the last), in fp32."""
    axes = _trailing_axes(x, axis, "softmax")
    P = x.shape[0]
    out = _result_like(x, dtype)
    if len(axes) == x.ndim - 1:
        # Over every free element of a partition: per-partition columns, one activation.
        m = ndarray((P, 1), float32, sbuf)
        nisa.tensor_reduce(dst=m, op=maximum, data=x, axis=axes, negate=True)
        e = ndarray(x.shape, float32, sbuf)
        s = ndarray((P, 1), float32, sbuf)
        nisa.activation(dst=e, op=exp, data=x, bias=m, reduce_op=add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        r = ndarray((P, 1), float32, sbuf)
        nisa.reciprocal(dst=r, data=s)
        nisa.tensor_scalar(dst=out, data=e, op0=multiply, operand0=r)
        return out
    # Over some trailing axes: the per-row statistics are spread back over them by views.
    red = tuple(1 if d in axes else x.shape[d] for d in range(x.ndim))
    m = ndarray(red, float32, sbuf)
    nisa.tensor_reduce(dst=m, op=maximum, data=x, axis=axes, keepdims=True)
    e = ndarray(x.shape, float32, sbuf)
    nisa.tensor_tensor(dst=e, data1=x, data2=_spread(m, x.shape), op=subtract)
    nisa.activation(dst=e, op=exp, data=e)
    s = ndarray(red, float32, sbuf)
    nisa.tensor_reduce(dst=s, op=add, data=e, axis=axes, keepdims=True)
    nisa.reciprocal(dst=s, data=s)
    nisa.tensor_tensor(dst=out, data1=e, data2=_spread(s, x.shape), op=multiply)
    return out


def rms_norm(x: NkiTensor, w: NkiTensor, axis, n, epsilon=1e-6, dtype=None, compute_dtype=None) -> NkiTensor:
    """``x / sqrt(sum(x**2) / n + epsilon) * w`` over trailing free ``axis`` (n elements)."""
    axes = _trailing_axes(x, axis, "rms_norm")
    P = x.shape[0]
    normed = ndarray(x.shape, float32, sbuf)
    sq = ndarray(x.shape, float32, sbuf)
    if len(axes) == x.ndim - 1:
        ss = ndarray((P, 1), float32, sbuf)
        nisa.activation(dst=sq, op=square, data=x, reduce_op=add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
    else:
        ss = ndarray(tuple(1 if d in axes else x.shape[d] for d in range(x.ndim)), float32, sbuf)
        nisa.activation(dst=sq, op=square, data=x)
        nisa.tensor_reduce(dst=ss, op=add, data=sq, axis=axes, keepdims=True)
    rinv = ndarray(ss.shape, float32, sbuf)
    nisa.tensor_scalar(dst=rinv, data=ss, op0=multiply, operand0=1.0 / n, op1=add, operand1=float(epsilon))
    nisa.activation(dst=rinv, op=rsqrt, data=rinv)
    if ss.shape == (P, 1):
        nisa.tensor_scalar(dst=normed, data=x, op0=multiply, operand0=rinv)
    else:
        nisa.tensor_tensor(dst=normed, data1=x, data2=_spread(rinv, x.shape), op=multiply)
    out = _result_like(x, dtype)
    wb = broadcast_to(w, x.shape) if w.shape != x.shape else w
    nisa.tensor_tensor(dst=out, data1=normed, data2=wb, op=multiply)
    return out


def expand_dims(x: NkiTensor, axis: int) -> NkiTensor:
    return x.expand_dim(axis)


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations", "math", "builtins")]

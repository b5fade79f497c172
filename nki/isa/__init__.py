"""``nki.isa``: NeuronCore instructions, destination first (NKI 0.2+).

Each call checks its Python arguments and records one instruction (operands as access
patterns, attributes by their names in the op table of csrc/nki/ir.h, which lays them out). The
hardware rules (memories, partitions, matmul limits, dtypes, bounds) are checked by the C++
verifier on the whole traced program, with the calling line in the error.
"""

from __future__ import annotations

import math

from .. import _ops
from .._trace import MemoryRegion, NkiTensor, NkiValidationError, current, memset_value
from . import constants
from .constants import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd

__all__ = [
    "NkiValidationError", "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version",
    "get_nc_version", "dma_copy", "tensor_copy", "memset", "iota", "nc_matmul", "nc_transpose", "tensor_tensor",
    "tensor_scalar", "activation", "activation_reduce", "tensor_reduce", "tensor_tensor_scan", "affine_select",
    "bn_stats", "bn_aggr", "max8", "nc_find_index8", "reciprocal", "tensor_partition_reduce",
    "scalar_tensor_tensor", "select", "tensor_copy_predicated", "select_reduce", "range_select",
    "tensor_scalar_reduce", "tensor_scalar_cumulative", "exponential", "activate2", "nc_match_replace8",
    "nc_stream_shuffle", "dma_transpose", "nc_n_gather", "local_gather", "get_nc_sub_version", "dma_engine",
    "constants", "sendrecv", "core_barrier", "nonzero_with_count", "dma_compute",
]


unknown_engine, tensor_engine, scalar_engine, gpsimd_engine, vector_engine = (
    engine.unknown, engine.tensor, engine.scalar, engine.gpsimd, engine.vector)


def get_nc_version() -> nc_version:
    return nc_version(current().nc_version)


def get_nc_sub_version() -> int:
    return 0


def _t(x, what: str) -> NkiTensor:
    if not isinstance(x, NkiTensor):
        raise TypeError(f"{what} must be a tensor (nl.ndarray or a view of one), got {type(x).__name__}")
    return x


def _opt_t(x, what: str):
    return None if x is None else _t(x, what)


def _scalar_or_column(x, what: str):
    """(tensor or None, immediate): an operand that is an fp32 scalar or a (P, 1) tensor."""
    if x is None:
        return None, 0.0
    if isinstance(x, NkiTensor):
        return x, 0.0
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{what} must be a number or a (P, 1) tensor, got {type(x).__name__}")
    return None, float(x)


def _code(kind, value, what: str) -> int:
    """The code of an argument that takes one of an enum's values (``nisa.oob_mode.skip``, or its
    number); anything else is a ValueError naming the choices."""
    try:
        return int(kind(value))
    except (ValueError, TypeError):
        names = ", ".join(f"nisa.{kind.__name__}.{m.name}" for m in kind)
        raise ValueError(f"{what}={value!r} is not a nisa.{kind.__name__}; use one of {names}") from None


def _engine(e) -> int:
    return _code(engine, e, "engine") if e is not None else 0


def _no_gpsimd_psum(what: str, eng, *tensors) -> None:
    """The verifier's gpsimd-psum rule for instructions whose attributes do not record the engine."""
    if _engine(eng) != engine.gpsimd:
        return
    for t in tensors:
        if isinstance(t, NkiTensor) and t.buffer is MemoryRegion.psum:
            raise NkiValidationError(f"{what}: {t.name or 'a tensor'} ({list(t.shape)} in psum) is in PSUM, which the "
                                     "GpSimd engine cannot access; use SBUF or another engine", "gpsimd-psum",
                                     *_here())


# ---- data movement -------------------------------------------------------------------------

def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None):
    """``dst = src`` by DMA (HBM/SBUF, never PSUM); different dtypes convert through fp32. With a
    run-time offset (``ap(scalar_offset=/vector_offset=)``, ``select``, ``vector_select``) an access
    outside the tensor raises, or with ``oob_mode=oob_mode.skip`` is skipped (that row, for a vector
    offset)."""
    current().emit("dma_copy", [_t(dst, "dst"), _t(src, "src")],
                   {"oob_mode": _code(_oob_mode_t, oob_mode, "oob_mode")})


def tensor_copy(dst, src, engine=engine.unknown, name=None):
    """On-chip copy by the Vector, Scalar or GpSimd engine (bit-exact for equal dtypes)."""
    current().emit("tensor_copy", [_t(dst, "dst"), _t(src, "src")], {"engine": _engine(engine)})


def memset(dst, value, engine=engine.unknown, name=None):
    """Fill ``dst`` with a compile-time constant of the destination's kind (int for integer dtypes)."""
    _t(dst, "dst")
    _no_gpsimd_psum("memset", engine, dst)
    current().emit("memset", [dst], floats={"value": memset_value(dst, value)})


def _pattern(pattern):
    pairs = [[int(s), int(n)] for s, n in pattern]
    if not 1 <= len(pairs) <= 4:
        raise ValueError(f"pattern must have 1 to 4 [step, num] pairs, got {pattern!r}")
    return [x for p in pairs for x in p]


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[c, i...] = offset + c * channel_multiplier + sum(i_k * step_k)`` computed in int32."""
    _t(dst, "dst")
    flat = _pattern(pattern)
    n = 1
    for i in range(1, len(flat), 2):
        n *= flat[i]
    if n != dst.size // dst.shape[0]:
        raise NkiValidationError(f"iota: the pattern covers {n} elements but dst has {dst.size // dst.shape[0]} per "
                                 "partition", "shape-mismatch", *_here())
    current().emit("iota", [dst], {"offset": offset, "channel_multiplier": channel_multiplier, "pattern": flat})


# ---- Tensor engine -------------------------------------------------------------------------

def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None):
    """``dst[M, N] (PSUM, fp32) (+)= stationary[K, M].T @ moving[K, N]`` (SBUF operands).

    ``accumulate=None``: the first matmul write to a PSUM element overwrites it, later ones add."""
    if perf_mode not in (None, matmul_perf_mode.none):
        raise NotImplementedError("nc_matmul: perf_mode=double_row is not supported by this simulator yet")
    if tile_position or tile_size:
        if not (tile_position and tile_size):
            raise ValueError("nc_matmul: tile_position and tile_size are given together")
    acc = -1 if accumulate is None else int(bool(accumulate))
    current().emit("nc_matmul", [_t(dst, "dst"), _t(stationary, "stationary"), _t(moving, "moving")],
                   {"accumulate": acc, "is_transpose": bool(is_transpose)})


def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """``dst[F, P] = data[P, F]``: Tensor engine (<= 128 x 128, SBUF -> PSUM) or Vector (<= 32 x 32)."""
    current().emit("nc_transpose", [_t(dst, "dst"), _t(data, "data")], {"engine": _engine(engine)})


# ---- Vector / Scalar / GpSimd compute -------------------------------------------------------

def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """``dst = op(data1, data2)`` element-wise, in fp32 (bitwise ops on integers)."""
    current().emit("tensor_tensor", [_t(dst, "dst"), _t(data1, "data1"), _t(data2, "data2")],
                   {"op": _ops.alu(op, "op"), "engine": _engine(engine)})


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    """``dst = (data op0 operand0) op1 operand1``; operands are scalars or (P, 1) fp32 columns."""
    if (op1 is None) != (operand1 is None) and not (op1 is not None and _ops.alu_is_unary(op1)):
        raise ValueError("tensor_scalar: op1 and operand1 are given together (or both None)")
    t0, i0 = _scalar_or_column(operand0, "operand0")
    t1, i1 = _scalar_or_column(operand1, "operand1")
    _no_gpsimd_psum("tensor_scalar", engine, dst, data, t0, t1)
    current().emit("tensor_scalar", [_t(dst, "dst"), _t(data, "data"), t0, t1],
                   {"op0": _ops.alu(op0, "op0"), "reverse0": bool(reverse0),
                    "op1": -1 if op1 is None else _ops.alu(op1, "op1"), "reverse1": bool(reverse1)},
                   {"operand0": i0, "operand1": i1})


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """``dst = (data op0 operand0) op1 operand1``; operand0 scalar or (P, 1), operand1 a full tile."""
    t0, i0 = _scalar_or_column(operand0, "operand0")
    current().emit("scalar_tensor_tensor", [_t(dst, "dst"), _t(data, "data"), t0, _t(operand1, "operand1")],
                   {"op0": _ops.alu(op0, "op0"), "op1": _ops.alu(op1, "op1"), "reverse0": bool(reverse0),
                    "reverse1": bool(reverse1)}, {"operand0": i0})


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None):
    """``dst = op(data * scale + bias)`` on the Scalar engine, in fp32. With ``reduce_cmd`` the
    per-partition sum of the result accumulates in the engine's registers; ``reduce_res`` (P, 1)
    receives them."""
    if reduce_op is not None and _ops.alu(reduce_op, "reduce_op") != _ops.ALU_CODE["add"]:
        raise NkiValidationError("activation: reduce_op must be nl.add", "dtype", *_here())
    tb, ib = _scalar_or_column(bias, "bias")
    ts, is_ = _scalar_or_column(scale, "scale")
    if ts is None and scale is None:
        is_ = 1.0
    current().emit("activation", [_t(dst, "dst"), _t(data, "data"), tb, ts, _opt_t(reduce_res, "reduce_res")],
                   {"op": _ops.act(op), "reduce_cmd": _reduce_cmd(reduce_cmd)}, {"scale": is_, "bias": ib})


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation`` with the sum over the free dimensions written to ``reduce_res``."""
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=reduce_cmd.reset_reduce)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce the trailing free axes ``axis`` of ``data`` with ``op`` (fp32)."""
    axes = [int(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
    _t(data, "data")
    axes = [a + data.ndim if a < 0 else a for a in axes]
    current().emit("tensor_reduce", [_t(dst, "dst"), data], {"op": _ops.alu(op, "op"), "negate": bool(negate),
                                                             "axis": axes})


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """Per partition: ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])`` with ``r[-1] = initial``."""
    ti, ii = _scalar_or_column(initial, "initial")
    current().emit("tensor_tensor_scan", [_t(dst, "dst"), _t(data0, "data0"), _t(data1, "data1"), ti],
                   {"op0": _ops.alu(op0, "op0"), "op1": _ops.alu(op1, "op1"), "reverse0": bool(reverse0),
                    "reverse1": bool(reverse1)}, {"initial": ii})


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, offset=0, name=None):
    """``dst = on_true_tile where cmp_op(affine value, 0) else on_false_value`` (the affine value as in iota)."""
    cmp = _ops.ALU_CODE["equal"] if cmp_op is None else _ops.alu(cmp_op, "cmp_op")
    current().emit("affine_select", [_t(dst, "dst"), _t(on_true_tile, "on_true_tile")],
                   {"cmp_op": cmp, "offset": offset, "channel_multiplier": channel_multiplier,
                    "pattern": _pattern(pattern)}, {"on_false_value": on_false_value})


def select(dst, predicate, on_true, on_false, name=None):
    """``dst = on_true where predicate != 0 else on_false`` (on_false a scalar or a (P, 1) column)."""
    tf, if_ = _scalar_or_column(on_false, "on_false")
    current().emit("select", [_t(dst, "dst"), _t(predicate, "predicate"), _t(on_true, "on_true"), tf],
                   floats={"on_false": if_})


def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` on the Vector engine (fp32)."""
    current().emit("reciprocal", [_t(dst, "dst"), _t(data, "data")])


def tensor_partition_reduce(dst, op, data, name=None):
    """Reduce across partitions: ``dst[0, :] = op over p of data[p, :]``."""
    current().emit("tensor_partition_reduce", [_t(dst, "dst"), _t(data, "data")], {"op": _ops.alu(op, "op")})


def bn_stats(dst, data, name=None):
    """Per partition, over at most 512 elements: ``[count, mean, var*count]`` of the even and of
    the odd positions (6 values)."""
    current().emit("bn_stats", [_t(dst, "dst"), _t(data, "data")])


def bn_aggr(dst, data, name=None):
    """Combine bn_stats triples into ``[mean, variance]`` per partition."""
    current().emit("bn_aggr", [_t(dst, "dst"), _t(data, "data")])


def max8(dst, src, name=None):
    """The 8 largest values of each partition, descending."""
    current().emit("max8", [_t(dst, "dst"), _t(src, "src")])


def nc_find_index8(dst, data, vals, name=None):
    """Per partition, the index of the first occurrence of each of 8 values (all ones when absent)."""
    current().emit("nc_find_index8", [_t(dst, "dst"), _t(data, "data"), _t(vals, "vals")])


# ---- Vector-engine selection, accumulation and data movement ---------------------------------

_FP32_MIN = -3.4028234663852886e38


def _reduce_cmd(cmd) -> int:
    return _code(_reduce_cmd_t, cmd, "reduce_cmd")


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """``dst = src`` where ``predicate`` is nonzero (zero with ``reverse_pred``); elsewhere dst keeps its
    values. ``src`` is a tile of dst's dtype or a number."""
    ts, is_ = (src, 0.0) if isinstance(src, NkiTensor) else _scalar_or_column(src, "src")
    current().emit("tensor_copy_predicated", [_t(dst, "dst"), ts, _t(predicate, "predicate")],
                   {"reverse_pred": bool(reverse_pred)}, {"src": is_})


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_op=None,
                  reverse_pred=False, name=None):
    """``dst = on_true where predicate (xor reverse_pred) else on_false``; with ``reduce_cmd`` the
    per-partition max of dst accumulates in the Vector engine's registers (written to reduce_res)."""
    _max_only("select_reduce", reduce_op)
    tf, if_ = _scalar_or_column(on_false, "on_false")
    current().emit("select_reduce", [_t(dst, "dst"), _t(predicate, "predicate"), _t(on_true, "on_true"), tf,
                                     _opt_t(reduce_res, "reduce_res")],
                   {"reduce_cmd": _reduce_cmd(reduce_cmd), "reverse_pred": bool(reverse_pred)}, {"on_false": if_})


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=None, range_start=0, on_false_value=_FP32_MIN, name=None):
    """``dst = on_true_tile where comp_op0(i, bound0) and comp_op1(i, bound1) else on_false_value`` with
    ``i = range_start + free index``; the per-partition max accumulates (reduce_res)."""
    _max_only("range_select", reduce_op)
    current().emit("range_select", [_t(dst, "dst"), _t(on_true_tile, "on_true_tile"), _t(bound0, "bound0"),
                                    _t(bound1, "bound1"), _opt_t(reduce_res, "reduce_res")],
                   {"comp_op0": _ops.alu(comp_op0, "comp_op0"), "comp_op1": _ops.alu(comp_op1, "comp_op1"),
                    "reduce_cmd": _reduce_cmd(reduce_cmd), "range_start": range_start},
                   {"on_false_value": on_false_value})


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None):
    """``dst = data op0 operand0``; ``reduce_op`` (add, multiply, max, min) of dst over the free
    dimensions accumulates in the Vector engine's registers, written (negated with
    ``reduce_res_negate``) to ``reduce_res``."""
    if reverse0:
        raise NotImplementedError("tensor_scalar_reduce: reverse0 is not supported (as in NKI)")
    if (reduce_cmd == _reduce_cmd_t.load_reduce) != (reduce_init is not None):
        raise ValueError("tensor_scalar_reduce: reduce_init is given exactly when reduce_cmd is load_reduce")
    t0, i0 = _scalar_or_column(operand0, "operand0")
    ti, ii = _scalar_or_column(reduce_init, "reduce_init")
    current().emit("tensor_scalar_reduce",
                   [_t(dst, "dst"), _t(data, "data"), t0, _opt_t(reduce_res, "reduce_res"), ti],
                   {"op0": _ops.alu(op0, "op0"), "reduce_op": _ops.alu(reduce_op, "reduce_op"),
                    "reduce_cmd": _reduce_cmd(reduce_cmd), "reduce_res_negate": bool(reduce_res_negate)},
                   {"operand0": i0, "reduce_init": ii})


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """Per partition, along the free elements: ``reg = op1(op0(src[i], imm0), reg); dst[i] = reg``
    (reg: the Vector engine's accumulator; reset to op1's identity, or ``imm1`` with load_reduce)."""
    if reduce_cmd == _reduce_cmd_t.load_reduce and imm1 is None:
        raise ValueError("tensor_scalar_cumulative: reduce_cmd=load_reduce takes the initial value imm1")
    t0, i0 = _scalar_or_column(imm0, "imm0")
    t1, i1 = _scalar_or_column(imm1, "imm1")
    current().emit("tensor_scalar_cumulative", [_t(dst, "dst"), _t(src, "src"), t0, t1],
                   {"op0": _ops.alu(op0, "op0"), "op1": _ops.alu(op1, "op1"), "reduce_cmd": _reduce_cmd(reduce_cmd)},
                   {"imm0": i0, "imm1": i1})


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None):
    """``dst = exp(src - max_value)`` on the Vector engine (NeuronCore-v4); with ``reduce_cmd`` the
    per-partition sum accumulates (reduce_res)."""
    tm, im = _scalar_or_column(max_value, "max_value")
    ti, ii = _scalar_or_column(reduce_init, "reduce_init")
    current().emit("exponential", [_t(dst, "dst"), _t(src, "src"), tm, _opt_t(reduce_res, "reduce_res"), ti],
                   {"reduce_cmd": _reduce_cmd(reduce_cmd)}, {"max_value": im, "reduce_init": ii})


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=reduce_cmd.idle, name=None):
    """``dst = op((data op0 imm0) op1 imm1)`` on the Scalar engine (NeuronCore-v4), with an optional
    reduction (add, max, min, abs_max, abs_min) in the engine's registers."""
    t0, i0 = _scalar_or_column(imm0, "imm0")
    t1, i1 = _scalar_or_column(imm1, "imm1")
    tr, ir = _scalar_or_column(relu_param, "relu_param")
    rop = -1 if reduce_op is None else _ops.alu(reduce_op, "reduce_op")
    current().emit("activate2", [_t(dst, "dst"), _t(data, "data"), t0, t1, tr, _opt_t(reduce_res, "reduce_res")],
                   {"op": _ops.act(op), "op0": _ops.alu(op0, "op0"), "op1": _ops.alu(op1, "op1"),
                    "reverse0": bool(reverse0), "reverse1": bool(reverse1), "reduce_op": rop,
                    "reduce_cmd": _reduce_cmd(reduce_cmd)}, {"imm0": i0, "imm1": i1, "relu_param": ir})


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """``dst = data`` with the first occurrence of each of the 8 ``vals`` per partition replaced by
    ``imm``; their indices go to ``dst_idx`` (duplicate vals: the last val takes the first match)."""
    current().emit("nc_match_replace8", [_t(dst, "dst"), _t(data, "data"), _t(vals, "vals"),
                                         _opt_t(dst_idx, "dst_idx")], floats={"imm": imm})


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each 32-partition quadrant: ``dst[i] = src[shuffle_mask[i]]`` (255 leaves dst[i])."""
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32:
        raise ValueError(f"nc_stream_shuffle: shuffle_mask has 32 entries, got {len(mask)}")
    current().emit("nc_stream_shuffle", [_t(dst, "dst"), _t(src, "src")], {"shuffle_mask": mask})


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error, name=None):
    """DMA transpose into SBUF: 2-D ``(1, 0)``, 3-D ``(2, 1, 0)``, 4-D ``(3, 1, 2, 0)``. With
    ``dge_mode=swdge`` the source carries a ``vector_offset`` (rows gathered at run time)."""
    axes = [] if axes is None else [int(a) for a in axes]
    current().emit("dma_transpose", [_t(dst, "dst"), _t(src, "src")],
                   {"dge_mode": _code(_dge_mode_t, dge_mode, "dge_mode"), "axes": axes})


def nc_n_gather(dst, data, indices, name=None):
    """Per partition: ``dst[p, j] = data[p, :].flatten()[indices[p, j]]`` (GpSimd, SBUF, uint32 indices)."""
    current().emit("nc_n_gather", [_t(dst, "dst"), _t(data, "data"), _t(indices, "indices")])


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Each GpSimd core (16 partitions) flattens its slice of ``index`` partition-first and gathers,
    in each of its partitions, ``num_elem_per_idx`` elements from each index (an element offset)."""
    _t(index, "index")
    per_core = (index.size // index.shape[0]) * 16
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    current().emit("local_gather", [_t(dst, "dst"), _t(src_buffer, "src_buffer"), index],
                   {"num_elem_per_idx": num_elem_per_idx, "num_valid_indices": valid})


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """Per GpSimd core (partitions 0, 16, ..., 112 only): the indices of ``src``'s nonzero elements
    plus ``index_offset``, then ``padding_val`` up to ``src``'s length, then the count (int32 dst
    with one more element per partition than src)."""
    current().emit("nonzero_with_count", [_t(dst, "dst"), _t(src, "src")],
                   {"index_offset": index_offset, "padding_val": padding_val})


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` by the DMA engines, in fp32 (HBM or
    SBUF). With a ``vector_offset`` on ``dst`` and the source that matches it, a scatter
    read-modify-write (``dst[idx] += src``); on the other source, a gather (``dst += src[idx]``)."""
    srcs = list(srcs)
    if not 1 <= len(srcs) <= 16:
        raise NkiValidationError(f"dma_compute takes 1 to 16 sources, got {len(srcs)}", "shape-mismatch", *_here())
    if _ops.alu(reduce_op, "reduce_op") != _ops.ALU_CODE["add"]:
        raise NkiValidationError("dma_compute: reduce_op must be nl.add", "alu-op", *_here())
    scales = [1.0] * len(srcs) if scales is None else [float(x) for x in scales]
    if len(scales) != len(srcs) or any(x != 1.0 for x in scales):
        raise NkiValidationError(f"dma_compute: scales must be None or one 1.0 per source, got {scales}",
                                 "alu-op", *_here())
    if not unique_indices:
        raise NotImplementedError("dma_compute(unique_indices=False): non-unique scatter indices are not supported "
                                  "(as in NKI)")
    current().emit("dma_compute", [_t(dst, "dst")] + [_t(x, f"srcs[{i}]") for i, x in enumerate(srcs)],
                   {"oob_mode": _code(_oob_mode_t, oob_mode, "oob_mode")}, {"scales": scales})


def _rank(x, what: str) -> int:
    n = math.prod(current().grid)
    if not isinstance(x, int) or not 0 <= x < n:
        raise NkiValidationError(f"{what} must be a program of this launch (0..{n - 1}), got {x!r}; cores exchange "
                                 "data within an SPMD launch such as kernel[2]", "shape-mismatch", *_here())
    return x


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None):
    """Send ``src`` to program ``send_to_rank`` of this launch while receiving program
    ``recv_from_rank``'s into ``dst`` (SBUF tiles of one shape and dtype); waits for the partner."""
    current().emit("sendrecv", [_t(dst, "dst"), _t(src, "src")],
                   {"send_to_rank": _rank(send_to_rank, "send_to_rank"),
                    "recv_from_rank": _rank(recv_from_rank, "recv_from_rank"), "pipe_id": pipe_id})


def core_barrier(data, cores, engine=engine.gpsimd, name=None):
    """Wait until every program of this launch named in ``cores`` reaches a barrier (writes before
    it, e.g. to halves of a shared HBM tensor, are then visible to all of them). Cores beyond the
    launch (``cores=(0, 1)`` in a one-program launch, as AWS's kernels write for LNC 1 and 2) are
    not waited for."""
    n = math.prod(current().grid)
    if any(not isinstance(c, int) or c < 0 for c in cores):
        raise NkiValidationError(f"core_barrier: cores are program numbers, got {cores!r}", "shape-mismatch",
                                 *_here())
    current().emit("core_barrier", [_t(data, "data")], {"cores": sorted({c for c in cores if c < n})})


def _max_only(what, reduce_op):
    if reduce_op is not None and _ops.alu(reduce_op, "reduce_op") != _ops.ALU_CODE["maximum"]:
        raise NkiValidationError(f"{what}: reduce_op must be nl.maximum", "alu-op", *_here())


# The enums by other names, for functions whose parameters shadow them.
_reduce_cmd_t, _dge_mode_t, _oob_mode_t = reduce_cmd, dge_mode, oob_mode


def _here():
    from .._trace import source_location

    return source_location()

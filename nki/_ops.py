"""Operator codes: which ``nl`` function stands for which ALU operator or activation function
when passed as ``op`` to an ``nki.isa`` instruction (numbering: csrc/nki/ir.h, Alu and Act)."""

from __future__ import annotations

(ADD, SUBTRACT, MULTIPLY, DIVIDE, MAXIMUM, MINIMUM, POWER, ABS_MAX, ABS_MIN, EQUAL, NOT_EQUAL, GREATER,
 GREATER_EQUAL, LESS, LESS_EQUAL, LOGICAL_AND, LOGICAL_OR, LOGICAL_XOR, BITWISE_AND, BITWISE_OR, BITWISE_XOR,
 LEFT_SHIFT, RIGHT_SHIFT, ABS, SQUARE, RELU, RSQRT, RECIPROCAL, BYPASS, AVERAGE) = range(30)
_UNARY = {ABS, SQUARE, RELU, RSQRT, RECIPROCAL, BYPASS}

(A_COPY, A_EXP, A_LOG, A_TANH, A_SIGMOID, A_RELU, A_GELU, A_GELU_TANH, A_GELU_SIGMOID, A_SILU, A_SQRT, A_RSQRT,
 A_RECIPROCAL, A_SQUARE, A_ABS, A_SIGN, A_SIN, A_COS, A_ARCTAN, A_SOFTPLUS, A_MISH, A_ERF, A_GELU_DX, A_SILU_DX,
 A_ERF_DX, A_NEGATIVE) = range(26)

_alu: dict = {}
_act: dict = {}


def register(fn, alu: int | None = None, act: int | None = None):
    if alu is not None:
        _alu[fn] = alu
    if act is not None:
        _act[fn] = act
    return fn


def _name(fn) -> str:
    return f"nl.{fn.__name__}" if callable(fn) else repr(fn)


def alu(fn, what: str = "op") -> int:
    try:
        return _alu[fn]
    except (KeyError, TypeError):
        names = ", ".join(sorted(_name(f) for f in _alu))
        raise ValueError(f"{what}={_name(fn)} is not an ALU operator; use one of {names}") from None


def alu_is_unary(fn) -> bool:
    return _alu.get(fn) in _UNARY


def act(fn) -> int:
    try:
        return _act[fn]
    except (KeyError, TypeError):
        names = ", ".join(sorted(_name(f) for f in _act))
        raise ValueError(f"op={_name(fn)} is not an activation function; use one of {names}") from None

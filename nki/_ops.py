"""Operator codes: which ``nl`` function stands for which ALU operator or activation function
when passed as ``op`` to an ``nki.isa`` instruction. Codes come from the C++ core by name
(csrc/nki/ir.h, Alu and Act); nothing is numbered here."""

from __future__ import annotations

from . import _core

ALU_CODE: dict[str, int] = dict(_core.ALU_OPS)  # "add" -> code
ACT_CODE: dict[str, int] = dict(_core.ACTIVATIONS)  # "exp" -> code
_UNARY = {ALU_CODE[n] for n in ("abs", "square", "relu", "rsqrt", "reciprocal", "bypass")}

_alu: dict = {}
_act: dict = {}


def register(fn, alu: str | None = None, act: str | None = None):
    """``fn`` (an ``nl`` function) stands for the ALU operator and / or activation function named."""
    if alu is not None:
        _alu[fn] = ALU_CODE[alu]
    if act is not None:
        _act[fn] = ACT_CODE[act]
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

"""``nki.isa.constants``: the enumerations that ``nki.isa`` instructions take (also exported by
``nki.isa`` itself, as AWS's kernels import them from either place)."""

from __future__ import annotations

import enum

from .. import _core

__all__ = ["engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "dma_engine", "nc_version"]


# The enums the C++ core interprets take their codes from it by name (csrc/nki/ir.h: Engine,
# ReduceCmd, DgeMode, OobMode); the others are front-end only.
def _from_core(name: str, codes: dict) -> type:
    return enum.IntEnum(name, sorted(codes.items(), key=lambda kv: kv[1]), module=__name__)


engine = _from_core("engine", _core.ENGINES)
reduce_cmd = _from_core("reduce_cmd", _core.REDUCE_CMDS)
dge_mode = _from_core("dge_mode", _core.DGE_MODES)
oob_mode = _from_core("oob_mode", _core.OOB_MODES)


class matmul_perf_mode(enum.IntEnum):
    none = 0
    double_row = 1


class dma_engine(enum.IntEnum):
    dma = 1
    gpsimd_dma = 2


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4

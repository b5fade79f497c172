"""The NKI dtypes, in one table: names, codes and sizes come from the C++ core (csrc/nki/ir.h,
DType, through ``nki._core``); what each one is in numpy and in torch is here."""

from __future__ import annotations

from . import _core

# name -> code, in code order
DTYPE_CODE: dict[str, int] = dict(sorted(_core.DTYPES.items(), key=lambda kv: kv[1]))
DTYPES: tuple[str, ...] = tuple(DTYPE_CODE)
DTYPE_SIZE: dict[str, int] = dict(_core.DTYPE_SIZES)
# Named by nki.language (kernels refer to them at import) but not simulated yet.
MX_DTYPES = ("float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4", "float8_e8m0fnu")
_ALIASES = {"bool": "bool_", "float8_e4m3fnuz": None, "half": "float16", "float": "float32"}
# numpy dtype names (ml_dtypes' for the 16/8-bit floats) -> NKI dtype: the arrays a kernel takes
NUMPY_DTYPES = {"float32": "float32", "float16": "float16", "int8": "int8", "uint8": "uint8", "int16": "int16",
                "uint16": "uint16", "int32": "int32", "uint32": "uint32", "bool": "bool_", "bfloat16": "bfloat16",
                "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "float8_e4m3": "float8_e4m3"}


def normalize_dtype(dtype) -> str:
    """An NKI dtype string from an nl dtype, a numpy dtype or a torch dtype."""
    if isinstance(dtype, str) and dtype in DTYPE_CODE:
        return dtype
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "")
    name = _ALIASES.get(name, name)
    if name in DTYPE_CODE:
        return name
    if name in MX_DTYPES:
        raise NotImplementedError(f"{name}: the packed MX dtypes (and nc_matmul_mx / quantize_mx that use them) are "
                                  "not supported by this simulator yet")
    raise TypeError(f"{dtype!r} is not an NKI dtype; NKI has {', '.join(DTYPES)} (no 64-bit types)")


def itemsize(dtype: str) -> int:
    return DTYPE_SIZE[dtype]


def is_integer(dtype: str) -> bool:
    """Integer and bool dtypes (the ones memset fills with whole numbers)."""
    return dtype.startswith(("int", "uint", "bool"))


def torch_dtype(dtype: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "tfloat32": torch.float32, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
            # torch's only e4m3 type; the two encodings agree on every value up to 240
            "float8_e4m3": torch.float8_e4m3fn,
            "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "uint16": torch.uint16,
            "int32": torch.int32, "uint32": torch.uint32, "bool_": torch.bool}[dtype]


def numpy_dtype(dtype: str):
    import numpy as np

    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3"):
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(f"numpy has no {dtype}; install ml_dtypes, or call the kernel with torch tensors") from None
        return getattr(ml_dtypes, dtype)
    return np.dtype({"bool_": "bool", "tfloat32": "float32"}.get(dtype, dtype))

"""Facts the estimate reads: Trainium chips from the platform model (csrc/runtime/platform.cpp, the one
owner of chip facts, through the NKI binding), GPU comparators from their public data sheets."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from torch_neuronx.estimate._errors import EstimateError

TRAINIUM = ("trn1", "inf2", "trn2", "trn3")
GPUS = ("h100", "h200")


def _core():
    try:
        from nki import _core  # the NKI binding without libtorch
    except ImportError as e:
        try:
            from torch_neuronx._C import _nki as _core  # builds from before the NKI core had its own module
        except ImportError:
            raise EstimateError(f"the platform model (nki._core) does not load: {e}; rebuild torch-neuronx "
                                "(make build)") from e
    return _core


@functools.lru_cache(maxsize=None)
def chip(name: str) -> dict:
    """The platform model's facts of a Trainium chip (``torch.neuron.get_platform()``'s keys)."""
    key = name.strip().lower()
    if key not in TRAINIUM:
        raise EstimateError(f"unknown platform {name!r}; choose from {', '.join(TRAINIUM + GPUS)}")
    return dict(_core().target_facts(key))


# GPU comparators: not chips this project models (the platform model owns Trainium only), so their
# public peaks live here, each with its data sheet. The comparator model is simpler (see _gpu.py).
@dataclass(frozen=True)
class Gpu:
    name: str
    product: str
    bf16_tflops: float  # dense
    fp8_tflops: float  # dense
    hbm_bytes: int
    hbm_tbps: float
    nvlink_tbps: float  # per GPU, all links
    gpus_per_instance: int
    instance: str
    efa_gbps: float  # per instance
    source: str


GPU_FACTS = {
    "h100": Gpu("h100", "NVIDIA H100 SXM", 989.0, 1979.0, 80 * 10**9, 3.35, 0.9, 8, "p5.48xlarge", 3200,
                "NVIDIA H100 data sheet (SXM: 989 dense BF16 / 1,979 dense FP8 TFLOPS, 80 GB, 3.35 TB/s, "
                "NVLink 900 GB/s); AWS p5.48xlarge: 8 GPUs, 3,200 Gbps EFA"),
    "h200": Gpu("h200", "NVIDIA H200 SXM", 989.0, 1979.0, 141 * 10**9, 4.8, 0.9, 8, "p5e.48xlarge", 3200,
                "NVIDIA H200 data sheet (H100's compute, 141 GB, 4.8 TB/s, NVLink 900 GB/s); AWS p5e.48xlarge: "
                "8 GPUs, 3,200 Gbps EFA"),
}


def parse_platforms(spec: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"trn2,trn3"`` -> ``["trn2", "trn3"]``; unknown names are an EstimateError listing the known ones."""
    names = [s.strip().lower() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not names:
        raise EstimateError("no platform given; pass e.g. --platform trn2,trn3")
    for n in names:
        if n not in TRAINIUM + GPUS:
            raise EstimateError(f"unknown platform {n!r}; choose from {', '.join(TRAINIUM + GPUS)}")
    return list(dict.fromkeys(names))

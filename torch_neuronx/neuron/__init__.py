"""``torch.neuron``: the device module of the ``neuron`` backend, shaped like ``torch.cuda``."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

from torch_neuronx import _C
from torch_neuronx.neuron import _utils, amp
from torch_neuronx.neuron._utils import _get_device_index
from torch_neuronx.neuron.memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    get_per_process_memory_fraction,
)
from torch_neuronx.neuron.random import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_neuronx.neuron.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

_initialized = False
_init_lock = threading.Lock()


def is_available() -> bool:
    """True when at least one neuron device is visible (does not initialize the runtime)."""
    return _C._device_count() > 0


def device_count() -> int:
    """Number of visible logical NeuronCores (``NEURON_RT_VISIBLE_CORES`` / ``NEURON_RT_NUM_CORES``)."""
    return _C._device_count()


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def is_initialized() -> bool:
    return _initialized and not _C._is_in_bad_fork()


def _lazy_init() -> None:
    global _initialized
    if is_initialized():
        return
    with _init_lock:
        if is_initialized():
            return
        err = _C._config_error()
        if err:
            raise RuntimeError(f"The neuron device is misconfigured: {err}")
        if _C._device_count() == 0:
            raise RuntimeError(
                "No neuron devices are visible to this process (NEURON_RT_VISIBLE_CORES or "
                "NEURON_RT_NUM_CORES selects none). Unset them or name at least one core, e.g. "
                "NEURON_RT_VISIBLE_CORES=0-3."
            )
        _C._lazy_init()  # raises in a child forked after initialization
        _initialized = True


def init() -> None:
    """Initialize the runtime explicitly (normally lazy, on first use)."""
    _lazy_init()


def _drain_autograd_workers() -> None:
    """At exit, before the interpreter finalizes: each device's autograd worker releases the
    graph tasks of finished backwards (which may own Python objects), see the C++ side."""
    if not is_initialized():
        return
    try:
        _C._drain_autograd_workers(device_count())
    except Exception:  # exiting anyway; a device error here must not mask the script's own status
        pass


def current_device() -> int:
    return _C._current_device()


def set_device(device: Any) -> None:
    idx = _get_device_index(device)
    if idx >= 0:
        # As torch.cuda.set_device: initializes, so that is_initialized() (which FakeTensor and
        # DTensor consult to resolve a bare "neuron") sees the device chosen here.
        _lazy_init()
        _C._set_device(idx)


class device:
    """Context manager that changes the current neuron device."""

    def __init__(self, device: Any):
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = _C._current_device()
            if self.prev_idx != self.idx:
                _C._set_device(self.idx)
        return self

    def __exit__(self, *args):
        if self.idx >= 0 and self.prev_idx != self.idx:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current (no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "neuron" else -1)


def synchronize(device: Any = None) -> None:
    """Wait for all work on ``device`` (execution is synchronous, so this only validates)."""
    if torch.compiler.is_compiling():
        # Traced: torch.accelerator's synchronize is what Dynamo models (as current_stream's
        # streams). is_available/device_count/current_device are folded to constants instead,
        # as torch.cuda's are (registered by torch_neuronx.compile).
        return torch.accelerator.synchronize() if device is None else torch.accelerator.synchronize(device)
    _lazy_init()
    torch.accelerator.synchronize(_get_device_index(device, optional=True))


def _sleep(cycles: int) -> None:
    """Holds the current stream busy for ``cycles`` cycles of the engine clock
    (``get_platform()["engine_ghz"]``), as ``torch.cuda._sleep`` does with the GPU clock: work
    queued after it on the stream, and events recorded after it, complete after it."""
    if not isinstance(cycles, int) or isinstance(cycles, bool):
        raise TypeError(f"_sleep expects an integer number of cycles, got {type(cycles).__name__}")
    if cycles < 0:
        raise ValueError(f"_sleep expects a non-negative number of cycles, got {cycles}")
    _lazy_init()
    _C._sleep(cycles)


class _NeuronDeviceProperties:
    def __init__(self, info: dict):
        self.name = _device_name(info)
        self.total_memory = int(info["total_memory"])
        self.platform = info["platform"]
        self.core = info["core"]
        self.lnc = int(info["lnc"])
        self.logical_core = int(info["logical_core"])
        self.physical_cores = list(info["physical_cores"])
        self.index = int(info["index"])

    def __repr__(self) -> str:
        return (
            f"_NeuronDeviceProperties(name='{self.name}', platform='{self.platform}', "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, lnc={self.lnc}, "
            f"logical_core={self.logical_core}, physical_cores={self.physical_cores})"
        )


def _device_name(info: dict) -> str:
    return f"{info['product']} {info['core']} (LNC={info['lnc']}, simulated)"


def get_device_properties(device: Any = None) -> _NeuronDeviceProperties:
    idx = _get_device_index(device, optional=True)
    return _NeuronDeviceProperties(_C._device_properties(idx if idx >= 0 else current_device()))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(NeuronCore generation, 0): 3 for trn2 (NeuronCore-v3), 4 for trn3."""
    idx = _get_device_index(device, optional=True)
    return (int(_C._device_properties(idx if idx >= 0 else current_device())["nc_version"]), 0)


def get_platform() -> dict:
    """The simulated platform: the platform model's facts of the chip (cores, SBUF/PSUM, engine
    clocks, TFLOPS, HBM, DMA, links, nc_version) and the device configuration (LNC, devices)."""
    return dict(_C._platform())


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return is_available()


def is_fp8_supported() -> bool:
    """FP8 / MXFP8 matmuls need Trainium 3 (NEURON_PLATFORM=trn3)."""
    return is_available() and bool(_C._platform()["supports_fp8"])


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16, torch.float32]


# ---- op tracking -------------------------------------------------------------------------


def get_executed_ops() -> dict[str, int]:
    """Ops run on neuron since start or :func:`clear_op_tracking`, with counts."""
    return dict(_C._executed_ops())


def get_fallback_ops() -> dict[str, int]:
    """Ops that had no native neuron kernel and ran through the generic fallback, with counts."""
    return dict(_C._fallback_ops())


def clear_op_tracking() -> None:
    _C._clear_op_tracking()


def set_fallback_policy(policy: str) -> None:
    """``'silent'`` (default), ``'warn'`` (once per op) or ``'error'`` (raise NotImplementedError)."""
    if not isinstance(policy, str):
        raise TypeError(f"fallback policy must be 'silent', 'warn' or 'error', not {policy!r}")
    _C._set_fallback_policy(policy)


def get_fallback_policy() -> str:
    return _C._get_fallback_policy()


@contextlib.contextmanager
def fallback_policy(policy: str):
    """Temporarily set the fallback policy."""
    prev = get_fallback_policy()
    set_fallback_policy(policy)
    try:
        yield
    finally:
        set_fallback_policy(prev)


def __getattr__(name: str):
    if name in ("get_dynamo_metrics", "reset_dynamo_metrics"):
        # Loaded on first use: they import torch._dynamo.
        from torch_neuronx.compile import _metrics

        return getattr(_metrics, name)
    if name in ("nki_op", "wrap_nki"):
        from torch_neuronx import _nki

        return getattr(_nki, name)
    if name == "default_generators":
        return tuple(_C._default_generator(i) for i in range(device_count()))
    raise AttributeError(f"module 'torch.neuron' has no attribute '{name}'")


__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "amp",
    "clear_op_tracking",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "fallback_policy",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_dynamo_metrics",
    "get_executed_ops",
    "get_fallback_ops",
    "get_fallback_policy",
    "get_per_process_memory_fraction",
    "get_platform",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_fp8_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "nki_op",
    "reset_accumulated_memory_stats",
    "reset_dynamo_metrics",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_fallback_policy",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]

"""Memory management of ``torch.neuron`` (the shape of torch.cuda.memory).

Statistics come from the caching allocator through ``torch.accelerator``, so both
report the same truth.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from torch_neuronx import _C
from torch_neuronx.neuron._utils import _get_device_index


def _idx(device: Any) -> int:
    idx = _get_device_index(device, optional=True)
    _C._check_device(idx)
    return idx


def empty_cache() -> None:
    """Return cached, unused device memory to the device."""
    torch.accelerator.empty_cache()


def memory_stats(device: Any = None) -> OrderedDict[str, Any]:
    return torch.accelerator.memory_stats(_idx(device))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    idx = _idx(device)
    if torch._C._accelerator_isAllocatorInitialized():
        torch.accelerator.reset_peak_memory_stats(idx)


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    idx = _idx(device)
    if torch._C._accelerator_isAllocatorInitialized():
        torch.accelerator.reset_accumulated_memory_stats(idx)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory (free excludes memory the cache holds)."""
    info = _C._device_memory_info(_idx(device))
    return info["capacity"] - info["used"], info["capacity"]


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap this process's use of ``device`` at ``fraction`` of its capacity; beyond it,
    allocations raise torch.OutOfMemoryError (a cheap way to test out-of-memory paths)."""
    if not isinstance(fraction, (int, float)):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    _C._set_memory_fraction(float(fraction), _idx(device))


def get_per_process_memory_fraction(device: Any = None) -> float:
    limit, capacity = _C._allocator_limit(_idx(device))
    return limit / capacity if capacity else 0.0


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator's statistics for ``device``."""
    idx = _idx(device)
    stats = memory_stats(idx)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Device reserved segments", "segment", False),
    ]
    pools = [("all", "")] if abbreviated else [("all", ""), ("large_pool", "  from large pool"), ("small_pool", "  from small pool")]
    width = 78
    lines = ["=" * width, f" torch.neuron memory summary, device neuron:{idx}".ljust(width), "-" * width]
    lines.append(f"{'Metric':<34}{'Cur Usage':>11}{'Peak Usage':>11}{'Tot Alloc':>11}{'Tot Freed':>11}")
    lines.append("-" * width)
    for title, key, is_bytes in rows:
        for pool, label in pools:
            vals = [stats.get(f"{key}.{pool}.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
            cells = [_fmt(v) if is_bytes else str(v) for v in vals]
            name = title if pool == "all" else label
            lines.append(f"{name:<34}" + "".join(f"{c:>11}" for c in cells))
        lines.append("-" * width)
    free, total = mem_get_info(idx)
    lines.append(f" Device capacity {_fmt(total)}, free {_fmt(free)}; OOMs: {stats.get('num_ooms', 0)}, "
                 f"cache flushes: {stats.get('num_alloc_retries', 0)}")
    lines.append("=" * width)
    return "\n".join(lines)

"""Compilation artifacts: ``TORCH_NEURONX_DEBUG_DIR`` and ``TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS``.

With preservation on, the neuron backend writes each Dynamo graph it receives
(``fx_graphs/proc_<rank>/<model>_<n>.txt``) and Inductor's debug trace of its compilation
(``inductor/``: readable FX graphs before and after AOTAutograd, the IR, the generated wrapper
and C++ kernels). With it off (the default) nothing is written. The directory defaults to the
user's cache directory, not /tmp. Preservation bypasses Inductor's caches (a cache hit
generates no code to keep).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch

from torch_neuronx.compile._env import env_flag

_counter = itertools.count()


def debug_dir() -> Path:
    d = os.environ.get("TORCH_NEURONX_DEBUG_DIR")
    if d:
        return Path(d)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torch_neuronx" / "neuron_backend"


def preserve() -> bool:
    return env_flag("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", False)


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    return int(os.environ.get("RANK", "0"))


def save_fx_graph(gm: torch.fx.GraphModule, name: str) -> dict:
    """Write ``gm`` when preserving; returns Inductor config patches that trace the compile there."""
    if not preserve():
        return {}
    base = debug_dir() / f"proc_{_rank()}"
    graphs = base / "fx_graphs"
    graphs.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    stem = f"{safe}_{os.getpid()}_{next(_counter)}"
    (graphs / f"{stem}.txt").write_text(gm.print_readable(print_output=False) + "\n\n" + str(gm.graph))
    # A cache hit skips code generation and so would write no trace: preserving bypasses the
    # FX-graph and AOTAutograd caches, so every graph's artifacts are written.
    return {"trace.enabled": True, "trace.debug_dir": str(base / "inductor" / stem),
            "force_disable_caches": True}

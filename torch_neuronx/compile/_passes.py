"""The neuron FX pass stage.

Inductor runs ``NeuronPostGradPasses`` on every post-grad (ATen-level, functional) graph that
targets ``neuron``, whether it was compiled with ``backend="neuron"`` or the default backend.
This is where device-specific rewrites and, later, NKI kernel substitution plug in. Each pass
is ``fn(graph: torch.fx.Graph) -> None`` and rewrites in place; the list is ordered.

The stage's ``uuid()`` enters Inductor's FX-graph cache key, so a cached graph is reused only
for the same passes, the same torch_neuronx version and the same simulated platform.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable

import torch
from torch._inductor.custom_graph_pass import CustomGraphModulePass

FxPass = Callable[[torch.fx.Graph], None]

# (name, pass), in order. Keep it small: each entry is documented in docs/compile.md.
PASSES: list[tuple[str, FxPass]] = []


def register_fx_pass(name: str, fn: FxPass) -> None:
    """Append ``fn`` to the neuron pass stage (names are unique)."""
    if any(n == name for n, _ in PASSES):
        raise ValueError(f"an FX pass named {name!r} is already registered")
    PASSES.append((name, fn))


def platform_key() -> str:
    """What about the simulated device changes generated code or its validity."""
    import torch_neuronx

    p = torch.neuron.get_platform()
    return f"torch_neuronx={torch_neuronx.__version__};platform={p['platform']};lnc={p['lnc']}"


class NeuronPostGradPasses(CustomGraphModulePass):
    """The pass stage. ``codegen_source`` is the code generator's neuron specifics (its module's
    source, handed in by the code generator): it enters the cache key, so a change there does
    not reuse code generated before it."""

    def __init__(self, codegen_source: str = ""):
        self.codegen_source = codegen_source

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        for _, fn in PASSES:
            fn(gm.graph)
        gm.recompile()

    def uuid(self) -> bytes:
        h = hashlib.sha256(platform_key().encode())
        h.update(self.codegen_source.encode())
        for name, fn in PASSES:
            h.update(name.encode())
            try:
                h.update(inspect.getsource(fn).encode())
            except (OSError, TypeError):
                h.update(repr(fn).encode())
        return h.digest()

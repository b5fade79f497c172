"""vLLM's piecewise compilation (its default mode, VLLM_COMPILE) on ``neuron``: vLLM traces the model
once, splits the graph at attention, and hands each piece to this compiler, which compiles it with
torch.compile's ``neuron`` backend — the same backend ``torch.compile(backend="neuron")`` uses, so
the pieces get its Inductor pipeline and its compile cache."""

from __future__ import annotations

from typing import Any, Callable

import torch.fx as fx

from vllm.compilation.compiler_interface import CompilerInterface


class NeuronAdaptor(CompilerInterface):
    name = "neuron"

    def compile(self, graph: fx.GraphModule, example_inputs: list[Any], compiler_config: dict[str, Any],
                compile_range, key: str | None = None) -> tuple[Callable[..., Any] | None, Any | None]:
        from torch_neuronx.compile import _backend

        # No handle: vLLM's own artifact cache is not used; the neuron backend's Inductor FX graph
        # cache applies as to any torch.compile.
        return _backend.neuron_backend(graph, example_inputs), None

"""vLLM platform plugin: ``vllm serve`` and ``vllm.LLM`` on the ``neuron`` device.

vLLM finds this module through the ``vllm.platform_plugins`` entry point of our package and calls
:func:`register`, which names :class:`~torch_neuronx.vllm.platform.NeuronPlatform`. Nothing here
imports vLLM until vLLM itself asks for the platform, so ``import torch_neuronx`` stays free of it.

vLLM lives in its own environment (``make serve-deps`` → ``.venv/serve``, see docs/serving.md).
Setting ``VLLM_TARGET_DEVICE=cpu`` selects vLLM's own CPU backend instead (vLLM treats that
variable as authoritative), which is how ``make bench-serve`` runs both in one environment.
"""

from __future__ import annotations

PLATFORM = "torch_neuronx.vllm.platform.NeuronPlatform"


def register() -> str | None:
    """The ``vllm.platform_plugins`` hook: the platform's qualified name when a ``neuron`` device
    is present, else ``None`` (vLLM then falls back to its built-in platforms)."""
    import torch

    import torch_neuronx  # noqa: F401  (registers the device)

    return PLATFORM if torch.neuron.is_available() else None

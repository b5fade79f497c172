"""How fast, and how much, on Trainium: a performance model of one training or inference step.

``torch_neuronx.estimate(model, inputs, ...)`` (this module is callable) and ``python -m
torch_neuronx.estimate TARGET`` capture one step of one rank at the aten level — on fake tensors at full
size, on ``neuron`` at the size given, or as the kernels torch.compile generates — cost every op with
the engine model of our NKI kernels (matmuls, attention, norms, softmax) and engine/HBM rates (the
rest), every collective from its size, group and the instance topology, and report step time, tokens/s,
MFU, memory per core and $ per 1M tokens per platform. See docs/estimate.md.
"""

from __future__ import annotations

import sys
import types

from torch_neuronx.estimate._api import capture, estimate
from torch_neuronx.estimate._errors import EstimateError
from torch_neuronx.estimate._step import Plan


class _CallableModule(types.ModuleType):
    """``torch_neuronx.estimate(...)`` calls ``estimate``: the package is the function, as the CLI is."""

    def __call__(self, *args, **kwargs):
        return estimate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["EstimateError", "Plan", "capture", "estimate"]

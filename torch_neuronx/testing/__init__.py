"""Testing tools for the ``neuron`` device: comparison with CPU, isolated runs.

``compare(neuron_result, cpu_result)`` walks nested outputs and reports the largest
difference; ``compare_with_float64(neuron_result, cpu_result, float64_result)`` decides,
when they differ beyond the tolerance, whether the device's is as accurate; ``CPUCopy`` copies device arguments to CPU with their exact layout;
``find_divergence(fn)`` names the first aten op whose device result differs from CPU's;
``run_isolated`` runs many checks in worker processes so that one crash or hang does
not end a sweep. The coverage sweeps, which are not part of the installed package
(``coverage/`` in the repository, run by ``make coverage-*``), are built on these.
"""

from torch_neuronx.testing._compare import (
    CPUCopy,
    Diff,
    UnsupportedLayout,
    compare,
    compare_with_float64,
    map_tensors,
    model_tolerance,
    op_tolerance,
    tensors,
    to_cpu,
    to_device,
)
from torch_neuronx.testing._divergence import Divergence, find_divergence
from torch_neuronx.testing._pool import Outcome, run_isolated

__all__ = [
    "CPUCopy", "Diff", "Divergence", "Outcome", "UnsupportedLayout", "compare", "compare_with_float64",
    "find_divergence", "map_tensors", "model_tolerance", "op_tolerance", "run_isolated", "tensors", "to_cpu",
    "to_device",
]  # fmt: skip

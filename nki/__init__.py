"""NKI, the Neuron Kernel Interface, on the simulated NeuronCore.

The language is AWS's (``import nki``, ``nki.language as nl``, ``nki.isa as nisa``, NKI 0.2+
destination-first instructions); kernels written for AWS's toolchain run here unchanged. A
kernel is traced once per signature into a C++ program, checked against the target
NeuronCore's limits (``NkiValidationError`` names the broken rule and the kernel line), and run
in C++ on simulated HBM/SBUF/PSUM. See docs/nki.md.
"""

from . import isa, language, typing
from ._jit import Kernel, TensorSpec, jit, simulate
from ._trace import NkiTensor, NkiValidationError
from ._estimate import benchmark, estimate  # modelled latency, no hardware (docs/estimate.md)

dtype = language.DType  # NKI dtypes are strings ("float32", "bfloat16", ...); the type for annotations

__all__ = ["jit", "simulate", "estimate", "benchmark", "TensorSpec", "Kernel", "NkiTensor", "NkiValidationError", "isa", "language", "typing", "dtype"]

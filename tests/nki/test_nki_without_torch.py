"""``import nki`` needs no torch: the NKI core is its own extension (nki._core) that links no
libtorch, so simulating a kernel on numpy arrays loads neither torch nor the neuron device.
With torch there, torch tensors still work, and once torch_neuronx is loaded the core runs
large tiles on torch's intra-op pool (one pool per process), whichever was imported first."""

import pytest

# A matmul (TensorE, large enough for the executor to split over threads) and an
# elementwise op (VectorE), checked against numpy / torch in the same interpreter.
_KERNEL = """
import nki, nki.language as nl, nki.isa as nisa

@nki.jit
def matmul_add(a_t, b, c):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, nl.load(a_t), nl.load(b))
    nl.store(out, nl.add(acc, nl.load(c)))
    return out
"""

_NUMPY_RUN = _KERNEL + """
import numpy as np
rng = np.random.default_rng(0)
a_t, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((128, 128), (128, 512), (128, 512)))
got = nki.simulate(matmul_add)(a_t, b, c)
np.testing.assert_allclose(got, a_t.T @ b + c, rtol=1e-4, atol=1e-4)
"""


def test_numpy_kernel_loads_neither_torch_nor_the_device(run_python):
    out = run_python(_NUMPY_RUN + """
import sys
maps = open('/proc/self/maps').read()
print('torch' in sys.modules, 'torch_neuronx' in sys.modules, 'libtorch' in maps or 'libc10' in maps,
      nki._core._has_parallel_for())
""", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    # no torch module, no libtorch mapped: the core runs serially, having no pool to use
    assert out.split() == ["False", "False", "False", "False"]


@pytest.mark.parametrize("first", ["nki", "torch"])
def test_torch_tensors_and_torchs_thread_pool(run_python, first):
    imports = "import nki\nimport torch\n" if first == "nki" else "import torch\nimport nki\n"
    out = run_python(imports + _NUMPY_RUN + """
torch.manual_seed(0)
a_t, b, c = torch.randn(128, 128), torch.randn(128, 512), torch.randn(128, 512)
want = a_t.T @ b + c
torch.testing.assert_close(matmul_add(a_t, b, c), want, rtol=1e-4, atol=1e-4)
got = matmul_add(a_t.to('neuron'), b.to('neuron'), c.to('neuron'))
assert got.device.type == 'neuron'
torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
print(nki._core._has_parallel_for())
""", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert out.split() == ["True"]


def test_cpu_tensors_without_the_device(run_python):
    # torch without torch_neuronx (autoload off): CPU tensors work; the core has no pool to take
    out = run_python("import torch\n" + _KERNEL + """
import sys
torch.manual_seed(0)
a_t, b, c = torch.randn(128, 128), torch.randn(128, 512), torch.randn(128, 512)
torch.testing.assert_close(matmul_add(a_t, b, c), a_t.T @ b + c, rtol=1e-4, atol=1e-4)
print('torch_neuronx' in sys.modules, nki._core._has_parallel_for())
""", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.split() == ["False", "False"]


def test_set_parallel_for_refuses_anything_but_a_pool(run_python):
    out = run_python("""
import nki
try:
    nki._core.set_parallel_for(object())
except TypeError as e:
    print(e)
""")
    assert "'neuron.parallel_for' capsule or None" in out

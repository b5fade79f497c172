"""The host GEMM (csrc/cpu/gemm.h) behind the device's 16-bit products and the NKI simulator's
nc_matmul, on every path: NEURON_CPU_GEMM forces one in a fresh interpreter, and the products
must equal the float64 product on CPU, rounded once. A path this CPU lacks is a clear error."""

import pytest

from _subprocess import run_python

PATHS = ["scalar", "avx2", "avx512", "avx512bf16"]


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _missing(path: str) -> list[str]:
    need = {"scalar": [], "avx2": ["avx2", "fma"], "avx512": ["avx512f"],
            "avx512bf16": ["avx512f", "avx512bw", "avx512_bf16"]}[path]
    flags = _cpu_flags()
    return [f for f in need if f not in flags]


_PRODUCTS = r"""
import torch, torch_neuronx
from torch_neuronx.kernels import nki_kernels as K

g = torch.Generator().manual_seed(0)


def check(got, want64, dtype, k):
    # the fp32 sum's error (k roundings of partial sums) plus one rounding to dtype
    assert got.dtype == dtype and got.shape == want64.shape
    got = got.double()
    ulp = torch.finfo(dtype).eps
    bound = want64.abs() * ulp + k * 2.0 ** -24 * want64.abs().max() + 1e-30
    err = (got - want64).abs()
    assert (err <= bound).all(), f"{dtype}: error {(err / bound).max().item():.2f} x the bound"


for dtype in (torch.bfloat16, torch.float16):
    for m, k, n in ((1, 7, 13), (31, 257, 13), (130, 300, 70)):
        a = torch.randn(m, k, generator=g).to(dtype)
        b = torch.randn(k, n, generator=g).to(dtype)
        check((a.to("neuron") @ b.to("neuron")).cpu(), a.double() @ b.double(), dtype, k)
        # transposed operands, as a linear layer's gradients give them
        check((b.t().to("neuron") @ a.t().to("neuron")).cpu(), b.double().t() @ a.double().t(), dtype, k)
    s, x, y = (torch.randn(3, 20, 30, generator=g).to(dtype), torch.randn(3, 20, 65, generator=g).to(dtype),
               torch.randn(3, 65, 30, generator=g).to(dtype))
    got = torch.baddbmm(s.to("neuron"), x.to("neuron"), y.to("neuron"), beta=0.5, alpha=2.0).cpu()
    check(got, 0.5 * s.double() + 2.0 * (x.double() @ y.double()), dtype, 65)

for dtype in (torch.float32, torch.bfloat16):
    a = torch.randn(200, 300, generator=g).to(dtype)
    b = torch.randn(300, 130, generator=g).to(dtype)
    got = K.matmul_kernel(a.to("neuron"), b.to("neuron")).cpu()
    check(got, a.double() @ b.double(), dtype, 300)
print("products ok")
"""

_REFUSED = r"""
import torch, torch_neuronx
from torch_neuronx.kernels import nki_kernels as K

a = torch.ones(4, 8, dtype=torch.bfloat16, device="neuron")
for what, fn in (("device", lambda: a @ a.t()), ("nki", lambda: K.matmul_kernel(a, a.t().contiguous()))):
    try:
        fn()
    except Exception as e:
        print(what, type(e).__name__, e)
    else:
        print(what, "accepted")
"""


@pytest.mark.parametrize("path", PATHS)
def test_each_gemm_path_matches_cpu_or_is_refused(path):
    missing = _missing(path)
    out = run_python(_PRODUCTS if not missing else _REFUSED, env={"NEURON_CPU_GEMM": path, "OMP_NUM_THREADS": "2"})
    if not missing:
        assert "products ok" in out
        return
    for what in ("device", "nki"):
        line = next(l for l in out.splitlines() if l.startswith(what + " "))
        assert "accepted" not in line, line
        assert f"NEURON_CPU_GEMM={path}: this CPU lacks" in line, line
        for feature in missing:
            assert feature.replace("avx512_bf16", "avx512bf16") in line, line


def test_unknown_gemm_path_names_the_choices():
    out = run_python(_REFUSED, env={"NEURON_CPU_GEMM": "avx3"})
    for what in ("device", "nki"):
        line = next(l for l in out.splitlines() if l.startswith(what + " "))
        assert "NEURON_CPU_GEMM='avx3' names no GEMM path; use scalar, avx2, avx512 or avx512bf16" in line, line

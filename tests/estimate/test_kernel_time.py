"""torch_neuronx.estimate._kernels.kernel_time: the engine model (nki.estimate) of our shipped NKI
kernels at a shape, as the step model costs matmuls, attention, norms and softmax. Oracles: the whole
kernel modelled by nki.estimate at the same shape, repeatability, and more work never taking less time."""

import pytest

import nki
from nki import TensorSpec
from torch_neuronx.estimate._kernels import _kernel_time, kernel_time
from torch_neuronx.kernels import nki_kernels


def test_shipped_kernels_reproducible_and_ordered():
    shapes = {"matmul": ((256, 512), (512, 1024)), "softmax": ((256, 1024),), "rmsnorm": ((256, 1024), (1024,)),
              "flash_attention_fwd": ((1, 256, 64),) * 3,
              "flash_attention_bwd": ((1, 256, 64),) * 5 + ((1, 256),)}
    first = {k: kernel_time(k, s, "bfloat16", "trn2", causal=True) for k, s in shapes.items()}
    _kernel_time.cache_clear()
    for k, s in shapes.items():
        again = kernel_time(k, s, "bfloat16", "trn2", causal=True)
        assert again == first[k], k
        assert again.seconds > 0 and again.instructions > 0
    # More work never takes less time; FP32 matmuls (4 passes) are slower than BF16.
    mm = [kernel_time("matmul", ((m, 512), (512, 512))).seconds for m in (128, 256, 512, 1024)]
    assert mm == sorted(mm)
    assert kernel_time("matmul", ((512, 512), (512, 512)), "float32").seconds > mm[2]


def test_a_shape_traced_whole_is_nki_estimates_time_of_the_kernel():
    a, b = TensorSpec((256, 512), "bfloat16"), TensorSpec((512, 512), "bfloat16")
    for platform in ("trn1", "trn3"):
        whole = nki.estimate(nki_kernels.matmul_kernel, platform=platform)(a, b)
        t = kernel_time("matmul", ((256, 512), (512, 512)), "bfloat16", platform)
        assert t.seconds * 1e9 == pytest.approx(whole.latency_ns, rel=1e-12)
        assert t.flops == 2.0 * 256 * 512 * 512
        assert t.assumptions == whole.assumptions  # no extrapolation note: modelled whole
    # the platform model's aliases name the same chip
    assert kernel_time("softmax", ((128, 256),), platform="gen3") == kernel_time("softmax", ((128, 256),))


def test_large_shapes_are_extrapolated_close_to_the_whole_model():
    whole = nki.estimate(nki_kernels.matmul_kernel, platform="trn2")(
        TensorSpec((2048, 1024), "bfloat16"), TensorSpec((1024, 512), "bfloat16")).latency_ns
    fitted = kernel_time("matmul", ((2048, 1024), (1024, 512)), "bfloat16", "trn2")
    assert any("extrapolated" in a for a in fitted.assumptions)
    assert fitted.seconds * 1e9 == pytest.approx(whole, rel=0.05)


def test_unknown_platform_or_kernel_is_a_value_error():
    with pytest.raises(ValueError, match="unknown platform 'h100': kernel_time models trn1"):
        kernel_time("matmul", ((128, 128), (128, 128)), platform="h100")
    with pytest.raises(ValueError, match="unknown shipped kernel 'gemm'; expected one of matmul, softmax"):
        kernel_time("gemm", ((128, 128), (128, 128)))

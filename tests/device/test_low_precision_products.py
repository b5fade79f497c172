"""bf16 and fp16 matrix products and convolutions on neuron: exact products of the 16-bit
operands, accumulated in fp32, rounded once to the result's dtype, as the PE array computes
them (widens in csrc/aten/kernel.h; matmul.cpp, ops.cpp).

The oracle is the same computation in float64 on CPU, rounded to the dtype: the correctly
rounded result. An fp32 accumulation rounded once differs from it only where the fp32 sum lies
within its own error of a rounding boundary (rare, and then by one unit in the last place); a
kernel that rounds partial sums to 16 bits misses it far more often."""

import pytest
import torch
import torch.nn.functional as F

DTYPES = [torch.bfloat16, torch.float16]


def _g():
    return torch.Generator().manual_seed(0)


def rand(*shape, dtype, g):
    return torch.randn(shape, generator=g).to(dtype)


def exact(fn, *args, **kw):
    """fn in float64 on the (16-bit exact) CPU values."""
    return fn(*[a.double() if isinstance(a, torch.Tensor) else a for a in args], **kw)


def on_neuron(fn, *args, **kw):
    return fn(*[a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args], **kw)


def assert_rounded_once(got, want64, dtype):
    """got (16-bit, neuron) is want64 rounded to dtype, up to one ulp in rare elements."""
    assert got.device.type == "neuron" and got.dtype == dtype
    got = got.cpu()
    want = want64.to(dtype)
    assert got.shape == want.shape
    fi = torch.finfo(dtype)
    # the unit in the last place of the larger of the two (they may lie in different binades)
    exponent = torch.frexp(torch.maximum(want.double().abs(), got.double().abs())).exponent.double()
    ulp = (2.0 ** (exponent - 1) * fi.eps).clamp_min(fi.smallest_normal * fi.eps)
    # plus the fp32 sum's own error, which shows in results near zero (cancellation)
    fp32_sum = 1e-6 * want64.abs().max().item()
    err = (got.double() - want.double()).abs()
    assert (err <= ulp * 1.0001 + fp32_sum).all(), f"largest error {(err / ulp).max():.2f} ulp"
    mismatched = (got != want).double().mean().item()
    assert mismatched < 0.01, f"{mismatched:.2%} of elements not correctly rounded"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 300, 70), (1, 384, 320), (320, 384, 1), (5, 1000, 3)])
def test_mm_is_rounded_once(dtype, shape):
    m, k, n = shape
    g = _g()
    a, b = rand(m, k, dtype=dtype, g=g), rand(k, n, dtype=dtype, g=g)
    assert_rounded_once(on_neuron(torch.mm, a, b), exact(torch.mm, a, b), dtype)
    # transposed operands, as linear layers and their gradients give them
    assert_rounded_once(on_neuron(torch.mm, b.t(), a.t()), exact(torch.mm, b.t(), a.t()), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_shape", [(), (70,), (1, 70), (64, 70)])
def test_addmm_bias_alpha_beta(dtype, bias_shape):
    g = _g()
    s, a, b = rand(*bias_shape, dtype=dtype, g=g), rand(64, 300, dtype=dtype, g=g), rand(300, 70, dtype=dtype, g=g)
    for beta, alpha in [(1, 1), (0.5, 2.0)]:
        got = on_neuron(torch.addmm, s, a, b, beta=beta, alpha=alpha)
        assert_rounded_once(got, exact(torch.addmm, s, a, b, beta=beta, alpha=alpha), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_and_in_place_forms_equal_the_functional_result(dtype):
    g = _g()
    s, a, b = rand(64, 70, dtype=dtype, g=g), rand(64, 300, dtype=dtype, g=g), rand(300, 70, dtype=dtype, g=g)
    ns, na, nb = s.to("neuron"), a.to("neuron"), b.to("neuron")
    want = torch.addmm(ns, na, nb, beta=0.5, alpha=2.0)
    out = torch.empty(0, device="neuron", dtype=dtype)  # resized, as on CPU
    assert torch.equal(torch.addmm(ns, na, nb, beta=0.5, alpha=2.0, out=out).cpu(), want.cpu())
    assert torch.equal(torch.mm(na, nb, out=torch.empty(64, 70, device="neuron", dtype=dtype)).cpu(),
                       torch.mm(na, nb).cpu())
    inplace = ns.clone()
    assert inplace.addmm_(na, nb, beta=0.5, alpha=2.0) is inplace
    assert torch.equal(inplace.cpu(), want.cpu())
    # out aliasing self: the product is complete before it is written
    alias = ns.clone()
    torch.addmm(alias, na, nb, out=alias)
    assert torch.equal(alias.cpu(), torch.addmm(ns, na, nb).cpu())

    bs, b1, b2 = rand(3, 20, 30, dtype=dtype, g=g), rand(3, 20, 200, dtype=dtype, g=g), rand(3, 200, 30, dtype=dtype, g=g)
    nbs, nb1, nb2 = bs.to("neuron"), b1.to("neuron"), b2.to("neuron")
    assert_rounded_once(torch.bmm(nb1, nb2), exact(torch.bmm, b1, b2), dtype)
    assert_rounded_once(torch.baddbmm(nbs, nb1, nb2, beta=0.5, alpha=2.0),
                        exact(torch.baddbmm, bs, b1, b2, beta=0.5, alpha=2.0), dtype)
    assert torch.equal(torch.bmm(nb1, nb2, out=torch.empty(0, device="neuron", dtype=dtype)).cpu(),
                       torch.bmm(nb1, nb2).cpu())
    inplace = nbs.clone()
    assert inplace.baddbmm_(nb1, nb2) is inplace
    assert torch.equal(inplace.cpu(), torch.baddbmm(nbs, nb1, nb2).cpu())


def test_mismatched_operands_raise_as_on_cpu():
    g = _g()
    a, b = rand(8, 16, dtype=torch.bfloat16, g=g), rand(16, 4, dtype=torch.float16, g=g)
    for fn, args in [(torch.mm, (a, b)), (torch.addmm, (torch.zeros(8, 4, dtype=a.dtype), a, b))]:
        with pytest.raises(RuntimeError) as cpu:
            fn(*args)
        with pytest.raises(RuntimeError) as dev:
            on_neuron(fn, *args)
        assert str(dev.value) == str(cpu.value)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        on_neuron(torch.mm, a, a)
    with pytest.raises(RuntimeError):  # addmm_ never broadcasts self
        torch.zeros(8, 1, device="neuron", dtype=torch.bfloat16).addmm_(a.to("neuron"), a.t().to("neuron"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_layer_forward_and_gradients(dtype):
    g = _g()
    x, w, bias, dy = (rand(*s, dtype=dtype, g=g) for s in [(4, 9, 96), (80, 96), (80,), (4, 9, 80)])
    xn, wn, bn = (t.to("neuron").requires_grad_() for t in (x, w, bias))
    y = F.linear(xn, wn, bn)
    y.backward(dy.to("neuron"))
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, bias))
    y64 = F.linear(x64, w64, b64)
    y64.backward(dy.double())
    assert_rounded_once(y, y64.detach(), dtype)
    assert_rounded_once(xn.grad, x64.grad, dtype)
    assert_rounded_once(wn.grad, w64.grad, dtype)
    assert_rounded_once(bn.grad, b64.grad, dtype)


CONVS = {
    "conv1d": (F.conv1d, (2, 16, 50), (24, 16, 5), dict(padding=2)),
    "conv2d strided, grouped": (F.conv2d, (2, 8, 12, 12), (16, 4, 3, 3), dict(stride=2, padding=1, groups=2)),
    "conv_transpose2d": (F.conv_transpose2d, (2, 8, 7, 7), (8, 6, 3, 3), dict(stride=2)),
    "conv3d": (F.conv3d, (1, 4, 5, 6, 6), (6, 4, 3, 3, 3), dict(padding=1)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("conv", CONVS)
def test_convolution_forward_and_backward(dtype, conv):
    fn, xs, ws, kw = CONVS[conv]
    g = _g()
    x, w = rand(*xs, dtype=dtype, g=g), rand(*ws, dtype=dtype, g=g)
    out_channels = ws[1] * kw.get("groups", 1) if fn is F.conv_transpose2d else ws[0]
    bias = rand(out_channels, dtype=dtype, g=g)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, bias))
    y64 = fn(x64, w64, b64, **kw)
    dy = rand(*y64.shape, dtype=dtype, g=g)
    y64.backward(dy.double())

    xn, wn, bn = (t.to("neuron").requires_grad_() for t in (x, w, bias))
    y = fn(xn, wn, bn, **kw)
    y.backward(dy.to("neuron"))
    assert_rounded_once(y, y64.detach(), dtype)
    assert_rounded_once(xn.grad, x64.grad, dtype)
    assert_rounded_once(wn.grad, w64.grad, dtype)
    assert_rounded_once(bn.grad, b64.grad, dtype)


def test_channels_last_bf16_convolution_returns_what_fake_tensors_describe():
    g = _g()
    x = rand(2, 8, 10, 10, dtype=torch.bfloat16, g=g).to(memory_format=torch.channels_last)
    w = rand(16, 8, 3, 3, dtype=torch.bfloat16, g=g)
    y = on_neuron(F.conv2d, x, w)
    assert y.is_contiguous()
    assert_rounded_once(y, exact(F.conv2d, x, w), torch.bfloat16)


def test_mixed_dtype_convolution_raises_as_on_cpu():
    g = _g()
    x, w = rand(1, 3, 8, 8, dtype=torch.bfloat16, g=g), rand(4, 3, 3, 3, dtype=torch.float32, g=g)
    with pytest.raises(RuntimeError) as cpu:
        F.conv2d(x, w)
    with pytest.raises(RuntimeError) as dev:
        on_neuron(F.conv2d, x, w)
    assert str(dev.value) == str(cpu.value)

"""mm/addmm with one row or one column take neuron's matrix-vector path (csrc/aten/matmul.cpp).

The oracle is the product in float64: the path accumulates in fp32 in a fixed order, so it
is held to fp32 accuracy, not to the BLAS's bits."""

import pytest
import torch

K = 384  # large enough for the path (at least 2**16 matrix elements with N below)
N = 320
# fp32 sums of a few hundred unit-size products: a few ulps of the partial sums.
ATOL = 1e-4


def ref(fn, *args):
    return fn(*[a.double() if isinstance(a, torch.Tensor) else a for a in args]).float()


def on_neuron(fn, *args):
    return fn(*[a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args])


def assert_matches(fn, *args):
    got = on_neuron(fn, *args)
    want = ref(fn, *args)
    assert got.device.type == "neuron"
    assert got.shape == want.shape
    assert got.stride() == fn(*args).stride()  # the layout the CPU kernel gives
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=ATOL)
    return got


def _g():
    return torch.Generator().manual_seed(0)


LAYOUTS = {
    # (x, w): y = x @ w, one row
    "row, w transposed (linear)": lambda g: (torch.randn(1, K, generator=g), torch.randn(N, K, generator=g).t()),
    "row, w row-major": lambda g: (torch.randn(1, K, generator=g), torch.randn(K, N, generator=g)),
    "row, strided x": lambda g: (torch.randn(1, 2 * K, generator=g)[:, ::2], torch.randn(N, K, generator=g).t()),
    "row, x a column view": lambda g: (torch.randn(K, 1, generator=g).t(), torch.randn(K, N, generator=g)),
    # one column
    "column, a row-major": lambda g: (torch.randn(N, K, generator=g), torch.randn(K, 1, generator=g)),
    "column, a transposed": lambda g: (torch.randn(K, N, generator=g).t(), torch.randn(K, 1, generator=g)),
    "column, strided v": lambda g: (torch.randn(N, K, generator=g), torch.randn(K, 3, generator=g)[:, 1:2]),
    "dot as mm": lambda g: (torch.randn(1, 1 << 16, generator=g), torch.randn(1 << 16, 1, generator=g)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mm_matches_float64(layout):
    a, b = LAYOUTS[layout](_g())
    assert_matches(torch.mm, a, b)
    assert_matches(torch.matmul, a, b)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mm_out_writes_the_given_tensor(layout):
    a, b = LAYOUTS[layout](_g())
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="neuron")
    ptr = out.data_ptr()
    r = torch.mm(a.to("neuron"), b.to("neuron"), out=out)
    assert r is out and out.data_ptr() == ptr
    torch.testing.assert_close(out.cpu(), ref(torch.mm, a, b), rtol=1e-5, atol=ATOL)


def test_mm_out_strided_and_resized_outputs():
    a, b = LAYOUTS["row, w transposed (linear)"](_g())
    # A column of a wider tensor: the path writes with the output's stride.
    wide = torch.zeros(N, 3, device="neuron")
    torch.mm(b.t().to("neuron"), a.t().to("neuron"), out=wide[:, 1:2])
    torch.testing.assert_close(wide[:, 1].cpu(), ref(torch.mm, a, b)[0], rtol=1e-5, atol=ATOL)
    assert torch.count_nonzero(wide[:, [0, 2]]).item() == 0
    # A wrongly sized out= is resized as on the CPU.
    out = torch.empty(0, device="neuron")
    torch.mm(a.to("neuron"), b.to("neuron"), out=out)
    assert out.shape == (1, N)
    torch.testing.assert_close(out.cpu(), ref(torch.mm, a, b), rtol=1e-5, atol=ATOL)


@pytest.mark.parametrize("bias_shape", ["scalar", "n", "1xn", "mxn"])
@pytest.mark.parametrize("row", [True, False])
def test_addmm_bias_broadcast_alpha_beta(bias_shape, row):
    g = _g()
    if row:
        a, b = torch.randn(1, K, generator=g), torch.randn(N, K, generator=g).t()
        M, n = 1, N
    else:
        a, b = torch.randn(N, K, generator=g), torch.randn(K, 1, generator=g)
        M, n = N, 1
    shape = {"scalar": (), "n": (n,), "1xn": (1, n), "mxn": (M, n)}[bias_shape]
    bias = torch.randn(shape, generator=g)
    for beta, alpha in ((1, 1), (0.5, 2.0), (-1, 0.25)):
        assert_matches(lambda s, x, y: torch.addmm(s, x, y, beta=beta, alpha=alpha), bias, a, b)
        out = torch.empty(M, n, device="neuron")
        torch.addmm(bias.to("neuron"), a.to("neuron"), b.to("neuron"), beta=beta, alpha=alpha, out=out)
        torch.testing.assert_close(out.cpu(), ref(lambda s, x, y: torch.addmm(s, x, y, beta=beta, alpha=alpha),
                                                  bias, a, b), rtol=1e-5, atol=ATOL)


def test_addmm_beta_zero_ignores_nan_in_self_as_blas_does():
    a, b = LAYOUTS["row, w transposed (linear)"](_g())
    bias = torch.full((N,), float("nan"))
    got = torch.addmm(bias.to("neuron"), a.to("neuron"), b.to("neuron"), beta=0)
    assert not got.isnan().any()
    torch.testing.assert_close(got.cpu(), torch.addmm(bias, a, b, beta=0), rtol=1e-5, atol=ATOL)


def test_addmm_out_aliasing_self_matches_cpu():
    a, b = LAYOUTS["row, w transposed (linear)"](_g())
    s = torch.randn(1, N, generator=_g())
    ns = s.to("neuron")
    torch.addmm(ns, a.to("neuron"), b.to("neuron"), out=ns)
    torch.addmm(s, a, b, out=s)
    torch.testing.assert_close(ns.cpu(), s, rtol=1e-5, atol=ATOL)


def test_bad_shapes_and_dtypes_raise_as_on_cpu():
    a, b = LAYOUTS["row, w transposed (linear)"](_g())
    na, nb = a.to("neuron"), b.to("neuron")
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(na, nb.t())
    with pytest.raises(RuntimeError, match="expected .* same dtype|expected m1 and m2 to have the same dtype"):
        torch.mm(na, nb.double())
    with pytest.raises(RuntimeError):
        torch.addmm(torch.zeros(7, device="neuron"), na, nb)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(na, b)


def test_gradients_of_a_one_token_linear_layer():
    g = _g()
    x = torch.randn(1, 1, K, generator=g)
    lin = torch.nn.Linear(K, N)
    lin_n = torch.nn.Linear(K, N).to("neuron")
    lin_n.load_state_dict(lin.state_dict())
    xn = x.to("neuron").requires_grad_()
    xc = x.clone().requires_grad_()
    w = torch.randn(1, 1, N, generator=g)
    (lin_n(xn) * w.to("neuron")).sum().backward()
    (lin(xc) * w).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(lin_n.weight.grad.cpu(), lin.weight.grad, rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(lin_n.bias.grad.cpu(), lin.bias.grad)


def test_results_are_deterministic_across_thread_counts():
    big = torch.randn(1, 4096, generator=_g()), torch.randn(4096, 1024, generator=_g())
    a, b = (t.to("neuron") for t in big)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [torch.mm(a, b).cpu(), torch.mm(b.t(), a.t()).cpu()]
        torch.set_num_threads(max(2, threads))
        many = [torch.mm(a, b).cpu(), torch.mm(b.t(), a.t()).cpu()]
    finally:
        torch.set_num_threads(threads)
    for x, y in zip(one, many):
        assert torch.equal(x, y)


def test_results_are_device_memory_on_the_operands_device():
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    a, b = LAYOUTS["row, w transposed (linear)"](_g())
    na, nb = a.to("neuron:1"), b.to("neuron:1")
    before = [torch.neuron.memory_allocated(d) for d in (0, 1)]
    y = torch.mm(na, nb)
    assert y.device == torch.device("neuron", 1)
    # The result is allocated by the device's allocator, on the operands' device.
    assert torch.neuron.memory_allocated(1) - before[1] >= y.numel() * 4
    assert torch.neuron.memory_allocated(0) == before[0]
    torch.testing.assert_close(y.cpu(), ref(torch.mm, a, b), rtol=1e-5, atol=ATOL)


def test_float64_keeps_the_cpu_kernel():
    # (bf16 and fp16 take this path in fp32: tests/device/test_low_precision_products.py)
    a, b = LAYOUTS["row, w transposed (linear)"](_g())
    got = torch.mm(a.to("neuron", torch.float64), b.to("neuron", torch.float64))
    assert got.dtype == torch.float64
    assert torch.equal(got.cpu(), torch.mm(a.double(), b.double()))

"""Eager ops on neuron against CPU: dtypes, views, in-place/out=, fallback tracking and
policy, mixed-device errors, autocast, GradScaler, serialization."""

import io
import warnings

import pytest
import torch


def both(fn, *cpu_args):
    """Run fn on CPU args and on their neuron copies; return (neuron result on CPU, CPU result)."""
    dev_args = [a.to("neuron") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    n = fn(*dev_args)
    c = fn(*cpu_args)
    return n, c


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.int32, torch.bfloat16, torch.float16, torch.bool])
def test_no_dtype_is_silently_changed(dtype):
    x = (torch.arange(24).reshape(4, 6) % 5).to(dtype)
    n = x.to("neuron")
    assert n.dtype == dtype
    assert torch.equal(n.cpu(), x)
    if dtype != torch.bool:
        r = n * 2 + 1
        assert r.dtype == (x * 2 + 1).dtype
        assert torch.equal(r.cpu(), x * 2 + 1)
    big = torch.tensor([2**40 + 3], dtype=torch.int64, device="neuron")
    assert int((big + 1).item()) == 2**40 + 4
    d = torch.tensor([1.0 + 1e-12], dtype=torch.float64, device="neuron")
    assert (d - 1.0).item() == pytest.approx(1e-12, rel=1e-6)


def test_hot_ops_match_cpu():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(32, 48, generator=g)
    b = torch.randn(48, 16, generator=g)
    bias = torch.randn(16, generator=g)
    checks = [
        (lambda a, b, c: a @ b, (a, b, bias)),
        (lambda a, b, c: torch.addmm(c, a, b), (a, b, bias)),
        (lambda a, b, c: torch.nn.functional.linear(a, b.t(), c), (a, b, bias)),
        (lambda a, b, c: torch.bmm(a.view(4, 8, 48), b.expand(4, 48, 16)), (a, b, bias)),
        (lambda a, b, c: torch.softmax(a, -1), (a, b, bias)),
        (lambda a, b, c: torch.log_softmax(a, 0), (a, b, bias)),
        (lambda a, b, c: torch.nn.functional.layer_norm(a, (48,)), (a, b, bias)),
        (lambda a, b, c: torch.nn.functional.rms_norm(a, (48,)), (a, b, bias)),
        (lambda a, b, c: torch.nn.functional.silu(a) * torch.sigmoid(a) + torch.tanh(a), (a, b, bias)),
        (lambda a, b, c: torch.nn.functional.gelu(a, approximate="tanh"), (a, b, bias)),
        (lambda a, b, c: a.sum(1) + a.mean(0).sum() + a.amax(1) + a.var(1), (a, b, bias)),
        (lambda a, b, c: torch.cat([a, a * 2], 1)[:, ::3].contiguous(), (a, b, bias)),
        (lambda a, b, c: a.t()[5:9].reshape(-1), (a, b, bias)),
        (lambda a, b, c: torch.where(a > 0, a, c.sum()), (a, b, bias)),
        (lambda a, b, c: a.topk(3, dim=1).values, (a, b, bias)),
        (lambda a, b, c: torch.cumsum(a, 1), (a, b, bias)),
    ]
    for fn, args in checks:
        n, c = both(fn, *args)
        assert n.device.type == "neuron"
        torch.testing.assert_close(n.cpu(), c, atol=1e-5, rtol=1e-4)


def test_embedding_indexing_and_sdpa():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(50, 8, generator=g)
    idx = torch.randint(0, 50, (4, 6), generator=g)
    n, c = both(lambda w, i: torch.nn.functional.embedding(i, w), w, idx)
    torch.testing.assert_close(n.cpu(), c)
    n, c = both(lambda w, i: w[i[0]] + w.index_select(0, i[1]), w, idx)
    torch.testing.assert_close(n.cpu(), c)
    mask = w > 0
    n, c = both(lambda w, m: w[m], w, mask)
    torch.testing.assert_close(n.cpu(), c)
    # CPU index tensors are accepted for indexing, as on CUDA
    wn = w.to("neuron")
    torch.testing.assert_close(wn[idx[0]].cpu(), w[idx[0]])
    q, k, v = (torch.randn(2, 4, 10, 8, generator=g) for _ in range(3))
    n, c = both(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
    torch.testing.assert_close(n.cpu(), c, atol=1e-5, rtol=1e-4)


def test_autograd_matches_cpu():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 8, generator=g)
    x = torch.randn(4, 16, generator=g)

    def run(device):
        wd = w.to(device).requires_grad_()
        xd = x.to(device).requires_grad_()
        y = torch.nn.functional.gelu(xd @ wd).softmax(-1)
        loss = torch.nn.functional.cross_entropy(y, torch.tensor([1, 2, 3, 0], device=device))
        loss.backward()
        return loss.detach().cpu(), wd.grad.cpu(), xd.grad.cpu()

    for n, c in zip(run("neuron"), run("cpu")):
        torch.testing.assert_close(n, c, atol=1e-6, rtol=1e-5)


def test_in_place_out_and_views_write_through():
    x = torch.zeros(4, 6, device="neuron")
    v = x[1:3, ::2]
    v.add_(5)
    x.t()[0].fill_(-1)
    ref = torch.zeros(4, 6)
    ref[1:3, ::2] += 5
    ref.t()[0] = -1
    assert torch.equal(x.cpu(), ref)
    out = torch.empty(0, device="neuron")
    torch.mul(x, 2, out=out)  # out= resizes
    assert out.shape == (4, 6) and torch.equal(out.cpu(), ref * 2)
    y = torch.zeros(0, device="neuron")
    y.resize_(3, 5).fill_(2)
    assert y.shape == (3, 5) and torch.equal(y.cpu(), torch.full((3, 5), 2.0))
    z = torch.arange(10.0, device="neuron")
    z.unsqueeze(0).mul_(3)
    assert torch.equal(z.cpu(), torch.arange(10.0) * 3)
    base = torch.arange(12.0, device="neuron")
    view = base.view(3, 4)
    assert view._base is base and view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_mixed_devices_raise_the_cuda_error():
    a = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least "
                                           "two devices, neuron:0 and cpu!"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="neuron:0 and neuron:1"):
        torch.mm(torch.ones(2, 2, device="neuron:0"), torch.ones(2, 2, device="neuron:1"))
    with pytest.raises(RuntimeError, match="same device"):
        torch.nn.Linear(3, 3)(a)  # CPU weights, neuron input
    # a CPU scalar tensor is fine, as with CUDA
    assert torch.equal((a * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


def test_outputs_on_another_device_raise_the_cuda_error():
    # an argument the op writes (out=, self of an in-place op) must be on the op's device, even a
    # 0-dim CPU tensor, which only mixes in as an input (a CPU scalar); nothing is written
    x = torch.tensor([0.0, 1.0, 2.0, 0.0], device="neuron")
    mismatch = "Expected all tensors to be on the same device, but found at least two devices, "
    cases = [
        (lambda out: torch.nonzero(x, out=out), torch.full([], -1, dtype=torch.long)),  # boxed fallback
        (lambda out: torch.add(x, x, out=out), torch.full((4,), -1.0)),  # explicit kernel
        (lambda out: out.add_(x[1]), torch.full([], -1.0)),  # in-place on a CPU scalar
        (lambda out: torch.histc(x.long(), bins=4, min=0, max=4, out=out), torch.full((4,), -1, dtype=torch.long)),
    ]
    for call, out in cases:
        with pytest.raises(RuntimeError, match=mismatch + "neuron:0 and cpu!"):
            call(out)
        assert (out == -1).all(), "the CPU tensor was written"
        with pytest.raises(RuntimeError, match=mismatch + "neuron:[01] and neuron:[01]!"):
            call(out.to("neuron:1"))


@pytest.mark.parametrize("index", [torch.tensor([0, 2]), torch.tensor(1)], ids=["vector", "scalar"])
def test_index_fill_takes_no_cpu_index_as_on_cuda(index):
    # CUDA's index_fill_ iterates the index with self (TensorIterator), so a CPU index raises, a
    # 0-dim one too; the fill value may be a CPU scalar tensor
    t = torch.zeros(3, 4, device="neuron")
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, neuron:0 and cpu!"):
        t.index_fill_(0, index, 1.0)
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, neuron:0 and cpu!"):
        t.index_fill(1, index, torch.tensor(1.0))
    assert torch.equal(t.cpu(), torch.zeros(3, 4))
    n, c = both(lambda a, i: a.index_fill_(0, i, torch.tensor(2.0)), torch.zeros(3, 4), index)
    assert torch.equal(n.cpu(), c)


def test_fallback_is_tracked_and_policy_applies():
    torch.neuron.clear_op_tracking()
    x = torch.randn(8, 8, device="neuron")
    y = x @ x
    assert torch.neuron.get_executed_ops().get("aten::mm") == 1
    assert "aten::mm" not in torch.neuron.get_fallback_ops()
    r = torch.trace(x)  # no explicit kernel: generic fallback
    torch.testing.assert_close(r.cpu(), torch.trace(x.cpu()))
    assert r.device.type == "neuron"
    assert torch.neuron.get_fallback_ops() == {"aten::trace": 1}
    with torch.neuron.fallback_policy("error"):
        assert torch.neuron.get_fallback_policy() == "error"
        torch.neuron.clear_op_tracking()
        with pytest.raises(NotImplementedError, match="has no native neuron kernel.*set_fallback_policy"):
            torch.trace(x)
        assert torch.neuron.get_fallback_ops() == {}  # refused, so it did not run
        (x + y).sum()  # explicit kernels still run
    with torch.neuron.fallback_policy("warn"):
        with pytest.warns(UserWarning, match="generic fallback"):
            torch.bincount(torch.tensor([1, 2, 2], device="neuron"))
    assert torch.neuron.get_fallback_policy() == "silent"
    with pytest.raises(ValueError, match="Unknown fallback policy"):
        torch.neuron.set_fallback_policy("loud")
    with pytest.raises(TypeError, match="fallback policy must be"):
        torch.neuron.set_fallback_policy(3)
    torch.neuron.clear_op_tracking()
    assert torch.neuron.get_fallback_ops() == {}


def test_fallback_policy_from_env(run_python):
    out = run_python(
        "import torch\n"
        "x = torch.randn(3, device='neuron')\n"
        "try:\n"
        "    torch.trace(x.view(3, 1))\n"
        "except NotImplementedError as e:\n"
        "    print('blocked', 'aten::trace' in str(e))\n",
        env={"TORCH_NEURONX_FALLBACK_POLICY": "error"},
    )
    assert out.split() == ["blocked", "True"]


def test_autocast_bf16():
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    lin_n = torch.nn.Linear(16, 8).neuron()
    lin_n.load_state_dict(lin.state_dict())
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = lin_n(x.neuron())
        s = torch.softmax(y, -1)  # fp32 op list
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yc = lin(x)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    torch.testing.assert_close(y.float().cpu(), yc.float(), atol=1e-2, rtol=1e-2)
    assert torch.get_autocast_dtype("neuron") == torch.bfloat16
    with torch.neuron.amp.autocast():
        assert lin_n(x.neuron()).dtype == torch.bfloat16


def test_grad_scaler_unscales_and_skips_inf_steps():
    model = torch.nn.Linear(4, 1).neuron()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron", init_scale=1024.0)
    before = model.weight.detach().cpu().clone()
    loss = model(torch.ones(2, 4, device="neuron")).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    # unscaled gradient: d(sum(Wx+b))/dW = 2 per weight
    torch.testing.assert_close(model.weight.detach().cpu(), before - 0.1 * 2.0)
    assert scaler.get_scale() == 1024.0
    # an inf gradient skips the step and halves the scale
    opt.zero_grad()
    w = model.weight.detach().cpu().clone()
    loss = model(torch.full((2, 4), float("inf"), device="neuron")).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.detach().cpu(), w)
    assert scaler.get_scale() == 512.0


def test_save_and_load(tmp_path):
    sd = {"w": torch.randn(5, 3, device="neuron:1"), "i": torch.arange(4, device="neuron")}
    path = tmp_path / "ckpt.pt"
    torch.save(sd, path)
    back = torch.load(path)
    assert back["w"].device == torch.device("neuron", 1)
    assert torch.equal(back["w"].cpu(), sd["w"].cpu()) and back["i"].dtype == torch.int64
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["w"].device.type == "cpu" and torch.equal(on_cpu["w"], sd["w"].cpu())
    moved = torch.load(path, map_location="neuron:2")
    assert moved["w"].device == torch.device("neuron", 2)
    buf = io.BytesIO()
    torch.save(torch.nn.Linear(3, 2).neuron().state_dict(), buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["weight"].device.type == "neuron"


def test_load_onto_a_missing_device_is_a_clear_error(tmp_path, run_python):
    path = tmp_path / "t.pt"
    torch.save(torch.ones(2, device="neuron:3"), path)
    out = run_python(
        f"import torch\ntorch.load({str(path)!r})\n", env={"NEURON_RT_VISIBLE_CORES": "0"}, expect_rc=1
    )
    assert "Attempting to deserialize object on NEURON device 3 but torch.neuron.device_count() is 1" in out
    out = run_python(f"import torch\ntorch.load({str(path)!r})\n", env={"NEURON_RT_VISIBLE_CORES": ""}, expect_rc=1)
    assert "torch.neuron.is_available() is False" in out and "map_location=torch.device('cpu')" in out
    out = run_python(
        f"import torch\nprint(torch.load({str(path)!r}, map_location='cpu').device)\n",
        env={"NEURON_RT_VISIBLE_CORES": ""},
    )
    assert out.strip() == "cpu"


def test_sdpa_takes_the_cpu_flash_kernel():
    # The backend choice is CPU's, so the fused flash kernel runs (not the unfused math path),
    # results equal CPU's, and a mask that requires grad takes the differentiable path.
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 12, 16, generator=g) for _ in range(3))
    torch.neuron.clear_op_tracking()
    with torch.neuron.fallback_policy("error"):
        n, c = both(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
    assert torch.equal(n.cpu(), c)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in torch.neuron.get_executed_ops()
    mask = torch.randn(12, 12, generator=g, requires_grad=True)
    mask_n = mask.detach().to("neuron").requires_grad_()
    torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    qn, kn, vn = (t.to("neuron") for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(qn, kn, vn, attn_mask=mask_n).sum().backward()
    torch.testing.assert_close(mask_n.grad.cpu(), mask.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("transposed", [False, True])
def test_convolution_forward_and_backward(transposed):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 9, 9, generator=g, requires_grad=True)
    w = torch.randn(3, 4, 3, 3, generator=g, requires_grad=True) if transposed else \
        torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    b = torch.randn(4, generator=g, requires_grad=True)
    conv = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
    xn, wn, bn = (t.detach().to("neuron").requires_grad_() for t in (x, w, b))
    y, yn = conv(x, w, b, stride=2, padding=1), conv(xn, wn, bn, stride=2, padding=1)
    assert yn.device.type == "neuron"
    torch.testing.assert_close(yn.cpu(), y)
    gy = torch.randn(y.shape, generator=g)
    y.backward(gy)
    yn.backward(gy.to("neuron"))
    for a, e in ((xn, x), (wn, w), (bn, b)):
        torch.testing.assert_close(a.grad.cpu(), e.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialiased_resize_in_half_precision_like_cuda(mode, dtype):
    # CUDA computes antialiased resizes in bf16/fp16 (accumulating in float32); ATen's CPU
    # kernels refuse them. On neuron: the float32 result rounded once, forward and backward.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 7, generator=g).to(dtype)
    grad = torch.randn(2, 3, 5, 4, generator=g).to(dtype)
    xn = x.to("neuron").requires_grad_()
    out = torch.nn.functional.interpolate(xn, size=(5, 4), mode=mode, antialias=True)
    out.backward(grad.to("neuron"))
    xf = x.float().requires_grad_()
    ref = torch.nn.functional.interpolate(xf, size=(5, 4), mode=mode, antialias=True)
    ref.backward(grad.float())
    assert out.dtype == dtype and xn.grad.dtype == dtype
    assert torch.equal(out.cpu(), ref.to(dtype))
    assert torch.equal(xn.grad.cpu(), xf.grad.to(dtype))
    # upsampling too, and float32 unchanged (the CPU's kernel)
    up = torch.nn.functional.interpolate(x.to("neuron"), scale_factor=2.5, mode=mode, antialias=True)
    assert torch.equal(up.cpu(), torch.nn.functional.interpolate(x.float(), scale_factor=2.5, mode=mode,
                                                                 antialias=True).to(dtype))
    f32 = torch.nn.functional.interpolate(x.float().to("neuron"), size=(5, 4), mode=mode, antialias=True)
    assert torch.equal(f32.cpu(), ref.detach())


def test_integer_histc_counts_like_cuda():
    # CUDA accepts integer input (MoE routers count tokens per expert this way); CPU does not.
    ids = torch.randint(0, 8, (200,), dtype=torch.int32, generator=torch.Generator().manual_seed(4))
    n = torch.histc(ids.to("neuron"), bins=8, min=0, max=7)
    assert n.dtype == torch.int32 and n.device.type == "neuron"
    assert torch.equal(n.cpu(), torch.bincount(ids, minlength=8).to(torch.int32))
    out = torch.empty(0, dtype=torch.int32, device="neuron")
    torch.histc(ids.to("neuron"), bins=8, min=0, max=7, out=out)
    assert torch.equal(out.cpu(), n.cpu())
    f = torch.randn(100)
    torch.testing.assert_close(torch.histc(f.to("neuron"), bins=5).cpu(), torch.histc(f, bins=5))


def test_cpu_kernel_is_preferred_over_composite():
    # addr has a CPU kernel and a composite one; the device must compute what CPU computes.
    g = torch.Generator().manual_seed(5)
    m, a, b = (torch.randn(*s, generator=g).bfloat16() for s in ((16, 12), (16,), (12,)))
    torch.neuron.clear_op_tracking()
    with torch.neuron.fallback_policy("error"):  # the device's own choice, not a fallback
        n, c = both(lambda m, a, b: torch.addr(m, a, b, beta=0.5, alpha=3), m, a, b)
    assert torch.equal(n.cpu(), c)
    assert "aten::addr" in torch.neuron.get_executed_ops() and torch.neuron.get_fallback_ops() == {}
    n, c = both(lambda m: torch.all(m > 0, dim=(0, 1)), m)
    assert torch.equal(n.cpu(), c)


@pytest.mark.parametrize(
    "kind, make",
    [
        ("sparse", lambda x: x.to_sparse()),
        ("sparse compressed", lambda x: x.to_sparse_csr()),
        ("quantized", lambda x: torch.quantize_per_tensor(x, 0.1, 10, torch.qint8)),
        ("quantized", lambda x: torch.quantize_per_channel(
            x, torch.ones(4, device=x.device), torch.zeros(4, dtype=torch.long, device=x.device), 0, torch.quint8)),
        ("quantized", lambda x: torch.quantize_per_tensor_dynamic(x, torch.quint8, False)),
        ("nested", lambda x: torch.nested.as_nested_tensor([x, x[:2]])),
    ],
)
def test_non_dense_results_are_a_clear_error(kind, make):
    # Found from the result itself (layout, quantizer, nesting), so no op list can miss one;
    # never a tensor that claims a quantized dtype without being quantized.
    x = torch.randn(4, 4, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation functions are deprecated
        with pytest.raises(NotImplementedError, match=f"would return a {kind} tensor.*only dense"):
            make(x)
    assert make(x.cpu()) is not None  # the same call is fine on CPU


@pytest.mark.parametrize(
    "kind, make",
    [
        ("quantized", lambda: torch.empty(3, dtype=torch.qint8, device="neuron")),
        ("quantized", lambda: torch.zeros(2, 2, dtype=torch.quint8, device="neuron")),
        ("quantized", lambda: torch._empty_affine_quantized([2, 3], scale=0.1, zero_point=0, dtype=torch.quint8,
                                                            device="neuron")),
        ("quantized", lambda: torch.quantize_per_tensor(torch.randn(2, 3), 0.1, 0, torch.qint8).to("neuron")),
        ("sparse", lambda: torch.empty(2, 2, layout=torch.sparse_coo, device="neuron")),
        ("sparse", lambda: torch.eye(3).to_sparse().to("neuron")),
    ],
    ids=["empty", "zeros", "empty_affine_quantized", "to", "sparse_empty", "sparse_to"],
)
def test_quantized_and_sparse_tensors_made_on_the_device_are_a_clear_error(kind, make):
    # factories given a quantized dtype or the sparse layout, and moves of such tensors, reach the
    # QuantizedPrivateUse1 / SparsePrivateUse1 keys, where no op has a kernel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation functions are deprecated
        with pytest.raises(NotImplementedError, match=f"aten::\\w+ would return a {kind} tensor.*only dense"):
            make()


def test_nested_tensors_strided_refused_jagged_work():
    x = torch.randn(4, 4, device="neuron")
    with pytest.raises(NotImplementedError, match="nested.*layout=torch.jagged work on neuron"):
        torch.nested.nested_tensor([x, x[:2]])
    j = torch.nested.nested_tensor([x, x[:2]], layout=torch.jagged)
    c = torch.nested.nested_tensor([x.cpu(), x[:2].cpu()], layout=torch.jagged)
    assert j.device == x.device and torch.equal((j * 2).values().cpu(), (c * 2).values())


def test_linear_cross_entropy_accumulates_like_cpu():
    # PyTorch picks the chunked path's accumulation per device type; neuron accumulates in fp32 as CPU does.
    opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(8, 8, generator=g).bfloat16(), torch.randn(8, 8, generator=g).bfloat16()
    t = torch.randint(0, 8, (8,), generator=g)
    f = torch.nn.functional.linear_cross_entropy
    n, c = both(lambda x, w, t: f(x, w, t, reduction="none", options=opts), x, w, t)
    assert torch.equal(n.cpu(), c)


def test_autocast_lists_match_cuda():
    # One op per list of CUDA's autocast policy (torch 2.13): lower precision, fp32,
    # fp32 with an output dtype, promote, and the banned binary_cross_entropy.
    a, b = torch.randn(4, 4, device="neuron"), torch.randn(4, 4, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype == torch.bfloat16  # lower_precision_fp
        assert torch.nn.functional.mse_loss(a.bfloat16(), b.bfloat16()).dtype == torch.float32  # fp32
        assert a.bfloat16().exp().dtype == torch.float32
        assert torch.cumsum(a.bfloat16(), 0).dtype == torch.float32  # fp32_set_opt_dtype
        assert torch.cat([a.bfloat16(), b]).dtype == torch.float32  # promote
        p = torch.sigmoid(a)
        with pytest.raises(RuntimeError, match="(?s)unsafe to autocast.*binary_cross_entropy_with_logits"):
            torch.nn.functional.binary_cross_entropy(p, torch.rand(4, 4, device="neuron"))
        with_logits = torch.nn.functional.binary_cross_entropy_with_logits(a, torch.rand(4, 4, device="neuron"))
        assert with_logits.dtype == torch.float32
    # outside autocast it is an ordinary op
    t = torch.rand(4, 4)
    got = torch.nn.functional.binary_cross_entropy(torch.sigmoid(a), t.to("neuron"))
    torch.testing.assert_close(got.cpu(), torch.nn.functional.binary_cross_entropy(torch.sigmoid(a.cpu()), t))
    # every op CUDA's autocast handles is handled by neuron's (cuDNN-only ops aside)
    names = torch._C._dispatch_get_all_op_names()
    cuda = {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")}
    neuron = {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastPrivateUse1")}
    assert len(cuda) > 100
    assert {n for n in cuda - neuron if "cudnn" not in n} == set()


def test_back_to_back_ops_on_varied_views_match_cpu():
    # Each call reuses the CPU aliases of the previous one (the thread's alias pool): dtype,
    # shape, strides, offset and conj/neg bits must all follow the new arguments.
    g = torch.Generator().manual_seed(11)
    base = torch.randn(6, 8, generator=g)
    cbase = torch.randn(4, 4, dtype=torch.complex64, generator=g)
    cases = [
        lambda b, c: b + 1,
        lambda b, c: b[1:, 2:].t() * 3,  # offset + transposed strides
        lambda b, c: b.double()[::2].sum(0),  # another dtype, step
        lambda b, c: (c.conj() * 2).resolve_conj(),  # conj bit on the argument
        lambda b, c: torch._neg_view(b[:, 1]) + b[:, 1],  # neg bit
        lambda b, c: b.view(48)[5:20].cumsum(0),
        lambda b, c: b[2] @ b.t(),  # a 1-D argument after 2-D ones
        lambda b, c: b.bfloat16().relu_().float(),  # in-place on a fresh tensor
        lambda b, c: torch.cat([b[:2], b[4:]]),  # two views of one storage
        lambda b, c: b + b,  # the same tensor twice
    ]
    dev_b, dev_c = base.to("neuron"), cbase.to("neuron")
    for _ in range(3):  # again, with the pool warm
        for i, f in enumerate(cases):
            got, want = f(dev_b, dev_c), f(base, cbase)
            assert got.device.type == "neuron", i
            torch.testing.assert_close(got.cpu(), want, msg=f"case {i}")
    assert torch.equal(dev_b.cpu(), base) and torch.equal(dev_c.cpu(), cbase)  # inputs untouched


def test_ops_alternating_inference_mode_and_autograd_match_cpu():
    w = torch.randn(4, 4)
    x = torch.randn(3, 4)
    wn = w.to("neuron").requires_grad_()
    for _ in range(2):
        with torch.inference_mode():
            y = x.to("neuron") @ wn.detach()
            y.add_(1)
            assert y.is_inference()
            torch.testing.assert_close(y.cpu(), x @ w + 1)
        out = (x.to("neuron") @ wn).relu().sum()
        out.backward()
        ref = w.clone().requires_grad_()
        (x @ ref).relu().sum().backward()
        torch.testing.assert_close(wn.grad.cpu(), ref.grad)
        wn.grad = None


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_structured_ops_run_cpu_functional_kernel(reduction):
    # smooth_l1_loss's functional form reaches CPU's own kernel: same result, no fallback,
    # and no "output was resized" warning from an out= tensor made at the reduced shape.
    g = torch.Generator().manual_seed(12)
    a, b = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    torch.neuron.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.nn.functional.smooth_l1_loss(a.to("neuron"), b.to("neuron"), reduction=reduction)
    assert torch.equal(got.cpu(), torch.nn.functional.smooth_l1_loss(a, b, reduction=reduction))
    assert torch.neuron.get_fallback_ops() == {}
    assert "aten::smooth_l1_loss" in torch.neuron.get_executed_ops()

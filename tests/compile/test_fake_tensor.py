"""Fake tensors on neuron: what Dynamo and AOTAutograd trace with.

A fake run must describe the real run on neuron (shapes, dtypes, devices, strides,
aliasing, gradients): scaled_dot_product_attention in all its variants, the efficient-
attention ops it takes on neuron, and the OpInfo samples of the core ops (the whole
op_db is `make coverage-fake`). Compiled SDPA (backends "eager" and "aot_eager",
forward and backward) must equal eager on neuron, which equals CPU bit for bit
(tests/device/test_attention.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.testing._internal.common_dtype import floating_types
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

import torch_neuronx

import fake_sweep  # coverage/ (on sys.path by conftest.py)
import opinfo_sweep

aten = torch.ops.aten

# (query heads, kv heads), mask kind, causal, dropout_p; L=37 is not a multiple of 32
SDPA_CASES = {
    "plain": ((4, 4), None, False, 0.0),
    "causal": ((4, 4), None, True, 0.0),
    "bool-mask": ((4, 4), "bool", False, 0.0),
    "float-mask": ((4, 4), "float", False, 0.0),
    "mask-requires-grad": ((4, 4), "float-grad", False, 0.0),
    "gqa": ((4, 2), None, False, 0.0),
    "gqa-causal": ((4, 2), None, True, 0.0),
    "dropout": ((4, 4), None, False, 0.3),
}
# the variants neuron runs through its efficient-attention ops (the others keep the CPU's choice)
EFFICIENT = {"plain", "causal", "bool-mask", "float-mask"}


def _sdpa_inputs(case: str, L: int = 37, S: int = 37, E: int = 16):
    (hq, hk), mask, causal, p = SDPA_CASES[case]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, n, E, generator=g) for h, n in ((hq, L), (hk, S), (hk, S)))
    m = {"bool": torch.rand(L, S, generator=g) > 0.3, "float": torch.randn(2, 1, L, S, generator=g),
         "float-grad": torch.randn(L, S, generator=g)}.get(mask)  # fmt: skip
    return [q, k, v], m, dict(is_causal=causal, dropout_p=p, enable_gqa=hq != hk)


def _sdpa(q, k, v, mask, kw):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def _on_neuron(qkv, mask):
    dev = [t.to("neuron").requires_grad_() for t in qkv]
    m = None if mask is None else mask.to("neuron")
    if m is not None and m.is_floating_point() and mask.dim() == 2:
        m.requires_grad_()
    return dev, m


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_fake_describes_the_device_run(case):
    qkv, mask, kw = _sdpa_inputs(case)
    (q, k, v), m = _on_neuron(qkv, mask)
    problems = fake_sweep.check_fake(lambda q, k, v, m: _sdpa(q, k, v, m, kw), q, k, v, m, grad=True)
    assert problems == [], problems


def test_sdpa_runs_under_fake_mode_on_neuron():
    # the original failure: the device's backend choice copied its inputs to real CPU tensors
    with FakeTensorMode():
        q = torch.empty(2, 4, 37, 16, device="neuron")
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert isinstance(out, FakeTensor) and out.device.type == "neuron" and out.shape == q.shape


@pytest.mark.parametrize("compute_lse", [True, False])
@pytest.mark.parametrize("L", [37, 64])
def test_efficient_attention_ops_fake_matches_kernel(L, compute_lse):
    q, k, v = (torch.randn(2, 4, n, 16, device="neuron") for n in (L, 45, 45))
    bias = torch.randn(2, 4, L, 45, device="neuron")
    for b in (None, bias):
        fwd = lambda q, k, v, b: aten._scaled_dot_product_efficient_attention(q, k, v, b, compute_lse)  # noqa: E731
        assert fake_sweep.check_fake(fwd, q, k, v, b) == []
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, is_causal=True)
    assert lse.shape == (2, 4, L)  # unpadded, as the fake kernel says
    g = torch.randn_like(out)

    def bwd(g, q, k, v, out, lse, seed, offset):
        return aten._scaled_dot_product_efficient_attention_backward(
            g, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], is_causal=True)

    assert fake_sweep.check_fake(bwd, g, q, k, v, out, lse, seed, offset) == []


def _cpu_kernel_cases():
    """Ops whose PyTorch fake kernels describe CUDA's kernel for any device but "cpu",
    while neuron runs the CPU's (torch_neuronx/_device_defaults.py)."""
    n, bf = "neuron", torch.bfloat16
    g = torch.Generator().manual_seed(0)
    x, x16 = torch.randn(3, 2, 4, generator=g).to(n), torch.randn(3, 2, 4, generator=g).to(n, bf)
    rm, rv = torch.zeros(2, device=n), torch.ones(2, device=n)
    rm16, rv16 = rm.to(bf), rv.to(bf)  # (bf16 input with float32 statistics: CPU's fake is off too)
    w, idx, off = torch.randn(10, 3, generator=g).to(n), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9], device=n), (
        torch.tensor([0, 4], device=n))
    cases = {
        "native_layer_norm-bf16": (lambda x: aten.native_layer_norm(x, (4,), None, None, 1e-5), (x16,)),
        "native_batch_norm-eval": (lambda x, m, v: aten.native_batch_norm(x, None, None, m, v, False, 0.1, 1e-5),
                                   (x, rm, rv)),
        "native_batch_norm-train-bf16": (
            lambda x, m, v: aten.native_batch_norm(x, None, None, m, v, True, 0.1, 1e-5), (x16, rm16, rv16)),
        "_native_batch_norm_legit_no_training": (
            lambda x, m, v: aten._native_batch_norm_legit_no_training(x, None, None, m, v, 0.1, 1e-5), (x, rm, rv)),
        "_batch_norm_with_update-bf16": (  # (weight None: PyTorch's decomposition raises, on CPU too)
            lambda x, w, m, v: aten._batch_norm_with_update(x, w, w, m, v, 0.1, 1e-5), (x16, rv16, rm16, rv16)),
        "nonzero_static": (lambda x: aten.nonzero_static(x, size=4), (x,)),
        "pixel_shuffle-channels_last": (lambda x: aten.pixel_shuffle(x, 2), (
            torch.randn(1, 8, 3, 3, generator=g).to(n).to(memory_format=torch.channels_last),)),
    }  # fmt: skip
    for mode, name in enumerate(("sum", "mean", "max")):
        cases[f"_embedding_bag-{name}"] = (lambda w, i, o, mode=mode: aten._embedding_bag(w, i, o, False, mode),
                                           (w, idx, off))  # fmt: skip
        cases[f"_embedding_bag_forward_only-{name}"] = (
            lambda w, i, o, mode=mode: aten._embedding_bag_forward_only(w, i, o, False, mode), (w, idx, off))
    return cases


CPU_KERNEL_CASES = list(_cpu_kernel_cases())


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", CPU_KERNEL_CASES)
def test_cpu_kernel_ops_fake_describes_the_device_run(case, dynamic):
    fn, args = _cpu_kernel_cases()[case]
    assert fake_sweep.check_fake(fn, *args, dynamic=dynamic) == []


def test_unique_dim_fake_describes_the_device_run():
    # data-dependent: needs symbolic sizes; neuron's kernel, as the CPU's, returns inverse and counts unasked
    t = torch.tensor([[1, 2], [1, 2], [3, 4]], device="neuron")
    assert fake_sweep.check_fake(lambda t: aten.unique_dim(t, 0), t, dynamic=True) == []


def test_fakes_need_the_neuron_kernels():
    # Without neuron's fake kernels, PyTorch's (CUDA's description) gets these wrong: the
    # checks above can fail.
    from torch._subclasses import fake_impls

    checks = fake_impls.op_implementations_checks  # the list FakeTensorMode reads
    ours = [c for c in checks if c[1].__module__.startswith("torch_neuronx")]
    assert len(ours) >= 3, "neuron's fake kernels are not registered"
    q = torch.randn(1, 2, 37, 8, device="neuron")
    cases = _cpu_kernel_cases()
    try:
        for c in ours:
            checks.remove(c)
        FakeTensorMode.cache.clear()
        problems = {name: fake_sweep.check_fake(*cases[name][:1], *cases[name][1])
                    for name in ("native_layer_norm-bf16", "nonzero_static", "_embedding_bag-sum")}  # fmt: skip
        problems["efficient"] = fake_sweep.check_fake(
            lambda q: aten._scaled_dot_product_efficient_attention(q, q, q, None, True), q)
    finally:
        checks[:0] = ours
        FakeTensorMode.cache.clear()
    assert all(problems.values()), problems
    assert any(p.startswith("forward [1]: shape") for p in problems["efficient"]), problems  # the padded logsumexp


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_compiled_sdpa_equals_eager(backend, case):
    qkv, mask, kw = _sdpa_inputs(case)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, m: _sdpa(q, k, v, m, kw), backend=backend, fullgraph=True)
    runs = []
    for fn in (lambda q, k, v, m: _sdpa(q, k, v, m, kw), compiled):
        (q, k, v), m = _on_neuron(qkv, mask)
        torch_neuronx.clear_op_tracking()
        torch.manual_seed(0)
        out = fn(q, k, v, m)
        out.backward(torch.ones_like(out))
        ran = torch_neuronx.get_executed_ops()
        grads = [t.grad for t in (q, k, v)] + ([m.grad] if m is not None and m.requires_grad else [])
        runs.append(([out.detach().cpu()] + [x.cpu() for x in grads], ran))
    (eager, _), (comp, ran) = runs
    assert len(comp) == len(eager)
    for a, b in zip(comp, eager):
        assert torch.equal(a, b)
    if case in EFFICIENT:
        assert "aten::_scaled_dot_product_efficient_attention_backward" in ran, ran


def test_compiled_sdpa_with_symbolic_sizes_equals_eager():
    # dynamic=True: traced with symbolic sizes (the mask is padded by a symbolic amount)
    case = "float-mask"
    torch._dynamo.reset()
    compiled = torch.compile(_sdpa, backend="aot_eager", dynamic=True, fullgraph=True)
    for L in (37, 45):  # one graph for both lengths
        qkv, mask, kw = _sdpa_inputs(case, L=L, S=L)
        runs = []
        for fn in (_sdpa, compiled):
            (q, k, v), m = _on_neuron(qkv, mask)
            out = fn(q, k, v, m, kw)
            out.backward(torch.ones_like(out))
            runs.append([out.detach().cpu()] + [t.grad.cpu() for t in (q, k, v)])
        for a, b in zip(*runs):
            assert torch.equal(a, b)


class _Block(torch.nn.Module):
    """The ops above in one model: embedding bags, batch and layer norm, attention."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(50, 32, mode="max")
        self.bn, self.ln = torch.nn.BatchNorm1d(32), torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, idx, offsets):
        x = self.ln(self.bn(self.emb(idx, offsets))).view(1, -1, 32)  # [1, bags, 32]
        q, k, v = self.qkv(x).view(1, -1, 3, 2, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_model_trains_as_eager(dtype):
    torch.manual_seed(0)
    ref = _Block().to(dtype)
    idx, offsets = torch.randint(0, 50, (60,)), torch.arange(0, 60, 3)
    runs = []
    for backend in (None, "aot_eager"):
        torch._dynamo.reset()
        model = _Block().to(dtype).to("neuron")
        model.load_state_dict(ref.state_dict())
        fn = model if backend is None else torch.compile(model, backend=backend, fullgraph=True)
        out = fn(idx.to("neuron"), offsets.to("neuron"))
        out.float().square().sum().backward()
        runs.append([out.detach().cpu()] + [p.grad.cpu() for p in model.parameters()] + [model.bn.running_var.cpu()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# ---- the OpInfo sweep under fake mode ------------------------------------------------

CORE_KEYS = [k for k in opinfo_sweep.select_op_keys(opinfo_sweep.CORE_OPS) if opinfo_sweep.has_swept_dtype(k)]


def _one_dtype(key):
    """float32, or the first core dtype the op supports (bitwise ops: int64)."""
    supported = opinfo_sweep._find_op(key).supported_dtypes("cpu")
    return next(d for d in opinfo_sweep.CORE_DTYPES if d in supported)


@pytest.mark.parametrize("key", CORE_KEYS)
def test_core_op_fake_describes_the_device_run(key):
    dtype = _one_dtype(key)
    r = fake_sweep.check_op(key, (dtype,))
    counts = r["counts"].get(opinfo_sweep.dtype_name(dtype), {})
    assert counts.get("fail", 0) == 0, f"{key}: {r['failures'][:2]}"
    if not counts.get("pass"):  # data-dependent output sizes (nonzero): traced with symbolic sizes
        r = fake_sweep.check_op(key, (dtype,), dynamic=True)
        counts = r["counts"].get(opinfo_sweep.dtype_name(dtype), {})
        assert counts.get("fail", 0) == 0, f"{key}: {r['failures'][:2]}"
    if not counts.get("pass"):  # a Python value from tensor data (equal): nothing to trace
        assert set(r["reasons"]) == {"upstream: forward: raises DataDependentOutputException"}, r["reasons"]


def _samples(op, device, dtype, requires_grad, **kw):
    yield SampleInput(torch.randn(3, 5, dtype=dtype, device=device, requires_grad=requires_grad))
    yield SampleInput(torch.randn(5, 4, dtype=dtype, device=device).t().requires_grad_(requires_grad))


def _lying_op(devices):
    def fn(x):
        r = x * 2
        # the fake run, on the given devices, says the result has another shape
        return r.unsqueeze(0) if isinstance(x, FakeTensor) and x.device.type in devices else r

    return OpInfo("lying", op=fn, dtypes=floating_types(), sample_inputs_func=_samples, supports_out=False)


@pytest.mark.parametrize("devices,outcome", [(("neuron",), "fail"), (("neuron", "cpu"), "upstream"), ((), "pass")])
def test_sweep_classifies_a_wrong_fake(monkeypatch, devices, outcome):
    opinfo_sweep._find_op("add")  # fill the lookup table first
    monkeypatch.setitem(opinfo_sweep._OPS_BY_KEY, "lying", _lying_op(devices))
    r = fake_sweep.check_op("lying", (torch.float32,))
    assert r["counts"]["float32"] == {outcome: 2}, r
    if outcome == "fail":
        assert r["failures"][0]["message"].startswith("forward: shape"), r["failures"]


def test_summary_counts_crashes_as_failures():
    results = [
        {"op": "a", "status": "ok", "counts": {"float32": {"pass": 3, "upstream": 2}},
         "reasons": {"upstream: forward: raises DynamicOutputShapeException": 2}},
        {"op": "b", "status": "crash", "error": "worker process died (exit code -11)", "counts": {}},
    ]  # fmt: skip
    s = fake_sweep.summarize(results)
    assert (s["samples_pass"], s["samples_fail"], s["samples_upstream"], s["samples"]) == (3, 1, 2, 6)
    assert s["reasons"][0]["ops"] == ["a"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_channels_last_convolution_fake_describes_the_device_run(dtype, transposed):
    # The fake kernel says a neuron convolution's results are contiguous; CPU's kernels keep
    # channels-last inputs channels-last, so the device must make its results match.
    conv = F.conv_transpose2d if transposed else F.conv2d
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 6, 6, generator=g, dtype=dtype), torch.randn(3, 3, 3, 3, generator=g, dtype=dtype)
    x, w = (t.to("neuron").to(memory_format=torch.channels_last).requires_grad_() for t in (x, w))
    problems = fake_sweep.check_fake(lambda a, b: conv(a, b, stride=2, padding=1), x, w, grad=True)
    assert problems == [], problems


def test_compiled_bf16_convolution_equals_eager():
    # Inductor lays bfloat16 convolution inputs out channels-last for the device and then
    # checks the result's strides against the fake run.
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 3, 4, 4, generator=g), torch.randn(3, 3, 3, 3, generator=g), torch.randn(3, generator=g)
    x, w, b = (t.to("neuron", torch.bfloat16) for t in (x, w, b))
    f = lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=2)  # noqa: E731
    torch._dynamo.reset()
    actual = torch.compile(f, backend="neuron")(x, w, b)
    # Inductor adds the bias in float32 before rounding once; eager rounds the convolution
    # first: a bfloat16 rounding step apart near zero.
    torch.testing.assert_close(actual.cpu(), f(x, w, b).cpu(), rtol=1.6e-2, atol=1.6e-2)
    assert actual.is_contiguous()

"""The shipped NKI kernels (torch_neuronx.kernels) and NKI kernels as PyTorch operators
(nki_op / wrap_nki): results against torch on CPU, gradients, torch.compile without graph
breaks, numpy through nki.simulate, SPMD launches, and bad input."""

import math

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
import torch_neuronx
from torch_neuronx import nki_op, wrap_nki
from torch_neuronx.kernels import flash_attention, matmul, nki_kernels, rms_norm, softmax, vit_attention

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_matmul_matches_torch(dtype):
    a = torch.randn(200, 300, generator=_g()).to(dtype)
    b = torch.randn(300, 700, generator=_g(1)).to(dtype)
    got = matmul(a.to("neuron"), b.to("neuron"))
    assert got.device.type == "neuron" and got.dtype == dtype
    want = (a.double() @ b.double()).to(dtype)
    # fp32 accumulation of 300 products, rounded once to the output dtype
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=0.3)
    torch.testing.assert_close(got.cpu().float(), want.float(), **tol)


def test_tiled_matmul_when_b_does_not_stay_in_sbuf(monkeypatch):
    # The column-block schedule (b too large to keep in SBUF), forced on a shape no other test traces.
    monkeypatch.setattr(nki_kernels, "B_RESIDENT_BYTES", 0)
    a = torch.randn(130, 260, generator=_g())
    b = torch.randn(260, 600, generator=_g(1))
    got = matmul(a.to("neuron"), b.to("neuron"))
    torch.testing.assert_close(got.cpu(), (a.double() @ b.double()).float(), rtol=1e-5, atol=1e-4)


def test_tiled_matmul_with_a_long_k_narrows_its_column_blocks():
    # fp32, K = 20000: a column block of b over every K tile at the full 512 columns would need
    # 1.3 MB per partition of SBUF; the kernel narrows the blocks (and says so when K is too long).
    a = torch.randn(3, 20000, generator=_g())
    b = torch.randn(20000, 700, generator=_g(1))
    got = matmul(a.to("neuron"), b.to("neuron"))
    torch.testing.assert_close(got.cpu(), (a.double() @ b.double()).float(), rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="K = 60000 is too long"):
        matmul(torch.randn(2, 60000).to("neuron"), torch.randn(60000, 8).to("neuron"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_and_rmsnorm_match_torch(dtype):
    x = torch.randn(3, 130, 77, generator=_g()).to(dtype)
    w = torch.randn(77, generator=_g(1)).to(dtype)
    xn = x.to("neuron")
    torch.testing.assert_close(softmax(xn).cpu().float(), torch.softmax(x.float(), -1).to(dtype).float(),
                               **TOL[dtype])
    want = torch.nn.functional.rms_norm(x.float(), (77,), w.float(), eps=1e-6).to(dtype).float()
    torch.testing.assert_close(rms_norm(xn, w.to("neuron")).cpu().float(), want, **TOL[dtype])


def test_kernels_called_with_numpy_through_simulate():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 128), dtype=np.float32), rng.standard_normal((128, 600), dtype=np.float32)
    got = nki.simulate(nki_kernels.matmul_kernel)(a, b)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((140, 33), dtype=np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(nki.simulate(nki_kernels.softmax_kernel)(x), e / e.sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-6)
    w = rng.standard_normal(33, dtype=np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(nki.simulate(nki_kernels.rmsnorm_kernel)(x, w, 1e-6), want, rtol=1e-5, atol=1e-5)
    q, k, v = (rng.standard_normal((2, 130, 32), dtype=np.float32) for _ in range(3))
    o, lse = nki.simulate(nki_kernels.flash_attention_fwd_kernel)(q, k, v, 32 ** -0.5, True)
    s = np.einsum("bqd,bkd->bqk", q, k).astype(np.float64) * 32 ** -0.5
    s[:, np.triu_indices(130, 1)[0], np.triu_indices(130, 1)[1]] = -np.inf
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-5, atol=1e-5)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(o, np.einsum("bqk,bkd->bqd", p / p.sum(-1, keepdims=True), v), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_attention_forward_and_backward_match_sdpa(causal, dtype):
    q, k, v = (torch.randn(2, 2, 200, 64, generator=_g(i)).to(dtype) for i in range(3))
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    out = flash_attention(qn, kn, vn, causal=causal)
    qc, kc, vc = (t.float().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)
    tol = TOL[dtype]
    torch.testing.assert_close(out.cpu().float(), ref.detach(), **tol)
    g = torch.randn(ref.shape, generator=_g(9))
    out.backward(g.to(dtype).to("neuron"))
    ref.backward(g.to(dtype).float())
    for got, want in ((qn.grad, qc.grad), (kn.grad, kc.grad), (vn.grad, vc.grad)):
        assert got.dtype == dtype
        torch.testing.assert_close(got.cpu().float(), want, **(tol if dtype == torch.float32 else
                                                               dict(rtol=5e-2, atol=5e-2)))


def test_flash_attention_grouped_query_heads():
    q = torch.randn(1, 4, 64, 32, generator=_g())
    k, v = (torch.randn(1, 2, 64, 32, generator=_g(i)) for i in (1, 2))
    got = flash_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got.cpu(), ref, **TOL[torch.float32])


def test_vit_attention_block_matches_torch_with_gradients():
    C, heads = 64, 4
    qkv, proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
    x = torch.randn(2, 50, C, generator=_g())  # 49 patches + a class token

    def reference(x):
        B, N, _ = x.shape
        q, k, v = qkv(x).reshape(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return proj(a.transpose(1, 2).reshape(B, N, C))

    params = [p.detach().to("neuron").requires_grad_() for p in (qkv.weight, qkv.bias, proj.weight, proj.bias)]
    xn = x.to("neuron").requires_grad_()
    out = vit_attention(xn, *params, num_heads=heads)
    xc = x.clone().requires_grad_()
    ref = reference(xc)
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-4, atol=1e-5)
    g = torch.randn(ref.shape, generator=_g(3))
    out.backward(g.to("neuron"))
    ref.backward(g)
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    for got, want in zip(params, (qkv.weight, qkv.bias, proj.weight, proj.bias)):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-4)


class _AttnLayer(torch.nn.Module):
    """A Llama-style attention block: RMSNorm, q/k/v/o projections, causal attention, residual."""

    def __init__(self, dim=64, heads=2, use_nki=True):
        super().__init__()
        self.heads, self.use_nki = heads, use_nki
        self.norm = torch.nn.Parameter(torch.ones(dim))
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, S, Dm = x.shape
        h = rms_norm(x, self.norm) if self.use_nki else torch.nn.functional.rms_norm(x, (Dm,), self.norm, 1e-6)
        q, k, v = self.qkv(h).view(B, S, 3, self.heads, Dm // self.heads).permute(2, 0, 3, 1, 4)
        if self.use_nki:
            a = flash_attention(q, k, v, causal=True)
        else:
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(a.transpose(1, 2).reshape(B, S, Dm))


def test_llama_attention_layer_trains_with_nki_kernels_like_sdpa_on_cpu():
    torch.manual_seed(0)
    ref = _AttnLayer(use_nki=False)
    dev = _AttnLayer(use_nki=True)
    dev.load_state_dict(ref.state_dict())
    dev.to("neuron")
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_d = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    x = torch.randn(2, 48, 64, generator=_g())
    target = torch.randn(2, 48, 64, generator=_g(1))
    losses = []
    for _ in range(3):
        lr_ = torch.nn.functional.mse_loss(ref(x), target)
        ld = torch.nn.functional.mse_loss(dev(x.to("neuron")), target.to("neuron"))
        lr_.backward()
        ld.backward()
        for (n, pr), pd in zip(ref.named_parameters(), dev.parameters()):
            torch.testing.assert_close(pd.grad.cpu(), pr.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{n}: {m}")
        opt_r.step(), opt_d.step(), opt_r.zero_grad(), opt_d.zero_grad()
        losses.append((lr_.item(), ld.item()))
    for a, b in losses:
        assert a == pytest.approx(b, rel=1e-4)
    assert losses[-1][1] < losses[0][1]


def test_compiled_model_has_no_graph_break_at_the_kernels():
    torch.manual_seed(0)
    layer = _AttnLayer(use_nki=True).to("neuron")
    x = torch.randn(2, 48, 64, generator=_g()).to("neuron")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(layer)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    ops = [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("neuron_nki.flash_attention_fwd" in o for o in ops), ops
    compiled = torch.compile(layer, backend="neuron")
    out = compiled(x)
    torch.testing.assert_close(out.cpu(), layer(x).cpu(), rtol=1e-5, atol=1e-5)
    out.sum().backward()  # the compiled backward runs the NKI backward kernel
    assert all(p.grad is not None for p in layer.parameters())


@nki.jit
def _double_into(x, out):
    nl.store(out, nl.multiply(nl.load(x), 2.0))


@nki_op("nki_test::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _double_into(x, out)  # the kernel writes the given output tensor, AWS's pattern
    return out


def test_nki_op_runs_on_device_memory_without_copies():
    x = torch.randn(128, 64, generator=_g()).to("neuron")
    before = torch.neuron.get_executed_ops().get("aten::copy_", 0)
    y = _double(x)
    assert torch.neuron.get_executed_ops().get("aten::copy_", 0) == before  # no staging copies
    assert y.device == x.device
    assert torch.equal(y.cpu(), x.cpu() * 2)


@nki.jit
def _spmd_rows(x):
    """Each program of a 1-D or 2-D grid writes its own block of rows (program ids in them)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    n = nl.num_programs(0) * (nl.num_programs(1) if nl.program_ndim() > 1 else 1)
    pid = nl.program_id(0) * (nl.num_programs(1) if nl.program_ndim() > 1 else 1) + \
        (nl.program_id(1) if nl.program_ndim() > 1 else 0)
    rows = x.shape[0] // n
    t = nl.load(x[pid * rows:(pid + 1) * rows, :])
    nl.store(out[pid * rows:(pid + 1) * rows, :], nl.add(t, float(pid)))
    return out


@pytest.mark.parametrize("grid", [(2,), (2, 3)])
def test_spmd_grids_and_wrap_nki(grid):
    x = torch.randn(12 * 4, 16, generator=_g())
    got = wrap_nki(_spmd_rows)[grid](x.to("neuron")).cpu()
    n = math.prod(grid)
    want = x + torch.arange(n).repeat_interleave(x.shape[0] // n)[:, None].float()
    torch.testing.assert_close(got, want)


def test_bad_input_is_a_clear_error():
    x = torch.randn(128, 64)
    with pytest.raises(TypeError, match="no 64-bit"):
        _double_into(x.double().to("neuron"), torch.empty(128, 64, dtype=torch.float64, device="neuron"))
    with pytest.raises(RuntimeError, match="same device"):
        _double_into(x.to("neuron:0"), torch.empty(128, 64, device="cpu"))
    if torch.neuron.device_count() > 1:
        with pytest.raises(RuntimeError, match="same device"):
            _double_into(x.to("neuron:0"), torch.empty(128, 64, device="neuron:1"))
    with pytest.raises(TypeError, match="numpy arrays or torch tensors"):
        _double_into(x.numpy(), torch.empty(128, 64))
    with pytest.raises(ValueError, match="namespace::op"):
        nki_op("no_namespace")
    with pytest.raises(ValueError, match="head_dim"):
        flash_attention(*(torch.randn(1, 1, 8, 256, device="neuron") for _ in range(3)))


def test_wrong_memory_and_dtype_raise_with_the_kernel_line():
    @nki.jit
    def psum_to_hbm(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        acc = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.dma_copy(dst=out, src=acc)  # DMA cannot read PSUM
        return out

    with pytest.raises(nki.NkiValidationError) as e:
        psum_to_hbm(torch.zeros(128, 64, device="neuron"))
    assert e.value.rule == "dma-psum"
    assert e.value.lineno == psum_to_hbm.func.__code__.co_firstlineno + 4

    @nki.jit
    def int_matmul(a, b):
        out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        acc = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=ta, moving=tb)
        nl.store(out, nl.copy(acc))
        return out

    with pytest.raises(nki.NkiValidationError, match="floating point") as e:
        int_matmul(torch.zeros(64, 32, dtype=torch.int32), torch.zeros(64, 16, dtype=torch.int32))
    assert e.value.rule == "matmul-dtype"

    @nki.jit
    def hbm_output(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
        nl.store(out, nl.load(x))
        return out

    with pytest.raises(nki.NkiValidationError, match="shared_hbm") as e:
        hbm_output(torch.zeros(8, 8))
    assert e.value.rule == "kernel-output"

"""FlexAttention on neuron: ``torch.nn.attention.flex_attention`` compiled by Inductor, forward and
backward, with block masks made on the device, and Hugging Face models that use it.

Oracles: the same compiled computation on CPU where the CPU supports it (inference: both run
Inductor's C++ FlexAttention template), and otherwise the attention written out in float64 on
CPU (torch 2.13 has no FlexAttention backward on CPU). Inductor compiles C++ for every graph, so
shapes are small and each compiled function is reused across the checks it serves.
"""

from __future__ import annotations

import textwrap
import warnings

import pytest
import torch
from _subprocess import run_python
from _tiny_llama import NEURON, llama_pair, tiny_llama_config
from torch._inductor.utils import run_and_get_code
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

import torch_neuronx  # noqa: F401

B, HQ, HKV, L, D = 2, 4, 2, 256, 16  # L spans two 128-token sparse blocks
WINDOW = 48
TEMPLATE_MARK = "exp_reduce_sum_fusion_kernel"  # a helper of Inductor's C++ FlexAttention template


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window_in_documents(doc):
    """mask_mod: causal, within WINDOW tokens, and within the same document (``doc`` holds each
    token's document id: a tensor the mask captures)."""

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW) & (doc[q_idx] == doc[kv_idx])

    return mask_mod


DOC = torch.repeat_interleave(torch.arange(3), torch.tensor([100, 60, 96]))


def relative_bias(bias):
    """score_mod adding a learned per-head bias indexed by the query-key distance."""

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + L - 1]

    return score_mod


def reference(q, k, v, mask_mod, score_mod=None):
    """(out, logsumexp, (q, k, v)) of flex_attention written out on CPU in float64 (GQA by
    repetition); q, k, v are the float64 leaves, for their gradients."""
    q, k, v = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    g = q.size(1) // k.size(1)
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kk.transpose(-2, -1) / q.size(-1) ** 0.5
    b = torch.arange(s.size(0)).view(-1, 1, 1, 1)
    h = torch.arange(s.size(1)).view(1, -1, 1, 1)
    qi = torch.arange(s.size(2)).view(1, 1, -1, 1)
    ki = torch.arange(s.size(3)).view(1, 1, 1, -1)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    s = s.masked_fill(~mask_mod(b, h, qi, ki).expand_as(s), float("-inf"))
    return torch.softmax(s, -1) @ vv, torch.logsumexp(s, -1), (q, k, v)


def qkv(seed=0):
    torch.manual_seed(seed)
    return [torch.randn(shape) for shape in [(B, HQ, L, D), (B, HKV, L, D), (B, HKV, L, D)]]


# One compiled function per (mask, score_mod) so each graph compiles once for all its checks.
@torch.compile(fullgraph=True)
def flex_causal(q, k, v, block_mask):
    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)


@torch.compile(fullgraph=True)
def flex_window_bias(q, k, v, block_mask, bias):
    return flex_attention(
        q, k, v, score_mod=relative_bias(bias), block_mask=block_mask, enable_gqa=True, return_aux=AuxRequest(lse=True)
    )


def _masks(mask_factory):
    """{device: BlockMask}; ``mask_factory(device)`` gives the mask_mod for that device."""
    return {
        dev: create_block_mask(mask_factory(dev), None, None, L, L, device=dev) for dev in ("cpu", "neuron")
    }


def _causal(device):
    return causal


def _window_docs(device):
    return sliding_window_in_documents(DOC.to(device))


def test_block_masks_are_made_on_neuron():
    for factory in (_causal, _window_docs):
        m = _masks(factory)
        assert m["neuron"].kv_num_blocks.device == NEURON
        for a, b in zip(m["cpu"].as_tuple()[:-1], m["neuron"].as_tuple()[:-1]):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b.cpu())
            else:
                assert a == b
    assert m["neuron"].sparsity() > 0


def test_causal_inference_matches_cpu_template():
    masks = _masks(_causal)
    q, k, v = qkv()
    # Grad mode is on and nothing requires grad: flex_attention then asks for the logsumexp, which
    # nothing reads, so neuron must still take the template (the CPU never asks).
    out, code = run_and_get_code(flex_causal, *(t.to(NEURON) for t in (q, k, v)), masks["neuron"])
    expected = flex_causal(q, k, v, masks["cpu"])
    assert TEMPLATE_MARK in "".join(code)
    assert out.device == NEURON
    # The CPU's C++ template: the same code on the same host, so the same numbers.
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
    ref, _, _ = reference(q, k, v, causal)
    torch.testing.assert_close(out.cpu().double(), ref.detach(), rtol=1e-5, atol=1e-5)


def _train_and_check(fn, mask_factory, q, k, v, *extra, score_mod=None, tol=1e-5):
    """fn on neuron, forward and backward, against the float64 reference on CPU."""
    leaves = [t.to(NEURON).requires_grad_() for t in (q, k, v, *extra)]
    masks = _masks(mask_factory)
    mask_mod = mask_factory("cpu")
    res = fn(*leaves[:3], masks["neuron"], *leaves[3:])
    out, aux = res if isinstance(res, tuple) else (res, None)
    torch.manual_seed(1)
    grad_out = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad_out.to(NEURON))

    ref_extra = [t.detach().double().requires_grad_() for t in extra]
    ref_out, ref_lse, ref_qkv = reference(q, k, v, mask_mod, score_mod(*ref_extra) if score_mod else None)
    ref_out.backward(grad_out.double())

    torch.testing.assert_close(out.detach().cpu().double(), ref_out.detach(), rtol=tol, atol=tol)
    if aux is not None:
        torch.testing.assert_close(aux.lse.detach().cpu().double(), ref_lse.detach(), rtol=tol, atol=tol)
    for name, got, want in zip(("q", "k", "v", "bias"), leaves, [*ref_qkv, *ref_extra]):
        assert got.grad is not None and got.grad.device == NEURON, name
        torch.testing.assert_close(got.grad.cpu().double(), want.grad, rtol=tol, atol=tol, msg=name)


def test_causal_forward_backward():
    _train_and_check(flex_causal, _causal, *qkv())


def test_sliding_window_documents_relative_bias_forward_backward():
    # Tensors captured by the mask (document ids) and by the score_mod (a learned bias, which
    # gets a gradient), and the logsumexp returned as well.
    torch.manual_seed(2)
    bias = 0.5 * torch.randn(HQ, 2 * L - 1)
    _train_and_check(flex_window_bias, _window_docs, *qkv(seed=3), bias, score_mod=relative_bias)


def test_eager_forward_backward():
    # Without torch.compile flex_attention runs PyTorch's math implementation on the device.
    q, k, v = qkv(seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "flex_attention called without torch.compile()"
        _train_and_check(
            lambda q, k, v, bm: flex_attention(q, k, v, block_mask=bm, enable_gqa=True), _window_docs, q, k, v
        )


def test_tiny_llama_trains_with_flex_attention():
    cpu_model, neuron_model = llama_pair(tiny_llama_config(attn_implementation="flex_attention"))
    # torch 2.13 has no FlexAttention backward on CPU: the CPU model runs SDPA, the same attention.
    cpu_model.set_attn_implementation("sdpa")
    assert neuron_model.config._attn_implementation == "flex_attention"
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu_model, neuron_model)]
    torch.manual_seed(5)
    for _ in range(2):
        ids = torch.randint(1, 64, (2, 24))
        losses = []
        for model, opt in zip((cpu_model, neuron_model), opts):
            dev_ids = ids.to(next(model.parameters()).device)
            loss = model(input_ids=dev_ids, labels=dev_ids).loss
            loss.backward()
            losses.append(loss.detach().cpu())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(cpu_model.named_parameters(), neuron_model.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=name)
        for opt in opts:
            opt.step()
            opt.zero_grad()


def test_autocast_forward_backward():
    # flex_attention's autocast rule (q, k, v cast to the autocast dtype) applies on neuron as on
    # CPU/CUDA. Eager: the rule is the same HOP dispatch that Dynamo traces when compiling.
    q, k, v = qkv(seed=6)
    leaves = [t.to(NEURON).requires_grad_() for t in (q, k, v)]
    block_mask = _masks(_causal)["neuron"]
    with warnings.catch_warnings(), torch.autocast("neuron", dtype=torch.bfloat16):
        warnings.simplefilter("ignore", UserWarning)
        out = flex_attention(*leaves, block_mask=block_mask, enable_gqa=True)
    assert out.dtype == torch.bfloat16
    torch.manual_seed(1)
    grad_out = torch.randn(out.shape)
    out.float().backward(grad_out.to(NEURON))
    ref_out, _, ref_qkv = reference(q, k, v, causal)
    ref_out.backward(grad_out.double())
    torch.testing.assert_close(out.float().cpu().double(), ref_out.detach(), rtol=2e-2, atol=2e-2)
    for name, got, want in zip("qkv", leaves, ref_qkv):
        assert got.grad.dtype == torch.float32, name
        torch.testing.assert_close(got.grad.cpu().double(), want.grad, rtol=5e-2, atol=5e-2, msg=name)


def batch_bias(bias):
    """score_mod reading a bias at every (batch, head, query, key), as Transformers' FlexAttention
    integration reads T5's position bias."""

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[b, h, q_idx, kv_idx]

    return score_mod


@torch.compile(fullgraph=True)
def flex_batch_bias(q, k, v, block_mask, bias):
    # expanded to the batch here: a captured tensor is not broadcast by the index
    return flex_attention(q, k, v, score_mod=batch_bias(bias.expand(q.size(0), -1, -1, -1)), block_mask=block_mask,
                          enable_gqa=True)


def test_bias_of_batch_one_read_at_the_batch_index_names_the_tensor():
    # T5's position bias has batch size 1 and Transformers' score_mod reads it at index b: past
    # its end for every batch but the first. That is the model's read, not a broadcast the
    # device should make: Inductor's C++ code on the CPU stops at the same read when it runs;
    # neuron refuses the graph before generating code, saying which tensor.
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 2, 32, 16) for _ in range(3))
    bias = torch.randn(1, 2, 32, 32)
    compiled = torch.compile(lambda q, k, v, bias: flex_attention(q, k, v, score_mod=batch_bias(bias)),
                             fullgraph=True)
    with pytest.raises(Exception, match=r"score_mod reads the tensor it captured as buffer 0 \(shape \[1, 2, 32, 32\]\) "
                                        r"at dimension 0 with index b \(b = the batch index, 0\.\.1\).*size 1"):
        compiled(*(t.to(NEURON) for t in (q, k, v, bias)))
    with pytest.raises(RuntimeError, match="index out of bounds"):
        compiled(q, k, v, bias)  # the CPU oracle


def test_bias_expanded_to_the_batch_forward_backward():
    # The same bias expanded to the batch (the fix for such a model) trains, its gradient summed
    # over the batch.
    torch.manual_seed(8)
    bias = 0.5 * torch.randn(1, HQ, L, L)
    _train_and_check(flex_batch_bias, _causal, *qkv(seed=9), bias,
                     score_mod=lambda bias: batch_bias(bias.expand(B, -1, -1, -1)))


_THREADS_PROGRAM = textwrap.dedent("""
    import torch, torch_neuronx
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 16, dtype=torch.float64) for _ in range(3))
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 256, 256, device="neuron")
    f = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=mask), fullgraph=True)
    out = f(*(t.float().to("neuron") for t in (q, k, v))).cpu()
    s = (q @ k.transpose(-1, -2)) / 4
    s = s.masked_fill(torch.ones(256, 256, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out, (torch.softmax(s, -1) @ v).float(), rtol=1e-5, atol=1e-5)
    print("ok", torch.get_num_threads())
""")


def test_a_kernel_compiled_for_one_thread_count_is_not_reused_for_another(tmp_path):
    # The FlexAttention template sizes per-thread buffers by the thread count it is generated
    # for: a process with 2 threads must not load from the cache what a 1-thread one compiled.
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    for threads in ("1", "2"):
        out = run_python(_THREADS_PROGRAM, env={**env, "OMP_NUM_THREADS": threads})
        assert f"ok {threads}" in out, out

"""scaled_dot_product_attention on neuron: the device-generic efficient-attention ops.

Where the CPU picks its flash kernel, neuron answers "efficient" and runs the same CPU
kernel underneath, so results equal CPU bit for bit while context parallelism and DTensor
see the ops they shard (tests/distributed/workers/parallel2.py checks context parallel end to end).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx


CASES = [((2, 4, 37, 37, 16), v) for v in ("plain", "causal", "bool-mask", "float-mask")] + [
    ((1, 2, 64, 80, 32), v) for v in ("plain", "bool-mask", "float-mask")]


@pytest.mark.parametrize("shape,variant", CASES, ids=[f"{'x'.join(map(str, s))}-{v}" for s, v in CASES])
def test_sdpa_matches_cpu_bitwise(shape, variant):
    B, H, L, S, E = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, E, generator=g) for n in (L, S, S))
    mask = {"bool-mask": torch.rand(L, S, generator=g) > 0.3,
            "float-mask": torch.randn(B, 1, L, S, generator=g)}.get(variant)
    causal = variant == "causal"
    grad = torch.randn(B, H, L, E, generator=g)

    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*cpu, attn_mask=mask, is_causal=causal)
    out.backward(grad)

    torch_neuronx.clear_op_tracking()
    dev = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    out_n = F.scaled_dot_product_attention(*dev, attn_mask=None if mask is None else mask.to("neuron"),
                                           is_causal=causal)
    out_n.backward(grad.to("neuron"))
    ran = torch_neuronx.get_executed_ops()
    assert "aten::_scaled_dot_product_efficient_attention" in ran, ran
    assert "aten::_scaled_dot_product_efficient_attention_backward" in ran, ran
    assert torch.equal(out_n.cpu(), out)
    for a, b in zip(dev, cpu):
        assert torch.equal(a.grad.cpu(), b.grad)


def test_sdpa_keeps_cpu_choice_where_efficient_does_not_apply():
    q = torch.randn(1, 4, 8, 16, device="neuron")
    kv = torch.randn(1, 2, 8, 16, device="neuron")
    # grouped-query heads and dropout run the CPU's own choice, and still match it
    ref = F.scaled_dot_product_attention(q.cpu(), kv.cpu(), kv.cpu(), enable_gqa=True)
    assert torch.equal(F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True).cpu(), ref)
    torch.manual_seed(0)
    d = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert d.shape == q.shape and d.device.type == "neuron"
    # a mask that requires grad gets its gradient (the fused kernels do not compute it)
    m = torch.randn(8, 8, requires_grad=True)
    mn = m.detach().to("neuron").requires_grad_()
    F.scaled_dot_product_attention(q.cpu(), q.cpu(), q.cpu(), attn_mask=m).sum().backward()
    F.scaled_dot_product_attention(q, q, q, attn_mask=mn).sum().backward()
    torch.testing.assert_close(mn.grad.cpu(), m.grad)


def test_efficient_attention_logsumexp_is_per_query():
    q = torch.randn(2, 2, 20, 8, device="neuron")
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True)
    ref_out, ref_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q.cpu(), q.cpu(), q.cpu())
    assert lse.shape == (2, 2, 20)
    assert torch.equal(out.cpu(), ref_out) and torch.equal(lse.cpu(), ref_lse)

"""Recurrent modules on neuron against CPU. ATen runs LSTM/GRU cells on accelerators
through fused cell ops that only CUDA implements upstream; neuron has its own kernels."""

import copy

import pytest
import torch

TOL = dict(rtol=1e-5, atol=1e-5)


def run(module, inputs, device, create_graph=False):
    """Forward, backward of a fixed function of the outputs; returns outputs and all grads on CPU."""
    m = copy.deepcopy(module).to(device)
    args = [a.to(device).requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else
            tuple(h.to(device).requires_grad_() for h in a) for a in inputs]
    out = m(*args)
    flat = [o for o in (out if isinstance(out, tuple) else (out,)) for o in (o if isinstance(o, tuple) else (o,))]
    loss = sum((o * torch.linspace(-1, 1, o.numel(), device=device).view_as(o)).sum() for o in flat)
    leaves = list(m.parameters()) + [a for a in args if isinstance(a, torch.Tensor)] + \
        [h for a in args if isinstance(a, tuple) for h in a]
    grads = torch.autograd.grad(loss, leaves, create_graph=create_graph)
    if create_graph:  # second order: the differentiable backward of the fused cells
        gg = torch.autograd.grad(sum(g.square().sum() for g in grads), list(m.parameters()))
        grads = grads + gg
    return [o.detach().cpu() for o in flat], [g.detach().cpu() for g in grads]


def check(module, inputs, create_graph=False):
    (out_n, grad_n), (out_c, grad_c) = run(module, inputs, "neuron", create_graph), run(module, inputs, "cpu", create_graph)
    assert len(out_n) == len(out_c) and len(grad_n) == len(grad_c)
    for n, c in zip(out_n + grad_n, out_c + grad_c):
        torch.testing.assert_close(n, c, **TOL)


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(num_layers=2, bidirectional=True, batch_first=True),
        dict(bias=False),
    ],
    ids=["plain", "2layer-bidir-batchfirst", "nobias"],
)
def test_rnn_modules_match_cpu(cls, kw):
    torch.manual_seed(0)
    m = cls(6, 5, **kw)
    check(m, [torch.randn(3, 4, 6)])


def test_lstm_with_projection_and_initial_state():
    torch.manual_seed(1)
    m = torch.nn.LSTM(6, 5, proj_size=3)
    check(m, [torch.randn(4, 2, 6), (torch.randn(1, 2, 3), torch.randn(1, 2, 5))])


@pytest.mark.parametrize("cls, nstate", [(torch.nn.LSTMCell, 2), (torch.nn.GRUCell, 1)])
def test_cells_match_cpu_first_and_second_order(cls, nstate):
    torch.manual_seed(2)
    m = cls(6, 5)
    state = tuple(torch.randn(3, 5) for _ in range(nstate))
    args = [torch.randn(3, 6), state if nstate == 2 else state[0]]
    check(m, args)
    check(m, args, create_graph=True)


def test_fused_cells_are_native_kernels():
    torch.manual_seed(3)
    m = torch.nn.LSTM(4, 4).to("neuron")
    g = torch.nn.GRU(4, 4).to("neuron")
    x = torch.randn(2, 1, 4, device="neuron", requires_grad=True)
    torch.neuron.clear_op_tracking()
    with torch.neuron.fallback_policy("error"):
        (m(x)[0].sum() + g(x)[0].sum()).backward()
    ran = torch.neuron.get_executed_ops()
    for op in ("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell",
               "_thnn_fused_gru_cell_backward"):
        assert f"aten::{op}" in ran


def test_fused_cell_rejects_mismatched_gates():
    a = torch.randn(2, 8, device="neuron")
    with pytest.raises(RuntimeError, match="same shape"):
        torch.ops.aten._thnn_fused_lstm_cell(a, torch.randn(2, 4, device="neuron"), torch.randn(2, 2, device="neuron"))
    with pytest.raises(RuntimeError, match="do not hold 3 gates"):
        torch.ops.aten._thnn_fused_gru_cell(a, a, torch.randn(2, 2, device="neuron"))


def test_lstm_bf16_autocast_matches_cpu_closely():
    torch.manual_seed(4)
    m = torch.nn.LSTM(8, 8)
    x = torch.randn(5, 2, 8)
    c = m(x)[0]
    n = copy.deepcopy(m).to("neuron")(x.to("neuron"))[0].cpu()
    torch.testing.assert_close(n, c, **TOL)
    nb = copy.deepcopy(m).bfloat16().to("neuron")(x.bfloat16().to("neuron"))[0].cpu()
    cb = copy.deepcopy(m).bfloat16()(x.bfloat16())[0]
    torch.testing.assert_close(nb.float(), cb.float(), rtol=0.05, atol=0.05)

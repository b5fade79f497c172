"""torch.compile on neuron: the device interface, Inductor code generation for the device,
the "neuron" backend (options, modes, fallback, artifacts, metrics), dynamic shapes, training,
custom ops, compiled optimizers, caches and Hugging Face's own use of the backend.

The oracle is the same computation run eagerly on neuron (itself checked against CPU by the
eager test suites), and CPU where noted.
"""

from __future__ import annotations

import copy
import gc
import os
import textwrap
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from _tiny_llama import NEURON, llama_pair, tiny_llama_config

import torch_neuronx


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )


# ---- the device in Dynamo and Inductor -------------------------------------------------------


def test_dynamo_device_interface():
    from torch._dynamo.device_interface import get_interface_for_device

    iface = get_interface_for_device("neuron")
    assert iface.device_count() == torch.neuron.device_count()
    assert iface.is_available()
    assert iface.current_device() == torch.neuron.current_device()
    props = iface.get_device_properties(torch.device("neuron", 0))
    assert props.multi_processor_count == torch.get_num_threads()
    assert props.total_memory == torch.neuron.get_device_properties(0).total_memory
    assert not iface.is_triton_capable()
    assert get_interface_for_device("neuron:1") is iface
    with iface.device(1):
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    assert isinstance(iface.current_stream(), torch.neuron.Stream)


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
def test_mlp_forward_backward_matches_eager(backend):
    eager = _mlp().to(NEURON)
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(8, 16, device=NEURON)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch_neuronx.clear_op_tracking()
    y = compiled(x1)
    assert y.device == NEURON
    y.square().sum().backward()
    ref = eager(x2)
    ref.square().sum().backward()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert p.grad.device == NEURON
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    # Generated kernels write device memory directly: nothing goes through the CPU fallback.
    assert torch_neuronx.get_fallback_ops() == {}
    m = torch.neuron.get_dynamo_metrics()
    assert m.compiles == 1 and m.graph_breaks == 0


def test_generated_code_uses_the_device_allocator_and_current_device():
    def f(a, b):
        return (a * b).relu() + 1, a.sum(0)

    cf = torch.compile(f, backend="neuron")
    a, b = torch.randn(256, 64, device=NEURON), torch.randn(256, 64, device=NEURON)
    torch.neuron.synchronize()
    # Earlier tests' garbage must not be collected (and its device memory freed) mid-measurement.
    gc.collect()
    gc.disable()
    try:
        base = torch.neuron.memory_allocated()
        out_e = f(a, b)
        eager_delta = torch.neuron.memory_allocated() - base
        del out_e
        assert torch.neuron.memory_allocated() == base
        out_c = cf(a, b)
        assert torch.neuron.memory_allocated() - base == eager_delta > 0
    finally:
        gc.enable()
    torch.testing.assert_close(out_c, f(a, b))
    del out_c
    assert torch.neuron.memory_allocated() == base

    # Inputs on another device: results stay there, and that device's memory is used.
    dev1 = torch.device("neuron", 1)
    base1 = torch.neuron.memory_allocated(1)
    out1 = cf(a.to(dev1), b.to(dev1))
    assert all(t.device == dev1 for t in out1)
    assert torch.neuron.memory_allocated(1) > base1
    torch.testing.assert_close(out1[0].cpu(), f(a, b)[0].cpu())
    assert torch.neuron.current_device() == 0


def test_guards_on_device():
    cf = torch.compile(lambda x: x.sin() * 2, backend="neuron")
    x = torch.randn(10)
    torch.testing.assert_close(cf(x.to(NEURON)).cpu(), x.sin() * 2)
    y = cf(x)  # a CPU tensor is a new guard: recompiled for CPU, result on CPU
    assert y.device.type == "cpu"
    torch.testing.assert_close(y, x.sin() * 2)
    assert torch.neuron.get_dynamo_metrics().recompiles == 1


def test_torch_neuron_calls_trace():
    def f(x):
        s = torch.neuron.current_stream()
        torch.neuron.synchronize()
        return x + torch.neuron.device_count() + (1 if s.device_index == x.device.index else 0)

    x = torch.randn(4, device=NEURON)
    torch.testing.assert_close(torch.compile(f, backend="neuron")(x), f(x))


# ---- the backend: entry point, options, modes, failures ------------------------------------


def test_backend_is_registered():
    from importlib.metadata import entry_points

    assert "neuron" in torch._dynamo.list_backends()
    eps = entry_points(group="torch_dynamo_backends")
    assert "neuron" in eps.names
    assert eps["neuron"].load() is torch_neuronx.compile.neuron_backend


def test_unknown_option_and_mode_are_clear_errors():
    x = torch.randn(4, device=NEURON)
    with pytest.raises(Exception, match=r"unknown option\(s\) 'no_such_option'.*fallback_execution"):
        torch.compile(torch.sin, backend="neuron", options={"no_such_option": 1})(x)
    with pytest.raises(Exception, match="unknown mode 'fastest'.*'reduce-overhead'"):
        torch.compile(torch.sin, backend="neuron", mode="fastest")(x)
    with pytest.raises(Exception, match="'fallback_execution' must be a bool"):
        torch.compile(torch.sin, backend="neuron", options={"fallback_execution": "yes"})(x)
    with pytest.raises(Exception, match="'cpp_wrapper' is not supported on neuron"):
        torch.compile(torch.sin, backend="neuron", options={"cpp_wrapper": True})(x)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_modes(mode):
    def f(a, b):
        return torch.tanh(a @ b) + a.mean()

    a, b = torch.randn(16, 16, device=NEURON), torch.randn(16, 16, device=NEURON)
    torch.testing.assert_close(torch.compile(f, backend="neuron", mode=mode)(a, b), f(a, b))


def test_inductor_options_pass_through():
    x = torch.randn(64, device=NEURON)
    f = torch.compile(lambda t: t.cos() + 1, backend="neuron", options={"cpp.simdlen": 0, "epilogue_fusion": False})
    torch.testing.assert_close(f(x), x.cos() + 1)


@pytest.fixture
def broken_sin_lowering():
    """Make Inductor's lowering of aten.sin fail, as a lowering bug would."""
    from torch._inductor import lowering

    op = torch.ops.aten.sin.default
    orig = lowering.lowerings[op]

    def broken(*args, **kwargs):
        raise NotImplementedError("simulated lowering failure")

    lowering.lowerings[op] = broken
    yield
    lowering.lowerings[op] = orig


def _sin_graph(x):
    return torch.sin(x * 2) + 1


def test_compile_failure_names_node_and_op(broken_sin_lowering, monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", raising=False)
    x = torch.randn(8, device=NEURON)
    with pytest.raises(Exception) as info:
        torch.compile(_sin_graph, backend="neuron")(x)
    msg = str(info.value)
    assert "node 'sin'" in msg and "aten.sin.default" in msg, msg
    assert "simulated lowering failure" in msg
    assert "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0" in msg


@pytest.mark.parametrize("how", ["env", "option"])
def test_compile_failure_falls_back_to_eager_when_allowed(broken_sin_lowering, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
        options = None
    else:
        monkeypatch.delenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", raising=False)
        options = {"fallback_execution": True}
    x = torch.randn(8, device=NEURON)
    with pytest.warns(UserWarning, match=r"(?s)node 'sin' \(aten.sin.default\), from File .*test_compile.py.*torch.sin\(x \* 2\).*eagerly"):
        y = torch.compile(_sin_graph, backend="neuron", options=options)(x)
    assert y.device == NEURON
    torch.testing.assert_close(y, _sin_graph(x))


def test_backward_compile_failure_is_handled_at_compile_time(monkeypatch):
    # The backward of sin uses cos: break cos's lowering, so only the backward graph fails.
    from torch._inductor import lowering

    def broken(*args, **kwargs):
        raise NotImplementedError("simulated lowering failure")

    monkeypatch.setitem(lowering.lowerings, torch.ops.aten.cos.default, broken)
    monkeypatch.delenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", raising=False)
    x = torch.randn(8, device=NEURON, requires_grad=True)
    with pytest.raises(Exception, match=r"aten.cos.default.*simulated lowering failure"):
        torch.compile(lambda t: t.sin().sum(), backend="neuron")(x)  # raised by the forward call
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="eagerly"):
        y = torch.compile(lambda t: t.sin().sum(), backend="neuron", options={"fallback_execution": True})(x)
    y.backward()
    torch.testing.assert_close(x.grad, x.detach().cos())


def test_data_dependent_backward_graph_breaks_instead_of_failing():
    # The backward of index_put with a boolean index needs nonzero (a data-dependent shape):
    # Dynamo graph-breaks around it, as for Inductor, rather than a compile error.
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(5, 5, generator=g), torch.randn(5, generator=g)
    mask = torch.tensor([True, True, False, True, False])

    def f(a, b):
        return torch.index_put(a, (mask,), b).sin().sum()

    grads = []
    for fn in (f, torch.compile(f, backend="neuron")):
        a, b = x.to(NEURON).requires_grad_(), v.to(NEURON).requires_grad_()
        fn(a, b).backward()
        grads.append((a.grad.cpu(), b.grad.cpu()))
    torch.testing.assert_close(grads[1], grads[0])


def test_rng_state_functions_are_not_traced():
    # torch.testing's freeze_rng_state saves and restores torch.neuron's RNG state under
    # no_dispatch; like torch.cuda's, those functions run eagerly, never traced.
    from torch.testing._internal.common_methods_invocations import wrapper_set_seed

    x = torch.randn(16, 16, device=NEURON)
    f = lambda t: wrapper_set_seed(F.dropout, t, p=0.5, training=True)  # noqa: E731
    before = torch.neuron.get_rng_state()
    expected = f(x)
    actual = torch.compile(f, backend="neuron", options={"fallback_random": True})(x)
    assert torch.equal(actual.cpu(), expected.cpu())
    assert torch.equal(torch.neuron.get_rng_state(), before)  # restored, as eagerly


def test_bad_fallback_env_value(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "maybe")
    with pytest.raises(Exception, match="TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION='maybe' is not a boolean"):
        torch.compile(torch.cos, backend="neuron")(torch.randn(2, device=NEURON))


def test_artifacts(tmp_path, monkeypatch):
    from torch_neuronx.compile import _artifacts

    monkeypatch.delenv("TORCH_NEURONX_DEBUG_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert _artifacts.debug_dir() == tmp_path / "cache" / "torch_neuronx" / "neuron_backend"

    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path / "dbg"))
    x = torch.randn(8, device=NEURON)
    monkeypatch.delenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", raising=False)
    torch.compile(lambda t: t.exp() - 1, backend="neuron")(x)
    assert not (tmp_path / "dbg").exists()  # nothing written unless asked

    torch._dynamo.reset()
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    torch.compile(lambda t: t.exp() - 2, backend="neuron", options={"model_name": "mymodel"})(x)
    graphs = list((tmp_path / "dbg" / "proc_0" / "fx_graphs").glob("mymodel_*.txt"))
    assert len(graphs) == 1 and "exp" in graphs[0].read_text()
    code = list((tmp_path / "dbg" / "proc_0" / "inductor").rglob("output_code.py"))
    assert code and "cpp_fused" in code[0].read_text()


# ---- beyond static graphs ------------------------------------------------------------------


def test_graph_break():
    def f(x):
        y = x.relu() * 3
        torch._dynamo.graph_break()
        return y.sum(-1) + x.mean()

    x = torch.randn(6, 5, device=NEURON)
    torch.testing.assert_close(torch.compile(f, backend="neuron")(x), f(x))
    m = torch.neuron.get_dynamo_metrics()
    assert m.graph_breaks == 1 and m.compiles == 2
    assert any("graph_break" in r for r in m.graph_break_reasons), m.graph_break_reasons
    torch._dynamo.reset()
    with pytest.raises(Exception, match="graph_break"):
        torch.compile(f, backend="neuron", fullgraph=True)(x)


@torch.library.custom_op("tnx_test::scaled_softsign", mutates_args=())
def scaled_softsign(x: torch.Tensor, scale: float) -> torch.Tensor:
    raise NotImplementedError("no kernel for this device")


@scaled_softsign.register_kernel("neuron")
def _(x, scale):
    return scale * x / (1 + x.abs())


@scaled_softsign.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _softsign_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * ctx.scale / (1 + x.abs()) ** 2, None


def _softsign_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


scaled_softsign.register_autograd(_softsign_backward, setup_context=_softsign_setup)


def test_custom_op():
    def f(x):
        return scaled_softsign(x.sin(), 2.5).sum()

    x1 = torch.randn(7, 3, device=NEURON, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    y = torch.compile(f, backend="neuron", fullgraph=True)(x1)
    y.backward()
    ref = f(x2)
    ref.backward()
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(x1.grad, x2.grad)
    xc = x2.detach().cpu()
    torch.testing.assert_close(y.cpu(), (2.5 * xc.sin() / (1 + xc.sin().abs())).sum())


def test_compiled_optimizer_step():
    torch.manual_seed(0)
    params = [torch.randn(32, 8, device=NEURON), torch.randn(8, device=NEURON)]
    p_c = [p.clone().requires_grad_() for p in params]
    p_e = [p.clone().requires_grad_() for p in params]
    opt_c = torch.optim.AdamW(p_c, lr=0.05, weight_decay=0.1)
    opt_e = torch.optim.AdamW(p_e, lr=0.05, weight_decay=0.1)
    step = torch.compile(opt_c.step, backend="neuron")
    for i in range(3):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(p_c, grads):
            p.grad = g.clone()
        for p, g in zip(p_e, grads):
            p.grad = g.clone()
        step()
        opt_e.step()
    for a, b in zip(p_c, p_e):
        assert a.device == NEURON
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(opt_c.state[p_c[0]]["exp_avg_sq"], opt_e.state[p_e[0]]["exp_avg_sq"])


# ---- models ----------------------------------------------------------------------------------


def _train_steps(model, ids, steps, amp):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        with torch.autocast("neuron", dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses), grads


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
def test_tiny_llama_training_step(amp):
    _, model = llama_pair()
    eager = copy.deepcopy(model)
    ids = torch.randint(1, 64, (2, 16)).to(NEURON)
    compiled = torch.compile(model, backend="neuron")
    lc, gc = _train_steps(compiled, ids, 2, amp)
    le, ge = _train_steps(eager, ids, 2, amp)
    tol = dict(rtol=2e-2, atol=2e-2) if amp else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lc, le, **tol)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b, **tol)
    ptol = dict(rtol=1e-2, atol=5e-3) if amp else dict(rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, **ptol)
    m = torch.neuron.get_dynamo_metrics()
    assert m.compiles == 1 and m.graph_breaks == 0, m


def test_dynamic_shapes_automatic_and_explicit():
    cpu, model = llama_pair()
    model.eval()
    lengths = [17, 33, 65, 9, 48]

    def run(fn):
        outs = []
        for n in lengths:
            ids = torch.arange(n).remainder(63).add(1).unsqueeze(0)
            with torch.no_grad():
                outs.append((fn(ids.to(NEURON)).logits, cpu(ids).logits))
        return outs

    # Automatic: static first, one recompile makes the sequence dimension dynamic.
    for got, ref in run(torch.compile(model, backend="neuron")):
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)
    m = torch.neuron.get_dynamo_metrics()
    assert m.compiles <= 2 and m.recompiles <= 1, m.as_dict()
    assert all("size mismatch" in r for r in m.recompile_reasons), m.recompile_reasons

    # dynamic=True: one compile for every length.
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    for got, ref in run(torch.compile(model, backend="neuron", dynamic=True)):
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)
    assert torch.neuron.get_dynamo_metrics().compiles == 1


def test_mark_dynamic():
    f = torch.compile(lambda x: (x.softmax(-1) * x).sum(-1), backend="neuron")
    for n in (5, 12, 40):
        x = torch.randn(3, n, device=NEURON)
        torch._dynamo.mark_dynamic(x, 1)
        torch.testing.assert_close(f(x), (x.softmax(-1) * x).sum(-1))
    assert torch.neuron.get_dynamo_metrics().compiles == 1


def test_generate_with_static_cache_compiles_with_neuron_backend():
    # transformers compiles the decoding forward itself on neuron, with backend="neuron".
    cpu, model = llama_pair()
    ids = torch.randint(1, 64, (1, 7))
    ref = cpu.generate(ids, max_new_tokens=6, do_sample=False)
    got = model.generate(ids.to(NEURON), max_new_tokens=6, do_sample=False, cache_implementation="static")
    assert torch.equal(got.cpu(), ref)
    m = torch.neuron.get_dynamo_metrics()
    assert m.compiles >= 1, m
    assert model._last_compile_config.backend == "neuron"


def test_trainer_with_torch_compile(tmp_path):
    from transformers import Trainer, TrainingArguments

    _, model = llama_pair()
    ids = torch.randint(1, 64, (8, 16))
    data = [{"input_ids": r, "labels": r} for r in ids]
    # Batches of 2 x 16 tokens, as in test_tiny_llama_training_step: its compiled graphs are reused.
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=4, learning_rate=5e-3,
        torch_compile=True, torch_compile_backend="neuron", logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=False, dataloader_pin_memory=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    assert trainer.args.device.type == "neuron"
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert torch.neuron.get_dynamo_metrics().compiles >= 1


# ---- caches ----------------------------------------------------------------------------------

_WARM = textwrap.dedent(
    """
    import json, torch, torch_neuronx
    torch.neuron.reset_dynamo_metrics()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU(), torch.nn.Linear(8, 2)).to("neuron")
    x = torch.randn(4, 8, device="neuron", requires_grad=True)
    torch.compile(m, backend="neuron")(x).sum().backward()
    d = torch.neuron.get_dynamo_metrics()
    print(json.dumps(dict(fx_hits=d.fx_graph_cache_hits, fx_misses=d.fx_graph_cache_misses,
                          aot_hits=d.aot_autograd_cache_hits, compiles=d.compiles)))
    """
)


def test_second_process_compiles_warm(tmp_path, run_python):
    import json

    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "NEURON_PLATFORM": "trn2"}
    first = json.loads(run_python(_WARM, env=env).strip().splitlines()[-1])
    assert first["fx_misses"] >= 1 and first["fx_hits"] == 0, first
    second = json.loads(run_python(_WARM, env=env).strip().splitlines()[-1])
    assert second["fx_misses"] == 0 and second["fx_hits"] >= 1 and second["aot_hits"] >= 1, second
    # The simulated platform is part of the key: another chip compiles cold.
    other = json.loads(run_python(_WARM, env={**env, "NEURON_PLATFORM": "trn3"}).strip().splitlines()[-1])
    assert other["fx_misses"] >= 1 and other["fx_hits"] == 0, other

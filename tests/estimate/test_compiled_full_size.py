"""Rules of the step model that a comparison with published measurements corrected:

- a compiled graph at full size (``compile=True``, mode "full") costs each run of consecutive element-wise
  ops as one fused kernel: every op's instructions on its engine, HBM traffic once;
- on NeuronCore-v2 (trn1, inf2), which has no DMA transpose, the shipped kernels transpose on TensorE
  (a strided DMA would move one element per descriptor) — still computing the same result."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch

import nki
import torch_neuronx
from torch_neuronx.estimate import capture
from torch_neuronx.estimate._capture import Op
from torch_neuronx.estimate._costs import _elementwise, fused_cost, fusable, target
from torch_neuronx.estimate._elementwise import engine_rate, rate
from torch_neuronx.estimate._model import _fuse

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from _tiny_llama import tiny_llama_config  # noqa: E402


def _ew(name, shape, n_inputs=2, dtype="float32", phase="forward"):
    size = math.prod(shape) * 4
    return Op(f"aten.{name}.Tensor", phase, [(shape, dtype)] * n_inputs, [(shape, dtype)], size * n_inputs, size)


def test_fused_run_costs_engine_work_once_and_hbm_traffic_once():
    t = target("trn2")
    shape = (4096, 4096)
    run = [_ew("mul", shape), _ew("add", shape), _ew("mul", shape)]
    n = math.prod(shape)
    per_op_engine = n * engine_rate("binary", "float32", "trn2") / t.lnc
    dma = (run[0].in_bytes + run[0].out_bytes) / min(t.hbm_bw, t.dma_bw)
    fixed = rate("binary", "float32", "trn2")[0] / t.lnc
    assert fused_cost(run, t).seconds == pytest.approx(fixed + max(3 * per_op_engine, dma))
    # Fusion removes HBM round trips and fixed costs, never engine work: cheaper than eager, not free.
    eager = sum(_elementwise(op, t).seconds for op in run)
    assert 3 * per_op_engine / 1.0001 <= fused_cost(run, t).seconds < eager


def test_runs_break_at_matmuls_and_phases_and_keep_views():
    mm = Op("aten.mm.default", "forward", [((64, 64), "float32"), ((64, 64), "float32")], [((64, 64), "float32")],
            0, 0)
    view = Op("aten.view.default", "forward", [((64, 64), "float32")], [((4096,), "float32")], 0, 0)
    a, b, c = _ew("mul", (64, 64)), _ew("add", (64, 64)), _ew("mul", (64, 64), phase="backward")
    assert all(fusable(x) for x in (a, b, c)) and not fusable(mm)
    assert _fuse([a, view, b, mm, a, c]) == [view, [a, b], mm, a, c]


def test_compiled_full_size_step_costs_less_vector_time_than_eager_and_same_matmuls():
    cfg = tiny_llama_config(num_hidden_layers=4, hidden_size=256, vocab_size=256, intermediate_size=512)
    kw = dict(task="train", batch=2, seq=256, platforms="trn2")
    eager = torch_neuronx.estimate(cfg, **kw)
    fused = torch_neuronx.estimate(cfg, compile=True, **kw)
    e, f = eager.results["trn2"].breakdown, fused.results["trn2"].breakdown
    assert f["tensor_engine_s"] == pytest.approx(e["tensor_engine_s"])
    assert f.get("vector_engine_s", 0) + f.get("scalar_engine_s", 0) < e["vector_engine_s"] + e["scalar_engine_s"]
    assert fused.results["trn2"].step_time_s < eager.results["trn2"].step_time_s
    assert any("fused kernel" in a for a in fused.capture.assumptions)
    # record mode with compile still costs Inductor's kernels (the full-size path does not replace it)
    assert capture(cfg, task="prefill", seq=32, mode="full", compile=True).fused


def test_trn1_kernels_transpose_on_tensor_engine_and_stay_correct(monkeypatch):
    from torch_neuronx.kernels import nki_kernels as K

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((200, 300)).astype(np.float32), rng.standard_normal((300, 130)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(nki.simulate(K.matmul_kernel)(a, b)), a @ b, rtol=1e-4, atol=1e-4)
    q, k, v = (rng.standard_normal((2, 256, 64)).astype(np.float32) for _ in range(3))
    o = nki.simulate(K.flash_attention_fwd_kernel)(q, k, v, 1 / 8.0, True)
    o = o[0] if isinstance(o, (tuple, list)) else o
    ref = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)), is_causal=True)
    np.testing.assert_allclose(np.asarray(o), ref.numpy(), rtol=1e-4, atol=1e-4)
    # The a.T tiles come from TensorE transposes, not element-wise DMA: the kernel is TensorE-bound.
    r = nki.estimate(K.matmul_kernel, platform="trn1")(nki.TensorSpec((1024, 4096), "bfloat16"),
                                                       nki.TensorSpec((4096, 448), "bfloat16"))
    assert r.bound == "tensor"
    assert r.engines["tensor"]["instruction_count"] > 1024 // 128 * 4096 // 128  # matmuls + transposes

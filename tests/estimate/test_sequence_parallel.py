"""Sequence parallelism, the vocabulary-parallel loss and last-position logits in the step model.

Oracles: the analytic collective volumes of tensor parallelism with sequence parallelism (an all-gather
and a reduce-scatter around each tensor-parallel block, the same bytes over the ring as the all-reduce
they replace), the per-rank element-wise work and activation memory of the same step without it, and
the shapes of the logits HF's loss and generate would otherwise materialise."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

import torch_neuronx
from torch_neuronx.estimate import EstimateError, Plan, capture
from torch_neuronx.estimate.__main__ import main
from torch_neuronx.estimate._collectives import collective_seconds
from torch_neuronx.estimate._costs import fusable, target
from torch_neuronx.estimate._model import collective_class

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from _tiny_llama import tiny_llama_config  # noqa: E402

# Hidden size, vocabulary and intermediate size all differ (and differ from their tp shards), so an
# op's last dimension says which of them it is.
L, H, V, I, SEQ, TP = 4, 64, 96, 160, 32, 2
BF16, FP32 = 2, 4
ACT = SEQ * H * BF16  # one sequence of hidden states


def config(**kw):
    return tiny_llama_config(**{**dict(num_hidden_layers=L, hidden_size=H, vocab_size=V, intermediate_size=I), **kw})


@pytest.fixture(scope="module")
def train():
    """The same training step (4 micro-batches of one sequence) with and without sequence parallelism."""
    return {sp: capture(config(), task="train", batch=4, seq=SEQ, plan=Plan(tp=TP, sp=sp)) for sp in (True, False)}


def volume(cap, kind, phase, at_least=0):
    return sum(op.comm_bytes * op.count for op in cap.ops
               if op.collective == kind and op.phase == phase and op.comm_bytes >= at_least)


def test_sequence_parallel_is_the_default_for_train_and_prefill_with_tp():
    assert capture(config(), task="train", batch=1, seq=SEQ, plan=Plan(tp=TP)).sp is True
    assert capture(config(), task="prefill", batch=1, seq=SEQ, plan=Plan(tp=TP)).sp is True
    # One token per sequence has no sequence to split; one rank has nothing to split it over.
    assert capture(config(), task="decode", batch=1, seq=SEQ, plan=Plan(tp=TP)).sp is False
    assert capture(config(), task="train", batch=1, seq=SEQ, plan=Plan()).sp is False


def test_sequence_parallel_collective_volumes(train):
    # Forward, per micro-batch: the vocab-parallel embedding's output reduce-scattered to sequence
    # shards; in each layer attention and the MLP all-gather their input and reduce-scatter their
    # output; the head all-gathers its input. Backward mirrors it (an all-gather's gradient is a
    # reduce-scatter and back). No hidden-state all-reduce is left.
    cap, m = train[True], 4
    assert cap.sp is True
    assert volume(cap, "reduce_scatter", "forward") == m * (2 * L + 1) * ACT
    assert volume(cap, "all_gather", "forward") == m * (2 * L + 1) * ACT
    assert volume(cap, "reduce_scatter", "backward") == m * (2 * L + 1) * ACT
    assert volume(cap, "all_gather", "backward") == m * (2 * L + 1) * ACT
    for phase in ("forward", "backward"):
        assert volume(cap, "all_reduce", phase, at_least=SEQ * H) == 0
    # The loss is vocab-parallel either way: three fp32 all-reduces of one value per token.
    assert volume(cap, "all_reduce", "forward") == m * 3 * SEQ * FP32
    assert {op.group for op in cap.ops if op.collective} == {(0, 1)}


def test_sequence_parallel_moves_the_same_bytes_as_the_all_reduces_it_replaces(train):
    # all-gather + reduce-scatter move (g-1)/g of the buffer each, an all-reduce 2(g-1)/g: the layers'
    # tensor-parallel communication costs the same time with and without sequence parallelism.
    t = target("trn2")
    plan = Plan(tp=TP)

    def tp_seconds(cap, phase):
        return sum(collective_seconds(op.collective, op.comm_bytes, op.group, t)[0] * op.count for op in cap.ops
                   if op.collective and op.phase == phase and op.comm_bytes >= SEQ * H
                   and collective_class(op, plan) == "tp")

    assert tp_seconds(train[True], "forward") == pytest.approx(tp_seconds(train[False], "forward"), rel=1e-12)
    # Backward without SP all-reduces each of the 5 column-parallel projections' input gradients
    # and the head's; with SP each block's (and the head's) is one reduce-scatter plus the all-gather
    # of the row-parallel output's gradient: (2L + 1) x 2 half-volumes vs (5L + 1) full ones.
    ar = tp_seconds(train[False], "backward") / (5 * L + 1)
    assert tp_seconds(train[True], "backward") == pytest.approx(ar * (2 * L + 1), rel=1e-12)


def _hidden_elementwise(cap, phase, dtype=None):
    """Elements the rank's element-wise ops write on hidden states (norms, residual adds) in a phase."""
    return sum(math.prod(op.outputs[0][0]) * op.count for op in cap.ops
               if op.phase == phase and fusable(op) and op.outputs and op.outputs[0][0][-1:] == (H,)
               and dtype in (None, op.outputs[0][1]))


def test_sequence_parallel_divides_the_element_wise_work_by_tp(train):
    # Forward: every element-wise op on hidden states (norms, residual adds) runs on SEQ / TP tokens.
    # Backward: the norms' (fp32) work too; the partial input gradients of a block's column-parallel
    # projections are still summed over the whole sequence before their one reduce-scatter.
    for phase, dtype in (("forward", None), ("backward", "float32")):
        without = _hidden_elementwise(train[False], phase, dtype)
        assert without > 0
        assert _hidden_elementwise(train[True], phase, dtype) == pytest.approx(without / TP, rel=1e-12)
    # Norms and residual adds run on SEQ / TP tokens: every rmsnorm statistic is per local token.
    rsqrt = [op for op in train[True].ops if op.name == "aten.rsqrt.default" and op.phase == "forward"]
    assert rsqrt and all(op.inputs[0][0] == (1, SEQ // TP, 1) for op in rsqrt)


def test_sequence_parallel_activation_memory_drops(train):
    # Each of the 2L + 1 norms keeps at least its fp32 input for the backward: with the sequence split
    # over TP ranks, each keeps 1/TP of it.
    saved = (2 * L + 1) * SEQ * H * FP32 * (1 - 1 / TP)
    assert train[True].static_bytes == train[False].static_bytes
    assert train[False].peak_bytes - train[True].peak_bytes >= saved


def test_vocabulary_parallel_loss_materialises_no_full_vocabulary_logits(train):
    for cap in train.values():
        assert not [op.name for op in cap.ops if any(s[-1:] == (V,) for s, _ in op.outputs)]
        # The fp32 log-softmax (loss_parallel's: max, exp, sum, all-reduced) runs on the rank's
        # vocabulary shard of every token.
        (exp,) = {op.inputs[0] for op in cap.ops if op.name == "aten.exp.default" and op.phase == "forward"}
        assert exp == ((SEQ, V // TP), "float32")


def test_inference_computes_the_last_position_logits_only():
    for task, plan in (("prefill", Plan()), ("prefill", Plan(tp=TP)), ("decode", Plan(tp=TP))):
        cap = capture(config(), task=task, batch=2, seq=SEQ, plan=plan)
        heads = [op for op in cap.ops if op.name in ("aten.mm.default", "aten.addmm.default")
                 and op.outputs[0][0][-1] == V // plan.tp]
        assert heads and all(op.outputs[0][0] == (2, V // plan.tp) for op in heads), (task, plan)
        assert any("last position only" in a for a in cap.assumptions)


def test_sp_flag_in_the_cli_report_and_json(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    config().to_json_file(cfg)
    out = tmp_path / "e.json"
    common = [str(cfg), "--seq", str(SEQ), "--tp", str(TP), "--platform", "trn2", "--no-comparators", "--no-progress"]
    assert main(common + ["--json", str(out)]) == 0
    assert "tp 2 (sequence parallel)" in capsys.readouterr().out
    js = json.loads(out.read_text())
    assert js["plan"]["sp"] is True and any(a.startswith("sequence parallelism") for a in js["assumptions"])
    assert main(common + ["--no-sp", "--json", str(out)]) == 0
    assert "sequence parallel)" not in capsys.readouterr().out
    js = json.loads(out.read_text())
    assert js["plan"]["sp"] is False and any(a.startswith("no sequence parallelism") for a in js["assumptions"])
    assert main([str(cfg), "--sp", "--no-progress"]) == 2
    assert "--sp shards the sequence over the tensor-parallel ranks: give --tp > 1" in capsys.readouterr().err


def test_a_plan_without_room_for_sequence_parallelism():
    # The MLP left out of the tensor-parallel plan: its replicated weights cannot take sequence-sharded
    # DTensor input, so sequence parallelism does not apply. Asked for, it is a clear error; by default
    # the step is traced without it and the report says why.
    cfg = config()
    cfg.base_model_tp_plan = {k: v for k, v in type(cfg).base_model_tp_plan.items() if ".mlp." not in k}
    with pytest.raises(EstimateError, match=r"--sp: model\.layers\.0\.mlp \(LlamaMLP\) has parameters but no "
                                            r"tensor-parallel style; run without --sp"):
        capture(cfg, task="train", batch=1, seq=SEQ, plan=Plan(tp=TP, sp=True))
    cap = capture(cfg, task="train", batch=1, seq=SEQ, plan=Plan(tp=TP))
    assert cap.sp is False
    assert any(a.startswith("sequence parallelism not applied to train: model.layers.0.mlp") for a in cap.assumptions)


def test_views_of_parameters_are_not_new_memory():
    # Every linear layer transposes its weight (a view of the parameter's storage): one token's
    # prefill creates a few KiB of activations and KV cache, not a second copy of the weights.
    cap = capture(config(), task="prefill", batch=1, seq=1)
    assert 0 < cap.peak_bytes - cap.static_bytes < cap.static_bytes / 20

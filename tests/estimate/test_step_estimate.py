"""torch_neuronx.estimate: one rank's step captured at the aten level and costed per platform.

Oracles: analytic FLOP and collective-volume formulas of the traced plans (TP from the model's
Hugging Face tp_plan, FSDP2, pipeline stages), the same step captured on fake tensors and on neuron,
eager vs compiled matmul work, and the CLI's output files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import torch_neuronx
from torch_neuronx.estimate import EstimateError, Plan, capture
from torch_neuronx.estimate.__main__ import main
from torch_neuronx.estimate._ops import MATMUL_OPS, VIEW_OPS, _mm_dims, base_name

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from _tiny_llama import tiny_llama_config  # noqa: E402

L, H, V, I = 4, 64, 64, 128  # layers, hidden, vocab, intermediate of the tiny config below
SEQ = 32
BF16 = 2


def config(**kw):
    return tiny_llama_config(**{**dict(num_hidden_layers=L, hidden_size=H, vocab_size=V, intermediate_size=I), **kw})


# Parameters of one decoder layer: q, o (H x H), k, v (H x H/2: 2 of 4 heads), gate, up, down, two norms.
LINEAR_PER_LAYER = 2 * H * H + 2 * H * (H // 2) + 3 * H * I
PARAMS_PER_LAYER = LINEAR_PER_LAYER + 2 * H
ROOT_PARAMS = 2 * V * H + H  # embedding, head, final norm


def collective_bytes(cap, kind, phase):
    return sum(op.comm_bytes * op.count for op in cap.ops if op.collective == kind and op.phase == phase)


def matmul_flops(cap):
    total = 0.0
    for op in cap.ops:
        if base_name(op.name) in MATMUL_OPS and op.collective is None:
            b, m, k, n = _mm_dims(op)
            total += 2 * b * m * k * n * op.count
    return total


def test_training_step_matmul_flops_match_the_analytic_count():
    # 6 FLOPs per parameter of every linear layer per token: forward, input gradient, weight gradient;
    # the 4 layers are costed from traces of 1 and 2 layers.
    batch = 4
    cap = capture(config(), task="train", batch=batch, seq=SEQ)
    assert cap.micro_steps == batch and cap.tokens == batch * SEQ
    assert matmul_flops(cap) == pytest.approx(6 * batch * SEQ * (L * LINEAR_PER_LAYER + V * H), rel=1e-9)


def test_record_on_neuron_and_full_size_on_fake_tensors_capture_the_same_step():
    def ops(cap):
        out = {}
        for op in cap.ops:
            key = (op.name, op.phase, tuple(op.inputs))
            out[key] = out.get(key, 0) + op.count
        return out

    full = capture(config(), task="train", batch=2, seq=SEQ, mode="full")
    record = capture(config(), task="train", batch=2, seq=SEQ, mode="record")
    assert ops(full) == ops(record)
    assert full.peak_bytes == record.peak_bytes and full.static_bytes == record.static_bytes

    # With TP x FSDP2 on the fake process group the device's functional collectives add wrapper and view
    # ops; every op that costs time is the same.
    def costed(cap):
        return {k: v for k, v in ops(cap).items() if base_name(k[0]) not in VIEW_OPS and "_wrap_" not in k[0]}

    plan = Plan(tp=2, dp=2, fsdp=True)
    full = capture(config(), task="train", batch=4, seq=SEQ, plan=plan, mode="full")
    record = capture(config(), task="train", batch=4, seq=SEQ, plan=plan, mode="record")
    assert costed(full) == costed(record)


def test_tensor_parallel_collective_volumes():
    # HF's plan without sequence parallelism: a vocab-parallel embedding, q/k/v/gate/up column-parallel,
    # o/down row-parallel, the head column-parallel with its logits left sharded over the vocabulary
    # (vocab-parallel loss). Forward: an all-reduce of the embedding's output, after o and after down
    # in each layer, and the loss's three (max, sum of exponentials, target logit: one fp32 value per
    # token). Backward: the input gradient of each of the 5 column-parallel projections and of the head
    # is all-reduced. The full-vocabulary logits are never gathered.
    batch, tp = 4, 2
    cap = capture(config(), task="train", batch=batch, seq=SEQ, plan=Plan(tp=tp, sp=False))
    assert cap.sp is False
    act = SEQ * H * BF16  # one micro-batch (1 sequence) of hidden states
    assert collective_bytes(cap, "all_reduce", "forward") == batch * ((2 * L + 1) * act + 3 * SEQ * 4)
    assert collective_bytes(cap, "all_reduce", "backward") == batch * (5 * L + 1) * act
    assert collective_bytes(cap, "all_gather", "forward") == 0
    groups = {op.group for op in cap.ops if op.collective}
    assert groups == {(0, 1)}


def test_fsdp2_collective_volumes():
    # fully_shard per decoder layer and at the root: every unit's parameters are all-gathered for the
    # forward, the layers again for the backward (resharded after forward), and the gradients
    # reduce-scattered; once per micro-batch.
    batch, dp = 4, 2
    cap = capture(config(), task="train", batch=batch, seq=SEQ, plan=Plan(dp=dp, fsdp=True))
    m = batch // dp
    assert cap.micro_steps == m
    full = (L * PARAMS_PER_LAYER + ROOT_PARAMS) * BF16
    assert collective_bytes(cap, "all_gather", "forward") == m * full
    assert collective_bytes(cap, "all_gather", "backward") == m * L * PARAMS_PER_LAYER * BF16
    assert collective_bytes(cap, "reduce_scatter", "backward") == m * full
    assert {op.group for op in cap.ops if op.collective} == {(0, 1)}
    # Each rank holds half the parameters.
    assert cap.static_bytes < full


def test_pipeline_and_ddp_collective_volumes():
    batch, pp, dp = 8, 2, 2
    cap = capture(config(), task="train", batch=batch, seq=SEQ, plan=Plan(pp=pp, dp=dp))
    m = batch // dp
    assert cap.pp_boundary_bytes == SEQ * H * BF16  # one micro-batch of hidden states per stage boundary
    sends = [op for op in cap.ops if op.collective == "send"]
    assert sorted(op.phase for op in sends) == ["backward", "forward"]
    assert all(op.count == m and op.comm_bytes == SEQ * H * BF16 and op.group == (0, dp) for op in sends)
    # DDP: one all-reduce of the gradients of this stage's parameters (2 layers, embedding, head, norm).
    (ar,) = [op for op in cap.ops if op.collective == "all_reduce"]
    assert ar.comm_bytes == (L // pp * PARAMS_PER_LAYER + ROOT_PARAMS) * BF16 and ar.group == (0, 1)


def test_elementwise_ops_cost_what_the_engine_model_gives_their_streaming_kernel():
    import nki

    from torch_neuronx.estimate._capture import Op
    from torch_neuronx.estimate._costs import target, trainium_op_cost
    from torch_neuronx.estimate._elementwise import COLS, _binary
    from torch_neuronx.estimate._facts import chip

    t = target("trn2")
    P = chip("trn2")["partitions"]  # the streaming kernels' tile rows

    def add(rows):
        shape = (rows, COLS)
        return Op("aten.add.Tensor", "forward", [(shape, "bfloat16")] * 2, [(shape, "bfloat16")], 0, 0)

    spec = nki.TensorSpec((8 * P, COLS), "bfloat16")
    want = nki.estimate(_binary, platform="trn2")(spec, spec).latency_us * 1e-6
    # A rank (logical core) is two physical cores: the op is split over them.
    assert trainium_op_cost(add(8 * P), t, "bf16").seconds * t.lnc == pytest.approx(want, rel=1e-6)
    times = [trainium_op_cost(add(rows), t, "bf16").seconds for rows in (1, 128, 4096, 65536)]
    assert times == sorted(times) and times[0] > 0


def test_estimate_end_to_end_and_deterministic():
    kw = dict(task="train", batch=4, seq=SEQ, tp=2, dp=2, fsdp=True, platforms="trn2,trn3,h100")
    a = torch_neuronx.estimate(config(), **kw)
    b = torch_neuronx.estimate(config(), **kw)
    assert a.to_json() == b.to_json()
    js = a.to_json()
    for name in ("trn2", "trn3", "h100"):
        r = js["platforms"][name]
        assert r["fits"] is True and r["step_time_s"] > 0 and 0 < r["mfu"] < 1
        assert r["tokens_per_s"] == pytest.approx(4 * SEQ / r["step_time_s"])
        assert sum(r["breakdown"].values()) == pytest.approx(r["step_time_s"])
    # trn3 has the faster vector engine and HBM: never slower on the same step
    assert js["platforms"]["trn3"]["step_time_s"] <= js["platforms"]["trn2"]["step_time_s"]
    assert js["assumptions"] and "GPU comparator" in str(a)


def test_decode_and_generate():
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dec = torch_neuronx.estimate(config(), task="decode", batch=2, seq=64, tp=2, platforms="trn2")
    # the KV cache is passed the way this Transformers names it (`cache`; `past_key_values` is deprecated)
    assert not [w for w in seen if "past_key_values" in str(w.message)], [str(w.message) for w in seen]
    gen = torch_neuronx.estimate(config(), task="generate", batch=2, seq=64, new_tokens=8, platforms="trn2")
    assert dec.capture.tokens == 2 and gen.capture.tokens == 16
    assert {op.phase for op in gen.capture.ops} == {"prefill", "decode"}
    assert dec.results["trn2"].step_time_s < gen.results["trn2"].step_time_s


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.norm(self.up(x)))).square().mean()


def test_compiled_mode_costs_inductor_kernels():
    torch.manual_seed(0)
    model, x = _MLP(), torch.randn(32, 64)
    eager = capture(model, (x,), mode="record")
    compiled = capture(model, (x,), mode="record", compile=True)
    names = [op.name for op in compiled.ops]
    assert any(n.startswith("inductor.") for n in names)
    assert "aten.gelu.default" in [op.name for op in eager.ops] and "aten.gelu.default" not in names
    # The same matmuls, now as Inductor's extern kernels: forward and weight gradient of both layers,
    # the input gradient of the second only (the input needs none).
    assert matmul_flops(compiled) == matmul_flops(eager) == 2 * 32 * (64 * 256) * 5
    est = torch_neuronx.estimate(model, (x,), mode="record", compile=True, platforms="trn2")
    assert est.results["trn2"].step_time_s > 0


def _write_config(tmp_path, **kw):
    path = tmp_path / "config.json"
    config(**kw).to_json_file(path)
    return str(path)


def test_cli_writes_json_plot_and_trace(tmp_path, capsys):
    cfg = _write_config(tmp_path)
    out = tmp_path / "e.json"
    rc = main([cfg, "--batch", "4", "--seq", str(SEQ), "--tp", "2", "--dp", "2", "--fsdp", "--no-progress",
               "--json", str(out), "--plot", str(tmp_path / "e.png"), "--trace", str(tmp_path / "t.json")])
    text = capsys.readouterr().out
    assert rc == 0
    assert "step time" in text and "assumptions:" in text and "not modelled:" in text and "unverified" in text
    js = json.loads(out.read_text())
    assert set(js["platforms"]) == {"trn2", "trn3", "h100", "h200"}
    for r in js["platforms"].values():
        assert {"step_time_s", "tokens_per_s", "mfu", "memory_per_core_bytes", "fits", "usd_per_million_tokens",
                "breakdown"} <= set(r)
    assert js["platforms"]["trn3"]["usd_per_million_tokens"] is None  # no price shipped for it
    assert isinstance(js["assumptions"], list) and js["assumptions"]
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("ph") == "X" and e["name"] == "aten.mm.default" for e in trace["traceEvents"])


def test_model_that_does_not_fit_is_reported_with_its_largest_tensors(tmp_path, capsys):
    # ~17B parameters on one core in bf16 with AdamW: far beyond 24 GiB, reported, not raised.
    cfg = _write_config(tmp_path, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                        num_key_value_heads=8, vocab_size=32000)
    with open(cfg) as f:
        d = json.load(f)
    d["num_hidden_layers"] = 20
    with open(cfg, "w") as f:
        json.dump(d, f)
    out = tmp_path / "e.json"
    assert main([cfg, "--seq", "256", "--platform", "trn2", "--no-comparators", "--no-progress", "--json",
                 str(out)]) == 0
    r = json.loads(out.read_text())["platforms"]["trn2"]
    assert r["fits"] is False and r["memory_per_core_bytes"] > r["memory_capacity_per_core_bytes"]
    assert r["largest_tensors_if_not_fitting"] and "parameter" in r["largest_tensors_if_not_fitting"][0]
    assert "does not fit" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--platform", "trn9"], "unknown platform 'trn9'; choose from trn1, inf2, trn2, trn3, h100, h200"),
    (["--tp", "3"], "--tp 3 does not divide the model's 4 attention heads"),
    (["--pp", "3"], "--pp 3 does not divide the model's 4 layers"),
    (["--batch", "3", "--dp", "2"], "--batch 3 is not a multiple of dp x micro-batch"),
    (["--fsdp"], "--fsdp shards over the data-parallel ranks: give --dp > 1"),
])
def test_bad_plans_are_clear_errors(tmp_path, capsys, args, message):
    assert main([_write_config(tmp_path), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON (line 1"),
    ('{"instances": {"trn2.48xlarge": {"usd_per_hour": "cheap", "source": "x", "date": "2025"}}}',
     "needs \"usd_per_hour\" as a positive number"),
    ('{"instances": {"trn2.48xlarge": {"usd_per_hour": 30}}}', "needs \"source\""),
    ('[1, 2]', "no \"instances\" object"),
])
def test_malformed_price_file_is_a_clear_error(tmp_path, capsys, content, message):
    prices = tmp_path / "prices.json"
    prices.write_text(content)
    assert main([_write_config(tmp_path), "--no-progress", "--prices", str(prices)]) == 2
    err = capsys.readouterr().err
    assert f"price file {prices}" in err and message in err


def test_plot_without_matplotlib_names_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main([_write_config(tmp_path), "--no-progress", "--platform", "trn2", "--no-comparators", "--plot",
                 str(tmp_path / "e.png")]) == 2
    assert "--plot needs matplotlib, which is not installed: pip install matplotlib" in capsys.readouterr().err


def test_cli_in_a_fresh_process_reports_bad_input_without_a_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "torch_neuronx.estimate", _write_config(tmp_path), "--platform",
                        "trn2,gaudi"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "unknown platform 'gaudi'" in r.stderr and "Traceback" not in r.stderr


def test_check_reports_the_estimated_step_time():
    from torch_neuronx.check import check_model

    torch.manual_seed(0)
    report = check_model(_MLP(), (torch.randn(8, 64),), progress=False)
    assert set(report.estimate) == {"trn2", "trn3"} and all(v > 0 for v in report.estimate.values())
    assert "estimated training step time on Trainium" in str(report)

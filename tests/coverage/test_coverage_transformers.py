"""Hugging Face causal-LM coverage: each architecture of the CI subset, tiny and randomly
initialised, must match CPU on neuron (forward logits, every gradient, the AdamW step,
greedy generate, bfloat16 forward, and forward + backward compiled with the neuron backend).
Also checks that the sweep's checker notices a wrong device or compiled result, counts graph
breaks, and that its report counts statuses correctly."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from torch_neuronx.testing import Outcome

import hf_sweep  # coverage/ (on sys.path by conftest.py)

sweep = hf_sweep.population("transformers")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _explain(r: dict) -> str:
    stages = "; ".join(f"{k}: {v}" for k, v in r["stages"].items())
    return f"{r['arch']}: {r['status']} at {r['stage']}: {r['reason']}\n  stages: {stages}"


@pytest.mark.parametrize("arch", sweep.fast)
def test_architecture_matches_cpu(arch):
    r = sweep.check_one(arch)
    assert r["status"] == "pass", _explain(r)
    assert r["stages"] == {s: "pass" for s in sweep.stages}, _explain(r)  # every stage ran and matched
    # every op these models use has a native kernel; a new fallback op wants one too
    assert r["fallback_ops"] == {}, f"{arch} ran ops through the generic fallback: {r['fallback_ops']}"
    assert r["dynamo"]["compiles"] >= 1, r["dynamo"]  # the compiled stage really compiled


@pytest.mark.parametrize("arch", ["reformer", "prophetnet"])
def test_compiled_stage_of_architectures_that_need_the_cpu_cat_lowering(arch):
    # Inductor's masked pointwise cat (its GPU lowering) failed to compile for these; neuron
    # lowers cat as the CPU does. Compiled afresh: a warm AOTAutograd cache entry of prophetnet's
    # graph replays an _unsafe_view output alias with corrupted sizes (its deserialized ViewMeta),
    # an open defect this test is not about.
    import torch._functorch.config as functorch_config

    with functorch_config.patch(enable_autograd_cache=False):
        r = sweep.check_one(arch)
    assert r["stages"]["compiled"] == "pass", _explain(r)


# ---- the checker itself can fail ---------------------------------------------------------------

def _perturbed_copy(model):
    dev = copy.deepcopy(model)
    with torch.no_grad():
        dev.get_output_embeddings().weight[0, 0] += 0.5  # every logit row reads this weight
    return dev


def _frozen_copy(model):
    dev = copy.deepcopy(model)
    dev.get_input_embeddings().weight.requires_grad_(False)
    return dev


def test_checker_reports_a_wrong_device_result(monkeypatch):
    monkeypatch.setattr(sweep, "device_copy", _perturbed_copy)
    r = sweep.check_one("llama")
    assert r["status"] == "fail" and r["stage"] == "forward", _explain(r)
    assert "logits" in r["reason"] and "differ" in r["reason"], r["reason"]


def test_checker_reports_a_missing_gradient(monkeypatch):
    monkeypatch.setattr(sweep, "device_copy", _frozen_copy)
    r = sweep.check_one("llama")
    assert r["status"] == "fail" and r["stage"] == "backward", _explain(r)
    assert "None on neuron" in r["reason"], r["reason"]


def test_checker_reports_a_wrong_compiled_result(monkeypatch):
    real = sweep.compiled

    def wrong(model, batch, config):
        out = real(model, batch, config)
        out["logits"] = out["logits"] + 0.5
        return out

    monkeypatch.setattr(sweep, "compiled", wrong)
    r = sweep.check_one("llama")
    assert r["status"] == "fail" and r["stage"] == "compiled", _explain(r)
    assert r["reason"].startswith("vs eager neuron: ") and "logits" in r["reason"], r["reason"]
    assert r["stages"]["step"] == "pass", _explain(r)  # the step ran on eager's gradients


def test_compiled_stage_leaves_eager_gradients(monkeypatch):
    real = sweep.backward

    def backward(model, batch, config=None):
        out = real(model, batch, config)
        if model._compiled_call_impl is not None:  # the compiled stage's own run: spoil its grads
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.add_(1.0)
        return out

    monkeypatch.setattr(sweep, "backward", backward)
    r = sweep.check_one("llama")
    assert r["stages"]["compiled"] == "pass" and r["stages"]["step"] == "pass", _explain(r)


def test_graph_breaks_are_counted(monkeypatch):
    real = sweep.build

    def with_break(model_type, record):
        model, config = real(model_type, record)
        model.model.norm.register_forward_pre_hook(lambda m, args: torch._dynamo.graph_break())
        return model, config

    monkeypatch.setattr(sweep, "build", with_break)
    r = sweep.check_one("llama")
    assert r["stages"]["compiled"] == "pass", _explain(r)  # a graph break is allowed, and counted
    assert r["dynamo"]["graph_breaks"] >= 1 and r["dynamo"]["compiles"] >= 2, r["dynamo"]
    assert any("graph_break" in k for k in r["dynamo"]["graph_break_reasons"]), r["dynamo"]


# ---- report ------------------------------------------------------------------------------------

def _record(arch, status, stage=None, reason=""):
    return {"arch": arch, "status": status, "stage": stage, "reason": reason, "stages": {},
            "fallback_ops": {"aten::histc": 2} if status == "fail" else {}, "seconds": 1.0, "params": 10,
            "notes": []}


FABRICATED = [
    _record("a_pass", "pass"),
    _record("b_pass", "pass"),
    _record("c_fail", "fail", "backward", "grads.w: 3 of 4 elements differ"),
    _record("d_unrunnable", "cpu-unrunnable", "setup", "CPU setup: ImportError: needs timm"),
    _record("e_crash", "crash", None, "worker process died (exit code -11)"),
    _record("f_timeout", "timeout", None, "no result after 240 s"),
]
META = {"torch": "t", "transformers": "x", "date": "2000-01-01", "command": "cmd", "workers": 2,
        "timeout": 240, "wall_seconds": 1.0, "architectures": 6}


def test_summary_counts_cpu_unrunnable_apart_and_crash_timeout_as_not_passing():
    s = sweep.summarize(FABRICATED)
    assert s["total"] == 6 and s["pass"] == 2 and s["fail"] == 1 and s["crash"] == 1 and s["timeout"] == 1
    assert s["cpu-unrunnable"] == 1 and s["runnable"] == 5
    assert s["pass_rate"] == pytest.approx(2 / 5)


def test_outcomes_that_are_not_results_never_pass():
    crash = sweep.record(Outcome("x", "crash", error="worker process died (exit code -6)"))
    timeout = sweep.record(Outcome("y", "timeout", error="no result after 240 s", seconds=240))
    raised = sweep.record(Outcome("z", "exception", error="KeyError: 'k'\nTraceback ..."))
    assert (crash["status"], timeout["status"], raised["status"]) == ("crash", "timeout", "fail")
    assert raised["reason"] == "KeyError: 'k'"
    assert sweep.summarize([crash, timeout, raised])["pass"] == 0


def test_report_files(tmp_path):
    md, js = sweep.write(FABRICATED, tmp_path, META)
    data = json.loads(js.read_text())
    assert data["summary"]["pass"] == 2 and data["summary"]["runnable"] == 5
    assert [r["arch"] for r in data["results"]] == [r["arch"] for r in FABRICATED]
    text = md.read_text()
    assert "Pass rate: 2 / 5 = 40.0%" in text
    failures = text.split("## Failures")[1].split("## Compiled stage not passing")[0]
    not_compiled = text.split("## Compiled stage not passing")[1].split("## CPU-unrunnable")[0]
    assert "c_fail" in not_compiled and "d_unrunnable" not in not_compiled
    unrunnable = text.split("## CPU-unrunnable")[1]
    for arch in ("c_fail", "e_crash", "f_timeout"):
        assert arch in failures
    assert "d_unrunnable" in unrunnable and "needs timm" in unrunnable
    assert "d_unrunnable" not in failures and "a_pass" not in failures
    assert "| e_crash | crash |" in text and "| a_pass | pass |" in text


@pytest.mark.parametrize("records, code", [
    (FABRICATED[:2] + FABRICATED[3:4], 0),                # passes and cpu-unrunnable only
    (FABRICATED[:2] + FABRICATED[4:5], 1),                # a crash
    (FABRICATED[:2] + FABRICATED[5:6], 1),                # a timeout
    (FABRICATED[:3], 1),                                  # a failure
])
def test_exit_code(monkeypatch, records, code):
    monkeypatch.setattr(sweep, "run", lambda names, workers, timeout: records)
    assert hf_sweep.main(["--population", "transformers", "--only", "llama", "--no-write"]) == code

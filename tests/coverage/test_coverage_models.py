"""Hugging Face model-family coverage: each family of the CI subset (the population's ``fast`` subset), with
the task head it is used with, tiny and randomly initialised, must match CPU on neuron: forward
(every output, loss included), every gradient, the AdamW step, greedy generate for the heads that
generate text, and the bfloat16 forward. The subset runs through the sweep's own worker pool.
Also checks that the sweep's checker notices a wrong device result, that ``cpu-unrunnable``
cannot hide a device failure or a harness gap, and that its report counts statuses correctly."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from torch_neuronx.testing import Outcome

import _models_specs as specs  # coverage/ (on sys.path by conftest.py)
import hf_sweep

sweep = hf_sweep.population("models")

TIMEOUT = 240.0


@pytest.fixture(scope="module")
def fast_records() -> dict:
    """One isolated run of the whole subset (two workers), keyed by architecture."""
    records = sweep.run(list(sweep.fast), workers=2, timeout=TIMEOUT, progress=False)
    return {r["arch"]: r for r in records}


def _explain(r: dict) -> str:
    stages = "; ".join(f"{k}: {v}" for k, v in r["stages"].items())
    return f"{r['arch']}: {r['status']} at {r['stage']}: {r['reason']}\n  stages: {stages}"


def test_fast_subset_is_the_most_used_families_of_every_modality():
    names = sweep.fast
    assert len(names) == 20 and len(set(names)) == 20  # an empty subset would collect nothing
    assert set(names) <= set(sweep.names())
    tasks = {specs.task_of(n)[0] for n in names}
    assert {"masked-lm", "seq2seq-lm", "speech-seq2seq", "ctc", "image-classification", "contrastive",
            "image-text-to-text", "causal-lm"} <= tasks, tasks


@pytest.mark.parametrize("arch", sweep.fast)
def test_family_matches_cpu(fast_records, arch):
    r = fast_records[arch]
    assert r["status"] == "pass", _explain(r)
    task = r["task"]
    expected = {"setup", "forward", "backward", "step", "bf16"}
    if task in specs.TEXT_GENERATION:
        expected.add("generate")
    assert set(r["stages"]) == expected, _explain(r)  # every stage ran ...
    assert all(v == "pass" for v in r["stages"].values()), _explain(r)  # ... and matched CPU
    assert r["params"] > 0 and r["notes"] == [], _explain(r)


# ---- the checker itself can fail ---------------------------------------------------------------

def _perturbed_copy(model):
    dev = copy.deepcopy(model)
    with torch.no_grad():
        next(p for p in dev.parameters() if p.dim() == 2)[0, 0] += 0.5  # the embedding every row reads
    return dev


def _frozen_copy(model):
    dev = copy.deepcopy(model)
    dev.get_input_embeddings().weight.requires_grad_(False)
    return dev


def test_checker_reports_a_wrong_device_result(monkeypatch):
    monkeypatch.setattr(sweep, "device_copy", _perturbed_copy)
    r = sweep.check_one("bert")
    assert r["status"] == "fail" and r["stage"] == "forward", _explain(r)
    assert "differ" in r["reason"], r["reason"]


def test_checker_reports_a_missing_gradient(monkeypatch):
    monkeypatch.setattr(sweep, "device_copy", _frozen_copy)
    r = sweep.check_one("bert")
    assert r["status"] == "fail" and r["stage"] == "backward", _explain(r)
    assert "None on neuron" in r["reason"], r["reason"]


def test_a_head_that_writes_to_its_inputs_is_compared_on_the_inputs_cpu_saw():
    # BLIP's generate sets the first token of the ids it is given; the device's forward must still
    # get the ids the CPU forward got (its loss differed when they leaked into the device's inputs)
    r = sweep.check_one("blip")
    assert r["status"] == "pass" and r["stages"]["generate"] == "pass", _explain(r)


def test_projection_loss_weighs_every_element():
    a = torch.zeros(3, 4, requires_grad=True)
    b = torch.zeros(5, requires_grad=True)
    hf_sweep.projection_loss({"x": a, "y": (b, torch.ones(2))}).backward()
    assert bool((a.grad != 0).all()) and bool((b.grad != 0).all())
    with pytest.raises(RuntimeError, match="no output"):
        hf_sweep.projection_loss({"x": torch.ones(2)})


# ---- cpu-unrunnable hides nothing --------------------------------------------------------------

def _on_device(batch: dict) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "neuron" for v in batch.values())


def test_a_device_error_that_looks_like_a_missing_package_is_a_failure(monkeypatch):
    real = sweep.forward

    def forward(model, batch, ctx):
        if _on_device(batch):
            raise ImportError("No module named 'timm'")
        return real(model, batch, ctx)

    monkeypatch.setattr(sweep, "forward", forward)
    r = sweep.check_one("bert")
    assert r["status"] == "fail" and r["stage"] == "forward", _explain(r)


def test_a_declared_library_defect_that_does_not_happen_is_a_failure(monkeypatch):
    monkeypatch.setitem(specs.SPECS, "bert", specs.Spec("test", unrunnable="a library defect",
                                                        unrunnable_match="Traceback"))
    r = sweep.check_one("bert")
    assert r["status"] == "fail" and r["stage"] == "harness", _explain(r)
    assert "declared cpu-unrunnable" in r["reason"], r["reason"]


def test_a_declared_library_defect_must_match_the_actual_error(monkeypatch):
    def broken(model, batch, ctx):
        raise ValueError("shapes do not match")

    monkeypatch.setattr(sweep, "forward", broken)
    monkeypatch.setitem(specs.SPECS, "bert", specs.Spec("test", unrunnable="a library defect",
                                                        unrunnable_match="some other error"))
    r = sweep.check_one("bert", device=False)
    assert r["status"] == "fail" and r["stage"] == "harness", _explain(r)  # a harness gap, not hidden
    monkeypatch.setitem(specs.SPECS, "bert", specs.Spec("test", unrunnable="a library defect",
                                                        unrunnable_match="shapes do not match"))
    r = sweep.check_one("bert", device=False)
    assert r["status"] == "cpu-unrunnable" and "a library defect" in r["reason"], _explain(r)


def test_a_cpu_error_is_a_harness_failure_unless_a_package_is_missing(monkeypatch):
    def broken(model, batch, ctx):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(sweep, "forward", broken)
    r = sweep.check_one("bert", device=False)
    assert r["status"] == "fail" and r["stage"] == "harness", _explain(r)

    def missing(model, batch, ctx):
        raise ImportError("No module named 'timm'")

    monkeypatch.setattr(sweep, "forward", missing)
    r = sweep.check_one("bert", device=False)
    assert r["status"] == "cpu-unrunnable" and "timm" in r["reason"], _explain(r)


# ---- report ------------------------------------------------------------------------------------

def _record(arch, status, stage=None, reason="", task="masked-lm"):
    return {"arch": arch, "task": task, "class": "X", "status": status, "stage": stage, "reason": reason,
            "stages": {}, "fallback_ops": {"aten::histc": 2} if status == "fail" else {}, "seconds": 1.0,
            "params": 10, "notes": []}


FABRICATED = [
    _record("a_pass", "pass"),
    _record("b_pass", "pass", task="image-classification"),
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
    assert s["by_task"] == {"image-classification": [1, 1], "masked-lm": [1, 4]}


def test_outcomes_that_are_not_results_never_pass():
    crash = sweep.record(Outcome("x", "crash", error="worker process died (exit code -6)"))
    timeout = sweep.record(Outcome("y", "timeout", error="no result after 240 s", seconds=240))
    raised = sweep.record(Outcome("z", "exception", error="KeyError: 'k'\nTraceback ..."))
    assert (crash["status"], timeout["status"], raised["status"]) == ("crash", "timeout", "fail")
    assert sweep.summarize([crash, timeout, raised])["pass"] == 0


def test_report_files(tmp_path):
    md, js = sweep.write(FABRICATED, tmp_path, META)
    data = json.loads(js.read_text())
    assert data["summary"]["pass"] == 2 and data["summary"]["runnable"] == 5
    text = md.read_text()
    assert "Pass rate: 2 / 5 = 40.0%" in text
    failures = text.split("## Failures")[1].split("## CPU-unrunnable")[0]
    unrunnable = text.split("## CPU-unrunnable")[1]
    for arch in ("c_fail", "e_crash", "f_timeout"):
        assert arch in failures
    assert "d_unrunnable" in unrunnable and "needs timm" in unrunnable
    assert "d_unrunnable" not in failures and "a_pass" not in failures


@pytest.mark.parametrize("records, code", [
    (FABRICATED[:2] + FABRICATED[3:4], 0),                # passes and cpu-unrunnable only
    (FABRICATED[:2] + FABRICATED[4:5], 1),                # a crash
    (FABRICATED[:2] + FABRICATED[5:6], 1),                # a timeout
    (FABRICATED[:3], 1),                                  # a failure
])
def test_exit_code(monkeypatch, records, code):
    monkeypatch.setattr(sweep, "run", lambda names, workers, timeout: records)
    assert hf_sweep.main(["--population", "models", "--only", "bert", "--no-write"]) == code

"""torch_neuronx.check: the model checker compares neuron with the CPU and reports what to do."""

from __future__ import annotations

import json

import pytest
import torch

from torch_neuronx import check_model

# One thread per child: the machine is shared. Progress bars off keeps the captured output short.
ENV = {"OMP_NUM_THREADS": "1", "TORCH_NEURONX_FALLBACK_POLICY": None}
CHECK = ["-W", "error::RuntimeWarning", "-m", "torch_neuronx.check"]

TINY_LLAMA = dict(
    model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)

# An op with no explicit neuron kernel; test_fallback_op_is_still_a_fallback guards that.
FALLBACK_OP = "aten::_logcumsumexp"

ENTRY_POINTS = '''
import torch


class Cumulative(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.1)  # both devices draw the same random stream: must still agree

    def forward(self, x):
        return torch.logcumsumexp(self.drop(self.proj(x)), dim=1)


class DeviceDependent(torch.nn.Module):
    """Deliberately wrong: computes something else on neuron."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x):
        if x.device.type == "neuron":
            x = x + 1e-2
        return {"scores": self.proj(x)}


class WithGraphBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)

    def forward(self, x):
        h = torch.relu(self.a(x))
        print("", end="")  # Dynamo cannot put print in a graph: one graph break
        return self.b(h)


def with_graph_break():
    torch.manual_seed(0)
    return WithGraphBreak(), torch.randn(3, 8)


def cumulative():
    torch.manual_seed(0)
    return Cumulative(), torch.randn(3, 8)


def device_dependent():
    torch.manual_seed(0)
    return DeviceDependent(), {"x": torch.randn(3, 8)}
'''


@pytest.fixture
def entry_points(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(ENTRY_POINTS)
    return str(path)


# The same models in this process, for the API tests.
_models: dict = {}
exec(ENTRY_POINTS, _models)
Cumulative, DeviceDependent = _models["Cumulative"], _models["DeviceDependent"]


def test_fallback_op_is_still_a_fallback():
    x = torch.randn(3, 8, device="neuron")
    torch.neuron.clear_op_tracking()
    torch.logcumsumexp(x, dim=1)
    assert FALLBACK_OP in torch.neuron.get_fallback_ops(), (
        f"{FALLBACK_OP} no longer runs through the generic fallback (it got a native kernel?): pick another "
        "op without an explicit neuron kernel for FALLBACK_OP and the test models in tests/coverage/test_check.py"
    )


def test_check_model_api_passes_and_records():
    torch.manual_seed(0)
    model = Cumulative()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = check_model(model, torch.randn(4, 8), steps=2, progress=False)
    assert report.passed, str(report)
    runs = {(r.stage, r.device.split(":")[0]): r for r in report.runs}
    for stage in ("inference", "training"):
        assert runs[stage, "neuron"].peak_memory > 0
        assert runs[stage, "neuron"].seconds > 0 and runs[stage, "cpu"].seconds > 0
    names = {(c.stage, c.name) for c in report.comparisons}
    assert {("inference", "output"), ("training", "output"), ("training", "loss"), ("training", "gradients"),
            ("training", "weights after step")} <= names
    assert all(c.ok and c.max_abs <= 1e-4 for c in report.comparisons), str(report)
    assert report.fallback_ops.get(FALLBACK_OP, 0) >= 1
    assert FALLBACK_OP in str(report) and "PASS" in str(report)
    json.dumps(report.to_dict())
    # the caller's model is not touched: the check works on copies
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_check_model_api_blocked_op_and_mismatch():
    torch.manual_seed(0)
    report = check_model(Cumulative(), (torch.randn(4, 8),), fallback_policy="error", progress=False)
    assert not report.passed
    assert [p.kind for p in report.problems] == ["fallback"], str(report)
    assert FALLBACK_OP in report.problems[0].what and "set_fallback_policy('warn')" in report.problems[0].advice

    torch.manual_seed(0)
    report = check_model(DeviceDependent(), {"x": torch.randn(4, 8)}, train=False, progress=False)
    assert not report.passed
    assert [(p.kind, p.what.split()[0]) for p in report.problems] == [("mismatch", "scores")], str(report)
    (scores,) = [c for c in report.comparisons if c.name == "scores"]
    assert not scores.ok and 5e-3 < scores.max_abs < 0.1
    # every op matches on its own inputs: the model's Python code is what differs
    assert report.divergence.startswith("all ") and "behaves differently on the device" in report.divergence
    assert "where it starts:" in str(report) and report.problems[0].advice.startswith("the model's own code")


def test_mismatch_names_the_first_op_that_differs():
    # A wrong device kernel for sigmoid, registered over the native one for this test only.
    import warnings

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        lib.impl("sigmoid", lambda t: (torch.sigmoid(t.cpu()) + 1e-3).to(t.device), "PrivateUse1")
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 2))
        report = check_model(model, torch.randn(4, 8), progress=False)
    finally:
        lib._destroy()
    assert not report.passed and {p.kind for p in report.problems} == {"mismatch"}, str(report)
    assert report.divergence.startswith("aten::sigmoid "), report.divergence
    assert "float32[4, 8]" in report.divergence and "max abs diff 0.001" in report.divergence
    assert "device bug" in report.problems[0].advice
    x = torch.randn(4, 8, device="neuron")  # the native kernel is back
    torch.testing.assert_close(torch.sigmoid(x).cpu(), torch.sigmoid(x.cpu()))


def test_cli_tiny_llama_config_passes(run_python, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    out_json = tmp_path / "report.json"
    out = run_python("", env=ENV, args=CHECK + [str(tmp_path / "config.json"), "--json", str(out_json)])
    assert "PASS" in out and "LlamaForCausalLM" in out and "random weights" in out, out
    for name in ("logits", "loss", "gradients", "weights after step"):
        assert name in out, out
    report = json.loads(out_json.read_text())
    assert report["passed"] and report["problems"] == []
    assert any(r["stage"] == "training" and (r["peak_memory"] or 0) > 0 for r in report["runs"])


def test_cli_fallback_blocked_then_allowed(run_python, entry_points):
    target = f"{entry_points}:cumulative"
    out = run_python("", env=ENV, expect_rc=1, args=CHECK + [target, "--fallback-policy", "error", "--no-progress"])
    assert "FAIL" in out and FALLBACK_OP in out, out
    assert "set_fallback_policy('warn')" in out and "native kernel" in out, out
    assert "Traceback" not in out, out
    out = run_python("", env=ENV, args=CHECK + [target, "--no-progress"])
    assert "PASS" in out and FALLBACK_OP in out, out


def test_cli_detects_device_dependent_result(run_python, entry_points):
    out = run_python("", env=ENV, expect_rc=1, args=CHECK + [f"{entry_points}:device_dependent", "--no-progress"])
    assert "MISMATCH" in out and "scores differs from the CPU" in out, out
    assert "branches on the device" in out and "repro info" in out, out


@pytest.mark.parametrize("target, expected", [
    ("{tmp}/missing/config.json", "no such file"),
    ("nosuchmodule:fn", "cannot import module 'nosuchmodule'"),
    ("nosuch-org/nosuch-model", "not a model in the local Hugging Face cache"),
])
def test_cli_bad_target(run_python, tmp_path, target, expected):
    env = dict(ENV, HF_HUB_CACHE=str(tmp_path / "empty-cache"), HF_HUB_OFFLINE="1")
    out = run_python("", env=env, expect_rc=2, args=CHECK + [target.format(tmp=tmp_path)])
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("torch_neuronx.check: error:") and expected in lines[0], out


def test_cli_cached_model_name_without_weights(run_python, tmp_path):
    # A hub cache holding only the config: the model is found offline and built with random weights.
    repo = tmp_path / "cache" / "models--tiny-org--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text(json.dumps(TINY_LLAMA))
    env = dict(ENV, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    out = run_python("", env=env, args=CHECK + ["tiny-org/tiny-llama", "--no-train", "--batch", "1", "--seq", "8",
                                                "--no-progress"])
    assert "PASS" in out and "random weights" in out and "int64[1, 8]" in out, out


def test_import_does_not_load_the_checker(run_python):
    out = run_python(
        "import sys, torch\n"
        "print('torch_neuronx.check' in sys.modules, 'transformers' in sys.modules)\n"
        "from torch_neuronx import check_model\n"
        "print(check_model.__module__)\n",
        env=ENV,
    )
    assert out.split() == ["False", "False", "torch_neuronx.check"], out


def test_cli_help_documents_targets_and_exit_codes(run_python):
    out = run_python("", env=ENV, args=CHECK + ["--help"])
    for text in ("config.json", "module:function", "--fallback-policy", "--json", "exit status", "examples:"):
        assert text in out, out


def test_check_compile_reports_graph_breaks_and_compile_time(run_python, entry_points):
    out = run_python("", env=ENV, args=CHECK + [f"{entry_points}:with_graph_break", "--compile", "--no-progress",
                                               "--steps", "2"])
    assert "PASS" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("torch.compile(backend='neuron')"))
    # One break in the module's code, hit by the inference and the training graphs.
    assert "0 graph break(s)" not in line and "compile time" in line, line
    assert "graph break x" in out, out


def test_check_model_compile_api():
    model, x = _models["with_graph_break"]()
    report = check_model(model, x, steps=2, compile=True, progress=False)
    assert report.passed, str(report)
    c = report.compile
    assert c["backend"] == "neuron" and c["graph_breaks"] >= 1 and c["compiles"] >= 2 and c["compile_time_s"] > 0
    assert report.to_dict()["compile"]["graph_breaks"] == c["graph_breaks"]
    assert check_model(model, x, steps=1, train=False, progress=False).compile == {}

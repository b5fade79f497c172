"""What every coverage sweep shares (``coverage/_sweep.py``): one command line, in which a full
run writes its report into docs/coverage and a subset only where ``--out-dir`` says, with the
command that regenerates it; and the sweeps import only what the repository declares."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest

import compiled_ops_sweep  # coverage/ (on sys.path by conftest.py)
import fake_sweep
import hf_sweep
import opinfo_sweep

_REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def _passing(name: str) -> dict:
    return {"arch": name, "status": "pass", "stage": None, "reason": "", "stages": {}, "fallback_ops": {},
            "seconds": 1.0, "params": 10, "notes": []}


@pytest.fixture
def causal(monkeypatch, tmp_path):
    """The causal-LM population with its run replaced by passing records, in an empty directory."""
    pop = hf_sweep.population("transformers")
    monkeypatch.setattr(pop, "run", lambda names, workers, timeout: [_passing(n) for n in names])
    monkeypatch.chdir(tmp_path)
    return pop


def test_full_run_writes_its_report_and_a_subset_only_where_asked(causal, tmp_path):
    assert hf_sweep.main(["--population", "transformers", "--only", "llama,gpt2"]) == 0
    assert not (tmp_path / "docs").exists()  # a subset never overwrites the committed report
    assert hf_sweep.main(["--population", "transformers", "--only", "llama", "--out-dir", "sub"]) == 0
    meta = json.loads((tmp_path / "sub" / "transformers.json").read_text())["meta"]
    assert meta["command"] == "python coverage/hf_sweep.py --population transformers --only llama"
    assert "Regenerate: `python coverage/hf_sweep.py --population transformers --only llama`" in \
        (tmp_path / "sub" / "transformers.md").read_text()

    assert hf_sweep.main(["--population", "transformers", "--workers", "3", "--timeout", "5"]) == 0
    data = json.loads((tmp_path / "docs" / "coverage" / "transformers.json").read_text())
    assert data["meta"]["command"] == "python coverage/hf_sweep.py --population transformers"
    assert (data["meta"]["workers"], data["meta"]["timeout"]) == (3, 5.0)
    assert len(data["results"]) == data["meta"]["architectures"] == len(causal.names()) > 100
    assert not (tmp_path / "docs" / "coverage" / "transformers_models.json").exists()
    assert hf_sweep.main(["--population", "transformers", "--fast", "--no-write", "--out-dir", "x"]) == 0
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("argv, message", [
    (["--only", "llama"], "the following arguments are required: --population"),
    (["--population", "causal"], "invalid choice: 'causal'"),
    (["--population", "transformers", "--only", "llama,bert_nope"], "not causal-LM model types: bert_nope"),
    (["--population", "models", "--only", "nope"], "not in MODEL_MAPPING_NAMES: nope"),
    (["--population", "diffusers", "--only", "Nope"], "no spec for: Nope"),
    (["--population", "transformers", "--workers", "0"], "--workers: must be greater than 0"),
])
def test_bad_options_are_usage_errors(causal, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        hf_sweep.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_op_sweeps_share_the_command_line(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    ran = []
    result = {"op": "add", "status": "ok", "counts": {"float32": {"pass": 2}}, "checks": {}, "failures": [],
              "reasons": {}, "seconds": 0.5}
    for cls in (opinfo_sweep.OpInfoSweep, fake_sweep.FakeSweep, compiled_ops_sweep.CompiledOpsSweep):
        monkeypatch.setattr(cls, "run", lambda self, items, workers, timeout: ran.append(items) or [dict(result)])
    assert opinfo_sweep.main(["--ops", "add", "--dtypes", "float32"]) == 0
    assert ran[-1] == [("add", ("float32",))] and not (tmp_path / "docs").exists()
    assert fake_sweep.main(["--dynamic", "--ops", "add", "--out-dir", "out"]) == 0
    meta = json.loads((tmp_path / "out" / "fake_dynamic.json").read_text())["meta"]
    assert meta["command"] == "python coverage/fake_sweep.py --dynamic --ops add" and meta["dynamic"] is True
    assert compiled_ops_sweep.main(["--core", "--max-samples", "2", "--out-dir", "out"]) == 0
    meta = json.loads((tmp_path / "out" / "ops_compiled.json").read_text())["meta"]
    assert meta["command"] == "python coverage/compiled_ops_sweep.py --core --max-samples 2"
    assert meta["max_samples"] == 2 and "the first 2 sample inputs" in (tmp_path / "out" / "ops_compiled.md").read_text()
    with pytest.raises(SystemExit):
        opinfo_sweep.main(["--ops", "add", "--dtypes", "float32,nope"])
    assert "--dtypes: not a list of torch dtypes" in capsys.readouterr().err


def _requirement_modules() -> set[str]:
    """Top-level modules of the distributions requirements.txt pins (and their dependency torch's)."""
    names = set()
    for line in (_REPO / "requirements.txt").read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*==", line)
        if m:
            names.add(re.sub(r"[-_.]+", "-", m[1]).lower())
    return {module for module, dists in importlib.metadata.packages_distributions().items()
            if any(re.sub(r"[-_.]+", "-", d).lower() in names for d in dists)}


def test_sweeps_import_only_declared_packages():
    """Every import in coverage/ (module level or not: the scripts run them all) is the standard
    library, torch-neuronx, a sibling script or a package requirements.txt pins."""
    files = sorted((_REPO / "coverage").glob("*.py"))
    allowed = set(sys.stdlib_module_names) | {"torch_neuronx", "nki"} | {f.stem for f in files}
    allowed |= _requirement_modules()
    assert {"yaml", "tqdm", "transformers", "diffusers", "torchgen"} <= allowed  # torchgen ships with torch
    undeclared = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            undeclared += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] not in allowed]
    assert not undeclared, f"imports of packages the repository does not declare: {undeclared}"

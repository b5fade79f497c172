"""The user-facing examples run as documented and pass their own checks (each compares its
neuron run with a CPU or single-device run and exits non-zero when they disagree)."""

from __future__ import annotations

from pathlib import Path

from _dist import torchrun
from _subprocess import run_python

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_lora_finetune():
    out = run_python("", args=[str(EXAMPLES / "lora_finetune.py")])
    assert out.rstrip().endswith("OK"), out


def test_trl_sft_tensor_parallel_x_fsdp_on_four_processes():
    res = torchrun(str(EXAMPLES / "trl_sft_tp_fsdp.py"), 4, timeout=600)
    assert any(line.endswith("]:OK") for line in res.out.splitlines()), res.out  # rank 0's verdict


def test_flux_tensor_parallel_on_two_processes(tmp_path):
    image = tmp_path / "flux.png"
    res = torchrun(str(EXAMPLES / "flux_tensor_parallel.py"), 2, "--steps", "2", "--size", "128", "--out", str(image),
                   timeout=600)
    assert "equal within" in res.out, res.out
    assert image.stat().st_size > 0


def test_moe_expert_parallel_on_two_processes():
    res = torchrun(str(EXAMPLES / "moe_expert_parallel.py"), 2, "--model", "qwen3_moe", timeout=600)
    assert "loss fell and matches one process" in res.out, res.out

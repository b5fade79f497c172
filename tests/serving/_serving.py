"""Shared pieces of the serving tests: the serving environment (.venv/serve, `make serve-deps`),
tiny checkpoints made in code, and Transformers' greedy ``generate`` on CPU as the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / ".venv" / "serve"
HERE = Path(__file__).resolve().parent

requires_serve_env = pytest.mark.skipif(
    not (SERVE / "vllm" / "__init__.py").is_file(),
    reason=f"vLLM is not installed in {SERVE}: run `make serve-deps` (make test does)")


def serve_env(**extra: str) -> dict:
    """The environment of a serving process: .venv/serve first on PYTHONPATH, one thread per
    process (the host's cores are shared), no usage reporting."""
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join(p for p in [str(SERVE), env.get("PYTHONPATH", "")] if p),
                "OMP_NUM_THREADS": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


def build_model(out: Path, family: str) -> Path:
    from torch_neuronx.vllm.tiny_models import build

    return build(out / family, family)


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """Transformers' greedy ``generate`` on CPU, one prompt at a time, never stopping early."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p, n in zip(prompts, max_tokens):
            ids = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
            out.append(ids[0, len(p):].tolist())
    return out


def run_offline(jobs: list[dict], tmp: Path, timeout: float = 900, **env: str) -> list[dict]:
    """Run tests/serving/_offline_generate.py on ``jobs`` in the serving environment; its RESULT
    lines, in job order."""
    spec = tmp / "jobs.json"
    spec.write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, str(HERE / "_offline_generate.py"), str(spec)],
                          env=serve_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CACHE_ROOT=str(tmp / "vllm-cache"),
                                        **env),
                          capture_output=True, text=True, timeout=timeout, cwd=tmp)
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or len(results) != len(jobs):
        raise AssertionError(f"offline vLLM run failed (exit {proc.returncode})\nstdout:\n{proc.stdout[-4000:]}"
                             f"\nstderr:\n{proc.stderr[-8000:]}")
    return results

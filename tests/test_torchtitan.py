"""TorchTitan 0.3.0's own trainer trains its Llama 3 and Qwen3 debug models on 4 neuron
processes: FSDP 2 x tensor parallel 2, selective activation checkpointing, AdamW with warm-up
(``make test-titan``, which installs it into ``.venv/titan``; see docs/huggingface.md, TorchTitan).
The exact comparison of the same recipe with one CPU process is ``fsdp2_tp_ac`` in
tests/test_distributed_parallel.py; here the trainer's own log is checked."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from _dist import DIST_DIR, torchrun
from _subprocess import run_python

TITAN = Path(__file__).resolve().parent.parent / ".venv" / "titan"
STEPS = 6
STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([-\d.naninf]+)\s+grad_norm:\s+([-\d.naninf]+)")


def _env(inductor_cache: Path | None = None) -> dict:
    if not (TITAN / "torchtitan").is_dir():
        raise AssertionError(f"torchtitan is not installed in {TITAN}: run `make titan-deps`")
    env = {"PYTHONPATH": os.pathsep.join([str(TITAN), os.environ.get("PYTHONPATH", "")]),
           "TOKENIZERS_PARALLELISM": "false"}
    if inductor_cache is not None:  # TorchTitan compiles FlexAttention; a cache of this run's own
        env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache)
    return env


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("titan_assets")
    run_python("", env=_env(), args=[str(DIST_DIR / "torchtitan_train.py"), "--make-assets", str(out)])
    return out


@pytest.mark.titan
@pytest.mark.parametrize("module,config", [("llama3", "llama3_debugmodel"), ("qwen3", "qwen3_debugmodel")])
def test_debug_model_trains_with_fsdp_tp_and_activation_checkpointing(assets, tmp_path, module, config):
    res = torchrun(
        "torchtitan_train.py", 4,
        "--module", module, "--config", config,
        "--hf_assets_path", str(assets / "tokenizer"),
        "--dataloader.dataset", "c4_test", "--dataloader.dataset_path", str(assets / "data"),
        "--training.seq_len", "128", "--training.local_batch_size", "2", "--training.steps", str(STEPS),
        "--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree", "2",
        # torch 2.13's FSDP has no spmd_types support (torchtitan's default targets newer torch)
        "--parallelism.spmd_backend", "partial_dtensor",
        "--compile.no-enable", "--checkpoint.no-enable", "--validator.no-enable", "--metrics.log_freq", "1",
        "--dump_folder", str(tmp_path), "--debug.seed", "42",
        env=_env(tmp_path / "inductor"), timeout=900,
    )
    log = re.sub(r"\x1b\[[0-9;]*m", "", res.out)
    rank0 = [line for line in log.splitlines() if line.startswith("[default0]:")]
    text = "\n".join(rank0)
    assert "dp_shard=2, cp=1, tp=2" in text, text
    assert "NEURON capacity" in text and "activation checkpointing to the model" in text, text
    assert "Applied FSDP to the model" in text, text
    steps = [(int(s), float(loss), float(norm)) for s, loss, norm in STEP.findall(text)]
    assert [s for s, _, _ in steps] == list(range(1, STEPS + 1)), text
    losses = [loss for _, loss, _ in steps]
    assert all(math.isfinite(x) for _, x, n in steps for x in (x, n)), steps
    # random init: about ln(vocabulary) at first; the corpus is learnable, so it falls steadily
    assert abs(losses[0] - math.log(2048)) < 0.6, losses
    assert losses[-1] < losses[0] - 0.8 and losses[-1] == min(losses), losses

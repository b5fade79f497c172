"""TorchTitan 0.3.0's own trainer trains its Llama 3 and Qwen3 debug models on 4 neuron
processes: FSDP 2 x tensor parallel 2, selective activation checkpointing, AdamW with warm-up
(``make test-titan``, which installs it into ``.venv/titan``; see docs/huggingface.md, TorchTitan).
The exact comparison of the same recipe with one CPU process is ``fsdp2_tp_ac`` in
tests/distributed/test_distributed_parallel.py; here the trainer's own log is checked. Its checkpoints: saved at
step 3, resumed by new processes on the same mesh and on 2 ranks, the losses continue unchanged."""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import pytest

from _dist import DIST_DIR, torchrun
from _subprocess import run_python

TITAN = Path(__file__).resolve().parents[2] / ".venv" / "titan"
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
# Llama 3's debug model trains the same way in the checkpoint test below (its uninterrupted run,
# with fp32 parameters); checked there with the same assertions (_check_trained).
@pytest.mark.parametrize("module,config", [("qwen3", "qwen3_debugmodel")])
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
    _check_trained("\n".join(rank0))


def _check_trained(text: str) -> None:
    """Rank 0's log of a 4-rank FSDP 2 x TP 2 run of STEPS steps from a random initialization."""
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


def _train(assets, dump: Path, nranks: int, tp: int, inductor: Path) -> tuple[dict[int, float], str]:
    """TorchTitan's Llama 3 debug model for STEPS steps, FSDP over nranks / tp ranks x TP tp, fp32
    parameters (so that runs on different meshes agree to fp32 rounding), a checkpoint every 3
    steps in ``dump``/ckpt, resuming from the latest one there; returns rank 0's loss per step and log."""
    res = torchrun(
        "torchtitan_train.py", nranks,
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--hf_assets_path", str(assets / "tokenizer"),
        "--dataloader.dataset", "c4_test", "--dataloader.dataset_path", str(assets / "data"),
        "--training.seq_len", "128", "--training.local_batch_size", "2", "--training.steps", str(STEPS),
        "--parallelism.data_parallel_shard_degree", str(nranks // tp), "--parallelism.tensor_parallel_degree", str(tp),
        "--parallelism.spmd_backend", "partial_dtensor", "--training.mixed_precision_param", "float32",
        "--checkpoint.enable", "--checkpoint.interval", "3", "--checkpoint.folder", "ckpt",
        "--compile.no-enable", "--validator.no-enable", "--metrics.log_freq", "1",
        "--dump_folder", str(dump), "--debug.seed", "42",
        env=_env(inductor), timeout=900,
    )
    text = "\n".join(line for line in re.sub(r"\x1b\[[0-9;]*m", "", res.out).splitlines()
                     if line.startswith("[default0]:"))
    return {int(s): float(loss) for s, loss, _ in STEP.findall(text)}, text


@pytest.mark.titan
def test_checkpoint_resumes_on_the_same_mesh_and_on_two_ranks(assets, tmp_path):
    """FSDP 2 x TP 2 on 4 ranks checkpoints at step 3 (DCP: model, AdamW, LR schedule, data loader,
    step); new processes resume from it on the same mesh, and on 2 ranks with FSDP 2 only (DCP
    reshards the TP x FSDP DTensors); both continue as the uninterrupted run did."""
    inductor = tmp_path / "inductor"  # one cache for the three runs: FlexAttention compiles once
    full, text = _train(assets, tmp_path / "full", 4, 2, inductor)
    _check_trained(text)
    step3 = tmp_path / "full" / "ckpt" / "step-3"
    assert sorted(p.name for p in step3.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]

    for name, nranks, tp in (("same_mesh", 4, 2), ("two_ranks", 2, 1)):
        dump = tmp_path / name
        shutil.copytree(step3, dump / "ckpt" / "step-3")
        resumed, text = _train(assets, dump, nranks, tp, inductor)
        assert f"Loading the checkpoint from {dump / 'ckpt' / 'step-3'}" in text, text
        assert sorted(resumed) == [4, 5, 6], text  # it went on from step 4
        for step, loss in resumed.items():
            # the log shows 5 decimals
            assert loss == pytest.approx(full[step], rel=1e-5, abs=2e-5), (name, step, resumed, full)

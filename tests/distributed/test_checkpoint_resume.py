"""Checkpoints that resume on ``neuron``: the Transformers ``Trainer`` under accelerate's FSDP2
plugin (sharded state dicts through torch.distributed.checkpoint) saves a checkpoint, the
processes end (or are killed right after the save), and new processes continue with
``trainer.train(resume_from_checkpoint=...)``. The oracle is the uninterrupted run with the same
seeds: the losses after the resume, the AdamW state, the LR scheduler and the RNG states (Python,
NumPy, CPU and the device's) must be what that run had. Worker: tests/distributed/workers/hf_trainer_resume.py;
TorchTitan's own checkpoints are in tests/ecosystem/test_torchtitan.py.
"""

from __future__ import annotations

import json
import math
import shutil
import signal

import numpy as np
import pytest
import torch
from _dist import spawn_ranks
from _tiny_llama import tiny_llama_config

STEPS, SAVE_AT = 6, 3
ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_llama_config()).save_pretrained(path)
    return path


def launch(nranks: int, model_dir, out_dir, tag: str, *args: str, expect_rc: int = 0) -> str:
    results = spawn_ranks("hf_trainer_resume.py", nranks, str(model_dir), str(out_dir), "--tag", tag,
                          "--steps", str(STEPS), "--save-at", str(SAVE_AT), *args, timeout=240, env=ENV)
    out = "\n".join(f"----- rank {r} (exit {rc})\n{o}" for r, (rc, o) in enumerate(results))
    for r, (rc, _) in enumerate(results):
        assert rc == expect_rc, f"rank {r} exited with {rc}, expected {expect_rc}\n{out}"
    return out


def losses(out_dir, tag: str) -> dict[int, dict]:
    steps = json.loads((out_dir / f"{tag}.json").read_text())["steps"]
    return {int(k): v for k, v in steps.items()}


def assert_losses_close(actual: dict, expected: dict, steps, rtol: float, what: str) -> None:
    for s in steps:
        a, e = actual[s]["loss"], expected[s]["loss"]
        assert math.isfinite(a) and abs(a - e) <= rtol * abs(e), f"{what}: step {s} loss {a} vs {e}"
        assert actual[s]["learning_rate"] == pytest.approx(expected[s]["learning_rate"], rel=1e-12), (what, s)


def probe(out_dir, tag: str, rank: int) -> dict:
    return torch.load(out_dir / f"{tag}.state{rank}.pt", weights_only=False)


def assert_state_equal(actual: dict, expected: dict, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    """AdamW state per parameter name, param groups and LR scheduler as in the uninterrupted run."""
    assert actual["optimizer"].keys() == expected["optimizer"].keys(), what
    for name, state in expected["optimizer"].items():
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}, (name, set(state))  # AdamW has stepped
        for key, value in state.items():
            torch.testing.assert_close(actual["optimizer"][name][key], value, rtol=rtol, atol=atol,
                                       msg=lambda m, n=name, k=key: f"{what}: {n} {k}: {m}")
    assert actual["param_groups"] == expected["param_groups"], what
    assert actual["scheduler"] == expected["scheduler"], what
    assert expected["scheduler"]["last_epoch"] == SAVE_AT, expected["scheduler"]


def assert_host_rng_equal(actual: dict, expected: dict, what: str) -> None:
    assert actual["python"] == expected["python"], f"{what}: Python RNG"
    an, en = actual["numpy"], expected["numpy"]
    assert an[0] == en[0] and np.array_equal(an[1], en[1]) and tuple(an[2:]) == tuple(en[2:]), f"{what}: NumPy RNG"
    assert torch.equal(actual["cpu"], expected["cpu"]), f"{what}: CPU RNG"


@pytest.fixture(scope="module")
def uninterrupted_2(model_dir, tmp_path_factory):
    """2 ranks, NEFTune noise on the device, checkpoint-3 saved on the way to step 6."""
    out = tmp_path_factory.mktemp("uninterrupted_2")
    launch(2, model_dir, out, "full", "--probe-at", str(SAVE_AT), "--neftune", "5")
    return out


def test_fsdp2_two_ranks_resume_matches_uninterrupted_run(model_dir, uninterrupted_2, tmp_path):
    ckpt = tmp_path / f"checkpoint-{SAVE_AT}"
    shutil.copytree(uninterrupted_2 / f"checkpoint-{SAVE_AT}", ckpt)
    # the sharded model and optimizer, one DCP file per rank, and one RNG file per rank
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (ckpt / part).iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (ckpt / "rng_state_1.pth").is_file()
    assert "neuron" in torch.load(ckpt / "rng_state_1.pth", weights_only=False)

    launch(2, model_dir, tmp_path, "resume", "--mode", "resume", "--checkpoint", str(ckpt),
           "--probe-at", str(SAVE_AT), "--neftune", "5")
    full, resumed = losses(uninterrupted_2, "full"), losses(tmp_path, "resume")
    assert sorted(full) == sorted(resumed) == list(range(1, STEPS + 1))
    assert full[STEPS]["loss"] < full[1]["loss"] - 0.1, full  # it trained
    assert_losses_close(resumed, full, range(SAVE_AT + 1, STEPS + 1), rtol=1e-5, what="resumed")
    for rank in range(2):
        a, e = probe(tmp_path, "resume", rank), probe(uninterrupted_2, "full", rank)
        assert_state_equal(a, e, f"rank {rank}")  # read back exactly
        assert_host_rng_equal(a["rng"], e["rng"], f"rank {rank}")
        # NEFTune drew from the device generator: its state moved, and came back
        assert torch.equal(a["rng"]["device"], e["rng"]["device"]), f"rank {rank}: neuron RNG"
        assert e["rng"]["device"].view(torch.int64)[1].item() > 0, e["rng"]["device"]


def test_fsdp2_killed_after_save_on_four_ranks_resumes_on_two(model_dir, tmp_path):
    """Four ranks save checkpoint-3 and are SIGKILLed; two new ranks load it (DCP reshards the
    FSDP2 model and AdamW state from 4 shards to 2) and continue as a 2-rank run would have."""
    killed = tmp_path / "killed"
    out = launch(4, model_dir, killed, "killed", "--mode", "kill", expect_rc=-signal.SIGKILL)
    assert out.count(f"saved checkpoint-{SAVE_AT}, killing myself") == 4, out
    ckpt = killed / f"checkpoint-{SAVE_AT}"
    assert len(list((ckpt / "pytorch_model_fsdp_0").glob("*.distcp"))) == 4
    assert (ckpt / "trainer_state.json").is_file() and not (killed / f"checkpoint-{SAVE_AT + 1}").exists()

    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    launch(2, model_dir, reference, "full", "--probe-at", str(SAVE_AT))
    launch(2, model_dir, resumed, "resume", "--mode", "resume", "--checkpoint", str(ckpt),
           "--probe-at", str(SAVE_AT))
    full, res = losses(reference, "full"), losses(resumed, "resume")
    # steps 1-3 were logged by the 4 ranks (restored from trainer_state.json), 4-6 by the 2 new ones:
    # the same global batches, so the same losses to rounding (sums in another order)
    assert_losses_close(res, full, range(1, STEPS + 1), rtol=1e-5, what="4 -> 2 ranks")
    for rank in range(2):
        a, e = probe(resumed, "resume", rank), probe(reference, "full", rank)
        # the 4-rank AdamW moments, resharded: equal to the 2-rank run's to rounding
        assert_state_equal(a, e, f"rank {rank}", rtol=1e-5, atol=1e-8)
        assert_host_rng_equal(a["rng"], e["rng"], f"rank {rank}")


def test_checkpoint_missing_a_shard_names_the_file(model_dir, uninterrupted_2, tmp_path):
    """A DCP shard deleted: every rank raises (torch's CheckpointException, carrying the reading
    rank's FileNotFoundError with the path) instead of hanging in the collectives of the load."""
    ckpt = tmp_path / f"checkpoint-{SAVE_AT}"
    shutil.copytree(uninterrupted_2 / f"checkpoint-{SAVE_AT}", ckpt)
    missing = ckpt / "pytorch_model_fsdp_0" / "__1_0.distcp"
    missing.unlink()
    out = launch(2, model_dir, tmp_path, "resume", "--mode", "resume", "--checkpoint", str(ckpt), expect_rc=1)
    for rank in range(2):
        assert f"[rank{rank}]: torch.distributed.checkpoint.api.CheckpointException" in out, out
    assert f"No such file or directory: '{missing}'" in out, out

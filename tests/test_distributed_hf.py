"""Hugging Face Accelerate and Transformers, multi-process on ``neuron`` with the ``neuron``
c10d backend, chosen by the libraries themselves.

* ``accelerate launch --num_processes 2`` takes accelerate's MULTI_NEURON path: accelerate
  finds the device through ``torch.accelerator.current_accelerator()`` / ``torch.neuron``,
  launches with torchrun because ``torch.neuron.device_count() > 1``, initializes the process
  group with backend ``"neuron"`` (its TORCH_DISTRIBUTED_BACKENDS table) and takes the device
  as ``torch.neuron.current_device()``. Worker: tests/dist/hf_accelerate_worker.py.
* ``transformers.Trainer`` with DDP on 2 processes (torchrun), a tiny LLaMA from its config.
  Worker: tests/dist/hf_trainer_worker.py.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile


from _dist import DIST_DIR, remove_leaked, run_session, shm_entries, torchrun



def accelerate_launch(script: str, *launch_args: str, env: dict | None = None, timeout: float = 300) -> str:
    """``python -m accelerate.commands.launch --num_processes 2 <launch_args> tests/dist/<script>``;
    returns the output, fails on a non-zero exit, a timeout or shared memory left behind."""
    with tempfile.TemporaryDirectory(prefix="tnx-hf-home-") as hf_home:
        return _accelerate_launch(script, launch_args, env, timeout, hf_home)


def _accelerate_launch(script, launch_args, env, timeout, hf_home) -> str:
    full_env = dict(os.environ)
    full_env.update({
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        # no user accelerate config (it lives under HF_HOME) and no network
        "HF_HOME": hf_home,
        "HF_HUB_OFFLINE": "1",
        "ACCELERATE_DISABLE_RICH": "1",
    })
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--main_process_port", "0", "--mixed_precision", "no", "--dynamo_backend", "no",
           *launch_args, str(DIST_DIR / script)]
    before = shm_entries()
    rc, out = run_session(cmd, full_env, timeout, f"accelerate launch {script}")
    leaked = remove_leaked(before)
    assert not leaked, f"accelerate launch {script} left shared memory behind: {leaked}\n{out}"
    assert rc == 0, f"accelerate launch {script} exited with {rc}\n{out}"
    return out


def _assert_ranks_ok(out: str, n: int = 2) -> None:
    for r in range(n):
        assert f"rank {r}: ok" in out, f"rank {r} did not finish\n{out}"


def test_accelerate_launch_neuron():
    """``accelerate launch --num_processes 2`` with no device flags: MULTI_NEURON, backend
    ``neuron``, device ``neuron:<local rank>``, correct gather/reduce/objects and a DDP step."""
    out = accelerate_launch("hf_accelerate_worker.py")
    _assert_ranks_ok(out)
    assert "FAIL" not in out, out
    for r in range(2):
        assert re.search(rf"rank {r}: distributed_type=DistributedType.MULTI_NEURON backend=neuron device=neuron:{r}", out), out


def test_trainer_ddp_neuron():
    """``transformers.Trainer`` + DDP on 2 neuron processes: loss falls, weights agree."""
    res = torchrun("hf_trainer_worker.py", 2, env={"HF_HUB_OFFLINE": "1"})
    _assert_ranks_ok(res.out)
    for r in range(2):
        assert re.search(rf"rank {r}: args.device=neuron:{r} parallel_mode=ParallelMode.DISTRIBUTED", res.out), res.out

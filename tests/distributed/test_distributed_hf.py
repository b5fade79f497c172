"""Hugging Face Accelerate and Transformers, multi-process on ``neuron`` with the ``neuron``
c10d backend, chosen by the libraries themselves.

* ``accelerate launch --num_processes 2`` takes accelerate's MULTI_NEURON path: accelerate
  finds the device through ``torch.accelerator.current_accelerator()`` / ``torch.neuron``,
  launches with torchrun because ``torch.neuron.device_count() > 1``, initializes the process
  group with backend ``"neuron"`` (its TORCH_DISTRIBUTED_BACKENDS table) and takes the device
  as ``torch.neuron.current_device()``. Worker: tests/distributed/workers/hf_accelerate_worker.py.
* ``transformers.Trainer`` with DDP on 2 processes (torchrun), a tiny LLaMA from its config.
  Worker: tests/distributed/workers/hf_trainer_worker.py.
"""

from __future__ import annotations

import re

from _dist import accelerate_launch, torchrun


def _assert_ranks_ok(out: str, n: int = 2) -> None:
    for r in range(n):
        assert f"rank {r}: ok" in out, f"rank {r} did not finish\n{out}"


def test_accelerate_launch_neuron():
    """``accelerate launch --num_processes 2`` with no device flags: MULTI_NEURON, backend
    ``neuron``, device ``neuron:<local rank>``, correct gather/reduce/objects and a DDP step."""
    out = accelerate_launch("hf_accelerate_worker.py", 2, ("--num_machines", "1", "--mixed_precision", "no",
                                                               "--dynamo_backend", "no"))
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

"""The ways a program can ask for the neuron backend, one after another in one process."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(__file__))
from _common import LOCAL_RANK, RANK, WORLD  # noqa: E402

import torch_neuronx.distributed as nd  # noqa: E402

dev = torch.device("neuron", LOCAL_RANK)
torch.neuron.set_device(dev)


def total(x: torch.Tensor) -> float:
    dist.all_reduce(x)
    return x.item()


# 1. No backend: neuron is the accelerator, so the default group is neuron's.
dist.init_process_group()
assert dist.get_backend() == "neuron", dist.get_backend()
assert total(torch.ones(1, device=dev)) == WORLD
dist.barrier()  # device-less call: needs the group's default backend to be neuron's
objs = [None] * WORLD
dist.all_gather_object(objs, RANK)
assert objs == list(range(WORLD)), objs
dist.destroy_process_group()
print("CHECK default ok", flush=True)

# 2. Explicit per-device map: CPU tensors on gloo, neuron tensors on neuron.
nd.reset_stats()
dist.init_process_group("cpu:gloo,neuron:neuron")
assert total(torch.ones(1)) == WORLD
assert total(torch.ones(1, device=dev)) == WORLD
assert nd.stats() == {"all_reduce": {"shm": 1}}, nd.stats()
lst = [RANK * 10]
dist.broadcast_object_list(lst, src=0)
assert lst == [0]
dist.destroy_process_group()
print("CHECK mixed ok", flush=True)

# 3. "neuron" by name, then a device mesh on it; a neuron-only group refuses CPU tensors.
dist.init_process_group("neuron", device_id=dev)
mesh = init_device_mesh("neuron", (WORLD,))
assert mesh.get_group().size() == WORLD
try:
    dist.all_reduce(torch.ones(1))
except (RuntimeError, ValueError) as e:
    assert "cpu" in str(e).lower(), e
else:
    raise AssertionError("a CPU tensor on a neuron-only group did not raise")
assert total(torch.ones(1, device=dev)) == WORLD
dist.destroy_process_group()
print("CHECK named ok", flush=True)
print(f"rank {RANK}: ok", flush=True)

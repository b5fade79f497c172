"""A process that never sets its device gets one from its DeviceMesh: global rank % device
count when no launcher said LOCAL_RANK (CUDA's rule); FSDP2 then computes there.
Launched by tests/distributed/test_distributed_collectives.py through spawn_ranks."""

from __future__ import annotations

import os

os.environ.pop("LOCAL_RANK", None)  # before torch: the device is then DeviceMesh's choice alone

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

dist.init_process_group("neuron")
assert not torch.neuron.is_initialized() and torch.neuron.current_device() == 0
mesh = init_device_mesh("neuron", (WORLD,))
want = torch.device("neuron", RANK % torch.neuron.device_count())
assert torch.neuron.current_device() == want.index, (torch.neuron.current_device(), want)

torch.manual_seed(0)
ref = nn.Linear(8, 4)
model = nn.Linear(8, 4)
model.load_state_dict(ref.state_dict())
fully_shard(model, mesh=mesh)
assert {p.device for p in model.parameters()} == {want}, [p.device for p in model.parameters()]
x = torch.randn(3, 8)
out = model(x)  # FSDP2 moves the CPU input to the mesh's device
assert out.device == want, out.device
torch.testing.assert_close(out.detach().cpu(), ref(x), rtol=1e-5, atol=1e-5)
dist.barrier()
dist.destroy_process_group()
print(f"rank {RANK}: ok on {want}", flush=True)

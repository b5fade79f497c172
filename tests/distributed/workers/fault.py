"""One rank is SIGKILLed mid-training; the others must raise, not hang."""

from __future__ import annotations

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(__file__))
from _common import LOCAL_RANK, RANK  # noqa: E402

VICTIM = int(sys.argv[1])
dev = torch.device("neuron", LOCAL_RANK % torch.neuron.device_count())
torch.neuron.set_device(dev)
dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=float(sys.argv[2])))
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(dev))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step in range(1000):
        if step == 3 and RANK == VICTIM:
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(8, 16, device=dev)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
except dist.DistBackendError as e:
    print(f"FAULT rank {RANK}: {e}", flush=True)
    sys.exit(3)
print(f"rank {RANK}: finished without noticing", flush=True)

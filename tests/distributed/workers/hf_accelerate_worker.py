"""Worker of tests/distributed/test_distributed_hf.py, launched by ``accelerate launch --num_processes 2``.

Nothing here chooses the device or the backend: ``Accelerator()`` must find the neuron device
and its process group on its own (accelerate's MULTI_NEURON path). Checks, on every process:
  * distributed type MULTI_NEURON, backend ``neuron``, device ``neuron:<local rank>``;
  * ``gather`` / ``reduce`` / ``pad_across_processes`` / ``gather_object`` /
    ``broadcast_object_list`` / ``wait_for_everyone`` give the right values across processes;
  * one training step of a small model through ``accelerator.prepare`` (DDP) leaves the same
    weights on every process, equal to a single-process oracle on the whole batch.

``TNX_TEST_ACCELERATE_CPU=1`` (launched by plain torchrun: ``accelerate launch --cpu`` would
start a single process) builds ``Accelerator(cpu=True)`` and expects MULTI_CPU / gloo / cpu
instead: it validates the script itself without the neuron backend.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType, broadcast_object_list, gather_object

CPU = os.environ.get("TNX_TEST_ACCELERATE_CPU") == "1"
failures: list[str] = []


def check(name: str, cond: bool, detail: object = "") -> None:
    print(f"CHECK {name}: {'ok' if cond else 'FAIL'} {detail}", flush=True)
    if not cond:
        failures.append(f"{name}: {detail}")


def on_device(t_device: torch.device, dev: torch.device) -> bool:
    if CPU:  # accelerate's MULTI_CPU device is "cpu:0", while tensors live on "cpu"
        return t_device.type == "cpu"
    return t_device == dev


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def main() -> None:
    accelerator = Accelerator(cpu=True) if CPU else Accelerator()
    rank, world, local = accelerator.process_index, accelerator.num_processes, accelerator.local_process_index
    dev = accelerator.device
    state = accelerator.state
    print(f"rank {rank}: distributed_type={accelerator.distributed_type} backend={state.backend} device={dev} "
          f"dist.backend={dist.get_backend() if dist.is_initialized() else None} "
          f"torch.neuron.current_device()={torch.neuron.current_device()}", flush=True)

    want_type = DistributedType.MULTI_CPU if CPU else DistributedType.MULTI_NEURON
    want_backend = "gloo" if CPU else "neuron"
    check("launched 2 processes", world == 2 and os.environ.get("WORLD_SIZE") == "2", (world, os.environ.get("WORLD_SIZE")))
    check("distributed_type", accelerator.distributed_type == want_type, accelerator.distributed_type)
    check("state.backend", state.backend == want_backend, state.backend)
    check("process group backend", dist.is_initialized() and dist.get_backend() == want_backend,
          dist.get_backend() if dist.is_initialized() else "not initialized")
    check("device type", dev.type == ("cpu" if CPU else "neuron"), dev)
    if not CPU:
        # accelerate sets device = torch.device("neuron", torch.neuron.current_device()) and never
        # calls set_device for neuron; DDP is then given device_ids=[local_process_index].
        check("device index == local rank", dev.index == local, f"device={dev} local_process_index={local}")

    # --- collectives through accelerate's own helpers ---------------------------------------
    t = torch.tensor([10.0 * rank + 1, 10.0 * rank + 2], device=dev)
    g = accelerator.gather(t)
    want = torch.tensor([10.0 * r + k for r in range(world) for k in (1, 2)])
    check("gather", g.device.type == dev.type and torch.equal(g.cpu(), want), (g, want))

    r = accelerator.reduce(t.clone(), reduction="sum")
    want = torch.tensor([sum(10.0 * q + 1 for q in range(world)), sum(10.0 * q + 2 for q in range(world))])
    check("reduce sum", torch.equal(r.cpu(), want), (r, want))
    r = accelerator.reduce(t.clone(), reduction="mean")
    check("reduce mean", torch.allclose(r.cpu(), want / world), (r, want / world))

    ragged = torch.arange(rank + 1, device=dev, dtype=torch.int64) + 1  # rank r has r+1 items
    padded = accelerator.pad_across_processes(ragged, dim=0, pad_index=-1)
    gp = accelerator.gather(padded).cpu().view(world, -1)
    want = torch.tensor([[k + 1 if k <= q else -1 for k in range(world)] for q in range(world)])
    check("pad_across_processes + gather", torch.equal(gp, want), (gp, want))

    m = accelerator.gather_for_metrics(torch.tensor([rank], device=dev))
    check("gather_for_metrics", m.cpu().tolist() == list(range(world)), m)

    objs = gather_object([{"rank": rank, "host": "x" * (rank + 1)}])
    check("gather_object", objs == [{"rank": q, "host": "x" * (q + 1)} for q in range(world)], objs)

    lst = [f"from {rank}", {"n": rank}] if rank == 0 else [None, None]
    broadcast_object_list(lst, from_process=0)
    check("broadcast_object_list", lst == ["from 0", {"n": 0}], lst)

    accelerator.wait_for_everyone()
    check("wait_for_everyone", True)

    # --- one DDP step through accelerator.prepare ------------------------------------------
    per = 4
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(per * world, 8, generator=gen), torch.randn(per * world, 2, generator=gen)
    oracle = build_model()
    opt = torch.optim.SGD(oracle.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(oracle(x), y).backward()
    opt.step()

    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=per, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    check("prepare wraps in DDP", isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model))
    for xb, yb in loader:
        check("batch on device", on_device(xb.device, dev), xb.device)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        break
    params = [p.detach() for p in accelerator.unwrap_model(model).parameters()]
    check("params on device", all(on_device(p.device, dev) for p in params), [p.device for p in params])
    flat = torch.cat([p.reshape(-1) for p in params])
    all_flat = accelerator.gather(flat.unsqueeze(0)).cpu()
    check("weights equal across processes", all(torch.equal(all_flat[0], all_flat[q]) for q in range(world)))
    want = torch.cat([p.detach().reshape(-1) for p in oracle.parameters()])
    check("weights equal the single-process oracle", torch.allclose(flat.cpu(), want, rtol=1e-5, atol=1e-6),
          (flat.cpu() - want).abs().max())

    accelerator.end_training()
    if failures:
        print(f"rank {rank}: FAILED {len(failures)} checks: {failures}", flush=True)
        raise SystemExit(1)
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    main()

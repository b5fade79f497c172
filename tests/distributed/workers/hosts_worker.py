"""Worker of tests/distributed/test_distributed_hosts.py: one rank of a job that spans two simulated hosts.

Launched by torchrun inside a network + UTS + mount namespace (one per host). Checks, on
every rank:
  * the job really spans two hosts: ranks 0-1 report hostname ``hostA``, ranks 2-3 ``hostB``;
  * all_reduce (sum) of per-rank inputs equals the reference computed from every rank's
    input, for several sizes and dtypes;
  * one DDP step of a small model equals the single-process oracle on the whole batch;
  * ``torch_neuronx.distributed.stats()`` (when it exists) says the all_reduce used shared
    memory within a host and gloo between hosts.

``TNX_TEST_BACKEND=gloo`` runs the same checks with backend gloo on CPU tensors, which
validates the namespace plumbing without the neuron backend.
"""

from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist

from _common import LOCAL_RANK, RANK, WORLD, done, init

BACKEND = os.environ.get("TNX_TEST_BACKEND", "neuron")
LOCAL_WORLD = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def rank_input(r: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    # Integer values (exact in every dtype used and in any summation order), distinct per rank.
    return ((torch.arange(n, dtype=torch.int64) * (r + 1) + 7 * r) % 1000).to(dtype)


def check_all_reduce(device: torch.device) -> None:
    for n in (1, 1000, (1 << 20) + 3):
        for dtype in (torch.float32, torch.int64):
            t = rank_input(RANK, n, dtype).to(device)
            dist.all_reduce(t)
            ref = sum(rank_input(r, n, dtype) for r in range(WORLD))
            assert t.device == device, (t.device, device)
            assert torch.equal(t.cpu(), ref), f"all_reduce n={n} {dtype}: got {t.cpu()[:8]} expected {ref[:8]}"
    # a non-trivial op on float data: max
    t = torch.tensor([float(RANK), -float(RANK), 3.5], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert t.cpu().tolist() == [float(WORLD - 1), 0.0, 3.5], t.cpu().tolist()


def check_other_collectives(device: torch.device) -> None:
    """Between hosts every other collective goes over gloo (all_reduce's AVG hierarchically)."""
    W = WORLD
    t = rank_input(RANK, 1000, torch.float32).to(device)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    ref = sum(rank_input(r, 1000, torch.float32) for r in range(W)) / W
    torch.testing.assert_close(t.cpu(), ref)
    b = rank_input(RANK, 300, torch.int64).to(device)
    dist.broadcast(b, src=W - 1)
    assert torch.equal(b.cpu(), rank_input(W - 1, 300, torch.int64))
    x = rank_input(RANK, 64, torch.float32).to(device)
    out = torch.empty(W * 64, device=device)
    dist.all_gather_into_tensor(out, x)
    assert torch.equal(out.cpu(), torch.cat([rank_input(r, 64, torch.float32) for r in range(W)]))
    big = rank_input(RANK, W * 40, torch.float32).to(device)
    part = torch.empty(40, device=device)
    dist.reduce_scatter_tensor(part, big)
    assert torch.equal(part.cpu(), sum(rank_input(r, W * 40, torch.float32) for r in range(W)).chunk(W)[RANK])
    # all_to_all_single with uneven splits: rank i sends i + j + 1 elements to rank j
    ins = [RANK + j + 1 for j in range(W)]
    outs = [j + RANK + 1 for j in range(W)]
    src = torch.arange(sum(ins), dtype=torch.float32) + 100 * RANK
    dst = torch.empty(sum(outs), device=device)
    dist.all_to_all_single(dst, src.to(device), output_split_sizes=outs, input_split_sizes=ins)
    expect = torch.cat([(torch.arange(sum(j + k + 1 for k in range(W)), dtype=torch.float32) + 100 * j)
                        .split([j + k + 1 for k in range(W)])[RANK] for j in range(W)])
    assert torch.equal(dst.cpu(), expect), (dst.cpu(), expect)
    # point to point within a host (0 -> 1) and between hosts (0 -> W - 1)
    if RANK == 0:
        dist.send(torch.full((5,), 11.0, device=device), 1)
        dist.send(torch.full((5,), 22.0, device=device), W - 1)
    elif RANK in (1, W - 1):
        r = torch.empty(5, device=device)
        dist.recv(r, 0)
        assert r.cpu().tolist() == [11.0 if RANK == 1 else 22.0] * 5, r
    dist.barrier()


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def check_ddp(device: torch.device) -> None:
    per_rank = 8
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(per_rank * WORLD, 16, generator=g)
    y = torch.randn(per_rank * WORLD, 4, generator=g)

    oracle = build_model()  # single process, whole batch, on the CPU
    opt = torch.optim.SGD(oracle.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(oracle(x), y).backward()
    opt.step()

    model = build_model().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type != "cpu" else None
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sl = slice(RANK * per_rank, (RANK + 1) * per_rank)
    loss = torch.nn.functional.mse_loss(ddp(x[sl].to(device)), y[sl].to(device))
    loss.backward()
    opt.step()
    for (name, p), q in zip(model.named_parameters(), oracle.parameters()):
        assert p.device == device, (name, p.device)
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def report_stats() -> None:
    try:
        import torch_neuronx.distributed as tnd
    except ImportError:
        print(f"rank {RANK}: STATS unavailable (no torch_neuronx.distributed)", flush=True)
        return
    if not hasattr(tnd, "stats"):
        print(f"rank {RANK}: STATS unavailable (torch_neuronx.distributed has no stats())", flush=True)
        return
    stats = tnd.stats()
    try:
        text = json.dumps(stats, default=str, sort_keys=True)
    except TypeError:
        text = repr(stats)
    print(f"rank {RANK}: STATS {text}", flush=True)


def main() -> None:
    if BACKEND == "gloo":
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    else:
        device = init(BACKEND)
    host = socket.gethostname()
    print(f"rank {RANK}: local_rank {LOCAL_RANK} host {host} device {device} backend {dist.get_backend()}", flush=True)

    hosts: list = [None] * WORLD
    dist.all_gather_object(hosts, host)
    # c10d rendezvous orders nodes by their address (hostname), so hostA holds ranks 0-1
    expected = [f"host{'AB'[r // LOCAL_WORLD]}" for r in range(WORLD)]
    assert hosts == expected, f"ranks are not placed on two hosts as expected: {hosts} != {expected}"

    check_all_reduce(device)
    print(f"rank {RANK}: all_reduce ok", flush=True)
    if BACKEND != "gloo":
        report_stats()  # right after the all_reduces, before DDP adds more collectives
    if BACKEND != "gloo":
        check_other_collectives(device)
        print(f"rank {RANK}: collectives ok", flush=True)
    check_ddp(device)
    print(f"rank {RANK}: ddp ok", flush=True)
    if BACKEND != "gloo":
        report_stats()
    done()


if __name__ == "__main__":
    main()

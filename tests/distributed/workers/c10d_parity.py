"""The neuron backend as PyTorch's own distributed tests see it (2 ranks): what gloo and NCCL
do that a backend is expected to do too.

* profiler: every collective and p2p op is an async profiler event ``neuron:<op>`` with its
  input shapes; the same program on an in-process gloo group (CPU) is the oracle;
* uneven ``all_gather`` / ``reduce_scatter`` (list forms whose tensors differ per rank);
* ``batch_isend_irecv`` with a send and a receive to the rank itself;
* timeouts carry c10d's wording ("caught collective operation timeout");
* pipelining: a schedule whose stages are not placed symmetrically (stages on one rank
  talk to each other), and static stages (shape inference off) with GPipe.

``TNX_DIST_DEVICE=cpu`` runs the checks that gloo supports on gloo, to validate them.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _common import DEVICE_KIND, RANK, WORLD, assert_close, assert_equal, clone, init, main  # noqa: E402

DEVICE = init()
ON_NEURON = DEVICE_KIND == "neuron"


def _data(rank: int, n: int, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * rank + n + salt)
    return torch.randn(n, generator=g)


# ---------------------------------------------------------------------------------------
# Profiler
# ---------------------------------------------------------------------------------------

def _collectives(dev, group):
    x = torch.ones(4, 3, device=dev)
    dist.all_reduce(x, group=group)
    dist.all_reduce(x, group=group, async_op=True).wait()
    dist.broadcast(x, 0, group=group)
    dist.reduce(x, 0, group=group)
    outs = [torch.empty(4, 3, device=dev) for _ in range(WORLD)]
    dist.all_gather(outs, x, group=group)
    dist.gather(x, outs if RANK == 0 else None, dst=0, group=group)
    dist.scatter(x, outs if RANK == 0 else None, src=0, group=group)
    big = torch.ones(WORLD * 4, 3, device=dev)
    dist.all_to_all_single(big.clone(), big, group=group)
    dist.barrier(group=group)
    if RANK == 0:
        dist.send(torch.ones(5, device=dev), 1, group=group)
    elif RANK == 1:
        dist.recv(torch.empty(5, device=dev), 0, group=group)


def _events(prof, prefix: str) -> list[tuple[str, list, bool]]:
    events = prof.events() if isinstance(prof, torch.profiler.profile) else prof.function_events
    return [(e.name[len(prefix):], e.input_shapes, e.is_async) for e in events if e.name.startswith(prefix)]


def check_profiler():
    gloo = dist.new_group(backend="gloo")
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, record_shapes=True) as ours:
        _collectives(DEVICE, None)
    with torch.profiler.profile(activities=acts, record_shapes=True) as oracle:
        _collectives("cpu", gloo)
    backend = dist.get_backend()
    got, want = _events(ours, f"{backend}:"), _events(oracle, "gloo:")
    assert got, "the profiler recorded no collective"
    assert got == want, f"\n{backend}: {got}\ngloo:   {want}"
    assert all(is_async for _, _, is_async in got), got
    # torch.autograd.profiler sees them too, with shapes, and ops issued inside another op
    # (all_gather_into_tensor on top of all_gather) are one event
    big = torch.empty(WORLD * 4, 3, device=DEVICE)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        dist.all_gather_into_tensor(big, torch.ones(4, 3, device=DEVICE))
    names = [n for n, _, _ in _events(prof, f"{backend}:")]
    if ON_NEURON:
        assert names == ["all_gather_into_tensor"], names
        assert _events(prof, f"{backend}:")[0][1] == [[4, 3]], _events(prof, f"{backend}:")
    dist.destroy_process_group(gloo)


# ---------------------------------------------------------------------------------------
# Uneven list collectives and p2p with oneself
# ---------------------------------------------------------------------------------------

def check_uneven_all_gather():
    for n in (3, 70_001):  # direct and chunked
        sizes = [n + 5 * r for r in range(WORLD)]
        x = _data(RANK, sizes[RANK]).to(DEVICE)
        outs = [torch.full((sizes[r],), -1.0, device=DEVICE) for r in range(WORLD)]
        dist.all_gather(outs, x)
        for r in range(WORLD):
            assert_equal(outs[r], _data(r, sizes[r]), f"all_gather output {r} of {n}")
    # 2-D outputs of different shapes and an empty one
    shapes = [(2, 3), (0, 3)] + [(1, 3)] * (WORLD - 2)
    x = torch.full(shapes[RANK], float(RANK + 1), device=DEVICE)
    outs = [torch.empty(s, device=DEVICE) for s in shapes]
    dist.all_gather(outs, x)
    for r in range(WORLD):
        assert_equal(outs[r], torch.full(shapes[r], float(r + 1)), f"all_gather 2-D output {r}")
    # this rank's own output must fit its input
    try:
        dist.all_gather([torch.empty(7 + r, device=DEVICE) for r in range(WORLD)], torch.ones(3, device=DEVICE))
    except ValueError as e:
        assert "this rank's" in str(e), e
    else:
        raise AssertionError("all_gather with a wrong own output size did not raise")


def check_uneven_reduce_scatter():
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
        sizes = [4 + 3 * r for r in range(WORLD)]
        ins = [_data(RANK, sizes[j], salt=j).to(DEVICE) for j in range(WORLD)]
        keep = [t.clone() for t in ins]
        out = torch.empty(sizes[RANK], device=DEVICE)
        dist.reduce_scatter(out, ins, op=op)
        parts = torch.stack([_data(r, sizes[RANK], salt=RANK) for r in range(WORLD)])
        ref = {dist.ReduceOp.SUM: parts.sum(0), dist.ReduceOp.MAX: parts.max(0).values,
               dist.ReduceOp.AVG: parts.sum(0) / WORLD}[op]
        assert_close(out, ref, f"reduce_scatter {op}")
        for j in range(WORLD):
            assert_equal(ins[j], keep[j], f"reduce_scatter input {j} unchanged")


def check_self_p2p():
    # NCCL lets a rank send to and receive from itself; pipelining does it for stages on one rank
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    mine = _data(RANK, 6, salt=1).to(DEVICE)
    got_self = torch.empty(6, device=DEVICE)
    got_prev = torch.empty(6, device=DEVICE)
    ops = [dist.P2POp(dist.isend, mine, RANK), dist.P2POp(dist.irecv, got_self, RANK),
           dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got_prev, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert_equal(got_self, _data(RANK, 6, salt=1), "recv from itself")
    assert_equal(got_prev, _data(prv, 6, salt=1), "recv from the previous rank")
    # the receive first, then the send; the send's data is what it was when it was issued
    t = torch.empty(2, 3, device=DEVICE)
    r = dist.irecv(t, RANK)
    src = torch.arange(6.0, device=DEVICE)
    s = dist.isend(src, RANK)
    src.zero_()
    r.wait()
    s.wait()
    assert_equal(t, torch.arange(6.0).reshape(2, 3), "irecv before isend to itself")
    # sizes that differ are refused, on the receive (the send has done its part)
    r = dist.irecv(torch.empty(4, device=DEVICE), RANK)
    dist.isend(torch.ones(5, device=DEVICE), RANK).wait()
    try:
        r.wait()
    except RuntimeError as e:
        assert "same size" in str(e), e
    else:
        raise AssertionError("a self recv of another size did not raise")


def check_timeout_wording():
    g = dist.new_group(timeout=datetime.timedelta(seconds=1))
    if RANK == 0:
        try:
            dist.all_reduce(torch.ones(1, device=DEVICE), group=g)
        except RuntimeError as e:
            msg = str(e)
            assert "caught collective operation timeout" in msg and "local rank 1" in msg, msg
        else:
            raise AssertionError("all_reduce without peers did not time out")
    dist.barrier()


# ---------------------------------------------------------------------------------------
# Pipelining
# ---------------------------------------------------------------------------------------

WIDTH = 8


def _stack(n: int) -> nn.Sequential:
    torch.manual_seed(11)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(n)])


def _reference(ref: nn.Module, x, y):
    ref.zero_grad()
    out = ref(x)
    loss = F.mse_loss(out, y, reduction="sum")
    loss.backward()
    return out.detach(), loss.detach()


def _check_grads(stages_mods: dict[int, nn.Module], ref: nn.Sequential, what: str):
    for i, mod in stages_mods.items():
        for (n, p), r in zip(mod.named_parameters(), ref[i].parameters()):
            assert p.grad is not None, f"{what}: stage {i} {n} has no gradient"
            assert_close(p.grad, r.grad, f"{what}: grad of stage {i} {n}", atol=1e-5, rtol=1e-4)


def check_pp_nonsymmetric():
    """Stages 0 and 3 on rank 0, 1 and 2 on rank 1 (a V): the 1 -> 2 and 3 <- ... hand-offs
    between stages of one rank go through send/recv to the rank itself."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, _Action, _ComputationType

    fwd, bwd = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
    placement = {0: [0, 3], 1: [1, 2]}
    order = {  # one microbatch through the V and back
        0: [_Action(0, fwd, 0), None, None, _Action(3, fwd, 0), _Action(3, bwd, 0), None, None, _Action(0, bwd, 0)],
        1: [None, _Action(1, fwd, 0), _Action(2, fwd, 0), None, None, _Action(2, bwd, 0), _Action(1, bwd, 0), None],
    }
    ref = _stack(4)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, WIDTH, generator=g), torch.randn(4, WIDTH, generator=g)
    ref_out, ref_loss = _reference(ref, x, y)
    mods = {i: clone(ref[i]).to(DEVICE) for i in placement[RANK]}
    stages = [PipelineStage(mods[i], i, 4, DEVICE) for i in placement[RANK]]
    stage_to_rank = {s: r for r, ss in placement.items() for s in ss}

    class VSchedule(PipelineScheduleMulti):
        def __init__(self, stages, loss_fn):
            super().__init__(stages=stages, n_microbatches=1, loss_fn=loss_fn, scale_grads=False)
            self.stage_index_to_group_rank = stage_to_rank
            for s in stages:
                s.stage_index_to_group_rank = stage_to_rank
            self.pipeline_order = order

    schedule = VSchedule(stages, lambda o, t: F.mse_loss(o, t, reduction="sum"))
    losses = []
    out = schedule.step(x.to(DEVICE), target=y.to(DEVICE), losses=losses) if RANK == 0 else schedule.step()
    if RANK == 0:  # first and last stage both live here
        assert_close(out, ref_out, "V pipeline output")
        assert_close(sum(losses), ref_loss, "V pipeline loss")
    _check_grads(mods, ref, "V pipeline")


def check_pp_static_gpipe():
    """GPipe over stages built with their shapes given (no shape inference), one per rank."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    n_micro, batch = 2, 4
    ref = _stack(WORLD)
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(batch, WIDTH, generator=g), torch.randn(batch, WIDTH, generator=g)
    ref_out, ref_loss = _reference(ref, x, y)
    mod = clone(ref[RANK]).to(DEVICE)
    # The examples say which activations carry gradients: without requires_grad, static
    # stages exchange none, and the first stage's backward fails as it does on gloo and NCCL
    # ("grad can be implicitly created only for scalar outputs"); see docs/distributed.md.
    mb = torch.empty(batch // n_micro, WIDTH, device=DEVICE, requires_grad=True)
    stage = PipelineStage(mod, RANK, WORLD, DEVICE, input_args=(mb,), output_args=(mb,))
    schedule = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=lambda o, t: F.mse_loss(o, t, reduction="sum"),
                             scale_grads=False)
    losses = []
    if RANK == 0:
        schedule.step(x.to(DEVICE))
    elif RANK == WORLD - 1:
        out = schedule.step(target=y.to(DEVICE), losses=losses)
        assert_close(out, ref_out, "GPipe output")
        assert_close(sum(losses), ref_loss, "GPipe loss")
    else:
        schedule.step()
    _check_grads({RANK: mod}, ref, "static GPipe")


# ---------------------------------------------------------------------------------------
# DDP with uneven inputs (join)
# ---------------------------------------------------------------------------------------

def _join_model() -> nn.Module:
    torch.manual_seed(21)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.BatchNorm1d(32), nn.Linear(32, 4))


def _join_input(rank: int, step: int) -> torch.Tensor:
    return _data(rank, 8 * 16, salt=step).reshape(8, 16)


def _join_reference(iters: dict[int, int]) -> nn.Module:
    """What DDP's join promises: at step i the ranks still training contribute their
    gradients, divided by the initial world size; the others contribute zeros."""
    ref = _join_model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(max(iters.values())):
        total = [torch.zeros_like(p) for p in ref.parameters()]
        active = [r for r in range(WORLD) if iters[r] > i]
        for r in active:
            ref.zero_grad()
            m = clone(ref).train()
            m(_join_input(r, i)).sum().backward()
            for t, p in zip(total, m.parameters()):
                t += p.grad
            # BatchNorm's running statistics follow the authoritative (last) rank, whose
            # buffers DDP broadcasts before every forward
            if r == active[-1]:
                for b, mb in zip(ref.buffers(), m.buffers()):
                    b.copy_(mb)
        for p, t in zip(ref.parameters(), total):
            p.grad = t / WORLD
        opt.step()
    return ref


def check_ddp_join_uneven():
    """DDP's join() with one rank running out of inputs early: no hang, and the model every
    rank ends with is the one the join semantics define (computed here on CPU)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    for iters, hook in (({0: 2, 1: 5}, None), ({0: 0, 1: 3}, None), ({0: 4, 1: 1}, default_hooks.allreduce_hook)):
        model = _join_model().to(DEVICE)
        # a tiny bucket cap: one bucket per parameter, so the joined rank shadows many all-reduces
        ddp = DDP(model, bucket_cap_mb=1e-4)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        with ddp.join():
            for i in range(iters[RANK]):
                opt.zero_grad()
                ddp(_join_input(RANK, i).to(DEVICE)).sum().backward()
                opt.step()
        ref = _join_reference(iters)
        for (n, p), r in zip(model.named_parameters(), ref.parameters()):
            assert_close(p, r, f"join {iters}: {n}", atol=1e-5, rtol=1e-4)
        assert ddp._get_ddp_logging_data().get("join_uneven_inputs"), "join was not logged"
    # throw_on_early_termination: every rank raises, at the step the first rank ran out
    ddp = DDP(_join_model().to(DEVICE))
    n = 0
    try:
        with ddp.join(throw_on_early_termination=True):
            for i in range(2 if RANK == 0 else 6):
                ddp(_join_input(RANK, i).to(DEVICE)).sum().backward()
                n += 1
    except RuntimeError as e:
        want = f"Rank {RANK} exhausted all inputs" if RANK == 0 else "Detected at least one rank that exhausted inputs"
        assert want in str(e), e
    else:
        raise AssertionError("join(throw_on_early_termination=True) did not raise")
    assert n == 2, n


CHECKS = {
    "profiler": check_profiler,
    "uneven_all_gather": check_uneven_all_gather,
    "uneven_reduce_scatter": check_uneven_reduce_scatter,
    "self_p2p": check_self_p2p,
    "timeout_wording": check_timeout_wording,
    "pp_nonsymmetric": check_pp_nonsymmetric,
    "pp_static_gpipe": check_pp_static_gpipe,
    "ddp_join_uneven": check_ddp_join_uneven,
}

if __name__ == "__main__":
    main(CHECKS)

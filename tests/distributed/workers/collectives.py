"""Every collective of the neuron backend against a reference computed from all ranks' inputs.

Each rank can compute every other rank's input (seeded by rank), so each check compares the
backend's result with the same reduction done locally on CPU. Prints ``CHECK <name> ok``.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

sys.path.insert(0, os.path.dirname(__file__))
from _common import RANK, WORLD, done, init  # noqa: E402

import torch_neuronx.distributed as nd  # noqa: E402

DEV = init()
R, W = RANK, WORLD
RO = dist.ReduceOp

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
ALL = FLOATS + FP8 + INTS + [torch.bool, torch.complex64]
SIZES = [37, 70_001, 300_007]  # direct; chunked through the buffers; zero-copy (>= 1 MiB in 4-byte dtypes)


def data(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 7 * n + salt)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.5
    if dtype.is_complex:
        return torch.randn(n, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g) * 2
        if dtype in FP8:
            x = x.clamp(-8, 8)
        return x.to(dtype)
    lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def reference(xs: list[torch.Tensor], op, factor: float = 1.0) -> torch.Tensor:
    """The reduction the backend promises: rank order, low precision accumulated in fp32."""
    dt = xs[0].dtype
    low = dt in (torch.float16, torch.bfloat16) or dt in FP8
    acc = xs[0].float() if low else xs[0].clone()
    if op == RO.PREMUL_SUM:
        acc = acc * factor
    for x in xs[1:]:
        if low:
            x = x.float()
        if dt == torch.bool:
            if op in (RO.SUM, RO.MAX, RO.BOR):
                acc = acc | x
            elif op in (RO.PRODUCT, RO.MIN, RO.BAND):
                acc = acc & x
            else:
                acc = acc ^ x
            continue
        if op in (RO.SUM, RO.AVG):
            acc = acc + x
        elif op == RO.PREMUL_SUM:
            acc = torch.add(acc, x, alpha=factor)
        elif op == RO.PRODUCT:
            acc = acc * x
        elif op == RO.MIN:
            acc = torch.minimum(acc, x.to(acc.dtype))
        elif op == RO.MAX:
            acc = torch.maximum(acc, x.to(acc.dtype))
        elif op == RO.BAND:
            acc = acc & x
        elif op == RO.BOR:
            acc = acc | x
        elif op == RO.BXOR:
            acc = acc ^ x
    if op == RO.AVG:
        acc = acc / len(xs) if (acc.is_floating_point() or acc.is_complex()) else torch.div(acc, len(xs), rounding_mode="trunc")
    return acc.to(dt)


def valid(op, dt) -> bool:
    fp = dt.is_floating_point
    if dt.is_complex:  # torch.distributed itself refuses the others on complex tensors
        return op in (RO.SUM, RO.AVG, RO.PREMUL_SUM)
    if op in (RO.BAND, RO.BOR, RO.BXOR):
        return not fp and not dt.is_complex
    if op in (RO.MIN, RO.MAX):
        return not dt.is_complex
    if op == RO.AVG:
        return dt != torch.bool
    if op == RO.PREMUL_SUM:
        return fp or dt.is_complex
    return True


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a = a.cpu()
    if a.dtype in FP8:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(a, b), f"{what}: max diff {(a.double() - b.double()).abs().max() if not a.dtype == torch.bool else '(bool)'}"


def check_all_reduce() -> None:
    ops = [RO.SUM, RO.AVG, RO.PRODUCT, RO.MIN, RO.MAX, RO.BAND, RO.BOR, RO.BXOR, "premul"]
    for dt in ALL:
        for n in SIZES:
            for op in ops:
                factor = 0.5
                rop = dist._make_nccl_premul_sum(factor) if op == "premul" else op
                kind = RO.PREMUL_SUM if op == "premul" else op
                if not valid(kind, dt):
                    continue
                x = data(R, n, dt).to(DEV)
                dist.all_reduce(x, op=rop)
                same(x, reference([data(r, n, dt) for r in range(W)], kind, factor), f"all_reduce {dt} {n} {op}")
    # non-contiguous input is reduced in place through its own strides
    base = data(R, 64, torch.float32).reshape(8, 8)
    x = base.to(DEV).t()
    dist.all_reduce(x)
    same(x, reference([data(r, 64, torch.float32).reshape(8, 8) for r in range(W)], RO.SUM).t(), "all_reduce strided")
    # invalid op/dtype pairs raise a ValueError naming both
    for op, dt, word in [(RO.BAND, torch.float32, "BAND"), (RO.MAX, torch.complex64, "complex"),
                         (RO.AVG, torch.bool, "bool")]:
        try:
            dist.all_reduce(torch.zeros(3, dtype=dt, device=DEV), op=op)
        except ValueError as e:
            assert word in str(e), e
        else:
            raise AssertionError(f"{op} on {dt} did not raise")
    print("CHECK all_reduce ok", flush=True)


def check_rooted() -> None:
    for dt in [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float8_e4m3fn, torch.complex64]:
        for n in SIZES:
            for root in range(W):
                x = data(R, n, dt, 1).to(DEV)
                dist.broadcast(x, src=root)
                same(x, data(root, n, dt, 1), f"broadcast {dt} {n} root {root}")
                x = data(R, n, dt, 2).to(DEV)
                op = RO.MAX if not dt.is_complex else RO.SUM
                dist.reduce(x, dst=root, op=op)
                if R == root:
                    same(x, reference([data(r, n, dt, 2) for r in range(W)], op), f"reduce {dt} {n} root {root}")
                else:
                    same(x, data(R, n, dt, 2), f"reduce leaves non-root {dt}")
                x = data(R, n, dt, 3).to(DEV)
                gl = [torch.empty(n, dtype=dt, device=DEV) for _ in range(W)] if R == root else None
                dist.gather(x, gl, dst=root)
                if R == root:
                    for r in range(W):
                        same(gl[r], data(r, n, dt, 3), f"gather {dt} from {r}")
                out = torch.empty(n, dtype=dt, device=DEV)
                sl = [data(r, n, dt, 4 + root).to(DEV) for r in range(W)] if R == root else None
                dist.scatter(out, sl, src=root)
                same(out, data(R, n, dt, 4 + root), f"scatter {dt} root {root}")
    print("CHECK rooted ok", flush=True)


def check_gather_scatter_family() -> None:
    for dt in [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.uint8, torch.bool, torch.float8_e5m2]:
        for n in SIZES:
            x = data(R, n, dt).to(DEV)
            outs = [torch.empty(n, dtype=dt, device=DEV) for _ in range(W)]
            dist.all_gather(outs, x)
            for r in range(W):
                same(outs[r], data(r, n, dt), f"all_gather {dt} {n}")
            big = torch.empty(W * n, dtype=dt, device=DEV)
            dist.all_gather_into_tensor(big, x)
            same(big, torch.cat([data(r, n, dt) for r in range(W)]), f"all_gather_into_tensor {dt}")
            if dt == torch.bool or dt in FP8:
                continue
            ops = [RO.SUM, RO.MAX] + ([RO.AVG] if dt.is_floating_point else [RO.BXOR])
            for op in ops:
                inp = data(R, W * n, dt, 5).to(DEV)
                out = torch.empty(n, dtype=dt, device=DEV)
                dist.reduce_scatter_tensor(out, inp, op=op)
                ref = reference([data(r, W * n, dt, 5) for r in range(W)], op).chunk(W)[R]
                same(out, ref, f"reduce_scatter_tensor {dt} {n} {op}")
                lst = [t.to(DEV) for t in data(R, W * n, dt, 5).chunk(W)]
                out2 = torch.empty(n, dtype=dt, device=DEV)
                dist.reduce_scatter(out2, lst, op=op)
                same(out2, ref, f"reduce_scatter {dt} {op}")
    # coalesced forms, as FSDP and DTensor issue them
    xs = [data(R, k, torch.float32, 9).to(DEV) for k in (5, 300)]
    outs = [torch.empty(W * x.numel(), device=DEV) for x in xs]
    with dist._coalescing_manager(device=DEV):
        for o, x in zip(outs, xs):
            dist.all_gather_into_tensor(o, x)
    for o, k in zip(outs, (5, 300)):
        same(o, torch.cat([data(r, k, torch.float32, 9) for r in range(W)]), "all_gather coalesced")
    ins = [data(R, W * k, torch.float32, 10).to(DEV) for k in (4, 100)]
    outs = [torch.empty(k, device=DEV) for k in (4, 100)]
    with dist._coalescing_manager(device=DEV):
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    for o, k in zip(outs, (4, 100)):
        same(o, reference([data(r, W * k, torch.float32, 10) for r in range(W)], RO.SUM).chunk(W)[R], "rs coalesced")
    ts = [data(R, k, torch.float32, 11).to(DEV) for k in (3, 1000)]
    dist.all_reduce_coalesced(ts)
    for t, k in zip(ts, (3, 1000)):
        same(t, reference([data(r, k, torch.float32, 11) for r in range(W)], RO.SUM), "all_reduce_coalesced")
    print("CHECK gather_scatter ok", flush=True)


def split_sizes(src: int, dst: int) -> int:
    return (src * 3 + dst * 5) % 7 + (src == dst)  # uneven, some zero


def check_all_to_all() -> None:
    for dt in [torch.float32, torch.bfloat16, torch.int64, torch.bool]:
        for scale in (1, 20_000):
            ins = [split_sizes(R, j) * scale for j in range(W)]
            outs = [split_sizes(j, R) * scale for j in range(W)]
            x = data(R, sum(ins), dt, 12).to(DEV)
            y = torch.empty(sum(outs), dtype=dt, device=DEV)
            dist.all_to_all_single(y, x, output_split_sizes=outs, input_split_sizes=ins)
            expect = torch.cat([
                data(j, sum(split_sizes(j, k) * scale for k in range(W)), dt, 12)
                .split([split_sizes(j, k) * scale for k in range(W)])[R] for j in range(W)
            ])
            same(y, expect, f"all_to_all_single uneven {dt} x{scale}")
            # even split, 2-D rows
            x2 = data(R, W * 6, dt, 13).reshape(W * 3, 2).to(DEV)
            y2 = torch.empty_like(x2)
            dist.all_to_all_single(y2, x2)
            same(y2, torch.cat([data(j, W * 6, dt, 13).reshape(W * 3, 2).chunk(W)[R] for j in range(W)]), "a2a even")
            lin = [t.to(DEV) for t in data(R, W * 4, dt, 14).chunk(W)]
            lout = [torch.empty(4, dtype=dt, device=DEV) for _ in range(W)]
            dist.all_to_all(lout, lin)
            for j in range(W):
                same(lout[j], data(j, W * 4, dt, 14).chunk(W)[R], "all_to_all list")
    print("CHECK all_to_all ok", flush=True)


def check_p2p() -> None:
    nxt, prv = (R + 1) % W, (R - 1) % W
    for n in (10, 3_000_000):  # larger than the ring: the transfer streams through it
        x = data(R, n, torch.float32, 15).to(DEV)
        y = torch.empty(n, device=DEV)
        # every rank sends before it receives: sends must not block
        s = dist.isend(x, nxt)
        r = dist.irecv(y, prv)
        s.wait()
        r.wait()
        same(y, data(prv, n, torch.float32, 15), f"isend/irecv ring {n}")
    ops = []
    outs = {}
    for peer in range(W):
        if peer == R:
            continue
        outs[peer] = torch.empty(100 + peer, dtype=torch.int64, device=DEV)
        ops.append(dist.P2POp(dist.isend, data(R, 100 + R, torch.int64, 16 + peer).to(DEV), peer))
        ops.append(dist.P2POp(dist.irecv, outs[peer], peer))
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for peer, t in outs.items():
        same(t, data(peer, 100 + peer, torch.int64, 16 + R), f"batch_isend_irecv from {peer}")
    # blocking send/recv and recv from any source
    if R == 0:
        got = set()
        for _ in range(W - 1):
            t = torch.empty(4, dtype=torch.int32, device=DEV)
            src = dist.recv(t)
            assert torch.equal(t.cpu(), torch.full((4,), src, dtype=torch.int32)), (src, t)
            got.add(src)
        assert got == set(range(1, W)), got
    else:
        dist.send(torch.full((4,), R, dtype=torch.int32, device=DEV), 0)
    # non-contiguous receive buffer
    if W >= 2 and R in (0, 1):
        if R == 0:
            dist.send(torch.arange(12.0, device=DEV).reshape(3, 4), 1)
        else:
            buf = torch.empty(4, 3, device=DEV).t()
            dist.recv(buf, 0)
            same(buf, torch.arange(12.0).reshape(3, 4), "recv into strided")
    dist.barrier()
    print("CHECK p2p ok", flush=True)


def check_functional() -> None:
    group = dist.group.WORLD
    x = data(R, 50, torch.float32, 20).to(DEV)
    y = funcol.all_reduce(x, "sum", group)
    same(y, reference([data(r, 50, torch.float32, 20) for r in range(W)], RO.SUM), "funcol.all_reduce")
    g = funcol.all_gather_tensor(x, 0, group)
    same(g, torch.cat([data(r, 50, torch.float32, 20) for r in range(W)]), "funcol.all_gather_tensor")
    big = data(R, W * 8, torch.bfloat16, 21).to(DEV)
    rs = funcol.reduce_scatter_tensor(big, "sum", 0, group)
    same(rs, reference([data(r, W * 8, torch.bfloat16, 21) for r in range(W)], RO.SUM).chunk(W)[R], "funcol.rs")
    a2a = funcol.all_to_all_single(data(R, W * 3, torch.float32, 22).to(DEV), None, None, group)
    same(a2a, torch.cat([data(j, W * 3, torch.float32, 22).chunk(W)[R] for j in range(W)]), "funcol.a2a")
    b = funcol.broadcast(data(R, 5, torch.float32, 23).to(DEV), 1 % W, group)
    same(b, data(1 % W, 5, torch.float32, 23), "funcol.broadcast")
    print("CHECK functional ok", flush=True)


def check_groups() -> None:
    # sub-groups of every size, in a scrambled rank order
    order = list(range(W))[::-1]
    for size in range(1, W + 1):
        members = sorted(order[:size], key=lambda r: (r * 7) % W)
        g = dist.new_group(members)
        if R in members:
            x = torch.tensor([float(R + 1)], device=DEV)
            dist.all_reduce(x, group=g)
            assert x.item() == sum(m + 1 for m in members), (members, x)
            gr = dist.get_group_rank(g, R)
            objs = [None] * size
            dist.all_gather_object(objs, ("rank", R), group=g)
            assert objs == [("rank", dist.get_global_rank(g, i)) for i in range(size)], objs
            lst = [{"from": R}] if gr == 0 else [None]
            dist.broadcast_object_list(lst, group_src=0, group=g)
            assert lst == [{"from": dist.get_global_rank(g, 0)}], lst
        dist.barrier()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60), wait_all_ranks=True)
    print("CHECK groups ok", flush=True)


def check_misuse() -> None:
    # shapes differ across ranks: every rank raises, naming both calls; the group survives
    n = 4 if R == 0 else 5
    try:
        dist.all_reduce(torch.ones(n, device=DEV))
    except ValueError as e:
        msg = str(e)
        assert "mismatched collectives" in msg and "float32[4]" in msg and "float32[5]" in msg, msg
    else:
        raise AssertionError("mismatched shapes did not raise")
    dt = torch.float32 if R == 0 else torch.float16
    try:
        dist.broadcast(torch.ones(3, dtype=dt, device=DEV), 0)
    except ValueError as e:
        assert "float32[3]" in str(e) and "float16[3]" in str(e), str(e)
    else:
        raise AssertionError("mismatched dtypes did not raise")
    x = torch.ones(3, device=DEV)
    dist.all_reduce(x)
    assert x.cpu().tolist() == [float(W)] * 3
    # a CPU tensor where neuron tensors are required
    try:
        dist.all_gather([torch.empty(2, device=DEV) for _ in range(W)], torch.ones(2))
    except (ValueError, RuntimeError) as e:
        assert "neuron" in str(e) or "cpu" in str(e), str(e)
    else:
        raise AssertionError("CPU input did not raise")
    # the group timeout is honoured: rank 0 waits alone in a sub-group
    g = dist.new_group(timeout=datetime.timedelta(seconds=2))
    if R == 0:
        try:
            dist.all_reduce(torch.ones(1, device=DEV), group=g)
        except dist.DistBackendError as e:
            assert "timed out" in str(e), str(e)
        else:
            raise AssertionError("collective without peers did not time out")
    # Work.wait(timeout) on a recv whose send comes later
    if R == 0:
        t = torch.empty(3, device=DEV)
        w = dist.irecv(t, 1)
        try:
            w.wait(timeout=datetime.timedelta(milliseconds=300))
        except dist.DistBackendError as e:
            assert "did not complete" in str(e), str(e)
        else:
            raise AssertionError("wait(timeout) did not raise")
        dist.barrier()
        w.wait()
        same(t, torch.full((3,), 7.0), "late recv")
    else:
        dist.barrier()
        if R == 1:
            dist.send(torch.full((3,), 7.0, device=DEV), 0)
    dist.barrier()
    print("CHECK misuse ok", flush=True)


def check_stats() -> None:
    s = nd.stats()
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv", "barrier"):
        assert s.get(op, {}).get("shm", 0) > 0, (op, s)
    assert all("gloo" not in v for v in s.values()), s
    print("CHECK stats ok", flush=True)


if __name__ == "__main__":
    for check in (check_all_reduce, check_rooted, check_gather_scatter_family, check_all_to_all, check_p2p,
                  check_functional, check_groups, check_misuse, check_stats):
        check()
    done()

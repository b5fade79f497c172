"""The batch-norm statistics ops behind ``nn.SyncBatchNorm`` (CUDA-only in PyTorch; kernels of
ours on ``neuron``), each against a float64 CPU reference written from its definition, with
the output dtypes and memory formats CUDA gives; then SyncBatchNorm itself on two ranks
(``tests/distributed/workers/sync_batch_norm.py``) against BatchNorm of the global batch on CPU."""

from __future__ import annotations

import pytest
import torch

EPS = 1e-5
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def acc(dtype):
    """CUDA's accumulate type: statistics of 16-bit inputs are float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def dims(x):
    return [0, *range(2, x.dim())]


def per_channel(v, x):
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def make(shape, dtype, memory_format=torch.contiguous_format, seed=0, scale=2.0, shift=0.5):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)
    return x.contiguous(memory_format=memory_format)


def close(actual, expected, dtype, what):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.cpu().double(), expected.double(), atol=tol, rtol=tol, msg=what)


def ref_stats(x):
    x = x.double()
    return x.mean(dims(x)), 1 / torch.sqrt(x.var(dims(x), unbiased=False) + EPS)


LAYOUTS = [((4, 3, 5, 6), torch.contiguous_format), ((4, 3, 5, 6), torch.channels_last), ((5, 3, 7), None),
           ((2, 3, 2, 3, 4), torch.channels_last_3d)]  # fmt: skip
LAYOUT_IDS = ["nchw", "channels_last", "ncl", "channels_last_3d"]


def _layout(shape, fmt):
    return fmt or torch.contiguous_format


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, fmt", LAYOUTS, ids=LAYOUT_IDS)
def test_batch_norm_stats(shape, fmt, dtype):
    x = make(shape, dtype, _layout(shape, fmt))
    mean, invstd = torch.batch_norm_stats(x.to("neuron"), EPS)
    assert mean.device.type == "neuron" and (mean.dtype, invstd.dtype) == (acc(dtype), acc(dtype))
    rm, ri = ref_stats(x)
    close(mean, rm, torch.float32 if dtype != torch.float64 else dtype, "mean")
    close(invstd, ri, torch.float32 if dtype != torch.float64 else dtype, "invstd")


def test_batch_norm_stats_of_constant_channels():
    x = torch.ones(2, 3, 4, device="neuron")
    mean, invstd = torch.batch_norm_stats(x, 0.0)
    # zero variance and eps: CUDA's InvStd gives 0, not inf
    assert torch.equal(mean.cpu(), torch.ones(3)) and torch.equal(invstd.cpu(), torch.zeros(3))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_running", [True, False])
def test_batch_norm_gather_stats_with_counts_combines_uneven_ranks(dtype, with_running):
    # three "ranks" with different batch sizes: the combined statistics are those of their union
    channels, momentum = 3, 0.1
    parts = [make((n, channels, 4), dtype, seed=i, shift=i) for i, n in enumerate((1, 4, 6))]
    stats = [torch.batch_norm_stats(p.to("neuron"), EPS) for p in parts]
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    counts = torch.tensor([p.numel() // channels for p in parts], dtype=mean_all.dtype, device="neuron")
    rm0 = make((channels,), dtype, seed=7)
    rv0 = make((channels,), dtype, seed=8, scale=0.1, shift=1.0)
    rm, rv = (rm0.to("neuron"), rv0.to("neuron")) if with_running else (None, None)
    if with_running:
        counts = counts.to(dtype)  # as SyncBatchNorm passes them
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        parts[0].to("neuron"), mean_all, invstd_all, rm, rv, momentum, EPS, counts)
    assert (mean.dtype, invstd.dtype) == (acc(dtype), acc(dtype))
    union = torch.cat([p.double() for p in parts])
    want_mean, want_invstd = ref_stats(union)
    stat_dtype = torch.float32 if dtype != torch.float64 else dtype
    close(mean, want_mean, stat_dtype, "mean")
    close(invstd, want_invstd, stat_dtype, "invstd")
    if with_running:
        n = union.numel() // channels
        var = union.var(dims(union), unbiased=False) * n / (n - 1)
        assert rm.dtype == dtype and rv.dtype == dtype
        close(rm, (1 - momentum) * rm0.double() + momentum * want_mean, dtype, "running_mean")
        close(rv, (1 - momentum) * rv0.double() + momentum * var, dtype, "running_var")


def test_batch_norm_gather_stats_takes_one_count_for_all_ranks():
    parts = [make((3, 2, 5), torch.float32, seed=i, shift=i) for i in range(2)]
    stats = [torch.batch_norm_stats(p.to("neuron"), EPS) for p in parts]
    rm, rv = torch.zeros(2, device="neuron"), torch.ones(2, device="neuron")
    mean, invstd = torch.batch_norm_gather_stats(
        parts[0].to("neuron"), torch.stack([m for m, _ in stats]), torch.stack([s for _, s in stats]), rm, rv,
        0.5, EPS, 15)
    union = torch.cat(parts).double()
    want_mean, want_invstd = ref_stats(union)
    close(mean, want_mean, torch.float32, "mean")
    close(invstd, want_invstd, torch.float32, "invstd")
    close(rm, 0.5 * want_mean, torch.float32, "running_mean")
    close(rv, 0.5 + 0.5 * union.var(dims(union)), torch.float32, "running_var")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, fmt", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_elemt(shape, fmt, dtype, affine):
    x = make(shape, dtype, _layout(shape, fmt))
    c = shape[1]
    mean, invstd = (t.to(acc(dtype)) for t in ref_stats(x))
    weight = make((c,), dtype, seed=1) if affine else None
    bias = make((c,), dtype, seed=2) if affine else None
    on = (lambda t: t.to("neuron") if t is not None else None)
    y = torch.batch_norm_elemt(x.to("neuron"), on(weight), on(bias), on(mean), on(invstd), EPS)
    assert y.dtype == dtype and y.is_contiguous(memory_format=_layout(shape, fmt))
    want = (x.double() - per_channel(mean.double(), x)) * per_channel(invstd.double(), x)
    if affine:
        want = want * per_channel(weight.double(), x) + per_channel(bias.double(), x)
    close(y, want, dtype, "output")
    # the out= variant writes the same values, resizing an empty out
    out = torch.empty(0, dtype=dtype, device="neuron")
    assert torch.batch_norm_elemt(x.to("neuron"), on(weight), on(bias), on(mean), on(invstd), EPS, out=out) is out
    assert out.shape == x.shape and torch.equal(out.cpu(), y.cpu())


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, fmt", LAYOUTS, ids=LAYOUT_IDS)
def test_batch_norm_backward_reduce(shape, fmt, dtype):
    x = make(shape, dtype, _layout(shape, fmt))
    dy = make(shape, dtype, _layout(shape, fmt), seed=3, shift=0.0)
    c = shape[1]
    mean, invstd = (t.to(acc(dtype)) for t in ref_stats(x))
    weight = make((c,), dtype, seed=1)
    sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(
        dy.to("neuron"), x.to("neuron"), mean.to("neuron"), invstd.to("neuron"), weight.to("neuron"), True, True, True)
    # the sums in the statistics' dtype, the parameter gradients in the weight's (as CUDA returns them)
    assert (sum_dy.dtype, sum_dy_xmu.dtype, gw.dtype, gb.dtype) == (acc(dtype), acc(dtype), dtype, dtype)
    xd, dyd = x.double(), dy.double()
    want_sum_dy = dyd.sum(dims(xd))
    want_dot = (dyd * (xd - per_channel(mean.double(), xd))).sum(dims(xd))
    stat = torch.float32 if dtype != torch.float64 else dtype
    tol = TOL[stat] * xd.numel() / c  # sums of numel/C terms
    torch.testing.assert_close(sum_dy.cpu().double(), want_sum_dy, atol=tol, rtol=TOL[stat])
    torch.testing.assert_close(sum_dy_xmu.cpu().double(), want_dot, atol=tol, rtol=TOL[stat])
    torch.testing.assert_close(gw.cpu().double(), want_dot * invstd.double(), atol=tol, rtol=TOL[dtype])
    torch.testing.assert_close(gb.cpu().double(), want_sum_dy, atol=tol, rtol=TOL[dtype])
    # only what is asked for
    r = torch.batch_norm_backward_reduce(dy.to("neuron"), x.to("neuron"), mean.to("neuron"), invstd.to("neuron"),
                                         None, False, True, False)
    assert [t is not None for t in r] == [False, False, True, False]
    assert r[2].dtype == acc(dtype)  # no weight: the statistics' dtype


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, fmt", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_backward_elemt(shape, fmt, dtype, affine):
    x = make(shape, dtype, _layout(shape, fmt))
    dy = make(shape, dtype, _layout(shape, fmt), seed=3, shift=0.0)
    c = shape[1]
    mean, invstd = (t.to(acc(dtype)) for t in ref_stats(x))
    weight = make((c,), dtype, seed=1).to(acc(dtype)) if affine else None  # SyncBatchNorm passes it so
    # sums over "all ranks": this rank's share is a third of the elements
    count = torch.tensor([x.numel() // c, 2 * x.numel() // c], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    sum_dy = torch.randn(c, generator=g, dtype=torch.float64).to(acc(dtype))
    sum_dy_xmu = torch.randn(c, generator=g, dtype=torch.float64).to(acc(dtype))
    on = (lambda t: t.to("neuron") if t is not None else None)
    gi = torch.batch_norm_backward_elemt(on(dy), on(x), on(mean), on(invstd), on(weight), on(sum_dy), on(sum_dy_xmu),
                                         on(count))
    assert gi.dtype == dtype and gi.is_contiguous(memory_format=_layout(shape, fmt))
    n = int(count.sum())
    inv = per_channel(invstd.double(), x)
    w = per_channel(weight.double(), x) if affine else 1.0
    xmu = x.double() - per_channel(mean.double(), x)
    want = (dy.double() - per_channel(sum_dy.double(), x) / n - xmu * inv**2 * per_channel(sum_dy_xmu.double(), x) / n)
    close(gi, want * inv * w, dtype, "grad_input")


def test_single_rank_pipeline_is_batch_norm():
    # stats -> gather (one rank) -> elemt -> backward_reduce -> backward_elemt is batch norm's
    # forward and backward, as autograd computes them on CPU
    x = make((6, 4, 3, 3), torch.float32, seed=5)
    dy = make((6, 4, 3, 3), torch.float32, seed=6, shift=0.0)
    w, b = make((4,), torch.float32, seed=7), make((4,), torch.float32, seed=8)
    xn, dyn, wn, bn = (t.to("neuron") for t in (x, dy, w, b))
    mean, invstd = torch.batch_norm_stats(xn, EPS)
    count = torch.tensor([x.numel() // 4], dtype=torch.float32, device="neuron")
    mean, invstd = torch.batch_norm_gather_stats_with_counts(xn, mean[None], invstd[None], None, None, 0.1, EPS, count)
    y = torch.batch_norm_elemt(xn, wn, bn, mean, invstd, EPS)
    sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(dyn, xn, mean, invstd, wn, True, True, True)
    gi = torch.batch_norm_backward_elemt(dyn, xn, mean, invstd, wn, sum_dy, sum_dy_xmu,
                                         count.to(torch.int32))
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    yr = torch.nn.functional.batch_norm(xr, None, None, wr, br, training=True, eps=EPS)
    yr.backward(dy.double())
    for got, want, what in ((y, yr, "output"), (gi, xr.grad, "grad_input"), (gw, wr.grad, "grad_weight"),
                            (gb, br.grad, "grad_bias")):
        torch.testing.assert_close(got.cpu().double(), want.detach(), atol=1e-4, rtol=1e-4, msg=what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_batch_norm_update_stats_like_cuda(dtype):
    # has a CPU kernel too, but CUDA returns the statistics of 16-bit inputs in float32
    x = make((5, 3, 4), dtype)
    rm, rv = torch.zeros(3, dtype=dtype, device="neuron"), torch.ones(3, dtype=dtype, device="neuron")
    mean, var = torch.batch_norm_update_stats(x.to("neuron"), rm, rv, 0.25)
    assert (mean.dtype, var.dtype) == (torch.float32, torch.float32)
    xd = x.double()
    close(mean, xd.mean(dims(xd)), torch.float32, "mean")
    close(var, xd.var(dims(xd), unbiased=False), torch.float32, "biased var")
    close(rm, 0.25 * xd.mean(dims(xd)), dtype, "running_mean")
    close(rv, 0.75 + 0.25 * xd.var(dims(xd)), dtype, "running_var")


def test_bad_arguments_are_clear_errors():
    x = torch.randn(4, 3, 5, device="neuron")
    m, s = torch.batch_norm_stats(x, EPS)
    with pytest.raises(RuntimeError, match="batch_norm_stats: expected an input of at least 2 dimensions"):
        torch.batch_norm_stats(torch.randn(4, device="neuron"), EPS)
    with pytest.raises(RuntimeError, match="batch_norm_elemt: expected mean to have 3 elements"):
        torch.batch_norm_elemt(x, None, None, m[:2], s, EPS)
    with pytest.raises(RuntimeError, match=r"expected mean of shape \(world_size, channels\)"):
        torch.batch_norm_gather_stats_with_counts(x, m, s, None, None, 0.1, EPS, torch.ones(1, device="neuron"))
    with pytest.raises(RuntimeError, match="expected one count per row of mean"):
        torch.batch_norm_gather_stats_with_counts(x, m[None], s[None], None, None, 0.1, EPS,
                                                  torch.ones(2, device="neuron"))
    with pytest.raises(RuntimeError, match="mean and invstd need to have the same data types"):
        torch.batch_norm_backward_reduce(x, x, m, s.double(), None, True, True, True)
    with pytest.raises(RuntimeError, match="count .* must be an integer tensor"):
        torch.batch_norm_backward_elemt(x, x, m, s, None, m, m, torch.ones(1, device="neuron"))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
        torch.batch_norm_elemt(x, None, None, m.cpu(), s, EPS)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
        torch.batch_norm_elemt(x, None, None, m, s, EPS, out=torch.empty(4, 3, 5))


# ---- nn.SyncBatchNorm on two ranks ----------------------------------------------------------

CHECKS = ["fp32", "fp32_3d", "fp16", "channels_last", "fp16_channels_last", "empty_rank",
          "ddp_convert_sync_batchnorm"]  # fmt: skip


@pytest.fixture(scope="module")
def launch():
    from test_distributed_parallel import Launch

    return Launch("sync_batch_norm.py", 2, timeout=300)


@pytest.mark.parametrize("check", CHECKS)
def test_sync_batch_norm_two_ranks(launch, check):
    launch.assert_check(check)


def test_sync_batch_norm_launch_exits_cleanly(launch):
    assert launch.error is None, launch.out
    assert sorted(launch.markers()) == sorted(CHECKS), launch.out[-5000:]
    if all(r == "ok" for r in launch.markers().values()):
        assert launch.rc == 0, launch.out[-5000:]

"""Two-rank checks of ``nn.SyncBatchNorm`` on ``neuron``: each rank normalises its share of a
global batch (shares of different sizes, one rank possibly empty) and must get what
``F.batch_norm`` gives on the whole batch on CPU in float64: the output, the gradients of
input, weight and bias, and the running statistics. Last, a conv net converted with
``convert_sync_batchnorm`` trains under DDP and must match the CPU model trained on the
global batch.

``python -m torch.distributed.run --nproc-per-node=2 sync_batch_norm.py [--only a,b]``
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from _common import RANK, WORLD, assert_close, init, main

DEVICE = init()
assert WORLD == 2, "sync_batch_norm.py runs on 2 ranks"
EPS, MOMENTUM = 1e-5, 0.1


def _global_batch(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5  # off-centre: the mean matters
    grad = torch.randn(shape, generator=g, dtype=torch.float64)
    return x, grad


def _share(t, sizes):
    start = sum(sizes[:RANK])
    return t[start:start + sizes[RANK]]


def _check_sync_bn(sizes, channels=4, spatial=(3, 5), dtype=torch.float32, memory_format=torch.contiguous_format,
                   tol=1e-5, seed=0):
    shape = (sum(sizes), channels, *spatial)
    x, grad = _global_batch(shape, seed)
    g = torch.Generator().manual_seed(seed + 1)
    weight = torch.rand(channels, generator=g, dtype=torch.float64) + 0.5
    bias = torch.randn(channels, generator=g, dtype=torch.float64)
    running_mean = torch.randn(channels, generator=g, dtype=torch.float64)
    running_var = torch.rand(channels, generator=g, dtype=torch.float64) + 0.5

    # The oracle: batch norm of the whole batch (as the device will see it: rounded to `dtype`).
    xr = x.to(dtype).double().requires_grad_()
    w, b = weight.to(dtype).double().requires_grad_(), bias.to(dtype).double().requires_grad_()
    rm, rv = running_mean.to(dtype).double(), running_var.to(dtype).double()
    ref = F.batch_norm(xr, rm, rv, w, b, training=True, momentum=MOMENTUM, eps=EPS)
    (ref * grad.to(dtype).double()).sum().backward()

    bn = nn.SyncBatchNorm(channels, eps=EPS, momentum=MOMENTUM).to(DEVICE, dtype)
    with torch.no_grad():
        for p, v in ((bn.weight, weight), (bn.bias, bias), (bn.running_mean, running_mean),
                     (bn.running_var, running_var)):
            p.copy_(v.to(dtype))
    xs = _share(x, sizes).to(dtype).to(DEVICE).contiguous(memory_format=memory_format).requires_grad_()
    out = bn(xs)
    (out * _share(grad, sizes).to(dtype).to(DEVICE)).sum().backward()

    assert out.dtype == dtype and out.device == DEVICE
    if xs.numel():
        assert out.is_contiguous(memory_format=memory_format), "the output keeps the input's memory format"
    tol = dict(atol=tol, rtol=tol)
    assert_close(out.double(), _share(ref, sizes).detach(), "output", **tol)
    # an empty share gets no input gradient (None stands for zeros)
    grad_in = xs.grad if xs.grad is not None else torch.zeros_like(xs)
    assert_close(grad_in.double(), _share(xr.grad, sizes), "grad of input", **tol)
    # each rank holds its share of the parameter gradients (DDP would sum them)
    for name, p, r in (("weight", bn.weight, w), ("bias", bn.bias, b)):
        total = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(total)
        assert_close(total.double(), r.grad, f"grad of {name}", **tol)
    assert_close(bn.running_mean.double(), rm, "running_mean", **tol)
    assert_close(bn.running_var.double(), rv, "running_var", **tol)


def check_fp32():
    _check_sync_bn([3, 5])


def check_fp32_3d():
    _check_sync_bn([2, 4], channels=3, spatial=(7,), seed=3)


def check_fp16():
    _check_sync_bn([3, 5], dtype=torch.float16, tol=1e-2, seed=1)


def check_channels_last():
    _check_sync_bn([3, 5], memory_format=torch.channels_last, seed=2)


def check_fp16_channels_last():
    _check_sync_bn([4, 2], dtype=torch.float16, memory_format=torch.channels_last, tol=1e-2, seed=4)


def check_empty_rank():
    _check_sync_bn([4, 0], seed=5)


def check_ddp_convert_sync_batchnorm():
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1),
                        nn.BatchNorm2d(2)).double()
    model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref)).float().to(DEVICE))
    assert sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules()) == 2
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sizes = [3, 5]
    for step in range(3):
        x = _global_batch((sum(sizes), 3, 6, 6), seed=10 + step)[0].float().double()
        grad = _global_batch((sum(sizes), 2, 6, 6), seed=20 + step)[1].float().double()
        ref_opt.zero_grad()
        # DDP averages the ranks' gradients, so the global loss is the ranks' mean
        ((ref(x) * grad).sum() / WORLD).backward()
        ref_opt.step()
        opt.zero_grad()
        out = model(_share(x, sizes).float().to(DEVICE))
        (out * _share(grad, sizes).float().to(DEVICE)).sum().backward()
        opt.step()
    ref_state = ref.state_dict()
    for name, v in model.module.state_dict().items():
        if name.endswith("num_batches_tracked"):
            assert v.item() == ref_state[name].item() == 3, name
            continue
        assert_close(v.double(), ref_state[name], f"after 3 steps: {name}", atol=1e-4, rtol=1e-4)


CHECKS = {name[len("check_"):]: fn for name, fn in list(globals().items()) if name.startswith("check_")}

if __name__ == "__main__":
    main(CHECKS)

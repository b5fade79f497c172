"""Two-rank acceptance checks of distributed training on ``neuron``.

Each check builds its distributed model on this rank's device, trains or runs it, and
compares against an oracle computed in this process on CPU from all ranks' data.
``python -m torch.distributed.run --nproc-per-node=2 parallel2.py [--only a,b] [--ckpt DIR]``
(``--ckpt``: a checkpoint that parallel4.py saved with 4 ranks, loaded here with 2).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from _common import (
    ADAMW, RANK, WORLD, assert_close, assert_equal, assert_params_close, clone, init,
    llama_tp_plan, lm_loss, log, main, rank_slice, tiny_llama, token_batches, train_reference,
)

DEVICE = init()
DT = DEVICE.type
assert WORLD == 2, "parallel2.py runs on 2 ranks"


def mesh_1d():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(DT, (WORLD,))


# ---------------------------------------------------------------------------------------
# DDP
# ---------------------------------------------------------------------------------------

def _ddp(make_opt, steps=3):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ref = tiny_llama()
    model = DDP(clone(ref).to(DEVICE))
    batches = token_batches(steps, batch=4)
    ref_losses = train_reference(ref, batches, make_opt)
    opt = make_opt(model)
    for step, ids in enumerate(batches):
        opt.zero_grad()
        loss = lm_loss(model, rank_slice(ids, RANK, WORLD).to(DEVICE))
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        assert_close(mean / WORLD, ref_losses[step], f"loss of step {step}")
    assert_params_close(model, ref, "after training")


def check_ddp_sgd():
    _ddp(lambda m: torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9))


def check_ddp_adamw():
    _ddp(lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1))


# ---------------------------------------------------------------------------------------
# FSDP2
# ---------------------------------------------------------------------------------------

def _fsdp2(reshard: bool, mixed: bool, steps=3):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)  # noqa: E731
    ref = tiny_llama()
    batches = token_batches(steps, batch=4)
    mesh = mesh_1d()
    model = clone(ref).to(DEVICE)
    kw = dict(mesh=mesh, reshard_after_forward=reshard)
    if mixed:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    for name, p in model.named_parameters():
        assert type(p).__name__ == "DTensor" and p.device.type == DT, name
        assert p.to_local().shape[0] <= -(-p.shape[0] // WORLD), name

    if mixed:
        # Oracle of FSDP2 mixed precision: every rank runs forward and backward with bf16
        # copies of the fp32 weights on its own data, the bf16 gradients are cast to fp32
        # and averaged, and the optimizer steps the fp32 weights.
        ref_opt = make_opt(ref)
        ref_losses = []
        for ids in batches:
            grads, losses = None, []
            for r in range(WORLD):
                low = clone(ref)
                for p in low.parameters():  # parameters only: buffers (rotary) stay fp32
                    p.data = p.data.to(torch.bfloat16)
                loss = lm_loss(low, rank_slice(ids, r, WORLD))
                loss.backward()
                losses.append(loss.detach().float())
                g = [p.grad.float() for p in low.parameters()]
                grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            for p, g in zip(ref.parameters(), grads):
                p.grad = g / WORLD
            ref_opt.step()
            ref_losses.append(sum(losses) / WORLD)
        fp32 = tiny_llama()
        train_reference(fp32, batches, make_opt)
    else:
        ref_losses = train_reference(ref, batches, make_opt)

    opt = make_opt(model)
    for step, ids in enumerate(batches):
        opt.zero_grad()
        loss = lm_loss(model, rank_slice(ids, RANK, WORLD).to(DEVICE))
        # Between forward and backward the layers hold sharded parameters (DTensors)
        # exactly when they reshard after forward.
        for i, layer in enumerate(model.model.layers):
            kinds = {type(p).__name__ for p in layer.parameters()}
            assert kinds == ({"DTensor"} if reshard else {"Parameter"}), f"layer {i} after forward: {kinds}"
        loss.backward()
        opt.step()
        mean = loss.detach().float()
        dist.all_reduce(mean)
        assert_close(mean / WORLD, ref_losses[step], f"loss of step {step}")
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
    assert_params_close(model, ref, "after training")
    if mixed:  # and bf16 training stays near fp32 training
        assert_params_close(model, fp32, "vs fp32 training", atol=5e-2, rtol=0)


def check_fsdp2():
    _fsdp2(reshard=True, mixed=False)


def check_fsdp2_no_reshard():
    _fsdp2(reshard=False, mixed=False)


def check_fsdp2_bf16():
    _fsdp2(reshard=True, mixed=True)


def check_fsdp2_bf16_no_reshard():
    _fsdp2(reshard=False, mixed=True)


# ---------------------------------------------------------------------------------------
# DTensor
# ---------------------------------------------------------------------------------------

def check_dtensor():
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = mesh_1d()
    g = torch.Generator().manual_seed(2)
    a = torch.randn(6, 10, generator=g)  # the same on every rank
    b = torch.randn(10, 4, generator=g)
    odd = torch.randn(5, 3, generator=g)  # 5 rows do not split evenly over 2 ranks

    da = distribute_tensor(a.to(DEVICE), mesh, [Shard(0)])
    assert da.device.type == DT and da.to_local().device == DEVICE
    assert_equal(da.to_local(), a.chunk(WORLD, 0)[RANK], "Shard(0) local shard")
    assert_equal(da.full_tensor(), a, "Shard(0) full_tensor")
    dodd = distribute_tensor(odd.to(DEVICE), mesh, [Shard(0)])
    assert_equal(dodd.to_local(), odd.chunk(WORLD, 0)[RANK], "uneven shard")
    assert_equal(dodd.full_tensor(), odd, "uneven full_tensor")
    assert_equal(dodd.redistribute(mesh, [Replicate()]).to_local(), odd, "uneven Shard(0) -> Replicate")

    # Shard <-> Replicate <-> Shard on another dim (all-gather, chunk, all-to-all).
    rep = da.redistribute(mesh, [Replicate()])
    assert_equal(rep.to_local(), a, "Shard(0) -> Replicate")
    s1 = da.redistribute(mesh, [Shard(1)])
    assert_equal(s1.to_local(), a.chunk(WORLD, 1)[RANK], "Shard(0) -> Shard(1)")
    assert_equal(rep.redistribute(mesh, [Shard(1)]).to_local(), a.chunk(WORLD, 1)[RANK], "Replicate -> Shard(1)")
    assert_equal(s1.redistribute(mesh, [Shard(0)]).to_local(), a.chunk(WORLD, 0)[RANK], "Shard(1) -> Shard(0)")

    # Partial: each rank holds one summand (all-reduce, reduce-scatter).
    parts = [torch.randn(6, 10, generator=g) for _ in range(WORLD)]
    total = parts[0] + parts[1]
    dp = DTensor.from_local(parts[RANK].to(DEVICE), mesh, [Partial()])
    assert_close(dp.redistribute(mesh, [Replicate()]).to_local(), total, "Partial -> Replicate", atol=0, rtol=0)
    assert_close(dp.redistribute(mesh, [Shard(0)]).to_local(), total.chunk(WORLD, 0)[RANK],
                 "Partial -> Shard(0)", atol=0, rtol=0)
    davg = DTensor.from_local(parts[RANK].to(DEVICE), mesh, [Partial("avg")])
    assert_close(davg.full_tensor(), total / 2, "Partial(avg) full_tensor", atol=0, rtol=0)
    dmax = DTensor.from_local(parts[RANK].to(DEVICE), mesh, [Partial("max")])
    assert_equal(dmax.full_tensor(), torch.maximum(parts[0], parts[1]), "Partial(max) full_tensor")

    # Ops on DTensors equal the plain tensors.
    db_rep = distribute_tensor(b.to(DEVICE), mesh, [Replicate()])
    mm = da @ db_rep  # row-sharded @ replicated: local matmul, Shard(0) result
    assert mm.placements == (Shard(0),), mm.placements
    assert_close(mm, a @ b, "Shard(0) @ Replicate")
    inner = s1 @ distribute_tensor(b.to(DEVICE), mesh, [Shard(0)])  # contraction dim sharded
    assert inner.placements == (Partial(),), inner.placements
    assert_close(inner, a @ b, "Shard(1) @ Shard(0)")
    assert_close(da.softmax(dim=1), a.softmax(dim=1), "softmax over the local dim")
    assert_close(da.softmax(dim=0), a.softmax(dim=0), "softmax over the sharded dim")
    s = da.sum()
    assert_close(s, a.sum(), "sum of Shard(0)")
    assert_close(da.sum(dim=1), a.sum(dim=1), "sum(dim=1) of Shard(0)")
    assert_close(da.sum(dim=0), a.sum(dim=0), "sum(dim=0) of Shard(0)")
    assert_close((da * 2 + rep).exp().mean(), (a * 3).exp().mean(), "elementwise")

    # Autograd through DTensor ops.
    x = distribute_tensor(a.to(DEVICE), mesh, [Shard(0)]).requires_grad_()
    w = distribute_tensor(b.to(DEVICE), mesh, [Replicate()]).requires_grad_()
    (x @ w).softmax(dim=-1).pow(2).sum().backward()
    xr, wr = a.clone().requires_grad_(), b.clone().requires_grad_()
    (xr @ wr).softmax(dim=-1).pow(2).sum().backward()
    assert_close(x.grad, xr.grad, "grad of the sharded input")
    assert_close(w.grad, wr.grad, "grad of the replicated weight")


# ---------------------------------------------------------------------------------------
# Tensor parallel (+ sequence parallel)
# ---------------------------------------------------------------------------------------

def _tp(sequence_parallel: bool):
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = mesh_1d()
    ref = tiny_llama()
    model = parallelize_module(clone(ref).to(DEVICE), mesh, llama_tp_plan(ref, sequence_parallel))
    q = model.model.layers[0].self_attn.q_proj.weight
    assert isinstance(q, DTensor) and q.to_local().shape[0] == q.shape[0] // WORLD, "q_proj not sharded"
    assert q.to_local().device == DEVICE
    plain = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    assert not plain, f"parameters left as plain tensors: {plain}"
    ids = token_batches(1, batch=2, seed=3)[0]  # every rank sees the same batch

    seen = []
    hook = model.model.layers[1].post_attention_layernorm.register_forward_hook(
        lambda mod, args, out: seen.append((args[0], out)))
    with torch.no_grad():
        logits = model(input_ids=ids.to(DEVICE)).logits
        assert_close(logits, ref(input_ids=ids).logits, "forward logits")
    hook.remove()
    norm_in, norm_out = seen[0]
    if sequence_parallel:  # the norm runs on this rank's half of the sequence
        for t in (norm_in, norm_out):
            assert isinstance(t, DTensor) and t.placements == (Shard(1),), t
            assert t.to_local().shape == (2, ids.shape[1] // WORLD, 32), t.to_local().shape
    else:  # the norm runs on the whole sequence, replicated
        assert isinstance(norm_in, DTensor) and norm_in.placements == (Replicate(),), norm_in
        assert norm_in.to_local().shape == (2, ids.shape[1], 32), norm_in.to_local().shape

    lr = 0.5
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    loss = lm_loss(model, ids.to(DEVICE))
    loss.backward()
    ref_loss = lm_loss(ref, ids)
    ref_loss.backward()
    assert_close(loss, ref_loss, "training loss")
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    for n, p in model.named_parameters():
        assert_close(p.grad, ref_grads[n], f"grad of {n}")
    opt.step()
    ref_opt.step()
    assert_params_close(model, ref, "after one SGD step")
    with torch.no_grad():
        assert_close(model(input_ids=ids.to(DEVICE)).logits, ref(input_ids=ids).logits, "logits after the step")


def check_tp():
    _tp(sequence_parallel=False)


def check_tp_sp():
    _tp(sequence_parallel=True)


# ---------------------------------------------------------------------------------------
# Pipeline parallel
# ---------------------------------------------------------------------------------------

def _mlp_stack(n_layers=4, width=16, seed=4) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = []
    for _ in range(n_layers):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


def _pp(schedule_cls, n_microbatches=4, steps=2):
    from torch.distributed.pipelining import PipelineStage

    ref = _mlp_stack()
    per_stage = len(ref) // WORLD
    # Stage r holds layers [r * per_stage, (r + 1) * per_stage) of the stack.
    stage_mod = clone(ref[RANK * per_stage:(RANK + 1) * per_stage]).to(DEVICE)
    stage = PipelineStage(stage_mod, RANK, WORLD, DEVICE)
    schedule = schedule_cls(stage, n_microbatches=n_microbatches, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    for step in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
        # Oracle: the pipeline averages the microbatches' losses (scale_grads=True).
        ref_opt.zero_grad()
        ref_losses = [F.mse_loss(ref(xm), ym) for xm, ym in zip(x.chunk(n_microbatches), y.chunk(n_microbatches))]
        (sum(ref_losses) / n_microbatches).backward()
        with torch.no_grad():
            ref_out = ref(x)

        opt.zero_grad()
        losses = []
        if RANK == 0:
            schedule.step(x.to(DEVICE))
        else:
            out = schedule.step(target=y.to(DEVICE), losses=losses)
            assert_close(out, ref_out, f"step {step}: pipeline output")
            assert len(losses) == n_microbatches, losses
            for i, (l, r) in enumerate(zip(losses, ref_losses)):
                assert l.device == DEVICE, l.device
                assert_close(l, r, f"step {step}: loss of microbatch {i}")
        ref_stage = ref[RANK * per_stage:(RANK + 1) * per_stage]
        for (n, p), r in zip(stage_mod.named_parameters(), ref_stage.parameters()):
            assert p.grad is not None and p.grad.device == DEVICE, n
            assert_close(p.grad, r.grad, f"step {step}: grad of stage {RANK} {n}")
        opt.step()
        ref_opt.step()


def check_pp_gpipe():
    from torch.distributed.pipelining import ScheduleGPipe

    _pp(ScheduleGPipe)


def check_pp_1f1b():
    from torch.distributed.pipelining import Schedule1F1B

    _pp(Schedule1F1B)


# ---------------------------------------------------------------------------------------
# Expert parallel
# ---------------------------------------------------------------------------------------

class _Expert(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.up, self.down = nn.Linear(h, f), nn.Linear(f, h)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def _moe_reference(gate, experts, x):
    """Top-1 MoE on one process: token t goes to expert argmax(softmax(gate(x_t)))."""
    probs = gate(x).softmax(-1)
    w, idx = probs.max(-1)
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        sel = idx == e
        y = y.index_put((sel.nonzero().squeeze(1),), expert(x[sel]))
    return y * w.unsqueeze(-1), idx


def _ep(all_to_all):
    """``all_to_all(input, output_split_sizes, input_split_sizes)``: differentiable."""
    H, FF, E = 8, 16, 4
    epr = E // WORLD  # experts per rank: rank r holds experts [r * epr, (r + 1) * epr)
    tokens = [7, 5]  # uneven token counts per rank
    torch.manual_seed(6)
    gate = nn.Linear(H, E, bias=False)
    experts = nn.ModuleList(_Expert(H, FF) for _ in range(E))
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(t, H, generator=g) for t in tokens]
    targets = [torch.randn(t, H, generator=g) for t in tokens]

    # Oracle over all ranks' tokens.
    x_ref = [x.clone().requires_grad_() for x in xs]
    y_ref, idx_ref = zip(*(_moe_reference(gate, experts, x) for x in x_ref))
    sum((y * t).sum() for y, t in zip(y_ref, targets)).backward()
    routed = torch.stack([torch.bincount(i, minlength=E).view(WORLD, epr).sum(1) for i in idx_ref])
    assert len(set(routed.flatten().tolist())) > 1, f"splits are even: {routed.tolist()}"
    if RANK == 0:
        log(f"EP tokens sent [source rank, destination rank]: {routed.tolist()}")

    # Distributed: replicated gate, local experts, all-to-all dispatch and combine.
    my_gate = clone(gate).to(DEVICE)
    my_experts = clone(experts[RANK * epr:(RANK + 1) * epr]).to(DEVICE)
    x = xs[RANK].to(DEVICE).requires_grad_()
    w, idx = my_gate(x).softmax(-1).max(-1)
    order = idx.argsort(stable=True)  # tokens grouped by expert, hence by destination rank
    counts = torch.bincount(idx, minlength=E)  # tokens of this rank per expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # [source rank, local expert]
    send_splits = counts.view(WORLD, epr).sum(1).tolist()
    recv_splits = recv_counts.view(WORLD, epr).sum(1).tolist()
    assert send_splits == routed[RANK].tolist(), (send_splits, routed)
    assert recv_splits == routed[:, RANK].tolist(), (recv_splits, routed)
    dispatched = all_to_all(x[order], recv_splits, send_splits)
    chunks = dispatched.split(recv_counts.tolist())  # (src 0, expert 0), (src 0, expert 1), ...
    processed = torch.cat([my_experts[i % epr](c) for i, c in enumerate(chunks)])
    combined = all_to_all(processed, send_splits, recv_splits)
    y = combined[order.argsort()] * w.unsqueeze(-1)
    (y * targets[RANK].to(DEVICE)).sum().backward()

    assert_close(y, y_ref[RANK], "MoE output")
    assert_close(x.grad, x_ref[RANK].grad, "grad of the input tokens")
    for i, (mine, ref) in enumerate(zip(my_experts, experts[RANK * epr:(RANK + 1) * epr])):
        for (n, p), r in zip(mine.named_parameters(), ref.parameters()):
            assert_close(p.grad, r.grad, f"grad of expert {RANK * epr + i} {n}")
    gate_grad = my_gate.weight.grad.clone()
    dist.all_reduce(gate_grad)  # the gate is replicated: sum its gradient over ranks
    assert_close(gate_grad, gate.weight.grad, "grad of the gate")


def check_ep():
    """Token dispatch with torch.distributed.nn.functional.all_to_all_single."""
    import warnings

    from torch.distributed.nn.functional import all_to_all_single

    def a2a(inp, out_splits, in_splits):
        with warnings.catch_warnings():  # deprecated in favour of the functional collectives
            warnings.simplefilter("ignore", FutureWarning)
            return all_to_all_single(inp.new_empty(sum(out_splits), *inp.shape[1:]), inp, out_splits, in_splits)

    _ep(a2a)


def check_ep_funcol():
    """Token dispatch with the functional collectives' all_to_all_single_autograd."""
    import torch.distributed._functional_collectives as funcol

    def a2a(inp, out_splits, in_splits):
        out = funcol.all_to_all_single_autograd(inp, out_splits, in_splits, dist.group.WORLD)
        return funcol.wait_tensor(out)

    _ep(a2a)


# ---------------------------------------------------------------------------------------
# Context parallel
# ---------------------------------------------------------------------------------------

class _Attention(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, s, d]
        return self.out(o.transpose(1, 2).reshape(b, s, h))


def check_cp():
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    mesh = mesh_1d()
    torch.manual_seed(8)
    ref = _Attention(16, 2)
    g = torch.Generator().manual_seed(9)
    SEQ = 20  # 5 per round-robin chunk: attention blocks of any length
    x, t = torch.randn(2, SEQ, 16, generator=g), torch.randn(2, SEQ, 16, generator=g)
    y_ref = ref(x)
    (y_ref * t).sum().backward()

    model = clone(ref).to(DEVICE)
    xd, td = x.to(DEVICE), t.to(DEVICE)
    # SDPA on neuron takes the device-generic "efficient" ops, which ring attention shards.
    with context_parallel(mesh, buffers=[xd, td], buffer_seq_dims=[1, 1]):
        assert xd.shape == (2, SEQ // WORLD, 16), xd.shape  # this rank's part of the sequence
        y = model(xd)
        (y * td).sum().backward()
    (y_full,) = context_parallel_unshard(mesh, [y.detach()], [1])
    assert_close(y_full, y_ref, "attention output")
    for (n, p), r in zip(model.named_parameters(), ref.parameters()):
        grad = p.grad.clone()
        dist.all_reduce(grad)  # each rank saw part of the sequence
        assert_close(grad, r.grad, f"grad of {n}")


# ---------------------------------------------------------------------------------------
# Distributed checkpoint saved by 4 ranks (parallel4.py), loaded by 2
# ---------------------------------------------------------------------------------------

CKPT_DIR = sys.argv[sys.argv.index("--ckpt") + 1] if "--ckpt" in sys.argv else None


def check_dcp_reshard():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict, get_state_dict, set_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    assert CKPT_DIR, "--ckpt DIR (written by parallel4.py) is required"
    ref_path = os.path.join(CKPT_DIR, "reference.pt")
    assert os.path.exists(ref_path), f"no checkpoint from parallel4.py in {CKPT_DIR}"
    saved = torch.load(ref_path)
    make_opt = lambda m: torch.optim.AdamW(m.parameters(), **ADAMW)  # noqa: E731

    mesh = mesh_1d()
    model = tiny_llama(seed=123).to(DEVICE)  # not the saved weights
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = make_opt(model)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=os.path.join(CKPT_DIR, "ckpt"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    for n, p in model.named_parameters():
        assert p.to_local().shape[0] == p.shape[0] // WORLD, (n, p.to_local().shape)  # resharded 4 -> 2
        assert_equal(p, saved["model"][n], f"loaded parameter {n}")
    osd = get_optimizer_state_dict(model, opt)
    assert osd["state"].keys() == saved["optim"].keys()
    for n, s in saved["optim"].items():
        assert osd["state"][n].keys() == s.keys(), (n, osd["state"][n].keys(), s.keys())
        for k, v in s.items():
            assert_equal(osd["state"][n][k], v, f"loaded optimizer state {n}.{k}")

    # One more AdamW step from the loaded state equals a CPU run from the same state.
    ref = tiny_llama(seed=123)
    ref.load_state_dict(saved["model"], strict=False)
    ref_opt = make_opt(ref)
    ref_opt.load_state_dict({
        "state": {i: saved["optim"][n] for i, (n, _) in enumerate(ref.named_parameters())},
        "param_groups": [{**ref_opt.param_groups[0], "params": list(range(len(saved["model"])))}],
    })
    ids = token_batches(4, batch=8, seed=11)[3]
    train_reference(ref, [ids], lambda m: ref_opt)
    opt.zero_grad()
    lm_loss(model, rank_slice(ids, RANK, WORLD).to(DEVICE)).backward()
    opt.step()
    assert_params_close(model, ref, "one step after loading")


def check_dtensor_random():
    """DTensor's random ops (initialising sharded parameters, dropout on sharded activations)
    run on a neuron mesh as on CUDA: every shard of a tensor draws different numbers, replicas
    draw the same, the same seed gives the same tensor, and the generator moves on."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = mesh_1d()

    def sharded_normal(seed: int):
        torch.manual_seed(seed)
        w = distribute_tensor(torch.empty(8, 6, device=DEVICE), mesh, [Shard(0)])
        w.normal_()
        r = distribute_tensor(torch.empty(4, 3, device=DEVICE), mesh, [Replicate()])
        r.uniform_(-1, 1)
        after = torch.randn(3, device=DEVICE)  # the generator after the DTensor ops
        return w.full_tensor().cpu(), r.to_local().cpu(), after.cpu()

    w, r, after = sharded_normal(0)
    halves = w.chunk(WORLD, 0)
    assert not torch.equal(halves[0], halves[1]), "both shards drew the same numbers"
    assert 0.5 < float(w.std()) < 1.5, f"not standard normal: std {float(w.std())}"
    reps = [torch.empty_like(r) for _ in range(WORLD)]
    dist.all_gather_object(reps, r)
    assert all(torch.equal(x, reps[0]) for x in reps), "replicas of a Replicate() tensor differ"
    assert float(r.abs().max()) <= 1.0
    w2, r2, after2 = sharded_normal(0)
    assert_equal(w2, w, "sharded normal_ with the same seed")
    assert_equal(r2, r, "replicated uniform_ with the same seed")
    assert_equal(after2, after, "draws after the DTensor ops with the same seed")
    w3, _, _ = sharded_normal(1)
    assert not torch.equal(w3, w), "another seed gave the same tensor"

    x = distribute_tensor(torch.ones(16, 8, device=DEVICE), mesh, [Shard(0)])
    torch.manual_seed(0)
    y = F.dropout(x, p=0.5, training=True)
    kept = y.full_tensor().cpu()
    assert set(kept.unique().tolist()) <= {0.0, 2.0} and 0.2 < float((kept == 0).float().mean()) < 0.8, kept
    # dropout draws from the device's generator, which DTensor moves per shard
    halves = kept.chunk(WORLD, 0)
    assert not torch.equal(halves[0], halves[1]), "both shards dropped the same elements"
    torch.manual_seed(0)
    assert_equal(F.dropout(x, p=0.5, training=True), kept, "sharded dropout with the same seed")


CHECKS = {
    "ddp_sgd": check_ddp_sgd,
    "ddp_adamw": check_ddp_adamw,
    "fsdp2": check_fsdp2,
    "fsdp2_no_reshard": check_fsdp2_no_reshard,
    "fsdp2_bf16": check_fsdp2_bf16,
    "fsdp2_bf16_no_reshard": check_fsdp2_bf16_no_reshard,
    "dtensor": check_dtensor,
    "dtensor_random": check_dtensor_random,
    "tp": check_tp,
    "tp_sp": check_tp_sp,
    "pp_gpipe": check_pp_gpipe,
    "pp_1f1b": check_pp_1f1b,
    "ep": check_ep,
    "ep_funcol": check_ep_funcol,
    "cp": check_cp,
    "dcp_reshard": check_dcp_reshard,
}

if __name__ == "__main__":
    main(CHECKS)

"""Four-rank acceptance checks of distributed training on ``neuron``: 2-D meshes
(FSDP2 x TP on 2x2, also with activation checkpointing as TorchTitan applies it) and a distributed checkpoint saved by 4 ranks.

``python -m torch.distributed.run --nproc-per-node=4 parallel4.py --ckpt DIR [--only a,b]``
writes ``DIR/ckpt`` (torch.distributed.checkpoint of an FSDP2 model and its AdamW state)
and ``DIR/reference.pt`` (the same state gathered to plain CPU tensors) for parallel2.py
to load with 2 ranks.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from _common import (
    ADAMW, RANK, WORLD, assert_close, assert_equal, assert_params_close, clone, full, init, llama_tp_plan,
    lm_loss, log, main, rank_slice, tiny_llama, token_batches, train_reference,
)

DEVICE = init()
DT = DEVICE.type
assert WORLD == 4, "parallel4.py runs on 4 ranks"
CKPT_DIR = sys.argv[sys.argv.index("--ckpt") + 1] if "--ckpt" in sys.argv else None


def check_dtensor_2d():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(DT, (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(8, 6, generator=g), torch.randn(6, 4, generator=g)
    da = distribute_tensor(a.to(DEVICE), mesh, [Shard(0), Shard(1)])
    assert_equal(da.to_local(), a.chunk(2, 0)[dp].chunk(2, 1)[tp], "[Shard(0), Shard(1)] local block")
    assert_equal(da.full_tensor(), a, "full_tensor")
    assert_equal(da.redistribute(mesh, [Replicate(), Shard(0)]).to_local(), a.chunk(2, 0)[tp],
                 "-> [Replicate, Shard(0)]")
    assert_equal(da.redistribute(mesh, [Shard(1), Replicate()]).to_local(), a.chunk(2, 1)[dp],
                 "-> [Shard(1), Replicate]")
    db = distribute_tensor(b.to(DEVICE), mesh, [Replicate(), Shard(0)])
    mm = da.redistribute(mesh, [Shard(0), Shard(1)]) @ db  # contraction sharded on tp
    assert mm.placements == (Shard(0), Partial()), mm.placements
    assert_close(mm, a @ b, "2-D matmul")
    assert_close(da.softmax(dim=1), a.softmax(dim=1), "2-D softmax")
    assert_close(da.sum(), a.sum(), "2-D sum")


def check_fsdp2_tp():
    """FSDP2 over "dp" x TP with sequence parallelism over "tp", on a 2x2 mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(DT, (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)  # noqa: E731
    ref = tiny_llama()
    model = parallelize_module(clone(ref).to(DEVICE), mesh["tp"], llama_tp_plan(ref, True))
    batches = token_batches(3, batch=4)
    ref_losses = train_reference(ref, batches, make_opt)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.device_mesh.ndim == 2 and q.to_local().shape == (q.shape[0] // 4, q.shape[1]), q
    opt = make_opt(model)
    for step, ids in enumerate(batches):
        opt.zero_grad()
        loss = lm_loss(model, rank_slice(ids, dp, 2).to(DEVICE))  # the tp pair shares a batch
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        assert_close(mean / WORLD, ref_losses[step], f"loss of step {step}")
    assert_params_close(model, ref, "after training")


def check_fsdp2_tp_ac():
    """The recipe TorchTitan applies to its Llama, written with plain PyTorch: tensor and
    sequence parallel on "tp", full activation checkpointing of every block, FSDP2 on "dp",
    AdamW and gradient-norm clipping over the 2-D sharded gradients."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(DT, (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    make_opt = lambda m: torch.optim.AdamW(m.parameters(), **ADAMW)  # noqa: E731
    ref = tiny_llama(seed=3)
    model = parallelize_module(clone(ref).to(DEVICE), mesh["tp"], llama_tp_plan(ref, True))
    batches = token_batches(3, batch=4, seed=4)
    ref_opt = make_opt(ref)
    ref_losses, ref_norms = [], []
    for ids in batches:
        ref_opt.zero_grad()
        loss = lm_loss(ref, ids)
        loss.backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5))
        ref_opt.step()
        ref_losses.append(loss.detach())
    mlp_calls = [0]
    layers = model.model.layers
    layers[0].mlp.register_forward_pre_hook(lambda *_: mlp_calls.__setitem__(0, mlp_calls[0] + 1))
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
        fully_shard(layers[i], mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = make_opt(model)
    for step, ids in enumerate(batches):
        opt.zero_grad()
        loss = lm_loss(model, rank_slice(ids, dp, 2).to(DEVICE))  # the tp pair shares a batch
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        assert_close(full(norm), ref_norms[step], f"gradient norm of step {step}")
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        assert_close(mean / WORLD, ref_losses[step], f"loss of step {step}")
    # each block ran its forward twice a step: once, and again (recomputed) in the backward
    assert mlp_calls[0] == 2 * len(batches), f"layer 0's MLP ran {mlp_calls[0]} times in {len(batches)} steps"
    assert_params_close(model, ref, "after training", atol=1e-4, rtol=1e-4)


def _fsdp_adamw(seed: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DT, (WORLD,))
    model = tiny_llama(seed=seed).to(DEVICE)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), **ADAMW)


def _train(model, opt, batches):
    for ids in batches:
        opt.zero_grad()
        lm_loss(model, rank_slice(ids, RANK, WORLD).to(DEVICE)).backward()
        opt.step()


def _full_state(model, opt) -> dict:
    """Parameters and optimizer state as full CPU tensors, keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, opt)
    return {
        "model": {n: full(p) for n, p in model.named_parameters()},
        "optim": {n: {k: full(v) for k, v in s.items()} for n, s in osd["state"].items()},
    }


def check_dcp_save():
    """Saves an FSDP2 model and its AdamW state with 4 ranks; loads it back bitwise."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_state_dict, set_state_dict,
    )

    assert CKPT_DIR, "--ckpt DIR is required"
    batches = token_batches(3, batch=8, seed=11)
    model, opt = _fsdp_adamw(seed=0)
    _train(model, opt, batches[:2])
    ref = tiny_llama(seed=0)
    train_reference(ref, batches[:2], lambda m: torch.optim.AdamW(m.parameters(), **ADAMW))
    assert_params_close(model, ref, "FSDP2 AdamW training")

    msd, osd = get_state_dict(model, opt)
    some = msd["model.layers.0.mlp.up_proj.weight"]
    assert type(some).__name__ == "DTensor" and some.to_local().device == DEVICE, type(some)
    path = os.path.join(CKPT_DIR, "ckpt")
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    saved = _full_state(model, opt)
    if RANK == 0:
        torch.save(saved, os.path.join(CKPT_DIR, "reference.pt"))
    assert os.path.exists(os.path.join(path, ".metadata"))

    # The gathered state dict of DCP's helpers equals the parameters.
    full_msd, full_osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    for n, t in saved["model"].items():
        assert_equal(full_msd[n], t, f"full_state_dict {n}")
    for n, s in saved["optim"].items():
        for k, v in s.items():
            assert_equal(full_osd["state"][n][k], v, f"full optimizer state {n}.{k}")

    # Round trip into a differently initialised model and a fresh optimizer.
    model2, opt2 = _fsdp_adamw(seed=123)
    msd2, osd2 = get_state_dict(model2, opt2)  # initialises the optimizer state
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded = _full_state(model2, opt2)
    assert loaded["model"].keys() == saved["model"].keys()
    for n, t in saved["model"].items():
        assert_equal(loaded["model"][n], t, f"loaded parameter {n}")
    assert loaded["optim"].keys() == saved["optim"].keys()
    for n, s in saved["optim"].items():
        assert loaded["optim"][n].keys() == s.keys(), (n, s.keys())
        for k, v in s.items():
            assert_equal(loaded["optim"][n][k], v, f"loaded optimizer state {n}.{k}")
    for (n, p), p2 in zip(model.named_parameters(), model2.parameters()):
        assert_equal(p2.to_local(), p.to_local(), f"local shard of {n}")

    # Training continues identically from the original and from the loaded state.
    _train(model, opt, batches[2:])
    _train(model2, opt2, batches[2:])
    for (n, p), p2 in zip(model.named_parameters(), model2.parameters()):
        assert_equal(p2, p, f"{n} after one more step")
    if RANK == 0:
        log(f"checkpoint: {sorted(os.listdir(path))}")


CHECKS = {
    "dtensor_2d": check_dtensor_2d,
    "fsdp2_tp": check_fsdp2_tp,
    "fsdp2_tp_ac": check_fsdp2_tp_ac,
    "dcp_save": check_dcp_save,
}

if __name__ == "__main__":
    main(CHECKS)

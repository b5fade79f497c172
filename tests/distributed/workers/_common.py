"""Shared set-up of the worker scripts that tests/_dist.py launches under torchrun.

``TNX_DIST_DEVICE=cpu`` runs a worker on device ``cpu`` with backend ``gloo`` instead of
``neuron``/``neuron``: the same scripts then validate themselves against stock PyTorch.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import traceback
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
DEVICE_KIND = os.environ.get("TNX_DIST_DEVICE", "neuron")
if DEVICE_KIND not in ("neuron", "cpu"):
    raise ValueError(f"TNX_DIST_DEVICE must be 'neuron' or 'cpu', not {DEVICE_KIND!r}")
# How long a rank that finished a check waits for the others before declaring them hung.
CHECK_TIMEOUT = float(os.environ.get("TNX_DIST_CHECK_TIMEOUT", "180"))


def init(backend: str | None = None) -> torch.device:
    """Initialises the default group and returns this rank's device (``neuron:<local rank>``)."""
    if DEVICE_KIND == "cpu":
        device = torch.device("cpu")
        dist.init_process_group(backend or "gloo")
        return device
    device = torch.device("neuron", LOCAL_RANK % torch.neuron.device_count())
    torch.neuron.set_device(device)
    dist.init_process_group(backend or "neuron")
    return device


def done() -> None:
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {RANK}: ok", flush=True)


def log(msg: str) -> None:
    print(f"rank {RANK}: {msg}", flush=True)


# ---------------------------------------------------------------------------------------
# Running many checks in one launch
# ---------------------------------------------------------------------------------------

def run_checks(checks: dict[str, Callable[[], None]], selected: list[str] | None = None) -> bool:
    """Runs each check on every rank, in order, and has rank 0 print one marker per check:

    ``CHECK <name> ok`` or ``CHECK <name> FAIL (ranks [...])``.

    After each check the ranks compare outcomes through the rendezvous store (not through
    the backend under test), so one failing check does not hide the next. A rank stuck in
    a collective makes the others give up after ``CHECK_TIMEOUT`` s and exit. Returns
    whether every check passed.
    """
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    stats = _backend_stats()
    all_ok = True
    names = list(checks) if not selected else selected
    for name in names:
        fn = checks[name]
        t0 = time.perf_counter()
        status = "ok"
        before = stats() if stats else None
        try:
            fn()
            if stats:  # the check's collectives went through the neuron backend
                used = _stats_delta(before, stats())
                if not used:
                    raise AssertionError("no collective of this check went through the neuron backend")
                if RANK == 0:
                    log(f"collectives of {name}: {used}")
        except Exception as e:  # noqa: BLE001 - report and go on with the next check
            status = "FAIL"
            first = (str(e).strip().splitlines() or [""])[0][:300]
            print(f"rank {RANK}: CHECK {name} error: {type(e).__name__}: {first}\n"
                  f"{traceback.format_exc()}", flush=True)
        store.set(f"tnx_check/{name}/{RANK}", status)
        keys = [f"tnx_check/{name}/{r}" for r in range(WORLD)]
        try:
            store.wait(keys, timedelta(seconds=CHECK_TIMEOUT))
        except Exception:  # noqa: BLE001
            print(f"CHECK {name} FAIL (rank {RANK} gave up waiting {CHECK_TIMEOUT:.0f} s for the "
                  f"other ranks: hung in a collective?)", flush=True)
            os._exit(3)
        statuses = [store.get(k).decode() for k in keys]
        dt = time.perf_counter() - t0
        if all(s == "ok" for s in statuses):
            marker = f"CHECK {name} ok"
        else:
            marker = f"CHECK {name} FAIL (ranks {[r for r, s in enumerate(statuses) if s != 'ok']})"
            all_ok = False
        if RANK == 0:
            print(f"{marker}  [{dt:.1f} s]", flush=True)
    return all_ok


def _backend_stats():
    """``torch_neuronx.distributed.stats`` (calls per collective and transport) on neuron."""
    if DEVICE_KIND != "neuron":
        return None
    import torch_neuronx.distributed as nd

    return getattr(nd, "stats", None)


def _stats_delta(before: dict, after: dict) -> dict:
    delta = {}
    for op, transports in after.items():
        for transport, n in transports.items():
            d = n - before.get(op, {}).get(transport, 0)
            if d:
                delta.setdefault(op, {})[transport] = d
    return delta


def main(checks: dict[str, Callable[[], None]]) -> None:
    """``script.py [--only a,b] [other args]``: runs the checks, exits 1 if one failed."""
    selected = None
    if "--only" in sys.argv:
        selected = sys.argv[sys.argv.index("--only") + 1].split(",")
    ok = run_checks(checks, selected)
    if ok:
        done()
    else:  # skip the barrier: the backend may be in a bad state after a failed check
        dist.destroy_process_group()
        sys.exit(1)


# ---------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------

def full(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t``; a DTensor is gathered first."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().cpu()


def assert_close(actual, expected, what: str, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    actual = full(actual)
    expected = full(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError(f"{what}: got {actual.dtype}{list(actual.shape)}, "
                             f"expected {expected.dtype}{list(expected.shape)}")
    if not torch.allclose(actual, expected, atol=atol, rtol=rtol):
        err = (actual.double() - expected.double()).abs().max().item()
        raise AssertionError(f"{what}: max abs error {err:.3g} (atol {atol}, rtol {rtol})")


def assert_equal(actual, expected, what: str) -> None:
    actual, expected = full(actual), full(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype or not torch.equal(actual, expected):
        raise AssertionError(f"{what}: not bitwise equal")


def assert_params_close(model: torch.nn.Module, ref: torch.nn.Module, what: str, **tol) -> None:
    ref_params = dict(ref.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert names, "model has no parameters"
    for name, p in model.named_parameters():
        assert_close(p, ref_params[_plain_name(name)], f"{what}: {name}", **tol)


def _plain_name(name: str) -> str:
    """Parameter name without the prefixes that DDP and activation wrappers add."""
    for prefix in ("module.",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.replace("_checkpoint_wrapped_module.", "")


# ---------------------------------------------------------------------------------------
# Tiny Llama and data
# ---------------------------------------------------------------------------------------

VOCAB, SEQ = 64, 16


def tiny_llama(seed: int = 0, **overrides):
    """A CPU 2-layer LlamaForCausalLM (hidden 32, vocab 64, 4 heads, 2 KV heads), fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=None, eos_token_id=None, attn_implementation="sdpa",
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**kwargs))
    return model


def token_batches(steps: int, batch: int, seq: int = SEQ, seed: int = 1) -> list[torch.Tensor]:
    """``steps`` global batches of token ids ``[batch, seq]`` on CPU, same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (batch, seq), generator=g) for _ in range(steps)]


def rank_slice(t: torch.Tensor, rank: int, nranks: int) -> torch.Tensor:
    """This rank's contiguous block of rows of a global batch."""
    assert t.shape[0] % nranks == 0
    n = t.shape[0] // nranks
    return t[rank * n:(rank + 1) * n]


# AdamW of the FSDP2 checkpoint checks (saved by parallel4.py, resumed by parallel2.py). eps 1e-6,
# not 1e-8: Adam's first steps move a weight by ~lr * g / (|g| + eps), so for a gradient near eps
# a rounding-level difference between sharded and full-batch sums (which varies with the CPU's
# vector width) would move it by a sizeable fraction of lr.
ADAMW = dict(lr=1e-2, weight_decay=0.1, eps=1e-6)


def lm_loss(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def train_reference(model, batches, make_opt, steps=None):
    """Single-process training on the full batches (CPU oracle); returns the losses."""
    opt = make_opt(model)
    losses = []
    for ids in batches[:steps]:
        opt.zero_grad()
        loss = lm_loss(model, ids)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def clone(model):
    return copy.deepcopy(model)


def _replicate_inputs(module, inputs, mesh):
    from torch.distributed.tensor import DTensor, Replicate

    return tuple(DTensor.from_local(t, mesh, [Replicate()], run_check=False) for t in inputs)


def _local_output(module, output, mesh):
    return output.to_local()


def ReplicateParameters():
    """A parallel style for modules that tensor parallelism leaves whole (the norms without
    sequence parallelism): parameters become replicated DTensors, so that every parameter
    of the model is a DTensor (as the optimizers' foreach kernels require), and the module
    still takes and returns plain tensors."""
    from torch.distributed.tensor import distribute_module
    from torch.distributed.tensor.parallel import ParallelStyle

    class _ReplicateParameters(ParallelStyle):
        def _apply(self, module, device_mesh):
            return distribute_module(module, device_mesh, input_fn=_replicate_inputs, output_fn=_local_output)

    return _ReplicateParameters()


def llama_tp_plan(model, sequence_parallel: bool) -> dict:
    """Megatron-style tensor-parallel plan of a Hugging Face Llama, optionally with
    sequence parallelism (norms and residual stream sharded on the sequence dimension)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    )

    if not sequence_parallel:
        plan = {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "model.norm": ReplicateParameters(),
            "lm_head": ColwiseParallel(output_layouts=Replicate()),
        }
        for i in range(len(model.model.layers)):
            p = f"model.layers.{i}"
            plan.update({
                f"{p}.input_layernorm": ReplicateParameters(),
                f"{p}.post_attention_layernorm": ReplicateParameters(),
                f"{p}.self_attn.q_proj": ColwiseParallel(),
                f"{p}.self_attn.k_proj": ColwiseParallel(),
                f"{p}.self_attn.v_proj": ColwiseParallel(),
                f"{p}.self_attn.o_proj": RowwiseParallel(),
                f"{p}.mlp.gate_proj": ColwiseParallel(),
                f"{p}.mlp.up_proj": ColwiseParallel(),
                f"{p}.mlp.down_proj": RowwiseParallel(),
            })
        return plan
    # The residual stream stays a DTensor sharded on the sequence (dim 1), so that the
    # model sees the global sequence length (positions, causal mask) through its shape.
    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                              use_local_output=False),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(len(model.model.layers)):
        p = f"model.layers.{i}"
        plan.update({
            f"{p}.input_layernorm": SequenceParallel(),
            f"{p}.self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            f"{p}.self_attn.q_proj": ColwiseParallel(),
            f"{p}.self_attn.k_proj": ColwiseParallel(),
            f"{p}.self_attn.v_proj": ColwiseParallel(),
            f"{p}.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            f"{p}.post_attention_layernorm": SequenceParallel(),
            f"{p}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            f"{p}.mlp.gate_proj": ColwiseParallel(),
            f"{p}.mlp.up_proj": ColwiseParallel(),
            f"{p}.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        })
    return plan

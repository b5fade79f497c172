"""Capture one step at the aten level: every op with its shapes and dtypes, every collective with its
size and group, and the bytes alive at the peak. One TorchDispatchMode serves the three modes: on
``neuron`` tensors (record), on fake tensors (full size, nothing allocated) and around the kernels of a
compiled graph (compiled mode adds the Inductor kernels, see _compiled.py)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # a build of torch without distributed
    _DTensor = None

# Dispatcher namespaces that carry no device work.
_SKIP_NAMESPACES = ("prim", "profiler")

# Collective ops (c10d and functional collectives) -> the collective they perform.
COLLECTIVES = {
    "allreduce_": "all_reduce", "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_base_": "all_to_all", "alltoall_": "all_to_all", "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast", "broadcast": "broadcast",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
}


@dataclass
class Op:
    """One op of the step as the device sees it."""

    name: str  # "aten.mm.default", "c10d._allgather_base_.default", "inductor.fused" ...
    phase: str  # "forward", "backward", "optimizer", "prefill", "decode"
    inputs: list[tuple[tuple[int, ...], str]]  # (shape, dtype) of every tensor argument, in order
    outputs: list[tuple[tuple[int, ...], str]]
    in_bytes: int  # bytes the op reads (tensor arguments; a broadcast dimension counts once)
    out_bytes: int  # bytes it writes
    args: dict[str, Any] = field(default_factory=dict)  # scalars the cost needs (is_causal, scale, ...)
    collective: str | None = None  # "all_reduce", "all_gather", ... for collectives
    group: tuple[int, ...] = ()  # ranks of the collective's group
    comm_bytes: int = 0  # bytes of the full (gathered / unreduced) buffer of a collective
    count: float = 1.0  # how many times the step runs it (layer replication scales this)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if _DTensor is not None and isinstance(t, _DTensor) else t


def _nbytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches for ``t``: stride-0 (broadcast) dimensions count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _group_ranks(args, kwargs, world: int) -> tuple[int, ...]:
    """Ranks of a collective's group: a ProcessGroup argument, or a functional collective's group name."""
    import torch.distributed as dist

    for a in list(args) + list(kwargs.values()):
        try:
            if isinstance(a, torch.ScriptObject):  # c10d ops carry the group boxed
                a = dist.ProcessGroup.unbox(a)
            if isinstance(a, dist.ProcessGroup):
                return tuple(dist.get_process_group_ranks(a))
            if isinstance(a, str) and a:
                from torch.distributed.distributed_c10d import _resolve_process_group

                return tuple(dist.get_process_group_ranks(_resolve_process_group(a)))
        except (ValueError, RuntimeError, KeyError):
            continue
    return tuple(range(world))


def _comm_bytes(kind: str, ns: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> int:
    """Bytes of the full buffer of a collective: the gathered output of an all-gather, the unreduced
    input of a reduce-scatter, the buffer of the others. c10d ops list output and input buffers among
    their arguments; functional collectives return their output."""
    sizes = [_nbytes(t) for t in ins]
    if not sizes:
        return 0
    if kind in ("all_gather", "reduce_scatter"):
        if ns != "c10d":
            return max(sum(sizes), sum(_nbytes(t) for t in outs))
        return max(sizes) if len(sizes) <= 2 else sum(sizes) // 2
    if kind == "all_to_all" and ns == "c10d":
        return sum(sizes) // 2
    return sum(sizes)


def _dtensor_meta_unrecorded(rec: "StepRecorder"):
    """While ``rec`` records, DTensor's sharding propagation (the op run once on global-shaped fake
    tensors to learn its output's shape; cached, so it runs on the first occurrence only) is paused:
    it is no work of the step. Returns the function that undoes this."""
    if _DTensor is None:
        return lambda: None
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    orig = ShardingPropagator.__dict__["_propagate_tensor_meta_non_cached"]

    def propagate(self, op_schema):
        rec.paused += 1
        try:
            return orig(self, op_schema)
        finally:
            rec.paused -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate

    def undo():
        ShardingPropagator._propagate_tensor_meta_non_cached = orig

    return undo


class StepRecorder(TorchDispatchMode):
    """Records every op dispatched while active, and the live bytes of the storages ops create."""

    def __init__(self, progress=None):
        super().__init__()
        self.ops: list[Op] = []
        self.phase = "forward"
        self.paused = 0  # > 0 inside compiled graphs: their kernels are recorded by _compiled.py
        self.live = 0  # bytes of storages created during the capture and still alive
        self.peak = 0
        self.peak_by_phase: dict[str, int] = {}
        self.recording = False
        self.compiled_recording = False  # compiled graphs run outside the mode: _compiled.py records them
        self.forward_live = 0  # bytes alive when the forward ends (kept for the backward)
        self.state_bytes = 0  # optimizer state created by the step (alive in every later step)
        self._seen: weakref.WeakSet = weakref.WeakSet()
        self.largest: dict[tuple, int] = {}  # (op, phase, shape, dtype) -> bytes of the largest outputs
        self._progress = progress
        import torch.distributed as dist

        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    # -- memory: storages created by ops, counted until Python frees them --
    def _track(self, t: torch.Tensor, name: str) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass wrapper)
            return
        if st in self._seen:
            return
        n = st.nbytes()
        self._seen.add(st)
        self.live += n
        weakref.finalize(st, self._free, n)
        self.peak = max(self.peak, self.live)
        if self.live > self.peak_by_phase.get(self.phase, 0):
            self.peak_by_phase[self.phase] = self.live
        if n >= 1 << 20:
            key = (name, self.phase, tuple(t.shape), _dtype(t))
            self.largest[key] = max(self.largest.get(key, 0), n)

    def __enter__(self):
        self.recording = True
        self._unpatch = _dtensor_meta_unrecorded(self)
        return super().__enter__()

    def __exit__(self, *exc):
        self.recording = False
        self._unpatch()
        return super().__exit__(*exc)

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _DTensor is not None and not self.paused and any(isinstance(a, _DTensor)
                                                              for a in tree_leaves((args, kwargs))):
            # DTensor runs the op itself, with this mode still active: its redistributions (the implicit
            # all-gathers / reduce-scatters sharding propagation inserts) and the local op at the shard
            # shapes one rank computes on are then recorded as what they are.
            return NotImplemented
        out = func(*args, **kwargs)
        if self.paused:
            return out
        ns = func.namespace
        if ns in _SKIP_NAMESPACES:
            return out
        name = str(func)
        # A DTensor op computes on the local shards: record the shapes one rank works on. (The
        # redistributions of tensor-parallel styles run as collectives on local tensors: recorded.)
        ins = [_local(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [_local(o) for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        op = Op(name, self.phase, [(tuple(t.shape), _dtype(t)) for t in ins],
                [(tuple(t.shape), _dtype(t)) for t in outs],
                sum(_nbytes(t) for t in ins), sum(_nbytes(t) for t in outs))
        base = func._schema.name.split("::")[-1]
        if ns in ("c10d", "_c10d_functional", "c10d_functional") and base in COLLECTIVES:
            op.collective = COLLECTIVES[base]
            op.group = _group_ranks(args, kwargs, self.world)
            op.comm_bytes = _comm_bytes(op.collective, ns, ins, outs)
        elif "attention" in base:
            for k in ("is_causal", "scale", "dropout_p"):
                if k in kwargs:
                    op.args[k] = kwargs[k]
            # positional is_causal of SDPA kernels: (q, k, v, dropout_p, is_causal, ...)
            for i, arg in enumerate(func._schema.arguments):
                if arg.name in ("is_causal", "scale") and i < len(args):
                    op.args[arg.name] = args[i]
        self.ops.append(op)
        # In-place and out= ops write storages that already exist; views (a weight's transpose in every
        # linear layer) share their input's.
        if not func._schema.is_mutable and not any(r.alias_info is not None for r in func._schema.returns):
            for t in outs:
                self._track(t, name)
        if self._progress is not None:
            self._progress()
        return out

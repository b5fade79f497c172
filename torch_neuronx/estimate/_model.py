"""From one rank's captured step to the step time on a platform.

step = compute (every op at its cost, times how often the step runs it)
     + exposed communication (tensor-parallel and other blocking collectives in full; FSDP/DP/CP
       collectives only where they outlast the compute of their phase they overlap with, and never
       less than the first of them, which nothing precedes)
     + pipeline bubble ((pp - 1) micro-batch times of a stage, 1F1B/GPipe fill and drain)
     + the pipeline's point-to-point transfers in fill and drain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch_neuronx.estimate._capture import Op
from torch_neuronx.estimate._collectives import collective_seconds
from torch_neuronx.estimate._costs import fusable, fused_cost, target, trainium_op_cost
from torch_neuronx.estimate._ops import Target
from torch_neuronx.estimate._step import Capture, Plan


@dataclass
class PlatformResult:
    platform: str
    label: str
    kind: str
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_chip: float
    tokens_per_s_per_instance: float
    mfu: float
    memory_per_core_bytes: int
    memory_capacity_bytes: int
    fits: bool
    instances: int
    chips: int
    usd_per_million_tokens: float | None
    usd_per_hour: float | None
    price_source: str
    breakdown: dict[str, float] = field(default_factory=dict)
    communication: dict[str, float] = field(default_factory=dict)  # total (not only exposed) per class
    does_not_fit: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_chip": self.tokens_per_s_per_chip,
            "tokens_per_s_per_instance": self.tokens_per_s_per_instance, "mfu": self.mfu,
            "memory_per_core_bytes": self.memory_per_core_bytes,
            "memory_capacity_per_core_bytes": self.memory_capacity_bytes, "fits": self.fits,
            "usd_per_million_tokens": self.usd_per_million_tokens, "usd_per_instance_hour": self.usd_per_hour,
            "price_source": self.price_source, "instances": self.instances, "chips": self.chips,
            "breakdown": dict(self.breakdown), "communication_total_s": dict(self.communication),
            "largest_tensors_if_not_fitting": list(self.does_not_fit), "label": self.label,
        }


def collective_class(op: Op, plan: Plan) -> str:
    """tp / dp / cp / pp / other: which mesh dimension the collective's group runs along."""
    if op.collective in ("send", "recv"):
        return "pp"
    g = tuple(sorted(op.group))
    for dim in ("tp", "dp", "cp", "pp"):
        size = dict(plan.dims())[dim]
        if size > 1 and len(g) == size and len(g) > 1 and g[1] - g[0] == plan.stride(dim):
            return dim
    return "other"


OVERLAPPED = ("dp", "cp")  # FSDP prefetch / reduce-scatter behind backward, DDP buckets, ring attention


def _fuse(ops: list[Op]) -> list:
    """Ops in order, with each run of consecutive element-wise ops of one phase (views between them do
    not break a run; anything else does) replaced by the list of its ops: what a graph compiler
    (neuronx-cc, Inductor) fuses into one kernel. The optimizer is left as it runs (its own step)."""
    from torch_neuronx.estimate._ops import VIEW_OPS, base_name

    out: list = []
    run: list[Op] = []

    def flush():
        if run:
            out.append(list(run) if len(run) > 1 else run[0])
            run.clear()

    for op in ops:
        if op.phase != "optimizer" and fusable(op):
            if run and (run[-1].phase != op.phase or run[-1].count != op.count):
                flush()
            run.append(op)
        elif base_name(op.name) in VIEW_OPS and op.collective is None:
            out.append(op)
        else:
            flush()
            out.append(op)
    flush()
    return out


def evaluate(cap: Capture, plan: Plan, platform: str, dtype: str, tokens: int, instances: int | None,
             prices) -> PlatformResult:
    t: Target = target(platform)
    if t.kind == "gpu":
        from torch_neuronx.estimate._gpu import gpu_op_cost as op_cost
    else:
        op_cost = trainium_op_cost
    engines: dict[str, float] = {}
    compute_phase: dict[str, float] = {}
    comm_total: dict[str, float] = {}
    blocking = 0.0
    overlap_phase: dict[str, float] = {}
    first_overlap: dict[str, float] = {}
    pp_p2p = 0.0
    model_flops = 0.0
    optimizer = 0.0
    for op in _fuse(cap.ops) if cap.fused and t.kind != "gpu" else cap.ops:
        if isinstance(op, list):  # a fused run of element-wise ops (compiled graph)
            c = fused_cost(op, t)
            engines[c.engine] = engines.get(c.engine, 0.0) + c.seconds
            compute_phase[op[0].phase] = compute_phase.get(op[0].phase, 0.0) + c.seconds
            continue
        if op.collective is not None:
            sec, _ = collective_seconds(op.collective, op.comm_bytes, op.group, t)
            cls = collective_class(op, plan)
            comm_total[cls] = comm_total.get(cls, 0.0) + sec * op.count
            if cls == "pp":
                pp_p2p = max(pp_p2p, sec)
            elif cls in OVERLAPPED:
                overlap_phase[op.phase] = overlap_phase.get(op.phase, 0.0) + sec * op.count
                first_overlap.setdefault(op.phase, sec)
            else:
                blocking += sec * op.count
            continue
        c = op_cost(op, t, dtype)
        if c.engine == "none":
            continue
        model_flops += c.flops * op.count
        if op.phase == "optimizer":
            optimizer += c.seconds * op.count  # its own line of the breakdown
        else:
            engines[c.engine] = engines.get(c.engine, 0.0) + c.seconds * op.count
        compute_phase[op.phase] = compute_phase.get(op.phase, 0.0) + c.seconds * op.count
    compute = sum(engines.values()) + optimizer
    hidden_comm = 0.0
    for phase, ov in overlap_phase.items():
        hidden_comm += max(ov - compute_phase.get(phase, 0.0), first_overlap.get(phase, 0.0), 0.0)
    exposed = blocking + hidden_comm
    bubble = 0.0
    p2p_exposed = 0.0
    if plan.pp > 1:
        stage_work = compute - optimizer + exposed
        per_micro = stage_work / max(1, cap.micro_steps)
        bubble = (plan.pp - 1) * per_micro
        # Activations forward and gradients backward: hidden behind compute in the steady state,
        # exposed while the pipeline fills and drains.
        p2p_exposed = 2 * (plan.pp - 1) * pp_p2p
    step = compute + exposed + bubble + p2p_exposed
    step = max(step, 1e-12)

    breakdown = {f"{k}_engine_s" if k != "dma" else "dma_s": v for k, v in sorted(engines.items())}
    breakdown.update({"exposed_communication_s": exposed + p2p_exposed, "pipeline_bubble_s": bubble,
                      "optimizer_s": optimizer})
    ranks = plan.world
    chips = math.ceil(ranks / t.ranks_per_chip)
    need = math.ceil(chips / t.chips_per_instance)
    inst = max(need, instances or 0)
    mem = cap.peak_bytes
    fits = mem <= t.hbm_capacity
    largest = [] if fits else [f"{d}: {b / 2**30:.2f} GiB" for d, b in cap.largest[:5]]
    price = prices.lookup(platform, t.instance) if prices is not None else None
    usd = None
    if price is not None:
        usd = price.usd_per_hour * inst * step / 3600 / tokens * 1e6
    return PlatformResult(
        platform=platform, label=t.label, kind=t.kind, step_time_s=step, tokens_per_s=tokens / step,
        tokens_per_s_per_chip=tokens / step / chips, tokens_per_s_per_instance=tokens / step / inst,
        mfu=model_flops / (step * t.peak_flops(dtype)), memory_per_core_bytes=int(mem),
        memory_capacity_bytes=int(t.hbm_capacity), fits=fits, instances=inst, chips=chips,
        usd_per_million_tokens=usd, usd_per_hour=price.usd_per_hour if price else None,
        price_source=price.describe() if price else "no price for this instance in the price table",
        breakdown=breakdown, communication=comm_total, does_not_fit=largest)

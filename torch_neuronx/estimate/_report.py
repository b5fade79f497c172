"""The estimate as a report: side-by-side text per platform, JSON, a PNG plot and a Chrome trace."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from torch_neuronx.estimate._capture import Op
from torch_neuronx.estimate._errors import EstimateError
from torch_neuronx.estimate._model import PlatformResult
from torch_neuronx.estimate._step import Capture, Plan


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _fmt_b(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def _fmt_n(x: float) -> str:
    for unit, size in (("M", 1e6), ("K", 1e3)):
        if x >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


NOT_MODELLED = [
    "host time: Python and framework overhead, kernel launch, data loading",
    "contention between engines and DMA for HBM bandwidth and SBUF capacity across ops (each op is costed alone)",
    "fusion across eager ops (only in compiled mode, as Inductor fuses them)",
    "the TensorE power-throttle ramp between ops (inside a kernel the engine model applies it)",
    "NeuronLink/EFA congestion from other jobs; collective algorithms other than ring and halving/doubling",
    "compiler (neuronx-cc) scheduling: the estimate is of our NKI kernels and the eager/Inductor op sequence",
]


@dataclass
class Estimate:
    model: str
    task: str
    plan: Plan
    dtype: str
    mode: str
    compiled: bool
    capture: Capture
    results: dict[str, PlatformResult]
    prices: object
    settings: dict = field(default_factory=dict)

    # -- what the estimate assumed and left out --
    def assumptions(self) -> list[str]:
        a = [
            f"one rank traced ({'fake tensors, full size' if self.mode == 'full' else 'on neuron, at the size given'}"
            f"{(', compiled: element-wise ops fused' if self.mode == 'full' else ', torch.compile: Inductor fused kernels costed') if self.compiled else ', eager aten ops costed'}); "
            f"ranks = tp x pp x dp x cp = {self.plan.world}, laid out tp innermost",
            "matmuls, attention, norms and softmax: the engine model of the shipped NKI kernels at each op's shape "
            "(torch_neuronx.estimate._kernels.kernel_time), split evenly over the physical cores of a logical core "
            "(LNC=2 on trn2/trn3)",
            "element-wise ops and reductions: the engine model's fixed time and time per element of a streaming "
            "NKI kernel (DMA in, one VectorE/ScalarE instruction, DMA out) for the op's engine and dtype; copies: "
            "DMA/HBM traffic",
            "collectives: ring or halving/doubling (the cheaper), bandwidth of the slowest hop (cores of a chip, "
            "NeuronLink, EFA) shared by every rank using it; per-step latencies are assumed (AWS publishes none): "
            + "; ".join(self._latencies()),
            "tensor-parallel collectives block (no async TP); FSDP all-gathers/reduce-scatters and DDP all-reduces "
            "overlap the compute of their phase",
            "memory: parameters, gradients, optimizer state (AdamW) and the activations alive at the traced peak; "
            "no allocator fragmentation, no runtime reserve",
            "mfu: FLOPs of the matmuls and attention that run (recompute included) over the dense peak of the "
            "ranks' cores for the dtype",
            "GPU comparators (h100/h200) use a simpler model: matmuls and attention at the dense peak, everything "
            "else at HBM bandwidth",
        ] + list(self.capture.assumptions)
        return a

    def to_json(self) -> dict:
        return {
            "model": self.model, "task": self.task, "mode": self.mode, "compiled": self.compiled, "dtype": self.dtype,
            "plan": {"tp": self.plan.tp, "pp": self.plan.pp, "dp": self.plan.dp, "cp": self.plan.cp,
                     "ep": self.plan.ep, "fsdp": self.plan.fsdp, "sp": self.capture.sp, "ranks": self.plan.world},
            "settings": dict(self.settings), "tokens_per_step": self.capture.tokens,
            "parameters": self.capture.param_count, "micro_batches_per_step": self.capture.micro_steps,
            "platforms": {n: r.to_json() for n, r in self.results.items()},
            "assumptions": self.assumptions(), "not_modelled": self._not_modelled(),
            "prices_file": self.prices.path,
        }

    def _latencies(self) -> list[str]:
        from torch_neuronx.estimate._costs import target

        out = []
        for n in self.results:
            t = target(n)
            out.append(f"{n} {t.link_latency * 1e6:g} us per step within an instance, "
                       f"{t.efa_latency * 1e6:g} us over EFA")
        return out

    def _not_modelled(self) -> list[str]:
        return list(NOT_MODELLED)

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=2)

    def __str__(self) -> str:
        p = self.plan
        lines = [f"torch_neuronx.estimate: {self.model}",
                 f"  task {self.task}, dtype {self.dtype}, tp {p.tp}{' (sequence parallel)' if self.capture.sp else ''}"
                 f" x pp {p.pp} x dp {p.dp} x cp {p.cp}{' (FSDP2)' if p.fsdp else ''}{f', ep {p.ep}' if p.ep > 1 else ''} = {p.world} ranks; "
                 f"{_fmt_n(self.capture.tokens)} tokens per step"
                 + (f", {self.capture.micro_steps} micro-batches per step" if self.capture.micro_steps > 1 else ""),
                 ""]
        cols = list(self.results.values())
        rows: list[tuple[str, ...]] = [("", *[r.platform + (" *" if r.kind == "gpu" else "") for r in cols])]

        def row(label, fn):
            rows.append((label, *[fn(r) for r in cols]))

        row("instances x chips", lambda r: f"{r.instances} x {r.chips // max(1, r.instances) or r.chips}"
            if r.instances else "-")
        row("step time", lambda r: _fmt_s(r.step_time_s))
        keys = []
        for r in cols:
            for k in r.breakdown:
                if k not in keys:
                    keys.append(k)
        for k in keys:
            row("  " + k.replace("_s", "").replace("_", " "), lambda r, k=k: _fmt_s(r.breakdown.get(k, 0.0)))
        row("tokens/s", lambda r: _fmt_n(r.tokens_per_s))
        row("tokens/s per chip", lambda r: _fmt_n(r.tokens_per_s_per_chip))
        row("tokens/s per instance", lambda r: _fmt_n(r.tokens_per_s_per_instance))
        row("MFU", lambda r: f"{100 * r.mfu:.1f}%")
        row("memory per core", lambda r: _fmt_b(r.memory_per_core_bytes))
        row("HBM per core", lambda r: _fmt_b(r.memory_capacity_bytes))
        row("fits", lambda r: "yes" if r.fits else "NO")
        row("$ per 1M tokens", lambda r: f"${r.usd_per_million_tokens:.3g}" if r.usd_per_million_tokens is not None
            else "no price")
        widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
        for i, rr in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                                          for j, (c, w) in enumerate(zip(rr, widths))).rstrip())
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        if any(r.kind == "gpu" for r in cols):
            lines.append("  * GPU comparator: a simpler model (dense peak FLOPs, HBM bandwidth), not the engine model")
        for r in cols:
            if not r.fits:
                lines.append(f"  {r.platform}: does not fit: {_fmt_b(r.memory_per_core_bytes)} per core > "
                             f"{_fmt_b(r.memory_capacity_bytes)}; largest tensors:")
                lines += [f"    {d}" for d in r.does_not_fit]
        lines += ["", "prices:"]
        lines += [f"  {r.platform}: {r.price_source}" for r in cols]
        lines += ["", "assumptions:"] + [f"  - {a}" for a in self.assumptions()]
        lines += ["", "not modelled:"] + [f"  - {a}" for a in self._not_modelled()]
        return "\n".join(lines)

    # -- a PNG: stacked step-time bars per platform, and $ per 1M tokens --
    def plot(self, path: str) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise EstimateError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None
        cols = list(self.results.values())
        keys = sorted({k for r in cols for k in r.breakdown})
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(4 + 1.6 * len(cols), 4.5))
        names = [r.platform for r in cols]
        bottom = [0.0] * len(cols)
        for k in keys:
            vals = [r.breakdown.get(k, 0.0) for r in cols]
            ax1.bar(names, vals, bottom=bottom, label=k.replace("_s", "").replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax1.set_ylabel("seconds per step")
        ax1.set_title("step time")
        ax1.legend(fontsize=7)
        usd = [r.usd_per_million_tokens or 0.0 for r in cols]
        ax2.bar(names, usd, color="tab:green")
        ax2.set_ylabel("USD per 1M tokens")
        ax2.set_title("$ per 1M tokens (0: no price)")
        fig.suptitle(f"{self.model}: {self.task}, {self.plan.world} ranks (estimate)", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    # -- a Chrome/Perfetto trace of one rank's step on the first platform --
    def to_trace(self, path: str, platform: str | None = None) -> None:
        from torch_neuronx.estimate._collectives import collective_seconds
        from torch_neuronx.estimate._costs import target, trainium_op_cost
        from torch_neuronx.estimate._gpu import gpu_op_cost

        name = platform or next(iter(self.results))
        t = target(name)
        cost = gpu_op_cost if t.kind == "gpu" else trainium_op_cost
        events = []
        tids = {}
        now = 0.0
        for op in self.capture.ops:
            if op.count <= 0:
                continue  # layer replication weights: the trace shows the traced ops once
            if op.collective is not None:
                sec, where = collective_seconds(op.collective, op.comm_bytes, op.group, t)
                track = f"cc ({where})"
                start = now
            else:
                c = cost(op, t, self.dtype)
                if c.engine == "none":
                    continue
                sec, track, start = c.seconds, c.engine, now
                now += sec * 1e6
            tid = tids.setdefault(track, len(tids) + 1)
            events.append({"name": op.name, "ph": "X", "ts": start, "dur": sec * 1e6, "pid": 1, "tid": tid,
                           "args": {"phase": op.phase, "inputs": str([s for s, _ in op.inputs][:4]),
                                    "count": op.count}})
        meta = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}}
                for track, tid in tids.items()]
        meta.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"{name} rank 0 (estimate)"}})
        with open(path, "w") as f:
            json.dump({"traceEvents": meta + events, "displayTimeUnit": "ms"}, f)


__all__ = ["Estimate", "Op"]

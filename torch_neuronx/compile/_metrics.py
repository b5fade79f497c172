"""``torch.neuron.get_dynamo_metrics()`` / ``reset_dynamo_metrics()``.

Dynamo records one ``CompilationMetrics`` per frame compilation and keeps counters of graph
breaks and cache lookups; this module accumulates the former (Dynamo keeps only the last 64)
and reports the latter relative to the last reset, for every ``torch.compile`` in the process.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading



@dataclasses.dataclass
class GraphCompileMetrics:
    """One frame compilation (forward) or one compiled backward."""

    compile_id: str
    co_name: str | None
    co_filename: str | None
    is_forward: bool
    graph_node_count: int | None
    graph_op_count: int | None
    recompile_reason: str | None
    compile_time_s: float
    fail_type: str | None
    fail_reason: str | None

    @property
    def graph_name(self) -> str:
        return f"{self.co_name}_{self.compile_id}" + ("" if self.is_forward else "_backward")


class DynamoMetrics(list):
    """The compilations since the last reset (a list of :class:`GraphCompileMetrics`, in order),
    with totals as attributes."""

    compiles: int  # forward frame compilations that produced a graph
    recompiles: int  # of those, compilations of an already compiled frame
    recompile_reasons: list[str]
    graph_breaks: int
    graph_break_reasons: dict[str, int]
    backward_compiles: int
    failures: int
    cache_hits: int  # Inductor FX-graph cache + AOTAutograd cache
    cache_misses: int
    fx_graph_cache_hits: int
    fx_graph_cache_misses: int
    aot_autograd_cache_hits: int
    aot_autograd_cache_misses: int
    compile_time_s: float

    def as_dict(self) -> dict:
        keys = [k for k in DynamoMetrics.__annotations__]
        d = {k: getattr(self, k) for k in keys}
        d["graphs"] = [dataclasses.asdict(g) | {"graph_name": g.graph_name} for g in self]
        return d

    def __repr__(self) -> str:
        return (
            f"DynamoMetrics(compiles={self.compiles}, recompiles={self.recompiles}, "
            f"graph_breaks={self.graph_breaks}, cache_hits={self.cache_hits}, "
            f"cache_misses={self.cache_misses}, compile_time_s={self.compile_time_s:.3f})"
        )


_lock = threading.Lock()
_records: list[GraphCompileMetrics] = []
_baseline: dict[str, collections.Counter] = {}


def _record(metrics) -> None:
    if metrics.is_runtime:
        return
    # Frames Dynamo skipped (nothing to compile) carry no graph: they are not compilations.
    if metrics.is_forward is not False and not metrics.graph_op_count and not metrics.fail_type:
        return
    fwd = metrics.is_forward is not False
    t = metrics.entire_frame_compile_time_s if fwd else None
    if t is None:
        us = metrics.duration_us or 0
        t = us / 1e6
    rec = GraphCompileMetrics(
        compile_id=str(metrics.compile_id),
        co_name=metrics.co_name,
        co_filename=metrics.co_filename,
        is_forward=fwd,
        graph_node_count=metrics.graph_node_count,
        graph_op_count=metrics.graph_op_count,
        recompile_reason=metrics.recompile_reason if fwd else None,
        compile_time_s=float(t or 0.0),
        fail_type=metrics.fail_type,
        fail_reason=metrics.fail_reason,
    )
    with _lock:
        _records.append(rec)


def _dynamo_utils():
    # Imported lazily: this module is loaded by an import hook of torch._dynamo.utils itself.
    import importlib

    return importlib.import_module("torch._dynamo.utils")


def install() -> None:
    """Wrap Dynamo's recorder (torch 2.13: ``record_compilation_metrics`` is looked up at call time)."""
    dynamo_utils = _dynamo_utils()
    orig = dynamo_utils.record_compilation_metrics
    if getattr(orig, "_neuron_wrapped", False):
        return

    @functools.wraps(orig)
    def record_compilation_metrics(*args, **kwargs):
        last = dynamo_utils._compilation_metrics[-1] if dynamo_utils._compilation_metrics else None
        orig(*args, **kwargs)
        new = dynamo_utils._compilation_metrics[-1] if dynamo_utils._compilation_metrics else None
        if new is not None and new is not last:
            _record(new)

    record_compilation_metrics._neuron_wrapped = True
    dynamo_utils.record_compilation_metrics = record_compilation_metrics


def _counter(group: str) -> collections.Counter:
    dynamo_utils = _dynamo_utils()
    now = collections.Counter(dynamo_utils.counters.get(group, {}))
    now.subtract(_baseline.get(group, collections.Counter()))
    return +now  # drops zero and negative entries


def get_dynamo_metrics() -> DynamoMetrics:
    """Compilations, recompilations (with reasons), graph breaks (with reasons), cache hits and
    misses, and compile time since the last :func:`reset_dynamo_metrics`."""
    with _lock:
        records = list(_records)
    out = DynamoMetrics(records)
    fwd = [r for r in records if r.is_forward and not r.fail_type]
    out.compiles = len(fwd)
    out.recompile_reasons = [r.recompile_reason for r in fwd if r.recompile_reason]
    out.recompiles = len(out.recompile_reasons)
    out.backward_compiles = sum(1 for r in records if not r.is_forward)
    out.failures = sum(1 for r in records if r.fail_type)
    breaks = _counter("graph_break")
    out.graph_break_reasons = dict(breaks)
    out.graph_breaks = sum(breaks.values())
    inductor, aot = _counter("inductor"), _counter("aot_autograd")
    out.fx_graph_cache_hits = inductor["fxgraph_cache_hit"]
    out.fx_graph_cache_misses = inductor["fxgraph_cache_miss"]
    out.aot_autograd_cache_hits = aot["autograd_cache_hit"]
    out.aot_autograd_cache_misses = aot["autograd_cache_miss"]
    out.cache_hits = out.fx_graph_cache_hits + out.aot_autograd_cache_hits
    out.cache_misses = out.fx_graph_cache_misses + out.aot_autograd_cache_misses
    out.compile_time_s = sum(r.compile_time_s for r in records)
    return out


def reset_dynamo_metrics() -> None:
    global _baseline
    dynamo_utils = _dynamo_utils()
    with _lock:
        _records.clear()
        _baseline = {g: collections.Counter(dynamo_utils.counters.get(g, {})) for g in ("graph_break", "inductor", "aot_autograd")}

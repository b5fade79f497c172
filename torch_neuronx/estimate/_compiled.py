"""Compiled mode: cost the kernels Inductor generates, not the eager ops.

While active, every graph Inductor compiles keeps the list of its fused kernels (scheduler nodes:
bytes read and written, elements), and each run of a compiled graph adds those kernels to the
recorder. Kernels Inductor leaves to ATen (matmuls, attention: "extern kernels") reach the recorder
through the dispatcher as ordinary ops. Caches are off so every graph is scheduled here.
"""

from __future__ import annotations

import contextlib

from torch_neuronx.estimate._capture import Op


def _int(x, default: int = 0) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        try:
            from torch._inductor.virtualized import V

            return int(V.graph.sizevars.size_hint(x))
        except Exception:  # noqa: BLE001 - symbolic sizes without a hint
            return default


def _kernels(scheduler) -> list[dict]:
    out = []
    for node in scheduler.nodes:
        if node.is_extern() or getattr(node, "is_template", lambda: False)():
            continue  # runs as an ATen op: the dispatcher records it
        nodes = node.get_nodes()
        try:
            nbytes = _int(node.get_read_write_buffers_sizes())
        except Exception:  # noqa: BLE001 - a node kind without the estimate
            continue
        elems = 0
        reduction = False
        for n in nodes:
            try:
                group = n.group[1]
                e = 1
                for g in group:
                    e *= _int(g, 1)
                elems = max(elems, e)
                reduction = reduction or n.is_reduction()
            except Exception:  # noqa: BLE001
                continue
        if nbytes or elems:
            out.append({"name": node.get_name(), "bytes": nbytes, "elements": elems,
                        "kind": "reduction" if reduction else "pointwise", "fused": len(nodes)})
    return out


@contextlib.contextmanager
def inductor_kernels(recorder):
    """Hooks Inductor for the duration: compiled graphs record their fused kernels into ``recorder``."""
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as icfg
    from torch._inductor import output_code, scheduler

    pending: list[list[dict]] = []
    orig_codegen = scheduler.Scheduler.codegen
    orig_compile = cfx.fx_codegen_and_compile
    orig_call = output_code.CompiledFxGraph.__call__

    def codegen(self, *a, **k):
        pending.append(_kernels(self))
        return orig_codegen(self, *a, **k)

    def compile_(*a, **k):
        start = len(pending)
        graph = orig_compile(*a, **k)
        kernels = [x for lst in pending[start:] for x in lst]
        del pending[start:]
        try:
            graph._neuron_estimate_kernels = kernels
        except AttributeError:
            pass
        return graph

    def call(self, inputs):
        for k in getattr(self, "_neuron_estimate_kernels", ()) if recorder.recording else ():
            recorder.ops.append(Op("inductor." + k["kind"], recorder.phase, [], [], k["bytes"], 0,
                                   args={"elements": k["elements"], "kernel": k["name"], "fused": k["fused"]}))
        return orig_call(self, inputs)

    scheduler.Scheduler.codegen = codegen
    cfx.fx_codegen_and_compile = compile_
    output_code.CompiledFxGraph.__call__ = call
    try:
        with icfg.patch(force_disable_caches=True):
            yield
    finally:
        scheduler.Scheduler.codegen = orig_codegen
        cfx.fx_codegen_and_compile = orig_compile
        output_code.CompiledFxGraph.__call__ = orig_call

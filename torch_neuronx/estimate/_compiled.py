"""Compiled mode: cost the kernels Inductor generates, not the eager ops.

While active, every graph Inductor compiles keeps the list of its kernels (scheduler nodes: fused
kernels with the bytes they read and write and their elements; extern kernels — matmuls, attention,
ATen fallbacks — as aten ops with their input shapes), and each run of a compiled graph adds them to
the recorder. Dynamo runs nothing compiled while a dispatch mode is active, so compiled graphs run
outside the recorder (ops outside them, e.g. an eager optimizer step, are recorded as usual). Caches
are off so every graph is scheduled here.
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


def _extern(node) -> dict | None:
    """An extern kernel (matmul, attention, any ATen fallback) as an aten op with its input shapes."""
    ir = node.node
    op = getattr(ir, "op_overload", None)
    name = str(op) if op is not None else ""
    if not name:
        kernel = (getattr(ir, "python_kernel_name", None) or "").split(".")[-1]
        if not kernel:
            return None
        name = f"aten.{kernel}.default"
    inputs = []
    for inp in getattr(ir, "inputs", ()):
        try:
            inputs.append((tuple(_int(d, 1) for d in inp.get_size()), str(inp.get_dtype()).replace("torch.", "")))
        except Exception:  # noqa: BLE001 - a non-tensor input
            continue
    try:
        outputs = [(tuple(_int(d, 1) for d in ir.get_size()), str(ir.get_dtype()).replace("torch.", ""))]
    except Exception:  # noqa: BLE001 - a multi-output kernel
        outputs = []
    args = {}
    kwargs = getattr(ir, "kwargs", None) or {}
    if "is_causal" in kwargs:
        args["is_causal"] = bool(kwargs["is_causal"])
    elif "attention" in name:
        bools = [a for a in getattr(ir, "constant_args", ()) if isinstance(a, bool)]
        args["is_causal"] = bools[0] if bools else False
    return {"kind": "extern", "name": name, "inputs": inputs, "outputs": outputs, "args": args}


def _kernels(scheduler) -> list[dict]:
    out = []
    for node in scheduler.nodes:
        if node.is_extern() or getattr(node, "is_template", lambda: False)():
            k = _extern(node)
            if k is not None:
                out.append(k)
            continue
        nodes = node.get_nodes()
        try:
            nbytes = _int(node.get_read_write_buffers_sizes())
        except Exception:  # noqa: BLE001 - a node kind without the estimate
            continue
        elems = 0
        reduction = False
        for n in nodes:
            try:
                e = 1
                for g in n.group[1]:
                    e *= _int(g, 1)
                elems = max(elems, e)
                reduction = reduction or n.is_reduction()
            except Exception:  # noqa: BLE001
                continue
        if nbytes or elems:
            out.append({"name": node.get_name(), "bytes": nbytes, "elements": elems,
                        "kind": "reduction" if reduction else "pointwise", "fused": len(nodes)})
    return out


def _op(k: dict, phase: str) -> Op:
    import math

    import torch

    if k["kind"] == "extern":
        def nbytes(shapes):
            return sum(math.prod(s) * getattr(torch, dt, torch.float32).itemsize for s, dt in shapes)

        return Op(k["name"], phase, list(k["inputs"]), list(k["outputs"]), nbytes(k["inputs"]), nbytes(k["outputs"]),
                  args=dict(k["args"]))
    return Op("inductor." + k["kind"], phase, [], [], k["bytes"], 0,
              args={"elements": k["elements"], "kernel": k["name"], "fused": k["fused"]})


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
        for k in getattr(self, "_neuron_estimate_kernels", ()) if recorder.compiled_recording else ():
            recorder.ops.append(_op(k, recorder.phase))
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

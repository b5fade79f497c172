"""The ``"neuron"`` backend of ``torch.compile``: Dynamo's graph -> the neuron FX pass stage
(run by Inductor after AOTAutograd, see ``_passes``) -> Inductor's C++ code generator for the
device.

    torch.compile(model, backend="neuron", options={"fallback_execution": True})
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from torch_neuronx.compile._env import env_flag

MODES: dict[str, dict[str, Any]] = {
    # What each mode means on neuron (docs/compile.md). There are no CUDA graphs: the overhead
    # left per call is the wrapper's, so "reduce-overhead" drops its per-call input checks
    # (Dynamo's guards already check shapes and strides).
    "default": {},
    "reduce-overhead": {"size_asserts": False, "alignment_asserts": False},
    "max-autotune": {"max_autotune": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}

# Options of the neuron backend itself; any Inductor option (torch._inductor.list_options())
# is also accepted and passed through.
NEURON_OPTIONS: dict[str, str] = {
    "fallback_execution": "bool: on a compile failure, warn and run the graph eagerly "
    "(default: TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 turns it on)",
    "model_name": "str: name used for saved artifacts and in error messages",
}


class NeuronCompileError(RuntimeError):
    """A graph failed to compile for neuron; the message names the failing node and op."""


def _inductor_options() -> list[str]:
    import torch._inductor

    return sorted(torch._inductor.list_options())


def validate(mode: str | None, options: dict | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(neuron options, Inductor config patches) for ``mode`` / ``options``; raises ValueError."""
    mode = mode or "default"
    if mode not in MODES:
        raise ValueError(
            f"torch.compile(backend='neuron'): unknown mode {mode!r}; valid modes are "
            + ", ".join(repr(m) for m in MODES)
        )
    options = dict(options or {})
    neuron = {k: options.pop(k) for k in list(options) if k in NEURON_OPTIONS}
    valid = _inductor_options()
    unknown = sorted(k for k in options if k not in valid)
    if unknown:
        raise ValueError(
            f"torch.compile(backend='neuron'): unknown option(s) {', '.join(map(repr, unknown))}. "
            f"Valid options: the neuron backend's {', '.join(map(repr, NEURON_OPTIONS))}, and any "
            f"Inductor option (torch._inductor.list_options(), e.g. 'max_autotune', 'epilogue_fusion', "
            f"'cpp.threads')."
        )
    if options.get("cpp_wrapper"):
        raise ValueError(
            "torch.compile(backend='neuron'): option 'cpp_wrapper' is not supported on neuron "
            "(the C++ wrapper has no C shims for the device); leave it off"
        )
    if "fallback_execution" in neuron and not isinstance(neuron["fallback_execution"], bool):
        raise ValueError("torch.compile(backend='neuron'): option 'fallback_execution' must be a bool")
    if "model_name" in neuron and not isinstance(neuron["model_name"], str):
        raise ValueError("torch.compile(backend='neuron'): option 'model_name' must be a str")
    neuron.setdefault("fallback_execution", not env_flag("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", True))
    return neuron, {**MODES[mode], **options}


def _failing_node(exc: BaseException) -> str:
    """"node 'x' (aten.op), from <user line>" for the node Inductor was lowering when it failed.

    Inductor's interpreter holds the failing ATen node in ``run_node``'s frame; its
    ``source_fn_stack`` names the node of the user's (Dynamo) graph it came from.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        tb = e.__traceback__
        node = None
        while tb is not None:
            f = tb.tb_frame
            if f.f_code.co_name == "run_node" and isinstance(f.f_locals.get("n"), torch.fx.Node):
                node = f.f_locals["n"]
            tb = tb.tb_next
        if node is not None and node.op == "call_function":
            src = node.meta.get("source_fn_stack") or []
            name = src[-1][0] if src else node.name
            where = f"node '{name}' ({node.target})"
            trace = [
                ln for ln in (node.meta.get("stack_trace") or "").strip().splitlines()
                if ln.strip() and set(ln.strip()) - set("^~")
            ]
            if len(trace) >= 2:
                where += f", from {trace[-2].strip()}: {trace[-1].strip()}"
            return where
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return ""


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: list, mode: str | None = None,
                   options: dict | None = None) -> Callable:
    """Dynamo backend: compile ``gm`` with Inductor for the neuron device."""
    from torch._inductor.compile_fx import compile_fx

    from torch_neuronx.compile import _artifacts

    neuron_opts, patches = validate(mode, options)
    name = neuron_opts.get("model_name") or gm.__class__.__name__
    patches = {**_artifacts.save_fx_graph(gm, name), **patches}
    from torch._dynamo.exc import RestartAnalysis, SkipFrame, exceptions_allowed_to_be_fallback

    import torch._functorch.config as functorch_config

    try:
        # The backward graph is compiled here too, not at the first backward(): a failure in
        # it is then reported (or falls back) like any other.
        with functorch_config.patch(force_non_lazy_backward_lowering=True):
            return compile_fx(gm, example_inputs, config_patches=patches)
    except (RestartAnalysis, SkipFrame):
        raise  # Dynamo's own control flow (e.g. retrace with a scalar as a tensor), not failures
    except exceptions_allowed_to_be_fallback:
        # Data-dependent shapes met while tracing the backward (e.g. nonzero for a boolean index):
        # Dynamo graph-breaks around them, as it does for Inductor, instead of failing the compile.
        raise
    except Exception as e:
        where = _failing_node(e)
        msg = (
            f"neuron backend: compiling graph of {name!r} failed"
            + (f" at {where}" if where else "")
            + f": {type(e).__name__}: {e}"
        )
        if not neuron_opts["fallback_execution"]:
            raise NeuronCompileError(
                msg + "\nSet TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 (or options={'fallback_execution': True}) "
                "to run such graphs eagerly instead."
            ) from e
        warnings.warn(msg + "\nRunning this graph eagerly on neuron instead.", stacklevel=2)
        return gm.forward


def register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "neuron" not in _COMPILER_FNS:
        register_backend(neuron_backend, name="neuron")

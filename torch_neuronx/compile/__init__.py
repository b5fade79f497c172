"""``torch.compile`` on ``neuron``: Dynamo's device interface, Inductor code generation for the
device, and the ``"neuron"`` backend.

Importing torch._dynamo costs about two seconds, so nothing here is imported with
torch_neuronx: `register()` installs import hooks that register the device with Dynamo and
Inductor the moment those load (which ``torch.compile`` does), or at once if they already have.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable

# module that must finish loading -> what registers neuron with it
_HOOKS: dict[str, str] = {
    "torch._dynamo.device_interface": "torch_neuronx.compile._device_interface:register",
    "torch._dynamo.utils": "torch_neuronx.compile._metrics:install",
    "torch._dynamo": "torch_neuronx.compile._device_interface:_register_constant_queries",
    # Also an entry point (torch_dynamo_backends); registering here covers source checkouts.
    "torch._dynamo.backends.registry": "torch_neuronx.compile._backend:register",
    "torch._inductor.compile_fx": "torch_neuronx.compile._inductor:register",
    # FlexAttention: the public API's device check, the HOPs' autocast rule, the Inductor lowering.
    "torch.nn.attention.flex_attention": "torch_neuronx.compile._flex_attention:patch_api",
    "torch._higher_order_ops.flex_attention": "torch_neuronx.compile._flex_attention:register_autocast",
    "torch._inductor.kernel.flex.flex_attention": "torch_neuronx.compile._flex_attention:register_inductor",
}
_lock = threading.Lock()
_done: set[str] = set()


def _run_hook(module_name: str) -> None:
    with _lock:
        if module_name in _done:
            return
        _done.add(module_name)
    target_mod, fn = _HOOKS[module_name].split(":")
    getattr(importlib.import_module(target_mod), fn)()


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs a registration right after a hooked torch module has executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _HOOKS or fullname in _done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module: Callable = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _run_hook(fullname)

        spec.loader.exec_module = exec_and_register
        return spec


_finder = _PostImportFinder()


def register() -> None:
    """Called from torch_neuronx's device registration."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in _HOOKS:
        if name in sys.modules:
            _run_hook(name)


def __getattr__(name: str):
    # The backend and metrics import torch._dynamo: load them on first use.
    if name in ("neuron_backend", "get_dynamo_metrics", "reset_dynamo_metrics", "register_fx_pass"):
        from torch_neuronx.compile import _backend, _metrics, _passes

        for mod in (_backend, _metrics, _passes):
            if hasattr(mod, name):
                globals()[name] = getattr(mod, name)
                return globals()[name]
    raise AttributeError(f"module 'torch_neuronx.compile' has no attribute {name!r}")

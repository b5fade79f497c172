"""torch-neuronx: AWS Trainium as a native PyTorch device, ``neuron``.

The device is a NeuronCore simulator: device memory is host memory owned by a C++
runtime, and every op runs ATen's CPU kernels directly on that memory. Importing this
package (or letting torch autoload it) registers the device:

    >>> import torch
    >>> x = torch.randn(2, 2, device="neuron")
"""

from __future__ import annotations


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group, called by torch at import time.

    Importing this module registers the device. Defined before ``import torch`` because
    ``import torch_neuronx`` first makes torch call this on a partially imported module.
    """
    if "_register" in globals():
        _register()


import torch  # noqa: E402

__version__ = "0.1.0"


def _check_torch_version() -> None:
    # Refuse before loading the extension: a libtorch ABI mismatch would otherwise
    # surface as an undefined symbol or a crash.
    try:
        from torch_neuronx import _build_info
    except ImportError as e:  # pragma: no cover - only in a broken source checkout
        raise ImportError(
            "torch_neuronx is not built: run `make build` (or `pip install --no-build-isolation -e .`)."
        ) from e
    built = _build_info.torch_version.split("+")[0]
    installed = torch.__version__.split("+")[0]
    if built != installed:
        raise ImportError(
            f"torch_neuronx was built against torch {built}, but torch {installed} is installed. "
            f"Install torch=={built} (pip install torch=={built}), or rebuild torch_neuronx against "
            f"the installed torch (pip install --no-build-isolation --force-reinstall -e .)."
        )


_check_torch_version()

from torch_neuronx import _C  # noqa: E402


def _share_thread_pool() -> None:
    # The NKI core (nki._core, which links no torch) runs large tiles on torch's intra-op pool:
    # one pool per process. Imported after this, nki._core takes the pool itself.
    import sys

    nki_core = sys.modules.get("nki._core")
    if nki_core is not None:
        nki_core.set_parallel_for(_C._parallel_for)


_share_thread_pool()

_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from torch_neuronx import neuron as _neuron_module

    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", _neuron_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    from torch_neuronx import (
        _device_defaults, _multiprocessing, _safetensors, _torchao, _transformers, compile, distributed,
    )

    _device_defaults.register()
    compile.register()
    distributed.register()
    _multiprocessing.register()
    _safetensors.register()
    _torchao.register()
    _transformers.register()
    import atexit

    atexit.register(_neuron_module._drain_autograd_workers)
    _registered = True


_register()

from torch_neuronx.neuron import (  # noqa: E402
    clear_op_tracking,
    get_executed_ops,
    get_fallback_ops,
    get_fallback_policy,
    set_fallback_policy,
)


def __getattr__(name: str):
    # check_model is imported on first use: torch imports this package on every `import torch`,
    # and importing torch_neuronx.check here would also make `python -m torch_neuronx.check`
    # run a module that is already imported (runpy's RuntimeWarning).
    if name in ("nki_op", "wrap_nki"):  # loaded on first use: NKI is not needed to use the device
        from torch_neuronx import _nki

        globals()[name] = getattr(_nki, name)
        return globals()[name]
    if name == "nki":
        import nki

        globals()["nki"] = nki
        return nki
    if name == "estimate":  # the package is callable: torch_neuronx.estimate(model, inputs, ...)
        import importlib

        return importlib.import_module("torch_neuronx.estimate")
    if name == "check_model":
        from torch_neuronx.check import check_model

        globals()["check_model"] = check_model
        return check_model
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")


__all__ = [
    "__version__",
    "check_model",
    "clear_op_tracking",
    "estimate",
    "get_executed_ops",
    "get_fallback_ops",
    "get_fallback_policy",
    "nki",
    "nki_op",
    "set_fallback_policy",
    "wrap_nki",
]

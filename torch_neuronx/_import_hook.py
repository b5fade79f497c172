"""Patching libraries that load after torch_neuronx: ``on_import(name, patch)`` calls
``patch(module)`` when module ``name`` finishes executing (an import hook on ``sys.meta_path``),
or at once when it is already imported. One hook serves every library we adapt."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable

_PATCHES: dict[str, list[Callable]] = {}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):  # get_filename, is_package, get_resource_reader, ...
        if name == "_inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        for patch in _PATCHES.get(module.__name__, ()):
            patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def on_import(name: str, patch: Callable) -> None:
    """Calls ``patch(module)`` once module ``name`` is imported (now, if it already is). Patches
    must be idempotent: registering again is a no-op, but a module may be reloaded."""
    patches = _PATCHES.setdefault(name, [])
    if patch in patches:
        return
    patches.append(patch)
    if name in sys.modules:
        patch(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())

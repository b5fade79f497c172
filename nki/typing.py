"""``nki.typing``: shape annotations for kernel parameters (``x: nt.tensor[128, 512]``).
Annotations document the expected shape; they do not change tracing."""

from __future__ import annotations


class _TensorType:
    def __init__(self, shape=None, dtype=None):
        self.shape, self.dtype = shape, dtype

    def __getitem__(self, item):
        if isinstance(item, tuple) and item and isinstance(item[-1], str):
            return _TensorType(tuple(item[:-1]), item[-1])
        return _TensorType(item if isinstance(item, tuple) else (item,))

    def __repr__(self) -> str:
        return f"nt.tensor[{self.shape}]" if self.shape is not None else "nt.tensor"


tensor = _TensorType()
mutable_tensor = _TensorType()  # a tensor argument the kernel writes

__all__ = ["tensor", "mutable_tensor"]

"""Sending neuron tensors between processes (``torch.multiprocessing`` queues and pipes).

torch 2.13 shares CUDA tensors by IPC and everything else as CPU shared memory, which a
neuron storage refuses; the error happens in the queue's feeder thread, so the item is
dropped and the receiver waits forever. Device memory here is host memory, so a neuron
tensor is shared like a CPU one: its storage moves once into a shared-memory file (sent
as a file descriptor) and the receiver maps it as a neuron tensor on the same device
index. Both sides see each other's writes, as with CUDA tensors. Only the
``file_descriptor`` strategy exists for neuron tensors (the Linux default).
"""

from __future__ import annotations

import multiprocessing.reduction
import os

import torch
from multiprocessing.reduction import ForkingPickler

from torch_neuronx import _C


def _rebuild_neuron_tensor(cls, df, nbytes, device, dtype, size, stride, offset, requires_grad):
    fd = df.detach()
    try:
        t = _C._tensor_from_shared_fd(fd, nbytes, device, dtype, list(size), list(stride), offset)
    finally:
        os.close(fd)  # the storage keeps its own duplicate
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad)


def _rebuild_neuron_storage(df, nbytes, device):
    return _rebuild_neuron_tensor(torch.Tensor, df, nbytes, device, torch.uint8, (nbytes,), (1,), 0, False).untyped_storage()


def _share(t: torch.Tensor):
    fd, nbytes = _C._share_storage_fd(t)
    return multiprocessing.reduction.DupFd(fd), nbytes


def _wrap_tensor_reducer(torch_reduce):
    def reduce(tensor):
        if tensor.device.type != "neuron":
            return torch_reduce(tensor)
        if tensor.requires_grad and not tensor.is_leaf:
            raise RuntimeError(
                "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
                "support crossing process boundaries. Call detach() on the tensor before sending it."
            )
        torch.utils.hooks.warn_if_has_hooks(tensor)
        df, nbytes = _share(tensor)
        args = (type(tensor), df, nbytes, tensor.device.index, tensor.dtype, tuple(tensor.size()),
                tuple(tensor.stride()), tensor.storage_offset(), tensor.requires_grad)
        return _rebuild_neuron_tensor, args

    return reduce


def _wrap_storage_reducer(torch_reduce):
    def reduce(storage):
        if storage.device.type != "neuron":
            return torch_reduce(storage)
        t = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        df, nbytes = _share(t)
        return _rebuild_neuron_storage, (df, nbytes, storage.device.index)

    return reduce


def register() -> None:
    """Wraps torch's reducers so neuron tensors and storages take the path above."""
    reducers = ForkingPickler._extra_reducers
    for cls in (torch.Tensor, torch.nn.Parameter):
        if cls in reducers and not getattr(reducers[cls], "_neuron", False):
            wrapped = _wrap_tensor_reducer(reducers[cls])
            wrapped._neuron = True
            ForkingPickler.register(cls, wrapped)
    if torch.UntypedStorage in reducers and not getattr(reducers[torch.UntypedStorage], "_neuron", False):
        wrapped = _wrap_storage_reducer(reducers[torch.UntypedStorage])
        wrapped._neuron = True
        ForkingPickler.register(torch.UntypedStorage, wrapped)

"""Tensor- and pipeline-parallel collectives for vLLM on ``neuron``.

vLLM gives each parallel group a device process group created with the platform's
``dist_backend`` (``"neuron"``: our c10d backend, shared-memory collectives between the
processes of one host); the base communicator's ``torch.distributed`` calls on that group are
exactly what ``neuron`` needs, so this class only names the device.
"""

from __future__ import annotations

from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase


class NeuronCommunicator(DeviceCommunicatorBase):
    """``all_reduce`` / ``all_gather`` / ``reduce_scatter`` / ``gather`` / ``send`` / ``recv``
    through ``torch.distributed`` on the group's ``neuron`` process group."""

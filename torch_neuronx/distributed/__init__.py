"""The ``neuron`` backend of torch.distributed.

Importing torch_neuronx registers it, so ``dist.init_process_group("neuron")`` (or
``"cpu:gloo,neuron:neuron"``, or no backend at all where ``neuron`` is the accelerator)
gives every collective on neuron tensors to our C++ backend: shared memory between the
ranks of a host, torch's gloo between hosts.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from torch_neuronx._C import _distributed as _impl

ProcessGroupNeuron = _impl.ProcessGroupNeuron

__all__ = ["ProcessGroupNeuron", "is_available", "reset_stats", "stats"]


def is_available() -> bool:
    return dist.is_available()


def stats() -> dict[str, dict[str, int]]:
    """Calls per collective and transport in this process since start (or ``reset_stats``).

    ``{"all_reduce": {"shm": 3, "gloo": 1}, ...}``. Transports: ``shm`` (shared memory within a
    host), ``gloo`` (torch's gloo between hosts), ``self`` (a group of one rank), ``store``
    (monitored_barrier).
    """
    return _impl.stats()


def reset_stats() -> None:
    _impl.reset_stats()


def _create_backend(dist_opts, backend_opts) -> ProcessGroupNeuron:
    """c10d's extended-API creator: called once per group on every member rank."""
    timeout = dist_opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    store, rank, size = dist_opts.store, dist_opts.group_rank, dist_opts.group_size
    pg = ProcessGroupNeuron(store, rank, size, timeout, str(dist_opts.group_id))
    if pg._num_hosts() > 1:
        # Between hosts: torch's gloo over every rank, and over the hosts' leaders for the
        # hierarchical all-reduce. Made here because gloo's Python constructor honours
        # GLOO_SOCKET_IFNAME like the rest of torch.distributed.
        from torch.distributed import PrefixStore, ProcessGroupGloo

        flat = ProcessGroupGloo(PrefixStore("neuron/gloo/", store), rank, size, timeout)
        leaders = None
        if pg._is_host_leader():
            leaders = ProcessGroupGloo(
                PrefixStore("neuron/leaders/", store), pg._host_index(), pg._num_hosts(), timeout
            )
        pg._set_gloo(flat, leaders)
    return pg


def _fix_default_backend() -> None:
    # torch 2.13 sets a group's default backend type (used by device-less calls such as
    # barrier, and by destroy_process_group) wrongly for a plugin backend:
    # - init_process_group() with no backend resolves the accelerator's backend ("neuron")
    #   for its device but still makes gloo the default, which was never created;
    # - a "device:backend" string compares the plugin's upper-case key with lower-case names
    #   and leaves the default unset once any plugin is registered ("No backend of type 0
    #   found" warnings), even for "cpu:gloo,neuron:gloo".
    # Resolve the name up front, as torch does when device_id is given, and set the default
    # to our backend where torch left it unset. Later torch releases are left alone.
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14):
        return
    c10d = dist.distributed_c10d
    original = c10d._new_process_group_helper
    if getattr(original, "_neuron_fixed", False):
        return

    def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        if str(backend) == dist.Backend.UNDEFINED and torch._C._get_accelerator().type == "neuron":
            backend = dist.Backend("neuron")
        result = original(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs)
        spec = str(backend).lower()
        pg = result[0] if isinstance(result, tuple) else result
        if ":" in spec and "nccl" not in spec and isinstance(pg, dist.ProcessGroup):
            if "neuron:neuron" in spec:
                pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
            elif "gloo" in spec:  # what torch picks when no plugin is registered
                pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        return result

    _new_process_group_helper._neuron_fixed = True
    c10d._new_process_group_helper = _new_process_group_helper


def _fake_backend_serves_neuron() -> None:
    # torch's "fake" process group (one process standing for every rank: LocalTensorMode,
    # cross-compilation) communicates nothing, whatever the device, but is declared for
    # cpu/cuda/hpu/xpu only, so a neuron DeviceMesh over it has no backend ("No backend type
    # associated with device type neuron"). torch.testing's fake_pg, imported by
    # init_process_group("fake"), registers it again with that list: neuron is added then too.
    fake = getattr(dist.Backend, "FAKE", None)
    if fake is None:
        return
    caps = dist.Backend.backend_capability.get(fake)
    if caps is not None and "neuron" not in caps:
        dist.Backend.backend_capability[fake] = [*caps, "neuron"]
    original = dist.Backend.register_backend
    if getattr(original, "_neuron_patched", False):
        return

    def register_backend(name, func, extended_api=False, devices=None):
        if str(name).lower() == fake and devices is not None:
            devices = [devices] if isinstance(devices, str) else list(devices)
            if "neuron" not in devices:
                devices.append("neuron")
        return original(name, func, extended_api, devices)

    register_backend._neuron_patched = True
    register_backend.__doc__ = original.__doc__
    dist.Backend.register_backend = staticmethod(register_backend)


def _patch_monitored_barrier() -> None:
    # torch's monitored_barrier refuses any backend but gloo by name; ours implements it.
    c10d = dist.distributed_c10d
    original = c10d.monitored_barrier
    if getattr(original, "_neuron_patched", False):
        return

    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        pg = group if group is not None else c10d._get_default_group()
        if not c10d._rank_not_in_group(pg) and "neuron" in str(c10d.get_backend(pg)) and "gloo" not in str(
            c10d.get_backend(pg)
        ):
            if timeout is None:
                timeout = c10d._get_default_timeout(dist.Backend("neuron"))
            backend = pg._get_backend(torch.device("neuron"))
            return backend.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        return original(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._neuron_patched = True
    monitored_barrier.__doc__ = original.__doc__
    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier


def _threaded_mesh_keeps_thread_devices() -> None:
    # A DeviceMesh built while the device is not initialized picks the process's device itself:
    # LOCAL_RANK, else global rank % device_count (torchrun without set_device relies on it).
    # Under the "threaded" process group (torch.testing's MultiThreadedTestCase: every rank a
    # thread of one process) the device is per thread but "initialized" is per process, so
    # only the thread that builds its mesh first moves, to its rank's device, and which one
    # that is depends on timing: rank 1 can end on neuron:1 while rank 0 stays on neuron:0.
    # Initializing first makes it none: each thread keeps its current device (neuron:0 unless
    # it sets one), the outcome the upstream tests expect of a CUDA run.
    device_mesh = dist.device_mesh
    DeviceMesh = getattr(device_mesh, "DeviceMesh", None)
    original = getattr(DeviceMesh, "_setup_world_group_and_device", None)
    if original is None or getattr(original, "_neuron_patched", False):
        return
    c10d = dist.distributed_c10d

    def _setup_world_group_and_device(self):
        if (
            getattr(self, "_device_type", None) == "neuron"
            and c10d.is_initialized()
            and c10d.get_backend() == "threaded"
            and torch.neuron.is_available()
        ):
            torch.neuron._lazy_init()
        return original(self)

    _setup_world_group_and_device._neuron_patched = True
    _setup_world_group_and_device.__doc__ = original.__doc__
    DeviceMesh._setup_world_group_and_device = _setup_world_group_and_device


def _destroy_at_exit() -> None:
    # Programs often exit without destroy_process_group(). Tear the groups down while the
    # interpreter is whole, not in its finalization, where the backends would be destroyed
    # next to autograd's device threads shutting down.
    try:
        if dist.is_initialized() and "neuron" in str(dist.get_backend()):
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway; a broken group must not mask the exit status
        pass


def register() -> None:
    if not dist.is_available():
        return
    if "NEURON" not in dist.Backend._plugins:
        import atexit

        atexit.register(_destroy_at_exit)
        dist.Backend.register_backend("neuron", _create_backend, extended_api=True, devices=["neuron"])
    _fix_default_backend()
    _patch_monitored_barrier()
    _fake_backend_serves_neuron()
    _threaded_mesh_keeps_thread_devices()

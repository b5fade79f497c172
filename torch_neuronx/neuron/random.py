"""Per-device random number generators of ``torch.neuron`` (the shape of torch.cuda.random).

Each device has a default generator. It draws from an mt19937 stream exactly like the
CPU generator, so ``torch.manual_seed(s)`` gives the same numbers on neuron and CPU.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from torch_neuronx import _C
from torch_neuronx.neuron._utils import _get_device_index


def _generator(device: Any = "neuron") -> torch.Generator:
    idx = _get_device_index(device, optional=True)
    _C._check_device(idx)
    return _C._default_generator(idx)


def _count() -> int:
    return _C._device_count()


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    """The RNG state of ``device`` as a ByteTensor (on CPU)."""
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(_count())]


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("set_rng_state expects a torch.ByteTensor, as returned by get_rng_state()")
    if new_state.device.type != "cpu":
        new_state = new_state.cpu()
    # The generator reads the CPU tensor's bytes itself, as torch.cuda.set_rng_state does: no
    # op is dispatched, so this works under FakeTensorMode and LocalTensorMode (which set each
    # simulated rank's state while sharding propagation runs on fake tensors).
    _generator(device).set_state(new_state)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seed the current neuron device's generator."""
    if _count() == 0:
        return
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(_count()):
        _C._default_generator(i).manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a non-deterministic number."""
    if _count() == 0:
        return
    _generator().seed()


def seed_all() -> None:
    if _count() == 0:
        return
    s = _C._default_generator(0).seed()
    for i in range(1, _count()):
        _C._default_generator(i).manual_seed(s)


def initial_seed() -> int:
    return _generator().initial_seed()

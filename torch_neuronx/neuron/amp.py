"""``torch.neuron.amp``: autocast and GradScaler bound to the neuron device."""

from __future__ import annotations

import torch


class autocast(torch.amp.autocast):
    """``torch.autocast("neuron", ...)``; bfloat16 by default (Trainium's matmul type)."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.bfloat16, cache_enabled: bool = True):
        super().__init__("neuron", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("neuron", ...)``."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        super().__init__("neuron", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)

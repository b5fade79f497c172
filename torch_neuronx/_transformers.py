"""Transformers' ``Trainer`` checkpoints the ``neuron`` generator.

``Trainer._save_rng_state`` writes the Python, NumPy and CPU generators and those of the devices
it names (CUDA, NPU, HPU, MLU, MUSA, XLA) to ``rng_state[_<process>].pth``; ``_load_rng_state``
restores them on ``train(resume_from_checkpoint=...)``. A device it does not name loses its
generator: on ``neuron`` everything drawn on the device after a resume (NEFTune's noise, random
masks made with ``device=``) differs from the uninterrupted run. The two methods are wrapped to
add the process's neuron generator to the same file under ``"neuron"``, as CUDA's is kept under
``"cuda"`` (a checkpoint stays readable by an unpatched Trainer, which ignores the key), and to
restore it. When a Trainer already writes the key, it is left alone.
"""

from __future__ import annotations

import functools
import os

_KEY = "neuron"


def _rng_file(trainer, checkpoint: str) -> str:
    # the file name Trainer._save_rng_state / _load_rng_state use
    name = "rng_state.pth" if trainer.args.world_size <= 1 else f"rng_state_{trainer.args.process_index}.pth"
    return os.path.join(checkpoint, name)


def _on_neuron(trainer) -> bool:
    return trainer.args.device.type == "neuron"


def _wrap_save(original):
    @functools.wraps(original)
    def _save_rng_state(self, output_dir, *args, **kwargs):
        result = original(self, output_dir, *args, **kwargs)
        path = _rng_file(self, output_dir)
        if _on_neuron(self) and os.path.isfile(path):
            import torch

            states = torch.load(path, weights_only=False)  # written just now by this process
            if _KEY not in states:
                states[_KEY] = torch.neuron.get_rng_state(self.args.device)
                torch.save(states, path)
        return result

    _save_rng_state._torch_neuronx = True
    return _save_rng_state


def _wrap_load(original):
    @functools.wraps(original)
    def _load_rng_state(self, checkpoint, *args, **kwargs):
        result = original(self, checkpoint, *args, **kwargs)
        if checkpoint is None or not _on_neuron(self):
            return result
        path = _rng_file(self, checkpoint)
        if os.path.isfile(path):
            import torch
            from transformers.trainer_pt_utils import safe_globals

            with safe_globals():
                states = torch.load(path, weights_only=True)
            if _KEY in states:
                torch.neuron.set_rng_state(states[_KEY], self.args.device)
        return result

    _load_rng_state._torch_neuronx = True
    return _load_rng_state


def _patch_trainer(module) -> None:
    trainer = getattr(module, "Trainer", None)
    for name, wrap in (("_save_rng_state", _wrap_save), ("_load_rng_state", _wrap_load)):
        original = getattr(trainer, name, None)
        if original is not None and not getattr(original, "_torch_neuronx", False):
            setattr(trainer, name, wrap(original))


def register() -> None:
    from torch_neuronx._import_hook import on_import

    on_import("transformers.trainer", _patch_trainer)

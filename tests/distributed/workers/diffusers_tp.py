"""Two-rank checks of Diffusers' own parallelism on ``neuron``: FLUX and Qwen-Image.

Tensor parallel is ``model.enable_parallelism(config=TensorParallelConfig(tp_degree=2))`` on the
transformer, which shards the Linears of the model's ``_tp_plan`` (diffusers picks its Neuron
backend for a ``neuron`` mesh: each rank's slice is cut on CPU and placed with
``DTensor.from_local``, then ``parallelize_module`` adds the hooks), or the same through
``from_pretrained(..., parallel_config=...)``, which reads each rank's slices off the safetensors
file. Context parallel is
``ContextParallelConfig(ulysses_degree=2)``: the sequence is split across the ranks and attention
runs Ulysses all-to-all. Every check compares with the 1-process result computed in this process:
the same model or pipeline unsharded on this rank's device, and on CPU.

    python -m torch.distributed.run --nproc-per-node=2 diffusers_tp.py [--only a,b]
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import torch

from _common import WORLD, assert_close, init, log, main

DEVICE = init()
assert WORLD == 2, "diffusers_tp.py runs on 2 ranks"

import diffusers  # noqa: E402
from diffusers import ContextParallelConfig, TensorParallelConfig  # noqa: E402

from torch_neuronx.testing import diffusers_pipelines as dp  # noqa: E402

diffusers.utils.logging.set_verbosity_error()
# Row-parallel layers add the ranks' partial products: a different summation order than one device.
TOL = dict(atol=1e-4, rtol=1e-4)


def _tensor_parallel(model) -> None:
    """Shards ``model`` with diffusers' tensor parallelism and checks the shards: every planned weight
    is a DTensor sharded over the 2 ranks, holding half of the full weight on this rank's device."""
    from torch.distributed.tensor import DTensor, Shard

    import diffusers.hooks.tensor_parallel_neuron as neuron_tp

    plan = type(model)._tp_plan
    assert plan, f"{type(model).__name__} has no _tp_plan"
    calls = []
    real = neuron_tp._apply_tp_neuron
    neuron_tp._apply_tp_neuron = lambda *a, **k: (calls.append(1), real(*a, **k))
    try:
        model.enable_parallelism(config=TensorParallelConfig(tp_degree=WORLD))
    finally:
        neuron_tp._apply_tp_neuron = real
    # diffusers shards a model on a neuron mesh with its Neuron backend (pre-sharded DTensor.from_local)
    assert calls == [1], "diffusers did not take its Neuron tensor-parallel path"
    model.to(DEVICE)
    sharded = 0
    for name, p in model.named_parameters():
        assert p.device == DEVICE, f"{name} is on {p.device}, expected {DEVICE}"
        if isinstance(p, DTensor) and isinstance(p.placements[0], Shard):
            dim = p.placements[0].dim
            assert p.to_local().shape[dim] * WORLD == p.shape[dim], f"{name}: local {p.to_local().shape}"
            assert p.to_local().device == DEVICE, name
            sharded += 1
    assert sharded >= len(plan), f"only {sharded} sharded parameters for a plan of {len(plan)} patterns"


def _model_inputs(kind: str) -> dict:
    g = torch.Generator().manual_seed(3)
    if kind == "flux":
        ids = torch.zeros(16, 3)
        ids[:, 1] = torch.arange(4).repeat_interleave(4)
        ids[:, 2] = torch.arange(4).repeat(4)
        return {"hidden_states": torch.randn(2, 16, 16, generator=g),
                "encoder_hidden_states": torch.randn(2, 8, 32, generator=g),
                "pooled_projections": torch.randn(2, 32, generator=g), "timestep": torch.tensor([0.3, 0.8]),
                "img_ids": ids, "txt_ids": torch.zeros(8, 3)}
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return {"hidden_states": torch.randn(2, 16, 16, generator=g),
            "encoder_hidden_states": torch.randn(2, 8, 16, generator=g),
            "encoder_hidden_states_mask": mask, "timestep": torch.tensor([0.3, 0.8]), "img_shapes": [(1, 4, 4)] * 2}


def _transformer(kind: str):
    from diffusers import FluxTransformer2DModel, QwenImageTransformer2DModel

    torch.manual_seed(0)
    if kind == "flux":
        return FluxTransformer2DModel(**dp.flux_transformer_config()).eval()
    return QwenImageTransformer2DModel(**dp.qwen_image_transformer_config()).eval()


def _on(device, kwargs: dict) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}


def _transformer_check(kind: str, parallel) -> None:
    model = _transformer(kind)
    inputs = _model_inputs(kind)
    with torch.no_grad():
        ref_cpu = model(**inputs, return_dict=False)[0]
        ref_dev = copy.deepcopy(model).to(DEVICE)(**_on(DEVICE, inputs), return_dict=False)[0]
        parallel(model)
        out = model(**_on(DEVICE, inputs), return_dict=False)[0]
    assert out.device == DEVICE and type(out) is torch.Tensor, (out.device, type(out))
    assert_close(out, ref_dev, f"{kind} transformer, 2 ranks vs 1 device", **TOL)
    assert_close(out, ref_cpu, f"{kind} transformer, 2 ranks vs CPU", **TOL)


def _context_parallel(model) -> None:
    model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=WORLD))
    model.to(DEVICE)


def _pipeline_check(kind: str) -> None:
    pipe = dp.tiny_pipeline(kind)
    ref_cpu = dp.run_pipeline(pipe, "cpu", "pt", kind=kind)
    ref_dev = dp.run_pipeline(pipe, DEVICE, "pt", kind=kind)
    _tensor_parallel(pipe.transformer)
    images = dp.run_pipeline(pipe, DEVICE, "pt", kind=kind, copy_first=False)
    assert images.device == DEVICE, images.device
    assert_close(images, ref_dev, f"{kind} images, 2 ranks vs 1 device", **TOL)
    assert_close(images, ref_cpu, f"{kind} images, 2 ranks vs CPU", **TOL)
    log(f"{kind}: images {tuple(images.shape)} match the 1-process run")


def check_flux_transformer_tp():
    _transformer_check("flux", _tensor_parallel)


def check_qwen_image_transformer_tp():
    _transformer_check("qwen-image", _tensor_parallel)


def check_flux_pipeline_tp():
    _pipeline_check("flux")


def check_qwen_image_pipeline_tp():
    _pipeline_check("qwen-image")


def check_flux_from_pretrained_tp():
    """``from_pretrained(..., parallel_config=TensorParallelConfig(...))``: each rank reads only its
    slices of the safetensors checkpoint into DTensors on its device."""
    import tempfile

    from diffusers import FluxTransformer2DModel
    from torch.distributed.tensor import DTensor

    model = _transformer("flux")
    inputs = _model_inputs("flux")
    with torch.no_grad():
        ref_cpu = model(**inputs, return_dict=False)[0]
    with tempfile.TemporaryDirectory() as tmp:  # one per rank, the same content
        model.save_pretrained(tmp)
        loaded = FluxTransformer2DModel.from_pretrained(tmp, parallel_config=TensorParallelConfig(tp_degree=WORLD))
    loaded = loaded.to(DEVICE).eval()
    sharded = [n for n, p in loaded.named_parameters() if isinstance(p, DTensor)]
    assert sharded and all(loaded.get_parameter(n).to_local().device == DEVICE for n in sharded), sharded[:3]
    with torch.no_grad():
        out = loaded(**_on(DEVICE, inputs), return_dict=False)[0]
    assert_close(out, ref_cpu, "flux transformer loaded sharded, 2 ranks vs CPU", **TOL)


def check_flux_transformer_cp():
    _transformer_check("flux", _context_parallel)


def check_flux_pipeline_cp():
    pipe = dp.tiny_pipeline("flux")
    ref_cpu = dp.run_pipeline(pipe, "cpu", "pt", kind="flux")
    _context_parallel(pipe.transformer)
    images = dp.run_pipeline(pipe, DEVICE, "pt", kind="flux", copy_first=False)
    assert_close(images, ref_cpu, "flux images, context parallel on 2 ranks vs CPU", **TOL)


CHECKS = {
    "flux_transformer_tp": check_flux_transformer_tp,
    "qwen_image_transformer_tp": check_qwen_image_transformer_tp,
    "flux_pipeline_tp": check_flux_pipeline_tp,
    "qwen_image_pipeline_tp": check_qwen_image_pipeline_tp,
    "flux_from_pretrained_tp": check_flux_from_pretrained_tp,
    "flux_transformer_cp": check_flux_transformer_cp,
    "flux_pipeline_cp": check_flux_pipeline_cp,
}

if __name__ == "__main__":
    main(CHECKS)

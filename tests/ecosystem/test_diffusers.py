"""Diffusers on ``neuron``, with CPU as the oracle:

* the library's own ``neuron`` code paths fire with torch-neuronx installed (device detection,
  the device-backend proxy, random latents drawn on CPU, float64 downcast, SDXL's timesteps);
* the fast subset of the model sweep (``coverage/hf_sweep.py --population diffusers``): forward and
  every gradient of UNet2DCondition, FLUX, FLUX.2, Qwen-Image, AutoencoderKL and Wan;
* tiny pipelines built in code (Stable Diffusion, FLUX, Qwen-Image; two steps, a CPU generator):
  the images on ``neuron`` equal CPU's;
* FLUX and Qwen-Image with Diffusers' tensor parallelism (and FLUX with its context parallelism)
  on 2 processes with the ``neuron`` backend equal the 1-process result;
* the checkers themselves fail on a perturbed result.
"""

from __future__ import annotations

import copy
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from torch_neuronx.testing import compare
from torch_neuronx.testing import diffusers_pipelines as dp

import hf_sweep  # coverage/ (on sys.path by conftest.py)

sweep = hf_sweep.population("diffusers")

# Images in [0, 1] after two denoising steps and a VAE decode; the device runs the same float32
# kernels, so differences are rounding (observed ~1e-6).
IMAGE_TOL = dict(rtol=0.0, atol=1e-4)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    hf_sweep.quiet(sweep.libraries)
    yield
    torch.set_num_threads(n)


# ---- the library's neuron code paths ----------------------------------------------------------

def test_diffusers_detects_the_neuron_device():
    from diffusers.utils import is_torch_neuronx_available
    from diffusers.utils.torch_utils import TorchDeviceBackend, get_device

    assert is_torch_neuronx_available()
    assert get_device() == "neuron"
    assert TorchDeviceBackend().device.type == "neuron"
    with warnings.catch_warnings():  # the module is deprecated, still what Diffusers' own tests use
        warnings.simplefilter("ignore", FutureWarning)
        from diffusers.utils import testing_utils
    assert torch.device(testing_utils.torch_device).type == "neuron"


def test_device_backend_proxy_reaches_torch_neuron():
    from diffusers.utils import torch_utils as tu

    backend = tu.TorchDeviceBackend("neuron")
    assert backend.module is torch.neuron
    assert tu.backend_device_count("neuron") == torch.neuron.device_count() >= 1
    assert backend.mem_get_info() == torch.neuron.mem_get_info(None)
    tu.backend_reset_peak_memory_stats("neuron")
    x = torch.empty(1 << 20, device="neuron")
    assert tu.backend_max_memory_allocated("neuron") >= x.nbytes
    tu.backend_manual_seed("neuron", 7)
    a = torch.randn(8, device="neuron")
    tu.backend_manual_seed("neuron", 7)
    assert torch.equal(a, torch.randn(8, device="neuron"))
    tu.backend_synchronize("neuron")
    tu.backend_empty_cache("neuron")


def test_latents_are_drawn_on_cpu_and_moved():
    from diffusers.utils.torch_utils import randn_tensor

    g = torch.Generator("cpu").manual_seed(3)
    out = randn_tensor((2, 4, 8, 8), generator=g, device=torch.device("neuron"))
    assert out.device.type == "neuron"
    assert torch.equal(out.cpu(), torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(3)))
    torch.manual_seed(5)
    unseeded = randn_tensor((3,), device=torch.device("neuron"))
    torch.manual_seed(5)
    assert torch.equal(unseeded.cpu(), torch.randn(3))  # the CPU stream, not the device's


def test_float64_and_int64_are_downcast_on_neuron_only():
    from diffusers.utils.torch_utils import maybe_adjust_dtype_for_device

    neuron, cpu = torch.device("neuron"), torch.device("cpu")
    assert maybe_adjust_dtype_for_device(torch.float64, neuron) == torch.float32
    assert maybe_adjust_dtype_for_device(torch.int64, neuron) == torch.int32
    assert maybe_adjust_dtype_for_device(torch.float64, cpu) == torch.float64
    assert maybe_adjust_dtype_for_device(torch.float16, neuron) == torch.float16


def test_sdxl_neuron_path_keeps_timesteps_on_cpu_and_casts_for_the_unet():
    pipe = dp.tiny_pipeline("stable-diffusion-xl")
    expected = dp.run_pipeline(pipe, "cpu")
    dev = copy.deepcopy(pipe).to("neuron")
    assert dev._execution_device.type == "neuron"
    seen = []
    dev.unet.register_forward_pre_hook(lambda m, args, kwargs: seen.append(args[1]), with_kwargs=True)
    images = dp.run_pipeline(dev, "neuron", copy_first=False)
    assert dev.scheduler.timesteps.device.type == "cpu"  # "[Neuron]" branch: scheduler set up on CPU
    assert len(seen) == dp.STEPS and all(t.device.type == "neuron" and t.dtype == torch.float32 for t in seen)
    _assert_images_match(images, expected)


# ---- model sweep, fast subset -----------------------------------------------------------------

def _explain(r: dict) -> str:
    stages = "; ".join(f"{k}: {v}" for k, v in r["stages"].items())
    return f"{r['model']}: {r['status']} at {r['stage']}: {r['reason']}\n  stages: {stages}\n  notes: {r['notes']}"


@pytest.mark.parametrize("name", sweep.fast)
def test_model_matches_cpu(name):
    r = sweep.check_one(name)
    assert r["status"] == "pass", _explain(r)
    assert r["stages"] == {s: "pass" for s in sweep.stages}, _explain(r)  # forward and backward both compared
    assert r["fallback_ops"] == {}, f"{name} ran ops through the generic fallback: {r['fallback_ops']}"


def _perturbed_copy(model):
    dev = copy.deepcopy(model)
    with torch.no_grad():
        p = max(dev.parameters(), key=lambda p: p.numel())  # a big weight: it reaches every output
        p.view(-1)[: max(1, p.numel() // 50)] += 0.05
    return dev


def _frozen_copy(model):
    dev = copy.deepcopy(model)
    next(dev.parameters()).requires_grad_(False)
    return dev


@pytest.mark.parametrize("name", ["FluxTransformer2DModel", "AutoencoderKL"])
def test_checker_reports_a_wrong_device_result(monkeypatch, name):
    monkeypatch.setattr(sweep, "device_copy", _perturbed_copy)
    r = sweep.check_one(name)
    assert r["status"] == "fail" and r["stage"] == "forward", _explain(r)
    assert "differ" in r["reason"], r["reason"]


def test_checker_reports_a_missing_gradient(monkeypatch):
    monkeypatch.setattr(sweep, "device_copy", _frozen_copy)
    r = sweep.check_one("FluxTransformer2DModel")
    assert r["stages"]["forward"] == "pass", _explain(r)
    assert r["status"] == "fail" and r["stage"] == "backward", _explain(r)
    assert "None on neuron" in r["reason"], r["reason"]


def test_checker_reports_a_wrong_gradient(monkeypatch):
    real = sweep.backward

    def backward(model, kwargs, spec):
        out = real(model, kwargs, spec)
        if next(model.parameters()).device.type == "neuron":
            out["grads"]["input.hidden_states"] = out["grads"]["input.hidden_states"] * 1.01
        return out

    monkeypatch.setattr(sweep, "backward", backward)
    r = sweep.check_one("FluxTransformer2DModel")
    assert r["status"] == "fail" and r["stage"] == "backward", _explain(r)
    assert "input.hidden_states" in r["reason"], r["reason"]


def test_every_sweep_spec_names_a_model_class():
    import diffusers

    for name, spec in sweep.specs().items():
        cls = sweep.model_class(spec)
        assert issubclass(cls, diffusers.ModelMixin), name
    assert set(sweep.fast) <= set(sweep.specs())


def _record(name, status, stage=None, reason=""):
    return {"model": name, "class": name.split("[")[0], "status": status, "stage": stage, "reason": reason,
            "stages": {}, "fallback_ops": {}, "seconds": 1.0, "params": 10, "notes": []}


FABRICATED = [
    _record("APass", "pass"),
    _record("BFail", "fail", "backward", "grads.param.w: 3 of 4 elements differ"),
    _record("CUnrunnable", "cpu-unrunnable", "forward", "CPU forward: NameError: transforms"),
    _record("DCrash", "crash", None, "worker process died (exit code -11)"),
]


def test_report_counts_and_lists_failures(tmp_path):
    from torch_neuronx.testing import Outcome

    s = sweep.summarize(FABRICATED)
    assert (s["pass"], s["fail"], s["crash"], s["cpu-unrunnable"], s["runnable"]) == (1, 1, 1, 1, 3)
    meta = {"torch": "t", "diffusers": "d", "transformers": "x", "date": "2000-01-01", "command": "cmd",
            "workers": 2, "timeout": 1, "wall_seconds": 1.0, "models": 4, "unswept": ["ZModel"]}
    md, js = sweep.write(FABRICATED, tmp_path, meta)
    text = md.read_text()
    assert "Pass rate: 1 / 3 = 33.3%" in text
    failures = text.split("## Failures")[1].split("## CPU-unrunnable")[0]
    assert "BFail" in failures and "DCrash" in failures and "APass" not in failures
    assert "ZModel" in text.split("not in the sweep")[1]
    crash = sweep.record(Outcome("FluxTransformer2DModel", "crash", error="died"))
    assert crash["status"] == "crash" and crash["class"] == "FluxTransformer2DModel"


@pytest.mark.parametrize("records, code", [(FABRICATED[:1] + FABRICATED[2:3], 0), (FABRICATED[:2], 1),
                                           (FABRICATED[:1] + FABRICATED[3:], 1)])
def test_exit_code(monkeypatch, records, code):
    monkeypatch.setattr(sweep, "run", lambda names, workers, timeout: records)
    assert hf_sweep.main(["--population", "diffusers", "--only", "AutoencoderKL", "--no-write"]) == code


# ---- pipelines ----------------------------------------------------------------------------------

def _assert_images_match(actual, expected):
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray) and actual.dtype == expected.dtype == np.float32
        actual, expected = torch.from_numpy(actual), torch.from_numpy(expected)
        device_type = None
    else:
        device_type = "neuron"
    assert expected.shape[0] == len(dp.PROMPTS)
    # not a degenerate image: values spread, mostly not clipped
    assert float(expected.float().std()) > 0.02 and float(((expected > 0) & (expected < 1)).float().mean()) > 0.5
    d = compare(actual, expected, device_type=device_type, **IMAGE_TOL)
    assert d.ok, d.summary()


@pytest.fixture(scope="module")
def pipelines():
    return {kind: dp.tiny_pipeline(kind) for kind in ("stable-diffusion", "flux", "qwen-image")}


@pytest.mark.parametrize("output_type", ["np", "pt"])
@pytest.mark.parametrize("kind", ["stable-diffusion", "flux", "qwen-image"])
def test_pipeline_images_match_cpu(pipelines, kind, output_type):
    pipe = pipelines[kind]
    expected = dp.run_pipeline(pipe, "cpu", output_type)
    images = dp.run_pipeline(pipe, "neuron", output_type)
    _assert_images_match(images, expected)
    assert pipe.device.type == "cpu"  # the oracle pipeline itself never moved


def test_pipeline_check_fails_on_a_perturbed_result(pipelines):
    pipe = pipelines["flux"]
    expected = dp.run_pipeline(pipe, "cpu")
    wrong = copy.deepcopy(pipe)
    with torch.no_grad():
        wrong.transformer.proj_out.bias += 0.01  # every predicted velocity moves a little
    images = dp.run_pipeline(wrong, "neuron")
    with pytest.raises(AssertionError, match="differ"):
        _assert_images_match(images, expected)


def test_tokenizer_is_byte_level_and_round_trips():
    tok = dp.byte_tokenizer(64, bos_eos=True)
    text = "ünïcode, spaces  and\nnewlines"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert len(ids) == len(text.encode()) + 2 and max(ids) < dp.VOCAB
    assert tok.decode(ids, skip_special_tokens=True) == text


# ---- tensor and context parallel on 2 processes -------------------------------------------------

DIST_CHECKS = ["flux_transformer_tp", "qwen_image_transformer_tp", "flux_pipeline_tp", "qwen_image_pipeline_tp",
               "flux_from_pretrained_tp", "flux_transformer_cp", "flux_pipeline_cp"]


@pytest.fixture(scope="module")
def launch():
    from test_distributed_parallel import Launch

    return Launch("diffusers_tp.py", 2, timeout=300)


@pytest.mark.parametrize("check", DIST_CHECKS)
def test_two_ranks(launch, check):
    launch.assert_check(check)


def test_two_rank_launch_exits_cleanly(launch):
    assert launch.error is None, launch.out[-5000:]
    assert sorted(launch.markers()) == sorted(DIST_CHECKS), launch.out[-5000:]
    if all(v == "ok" for v in launch.markers().values()):
        assert launch.rc == 0, launch.out[-5000:]

"""safetensors checkpoints loaded onto neuron: safetensors itself (every spelling of the
device), and the Transformers and Accelerate paths that hand it the device (from_pretrained
with a device map, disk offload, checkpoint loading). The oracle is the same checkpoint
loaded on the CPU: weights must come back bit for bit, logits within model tolerance."""

from __future__ import annotations

import os

import pytest
import safetensors
import safetensors.torch
import torch
from _tiny_llama import tiny_llama_config
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from torch_neuronx.testing import compare, model_tolerance

SPELLINGS = ["neuron", "neuron:0", 0, torch.device("neuron"), torch.device("neuron", 0)]
EXACT = dict(rtol=0.0, atol=0.0)


@pytest.fixture(scope="module")
def tensor_file(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(4, generator=g).to(torch.bfloat16),
        "f16": torch.randn(2, 2, generator=g).to(torch.float16),
        "i64": torch.randint(-100, 100, (7,), generator=g),
        "bool": torch.rand(6, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
    }
    path = str(tmp_path_factory.mktemp("st") / "tensors.safetensors")
    save_file(tensors, path)
    return path, tensors


@pytest.mark.parametrize("device", SPELLINGS, ids=repr)
def test_load_file_on_neuron(tensor_file, device):
    path, expected = tensor_file
    loaded = load_file(path, device=device)
    assert loaded.keys() == expected.keys()
    for name, t in loaded.items():
        assert t.device == torch.device("neuron", 0), name
    assert compare(loaded, expected, **EXACT).ok


def test_load_file_on_another_neuron_device(tensor_file):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    path, expected = tensor_file
    for device in ("neuron:1", torch.device("neuron", 1)):
        loaded = load_file(path, device=device)
        assert {t.device for t in loaded.values()} == {torch.device("neuron", 1)}
        assert compare(loaded, expected, **EXACT).ok


def test_neuron_means_the_current_device(tensor_file):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    path, _ = tensor_file
    before = torch.neuron.current_device()
    try:
        torch.neuron.set_device(1)
        assert load_file(path, device="neuron")["f32"].device == torch.device("neuron", 1)
    finally:
        torch.neuron.set_device(before)


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_safe_open_on_neuron(tensor_file, backend):
    path, expected = tensor_file
    with safe_open(path, framework="pt", device="neuron", backend=backend) as f:
        assert set(f.keys()) == set(expected)
        t = f.get_tensor("f32")
        part = f.get_slice("f32")[1:, ::2]
        everything = f.get_tensors()
    assert compare(t, expected["f32"], **EXACT).ok
    assert compare(part, expected["f32"][1:, ::2], **EXACT).ok
    assert compare(everything, expected, **EXACT).ok


def test_other_devices_are_left_to_safetensors(tensor_file):
    path, expected = tensor_file
    assert compare(load_file(path), expected, device_type="cpu", **EXACT).ok
    assert compare(load_file(path, device="cpu"), expected, device_type="cpu", **EXACT).ok
    for bad in ("neuron:x", "gpu", torch.device("cpu")):
        with pytest.raises(SafetensorError, match="is invalid"):
            load_file(path, device=bad)
    # Only PyTorch tensors can live on neuron; other frameworks keep safetensors' own error.
    with pytest.raises(SafetensorError):
        safe_open(path, framework="np", device="neuron")
    with pytest.raises(RuntimeError, match="Invalid device index 99"):
        load_file(path, device="neuron:99")


def test_registering_twice_wraps_once():
    from torch_neuronx import _safetensors

    wrapped = safetensors.safe_open
    _safetensors.register()
    assert safetensors.safe_open is wrapped and safetensors.torch.safe_open is wrapped
    assert not hasattr(wrapped.__wrapped__, "__wrapped__")  # the Rust class itself
    assert wrapped.__doc__ == wrapped.__wrapped__.__doc__


IMPORT_ORDERS = {
    # safetensors.torch imports torch, which registers the device before the name is bound
    "safetensors first": "from safetensors.torch import load_file\n",
    # without autoload, torch_neuronx comes after safetensors.torch has bound the name
    "no autoload": "from safetensors.torch import load_file\nimport torch_neuronx\n",
}


@pytest.mark.parametrize("order", IMPORT_ORDERS)
def test_import_order(run_python, tensor_file, order):
    path, _ = tensor_file
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"} if order == "no autoload" else None
    out = run_python(IMPORT_ORDERS[order] + f"print(load_file({path!r}, device='neuron')['f32'].device)", env=env)
    assert out.strip() == "neuron:0"


# ---- Transformers and Accelerate ----------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny LLaMA saved with save_pretrained, its CPU state dict and CPU logits."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(hidden_size=32, intermediate_size=64)).eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    return str(path), model.state_dict(), ids, logits


def _logits(model, ids):
    with torch.no_grad():
        return model(ids.to("neuron")).logits


def _empty_model(path):
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).eval()


LLAMA_LAYERS = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "model.rotary_emb", "lm_head"]


@pytest.mark.parametrize(
    "device_map", ["neuron", {"": "neuron"}, {"": "neuron:0"}, {"": 0}, torch.device("neuron", 0)], ids=repr
)
def test_from_pretrained_device_map(checkpoint, device_map):
    from transformers import AutoModelForCausalLM

    path, state, ids, logits = checkpoint
    model = AutoModelForCausalLM.from_pretrained(path, device_map=device_map).eval()
    assert {p.device for p in model.parameters()} == {torch.device("neuron", 0)}
    assert compare(model.state_dict(), state, **EXACT).ok
    assert compare(_logits(model, ids), logits, tolerance=model_tolerance).ok


def test_from_pretrained_device_map_auto(checkpoint):
    from transformers import AutoModelForCausalLM

    path, state, ids, logits = checkpoint
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto").eval()
    assert {p.device.type for p in model.parameters()} == {"neuron"}
    assert compare(model.state_dict(), state, **EXACT).ok
    assert compare(_logits(model, ids), logits, tolerance=model_tolerance).ok


@pytest.mark.parametrize("offload", ["disk", "cpu"])
def test_from_pretrained_offload(checkpoint, tmp_path, offload):
    # Offloaded weights come back through safetensors onto the execution device, "neuron".
    from transformers import AutoModelForCausalLM

    path, _, ids, logits = checkpoint
    device_map = dict.fromkeys(LLAMA_LAYERS, "neuron") | {"model.layers.1": offload}
    model = AutoModelForCausalLM.from_pretrained(path, device_map=device_map, offload_folder=str(tmp_path)).eval()
    assert model.hf_device_map["model.layers.1"] == offload
    assert compare(_logits(model, ids), logits, tolerance=model_tolerance).ok


@pytest.mark.parametrize(
    "device_map",
    [{"": "neuron"}, {"": 0}, {"": torch.device("neuron", 0)}, {"model": "neuron", "lm_head": "cpu"}],
    ids=repr,
)
def test_accelerate_load_checkpoint_in_model(checkpoint, device_map):
    from accelerate import load_checkpoint_in_model

    path, state, ids, logits = checkpoint
    model = _empty_model(path)
    load_checkpoint_in_model(model, os.path.join(path, "model.safetensors"), device_map=device_map)
    lm_head_on_cpu = device_map.get("lm_head") == "cpu"
    loaded = model.state_dict()
    for name, p in loaded.items():
        assert p.device.type == ("cpu" if lm_head_on_cpu and name.startswith("lm_head") else "neuron"), name
    assert compare(loaded, state, device_type=None, **EXACT).ok


def test_accelerate_load_checkpoint_and_dispatch(checkpoint, tmp_path):
    from accelerate import load_checkpoint_and_dispatch

    path, _, ids, logits = checkpoint
    # "auto" spreads the layers over the neuron devices (integer indices in the map);
    # a second map offloads a layer to disk.
    for device_map in ("auto", dict.fromkeys(LLAMA_LAYERS, "neuron") | {"model.layers.1": "disk"}):
        model = load_checkpoint_and_dispatch(
            _empty_model(path), path, device_map=device_map, offload_folder=str(tmp_path),
            no_split_module_classes=["LlamaDecoderLayer"],
        )  # fmt: skip
        assert compare(_logits(model, ids), logits, tolerance=model_tolerance).ok, device_map


@pytest.mark.parametrize("device", ["neuron", 0, torch.device("neuron")], ids=repr)
def test_accelerate_offloaded_weights_loader(checkpoint, device):
    # The index transformers writes for disk offload: weights read back from the checkpoint.
    from accelerate.utils import OffloadedWeightsLoader

    path, state, _, _ = checkpoint
    file = os.path.join(path, "model.safetensors")
    index = {k: {"safetensors_file": file, "weight_name": k, "dtype": "float32"} for k in state}
    weights = OffloadedWeightsLoader(index=index, device=device)
    loaded = {k: weights[k] for k in state}
    assert compare(loaded, state, **EXACT).ok

"""PEFT adapters on ``neuron``: a tiny LlamaForCausalLM with LoRA, IA3 or LoKr adapters trains,
merges, unmerges, saves and loads on neuron exactly as on the CPU (the oracle: the same model,
seed and batches on the CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from _tiny_llama import NEURON, tiny_llama_config

peft = pytest.importorskip("peft")
from peft import IA3Config, LoKrConfig, LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

FP32 = dict(atol=1e-5, rtol=1e-4)
STEPS = 3

# Non-trivial initialisations where the library offers them (LoRA's B and LoKr's w2 are zero
# by default, so the adapter would be a no-op before the first step): the first forward
# already exercises the adapter path, and the merges change the weights.
ADAPTERS = {
    "lora": lambda: LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                               target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]),
    "ia3": lambda: IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]),
    "lokr": lambda: LoKrConfig(r=4, alpha=8, init_weights=False, target_modules=["q_proj", "v_proj", "gate_proj"]),
}
PARAM_MARK = {"lora": "lora_", "ia3": "ia3_", "lokr": "lokr_"}


def batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def on(b: dict, device) -> dict:
    return {k: v.to(device) for k, v in b.items()}


def peft_pair(kind: str, seed: int = 0):
    """``(cpu, neuron)`` PeftModels with bit-identical base and adapter weights."""
    torch.manual_seed(seed)
    base = LlamaForCausalLM(tiny_llama_config())
    torch.manual_seed(seed + 1)
    cpu = get_peft_model(base, ADAPTERS[kind]())
    dev = copy.deepcopy(cpu).to(NEURON)
    for (name, p), q in zip(cpu.state_dict().items(), dev.state_dict().values()):
        assert q.device == NEURON and torch.equal(p, q.cpu()), name
    return cpu, dev


def trainable(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def train_both(cpu, dev, steps: int = STEPS) -> list[tuple[float, float]]:
    opts = [torch.optim.AdamW(trainable(m).values(), lr=1e-2, eps=1e-6) for m in (cpu, dev)]
    losses = []
    for step in range(steps):
        b = batch(100 + step)
        pair = []
        for m, opt, device in ((cpu, opts[0], "cpu"), (dev, opts[1], NEURON)):
            m.train()
            loss = m(**on(b, device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            pair.append(loss.item())
        losses.append(tuple(pair))
    return losses


def logits(model, device, seed: int = 7) -> torch.Tensor:
    model.eval()
    b = batch(seed)
    b.pop("labels")
    with torch.no_grad():
        out = model(**on(b, device)).logits
    assert out.device.type == torch.device(device).type
    return out.detach().cpu()


def assert_trainables_close(cpu, dev, **tol):
    tc, td = trainable(cpu), trainable(dev)
    assert tc.keys() == td.keys() and tc
    for name, p in tc.items():
        q = td[name]
        assert q.device == NEURON, name
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **tol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.fixture(scope="module", params=list(ADAPTERS))
def trained(request):
    """(kind, cpu PeftModel, neuron PeftModel, initial adapter weights, losses) after STEPS AdamW steps."""
    kind = request.param
    cpu, dev = peft_pair(kind)
    init = {n: p.detach().clone() for n, p in trainable(cpu).items()}
    losses = train_both(cpu, dev)
    return kind, cpu, dev, init, losses


def test_adapter_training_matches_cpu(trained):
    kind, cpu, dev, init, losses = trained
    tc = trainable(cpu)
    # Only the adapter trains; every trainable parameter is an adapter weight.
    assert tc and all(PARAM_MARK[kind] in n for n in tc), list(tc)
    assert all(not p.requires_grad for n, p in dev.named_parameters() if PARAM_MARK[kind] not in n)
    for c, n in losses:
        assert abs(n - c) <= 1e-5 * abs(c) + 1e-6, losses
    assert_trainables_close(cpu, dev, **FP32)
    # The comparison is not vacuous: the adapters moved away from their initial values.
    moved = max((tc[k].detach() - v).abs().max().item() for k, v in init.items())
    assert moved > 1e-3, moved


def test_merge_unmerge_and_merge_and_unload(trained):
    kind, cpu, dev, _, _ = trained
    cpu, dev = copy.deepcopy(cpu), copy.deepcopy(dev)
    ref = logits(cpu, "cpu")
    unmerged = logits(dev, NEURON)
    torch.testing.assert_close(unmerged, ref, **FP32)
    with dev.disable_adapter():
        plain = logits(dev, NEURON)
    assert (plain - unmerged).abs().max() > 1e-3, "the adapter does not change the output"

    # One adapted weight, followed through merge and unmerge.
    layer = dev.base_model.model.model.layers[0]
    target = layer.self_attn.v_proj
    w0 = target.get_base_layer().weight.detach().cpu().clone()

    dev.merge_adapter()
    cpu.merge_adapter()
    assert target.merged
    merged_w = target.get_base_layer().weight
    assert merged_w.device == NEURON
    assert (merged_w.detach().cpu() - w0).abs().max() > 1e-4, "merge left the base weight unchanged"
    torch.testing.assert_close(merged_w.detach().cpu(), cpu.base_model.model.model.layers[0].self_attn.v_proj
                               .get_base_layer().weight.detach(), **FP32)
    torch.testing.assert_close(logits(dev, NEURON), unmerged, **FP32)
    torch.testing.assert_close(logits(dev, NEURON), logits(cpu, "cpu"), **FP32)

    dev.unmerge_adapter()
    cpu.unmerge_adapter()
    assert not target.merged
    torch.testing.assert_close(target.get_base_layer().weight.detach().cpu(), w0, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(logits(dev, NEURON), unmerged, **FP32)

    merged_model = dev.merge_and_unload()
    cpu_merged = cpu.merge_and_unload()
    assert type(merged_model) is LlamaForCausalLM
    assert not any(PARAM_MARK[kind] in n for n, _ in merged_model.named_parameters())
    assert all(p.device == NEURON for p in merged_model.parameters())
    out = logits(merged_model, NEURON)
    torch.testing.assert_close(out, unmerged, **FP32)
    torch.testing.assert_close(out, logits(cpu_merged, "cpu"), **FP32)
    for (name, p), q in zip(cpu_merged.named_parameters(), merged_model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **FP32, msg=lambda m, n=name: f"{n}: {m}")


def test_save_on_neuron_load_on_neuron_and_cpu(trained, tmp_path):
    from safetensors.torch import load_file

    kind, cpu, dev, _, _ = trained
    expected = logits(dev, NEURON)
    dev.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_config.json").is_file()
    saved = load_file(tmp_path / "adapter_model.safetensors")
    # The file holds the trained adapter (no base weights), as CPU tensors equal to neuron's.
    td = {n.replace(".default", ""): p for n, p in trainable(dev).items()}
    assert saved.keys() == td.keys(), (sorted(saved)[:4], sorted(td)[:4])
    for name, t in saved.items():
        assert t.device.type == "cpu"
        assert torch.equal(t, td[name].detach().cpu()), name

    def fresh_base(device):
        torch.manual_seed(0)
        return LlamaForCausalLM(tiny_llama_config()).to(device)  # the same base weights as in training

    loaded_dev = PeftModel.from_pretrained(fresh_base(NEURON), tmp_path)
    assert all(p.device == NEURON for p in loaded_dev.parameters())
    assert not any(p.requires_grad for p in loaded_dev.parameters())  # inference mode by default
    torch.testing.assert_close(logits(loaded_dev, NEURON), expected, atol=0, rtol=0)

    # Adapter weights read straight onto the device (safetensors with device="neuron").
    loaded_direct = PeftModel.from_pretrained(fresh_base(NEURON), tmp_path, torch_device="neuron")
    torch.testing.assert_close(logits(loaded_direct, NEURON), expected, atol=0, rtol=0)

    loaded_cpu = PeftModel.from_pretrained(fresh_base("cpu"), tmp_path)
    torch.testing.assert_close(logits(loaded_cpu, "cpu"), expected, **FP32)
    torch.testing.assert_close(logits(loaded_cpu, "cpu"), logits(cpu, "cpu"), **FP32)

    # Loaded as trainable on neuron, it goes on training like the original.
    resumed = PeftModel.from_pretrained(fresh_base(NEURON), tmp_path, is_trainable=True)
    assert trainable(resumed).keys() == trainable(dev).keys()
    loss = resumed(**on(batch(50), NEURON)).loss
    loss.backward()
    assert all(p.grad is not None and p.grad.device == NEURON for p in trainable(resumed).values())


# ---- the other adapter types ---------------------------------------------------------------------

_T = ["q_proj", "v_proj"]
MORE_ADAPTERS = {
    "dora": lambda: peft.LoraConfig(r=4, use_dora=True, target_modules=_T, init_lora_weights=False),
    "pissa_rslora": lambda: peft.LoraConfig(r=4, use_rslora=True, target_modules=_T, init_lora_weights="pissa"),
    "olora": lambda: peft.LoraConfig(r=4, target_modules=_T, init_lora_weights="olora"),
    "loha": lambda: peft.LoHaConfig(r=4, target_modules=_T, init_weights=False),
    "adalora": lambda: peft.AdaLoraConfig(r=4, init_r=6, total_step=10, target_modules=_T),
    "boft": lambda: peft.BOFTConfig(boft_block_size=4, target_modules=_T),
    "oft": lambda: peft.OFTConfig(r=0, oft_block_size=4, target_modules=_T),
    "vera": lambda: peft.VeraConfig(r=4, target_modules=_T),
    "fourierft": lambda: peft.FourierFTConfig(n_frequency=16, target_modules=_T),  # FFTs: CPU fallback
    "hra": lambda: peft.HRAConfig(r=4, target_modules=_T),
    "c3a": lambda: peft.C3AConfig(block_size=16, target_modules=_T),
    "randlora": lambda: peft.RandLoraConfig(r=4, target_modules=_T),
    "miss": lambda: peft.MissConfig(r=4, target_modules=_T),
    "ln_tuning": lambda: peft.LNTuningConfig(target_modules=["input_layernorm"]),
    "prompt_tuning": lambda: peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
    "prefix_tuning": lambda: peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
    "p_tuning": lambda: peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=4,
                                                 encoder_hidden_size=32),
    # SHiRA keeps its adapter as a sparse COO tensor: sparse tensors do not exist on neuron yet.
    "shira": pytest.param(lambda: peft.ShiraConfig(r=4, target_modules=_T),
                          marks=pytest.mark.xfail(raises=NotImplementedError, strict=True,
                                                  reason="no sparse (COO) tensors on neuron")),
}


@pytest.mark.parametrize("make_config", list(MORE_ADAPTERS.values()), ids=list(MORE_ADAPTERS))
def test_more_adapter_types_train_and_merge_like_cpu(make_config):
    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_llama_config())
    torch.manual_seed(1)
    cpu = get_peft_model(base, make_config())
    dev = copy.deepcopy(cpu).to(NEURON)
    init = {n: p.detach().clone() for n, p in trainable(cpu).items()}
    assert init
    for c, n in train_both(cpu, dev, steps=2):
        assert abs(n - c) <= 1e-5 * abs(c) + 1e-6, (c, n)
    assert_trainables_close(cpu, dev, **FP32)
    moved = max((trainable(cpu)[k].detach() - v).abs().max().item() for k, v in init.items())
    assert moved > 1e-4, moved
    want = logits(cpu, "cpu")
    torch.testing.assert_close(logits(dev, NEURON), want, **FP32)
    if hasattr(dev, "merge_and_unload") and not dev.peft_config["default"].is_prompt_learning:
        merged = dev.merge_and_unload()
        assert type(merged) is LlamaForCausalLM
        torch.testing.assert_close(logits(merged, NEURON), want, atol=1e-4, rtol=1e-4)

"""A tiny Hugging Face Llama trained on neuron with attention on the NKI flash-attention kernels
(attn_implementation="nki_flash"), against the same model with SDPA on the CPU."""

import pytest
import torch

from torch_neuronx.kernels import hf as nki_hf
from torch_neuronx.kernels import ops


def _tiny_llama(attn: str):
    """The same weights every call (seeded), with ``attn`` as the attention implementation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.config._attn_implementation = attn
    return model


@pytest.fixture(scope="module")
def nki_flash():
    return nki_hf.register_attention()


def _count_kernel_calls(monkeypatch):
    calls = []
    real = ops._flash_fwd

    def counting(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(ops, "_flash_fwd", counting)
    return calls


def test_llama_trains_on_the_nki_kernels_like_sdpa_on_cpu(nki_flash, monkeypatch):
    calls = _count_kernel_calls(monkeypatch)
    ref = _tiny_llama("sdpa")
    dev = _tiny_llama(nki_flash).to("neuron")
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_d = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    ids = torch.randint(1, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(3):
        lr_ = ref(input_ids=ids, labels=ids).loss
        ld = dev(input_ids=ids.to("neuron"), labels=ids.to("neuron")).loss
        lr_.backward()
        ld.backward()
        assert ld.item() == pytest.approx(lr_.item(), rel=1e-4)
        for (name, pr), pd in zip(ref.named_parameters(), dev.parameters()):
            torch.testing.assert_close(pd.grad.cpu(), pr.grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")
        for o in (opt_r, opt_d):
            o.step()
            o.zero_grad()
        losses.append(ld.item())
    assert losses[-1] < losses[0]
    assert len(calls) == 3 * 2  # every layer of every step ran the kernel


def test_padding_masks_fall_back_to_sdpa_with_the_same_result(nki_flash, monkeypatch):
    calls = _count_kernel_calls(monkeypatch)
    ref = _tiny_llama("sdpa")
    dev = _tiny_llama(nki_flash).to("neuron")
    ids = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = dev(input_ids=ids.to("neuron"), attention_mask=mask.to("neuron")).logits
    torch.testing.assert_close(got.cpu()[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-5)
    assert calls == []

"""Tiny Hugging Face LLaMA models for tests: same weights on CPU and on neuron."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NEURON = torch.device("neuron", 0)


def tiny_llama_config(**overrides) -> LlamaConfig:
    """A 2-layer LlamaConfig with ~100K parameters; keyword arguments override fields."""
    kwargs = dict(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as in recent LLaMAs
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,  # generate() then always runs for max_new_tokens
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def llama_pair(config: LlamaConfig | None = None, seed: int = 0) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """``(cpu_model, neuron_model)``: one random init under ``torch.manual_seed(seed)``,
    copied into the second model through its state_dict, so both start bit-identical."""
    config = config if config is not None else tiny_llama_config()
    torch.manual_seed(seed)
    cpu_model = LlamaForCausalLM(config)
    neuron_model = LlamaForCausalLM(copy.deepcopy(config))
    neuron_model.load_state_dict(cpu_model.state_dict())
    neuron_model.to(NEURON)
    for (name, p), q in zip(cpu_model.state_dict().items(), neuron_model.state_dict().values()):
        assert q.device == NEURON, name
        assert torch.equal(p, q.cpu()), name
    return cpu_model, neuron_model


class CountingDataset(torch.utils.data.Dataset):
    """``n`` sequences of ``seq`` tokens, each counting up by one (mod the vocabulary, 0 being
    the pad token) from a random start: the next token is learnable. Items are Trainer batches."""

    def __init__(self, n: int, seq: int = 16, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        starts = torch.randint(1, vocab, (n, 1), generator=g)
        self.ids = (starts + torch.arange(seq)) % (vocab - 1) + 1

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

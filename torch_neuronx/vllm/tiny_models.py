"""Tiny checkpoints of the served model families, made in code and saved locally (no hub):
``make serve`` serves one, tests/serving/ compares vLLM on ``neuron`` with Transformers on them.

``python -m torch_neuronx.vllm.tiny_models OUT_DIR [--family llama]`` writes a Hugging Face
checkpoint (config, safetensors weights, tokenizer with a chat template) that ``vllm serve OUT_DIR``
and ``AutoModelForCausalLM.from_pretrained(OUT_DIR)`` both load.

The tokenizer is word-level over the numbers ``0 .. 199`` and a few words, so prompts are readable
("1 2 3 4") and any text made of those words tokenizes to exactly one id per word.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

N_NUMBERS = 200
WORDS = ["hello", "count", "from", "to", "the", "and", "is", "a", "what", "next", "please"]
SPECIAL = ["<pad>", "<unk>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|> {{ m['content'] }} "
    "{% elif m['role'] == 'user' %}<|user|> {{ m['content'] }} "
    "{% else %}<|assistant|> {{ m['content'] }} <eos> {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
FAMILIES = ("llama", "qwen3", "qwen3_moe", "gemma3", "gpt_oss")
MAX_POSITIONS = 256


def make_tokenizer():
    """A ``PreTrainedTokenizerFast`` over a ``tokenizers`` WordLevel model split on whitespace,
    with pad/eos tokens and a chat template."""
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS + [str(n) for n in range(N_NUMBERS)])}
    core = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                  eos_token="<eos>", model_max_length=MAX_POSITIONS)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_config(family: str, tok):
    """A 2-layer config of ``family`` (hidden 64, 4 query heads over 2 KV heads, head dim 16)."""
    import transformers

    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=MAX_POSITIONS, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id, bos_token_id=None, tie_word_embeddings=False,
                  # wider than the default 0.02, so the logits of a random model are far apart
                  # and greedy tokens do not hinge on rounding
                  initializer_range=0.2)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "qwen3":
        return transformers.Qwen3Config(**common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=32, decoder_sparse_step=1,
                                           norm_topk_prob=True)
    if family == "gemma3":
        # a sliding window much shorter than the prompts, so windowed layers differ from global ones
        return transformers.Gemma3TextConfig(**common, sliding_window=8, query_pre_attn_scalar=16,
                                             layer_types=["sliding_attention", "full_attention"])
    if family == "gpt_oss":
        common.pop("intermediate_size")
        # GPT-OSS's YaRN RoPE, its 32x factor consistent with these short contexts
        rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": MAX_POSITIONS // 32}
        return transformers.GptOssConfig(**common, intermediate_size=32, num_local_experts=4,
                                         num_experts_per_tok=2, sliding_window=8, rope_parameters=rope,
                                         layer_types=["sliding_attention", "full_attention"])
    raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")


def build(out_dir: str | Path, family: str = "llama", seed: int = 0) -> Path:
    """Write a freshly initialised tiny ``family`` checkpoint and its tokenizer to ``out_dir``
    (float32, same weights for the same seed) and return the directory."""
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    tok = make_tokenizer()
    config = tiny_config(family, tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--family", default="llama", choices=FAMILIES)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(build(a.out_dir, a.family, a.seed))


if __name__ == "__main__":
    main()

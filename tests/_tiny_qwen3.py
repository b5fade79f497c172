"""A tiny Qwen3 causal LM, a word-level tokenizer and small text data sets for the TRL tests,
all made in code (no downloads).

The "language" is counting: a sample is a run of consecutive numbers, ``"7 8 9 10 11 ..."``,
so the next token is learnable and a few optimizer steps make the loss fall.
"""

from __future__ import annotations

import torch

N_NUMBERS = 60  # tokens "0" .. "59"
SPECIAL = ["<pad>", "<unk>", "<eos>", "<|user|>", "<|assistant|>"]
# Jinja chat template: "<|user|> ... <|assistant|> ... <eos>" (the generation prompt ends with <|assistant|>).
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|> {{ m['content'] }} "
    "{% else %}<|assistant|> {{ m['content'] }} <eos> {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def make_tokenizer():
    """A ``PreTrainedTokenizerFast`` over a ``tokenizers`` WordLevel model: the special
    tokens and the numbers 0..59, split on whitespace; with pad/eos tokens and a chat template."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + [str(n) for n in range(N_NUMBERS)])}
    core = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>",
        model_max_length=64,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_qwen3_config(tok, **overrides):
    """A 2-layer Qwen3Config (hidden 64, 4 heads, 2 KV heads) sized for ``tok``."""
    from transformers import Qwen3Config

    kwargs = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
        tie_word_embeddings=False, attn_implementation="sdpa",
    )
    kwargs.update(overrides)
    return Qwen3Config(**kwargs)


def tiny_qwen3(tok, seed: int = 0, **overrides):
    """A freshly initialised tiny Qwen3ForCausalLM on the CPU (fp32), same weights for the same seed."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(tiny_qwen3_config(tok, **overrides))


def counting_texts(n: int, length: int = 12, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, N_NUMBERS - length, (n,), generator=g).tolist()
    return [" ".join(str(s + i) for i in range(length)) for s in starts]


def text_dataset(n: int = 64, length: int = 12, seed: int = 0):
    """``datasets.Dataset`` with a ``text`` column of counting runs (language modelling)."""
    from datasets import Dataset

    return Dataset.from_dict({"text": counting_texts(n, length, seed)})


def conversation_dataset(n: int = 32, seed: int = 0):
    """``messages`` column: the user gives the first numbers of a run, the assistant continues it."""
    from datasets import Dataset

    rows = []
    for t in counting_texts(n, 10, seed):
        words = t.split()
        rows.append([{"role": "user", "content": " ".join(words[:4])},
                     {"role": "assistant", "content": " ".join(words[4:])}])
    return Dataset.from_dict({"messages": rows})


def preference_dataset(n: int = 32, seed: int = 0):
    """``prompt`` / ``chosen`` / ``rejected``: the chosen completion keeps counting up, the
    rejected one counts down."""
    from datasets import Dataset

    prompts, chosen, rejected = [], [], []
    g = torch.Generator().manual_seed(seed)
    for s in torch.randint(6, N_NUMBERS - 12, (n,), generator=g).tolist():
        prompts.append(" ".join(str(s + i) for i in range(4)))
        chosen.append(" ".join(str(s + 4 + i) for i in range(4)))
        rejected.append(" ".join(str(s - 2 - i) for i in range(4)))
    return Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})

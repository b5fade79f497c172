"""TorchTitan's own trainer on ``neuron`` (run under torchrun with ``.venv/titan`` on PYTHONPATH).

``torchtitan_train.py --make-assets DIR`` writes what its debug configs read from the
repository's test assets, made here: a byte-level BPE tokenizer (``DIR/tokenizer``) and a small
synthetic text corpus in JSON lines (``DIR/data``). Otherwise the arguments go to
``torchtitan.train``.
"""

from __future__ import annotations

import json
import os
import random
import sys


def make_assets(out: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    subjects = ["the cat", "a dog", "my neighbor", "the teacher", "a small bird", "the engineer", "our team"]
    verbs = ["sees", "likes", "builds", "carries", "paints", "finds", "follows", "opens"]
    objects = ["a red house", "the green door", "three apples", "the long road", "a wooden boat", "some bread"]
    tails = ["in the morning", "after lunch", "near the lake", "every day", "before the rain", "at night"]
    docs = []
    for _ in range(2000):
        sentences = []
        for _ in range(rng.randint(4, 12)):
            s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
            if rng.random() < 0.6:
                s += " " + rng.choice(tails)
            sentences.append(s.capitalize() + ".")
        docs.append(" ".join(sentences))
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
    with open(os.path.join(out, "data", "train.jsonl"), "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainer=trainers.BpeTrainer(
        vocab_size=2048, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))  # the debug models have 2048 token embeddings
    tok.save(os.path.join(out, "tokenizer", "tokenizer.json"))
    with open(os.path.join(out, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": specials[0], "eos_token": specials[1], "pad_token": specials[2],
                   "add_bos_token": False, "add_eos_token": False, "model_max_length": 131072}, f)


def main() -> None:
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        # torchtitan 0.3.0 calls torch.distributed.set_timeout(timeout, group) after the first
        # step, an API newer than torch 2.13; 2.13's private equivalent does the same.
        from torch.distributed.distributed_c10d import _set_pg_timeout

        dist.set_timeout = lambda timeout, group=None: _set_pg_timeout(timeout, group)
    from torchtitan.train import main as train

    train()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-assets"]:
        make_assets(sys.argv[2])
    else:
        main()

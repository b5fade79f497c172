"""Train a tiny LLaMA-style language model on the `neuron` device.

A character-level LlamaForCausalLM (built from a LlamaConfig, no downloads) learns a
short built-in text. The script:

1. checks that the first training step's loss on the device matches the same model
   (identical weights, identical batch) on the CPU,
2. trains with AdamW for a few hundred steps and checks that the loss fell,
3. greedily generates text from a prompt with ``model.generate``.

It exits non-zero if a check fails.

    python examples/train_llama.py                    # on neuron
    python examples/train_llama.py --device cpu --steps 100
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch  # importing torch registers the `neuron` device (torch-neuronx autoload)
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

CORPUS = """\
The lighthouse keeper rose before the sun. Each morning he climbed the iron stairs,
wiped the salt from the great lens, and wrote the weather in a small green book.
The sea was calm on most days, and the gulls waited on the rail for bread.

In the village below, the baker opened her shop at six. She sold round loaves,
sweet buns with raisins, and a dark rye bread that the fishermen liked to take
to sea. When the boats came back at noon, the harbour smelled of rope and tar.

On stormy nights the keeper did not sleep. He watched the light turn and turn,
and he counted the ships that passed the rocks. In the morning he wrote their
names in the green book, and then he went down to the village for bread.

The children of the village liked to visit the lighthouse. The keeper showed
them the lens, the lamp, and the clockwork that made the light turn. He told
them that a light is only useful if it is kept burning every single night.
"""


class CharTokenizer:
    """Maps each character of a text to an id; id 0 is reserved for padding."""

    pad_token = "<pad>"

    def __init__(self, text: str) -> None:
        self.itos = [self.pad_token] + sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.itos)}
        self.pad_token_id = 0

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {unknown}")
        return [self.stoi[ch] for ch in text]

    def decode(self, ids) -> str:
        return "".join(self.itos[i] for i in ids if i != self.pad_token_id)


def get_batch(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """Random windows of `seq_len` token ids (on the CPU; the caller moves them)."""
    starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=gen)
    return torch.stack([data[s : s + seq_len] for s in starts.tolist()])


def fail(msg: str) -> None:
    print(f"FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500, help="training steps (default: 500)")
    parser.add_argument("--device", default="neuron", help="device to train on (default: neuron)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")

    hf_logging.set_verbosity_error()  # keep the output to what this script prints
    device = torch.device(args.device)
    torch.manual_seed(args.seed)  # seeds the CPU and every device generator
    batch_size, seq_len, lr = 16, 64, 3e-3

    tok = CharTokenizer(CORPUS)
    data = torch.tensor(tok.encode(CORPUS), dtype=torch.long)
    print(f"device: {device} | corpus: {len(CORPUS)} chars | vocab: {len(tok)} tokens")

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        eos_token_id=None,
    )
    # Initialise on the CPU, then give a copy of the same weights to the target device.
    cpu_model = LlamaForCausalLM(config)
    model = LlamaForCausalLM(config)
    model.load_state_dict(cpu_model.state_dict())
    model.to(device).train()
    print(f"model: LlamaForCausalLM, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)  # batch sampling, independent of the model init
    first_batch = get_batch(data, batch_size, seq_len, gen)

    # Oracle for step 1: the CPU model on the same batch.
    with torch.no_grad():
        cpu_loss = cpu_model(input_ids=first_batch, labels=first_batch).loss.item()
    del cpu_model

    losses: list[float] = []
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc="train", unit="step")
    for step in bar:
        batch = first_batch if step == 0 else get_batch(data, batch_size, seq_len, gen)
        batch = batch.to(device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step == 0:
            diff = abs(losses[0] - cpu_loss)
            tqdm.write(f"step 1 loss: {device.type} {losses[0]:.7f} | cpu {cpu_loss:.7f} | |diff| {diff:.2e}")
            if not math.isclose(losses[0], cpu_loss, rel_tol=1e-5, abs_tol=1e-6):
                bar.close()
                fail(f"step 1 loss on {device} differs from the CPU reference by {diff:.2e}")
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    bar.close()
    elapsed = time.perf_counter() - start

    # Compare averages over a few steps: single-batch losses are noisy.
    window = max(1, min(20, args.steps // 10))
    start_loss = losses[0]
    end_loss = sum(losses[-window:]) / window
    print(f"loss: start {start_loss:.4f} -> end {end_loss:.4f} (mean of last {window} steps)"
          f" | {args.steps} steps in {elapsed:.1f}s ({1000 * elapsed / args.steps:.0f} ms/step)")
    if not all(math.isfinite(x) for x in losses):
        fail("the loss became NaN or inf")
    if args.steps >= 100 and end_loss > 0.5 * start_loss:
        fail(f"the loss did not drop substantially ({start_loss:.4f} -> {end_loss:.4f})")

    # Greedy generation from a prompt.
    model.eval()
    prompt = "The keeper "
    input_ids = torch.tensor([tok.encode(prompt)], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=60,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    if out.device != input_ids.device:
        fail(f"generate returned tokens on {out.device}, expected {input_ids.device}")
    print(f"generated: {tok.decode(out[0].tolist())!r}")


if __name__ == "__main__":
    main()

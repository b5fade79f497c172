"""LoRA fine-tuning of a tiny LLaMA on the `neuron` device with PEFT and the transformers Trainer.

Everything is made here (no downloads). Tokens are the numbers 1..60; the model sees runs of
numbers and predicts the next one.

1. A "base model" (LlamaForCausalLM from a LlamaConfig) is trained in full to count up by one:
   ``7 8 9 10 ...``.
2. A LoRA adapter (``peft.get_peft_model``; only the adapter trains, ~10% of this small model) teaches
   it to count up by three instead: ``7 10 13 16 ...``. The first adapter step is checked against
   the same step on the CPU; then ``transformers.Trainer`` trains it (it puts the model on
   ``neuron:0`` by itself).
3. With the adapter the model counts by three; with the adapter disabled it still counts by one.
4. The adapter is saved (``save_pretrained``, a few hundred KB), loaded back onto a fresh base on
   neuron and on the CPU (``PeftModel.from_pretrained``), and merged into the base weights
   (``merge_and_unload``): all give the same predictions.

It exits non-zero if a check fails.

    python examples/lora_finetune.py                       # on neuron, about a minute
    python examples/lora_finetune.py --device cpu
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing to download
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # importing torch registers the `neuron` device (torch-neuronx autoload)
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

VOCAB, SEQ, PAD = 64, 16, 0
MAX_NUMBER = 60  # tokens 1..60 are numbers, 0 pads


def runs(n: int, stride: int, seed: int) -> torch.Tensor:
    """``n`` rows of SEQ numbers counting up by ``stride`` (wrapping around 1..MAX_NUMBER)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, MAX_NUMBER, (n, 1), generator=g)
    return (starts + stride * torch.arange(SEQ)) % MAX_NUMBER + 1


class RunsDataset(torch.utils.data.Dataset):
    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def next_token_accuracy(model, rows: torch.Tensor, device) -> float:
    """Share of positions 4.. where the greedy next token is right (the first ones are ambiguous)."""
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=rows.to(device)).logits
    pred = logits[:, 3:-1].argmax(-1).cpu()
    return (pred == rows[:, 4:]).float().mean().item()


def continue_run(model, prompt: list[int], device, n: int = 6) -> list[int]:
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=device), max_new_tokens=n, do_sample=False,
                             pad_token_id=PAD)
    return out[0, len(prompt):].tolist()


def fail(msg: str) -> None:
    print(f"FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="neuron", choices=["neuron", "cpu"])
    ap.add_argument("--base-steps", type=int, default=300)
    ap.add_argument("--lora-steps", type=int, default=150)
    ap.add_argument("--out", default=None, help="where to save the adapter (default: a temporary directory)")
    a = ap.parse_args()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notices inside the libraries
    from peft import LoraConfig, PeftModel, get_peft_model

    device = torch.device(a.device, 0) if a.device == "neuron" else torch.device("cpu")
    if a.device == "neuron" and not torch.neuron.is_available():
        fail("no neuron device (is torch_neuronx installed?)")
    print(f"device: {device}" + (f" ({torch.neuron.get_device_name(0)})" if a.device == "neuron" else ""))

    # 1. The base model: trained in full to count by one.
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=PAD, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).to(device)
    opt = torch.optim.AdamW(base.parameters(), lr=3e-3, weight_decay=0.0)
    data_by1 = runs(4096, 1, seed=1)
    t0 = time.perf_counter()
    base.train()
    for step in range(a.base_steps):
        ids = data_by1[(step * 32) % 4096:][:32].to(device)
        loss = base(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    test_by1, test_by3 = runs(64, 1, seed=100), runs(64, 3, seed=101)
    acc1 = next_token_accuracy(base, test_by1, device)
    print(f"[1] base model: {a.base_steps} full steps in {time.perf_counter() - t0:.1f} s, final loss "
          f"{loss.item():.3f}; counts by one: {acc1:.0%} of next tokens right")
    if acc1 < 0.95:
        fail(f"the base model did not learn to count (accuracy {acc1:.0%})")
    base_state = {k: v.detach().cpu().clone() for k, v in base.state_dict().items()}

    def fresh_base(dev) -> LlamaForCausalLM:
        m = LlamaForCausalLM(copy.deepcopy(config))
        m.load_state_dict(base_state)
        return m.to(dev)

    # 2. A LoRA adapter on every linear layer of the attention and MLP blocks.
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    torch.manual_seed(1)
    model = get_peft_model(fresh_base(device), lora)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    print(f"[2] LoRA r={lora.r}: {n_train:,} trainable of {n_all:,} parameters ({n_train / n_all:.1%})")

    # The first adapter step on the device against the same step on the CPU.
    cpu_model = copy.deepcopy(model).to("cpu")
    data_by3 = runs(2048, 3, seed=2)
    first = data_by3[:16]
    losses = []
    for m, dev in ((model, device), (cpu_model, torch.device("cpu"))):
        m.train()
        loss = m(input_ids=first.to(dev), labels=first.to(dev)).loss
        loss.backward()
        grads = [p.grad.detach().cpu() for p in m.parameters() if p.requires_grad]
        losses.append((loss.item(), grads))
        m.zero_grad()
    (l_dev, g_dev), (l_cpu, g_cpu) = losses
    g_err = max(((a_ - b_).norm() / b_.norm().clamp_min(1e-12)).item() for a_, b_ in zip(g_dev, g_cpu))
    print(f"    first step: loss {l_dev:.6f} on {device.type}, {l_cpu:.6f} on cpu; "
          f"adapter gradients differ by {g_err:.1e} (relative)")
    if abs(l_dev - l_cpu) > 1e-4 or g_err > 1e-4:
        fail("the first LoRA step differs from the CPU's")
    del cpu_model

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=os.path.join(tmp, "trainer"), max_steps=a.lora_steps, per_device_train_batch_size=32,
            learning_rate=1e-2, lr_scheduler_type="constant", warmup_steps=0, logging_steps=max(1, a.lora_steps // 5),
            save_strategy="no", report_to=[], disable_tqdm=True, seed=0, use_cpu=a.device == "cpu",
        )
        trainer = Trainer(model=model, args=args, train_dataset=RunsDataset(data_by3))
        if trainer.args.device.type != device.type:
            fail(f"Trainer chose {trainer.args.device}, expected {device}")
        t0 = time.perf_counter()
        trainer.train()
        logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        print(f"    Trainer on {trainer.args.device}: {a.lora_steps} adapter steps in "
              f"{time.perf_counter() - t0:.1f} s, loss {' -> '.join(f'{v:.3f}' for v in logged)}")

    # 3. With and without the adapter.
    acc3 = next_token_accuracy(model, test_by3, device)
    with model.disable_adapter():
        acc1_off = next_token_accuracy(model, test_by1, device)
        plain = continue_run(model, [7, 10, 13, 16], device)
    adapted = continue_run(model, [7, 10, 13, 16], device)
    print(f"[3] with the adapter, counts by three: {acc3:.0%} right; 7 10 13 16 -> {' '.join(map(str, adapted))}")
    print(f"    adapter disabled, counts by one:   {acc1_off:.0%} right; 7 10 13 16 -> {' '.join(map(str, plain))}")
    if acc3 < 0.9:
        fail(f"the adapter did not learn to count by three ({acc3:.0%})")
    if acc1_off < 0.95:
        fail("disabling the adapter did not give the base model back")

    # 4. Save, load on neuron and on the CPU, merge.
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or os.path.join(tmp, "adapter")
        model.save_pretrained(out)
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        probe = test_by3[:8]
        with torch.no_grad():
            model.eval()
            want = model(input_ids=probe.to(device)).logits.cpu()
            on_dev = PeftModel.from_pretrained(fresh_base(device), out).eval()
            on_cpu = PeftModel.from_pretrained(fresh_base("cpu"), out).eval()
            got_dev = on_dev(input_ids=probe.to(device)).logits.cpu()
            got_cpu = on_cpu(input_ids=probe).logits
            merged = copy.deepcopy(model).merge_and_unload().eval()
            got_merged = merged(input_ids=probe.to(device)).logits.cpu()
        errs = {name: (got - want).abs().max().item()
                for name, got in (("reloaded", got_dev), ("reloaded on cpu", got_cpu), ("merged", got_merged))}
        print(f"[4] adapter saved to {out} ({size / 1024:.0f} KB); max |logit difference| vs the trained model: "
              + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
        if type(merged) is not LlamaForCausalLM:
            fail(f"merge_and_unload returned {type(merged).__name__}")
        if max(errs.values()) > 1e-4:
            fail("a reloaded or merged model differs from the trained one")
    print("OK")


if __name__ == "__main__":
    main()

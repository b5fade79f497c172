"""Worker of tests/distributed/test_distributed_hf.py: ``transformers.Trainer`` with DDP, under torchrun.

A tiny LLaMA built from its config (no downloads, no tokenizer) learns a simple rule on
random token ids (each sequence counts up by one modulo the vocabulary, from a random start).
The Trainer must pick the neuron device and the ``neuron`` process group by itself. Checks:
  * ``args.device`` is ``neuron:<local rank>``, parallel mode DISTRIBUTED, the model is
    wrapped in DDP, the process group's backend is ``neuron``;
  * the logged training loss falls;
  * after training, the weights are identical on every rank (all_gather of a checksum).

``TNX_TEST_TRAINER_CPU=1`` runs it with ``use_cpu=True`` (gloo), to validate the script.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/_tiny_llama.py

import torch
import torch.distributed as dist
from transformers import LlamaForCausalLM, Trainer, TrainingArguments
from transformers.training_args import ParallelMode

from _tiny_llama import CountingDataset, tiny_llama_config

CPU = os.environ.get("TNX_TEST_TRAINER_CPU") == "1"
RANK = int(os.environ["RANK"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
VOCAB, SEQ, N_SEQ, STEPS = 64, 16, 64, 12


def main() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(vocab_size=VOCAB))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=4,
            max_steps=STEPS,
            learning_rate=5e-3,
            lr_scheduler_type="constant",
            warmup_steps=0,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            seed=0,
            use_cpu=CPU,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        dev = args.device
        print(f"rank {RANK}: args.device={dev} parallel_mode={args.parallel_mode} world_size={args.world_size} "
              f"backend={dist.get_backend() if dist.is_initialized() else None}", flush=True)
        assert args.parallel_mode == ParallelMode.DISTRIBUTED, args.parallel_mode
        assert args.world_size == int(os.environ["WORLD_SIZE"]) == 2, args.world_size
        assert dist.get_backend() == ("gloo" if CPU else "neuron"), dist.get_backend()
        if not CPU:
            assert dev == torch.device("neuron", LOCAL_RANK), f"args.device={dev}, expected neuron:{LOCAL_RANK}"

        trainer = Trainer(model=model, args=args, train_dataset=CountingDataset(N_SEQ, SEQ, VOCAB))
        trainer.train()
        wrapped = trainer.model_wrapped
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel), type(wrapped)

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(f"rank {RANK}: losses {[round(v, 4) for v in losses]}", flush=True)
    assert len(losses) == STEPS, losses
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert last < 0.8 * first, f"loss did not fall: first {first:.4f}, last {last:.4f}"

    params = list(model.parameters())
    want_dev = torch.device("cpu") if CPU else dev  # args.device is "cpu:0" with use_cpu
    assert all(p.device == want_dev for p in params), ({str(p.device) for p in params}, want_dev)
    # One checksum per parameter tensor (float64, position-weighted so swaps also show).
    sums = torch.stack([
        (p.detach().double().reshape(-1) * torch.arange(1, p.numel() + 1, dtype=torch.float64, device=p.device)).sum()
        for p in params
    ])
    gathered = [torch.zeros_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, sums)
    gathered = [g.cpu() for g in gathered]
    for r, g in enumerate(gathered):
        assert torch.equal(g, gathered[0]), f"weights of rank {r} differ from rank 0: {(g - gathered[0]).abs().max()}"
    print(f"rank {RANK}: checksum {float(gathered[0].sum()):.6f} equal on all ranks", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {RANK}: ok", flush=True)


if __name__ == "__main__":
    main()

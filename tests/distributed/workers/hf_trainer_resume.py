"""Worker of tests/distributed/test_checkpoint_resume.py: ``transformers.Trainer`` checkpoints that resume.

Started once per rank by ``tests/_dist.py``'s ``spawn_ranks`` (no torchrun agent, so a rank can
be killed without the launcher tearing the rest down). A tiny LLaMA (``MODEL_DIR``, saved by the
test) trains on token ids built in code, with AdamW and a warm-up + linear-decay schedule, so
that the optimizer, the scheduler and the data position all change the losses after a resume.

The model is sharded by accelerate's FSDP plugin, FSDP version 2, with sharded state dicts
(written through torch.distributed.checkpoint, so a checkpoint can be loaded by another number of
ranks). Transformers 5 expresses TP x FSDP only by sharding at load time
(``DistributedConfig``), and its Trainer refuses to checkpoint such models (a ValueError at
construction), so TP x FSDP resumes are shown with TorchTitan (tests/ecosystem/test_torchtitan.py).

``--neftune ALPHA`` adds NEFTune's noise to the embeddings, drawn from the device's generator at
every step: the losses after a resume then also depend on the device RNG coming back.

Modes:
  ``run``     train ``--steps`` steps; with ``--save-at K`` also save ``checkpoint-K`` on the way.
  ``kill``    the same, but every rank SIGKILLs itself right after ``checkpoint-K`` is complete.
  ``resume``  ``trainer.train(resume_from_checkpoint=--checkpoint)`` in new processes, to the end.

Rank 0 writes ``OUT_DIR/<tag>.json`` (the logged loss, grad norm and learning rate per step).
With ``--probe-at K`` every rank saves ``OUT_DIR/<tag>.state<rank>.pt`` when step K+1 begins:
the full (gathered) AdamW state per parameter name, the LR scheduler's state and the RNG states
(Python, NumPy, CPU and the rank's device), which the test compares between an uninterrupted and
a resumed run. ``TNX_DIST_DEVICE=cpu`` runs on CPU with gloo (the oracle of the script itself).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/_tiny_llama.py
from _tiny_llama import CountingDataset  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
CPU = os.environ.get("TNX_DIST_DEVICE", "neuron") == "cpu"
VOCAB, SEQ, N_SEQ = 64, 16, 256


def log(msg: str) -> None:
    print(f"rank {RANK}: {msg}", flush=True)


def full(t):
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()  # a collective: every rank calls it in the same order
    return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else t


def device_rng_state():
    if CPU:
        return None
    return torch.neuron.get_rng_state(LOCAL_RANK)


def probe_state(trainer) -> dict:
    """What must come back on resume, as comparable CPU values."""
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    optim = {}
    for group in trainer.optimizer.param_groups:
        for p in group["params"]:
            st = trainer.optimizer.state.get(p, {})
            optim[names[id(p)]] = {k: full(v) for k, v in sorted(st.items())}
    return {
        "optimizer": optim,
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in trainer.optimizer.param_groups],
        "scheduler": trainer.lr_scheduler.state_dict(),
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state(),
                "device": device_rng_state()},
    }


def main() -> None:
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("out_dir", help="where the Trainer writes checkpoints and rank 0 writes <tag>.json")
    p.add_argument("--tag", required=True)
    p.add_argument("--mode", choices=["run", "kill", "resume"], default="run")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--probe-at", type=int, default=0)
    p.add_argument("--checkpoint", default=None, help="resume from this checkpoint directory")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--neftune", type=float, default=None,
                   help="NEFTune's noise scale: noise drawn on the device at every step")
    a = p.parse_args()

    if not CPU:
        torch.neuron.set_device(LOCAL_RANK)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)

    args = TrainingArguments(
        output_dir=a.out_dir, max_steps=a.steps, per_device_train_batch_size=a.global_batch // WORLD,
        learning_rate=5e-3, lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0,
        logging_steps=1, save_strategy="steps" if a.save_at else "no", save_steps=a.save_at or 500,
        report_to=[], seed=0, data_seed=0, neftune_noise_alpha=a.neftune, use_cpu=CPU, dataloader_num_workers=0,
        disable_tqdm=True, fsdp=True, fsdp_config={
            "version": 2, "state_dict_type": "SHARDED_STATE_DICT", "reshard_after_forward": True,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
        },
    )

    class Hooks(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if a.probe_at and state.global_step == a.probe_at:
                path = os.path.join(a.out_dir, f"{a.tag}.state{RANK}.pt")
                torch.save(probe_state(trainer), path)

        def on_save(self, args, state, control, **kw):
            if a.mode == "kill" and state.global_step == a.save_at:
                dist.barrier()  # every rank's part of the checkpoint is on disk
                log(f"saved checkpoint-{state.global_step}, killing myself")
                os.kill(os.getpid(), signal.SIGKILL)

    trainer = Trainer(model=model, args=args, train_dataset=CountingDataset(N_SEQ, SEQ, VOCAB), callbacks=[Hooks()])
    want = torch.device("cpu") if CPU else torch.device("neuron", LOCAL_RANK)
    assert args.device.type == want.type, args.device
    assert dist.get_backend() == ("gloo" if CPU else "neuron"), dist.get_backend()
    if not CPU:  # accelerate shards with FSDP on accelerators only (DDP on CPU)
        assert trainer.is_fsdp_enabled and trainer.accelerator.state.fsdp_plugin.fsdp_version == 2
    trainer.train(resume_from_checkpoint=a.checkpoint if a.mode == "resume" else None)
    assert a.mode != "kill", "the kill run went past its checkpoint"

    if RANK == 0:
        steps = {h["step"]: {k: h[k] for k in ("loss", "grad_norm", "learning_rate")}
                 for h in trainer.state.log_history if "loss" in h}
        with open(os.path.join(a.out_dir, f"{a.tag}.json"), "w") as f:
            json.dump({"steps": steps}, f)
        log(f"losses {[round(s['loss'], 5) for s in steps.values()]}")
    dist.barrier()
    dist.destroy_process_group()
    log("ok")


if __name__ == "__main__":
    sys.exit(main())

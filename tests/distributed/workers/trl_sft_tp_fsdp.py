"""Worker of tests/ecosystem/test_trl.py: TRL ``SFTTrainer`` full fine-tuning of a tiny Qwen3 with tensor
parallelism 2 x FSDP2 2 on 4 processes (torchrun or ``accelerate launch``).

This is how a user of transformers 5 / accelerate 1.x / TRL expresses TP x FSDP: the model is
sharded at load time by ``from_pretrained(path, distributed_config=DistributedConfig(tp_size=2,
fsdp_size=2))`` (a 2-D device mesh ("fsdp", "tp"), the model's own TP plan, then ``fully_shard``);
the Trainer sees the sharded model and hands accelerate the matching
``ParallelismConfig(tp_size=2, dp_shard_size=2)``, so the two ranks of a TP group read the same
batch and the two FSDP groups read different ones.

``worker.py MODEL_DIR OUT_JSON [--steps N] [--batch B] [--lr LR] [--precisions fp32,bf16]``: the
model and tokenizer are read from MODEL_DIR (saved by the test); one training run per precision
(``bf16`` is TRL's default: autocast through accelerate), each from the saved weights; rank 0
writes, per run, the logged losses and grad norms and the full (gathered) values of a few trained
weights to OUT_JSON. Each rank prints ``rank R: ok``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/_tiny_qwen3.py

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
# Weights whose full values rank 0 reports: one of each TP style (colwise, rowwise), a
# replicated norm, the embedding and the head.
REPORTED = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.layers.1.self_attn.k_norm.weight",
    "lm_head.weight",
]


def train(a, bf16: bool) -> dict:
    """Loads the model sharded TP 2 x FSDP 2, runs ``a.steps`` SFT steps; returns the logged
    losses and grad norms and the full values of the REPORTED weights."""
    from accelerate.state import AcceleratorState, GradientState
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.distributed import DistributedConfig
    from trl import SFTConfig, SFTTrainer

    from _tiny_qwen3 import text_dataset

    # A second Trainer in the same process may change the mixed precision: accelerate keeps it
    # in a process-wide singleton (the process group itself stays).
    AcceleratorState._reset_state()
    GradientState._reset_state()

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        a.model_dir, distributed_config=DistributedConfig(tp_size=2, fsdp_size=2), dtype=torch.float32,
    )
    dev = torch.device("neuron", LOCAL_RANK)
    assert dist.is_initialized() and dist.get_backend() == "neuron", dist.get_backend()
    mesh = model._device_mesh
    assert mesh.device_type == "neuron", mesh
    q = dict(model.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
    # TP shards q_proj by rows; FSDP shards those rows again across the fsdp axis.
    assert isinstance(q, DTensor) and q.device_mesh.ndim == 2, q
    assert q.to_local().device == dev, q.to_local().device
    assert q.to_local().shape[0] == q.shape[0] // 4, (q.to_local().shape, q.shape)
    print(f"rank {RANK}: mesh {mesh.mesh_dim_names} {mesh.mesh.tolist()} q_proj {q.placements}", flush=True)

    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.batch, learning_rate=a.lr,
            lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no", report_to=[],
            disable_tqdm=True, seed=0, bf16=bf16, gradient_checkpointing=False, dataloader_num_workers=0,
            max_grad_norm=1.0,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=text_dataset(64), processing_class=tok)
        seen = set()  # output dtypes of a TP-sharded projection: autocast must reach the DTensor model
        model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.add(o.dtype))
        assert trainer.args.device == dev, trainer.args.device
        pc = trainer.accelerator.parallelism_config
        assert pc is not None and pc.tp_size == 2 and pc.dp_shard_size == 2, pc
        assert trainer.accelerator.mixed_precision == ("bf16" if bf16 else "no"), trainer.accelerator.mixed_precision
        trainer.train()
    assert seen == {torch.bfloat16 if bf16 else torch.float32}, seen

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    grad_norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    print(f"rank {RANK}: {'bf16' if bf16 else 'fp32'} losses {[round(v, 5) for v in losses]}", flush=True)
    params = dict(model.named_parameters())
    weights = {}
    for name in REPORTED:
        t = params[name]
        assert isinstance(t, DTensor), name
        weights[name] = t.full_tensor().detach().float().cpu().tolist()  # a collective: every rank
    return {"losses": losses, "grad_norms": grad_norms, "weights": weights}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("out_json")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="per data-parallel group")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--precisions", default="fp32", help="comma-separated runs, of fp32 and bf16")
    a = p.parse_args()

    results = {prec: train(a, bf16=(prec == "bf16")) for prec in a.precisions.split(",")}
    if RANK == 0:
        with open(a.out_json, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {RANK}: ok", flush=True)


if __name__ == "__main__":
    main()

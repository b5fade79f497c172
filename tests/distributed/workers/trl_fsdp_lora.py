"""Worker of tests/ecosystem/test_trl.py: TRL ``SFTTrainer`` with a LoRA adapter under accelerate's FSDP2
plugin, launched the way TRL documents it:

    accelerate launch --config_file <trl>/accelerate_configs/fsdp2.yaml --num_processes 2 worker.py ...

(FSDP version 2, transformer-based auto wrap, full state dict). accelerate shards the PEFT model
(frozen base and trainable adapter in the same FSDP units) over the ``neuron`` backend.

``worker.py MODEL_DIR OUT_JSON [--steps N] [--batch B] [--lr LR]``: rank 0 writes the logged losses
and the full values of the trained adapter weights (and whether the base stayed frozen) to
OUT_JSON; ``trainer.save_model`` writes the adapter (rank 0) next to it. Each rank prints
``rank R: ok``.
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


def main() -> None:
    from accelerate.utils import DistributedType
    from peft import LoraConfig
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from _tiny_qwen3 import text_dataset

    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("out_json")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-2)
    a = p.parse_args()

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    torch.manual_seed(0)  # the adapter's initialisation, as in the single-process reference
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.batch, learning_rate=a.lr,
            lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no", report_to=[],
            disable_tqdm=True, seed=0, bf16=False, gradient_checkpointing=False, dataloader_num_workers=0,
        )
        lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
        trainer = SFTTrainer(model=model, args=args, train_dataset=text_dataset(64), processing_class=tok,
                             peft_config=lora)
        dev = torch.device("neuron", LOCAL_RANK)
        assert trainer.args.device == dev, trainer.args.device
        assert trainer.is_fsdp_enabled and trainer.accelerator.distributed_type == DistributedType.FSDP
        assert trainer.accelerator.state.fsdp_plugin.fsdp_version == 2
        trainer.train()
        assert dist.get_backend() == "neuron", dist.get_backend()

        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        print(f"rank {RANK}: losses {[round(v, 5) for v in losses]}", flush=True)
        adapters, frozen_ok = {}, True
        for name, param in trainer.model.named_parameters():
            if isinstance(param, DTensor):
                assert param.device_mesh.device_type == "neuron", name
            full = param.full_tensor() if isinstance(param, DTensor) else param  # a collective: every rank
            if "lora_" in name:
                assert param.requires_grad, name
                adapters[name] = full.detach().float().cpu().tolist()
            elif param.requires_grad:
                frozen_ok = False
        trainer.save_model(os.path.join(os.path.dirname(a.out_json), "adapter"))
    if RANK == 0:
        with open(a.out_json, "w") as f:
            json.dump({"losses": losses, "adapters": adapters, "frozen_ok": frozen_ok}, f)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {RANK}: ok", flush=True)


if __name__ == "__main__":
    main()

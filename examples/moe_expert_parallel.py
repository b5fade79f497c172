"""Mixture-of-experts training with expert parallel on `neuron` processes, as Transformers does it.

    torchrun --nproc-per-node 4 examples/moe_expert_parallel.py                  # Qwen3-MoE
    torchrun --nproc-per-node 2 examples/moe_expert_parallel.py --model gpt_oss  # or deepseek_v3

(under a minute on a 2-core machine; ``--steps N`` for more or less). A tiny model of the chosen
family (8 routed experts, 2 per token) is made from its config and saved once; every rank loads
it with

    AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(
        fsdp_size=WORLD, ep_size=WORLD, ep_implementation="all_to_all"))

which splits the experts across the ranks (each holds 8 / WORLD of them), routes each token to
the ranks holding its experts with all-to-all, and shards the dense layers with FSDP2; the
collectives run on the ``neuron`` c10d backend. Each rank trains on its share of every global
batch (sequences that count up by one), so the run is the same training as one process on the
whole batch. Rank 0 then reloads the checkpoint in this process on the CPU, trains it on the
whole batches and compares: every step's loss must agree. The script exits non-zero if the loss
did not fall or the two runs disagree.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing to download

import torch
import torch.distributed as dist

VOCAB, SEQ, PER_RANK, EXPERTS, TOP_K = 64, 16, 4, 8, 2


def tiny_config(model_type: str):
    from transformers import DeepseekV3Config, GptOssConfig, Qwen3MoeConfig

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=None,
                  eos_token_id=None, tie_word_embeddings=False)
    if model_type == "qwen3_moe":
        return Qwen3MoeConfig(**common, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                              num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True)
    if model_type == "deepseek_v3":  # multi-head latent attention; first layer dense, then routed + shared
        common["num_key_value_heads"] = common["num_attention_heads"]
        return DeepseekV3Config(**common, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=EXPERTS,
                                num_experts_per_tok=TOP_K, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                                topk_group=1, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                                qk_rope_head_dim=8, v_head_dim=16, rope_scaling=None)
    if model_type == "gpt_oss":
        return GptOssConfig(**common, head_dim=16, intermediate_size=32, num_local_experts=EXPERTS,
                            num_experts_per_tok=TOP_K, sliding_window=8,
                            layer_types=["sliding_attention", "full_attention"])
    raise SystemExit(f"--model must be qwen3_moe, deepseek_v3 or gpt_oss, not {model_type!r}")


def global_batches(steps: int, world: int) -> list[torch.Tensor]:
    """Sequences that count up by one (mod the vocabulary) from a random start: learnable."""
    g = torch.Generator().manual_seed(1)
    starts = [torch.randint(1, VOCAB, (PER_RANK * world, 1), generator=g) for _ in range(steps)]
    return [(s + torch.arange(SEQ)) % (VOCAB - 1) + 1 for s in starts]


def train(model, batches, device) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-6)
    losses = []
    for ids in batches:
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3_moe", help="qwen3_moe (default), deepseek_v3 or gpt_oss")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    transformers.utils.logging.disable_progress_bar()
    config = tiny_config(args.model)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("neuron", local_rank % torch.neuron.device_count())
    torch.neuron.set_device(device)
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    if EXPERTS % world:
        raise SystemExit(f"{EXPERTS} experts do not split over {world} processes: use 1, 2, 4 or 8")

    # One checkpoint, written by rank 0 into a directory every rank can read.
    path = [tempfile.mkdtemp(prefix="moe_ep_") if rank == 0 else None]
    dist.broadcast_object_list(path)
    tmp, path = path[0], os.path.join(path[0], args.model)
    if rank == 0:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    dist.barrier()

    cfg = DistributedConfig(fsdp_size=world, ep_size=world, ep_implementation="all_to_all")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, distributed_config=cfg)
    batches = global_batches(args.steps, world)
    local = [ids[rank * PER_RANK:(rank + 1) * PER_RANK] for ids in batches]
    losses = train(model, local, device)
    means = []
    for loss in losses:  # the global batch's loss: the mean of the ranks' (equal-sized) shares
        dist.all_reduce(loss)
        means.append(float(loss) / world)

    ok = True
    if rank == 0:
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        print(f"{args.model}: {params / 1e6:.2f} M parameters, {EXPERTS} experts ({EXPERTS // world} per process), "
              f"{world} processes, {args.steps} steps")
        reference = train(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), batches, "cpu")
        for step, (got, want) in enumerate(zip(means, reference)):
            print(f"step {step}: loss {got:.4f} (one CPU process: {float(want):.4f})")
        ok = means[-1] < means[0] and all(abs(g - float(w)) <= 1e-3 * max(1.0, abs(float(w)))
                                          for g, w in zip(means, reference))
        print("loss fell and matches one process" if ok else "FAILED: the loss did not fall or the runs disagree")
    flag = torch.tensor([1.0 if ok else 0.0], device=device)
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if float(flag) == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Mixture-of-experts training with expert parallel on ``neuron``, as Transformers does it.

Tiny Qwen3-MoE, DeepSeek-V3 and GPT-OSS models load from a checkpoint with
``DistributedConfig(fsdp_size=WORLD, ep_size=WORLD)``: the experts are split across the ranks
and tokens reach their experts by all-to-all (Transformers' ``all_to_all`` implementation),
the dense layers are FSDP2-sharded. Each rank trains on its slice of the global batch; the
oracle, computed in this process on CPU, trains the same checkpoint on the whole batch.
Per model, one check: every step's loss (the mean over ranks) and every parameter after the
last step match the oracle.

``torchrun --nproc-per-node 2 moe_ep.py --ckpt DIR [--only qwen3_moe,...]``
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist

from _common import RANK, WORLD, assert_close, full, init, log, main, rank_slice

DEVICE = init()
STEPS, VOCAB, SEQ, PER_RANK = 4, 64, 8, 2
EXPERTS, TOP_K = 4, 2
# Adam normalises each update, so a gradient near zero amplifies rounding differences; eps as
# in the other distributed checks.
ADAMW = dict(lr=1e-2, weight_decay=0.0, eps=1e-6)
CKPT = sys.argv[sys.argv.index("--ckpt") + 1]
warnings.filterwarnings("ignore")


def tiny_config(model_type: str):
    """Small dims, ``EXPERTS`` routed experts (``TOP_K`` per token), eager attention; the
    router's auxiliary loss off, so the loss is the language-model loss only."""
    from transformers import DeepseekV3Config, GptOssConfig, Qwen3MoeConfig

    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=None,
                  eos_token_id=None, tie_word_embeddings=False, attn_implementation="eager")
    if model_type == "qwen3_moe":
        return Qwen3MoeConfig(**common, head_dim=8, intermediate_size=64, moe_intermediate_size=32,
                              num_experts=EXPERTS, num_experts_per_tok=TOP_K, decoder_sparse_step=1,
                              norm_topk_prob=True, output_router_logits=False)
    if model_type == "deepseek_v3":
        # first layer dense, second routed (plus the shared expert), one routing group
        common["num_key_value_heads"] = 4  # multi-head latent attention: one latent per head
        return DeepseekV3Config(**common, intermediate_size=64, moe_intermediate_size=32, n_routed_experts=EXPERTS,
                                num_experts_per_tok=TOP_K, n_shared_experts=1, first_k_dense_replace=1,
                                n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
                                qk_rope_head_dim=8, v_head_dim=8, rope_scaling=None)
    if model_type == "gpt_oss":
        return GptOssConfig(**common, head_dim=8, intermediate_size=32, num_local_experts=EXPERTS,
                            num_experts_per_tok=TOP_K, sliding_window=8, layer_types=["sliding_attention",
                                                                                     "full_attention"],
                            output_router_logits=False)
    raise ValueError(model_type)


def save_checkpoint(model_type: str) -> str:
    """Rank 0 writes the randomly initialised model; every rank then loads it."""
    from transformers import AutoModelForCausalLM

    path = os.path.join(CKPT, model_type)
    if RANK == 0:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(tiny_config(model_type), dtype=torch.float32).save_pretrained(path)
    dist.barrier()
    return path


def batches() -> list[torch.Tensor]:
    """Learnable sequences: each counts up by one (mod the vocabulary) from a random start."""
    g = torch.Generator().manual_seed(1)
    starts = [torch.randint(1, VOCAB, (PER_RANK * WORLD, 1), generator=g) for _ in range(STEPS)]
    return [(s + torch.arange(SEQ)) % (VOCAB - 1) + 1 for s in starts]


def train(model, data, device) -> list[torch.Tensor]:
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for ids in data:
        opt.zero_grad()
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def check_model(model_type: str) -> None:
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    path = save_checkpoint(model_type)
    data = batches()
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref_losses = train(ref, data, "cpu")

    cfg = DistributedConfig(fsdp_size=WORLD, ep_size=WORLD, ep_implementation="all_to_all")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, distributed_config=cfg)
    experts = [m for n, m in model.named_modules() if n.endswith("mlp.experts")]
    assert experts, "no expert modules found"
    for m in experts:  # each rank holds EXPERTS / WORLD experts
        for n, p in m.named_parameters(recurse=False):
            local = p.to_local() if isinstance(p, DTensor) else p
            assert local.shape[0] == EXPERTS // WORLD, f"{n}: local shape {tuple(local.shape)}"
    devices = {(p.to_local() if isinstance(p, DTensor) else p).device.type for p in model.parameters()}
    assert devices == {DEVICE.type}, f"parameters on {devices}, expected {DEVICE.type}"

    losses = train(model, [rank_slice(ids, RANK, WORLD) for ids in data], DEVICE)
    for step, (loss, expected) in enumerate(zip(losses, ref_losses)):
        mean = loss.clone()
        dist.all_reduce(mean)
        assert_close(mean / WORLD, expected, f"{model_type} loss at step {step}", atol=1e-5, rtol=1e-4)
    assert ref_losses[-1] < ref_losses[0], f"{model_type}: the oracle's loss did not fall: {ref_losses}"
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p, ref_params[name], f"{model_type} {name} after {STEPS} steps", atol=1e-4, rtol=1e-3)
    if RANK == 0:
        log(f"{model_type}: losses {[round(float(x), 4) for x in ref_losses]}")


CHECKS = {f"moe_ep_{m}": (lambda m=m: check_model(m)) for m in ("qwen3_moe", "deepseek_v3", "gpt_oss")}

if __name__ == "__main__":
    main(CHECKS)

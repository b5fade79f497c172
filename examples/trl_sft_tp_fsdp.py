"""Supervised fine-tuning with TRL on 4 `neuron` processes: tensor parallelism 2 x FSDP2 2.

    torchrun --nproc-per-node 4 examples/trl_sft_tp_fsdp.py
    accelerate launch --num_processes 4 examples/trl_sft_tp_fsdp.py      # the same, through accelerate

(about a minute on a 2-core machine; ``--steps N`` for more or less). Everything is made here, no
downloads: a tiny Qwen3 (2 layers, hidden 64) from its config, a word-level tokenizer
(``tokenizers`` WordLevel wrapped in ``PreTrainedTokenizerFast``, with a chat template), and a
conversational data set (``datasets.Dataset.from_dict``) in which the user gives the first numbers
of a run and the assistant continues it.

How the parallelism is expressed (transformers 5 / accelerate 1.x / TRL, unchanged):

* ``AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_size=2,
  fsdp_size=2))`` builds a 2-D device mesh ("fsdp", "tp") over the 4 ranks on ``neuron``, shards
  each layer with the model's own TP plan (q/k/v/gate/up column-wise, o/down row-wise), then
  applies FSDP2 (``fully_shard``) across the fsdp axis; the collectives run on the ``neuron``
  c10d backend.
* ``SFTTrainer`` sees the sharded model and gives accelerate ``ParallelismConfig(tp_size=2,
  dp_shard_size=2)``: the two ranks of a TP group read the same batch, the two FSDP groups
  different ones. TRL's defaults stay on: bf16 mixed precision (autocast on neuron), padding to a
  multiple of 128 on neuron.

The script checks that the loss fell and that the model learnt the task, saves the fine-tuned
model (``trainer.save_model`` gathers the shards into one ``model.safetensors``) and has rank 0
reload it on a single NeuronCore: the unsharded model must predict what the sharded one did.
It exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing to download
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # importing torch registers the `neuron` device and its c10d backend
import torch.distributed as dist

N_NUMBERS = 60
SPECIAL = ["<pad>", "<unk>", "<eos>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|> {{ m['content'] }} "
    "{% else %}<|assistant|> {{ m['content'] }} <eos> {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))


def log(msg: str) -> None:
    if RANK == 0:
        print(msg, flush=True)


def fail(msg: str) -> None:
    print(f"rank {RANK}: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def make_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + [str(n) for n in range(N_NUMBERS)])}
    core = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>",
                                  model_max_length=64)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def conversations(n: int, seed: int):
    """User: four numbers of a run; assistant: the next six."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    rows = []
    for s in torch.randint(0, N_NUMBERS - 10, (n,), generator=g).tolist():
        nums = [str(s + i) for i in range(10)]
        rows.append([{"role": "user", "content": " ".join(nums[:4])},
                     {"role": "assistant", "content": " ".join(nums[4:])}])
    return Dataset.from_dict({"messages": rows})


def save_initial_model(path: str, tok) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)


def answer_accuracy(model, tok, dataset, device) -> tuple[float, torch.Tensor]:
    """Share of assistant tokens predicted right (greedy, teacher forcing), and the logits.
    Every rank runs the same batch (the model is sharded across all of them)."""
    texts = [tok.apply_chat_template(m, tokenize=False) for m in dataset["messages"]]
    batch = tok(texts, return_tensors="pt", padding=True)
    ids = batch["input_ids"].to(device)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"].to(device)).logits
    logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
    pred = logits[:, :-1].argmax(-1).cpu()
    target = batch["input_ids"][:, 1:]
    assistant = tok.convert_tokens_to_ids("<|assistant|>")
    # the answer: the tokens after <|assistant|>, up to and including <eos>
    after = (batch["input_ids"] == assistant).long().cumsum(1)[:, :-1] > 0
    keep = after & (target != tok.pad_token_id)
    return (pred[keep] == target[keep]).float().mean().item(), logits.float().cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8, help="sequences per data-parallel group and step")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--out", default=None, help="where to save the fine-tuned model (default: a temporary directory)")
    a = ap.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)  # FSDP2/DTensor notes, the same on every rank
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.distributed import DistributedConfig
    from transformers.utils import logging as hf_logging
    from trl import SFTConfig, SFTTrainer

    hf_logging.set_verbosity_error()
    if int(os.environ.get("WORLD_SIZE", "1")) != 4:
        fail("run on 4 processes: torchrun --nproc-per-node 4 examples/trl_sft_tp_fsdp.py")
    # The process group first (transformers would create the same one), so that rank 0 can
    # share where it saved the initial model.
    torch.neuron.set_device(LOCAL_RANK % torch.neuron.device_count())
    dist.init_process_group("neuron")
    device = torch.device("neuron", torch.neuron.current_device())

    with tempfile.TemporaryDirectory() as tmp:
        where = [tmp]
        dist.broadcast_object_list(where, src=0)  # rank 0's directory for everyone
        init_dir, out_dir = os.path.join(where[0], "init"), a.out or os.path.join(where[0], "sft")
        if RANK == 0:
            save_initial_model(init_dir, make_tokenizer())
        dist.barrier()

        tok = AutoTokenizer.from_pretrained(init_dir)
        model = AutoModelForCausalLM.from_pretrained(
            init_dir, distributed_config=DistributedConfig(tp_size=2, fsdp_size=2), dtype=torch.float32)
        mesh = model._device_mesh
        q = model.model.layers[0].self_attn.q_proj.weight
        log(f"mesh {mesh.mesh_dim_names} over {mesh.device_type} ranks {mesh.mesh.tolist()}; q_proj "
            f"{tuple(q.shape)} stored as {q.placements}, {tuple(q.to_local().shape)} per rank")

        train, held_out = conversations(512, seed=0), conversations(32, seed=1)
        args = SFTConfig(output_dir=os.path.join(where[0], "trainer"), max_steps=a.steps,
                         per_device_train_batch_size=a.batch, learning_rate=a.lr, lr_scheduler_type="constant",
                         warmup_steps=0, logging_steps=max(1, a.steps // 6), save_strategy="no", report_to=[],
                         disable_tqdm=True, seed=0, gradient_checkpointing=False)
        trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tok)
        pc = trainer.accelerator.parallelism_config
        log(f"trainer: device {trainer.args.device}, mixed precision {trainer.accelerator.mixed_precision}, "
            f"parallelism tp={pc.tp_size} dp_shard={pc.dp_shard_size}, global batch "
            f"{a.batch * pc.dp_shard_size}")
        acc0, _ = answer_accuracy(model, tok, held_out, device)
        t0 = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - t0
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        log(f"{a.steps} steps in {elapsed:.1f} s; loss {' -> '.join(f'{v:.3f}' for v in losses)}")
        # accelerate wrapped forward in bf16 autocast for training; evaluate the weights in fp32
        model = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
        acc, logits = answer_accuracy(model, tok, held_out, device)
        log(f"held-out answers, tokens right: {acc0:.0%} before, {acc:.0%} after")
        if not losses[-1] < 0.7 * losses[0]:
            fail(f"the loss did not fall enough: {losses}")
        if acc < 0.8:
            fail(f"the model did not learn the task ({acc:.0%} of answer tokens right)")

        trainer.save_model(out_dir)  # every rank takes part in gathering the shards
        dist.barrier()
        if RANK == 0:
            single = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device)
            acc1, logits1 = answer_accuracy(single, tok, held_out, device)
            err = (logits1 - logits).abs().max().item()
            log(f"saved to {out_dir}; reloaded on one NeuronCore ({device}): {acc1:.0%} right, "
                f"max |logit difference| vs the sharded model {err:.1e}")
            if err > 1e-4:
                fail("the reloaded model does not predict what the sharded one did")
        dist.barrier()
    dist.destroy_process_group()
    log("OK")


if __name__ == "__main__":
    main()

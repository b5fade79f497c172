"""TRL on ``neuron``: SFT with LoRA and DPO on one process, and full SFT with tensor parallelism
2 x FSDP2 2 on four processes; a tiny Qwen3 built from its config, a word-level tokenizer made in
code and ``datasets.Dataset.from_dict`` data (tests/_tiny_qwen3.py). The oracle is the same run on
the CPU: in float32 the two must agree to rounding; in bfloat16 (TRL's default: autocast through
accelerate, with neuron's autocast op lists, which are CUDA's, not the CPU's) within bf16 noise.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from _dist import accelerate_launch, torchrun
from _tiny_llama import NEURON
from _tiny_qwen3 import conversation_dataset, make_tokenizer, preference_dataset, text_dataset, tiny_qwen3

trl = pytest.importorskip("trl")
from peft import LoraConfig  # noqa: E402
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # noqa: E402


@pytest.fixture(autouse=True)
def offline_and_fresh_accelerate(monkeypatch):
    """Nothing here needs the Hub: no telemetry ping from the TRL trainers. accelerate keeps
    process-wide singletons that each Trainer sets; start every run from a clean state."""
    import huggingface_hub.constants as hub
    from accelerate.state import AcceleratorState, GradientState

    monkeypatch.setattr(hub, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def reset_accelerate():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def common_args(out, use_cpu: bool, precision: str, **kw) -> dict:
    """Trainer arguments shared by the runs; ``precision="default"`` leaves bf16 unset (TRL: True)."""
    args = dict(output_dir=str(out), per_device_train_batch_size=8, logging_steps=1, report_to=[],
                save_strategy="no", disable_tqdm=True, seed=0, use_cpu=use_cpu, lr_scheduler_type="constant",
                dataloader_num_workers=0)
    if precision != "default":
        args["bf16"] = precision == "bf16"
    args.update(kw)
    return args


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


class DtypeProbe:
    """Records the output dtypes of one Linear during training (autocast on or off)."""

    def __init__(self, module: torch.nn.Module):
        self.dtypes: set[torch.dtype] = set()
        self.devices: set[str] = set()
        module.register_forward_hook(self)

    def __call__(self, module, inputs, output):
        self.dtypes.add(output.dtype)
        self.devices.add(output.device.type)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


# Relative difference allowed between bf16 training runs on neuron and on CPU after several
# steps. Neuron's bf16 matrix products are CPU's numbers (fp32 sums rounded once), summed in a
# different order, so single elements differ by one bf16 ulp (2**-8 relative) and each optimizer
# step carries those differences on.
BF16_TRAINING_DRIFT = 1e-2


def assert_close_list(actual, expected, atol, rtol=0.0, what=""):
    assert len(actual) == len(expected) and actual, (actual, expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert math.isfinite(a) and abs(a - e) <= atol + rtol * abs(e), f"{what} step {i}: {actual} vs {expected}"


# ---- SFT with LoRA, one process ----------------------------------------------------------------

SFT_STEPS = 12


def run_sft_lora(out, use_cpu: bool, precision: str):
    tok = make_tokenizer()
    model = tiny_qwen3(tok, seed=0)
    # The CPU run pads as TRL does on neuron, so that both see the same shapes.
    pad = dict(pad_to_multiple_of=128) if use_cpu else {}
    args = SFTConfig(**common_args(out, use_cpu, precision, max_steps=SFT_STEPS, learning_rate=2e-2, **pad))
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=conversation_dataset(32), processing_class=tok,
                         peft_config=lora)
    probe = DtypeProbe(trainer.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer)
    trainer.train()
    adapters = {n: p.detach().cpu() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return trainer, probe, adapters


@pytest.mark.parametrize("precision", ["default", "fp32"], ids=["bf16_default", "fp32"])
def test_sft_lora_on_neuron_matches_cpu(tmp_path, precision):
    trainer, probe, adapters = run_sft_lora(tmp_path / "neuron", use_cpu=False, precision=precision)
    args = trainer.args
    assert args.device == NEURON
    assert args.gradient_checkpointing  # TRL's default, kept
    # TRL pads to a multiple of 128 on neuron (one compiled shape per bucket on hardware).
    assert args.pad_to_multiple_of == 128
    assert all(p.device == NEURON for p in trainer.model.parameters())
    if precision == "default":
        # TRL turns bf16 on by default; transformers' and accelerate's bf16 checks accept neuron.
        assert args.bf16 is True and trainer.accelerator.mixed_precision == "bf16"
        assert probe.dtypes == {torch.bfloat16}, probe.dtypes
    else:
        assert trainer.accelerator.mixed_precision == "no" and probe.dtypes == {torch.float32}
    assert probe.devices == {"neuron"}
    losses = logged(trainer, "loss")
    assert len(losses) == SFT_STEPS
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1, losses
    assert adapters and all("lora_" in n for n in adapters)

    reset_accelerate()
    cpu_trainer, cpu_probe, cpu_adapters = run_sft_lora(tmp_path / "cpu", use_cpu=True, precision=precision)
    assert cpu_trainer.args.device.type == "cpu" and cpu_probe.devices == {"cpu"}
    cpu_losses = logged(cpu_trainer, "loss")
    assert cpu_adapters.keys() == adapters.keys()
    if precision == "fp32":
        # Same shapes, same kernels: observed bit-identical.
        assert_close_list(losses, cpu_losses, atol=1e-5, rtol=1e-5, what="fp32 loss")
        for name, p in cpu_adapters.items():
            torch.testing.assert_close(adapters[name], p, atol=1e-4, rtol=1e-3, msg=lambda m, n=name: f"{n}: {m}")
            assert rel_err(adapters[name], p) < 1e-5, (name, rel_err(adapters[name], p))
    else:
        # bf16 products round as on CPU but sum in another order (BF16_TRAINING_DRIFT): the
        # first steps agree closely; then Adam at a 2e-2 learning rate turns one-ulp differences
        # in small gradient elements into different updates (the adapters end ~20% apart), so the
        # losses are the comparison.
        assert_close_list(losses[:4], cpu_losses[:4], atol=1e-3, rtol=1e-3, what="bf16 loss")
        # Per step through the first half; after that a gradient spike (step 8 here) lets single
        # steps wander by a few percent on either side, so the second half compares its mean.
        half = SFT_STEPS // 2
        assert_close_list(losses[:half], cpu_losses[:half], atol=0.0, rtol=BF16_TRAINING_DRIFT, what="bf16 loss")
        late, cpu_late = sum(losses[half:]) / half, sum(cpu_losses[half:]) / half
        assert abs(late - cpu_late) <= BF16_TRAINING_DRIFT * cpu_late, (losses, cpu_losses)


# ---- DPO, one process --------------------------------------------------------------------------

DPO_STEPS = 8


def run_dpo(out, use_cpu: bool, precision: str):
    tok = make_tokenizer()
    model = tiny_qwen3(tok, seed=0)
    ref = copy.deepcopy(model)  # a model built in code has no path TRL could reload the reference from
    pad = dict(pad_to_multiple_of=128) if use_cpu else {}  # as TRL pads on neuron
    args = DPOConfig(**common_args(out, use_cpu, precision, max_steps=DPO_STEPS, learning_rate=1e-3, **pad))
    trainer = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=preference_dataset(32),
                         processing_class=tok)
    trainer.train()
    return trainer


@pytest.mark.parametrize("precision", ["default", "fp32"], ids=["bf16_default", "fp32"])
def test_dpo_on_neuron_matches_cpu(tmp_path, precision):
    trainer = run_dpo(tmp_path / "neuron", use_cpu=False, precision=precision)
    assert trainer.args.device == NEURON
    assert all(p.device == NEURON for p in trainer.model.parameters())
    assert all(p.device == NEURON for p in trainer.ref_model.parameters())
    assert trainer.accelerator.mixed_precision == ("bf16" if precision == "default" else "no")
    losses, margins = logged(trainer, "loss"), logged(trainer, "rewards/margins")
    acc = logged(trainer, "rewards/accuracies")
    assert len(losses) == DPO_STEPS and all(math.isfinite(v) for v in losses + margins)
    # Policy == reference at the start: loss log 2; then the chosen (counting up) completions
    # gain on the rejected ones.
    assert abs(losses[0] - math.log(2)) < 1e-3, losses
    assert sum(losses[-2:]) / 2 < 0.62, losses
    assert min(margins[-2:]) > 0.1 and min(acc[-2:]) >= 0.75, (margins, acc)

    reset_accelerate()
    cpu = run_dpo(tmp_path / "cpu", use_cpu=True, precision=precision)
    cpu_losses, cpu_margins = logged(cpu, "loss"), logged(cpu, "rewards/margins")
    tol = dict(atol=1e-5, rtol=1e-5) if precision == "fp32" else dict(atol=1e-3, rtol=1e-3)
    assert_close_list(losses, cpu_losses, **tol, what="loss")
    assert_close_list(margins, cpu_margins, **tol, what="margin")
    param_tol = 1e-5 if precision == "fp32" else BF16_TRAINING_DRIFT
    for (name, p), q in zip(cpu.model.named_parameters(), trainer.model.parameters()):
        assert rel_err(q, p) < param_tol, (name, rel_err(q, p))


# ---- more TRL trainers and data formats, one process, fp32 against the CPU ------------------------


def prompt_completion_dataset(n: int = 32):
    from datasets import Dataset

    p = preference_dataset(n)
    return Dataset.from_dict({"prompt": list(p["prompt"]), "completion": list(p["chosen"])})


def unpaired_preference_dataset(n: int = 16):
    from datasets import Dataset

    p = preference_dataset(n)
    return Dataset.from_dict({"prompt": list(p["prompt"]) * 2, "completion": list(p["chosen"]) + list(p["rejected"]),
                              "label": [True] * n + [False] * n})


def _sft_packed(tok, args):
    return SFTTrainer(model=tiny_qwen3(tok), args=SFTConfig(**args, packing=True, max_length=32),
                      train_dataset=text_dataset(64), processing_class=tok)


def _sft_prompt_completion(tok, args):
    return SFTTrainer(model=tiny_qwen3(tok), args=SFTConfig(**args), train_dataset=prompt_completion_dataset(),
                      processing_class=tok)


def _dpo_lora_ipo(tok, args):
    # With a PEFT model the reference is the base model with the adapter disabled.
    return DPOTrainer(model=tiny_qwen3(tok), args=DPOConfig(**args, loss_type=["ipo"]),
                      train_dataset=preference_dataset(32), processing_class=tok,
                      peft_config=LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.0))


def _reward(tok, args):
    from transformers import Qwen3ForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    from _tiny_qwen3 import tiny_qwen3_config

    torch.manual_seed(0)
    model = Qwen3ForSequenceClassification(tiny_qwen3_config(tok, num_labels=1))
    return RewardTrainer(model=model, args=RewardConfig(**args), train_dataset=preference_dataset(32),
                         processing_class=tok)


def _kto(tok, args):
    from trl import KTOConfig, KTOTrainer

    model = tiny_qwen3(tok)
    return KTOTrainer(model=model, ref_model=copy.deepcopy(model), args=KTOConfig(**args),
                      train_dataset=unpaired_preference_dataset(), processing_class=tok)


MORE_TRAINERS = {"sft_packed": (_sft_packed, 1e-2), "sft_prompt_completion": (_sft_prompt_completion, 1e-2),
                 "dpo_lora_ipo": (_dpo_lora_ipo, 1e-2), "reward": (_reward, 1e-3), "kto": (_kto, 1e-3)}


@pytest.mark.parametrize("case", list(MORE_TRAINERS))
def test_more_trainers_match_cpu(tmp_path, case):
    make, lr = MORE_TRAINERS[case]
    tok = make_tokenizer()
    runs = {}
    for use_cpu in (False, True):
        reset_accelerate()
        pad = dict(pad_to_multiple_of=128) if use_cpu else {}
        args = common_args(tmp_path / str(use_cpu), use_cpu, "fp32", max_steps=4, learning_rate=lr, **pad)
        trainer = make(tok, args)
        assert trainer.args.device.type == ("cpu" if use_cpu else "neuron")
        trainer.train()
        runs[use_cpu] = (trainer, logged(trainer, "loss"))
    (dev, losses), (cpu, cpu_losses) = runs[False], runs[True]
    assert all(p.device == NEURON for p in dev.model.parameters())
    assert len(losses) == 4 and len(set(losses)) > 1, losses  # it trained
    assert_close_list(losses, cpu_losses, atol=1e-5, rtol=1e-5, what=f"{case} loss")
    for (name, p), q in zip(cpu.model.named_parameters(), dev.model.parameters()):
        assert rel_err(q, p) < 1e-5, (name, rel_err(q, p))


def test_grpo_generates_and_trains_on_neuron(tmp_path):
    """Online RL: GRPO samples completions with ``generate`` on neuron, scores them with a reward
    function and takes policy-gradient steps. Sampling draws from neuron's generator, so the run
    is not compared with the CPU's; the checks are on what it produced."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = make_tokenizer()
    seen = []

    def counts_up(completions, **kwargs):
        seen.extend(completions)
        scores = []
        for c in completions:
            w = [int(x) for x in c.split() if x.isdigit()]
            scores.append(float(sum(b == a + 1 for a, b in zip(w, w[1:]))))
        return scores

    prompts = Dataset.from_dict({"prompt": list(preference_dataset(16)["prompt"])})
    args = GRPOConfig(**common_args(tmp_path, False, "default", per_device_train_batch_size=8, num_generations=4,
                                    max_completion_length=6, max_steps=3, learning_rate=1e-3))
    trainer = GRPOTrainer(model=tiny_qwen3(tok), reward_funcs=counts_up, args=args, train_dataset=prompts,
                          processing_class=tok)
    before = {n: p.detach().cpu().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.args.device == NEURON and trainer.accelerator.mixed_precision == "bf16"
    assert len(seen) == 3 * 8 and all(isinstance(c, str) for c in seen)
    lengths = logged(trainer, "completions/mean_length")
    assert lengths and all(0 < v <= 6 for v in lengths), lengths
    assert all(math.isfinite(v) for v in logged(trainer, "loss") + logged(trainer, "reward"))
    moved = max((p.detach().cpu() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved > 0, "no weight changed"


# ---- SFT, TP 2 x FSDP 2 on four processes ------------------------------------------------------

TP_STEPS, TP_BATCH, TP_LR = 4, 4, 3e-3  # TP_BATCH per data-parallel group: global batch 8


def test_sft_tp2_fsdp2_four_processes_match_one_process(tmp_path):
    """Full fine-tuning sharded by ``DistributedConfig(tp_size=2, fsdp_size=2)`` on 4 ranks
    (tests/distributed/workers/trl_sft_tp_fsdp.py) against one CPU process on the same global batches."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = make_tokenizer()
    model_dir = tmp_path / "tiny-qwen3"
    tiny_qwen3(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out_json = tmp_path / "result.json"
    res = torchrun("trl_sft_tp_fsdp.py", 4, str(model_dir), str(out_json), "--steps", str(TP_STEPS),
                   "--batch", str(TP_BATCH), "--lr", str(TP_LR), "--precisions", "fp32,bf16", timeout=240,
                   env={"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
    for r in range(4):
        assert f"rank {r}: ok" in res.out, res.out
    result = json.loads(out_json.read_text())

    # Oracle: one CPU process, fp32, the whole global batch per step (same sampler order).
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = SFTConfig(**common_args(tmp_path / "cpu", True, "fp32", max_steps=TP_STEPS, learning_rate=TP_LR,
                                   per_device_train_batch_size=2 * TP_BATCH, gradient_checkpointing=False,
                                   warmup_steps=0, max_grad_norm=1.0))
    ref = SFTTrainer(model=ref_model, args=args, train_dataset=text_dataset(64),
                     processing_class=AutoTokenizer.from_pretrained(model_dir))
    ref.train()
    ref_losses, ref_norms = logged(ref, "loss"), logged(ref, "grad_norm")
    assert ref_losses[-1] < ref_losses[0] - 0.3, ref_losses

    fp32 = result["fp32"]
    assert_close_list(fp32["losses"], ref_losses, atol=1e-5, rtol=1e-5, what="TPxFSDP fp32 loss")
    assert_close_list(fp32["grad_norms"], ref_norms, atol=1e-5, rtol=1e-5, what="TPxFSDP fp32 grad norm")
    params = dict(ref_model.named_parameters())
    for name, values in fp32["weights"].items():
        # Elementwise, Adam can turn a reduction-order difference on a near-zero gradient into a
        # few lr * 1e-3 (observed <= 2.5e-6); the tensors as a whole agree to ~1e-7.
        got = torch.tensor(values)
        torch.testing.assert_close(got, params[name].detach(), atol=5e-5, rtol=1e-4,
                                   msg=lambda m, n=name: f"{n} after {TP_STEPS} steps: {m}")
        assert rel_err(got, params[name]) < 1e-5, (name, rel_err(got, params[name]))

    # TRL's default precision on the same mesh: bf16 autocast; the loss falls and follows fp32.
    bf16 = result["bf16"]
    assert bf16["losses"] != fp32["losses"]  # autocast really ran (rounding differs)
    assert_close_list(bf16["losses"], ref_losses, atol=1e-2, what="TPxFSDP bf16 loss")
    assert bf16["losses"][-1] < bf16["losses"][0] - 0.3, bf16["losses"]


# ---- SFT with LoRA under accelerate's FSDP2 plugin, two processes ---------------------------------


def test_sft_lora_fsdp2_accelerate_two_processes_match_one_process(tmp_path):
    """TRL's own FSDP2 accelerate config (``trl/accelerate_configs/fsdp2.yaml``) with a LoRA adapter
    on 2 neuron processes (tests/distributed/workers/trl_fsdp_lora.py) against one CPU process on the same global
    batches. ``--mixed_precision no`` overrides the config's bf16 so that the two agree to rounding."""
    from peft import LoraConfig
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config_file = Path(trl.__file__).parent / "accelerate_configs" / "fsdp2.yaml"
    assert config_file.is_file(), config_file
    tok = make_tokenizer()
    model_dir = tmp_path / "tiny-qwen3"
    tiny_qwen3(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out_json = tmp_path / "run" / "result.json"
    out_json.parent.mkdir()
    out = accelerate_launch("trl_fsdp_lora.py", 2, ["--config_file", str(config_file), "--mixed_precision", "no"],
                            [str(model_dir), str(out_json), "--steps", "4", "--batch", "4", "--lr", "2e-2"],
                            timeout=240)
    for r in range(2):
        assert f"rank {r}: ok" in out, out
    result = json.loads(out_json.read_text())
    assert result["frozen_ok"], "a base weight was trainable"

    # Oracle: one CPU process with the whole global batch (2 x 4) per step.
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)  # the adapter's initialisation, as in the worker
    args = SFTConfig(**common_args(tmp_path / "cpu", True, "fp32", max_steps=4, learning_rate=2e-2,
                                   per_device_train_batch_size=8, gradient_checkpointing=False, warmup_steps=0,
                                   pad_to_multiple_of=128))
    ref = SFTTrainer(model=ref_model, args=args, train_dataset=text_dataset(64),
                     processing_class=AutoTokenizer.from_pretrained(model_dir),
                     peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
    ref.train()
    ref_losses = logged(ref, "loss")
    assert ref_losses[-1] < ref_losses[0] - 0.1, ref_losses
    assert_close_list(result["losses"], ref_losses, atol=1e-5, rtol=1e-5, what="FSDP2 LoRA loss")

    ref_params = {n: p.detach() for n, p in ref.model.named_parameters() if "lora_" in n}
    assert result["adapters"].keys() == ref_params.keys() and ref_params
    for name, values in result["adapters"].items():
        got = torch.tensor(values)
        torch.testing.assert_close(got, ref_params[name], atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
        assert rel_err(got, ref_params[name]) < 1e-5, (name, rel_err(got, ref_params[name]))
    # The adapter that trainer.save_model wrote holds the same trained weights.
    saved = load_file(out_json.parent / "adapter" / "adapter_model.safetensors")
    assert len(saved) == len(ref_params)
    for name, t in saved.items():
        key = name.replace(".weight", ".default.weight")
        torch.testing.assert_close(t, ref_params[key], atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")

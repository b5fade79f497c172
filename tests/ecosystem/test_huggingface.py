"""Hugging Face stack on neuron: accelerate and transformers detect the device, and a tiny
LlamaForCausalLM trains, autocasts and generates on it like it does on the CPU (the oracle)."""

from __future__ import annotations

import pytest
import torch
from _tiny_llama import NEURON, llama_pair, tiny_llama_config

# eps=1e-6 rather than AdamW's 1e-8: Adam's first update is about lr * g / (|g| + eps), so
# for a parameter whose gradient is ~1e-9 (there are a few) a 1e-9 difference in g -- far
# inside the gradient tolerance -- would move the update by a sizeable fraction of lr.
ADAMW = dict(lr=1e-3, eps=1e-6, weight_decay=0.01)
FP32 = dict(atol=1e-5, rtol=1e-4)
# Gradients are O(1e-3), where FP32's atol alone would let a 1% error through, so each tensor's
# relative error ||neuron - cpu|| / ||cpu|| is bounded too (observed: <= 1.5e-6 grads, 5e-7 logits).
FP32_REL_NORM = 1e-5


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps process-wide singletons (Accelerator and Trainer both set them)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def lm_batch(seed: int, batch: int = 2, seq: int = 16, vocab: int = 64):
    """Token ids, attention mask and labels; the second row ends in 4 right-padding tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def to_neuron(batch: dict) -> dict:
    return {k: v.to(NEURON) for k, v in batch.items()}


def rel_norm_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().cpu().double(), expected.detach().double()
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def assert_grads_close(cpu_model, neuron_model, max_rel_norm_err=None, **tol):
    for (name, p), q in zip(cpu_model.named_parameters(), neuron_model.parameters()):
        assert p.grad is not None and q.grad is not None, name
        assert q.grad.device == NEURON, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, **tol, msg=lambda m, n=name: f"grad of {n}: {m}")
        if max_rel_norm_err is not None:
            err = rel_norm_err(q.grad, p.grad)
            assert err < max_rel_norm_err, f"grad of {name}: relative error {err:.3g}"


def assert_params_close(cpu_model, neuron_model, **tol):
    for (name, p), q in zip(cpu_model.named_parameters(), neuron_model.parameters()):
        assert q.device == NEURON, name
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **tol, msg=lambda m, n=name: f"{n}: {m}")


# ---- detection --------------------------------------------------------------------------


def test_accelerate_and_transformers_detect_neuron():
    from accelerate.utils import is_neuron_available
    from transformers.utils import is_torch_neuron_available

    assert is_neuron_available() is True
    assert is_neuron_available(check_device=True) is True
    assert is_torch_neuron_available() is True


# ---- accelerate ---------------------------------------------------------------------------


def test_accelerator_prepares_and_steps_on_neuron(fresh_accelerate_state):
    from accelerate import Accelerator

    acc = Accelerator()
    # In a single (non-distributed) process accelerate reports the bare device type, as
    # it does for CUDA (torch.device("cuda")); it must resolve to neuron:0.
    assert acc.device.type == "neuron"
    assert acc.device.index in (None, 0)
    assert torch.empty(1, device=acc.device).device == NEURON

    cpu_model, model = llama_pair(seed=1)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), **ADAMW)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    batches = [lm_batch(seed) for seed in range(4)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None)  # already batched
    model, opt, loader = acc.prepare(model, opt, loader)
    assert all(p.device == NEURON for p in model.parameters())

    seen = 0
    for batch, cpu_batch in zip(loader, batches):
        assert all(v.device == NEURON for v in batch.values())
        loss = model(**batch).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()

        cpu_loss = cpu_model(**cpu_batch).loss
        cpu_loss.backward()
        cpu_opt.step()
        cpu_opt.zero_grad()

        torch.testing.assert_close(loss.detach().cpu(), cpu_loss.detach(), **FP32)
        seen += 1
    assert seen == len(batches)
    assert_params_close(cpu_model, acc.unwrap_model(model), **FP32)


# ---- transformers.Trainer ----------------------------------------------------------------


class PatternDataset(torch.utils.data.Dataset):
    """Shifted copies of a repeating token pattern: easy to learn in a few steps."""

    def __init__(self, n: int = 32, seq: int = 16, vocab: int = 64):
        base = torch.arange(seq) % 8 + 3
        self.rows = [(base + i) % vocab for i in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def run_trainer(model, output_dir, use_cpu: bool):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=20,
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=use_cpu,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PatternDataset())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses


def test_trainer_trains_on_neuron_like_on_cpu(tmp_path, fresh_accelerate_state):
    from accelerate.state import AcceleratorState, GradientState

    cpu_model, model = llama_pair(seed=2)

    trainer, losses = run_trainer(model, tmp_path / "neuron", use_cpu=False)
    assert trainer.args.device == NEURON
    assert all(p.device == NEURON for p in trainer.model.parameters())
    assert len(losses) == 20
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses

    # Oracle: the same run (same init, seed, data order, optimizer -- by default the fused
    # AdamW, so this covers neuron's _fused_adamw_ kernel) on the CPU.
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    cpu_trainer, cpu_losses = run_trainer(cpu_model, tmp_path / "cpu", use_cpu=True)
    assert cpu_trainer.args.device == torch.device("cpu")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), **FP32)


# ---- model parity --------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied_embeddings"])
def test_llama_forward_backward_adamw_match_cpu(tied):
    # Tied: lm_head and embed_tokens share one weight, whose grad sums both uses.
    cpu_model, model = llama_pair(tiny_llama_config(tie_word_embeddings=tied), seed=0)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), **ADAMW)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)

    for step in range(2):  # the second step runs with non-zero Adam state
        batch = lm_batch(seed=10 + step)
        cpu_out = cpu_model(**batch)
        out = model(**to_neuron(batch))
        assert out.logits.device == NEURON and out.logits.dtype == torch.float32
        torch.testing.assert_close(out.logits.detach().cpu(), cpu_out.logits.detach(), **FP32)
        assert rel_norm_err(out.logits, cpu_out.logits) < FP32_REL_NORM
        torch.testing.assert_close(out.loss.detach().cpu(), cpu_out.loss.detach(), **FP32)

        cpu_out.loss.backward()
        out.loss.backward()
        assert_grads_close(cpu_model, model, max_rel_norm_err=FP32_REL_NORM, **FP32)

        cpu_opt.step()
        opt.step()
        cpu_opt.zero_grad()
        opt.zero_grad()
        assert_params_close(cpu_model, model, **FP32)


@pytest.mark.parametrize(
    "impl", [dict(foreach=False), dict(foreach=True), dict(fused=True)], ids=["for_loop", "foreach", "fused"]
)
def test_adamw_implementations_match_cpu_given_the_same_grads(impl):
    # Isolates the optimizer kernels from forward/backward rounding: same params, same grads.
    torch.manual_seed(0)
    init = [torch.randn(33, 17), torch.randn(17), torch.randn(3, 4, 5)]
    cpu_params = [p.clone().requires_grad_() for p in init]
    params = [p.to(NEURON).requires_grad_() for p in init]
    cpu_opt = torch.optim.AdamW(cpu_params, lr=1e-2, weight_decay=0.1, **impl)
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **impl)
    for step in range(3):
        grads = [torch.randn_like(p) * 10.0**-step for p in init]
        for p, q, g in zip(cpu_params, params, grads):
            p.grad = g.clone()
            q.grad = g.to(NEURON)
        cpu_opt.step()
        opt.step()
    for p, q in zip(cpu_params, params):
        assert q.device == NEURON
        torch.testing.assert_close(q.detach().cpu(), p.detach(), atol=1e-7, rtol=1e-6)
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[q][key].device == NEURON
            torch.testing.assert_close(opt.state[q][key].cpu(), cpu_opt.state[p][key], atol=1e-7, rtol=1e-6)


def test_llama_bf16_autocast_matches_cpu_autocast():
    cpu_model, model = llama_pair(seed=0)
    batch = lm_batch(seed=20)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cpu_out = cpu_model(**batch)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = model(**to_neuron(batch))

    # Autocast really ran the projections in bf16 on both devices.
    assert cpu_out.logits.dtype == torch.bfloat16
    assert out.logits.dtype == torch.bfloat16 and out.logits.device == NEURON
    # Loose: bf16 keeps 8 mantissa bits (logits here are < 1, one ulp <= 2**-8 ~ 4e-3).
    torch.testing.assert_close(out.logits.float().cpu(), cpu_out.logits.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.loss.float().cpu(), cpu_out.loss.float(), atol=2e-3, rtol=2e-3)

    cpu_out.loss.backward()
    out.loss.backward()
    for (name, p), q in zip(cpu_model.named_parameters(), model.parameters()):
        assert q.grad.dtype == torch.float32, name  # master weights and grads stay fp32
    # bf16 rounding differs between the two runs at the ~1e-2 level (observed < 1e-2).
    assert_grads_close(cpu_model, model, max_rel_norm_err=5e-2, atol=1e-2, rtol=1e-1)


# ---- generation ------------------------------------------------------------------------------


@pytest.mark.parametrize("use_cache", [True, False], ids=["kv_cache", "no_cache"])
def test_greedy_generate_matches_cpu_exactly(use_cache):
    cpu_model, model = llama_pair(seed=3)
    cpu_model.eval()
    model.eval()
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(1, 64, (2, 7), generator=g)
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0  # the second prompt is 3 tokens shorter, left-padded
    prompt = prompt.masked_fill(mask == 0, 0)
    kwargs = dict(max_new_tokens=10, do_sample=False, use_cache=use_cache, pad_token_id=0)

    with torch.no_grad():
        cpu_tokens = cpu_model.generate(prompt, attention_mask=mask, **kwargs)
        tokens = model.generate(prompt.to(NEURON), attention_mask=mask.to(NEURON), **kwargs)

    assert tokens.device == NEURON
    assert cpu_tokens.shape == (2, 7 + 10)
    assert torch.equal(tokens.cpu(), cpu_tokens), f"\nneuron {tokens.tolist()}\ncpu    {cpu_tokens.tolist()}"

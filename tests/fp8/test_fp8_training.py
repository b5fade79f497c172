"""torchao's FP8 training (Float8Linear, tensor-wise and row-wise recipes) and MXFP8 training
(MXFP8TrainingOpConfig) on a tiny Llama on neuron: on trn3 it trains, tracking a bf16 run; on trn2
the first FP8 matmul raises the platform error. Each platform runs in a fresh process
(NEURON_PLATFORM is read at start-up)."""

import json

import pytest

pytest.importorskip("torchao")

_TRAIN = r'''
import json, sys, warnings, torch, torch_neuronx
warnings.filterwarnings("ignore")
from torchao.float8 import Float8LinearConfig, convert_to_float8_training
from transformers import LlamaConfig, LlamaForCausalLM

def run(recipe, steps=20):
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=None,
                      eos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).to("neuron")
    if recipe in ("MXFP8_RCEIL", "MXFP8_EMULATED_RCEIL"):
        from torchao.quantization import quantize_
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
        quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe[recipe]),
                  filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear) and fqn != "lm_head")
    elif recipe:
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                                   module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    torch_neuronx.clear_op_tracking()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(1, 256, (4, 32), generator=torch.Generator().manual_seed(0)).to("neuron")
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    kinds = sorted({type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__})
    weights = sorted({type(p.data).__name__ for p in model.parameters()})
    return dict(losses=losses, linears=kinds, weights=weights,
                scaled_mm="aten::_scaled_mm" in torch_neuronx.get_executed_ops())

out = {}
for recipe in sys.argv[1:]:
    try:
        out[recipe] = run(None if recipe == "bf16" else recipe)
    except RuntimeError as e:
        out[recipe] = dict(error=str(e).split("\n")[0])
print(json.dumps(out))
'''


def _train(run_python, platform, *recipes):
    lines = run_python(_TRAIN, env={"NEURON_PLATFORM": platform}, args=["-c", _TRAIN, *recipes])
    return json.loads(lines.strip().splitlines()[-1])


def test_float8_training_tracks_bf16_on_trn3(run_python):
    out = _train(run_python, "trn3", "bf16", "tensorwise", "rowwise")
    base = out["bf16"]["losses"]
    for recipe in ("tensorwise", "rowwise"):
        r = out[recipe]
        assert "Float8Linear" in r["linears"], r
        losses = r["losses"]
        assert losses[-1] < 0.8 * losses[0], (recipe, losses)  # it learns
        # FP8 forward/backward against bf16: the same curve within the recipe's expected gap.
        for a, b in zip(losses, base):
            assert abs(a - b) <= 0.05 * b, (recipe, losses, base)


def test_float8_training_refused_on_trn2(run_python):
    out = _train(run_python, "trn2", "tensorwise")
    err = out["tensorwise"].get("error", "")
    # the conversion itself refuses, before any step
    assert err.startswith("convert_to_float8_training: FP8 compute needs Trainium 3"), out
    assert "NEURON_PLATFORM=trn3" in err, out


def test_mxfp8_training_tracks_bf16_on_trn3(run_python):
    out = _train(run_python, "trn3", "bf16", "MXFP8_RCEIL", "MXFP8_EMULATED_RCEIL")
    base, native, emulated = out["bf16"]["losses"], out["MXFP8_RCEIL"], out["MXFP8_EMULATED_RCEIL"]
    assert "MXFP8TrainingWeightWrapperTensor" in native["weights"], native
    assert native["scaled_mm"], native  # the native MX GEMM, not a dequantize-then-bf16 emulation
    losses = native["losses"]
    assert losses[-1] < 0.8 * losses[0], losses
    # MXFP8 (e4m3 gradients too) against bf16, and against torchao's own emulation of the recipe.
    for a, b, e in zip(losses, base, emulated["losses"]):
        assert abs(a - b) <= 0.05 * b, (losses, base)
        assert abs(a - e) <= 0.02 * e, (losses, emulated["losses"])


def test_mxfp8_training_refused_on_trn2(run_python):
    out = _train(run_python, "trn2", "MXFP8_RCEIL")
    err = out["MXFP8_RCEIL"].get("error", "")
    assert err.startswith("quantize_ with MXFP8TrainingOpConfig: FP8 compute needs Trainium 3"), out
    assert "NEURON_PLATFORM=trn3" in err, out

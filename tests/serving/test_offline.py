"""vLLM's offline ``LLM.generate`` on ``neuron`` (torch_neuronx.vllm): greedy tokens equal to
Transformers' ``generate`` on CPU for the same tiny checkpoints of each served family (Llama,
Qwen3, Qwen3-MoE, Gemma 3 with its sliding window, GPT-OSS with sinks, YaRN and MoE), for a batch of
prompts of mixed lengths under chunked prefill; requests preempted when KV blocks run out are
resumed with the same tokens; tensor parallel 2 over two ``neuron`` processes gives the same
tokens; vLLM's default piecewise compilation (each piece through torch.compile's ``neuron`` backend)
and its DYNAMO_TRACE_ONCE mode give the same tokens; without an explicit size the KV cache gets its share of the device's capacity. One vLLM process runs all engines (importing vLLM is most of the start-up)."""

from __future__ import annotations

import pytest

from _dist import remove_leaked, shm_entries
from _serving import build_model, hf_greedy, requires_serve_env, run_offline

pytestmark = requires_serve_env

FAMILIES = ("llama", "qwen3", "qwen3_moe", "gemma3", "gpt_oss")
# 4-, 20- and 40-token prompts (longer than Gemma 3's and GPT-OSS's 8-token windows, and than the
# 16-token chunks below, so prefills are split and mixed with decodes)
PROMPTS = [[18, 19, 20, 21], list(range(30, 50)), [(7 * i) % 190 + 17 for i in range(40)]]
MAX_TOKENS = [8, 12, 6]
# Eager unless a job asks otherwise (vLLM's default, piecewise compilation, is tested on two families
# below: compiling every job would double this module's time).
ENGINE = {"dtype": "float32", "max_model_len": 128, "max_num_seqs": 8, "kv_cache_memory_bytes": 4 << 20,
          "max_num_batched_tokens": 16, "block_size": 16, "enforce_eager": True}
PIECEWISE = ("llama", "gpt_oss")  # the simplest family and the one with the most kinds of layers
# preemption: 8 requests of 64 tokens (4 blocks of 16 each) share 12 blocks
PREEMPT_PROMPTS = [list(range(20 + 3 * i, 44 + 3 * i)) for i in range(8)]
PREEMPT_MAX_TOKENS = [40] * 8
LLAMA_BLOCK_BYTES = 2 * 16 * 2 * 2 * 16 * 4  # layers x slots x kv heads x (k, v) x head dim x fp32
# the KV cache sized by profiling: gpu_memory_utilization of the device's capacity minus the peak use
DEVICE_MIB, KV_FRACTION = 512, 0.25


def _job(model, prompts, max_tokens, **engine):
    return {"model": str(model), "engine": {**ENGINE, **engine},
            "requests": [{"prompt_token_ids": p, "max_tokens": n} for p, n in zip(prompts, max_tokens)],
            "metrics": ["vllm:num_preemptions"] if engine.get("disable_log_stats") is False else []}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serving_offline")
    models = {f: build_model(tmp, f) for f in FAMILIES}
    jobs = [_job(models[f], PROMPTS, MAX_TOKENS) for f in FAMILIES]
    jobs.append(_job(models["llama"], PREEMPT_PROMPTS, PREEMPT_MAX_TOKENS, kv_cache_memory_bytes=12 * LLAMA_BLOCK_BYTES,
                     max_num_batched_tokens=256, disable_log_stats=False))
    jobs.append(_job(models["llama"], PROMPTS, MAX_TOKENS, tensor_parallel_size=2))
    jobs.append(_job(models["llama"], PROMPTS, MAX_TOKENS, compilation_config={"mode": 2}, enforce_eager=False))
    jobs.append(_job(models["llama"], PROMPTS, MAX_TOKENS, kv_cache_memory_bytes=None,
                     gpu_memory_utilization=KV_FRACTION))
    # vLLM's defaults: piecewise compilation (VLLM_COMPILE), each piece through the neuron backend
    jobs += [_job(models[f], PROMPTS, MAX_TOKENS, enforce_eager=False) for f in PIECEWISE]
    before = shm_entries()
    results = run_offline(jobs, tmp, NEURON_DEVICE_MEMORY=f"{DEVICE_MIB}MiB")
    leaked = remove_leaked(before)
    return models, results, leaked


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_transformers(runs, family):
    models, results, _ = runs
    got = results[FAMILIES.index(family)]
    assert got["platform"] == "neuron"
    assert got["tokens"] == hf_greedy(models[family], PROMPTS, MAX_TOKENS)


def test_preempted_requests_resume_with_the_same_tokens(runs):
    models, results, _ = runs
    got = results[len(FAMILIES)]
    assert got["metrics"]["vllm:num_preemptions"] > 0, "the KV cache was large enough: nothing was preempted"
    assert got["tokens"] == hf_greedy(models["llama"], PREEMPT_PROMPTS, PREEMPT_MAX_TOKENS)


def test_tensor_parallel_2_equals_tensor_parallel_1(runs):
    models, results, leaked = runs
    tp2, tp1 = results[len(FAMILIES) + 1], results[0]
    assert tp2["tokens"] == tp1["tokens"]
    assert leaked == [], f"shared-memory segments left behind: {leaked}"


def test_kv_cache_is_sized_from_the_device_memory_statistics(runs):
    models, results, _ = runs
    got = results[len(FAMILIES) + 3]
    assert got["tokens"] == results[0]["tokens"]
    budget = KV_FRACTION * DEVICE_MIB * 2**20
    # all of the budget but the profile run's peak (weights and activations of a tiny model)
    assert 0.95 * budget <= got["num_gpu_blocks"] * LLAMA_BLOCK_BYTES <= budget


def test_compiled_with_the_neuron_backend_equals_eager(runs):
    _, results, _ = runs
    compiled = results[len(FAMILIES) + 2]
    assert compiled["tokens"] == results[0]["tokens"]
    # vLLM traced the model once (DYNAMO_TRACE_ONCE) and torch.compile's neuron backend compiled it
    assert compiled["neuron_backend_calls"] - results[len(FAMILIES) + 1]["neuron_backend_calls"] >= 1


@pytest.mark.parametrize("family", PIECEWISE)
def test_default_piecewise_compilation_equals_transformers(runs, family):
    models, results, _ = runs
    i = len(FAMILIES) + 4 + PIECEWISE.index(family)
    got = results[i]
    assert got["tokens"] == hf_greedy(models[family], PROMPTS, MAX_TOKENS)
    # the graph split at each layer's attention: one piece more than the layers, each compiled
    # by the neuron backend
    pieces = got["neuron_backend_calls"] - results[i - 1]["neuron_backend_calls"]
    assert pieces == _layers(models[family]) + 1, pieces


def _layers(model_dir) -> int:
    import json

    return json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]

"""Mixture-of-experts training with expert parallel on ``neuron``: tiny Qwen3-MoE,
DeepSeek-V3 and GPT-OSS models load through Transformers' ``DistributedConfig(fsdp_size=N,
ep_size=N)``, experts split across the ranks with all-to-all token routing over the
``neuron`` backend, and train; every step's loss and every parameter afterwards match the
same training on one process (CPU). Worker: tests/distributed/workers/moe_ep.py."""

from __future__ import annotations

import re

import pytest

from _dist import torchrun

MODELS = ["qwen3_moe", "deepseek_v3", "gpt_oss"]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def launch(request, tmp_path_factory):
    n = request.param
    res = torchrun("moe_ep.py", n, "--ckpt", str(tmp_path_factory.mktemp(f"moe{n}")), timeout=400, expect_ok=False)
    return n, res


@pytest.mark.parametrize("model", MODELS)
def test_expert_parallel_training_matches_one_process(launch, model):
    n, res = launch
    m = re.search(rf"^(?:\[\w+\]:)?CHECK moe_ep_{model} (ok|FAIL.*?)(?:  \[[\d.]+ s\])?$", res.out, re.M)
    assert m, f"no result for {model} on {n} ranks:\n{res.out[-5000:]}"
    assert m.group(1).startswith("ok"), f"{model} on {n} ranks: {m.group(1)}\n{res.out[-8000:]}"
    # the tokens really went through the backend's all-to-all
    assert re.search(rf"collectives of moe_ep_{model}: .*'all_to_all'", res.out), res.out[-3000:]


def test_launch_exits_cleanly(launch):
    n, res = launch
    assert res.rc == 0, res.out[-5000:]
    for r in range(n):
        assert re.search(rf"^(\[\w+\]:)?rank {r}: ok$", res.out, re.M), f"rank {r} did not finish"

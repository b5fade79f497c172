"""``make bench-serve`` lists the performance model's TTFT and TPOT on trn2/trn3 for the model and
request shapes it benchmarks (benchmarks/serve.py ``estimated_rows``). Runs in the main environment:
the estimate needs no vLLM."""

from __future__ import annotations

import argparse
import importlib.util

import pytest
from transformers import AutoConfig

import torch_neuronx.estimate as estimate
from _serving import ROOT, build_model


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "benchmarks" / "serve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_estimated_rows_are_the_models_prefill_and_decode(bench, tmp_path):
    model = build_model(tmp_path, "llama")
    args = argparse.Namespace(concurrency=[1, 8], input_len=48, output_len=16)
    rows = {(r["backend"], r["concurrency"]): r for r in bench.estimated_rows(model, args)}
    assert set(rows) == {(f"{p} (estimated)", c) for p in ("trn2", "trn3") for c in (1, 8)}
    config = AutoConfig.from_pretrained(model)
    for c in (1, 8):
        # the same numbers the estimate CLI gives for that shape: prefill of the wave, decode at mean context
        prefill = estimate(config, task="prefill", batch=c, seq=48, platforms="trn2,trn3")
        decode = estimate(config, task="decode", batch=c, seq=56, platforms="trn2,trn3")
        for p in ("trn2", "trn3"):
            r = rows[(f"{p} (estimated)", c)]
            assert r["mean_ttft_ms"] == pytest.approx(prefill.results[p].step_time_s * 1e3)
            assert r["mean_tpot_ms"] == pytest.approx(decode.results[p].step_time_s * 1e3)
            wave = r["mean_ttft_ms"] + 15 * r["mean_tpot_ms"]
            assert r["request_throughput"] == pytest.approx(c / wave * 1e3)
            assert r["output_throughput"] == pytest.approx(16 * r["request_throughput"])
    for p in ("trn2", "trn3"):
        # a bigger wave takes longer per step but serves more requests per second
        one, eight = rows[(f"{p} (estimated)", 1)], rows[(f"{p} (estimated)", 8)]
        assert eight["mean_ttft_ms"] > one["mean_ttft_ms"] and eight["mean_tpot_ms"] > one["mean_tpot_ms"]
        assert eight["request_throughput"] > one["request_throughput"]

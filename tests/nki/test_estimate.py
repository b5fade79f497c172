"""nki.estimate / nki.benchmark: the engine model from Python (the step model's costs of our shipped
kernels, kernel_time, are tested in tests/estimate/test_kernel_time.py).

Schedules are checked against times computed by hand from the platform model's facts and the cost
rules (docs/estimate.md, "Kernels: the engine model"); the C++ schedules are in
tests/cpp/test_cost_model.cpp."""

import json

import numpy as np
import pytest

import nki
import nki.isa as nisa
import nki.language as nl
from nki import TensorSpec
from nki._core import target_facts


@nki.jit
def load_scale_store(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=y)
    return out


def queue_rate(platform):
    """One DMA queue's bytes per ns: the per-engine rate, within the core's share of HBM bandwidth."""
    f = target_facts(platform)
    return min(f["dma_engine_gbps"], f["hbm_tbps"] * 1000 / f["physical_cores_per_chip"] / f["dma_engines_per_core"])


def test_schedule_matches_the_hand_computed_one():
    r = nki.estimate(load_scale_store, platform="trn2")(TensorSpec((128, 512), "float32"))
    f = target_facts("trn2")
    dma = 600 + 8 * 512 * 4 / queue_rate("trn2")        # DGE 600 ns, then 16 queues x 8 rows of 2 KiB
    vec = (60 + 512) / f["vector_ghz"]                  # SBUF access + N cycles (fp32)
    lat = 100 / f["vector_ghz"]                         # the store waits for VectorE's fixed latency
    assert r.latency_ns == pytest.approx(dma + vec + lat + dma, rel=1e-12)
    assert r.latency_us == pytest.approx(r.latency_ns / 1e3)
    assert r.engines["vector"]["instruction_count"] == 1
    assert r.engines["dma"]["instruction_count"] == 2
    assert r.metrics["hbm_read_bytes"] == r.metrics["hbm_write_bytes"] == 128 * 512 * 4
    assert r.metrics["mbu_estimated_percent"] > 0 and r.metrics["mfu_estimated_percent"] == 0
    ops = [i[5] for i in r.instructions()]
    assert ops == ["dma_copy", "tensor_scalar", "dma_copy"]
    assert "estimated" in r.table()


def test_arguments_may_be_arrays_tensors_fake_or_specs_and_estimates_are_deterministic():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec = nki.estimate(load_scale_store)(TensorSpec((128, 256), "float32"))
    arr = nki.estimate(load_scale_store)(np.zeros((128, 256), np.float32))
    meta = nki.estimate(load_scale_store)(torch.empty(128, 256, device="meta"))
    with FakeTensorMode():
        fake = nki.estimate(load_scale_store)(torch.empty(128, 256))
    again = nki.estimate(load_scale_store)(TensorSpec((128, 256), "float32"))
    assert spec.latency_ns == arr.latency_ns == meta.latency_ns == fake.latency_ns == again.latency_ns
    assert spec.instructions() == again.instructions()


def test_platform_from_the_environment_and_unknown_platform(monkeypatch):
    x = TensorSpec((128, 512), "float32")
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    assert nki.estimate(load_scale_store)(x).platform == "trn3"
    assert nki.estimate(load_scale_store, platform="gen2")(x).platform == "trn1"
    with pytest.raises(ValueError, match="unknown platform 'trn9'.*trn2"):
        nki.estimate(load_scale_store, platform="trn9")


@nki.jit
def exchange(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    me = nl.program_id(0)
    nisa.sendrecv(dst=r, src=t, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_launch_of_two_programs_with_sendrecv(tmp_path):
    r = nki.estimate(exchange[2], platform="trn2")(TensorSpec((128, 512), "float32"))
    assert r.programs == 2
    load = 600 + 8 * 512 * 4 / queue_rate("trn2")
    # load; the exchange (DGE + the same bytes over the queues); the store
    assert r.latency_ns == pytest.approx(3 * load, rel=1e-12)
    path = r.to_perfetto(tmp_path / "trace.json")
    trace = json.loads(open(path).read())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"core 0", "core 1", "tensor", "vector", "dma queue 0", "dma queue 15"} <= names
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {s["name"] for s in slices} == {"dma_copy", "sendrecv"}
    assert all(s["args"]["source"].endswith(f"test_estimate.py:{s['args']['source'].rsplit(':', 1)[1]}")
               for s in slices)
    assert any(s["name"] == "sendrecv" and "test_estimate.py" in s["args"]["source"] for s in slices)


def test_benchmark_behaves_as_aws_with_estimated_latencies(capsys, tmp_path):
    bench = nki.benchmark(warmup=2, iters=10, save_trace_name=str(tmp_path / "p.json"))(load_scale_store)
    assert bench(np.zeros((128, 512), np.float32)) is None
    lat = bench.benchmark_result.nc_latency
    est = nki.estimate(load_scale_store)(TensorSpec((128, 512), "float32"))
    assert lat.get_latency_percentile(50) == lat.get_latency_percentile(99) == pytest.approx(est.latency_us)
    assert lat.estimated and bench.benchmark_result.estimated
    assert "estimated" in capsys.readouterr().out
    assert json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    with pytest.raises(ValueError, match="iters >= 1"):
        nki.benchmark(iters=0)
    with pytest.raises(ValueError, match="percentile"):
        lat.get_latency_percentile(101)

"""``nki.estimate`` and ``nki.benchmark``: how long a kernel would take on a NeuronCore, without
running it.

The kernel is traced and verified exactly as ``nki.jit`` does (once per signature), then the
engine model (csrc/nki/cost_model.cpp) schedules every instruction on the target's engines and DMA
queues from AWS's published instruction rules. Arguments may be numpy arrays, torch tensors (CPU,
neuron, meta or fake: only shape and dtype are read) or ``nki.TensorSpec(shape, dtype)``. The
platform is chosen as for NKI targets: ``platform=`` or NEURON_PLATFORM_TARGET_OVERRIDE /
NEURON_PLATFORM (default trn2). Every number is an estimate; docs/estimate.md lists the rules and
what is not modelled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ._jit import Kernel, TensorSpec, _classify, _Launch, _target_from_env
from ._trace import _core, normalize_dtype

__all__ = ["estimate", "benchmark", "EstimateReport", "TensorSpec"]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync", "dma")

ASSUMPTIONS = (
    "one NeuronCore per program of the launch; the core gets 1/cores of the chip's HBM bandwidth",
    "each engine runs its instructions in program order; engines wait only on true data dependencies",
    "DMA instructions are split over the core's DMA queues by partition rows",
    "on-chip memory is the kernel's tiles (no allocator address reuse or spilling of tiles modelled)",
)
NOT_MODELLED = (
    "SBUF/PSUM bank conflicts between engines",
    "instruction fetch and the sequencers' issue limits",
    "DMA queue placement by the compiler (all queues are available to every DMA)",
    "HBM page/refresh effects and contention with other cores",
    "ScalarE / GpSimdE data-type dependent rates beyond VectorE's performance mode",
    "kernel launch overhead on the host",
)


def _platform_name(platform) -> str:
    name = _target_from_env() if platform is None else str(platform)
    try:
        return _core.target_facts(name)["platform"]
    except ValueError:
        raise ValueError(f"unknown platform {platform!r}: nki.estimate models trn1 (gen2), inf2, trn2 (gen3) and "
                         "trn3 (gen4); pass platform='trn2' or set NEURON_PLATFORM_TARGET_OVERRIDE") from None


def _spec(x):
    """A tensor argument as a TensorSpec (shape and dtype only); anything else unchanged."""
    if isinstance(x, TensorSpec):
        return TensorSpec(tuple(int(d) for d in x.shape), normalize_dtype(x.dtype))
    mod = type(x).__module__
    if mod.startswith("torch") or mod.startswith("numpy"):
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is not None and dtype is not None:
            try:
                return TensorSpec(tuple(int(d) for d in shape), normalize_dtype(dtype))
            except TypeError:
                _classify(x)  # the error nki.jit gives for this argument
                raise
    return x


@dataclass
class EstimateReport:
    """The modelled schedule of one kernel call (or launch). Times are estimates."""

    platform: str
    programs: int
    latency_ns: float
    metrics: dict
    _native: object = field(repr=False)
    assumptions: tuple = ASSUMPTIONS
    not_modelled: tuple = NOT_MODELLED

    @property
    def latency_us(self) -> float:
        return self.latency_ns * 1e-3

    @property
    def engines(self) -> dict:
        """Per engine: active time (% of the kernel, summed over programs), active µs, instruction count."""
        m, out = self.metrics, {}
        for e in ENGINES:
            key = "dma" if e == "dma" else f"{e}_engine"
            pct = m[f"{key}_active_time_percent"]
            out[e] = {"active_time_percent": pct, "active_time_us": pct / 100 * self.latency_us * self.programs,
                      "instruction_count": m[f"{key}_instruction_count"]}
        return out

    @property
    def bound(self) -> str:
        """The busiest engine (AWS's rule of thumb: compute-bound when it is >= 90% active)."""
        return max(ENGINES, key=lambda e: self.engines[e]["active_time_percent"])

    def instructions(self) -> list:
        """(program, index, engine, start_ns, end_ns, op, file, line) per instruction."""
        return self._native.instructions()

    def table(self) -> str:
        m = self.metrics
        rows = [f"nki.estimate on {self.platform} ({self.programs} program{'s' if self.programs != 1 else ''}): "
                f"{self.latency_us:.3f} us (estimated)",
                f"  {'engine':<8} {'active %':>9} {'active us':>10} {'instructions':>13}"]
        for e, v in self.engines.items():
            rows.append(f"  {e:<8} {v['active_time_percent']:>9.1f} {v['active_time_us']:>10.3f} "
                        f"{v['instruction_count']:>13}")
        rows.append(f"  hfu {m['hfu_estimated_percent']:.1f}%  mfu {m['mfu_estimated_percent']:.1f}%  "
                    f"mbu {m['mbu_estimated_percent']:.1f}%  bound by {self.bound}")
        rows.append(f"  hbm read {m['hbm_read_bytes']} B  write {m['hbm_write_bytes']} B  "
                    f"spill save {m['spill_save_bytes']} B  reload {m['spill_reload_bytes']} B")
        rows.append(f"  model {m['model_flops']:.4g} FLOPs, transpose {m['transpose_flops']:.4g}, "
                    f"throttled {m['throttled_flops']:.4g}")
        rows.append("  not modelled: " + "; ".join(self.not_modelled))
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()

    def to_perfetto(self, path) -> str:
        """Writes the schedule as Chrome trace JSON (open in ui.perfetto.dev or chrome://tracing): one
        track per engine and DMA queue per program; each slice names its instruction and source line."""
        with open(path, "wb") as f:
            f.write(self._native.chrome_trace())
        return str(path)

    def to_dict(self) -> dict:
        return {"platform": self.platform, "programs": self.programs, "latency_us": self.latency_us,
                "metrics": dict(self.metrics), "engines": self.engines, "assumptions": list(self.assumptions),
                "not_modelled": list(self.not_modelled), "estimated": True}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)


def _model(kernel: Kernel, grid: tuple, args, kwargs, platform: str) -> EstimateReport:
    args = [_spec(a) for a in args]
    kwargs = {k: _spec(v) for k, v in kwargs.items()}
    compiled, _ = kernel._compiled(args, kwargs, grid, platform)
    native = _core.estimate(compiled.programs, platform)
    return EstimateReport(native.platform, native.programs, native.total_ns, native.metrics(), native)


def _unwrap(kernel):
    if isinstance(kernel, _Launch):
        return kernel.kernel, kernel.grid
    if isinstance(kernel, Kernel):
        return kernel, ()
    if callable(kernel):
        return Kernel(kernel), ()
    raise TypeError(f"nki.estimate takes an @nki.jit kernel (or kernel[grid]), got {type(kernel).__name__}")


class _Estimator:
    def __init__(self, kernel, grid, platform):
        self.kernel, self.grid, self.platform = kernel, grid, platform

    def __getitem__(self, grid) -> "_Estimator":
        return _Estimator(self.kernel, self.kernel[grid].grid, self.platform)

    def __call__(self, *args, **kwargs) -> EstimateReport:
        return _model(self.kernel, self.grid, args, kwargs, _platform_name(self.platform))


def estimate(kernel, platform=None):
    """``nki.estimate(kernel)(*args)`` (or ``nki.estimate(kernel[2])(...)``): the kernel traced and
    modelled on ``platform`` (default: the NKI target from the environment), returning an
    :class:`EstimateReport`. Nothing runs; arguments only give shapes and dtypes."""
    k, grid = _unwrap(kernel)
    _platform_name(platform)  # an unknown platform fails here, before any tracing
    return _Estimator(k, grid, platform)


# ---- nki.benchmark ------------------------------------------------------------------------------
class _Latency:
    """``benchmark_result.nc_latency``: latencies in microseconds, as AWS's. Every iteration of the
    model takes the same (estimated) time, so every percentile is that time."""

    estimated = True

    def __init__(self, samples_us: list):
        self._samples = sorted(samples_us)

    def get_latency_percentile(self, percentile) -> float:
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {percentile}")
        s = self._samples
        return s[min(len(s) - 1, max(0, math.ceil(percentile / 100 * len(s)) - 1))]

    def __repr__(self):
        return f"<nc_latency estimated p50={self.get_latency_percentile(50):.3f} us over {len(self._samples)} iters>"


@dataclass
class _BenchmarkResult:
    nc_latency: _Latency
    report: EstimateReport
    estimated: bool = True


class _Benchmark:
    def __init__(self, kernel, grid, warmup, iters, platform, save_trace_name):
        self.kernel, self.grid, self.warmup, self.iters = kernel, grid, warmup, iters
        self.platform, self.save_trace_name = platform, save_trace_name
        self.benchmark_result = None

    def __getitem__(self, grid) -> "_Benchmark":
        return _Benchmark(self.kernel, self.kernel[grid].grid, self.warmup, self.iters, self.platform,
                          self.save_trace_name)

    def __call__(self, *args, **kwargs):
        report = _model(self.kernel, self.grid, args, kwargs, _platform_name(self.platform))
        # Warm-up iterations are discarded as on hardware; the model has no run-to-run variation.
        self.benchmark_result = _BenchmarkResult(_Latency([report.latency_us] * self.iters), report)
        if self.save_trace_name:
            report.to_perfetto(self.save_trace_name)
        print(f"nki.benchmark: {self.kernel.__name__} on {report.platform}: {report.latency_us:.3f} us "
              f"(estimated by the engine model, not measured; {self.warmup} warmup + {self.iters} iterations)")
        return None


def benchmark(kernel=None, *, warmup=5, iters=10, platform=None, save_neff_name=None, save_trace_name=None,
              additional_compile_opt=None, device_lock=None, benchmark_machine=None, **options):
    """``nki.benchmark(warmup=, iters=)(kernel)(*args)``, as AWS's: afterwards
    ``.benchmark_result.nc_latency.get_latency_percentile(p)`` gives microseconds — here estimated
    by the engine model instead of measured. ``save_trace_name`` writes the modelled schedule as
    Chrome trace JSON (not an NTFF profile); ``save_neff_name`` and the device options are accepted
    and unused (there is no NEFF and no device)."""
    if not isinstance(warmup, int) or warmup < 0 or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"nki.benchmark needs warmup >= 0 and iters >= 1, got warmup={warmup!r}, iters={iters!r}")
    _platform_name(platform)

    def wrap(k):
        kern, grid = _unwrap(k)
        return _Benchmark(kern, grid, warmup, iters, platform, save_trace_name)

    return wrap if kernel is None else wrap(kernel)

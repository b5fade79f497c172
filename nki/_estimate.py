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

import functools
import json
import math
from dataclasses import dataclass, field

from ._jit import Kernel, TensorSpec, _classify, _Launch, _target_from_env
from ._trace import _core, normalize_dtype

__all__ = ["estimate", "benchmark", "EstimateReport", "TensorSpec", "kernel_time", "KernelTime"]

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


# ---- shipped kernels at a shape (the step model's costs of matmul / attention / norms) ----------
@dataclass(frozen=True)
class KernelTime:
    seconds: float
    flops: float
    hbm_read_bytes: int
    hbm_write_bytes: int
    engines: dict
    bound: str
    instructions: int
    assumptions: tuple


_KERNELS = {"matmul": "matmul_kernel", "softmax": "softmax_kernel", "rmsnorm": "rmsnorm_kernel",
            "flash_attention_fwd": "flash_attention_fwd_kernel", "flash_attention_bwd": "flash_attention_bwd_kernel"}
_TILE = 128


def _shipped(name):
    if name not in _KERNELS:
        raise ValueError(f"unknown shipped kernel {name!r}; expected one of {', '.join(_KERNELS)}")
    from torch_neuronx.kernels import nki_kernels  # imports only nki

    return getattr(nki_kernels, _KERNELS[name])


def _run_shipped(name, shapes, dtype, platform, causal):
    k = _shipped(name)
    specs = [TensorSpec(tuple(s), "float32" if (name == "flash_attention_bwd" and i == 5) else dtype)
             for i, s in enumerate(shapes)]
    if name == "rmsnorm":
        args = specs + [1e-6]
    elif name.startswith("flash_attention"):
        scale = 1.0 / math.sqrt(shapes[0][-1])
        args = specs + [scale, causal]
    else:
        args = specs
    r = _model(k, (), args, {}, platform)
    return r


def _up(x, m=_TILE):
    return max(m, -(-x // m) * m)


def _probe_sizes(full, small):
    """Two probe sizes below `full` (multiples of 128) for a linear fit, or None to trace it whole."""
    if full <= 2 * small:
        return None
    return small, 2 * small


def _lin(x, x1, y1, x2, y2):
    return y1 + (y2 - y1) * (x - x1) / (x2 - x1)


@functools.lru_cache(maxsize=4096)
def _kernel_time(name, shapes, dtype, platform, causal) -> KernelTime:
    notes = []
    if name == "matmul":
        (M, K), (_, N) = shapes
        size = 2 if dtype in ("bfloat16", "float16") else (1 if "float8" in dtype else 4)
        n_k = -(-K // _TILE)
        resident = n_k * N * size <= 96 * 1024

        def n_probe_ok(n):  # probes stay on the kernel's path (b resident in SBUF or not)
            return (n_k * n * size <= 96 * 1024) == resident

        pm = _probe_sizes(M, 256)
        n_small = 1024
        while not n_probe_ok(n_small) and n_small < N:
            n_small *= 2
        pn = _probe_sizes(N, n_small) if n_probe_ok(2 * n_small) else None
        ms = pm or (M,)
        ns = pn or (N,)
        runs = {(m, n): _run_shipped(name, ((m, K), (K, n)), dtype, platform, causal) for m in ms for n in ns}
        t = {key: r.latency_ns for key, r in runs.items()}
        if pm and pn:
            (m1, m2), (n1, n2) = pm, pn
            lo = _lin(M, m1, t[m1, n1], m2, t[m2, n1])
            hi = _lin(M, m1, t[m1, n2], m2, t[m2, n2])
            total = _lin(N, n1, lo, n2, hi)
        elif pm:
            total = _lin(M, pm[0], t[pm[0], N], pm[1], t[pm[1], N])
        elif pn:
            total = _lin(N, pn[0], t[M, pn[0]], pn[1], t[M, pn[1]])
        else:
            total = t[M, N]
        if pm or pn:
            notes.append(f"modelled at M in {ms}, N in {ns} and extrapolated linearly in the row / column blocks")
        ref = runs[ms[-1], ns[-1]]
        scale = (M * N) / (ms[-1] * ns[-1])
        flops = 2.0 * M * N * K
        rd = int(ref.metrics["hbm_read_bytes"] * scale)
        wr = M * N * size
    elif name in ("softmax", "rmsnorm"):
        (R, C) = shapes[0]
        pr = _probe_sizes(R, 256)
        rs = pr or (R,)
        runs = {r: _run_shipped(name, ((r, C),) + tuple(shapes[1:]), dtype, platform, causal) for r in rs}
        total = _lin(R, pr[0], runs[pr[0]].latency_ns, pr[1], runs[pr[1]].latency_ns) if pr else runs[R].latency_ns
        if pr:
            notes.append(f"modelled at {rs} rows and extrapolated linearly")
        ref = runs[rs[-1]]
        scale = R / rs[-1]
        flops = 0.0
        rd = int(ref.metrics["hbm_read_bytes"] * scale)
        wr = int(ref.metrics["hbm_write_bytes"] * scale)
    elif name in ("flash_attention_fwd", "flash_attention_bwd"):
        BH, S, D = shapes[0]
        Sk = shapes[1][1]
        longest = max(S, Sk)
        if longest <= 1024:
            lams = (1.0,)
        else:  # 3 probes with S and Sk scaled together: blocks grow quadratically
            lams = tuple(x / longest for x in (256, 512, 1024))

        def at(bh, lam):
            s, sk = _up(int(S * lam)), _up(int(Sk * lam))
            shp = [(bh, s, D), (bh, sk, D), (bh, sk, D)]
            if name == "flash_attention_bwd":
                shp += [(bh, s, D), (bh, s, D), (bh, s)]
            return _run_shipped(name, tuple(shp), dtype, platform, causal)

        one = [at(1, lam).latency_ns for lam in lams]
        if len(lams) == 1:
            per_head = one[0]
        else:  # quadratic through the three probes, evaluated at the full length
            (x1, x2, x3), (y1, y2, y3) = lams, one
            per_head = (y1 * (1 - x2) * (1 - x3) / ((x1 - x2) * (x1 - x3)) + y2 * (1 - x1) * (1 - x3) /
                        ((x2 - x1) * (x2 - x3)) + y3 * (1 - x1) * (1 - x2) / ((x3 - x1) * (x3 - x2)))
            notes.append(f"modelled at sequence lengths x{lams} of ({S}, {Sk}) and fitted quadratically")
        total = per_head
        if BH > 1:  # heads overlap at their boundaries: the increment of a second head, per head
            two = at(2, lams[-1]).latency_ns
            total = per_head * (1 + (BH - 1) * (two - one[-1]) / one[-1])
            notes.append(f"{BH} heads from the increment of a second head at the largest probe")
        ref = at(1, lams[-1])
        scale = BH / (lams[-1] ** 2)
        pairs = S * Sk / (2 if causal else 1)
        flops = BH * pairs * D * 2.0 * (2 if name == "flash_attention_fwd" else 5)
        rd = int(ref.metrics["hbm_read_bytes"] * scale)
        wr = int(ref.metrics["hbm_write_bytes"] * BH / lams[-1])
    else:  # pragma: no cover (checked by _shipped)
        raise AssertionError(name)
    return KernelTime(seconds=total * 1e-9, flops=flops, hbm_read_bytes=rd, hbm_write_bytes=wr,
                      engines={e: v["active_time_percent"] for e, v in ref.engines.items()}, bound=ref.bound,
                      instructions=sum(v["instruction_count"] for v in ref.engines.values()),
                      assumptions=ASSUMPTIONS + tuple(notes))


def kernel_time(kernel: str, shapes, dtype: str = "bfloat16", platform: str = "trn2", causal: bool = False
                ) -> KernelTime:
    """The estimated time of one of torch-neuronx's shipped NKI kernels (torch_neuronx/kernels/
    nki_kernels.py) at the given tensor-argument shapes, on one NeuronCore of `platform`. Cached."""
    _shipped(kernel)
    plat = _platform_name(platform)
    dt = normalize_dtype(dtype)
    shp = tuple(tuple(int(d) for d in s) for s in shapes)
    return _kernel_time(kernel, shp, dt, plat, bool(causal))

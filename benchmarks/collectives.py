"""Collective bandwidth of the `neuron` c10d backend against gloo, measured in one run.

For each rank count the script launches itself under torchrun (a free rendezvous port
chosen at run time, OMP_NUM_THREADS=1, a hard timeout, /dev/shm checked afterwards).
Every rank initialises the `neuron` group (shared memory, neuron tensors) and a gloo
group (CPU tensors) and times all_reduce, all_gather_into_tensor, reduce_scatter_tensor
and all_to_all_single on both, alternating backends point by point so both see the same
machine. Bandwidths follow NCCL-tests: algbw = size / time, busbw = algbw * 2(n-1)/n for
all_reduce and (n-1)/n for the other three, where `size` is the all_reduce tensor, the
all_gather output, the reduce_scatter input and the all_to_all input. GB = 1e9 bytes.
Each point: warm-up, then the median over iterations of the slowest rank's time, every
iteration preceded by a barrier and timed with time.perf_counter on every rank.

It also measures this machine's single-threaded memcpy bandwidth (a 256 MiB
tensor.copy_) as the ceiling and the 4 KiB all_reduce latency; prints a markdown table,
saves a plot to docs/distributed_collectives.png and rewrites the marked benchmark
section of docs/distributed.md (full runs only; --quick prints and writes nothing).

    .venv/bin/python benchmarks/collectives.py                 # full (make bench-collectives): ~3 min
    .venv/bin/python benchmarks/collectives.py --quick         # a smoke run, under a minute
    .venv/bin/python benchmarks/collectives.py --ranks 2 --sizes 4K,1M,32M --ops all_reduce --no-doc

On a shared machine it first waits (--wait-idle, up to 10 min) for other processes to
leave the CPUs idle, records how much CPU they took during each run, and runs a rank
count once more (--retries) when they took over 15%.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "distributed.md"
PLOT = ROOT / "docs" / "distributed_collectives.png"
MARK_START = "<!-- bench:collectives:start -->"
MARK_END = "<!-- bench:collectives:end -->"
BUSY = 0.15  # a run during which other processes used more of the CPUs than this is run again (--retries)
SHM_PREFIX = "torch_neuronx"  # shared-memory segments of the neuron backend start with this

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
BACKENDS = ("neuron", "gloo")
KiB, MiB = 1 << 10, 1 << 20
# Powers of 4 from 4 KiB to 256 MiB, plus 32 MiB (the size of the bandwidth target).
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,32M,64M,256M"
QUICK_SIZES = "4K,256K,32M"
LATENCY_BYTES = 4 * KiB

# Targets, checked on every full run.
TARGET_AR_BYTES, TARGET_AR_RANKS = 32 * MiB, 2
TARGET_VS_GLOO = 10.0  # neuron busbw >= 10x gloo's
TARGET_VS_MEMCPY = 0.5  # neuron busbw >= 0.5x single-threaded memcpy
TARGET_LATENCY = 1 / 5  # neuron 4 KiB all_reduce time <= 1/5 of gloo's


def bus_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": KiB, "M": MiB, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def fmt_size(b: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


# =========================================================================================
# Worker: one rank under torchrun
# =========================================================================================

def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import torch_neuronx  # noqa: F401  registers the device
    import torch_neuronx.distributed as tnd

    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated")
    warnings.filterwarnings("ignore", message="barrier\\(\\): using the device under current context")
    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("neuron", local % torch.neuron.device_count())
    torch.neuron.set_device(dev)
    timeout = datetime.timedelta(seconds=args.pg_timeout)
    dist.init_process_group("neuron", timeout=timeout)  # default group: neuron tensors, shared memory
    gloo = dist.new_group(backend="gloo", timeout=timeout)  # CPU tensors
    tnd.reset_stats()

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[{n} ranks] {msg}", flush=True)

    def slowest(values: list[float]) -> list[float]:
        """Per-iteration max over ranks (through gloo, outside the timed region)."""
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        return t.tolist()

    def timed(fn, iters: int) -> list[float]:
        # The neuron group's barrier (a futex in shared memory) before every iteration, for
        # both backends: the same, short exit skew on each side.
        out = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return slowest(out)

    def clamp_iters(t_est: float, budget: float, lo: int, hi: int) -> int:
        return max(lo, min(hi, int(budget / max(t_est, 1e-7))))

    def measure(fn) -> dict:
        fn()  # first call: first touch of buffers, gloo's lazy set-up
        t_est = timed(fn, 1)[0]  # the same on every rank (max over ranks): same counts everywhere
        warm = clamp_iters(t_est, args.budget / 5, 1, 10)
        for _ in range(warm):
            fn()
        iters = clamp_iters(t_est, args.budget, args.min_iters, args.max_iters)
        times = timed(fn, iters)
        return {"time_s": statistics.median(times), "min_s": min(times), "iters": iters, "warmup": warm + 1}

    def buffers(op: str, size: int, device) -> tuple:
        """(fn args) for one point: every buffer written once, so no page is left unmapped."""
        numel = size // 4  # float32
        part = numel // n

        def buf(k: int, value: float):
            return torch.empty(k, dtype=torch.float32, device=device).fill_(value)

        if op == "all_reduce":
            return (buf(numel, 0.0),)  # zeros: repeated in-place sums stay finite
        if op == "all_gather":
            return buf(numel, 0.0), buf(part, 1.0)
        if op == "reduce_scatter":
            return buf(part, 0.0), buf(numel, 1.0)
        return buf(numel, 0.0), buf(numel, 1.0)  # all_to_all

    def op_fn(op: str, bufs: tuple, group):
        if op == "all_reduce":
            return lambda: dist.all_reduce(bufs[0], group=group)
        if op == "all_gather":
            return lambda: dist.all_gather_into_tensor(bufs[0], bufs[1], group=group)
        if op == "reduce_scatter":
            return lambda: dist.reduce_scatter_tensor(bufs[0], bufs[1], group=group)
        return lambda: dist.all_to_all_single(bufs[0], bufs[1], group=group)

    devices = {"neuron": (dev, None), "gloo": (torch.device("cpu"), gloo)}
    points = []
    t_start = time.perf_counter()
    for op in args.ops.split(","):
        for size in [parse_size(s) for s in args.sizes.split(",")]:
            if size % (4 * n):
                log(f"skip {op} {fmt_size(size)}: not a whole number of float32 per rank")
                continue
            line = []
            for backend in BACKENDS:
                device, group = devices[backend]
                bufs = buffers(op, size, device)
                r = measure(op_fn(op, bufs, group))
                del bufs
                busbw = size / r["time_s"] * bus_factor(op, n) / 1e9
                points.append({"op": op, "size": size, "ranks": n, "backend": backend, "busbw_gbs": busbw, **r})
                line.append(f"{backend} {busbw:7.3f} GB/s ({fmt_time(r['time_s'])}, {r['iters']} it)")
            torch.neuron.empty_cache()
            log(f"{op:<15}{fmt_size(size):>8}  " + "   ".join(line))

    # Small-message latency: 4 KiB all_reduce, more iterations, backends alternating in blocks.
    latency = {}
    if args.lat_iters > 0:
        lat_bufs = {b: buffers("all_reduce", LATENCY_BYTES, devices[b][0]) for b in BACKENDS}
        fns = {b: op_fn("all_reduce", lat_bufs[b], devices[b][1]) for b in BACKENDS}
        for b in BACKENDS:
            for _ in range(20):
                fns[b]()
        pooled = {b: [] for b in BACKENDS}
        blocks = 4
        for _ in range(blocks):
            for b in BACKENDS:
                pooled[b] += timed(fns[b], max(1, args.lat_iters // blocks))
        for b in BACKENDS:
            ts = sorted(pooled[b])
            latency[b] = {"median_s": statistics.median(ts), "p10_s": ts[len(ts) // 10],
                          "p90_s": ts[(len(ts) * 9) // 10], "iters": len(ts)}
        log("latency 4 KiB all_reduce: " + "   ".join(f"{b} {latency[b]['median_s'] * 1e6:.1f} µs" for b in BACKENDS))

    stats = tnd.stats()
    dist.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": n, "points": points, "latency": latency, "neuron_stats": stats,
                       "seconds": time.perf_counter() - t_start}, f)
    dist.destroy_process_group()
    return 0


# =========================================================================================
# Launcher
# =========================================================================================

def shm_entries() -> set[str]:
    try:
        return {e for e in os.listdir("/dev/shm") if e.startswith(SHM_PREFIX)}
    except FileNotFoundError:
        return set()


def cpu_seconds() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, of this process and its waited-for descendants)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(f[:8]) - f[3] - f[4]  # user nice system idle iowait irq softirq steal: all but idle and iowait
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy / os.sysconf("SC_CLK_TCK"), me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Background:
    """CPU that processes other than this benchmark used, as a fraction of the machine."""

    def __enter__(self):
        self.t0, (self.busy0, self.own0) = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t0
        busy, own = cpu_seconds()
        self.fraction = max(0.0, (busy - self.busy0) - (own - self.own0)) / (wall * os.cpu_count())
        return False


def wait_idle(max_wait: float, threshold: float = 0.05) -> float:
    """Waits (at most max_wait s) until other processes use < threshold of the CPUs over 5 s."""
    deadline = time.monotonic() + max_wait
    while True:
        with Background() as bg:
            time.sleep(5)
        if bg.fraction < threshold or time.monotonic() >= deadline:
            return bg.fraction
        print(f"machine busy ({bg.fraction:.0%} of the CPUs used by other processes); waiting", flush=True)


def launch(n: int, args: argparse.Namespace, out: Path) -> dict:
    """Runs this script's worker on n local ranks; returns rank 0's results."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
        "--log-dir", str(out.parent / f"logs{n}"), "--tee=3",
        str(Path(__file__).resolve()), "--worker", "--out", str(out),
        "--ops", args.ops, "--sizes", args.sizes, "--budget", str(args.budget),
        "--min-iters", str(args.min_iters), "--max-iters", str(args.max_iters),
        "--lat-iters", str(args.lat_iters), "--pg-timeout", str(args.pg_timeout),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    before = shm_entries()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:  # nothing of the run may outlive it, whatever happened (also on Ctrl-C)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        for name in shm_entries() - before:
            print(f"warning: {n}-rank run left /dev/shm/{name}; removed", file=sys.stderr)
            try:
                os.unlink(f"/dev/shm/{name}")
            except OSError:
                pass
    if rc is None:
        raise SystemExit(f"error: the {n}-rank run did not finish in {args.timeout:.0f} s (killed); "
                         f"worker logs in {out.parent}")
    if rc != 0 or not out.exists():
        raise SystemExit(f"error: the {n}-rank run failed (exit {rc}); worker logs in {out.parent}")
    return json.loads(out.read_text())


def memcpy_samples(size: int = 256 * MiB, iters: int = 7) -> list[float]:
    """Seconds per single-threaded tensor.copy_ of `size` bytes between two touched CPU tensors."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.empty(size // 4, dtype=torch.float32).fill_(1.0)
        dst = torch.empty_like(src).fill_(0.0)
        for _ in range(2):
            dst.copy_(src)
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            dst.copy_(src)
            ts.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return ts


def memcpy_result(samples: list[float], size: int = 256 * MiB) -> dict:
    t = statistics.median(samples)
    return {"bytes": size, "time_s": t, "gbs": size / t / 1e9, "min_gbs": size / max(samples) / 1e9,
            "max_gbs": size / min(samples) / 1e9, "samples": len(samples)}


def machine_info() -> dict:
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f"{kb / (1 << 20):.0f} GiB"
    except (OSError, IndexError, ValueError):
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += " (with local changes)" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    l3 = ""
    try:
        for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
            if (idx / "level").read_text().strip() == "3":
                l3 = fmt_size(parse_size((idx / "size").read_text().strip()))
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "l3": l3, "usable_cores": len(os.sched_getaffinity(0)), "memory": mem,
        "kernel": platform.release(), "python": platform.python_version(), "torch": torch.__version__,
        "commit": commit, "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


# =========================================================================================
# Report
# =========================================================================================

def collect(runs: list[dict]) -> dict:
    """(op, ranks, size) -> {backend: point}."""
    table: dict = {}
    for run in runs:
        for p in run["points"]:
            table.setdefault((p["op"], p["ranks"], p["size"]), {})[p["backend"]] = p
    return table


def targets(table: dict, runs: list[dict], memcpy: dict) -> list[dict]:
    out = []
    pt = table.get(("all_reduce", TARGET_AR_RANKS, TARGET_AR_BYTES))
    what = f"all_reduce {fmt_size(TARGET_AR_BYTES)}, {TARGET_AR_RANKS} ranks"
    if pt and all(b in pt for b in BACKENDS):
        nb, gb = pt["neuron"]["busbw_gbs"], pt["gloo"]["busbw_gbs"]
        out.append({"target": f"{what}: neuron busbw ≥ {TARGET_VS_GLOO:g}× gloo",
                    "measured": f"{nb / gb:.1f}× ({nb:.2f} vs {gb:.2f} GB/s)", "ok": nb / gb >= TARGET_VS_GLOO})
        need = TARGET_VS_GLOO * gb
        out[-1]["note"] = (f"{TARGET_VS_GLOO:g}× gloo here is {need:.2f} GB/s busbw, "
                           f"{need / memcpy['gbs']:.2f}× the single-threaded memcpy ceiling")
        out.append({"target": f"{what}: neuron busbw ≥ {TARGET_VS_MEMCPY:g}× memcpy",
                    "measured": f"{nb / memcpy['gbs']:.2f}× ({nb:.2f} vs {memcpy['gbs']:.2f} GB/s)",
                    "ok": nb / memcpy["gbs"] >= TARGET_VS_MEMCPY})
    else:
        out.append({"target": f"{what}: not measured (needs --sizes with 32M and --ranks with 2)",
                    "measured": "-", "ok": None})
    for run in runs:
        lat = run.get("latency") or {}
        if all(b in lat for b in BACKENDS):
            nl, gl = lat["neuron"]["median_s"], lat["gloo"]["median_s"]
            out.append({"target": f"all_reduce 4 KiB latency, {run['ranks']} ranks: neuron ≤ 1/5 of gloo",
                        "measured": f"{nl / gl:.2f}× ({nl * 1e6:.1f} vs {gl * 1e6:.1f} µs)",
                        "ok": nl / gl <= TARGET_LATENCY})
    return out


def anomalies(table: dict, memcpy: dict) -> list[str]:
    notes = []
    for (op, n, size), pt in sorted(table.items()):
        if not all(b in pt for b in BACKENDS):
            continue
        nb, gb = pt["neuron"]["busbw_gbs"], pt["gloo"]["busbw_gbs"]
        if nb < gb:
            notes.append(f"{op} {fmt_size(size)} on {n} ranks: neuron is slower than gloo "
                         f"({nb:.3f} vs {gb:.3f} GB/s, {nb / gb:.2f}×)")
    for op in sorted({k[0] for k in table}):
        for n in sorted({k[1] for k in table if k[0] == op}):
            sizes = sorted(k[2] for k in table if k[0] == op and k[1] == n and "neuron" in table[k])
            for a, b in zip(sizes, sizes[1:]):
                ba, bb = table[(op, n, a)]["neuron"]["busbw_gbs"], table[(op, n, b)]["neuron"]["busbw_gbs"]
                # Below a few MiB the data stays in cache, so the first drop past it is expected.
                if a >= 4 * MiB and bb < 0.7 * ba:
                    notes.append(f"{op} on {n} ranks: neuron busbw drops from {ba:.2f} GB/s at {fmt_size(a)} "
                                 f"to {bb:.2f} GB/s at {fmt_size(b)}")
    # An all_reduce is a reduce_scatter plus an all_gather: either alone should take clearly less
    # time (by the bytes each rank copies: about 0.56x and 0.67x on 2 ranks).
    for op in ("all_gather", "reduce_scatter"):
        for n in sorted({k[1] for k in table if k[0] == op}):
            slow, total = [], 0
            for size in sorted(k[2] for k in table if k[0] == op and k[1] == n and k[2] >= MiB):
                ar, pt = table.get(("all_reduce", n, size), {}).get("neuron"), table[(op, n, size)].get("neuron")
                if ar and pt:
                    total += 1
                    if pt["time_s"] >= 0.8 * ar["time_s"]:
                        slow.append((size, pt["time_s"] / ar["time_s"]))
            if slow:
                fr = [f for _, f in slow]
                notes.append(f"{op} on {n} ranks takes {min(fr):.2f}–{max(fr):.2f}× the time of an all_reduce of the "
                             f"same size at {len(slow)} of {total} sizes ≥ 1 MiB "
                             f"({', '.join(fmt_size(s) for s, _ in slow)}), though an all_reduce is a "
                             "reduce_scatter plus an all_gather")
    return notes


def markdown_table(table: dict) -> str:
    lines = ["| size | op | ranks | neuron busbw GB/s | gloo busbw GB/s | neuron/gloo | neuron time | gloo time |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for (op, n, size) in sorted(table, key=lambda k: (OPS.index(k[0]) if k[0] in OPS else 99, k[1], k[2])):
        pt = table[(op, n, size)]
        if not all(b in pt for b in BACKENDS):
            continue
        nb, gb = pt["neuron"]["busbw_gbs"], pt["gloo"]["busbw_gbs"]
        ratio = f"{nb / gb:.2f}"
        if nb < gb:
            ratio = f"**{ratio}**"
        lines.append(f"| {fmt_size(size)} | {op} | {n} | {nb:.3f} | {gb:.3f} | {ratio} | "
                     f"{fmt_time(pt['neuron']['time_s'])} | {fmt_time(pt['gloo']['time_s'])} |")
    return "\n".join(lines)


def plot(table: dict, memcpy: dict, info: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    ops = [op for op in OPS if any(k[0] == op for k in table)]
    cols = 2 if len(ops) > 1 else 1
    rows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.2 * rows), squeeze=False)
    colors = {"neuron": "tab:blue", "gloo": "tab:orange"}
    styles = {2: "-", 4: "--"}
    for ax, op in zip(axes.flat, ops):
        for backend in BACKENDS:
            for n in sorted({k[1] for k in table if k[0] == op}):
                keys = sorted(k for k in table if k[0] == op and k[1] == n and backend in table[k])
                if not keys:
                    continue
                ax.plot([k[2] for k in keys], [table[k][backend]["busbw_gbs"] for k in keys],
                        styles.get(n, ":"), marker="o", ms=3.5, color=colors[backend], label=f"{backend}, {n} ranks")
        ax.axhline(memcpy["gbs"], color="gray", ls=":", lw=1.5, label=f"memcpy 1 thread ({memcpy['gbs']:.1f} GB/s)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({k[2] for k in table if k[0] == op})
        ax.set_xticks(sizes, [fmt_size(s).replace(" ", "") for s in sizes], rotation=45, fontsize=8)
        ax.minorticks_off()
        ax.set_title(op)
        ax.set_xlabel("message size")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", handlelength=3.5)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    fig.suptitle(f"torch.distributed busbw: neuron (shared memory) vs gloo — {info['cpu']}, {info['cores']} cores",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def doc_section(table, runs, memcpy, info, command, plotted, tgt, notes) -> str:
    rank_list = ", ".join(str(r["ranks"]) for r in runs)
    lines = [
        MARK_START,
        "### Collective bandwidth: `neuron` vs gloo",
        "",
        "<!-- Generated by benchmarks/collectives.py: rerun it rather than editing between the markers. -->",
        "",
        "Reproduce (one run measures both backends at every rank count; it rewrites this section and the plot):",
        "",
        "```bash",
        *([f"make bench-collectives    # = {command}"] if command.endswith("collectives.py") else [command]),
        "```",
        "",
        f"Measured {info['date']} on {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable"
        + (f", {info['l3']} L3" if info.get("l3") else "") + "), "
        f"{info['memory']} RAM, Linux {info['kernel']}, Python {info['python']}, torch {info['torch']}, "
        f"commit {info['commit']}. Ranks: {rank_list} processes on this one host "
        f"(OMP_NUM_THREADS=1; with more ranks than cores the ranks share them). Other processes used "
        + ", ".join(f"{r.get('background_cpu', 0):.0%}" for r in runs)
        + f" of the CPUs during the {rank_list}-rank runs ({memcpy.get('background_cpu', 0):.0%} during memcpy).",
        "",
        "Method: `neuron` runs on neuron tensors over shared memory, gloo on CPU tensors over loopback TCP, "
        "in the same processes, backend alternating point by point. Each point is warmed up, then timed for "
        "several iterations (fewer at large sizes), each after a barrier (the same shared-memory barrier for "
        "both backends) and with `time.perf_counter` on every rank; the table shows the median over "
        "iterations of the slowest rank. Bandwidths follow NCCL-tests: algbw = size / time, busbw = algbw × "
        "2(n−1)/n for all_reduce and × (n−1)/n for all_gather (`all_gather_into_tensor`, size = output), "
        "reduce_scatter (`reduce_scatter_tensor`, size = input) and all_to_all (`all_to_all_single`, size = "
        "input per rank); float32, GB = 10⁹ bytes. The ceiling is this machine's single-threaded memcpy: "
        f"`tensor.copy_` of {fmt_size(memcpy['bytes'])}, **{memcpy['gbs']:.2f} GB/s** (bytes copied / time; "
        f"median of {memcpy['samples']} copies before and after the runs, which ranged "
        f"{memcpy['min_gbs']:.2f}–{memcpy['max_gbs']:.2f} GB/s: this machine's noise).",
        "",
        "#### Targets",
        "",
        "| target | measured | result |",
        "|---|---|---|",
    ]
    for t in tgt:
        res = "—" if t["ok"] is None else ("PASS" if t["ok"] else "**MISS**")
        lines.append(f"| {t['target']} | {t['measured']} | {res} |")
    lines += [f"\nFor scale: {t['note']}." for t in tgt if t.get("note")]
    lines += ["", "#### Small-message latency (4 KiB all_reduce)", "",
              "| ranks | neuron median | gloo median | neuron p10–p90 | gloo p10–p90 | neuron/gloo |",
              "|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        lat = run.get("latency") or {}
        if all(b in lat for b in BACKENDS):
            ln, lg = lat["neuron"], lat["gloo"]
            lines.append(f"| {run['ranks']} | {ln['median_s'] * 1e6:.1f} µs | {lg['median_s'] * 1e6:.1f} µs | "
                         f"{ln['p10_s'] * 1e6:.1f}–{ln['p90_s'] * 1e6:.1f} µs | "
                         f"{lg['p10_s'] * 1e6:.1f}–{lg['p90_s'] * 1e6:.1f} µs | {ln['median_s'] / lg['median_s']:.2f} |")
    lines += ["", "#### Anomalies", ""]
    lines += [f"- {n}" for n in notes] if notes else ["None: neuron is at least as fast as gloo at every point."]
    if plotted:
        lines += ["", "#### Bus bandwidth vs message size", "",
                  f"![busbw vs size, neuron vs gloo vs memcpy]({PLOT.name})"]
    lines += ["", "#### All points", "", "Ratios below 1 (neuron slower than gloo) are in bold.", "",
              markdown_table(table), "", MARK_END]
    return "\n".join(lines)


def write_doc(section: str, path: Path) -> None:
    if not path.exists():
        path.write_text(f"# Distributed: the `neuron` c10d backend\n\n{section}\n")
        return
    text = path.read_text()
    a, b = text.find(MARK_START), text.find(MARK_END)
    if a >= 0 and b > a:
        text = text[:a] + section + text[b + len(MARK_END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: sizes {QUICK_SIZES}, fewer iterations, no doc or plot unless --doc")
    ap.add_argument("--ranks", default="2,4", help="comma-separated rank counts (one torchrun launch each)")
    ap.add_argument("--sizes", help=f"comma-separated message sizes, e.g. 4K,1M,256M (default {DEFAULT_SIZES})")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    ap.add_argument("--budget", type=float, help="seconds of timed iterations per point and backend (0.3; quick 0.1)")
    ap.add_argument("--min-iters", type=int, help="timed iterations at least (5; quick 3)")
    ap.add_argument("--max-iters", type=int, help="timed iterations at most (50; quick 20)")
    ap.add_argument("--lat-iters", type=int, help="timed 4 KiB all_reduce iterations for the latency (400; quick 100)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per rank count before the run is killed")
    ap.add_argument("--pg-timeout", type=float, default=120, help="process-group timeout in seconds")
    ap.add_argument("--wait-idle", type=float, default=600,
                    help="before each measurement wait up to this many seconds for other processes to leave "
                         "the CPUs idle (0: do not wait)")
    ap.add_argument("--retries", type=int, default=1,
                    help=f"run a rank count again (this many times at most) when other processes used more than "
                         f"{BUSY * 100:.0f}%% of the CPUs during it; the quietest run is kept")
    ap.add_argument("--json", help="also write every measurement here")
    doc = ap.add_mutually_exclusive_group()
    doc.add_argument("--doc", action="store_true", help="write docs/distributed.md and the plot even with --quick")
    doc.add_argument("--no-doc", action="store_true", help="print only; leave docs/ alone")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    q = args.quick
    for name, full, quick in (("sizes", DEFAULT_SIZES, QUICK_SIZES), ("budget", 0.3, 0.1), ("min_iters", 5, 3),
                              ("max_iters", 50, 20), ("lat_iters", 400, 100)):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    if args.worker:
        return worker(args)

    bad = set(args.ops.split(",")) - set(OPS)
    if bad:
        ap.error(f"unknown ops {sorted(bad)}; choose from {','.join(OPS)}")
    ranks = [int(r) for r in args.ranks.split(",")]
    [parse_size(s) for s in args.sizes.split(",")]  # fail early on a bad size
    write = args.doc or not (q or args.no_doc)
    shown, argv = [], iter(sys.argv[1:])  # the reproduce command, without options that do not change results
    for a in argv:
        if a in ("--json", "--wait-idle", "--retries"):
            next(argv, None)
        elif a.split("=")[0] not in ("--json", "--wait-idle", "--retries", "--doc", "--no-doc"):
            shown.append(a)
    command = shlex.join([".venv/bin/python", "benchmarks/collectives.py", *shown])

    t0 = time.perf_counter()
    info = machine_info()
    print(f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}", flush=True)
    if args.wait_idle > 0:
        wait_idle(args.wait_idle)
    with Background() as bg:
        copies = memcpy_samples()
    memcpy_bg = [bg.fraction]
    print(f"memcpy (1 thread, 256 MiB tensor.copy_): {memcpy_result(copies)['gbs']:.2f} GB/s", flush=True)
    runs = []
    tmp = Path(tempfile.mkdtemp(prefix="bench_collectives_"))  # kept when a run fails: the workers' logs
    for n in ranks:
        best = None
        for attempt in range(1 + max(0, args.retries)):
            if args.wait_idle > 0:
                wait_idle(args.wait_idle)
            print(f"--- {n} ranks" + (f" (again: attempt {attempt + 1})" if attempt else "") + " ---", flush=True)
            (tmp / f"ranks{n}.{attempt}").mkdir()
            with Background() as bg:
                run = launch(n, args, tmp / f"ranks{n}.{attempt}" / "result.json")
            run["background_cpu"] = bg.fraction
            print(f"other processes used {bg.fraction:.0%} of the CPUs during the {n}-rank run", flush=True)
            if best is None or run["background_cpu"] < best["background_cpu"]:
                best = run
            if bg.fraction <= BUSY:
                break
            print("warning: the machine was not idle; these numbers are disturbed", file=sys.stderr)
        runs.append(best)
    shutil.rmtree(tmp, ignore_errors=True)
    with Background() as bg:  # again after the runs: the ceiling is the median of both, its spread the noise
        copies += memcpy_samples()
    memcpy = memcpy_result(copies)
    memcpy["background_cpu"] = max(memcpy_bg + [bg.fraction])
    print(f"memcpy ceiling: {memcpy['gbs']:.2f} GB/s (median of {memcpy['samples']} copies before and after; "
          f"{memcpy['min_gbs']:.2f}-{memcpy['max_gbs']:.2f})", flush=True)
    for run in runs:
        st = run["neuron_stats"]
        off_shm = {op: t for op, t in st.items() if set(t) - {"shm"}}
        if off_shm:
            print(f"warning: {run['ranks']}-rank neuron collectives not (only) over shared memory: {off_shm}",
                  file=sys.stderr)

    table = collect(runs)
    tgt = targets(table, runs, memcpy)
    notes = anomalies(table, memcpy)
    print()
    print(markdown_table(table))
    print()
    for t in tgt:
        print(f"{'-' if t['ok'] is None else 'PASS' if t['ok'] else 'MISS'}  {t['target']}: {t['measured']}"
              + (f" ({t['note']})" if t.get("note") else ""))
    for note in notes:
        print(f"anomaly: {note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "memcpy": memcpy, "runs": runs, "targets": tgt,
                                               "anomalies": notes, "command": command}, indent=1))
    if write:
        plotted = plot(table, memcpy, info, PLOT)
        write_doc(doc_section(table, runs, memcpy, info, command, plotted, tgt, notes), DOC)
        print(f"wrote {DOC.relative_to(ROOT)}" + (f" and {PLOT.relative_to(ROOT)}" if plotted else ""))
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

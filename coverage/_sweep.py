"""What every coverage sweep shares: the command line, the run over isolated workers, the
report files (``Sweep``, ``main``, ``run_sweep``, ``write_report``), and the model sweeps' records.

A sweep is a ``Sweep``: which items it can run (``select``), the check each worker runs on one
item, how an outcome becomes a record, the summary, and the report. ``main`` gives every sweep
the same options (``--workers``, ``--timeout``, ``--out-dir``, ``--no-write``; each adds its own
selection), runs the items with a progress bar, prints the summary, writes
``docs/coverage/<report>.{md,json}`` for a full run (a subset only with ``--out-dir``) and
exits 1 when anything did not pass.

A model sweep builds each model tiny and random, runs it on CPU and on ``neuron`` with the
same weights and inputs, and records one result per model: a plain dict with ``status``
(one of ``STATUSES``), the failing ``stage`` and its ``reason``, every stage's outcome, the
ops that went through the generic fallback, and timings. Each model runs in a worker
process (``run_isolated``), so a crash or a hang is recorded for that model only. What
differs between sweeps (which models, which stages) stays in the sweep; the record
bookkeeping, the stage runner, the progress bar and the report helpers live here.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from torch_neuronx.testing._compare import Diff
from torch_neuronx.testing._pool import run_isolated

STATUSES = ("pass", "fail", "cpu-unrunnable", "crash", "timeout")
NOT_PASSING = ("fail", "crash", "timeout")


def error_text(e: BaseException) -> str:
    """``Type: first line of the message`` plus where it was raised (last frame)."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    msg = lines[0] if lines else ""
    if msg.endswith(":") and len(lines) > 1:  # "backend='neuron' raised:" and the cause on the next line
        msg += " " + lines[1]
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    if frames:
        f = frames[-1]
        where = f" [{Path(f.filename).name}:{f.lineno} in {f.name}]"
    return f"{type(e).__name__}: {msg[:400]}{where}"


def diff_problem(d: Diff) -> str | None:
    """None when ``d`` is a match, else its summary."""
    return None if d.ok else d.summary()


def grad_presence(dev: dict, ref: dict, ref_name: str = "CPU") -> str | None:
    """The first parameter whose gradient is None on one side only, else None."""
    for name, g in ref.items():
        d = dev.get(name)
        if (g is None) != (d is None):
            return f"grad of {name} is {'None' if d is None else 'a tensor'} on neuron, " \
                   f"{'None' if g is None else 'a tensor'} on {ref_name}"
    return None


def without_none_grads(out: dict) -> dict:
    """``out`` with the parameters that got no gradient left out of ``out["grads"]``."""
    return {**out, "grads": {k: v for k, v in out["grads"].items() if v is not None}}


def run_stage(stages: dict, stage: str, fn: Callable[[], Any], check: Callable[[Any], str | None]) -> Any:
    """Runs one device stage: ``stages[stage]`` becomes ``pass`` or ``fail: <why>`` (raised, or
    what ``check`` found wrong with the result). Returns the result, or None when it raised."""
    try:
        out = fn()
    except Exception as e:
        stages[stage] = f"fail: {error_text(e)}"
        return None
    problem = check(out)
    stages[stage] = "pass" if problem is None else f"fail: {problem}"
    return out


def settle(record: dict, order: tuple[str, ...]) -> None:
    """Final bookkeeping of a record after its device run: the fallback ops it used, its stages
    in ``order``, and its status from the first failing stage (``n/a`` stages named in the reason
    of a pass)."""
    stages = record["stages"]
    record["fallback_ops"] = dict(sorted(torch.neuron.get_fallback_ops().items()))
    record["stages"] = {s: stages[s] for s in order if s in stages}
    first = next((s for s in order if str(stages.get(s, "")).startswith("fail")), None)
    if first is not None:
        record.update(status="fail", stage=first, reason=stages[first][len("fail: "):])
    elif record["status"] == "pass":
        record["reason"] = "; ".join(f"{s} {stages[s]}" for s in order if str(stages.get(s, "")).startswith("n/a"))


def record_from_outcome(outcome, key: str) -> dict:
    """The result record for one ``run_isolated`` outcome (the item's name under ``key``); a
    crash, a timeout or an exception escaping the check is never a pass."""
    if outcome.kind == "ok":
        return outcome.value
    status = {"crash": "crash", "timeout": "timeout"}.get(outcome.kind, "fail")
    reason = outcome.error.strip().splitlines()[0] if outcome.error.strip() else outcome.kind
    return {key: outcome.item, "status": status, "stage": None if status != "fail" else "harness",
            "reason": reason, "stages": {}, "fallback_ops": {}, "seconds": round(outcome.seconds, 2),
            "params": 0, "notes": []}


def count_statuses(records: list[dict]) -> dict:
    """Counts per status, and the pass rate over the models that run on CPU."""
    counts = {s: 0 for s in STATUSES}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    runnable = len(records) - counts["cpu-unrunnable"]
    return {"total": len(records), **counts, "runnable": runnable,
            "pass_rate": (counts["pass"] / runnable) if runnable else 0.0}


def short_ops(ops: dict) -> str:
    names = [k.replace("aten::", "") for k in ops]
    return ", ".join(names[:4]) + (f" +{len(names) - 4}" if len(names) > 4 else "")


def cell(text: str, limit: int = 160) -> str:
    """``text`` as one markdown table cell: one line, pipes escaped, at most ``limit`` characters."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_lines(records: list[dict], key: str, noun: str) -> list[str]:
    """Markdown list of the failures grouped by cause (status, stage, reason), largest group first."""
    causes: dict[tuple, list[str]] = {}
    for r in sorted(records, key=lambda r: r[key]):
        if r["status"] in NOT_PASSING:
            causes.setdefault((r["status"], r["stage"], r["reason"]), []).append(r[key])
    if not causes:
        return ["None."]
    out = []
    for (status, stage, reason), names in sorted(causes.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        out.append(f"- {status} at stage {stage}, {len(names)} {noun}{'s' if len(names) > 1 else ''}: "
                   f"`{cell(reason, 600).replace('`', '')}`  ")
        out.append(f"  {', '.join(names)}")
    return out


def unrunnable_lines(records: list[dict], key: str) -> list[str]:
    """Markdown list of the models whose CPU reference could not run, with why."""
    unrunnable = [r for r in records if r["status"] == "cpu-unrunnable"]
    if not unrunnable:
        return ["None."]
    return [f"- **{r[key]}**: {cell(r['reason'], 600)}" for r in sorted(unrunnable, key=lambda r: r[key])]


# ---- every sweep: command line, run, report files ----------------------------------------------

class Sweep:
    """One sweep as ``main`` runs it. Subclasses fill in what differs; the items given to
    ``check()`` and the records it returns must be picklable (they cross to the workers)."""

    script = ""                 # its file in coverage/, without ``.py``
    description = ""            # --help's text
    report = ""                 # the report's name: docs/coverage/<report>.{md,json}
    unit = "item"               # of the progress bar
    default_timeout = 600.0     # seconds per item
    default_workers = 2

    def add_arguments(self, p) -> None:
        """The sweep's own options (which items, which variant)."""

    def configure(self, args) -> Sweep:
        """The sweep that runs with these options (a sweep of several populations picks one)."""
        return self

    def select(self, p, args) -> list:
        """The items these options select; a bad value is ``p.error``."""
        raise NotImplementedError

    def is_subset(self, args) -> bool:
        """True when the options select less than the sweep's report covers."""
        raise NotImplementedError

    def options(self, args) -> list[str]:
        """The options, beyond the script, that reproduce this run's report."""
        return []

    def check(self) -> Callable[[Any], Any]:
        """The module-level function a worker runs on one item."""
        raise NotImplementedError

    def initializer(self) -> None:
        """Each worker's set-up before its first item (slow imports), not counted against a timeout."""

    def record(self, outcome) -> dict:
        """The record of one ``run_isolated`` outcome; a crash or a timeout is never a pass."""
        raise NotImplementedError

    def label(self, record: dict) -> str:
        """The item's name in a record."""
        raise NotImplementedError

    def summarize(self, records: list[dict]) -> dict:
        raise NotImplementedError

    def progress(self, summary: dict) -> str:
        """The running counts on the progress bar."""
        return ""

    def failed(self, summary: dict) -> bool:
        raise NotImplementedError

    def printed(self, records: list[dict], summary: dict, seconds: float, workers: int) -> list[str]:
        """What the command prints when the run is done."""
        raise NotImplementedError

    def meta(self, items: list, args) -> dict:
        """What the report's ``meta`` holds besides the run's date, command, workers and times."""
        return {"torch": torch.__version__}

    def render(self, records: list[dict], summary: dict, meta: dict) -> tuple[dict, str]:
        """The report: the JSON document and the markdown page."""
        raise NotImplementedError

    def command(self, args) -> str:
        """The command that regenerates this run's report."""
        return " ".join([f"python coverage/{self.script}.py", *self.options(args)])

    def run(self, items: list, workers: int, timeout: float, progress: bool = True) -> list[dict]:
        return run_sweep(self, items, workers=workers, timeout=timeout, progress=progress)

    def write(self, records: list[dict], out_dir: str | Path, meta: dict) -> tuple[Path, Path]:
        """Writes ``<report>.md`` and ``<report>.json`` into ``out_dir``."""
        payload, markdown = self.render(records, self.summarize(records), meta)
        return write_report(out_dir, self.report, payload, markdown)


def run_sweep(sweep: Sweep, items: list, *, workers: int, timeout: float, progress: bool = True) -> list[dict]:
    """Runs ``sweep.check()`` on every item in isolated workers, with a progress bar; returns the
    records in the order of ``items``."""
    from tqdm import tqdm

    records: list[tuple[int, dict]] = []
    order = {id(item): i for i, item in enumerate(items)}
    bar = tqdm(total=len(items), disable=not progress, unit=sweep.unit, dynamic_ncols=True)
    try:
        for outcome in run_isolated(sweep.check(), items, workers=workers, timeout=timeout,
                                    initializer=sweep.initializer):
            r = sweep.record(outcome)
            records.append((order.get(id(outcome.item), len(order)), r))
            counts = sweep.progress(sweep.summarize([r for _, r in records]))
            bar.set_postfix_str(f"{counts} | {sweep.label(r)}" if counts else sweep.label(r))
            bar.update(1)
    finally:
        bar.close()
    return [r for _, r in sorted(records, key=lambda ir: ir[0])]


def write_report(out_dir: str | Path, name: str, payload: dict, markdown: str) -> tuple[Path, Path]:
    """Writes ``{name}.md`` and ``{name}.json`` (``payload``) into ``out_dir``."""
    import json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / f"{name}.md", out_dir / f"{name}.json"
    md.write_text(markdown)
    js.write_text(json.dumps(payload, indent=1) + "\n")
    return md, js


def main(sweep: Sweep, argv: list[str] | None = None) -> int:
    """The command line of every sweep: its own options plus ``--workers``, ``--timeout``,
    ``--out-dir`` and ``--no-write``. Prints the summary, writes the report (a full run by
    default into docs/coverage, a subset only with ``--out-dir``) and returns 1 when anything
    did not pass."""
    import argparse
    import datetime
    import time

    from torch_neuronx.testing._pool import positive

    p = argparse.ArgumentParser(description=sweep.description, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_arguments(p)
    p.add_argument("--workers", type=positive(int), default=sweep.default_workers,
                   help="worker processes (default %(default)s)")
    p.add_argument("--timeout", type=positive(float), default=None,
                   help=f"seconds per item before it counts as a timeout (default {sweep.default_timeout:g})")
    p.add_argument("--out-dir", default=None,
                   help="where to write the report (default docs/coverage for a full run; a subset run writes "
                        "only when this is given)")
    p.add_argument("--no-write", action="store_true", help="print the summary only")
    args = p.parse_args(argv)
    sweep = sweep.configure(args)
    items = sweep.select(p, args)
    timeout = args.timeout if args.timeout is not None else sweep.default_timeout

    start = time.perf_counter()
    records = sweep.run(items, args.workers, timeout)
    wall = time.perf_counter() - start
    summary = sweep.summarize(records)
    for line in sweep.printed(records, summary, wall, args.workers):
        print(line)

    out_dir = args.out_dir if args.out_dir is not None else (None if sweep.is_subset(args) else "docs/coverage")
    if out_dir and not args.no_write:
        meta = {**sweep.meta(items, args), "date": datetime.date.today().isoformat(),
                "command": sweep.command(args), "workers": args.workers, "timeout": timeout,
                "wall_seconds": round(wall, 1)}
        md, js = sweep.write(records, out_dir, meta)
        print(f"wrote {md} and {js}")
    return 1 if sweep.failed(summary) else 0

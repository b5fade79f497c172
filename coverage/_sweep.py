"""Pieces shared by the coverage sweeps (the model sweeps ``transformers_sweep``, ``models_sweep``,
``diffusers_sweep``; the op sweeps use ``script``).

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


def script(name: str) -> str:
    """The command that runs the sweep ``name`` (these sweeps are scripts run from the repository
    root, not modules of the installed package)."""
    return f"python coverage/{name}.py"


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


def write_records(records: list[dict], out_dir: str | Path, meta: dict, *, report: str,
                  render: Callable[[list[dict], dict], str], summarize: Callable[[list[dict]], dict],
                  key: str) -> tuple[Path, Path]:
    """Writes a model sweep's report into ``out_dir``: ``{report}.md`` (``render(records, meta)``)
    and ``{report}.json`` (meta, summary and the records sorted by ``key``)."""
    import json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / f"{report}.md", out_dir / f"{report}.json"
    md.write_text(render(records, meta))
    payload = {"meta": meta, "summary": summarize(records), "results": sorted(records, key=lambda r: r[key])}
    js.write_text(json.dumps(payload, indent=1) + "\n")
    return md, js


def run_with_progress(check: Callable[[str], dict], names: list[str], *, workers: int, timeout: float,
                      initializer: Callable[[], Any] | None, key: str, unit: str,
                      summarize: Callable[[list[dict]], dict] = count_statuses,
                      progress: bool = True) -> list[dict]:
    """Runs ``check`` on every name in isolated workers and returns the records, with a progress
    bar that shows the running counts."""
    from tqdm import tqdm

    records: list[dict] = []
    bar = tqdm(total=len(names), disable=not progress, unit=unit, dynamic_ncols=True)
    try:
        for outcome in run_isolated(check, names, workers=workers, timeout=timeout, initializer=initializer):
            r = record_from_outcome(outcome, key)
            records.append(r)
            s = summarize(records)
            bar.set_postfix_str(f"pass {s['pass']} fail {s['fail']} crash {s['crash']} "
                                f"timeout {s['timeout']} cpu-unrunnable {s['cpu-unrunnable']} | {r[key]}")
            bar.update(1)
    finally:
        bar.close()
    return records


def sweep_main(argv: list[str] | None, *, doc: str, module: str, item: str, example: str, all_names: list[str],
               fast: tuple[str, ...] | list[str], fast_name: str, unknown: str, default_timeout: float, report: str,
               regenerate: str, run: Callable[[list[str], int, float], list[dict]],
               summarize: Callable[[list[dict]], dict], write_report: Callable[..., tuple[Path, Path]],
               meta: Callable[[list[str]], dict], key: str, list_failures: bool = False) -> int:
    """The command line the model sweeps share: ``--only`` / ``--fast`` / all, ``--workers``,
    ``--timeout``, ``--out-dir`` / ``--no-write``; prints the summary, writes the report (full
    runs by default, subsets only with ``--out-dir``) and returns 1 when any item did not pass."""
    import argparse
    import datetime
    import sys
    import time

    from torch_neuronx.testing._pool import positive

    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help=f"comma-separated {item}s (e.g. {example})")
    p.add_argument("--fast", action="store_true", help=f"the CI subset ({fast_name})")
    p.add_argument("--workers", type=positive(int), default=2, help="worker processes (default 2)")
    p.add_argument("--timeout", type=positive(float), default=default_timeout,
                   help=f"seconds per {item} (default {default_timeout:g})")
    p.add_argument("--out-dir", default=None,
                   help=f"where to write {report}.{{md,json}} (default docs/coverage for a full run; "
                        "a subset run writes only when this is given)")
    p.add_argument("--no-write", action="store_true", help="do not write the report")
    args = p.parse_args(argv)

    if args.only:
        names = list(dict.fromkeys(n.strip() for n in args.only.split(",") if n.strip()))
        missing = [n for n in names if n not in all_names]
        if missing:
            p.error(unknown.format(", ".join(missing)))
    elif args.fast:
        names = list(fast)
    else:
        names = list(all_names)
    subset = bool(args.only or args.fast)

    start = time.perf_counter()
    records = run(names, args.workers, args.timeout)
    wall = time.perf_counter() - start
    s = summarize(records)
    print(f"{module.rsplit('.', 1)[-1].replace('_', ' ')}: {s['pass']}/{s['runnable']} pass "
          f"({100 * s['pass_rate']:.1f}%), fail {s['fail']}, crash {s['crash']}, timeout {s['timeout']}, "
          f"cpu-unrunnable {s['cpu-unrunnable']} of {s['total']} in {wall:.0f} s with {args.workers} workers")
    if list_failures:
        for r in sorted(records, key=lambda r: r[key]):
            if r["status"] in ("fail", "crash", "timeout"):
                print(f"  {r[key]}: {r['status']} at {r['stage']}: {r['reason'][:300]}")

    out_dir = args.out_dir if args.out_dir is not None else (None if subset else "docs/coverage")
    if out_dir and not args.no_write:
        command = regenerate if not subset else f"{script(module)} " + " ".join(
            sys.argv[1:] if argv is None else argv)
        info = {**meta(names), "date": datetime.date.today().isoformat(), "command": command,
                "workers": args.workers, "timeout": args.timeout, "wall_seconds": round(wall, 1)}
        md, js = write_report(records, out_dir, info)
        print(f"wrote {md} and {js}")
    return 1 if (s["fail"] or s["crash"] or s["timeout"]) else 0

"""Run many independent checks in worker processes, each check isolated from the others.

A sweep must survive what it finds: a check that crashes its interpreter (a segfault,
an abort) or hangs is recorded as ``crash`` / ``timeout`` for that item only, the
worker is replaced, and the sweep goes on. Workers are started with ``spawn`` (the
device refuses forked children) and run one check at a time.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator


@dataclass
class Outcome:
    """What became of one item: ``kind`` is ``ok`` (``value`` is what the check returned),
    ``exception`` (the check raised; ``error`` holds it), ``crash`` or ``timeout``."""

    item: Any
    kind: str
    value: Any = None
    error: str = ""
    seconds: float = 0.0


def _worker(conn, fn, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        index, item = msg
        start = time.perf_counter()
        try:
            value = fn(item)
            result = (index, "ok", value, "")
        except BaseException as e:  # noqa: BLE001 - the check's failure is the result
            result = (index, "exception", None, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")
        try:
            conn.send(result + (time.perf_counter() - start,))
        except Exception as e:  # an unpicklable value
            conn.send((index, "exception", None, f"result not picklable: {e}", time.perf_counter() - start))


class _Slot:
    def __init__(self, ctx, fn, threads):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, fn, threads), daemon=True)
        self.proc.start()
        child.close()
        self.index: int | None = None
        self.started = 0.0

    def give(self, index: int, item: Any) -> None:
        self.index, self.started = index, time.perf_counter()
        self.conn.send((index, item))

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def positive(kind: type):
    """An argparse ``type=`` for a number > 0 (``--workers``, ``--timeout``), with a clear error."""
    import argparse

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, not {text}")
        return value

    return parse


def default_workers() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def run_isolated(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    workers: int | None = None,
    timeout: float = 600.0,
    threads_per_worker: int = 1,
) -> Iterator[Outcome]:
    """Yield an :class:`Outcome` for every item of ``items`` as checks finish (not in order).

    ``fn`` must be a module-level function (it is pickled into the workers); it gets one
    item and returns a picklable value. An item running longer than ``timeout`` seconds
    is stopped and reported as ``timeout``.
    """
    todo = list(enumerate(items))
    todo.reverse()
    ctx = mp.get_context("spawn")
    n = max(1, min(workers or default_workers(), len(todo)))
    slots = [_Slot(ctx, fn, threads_per_worker) for _ in range(n)] if todo else []
    lookup = dict(todo)
    try:
        for s in slots:
            if todo:
                s.give(*todo.pop())
        while any(s.index is not None for s in slots):
            busy = [s for s in slots if s.index is not None]
            now = time.perf_counter()
            wait_for = max(0.05, min(timeout - (now - s.started) for s in busy))
            ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=wait_for)
            for i, s in enumerate(slots):
                if s.index is None:
                    continue
                item = lookup[s.index]
                elapsed = time.perf_counter() - s.started
                outcome = None
                if s.conn in ready:
                    try:
                        index, kind, value, error, seconds = s.conn.recv()
                        outcome = Outcome(item, kind, value, error, seconds)
                    except (EOFError, OSError):
                        pass
                if outcome is None and (s.proc.sentinel in ready or not s.proc.is_alive()):
                    s.proc.join(timeout=1)
                    code = s.proc.exitcode
                    outcome = Outcome(item, "crash", error=f"worker process died (exit code {code})", seconds=elapsed)
                    s.stop(kill=True)
                    slots[i] = s = _Slot(ctx, fn, threads_per_worker)
                elif outcome is None and elapsed > timeout:
                    outcome = Outcome(item, "timeout", error=f"no result after {timeout:.0f} s", seconds=elapsed)
                    s.stop(kill=True)
                    slots[i] = s = _Slot(ctx, fn, threads_per_worker)
                if outcome is None:
                    continue
                s.index = None
                if todo:
                    s.give(*todo.pop())
                yield outcome
    finally:
        for s in slots:
            s.stop(kill=s.index is not None)

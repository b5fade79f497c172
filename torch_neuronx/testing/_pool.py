"""Run many independent checks in worker processes, each check isolated from the others.

A sweep must survive what it finds: a check that crashes its interpreter (a segfault,
an abort) or hangs is recorded as ``crash`` / ``timeout`` for that item only, the
worker is replaced, and the sweep goes on. Workers are started with ``spawn`` (the
device refuses forked children) and run one check at a time.

A worker is handed an item only once it has reported that it is ready (torch imported,
the initializer run), so the per-item timeout measures the check alone: start-up can take
far longer than a check on a loaded machine. A worker that fails to start, or is not
ready within ``startup_timeout``, stops the run with a ``RuntimeError``: no item can run
without workers, and blaming the item at hand would misreport it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator

_READY = "ready"
_START_FAILED = "start-up failed"


@dataclass
class Outcome:
    """What became of one item: ``kind`` is ``ok`` (``value`` is what the check returned),
    ``exception`` (the check raised; ``error`` holds it), ``crash`` or ``timeout``."""

    item: Any
    kind: str
    value: Any = None
    error: str = ""
    seconds: float = 0.0


def _format(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"


def _worker(conn, fn, threads: int, initializer) -> None:
    try:
        import torch

        torch.set_num_threads(threads)
        if initializer is not None:
            initializer()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which stops the run
        conn.send((_START_FAILED, _format(e)))
        return
    conn.send(_READY)
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
            result = (index, "exception", None, _format(e))
        try:
            conn.send(result + (time.perf_counter() - start,))
        except Exception as e:  # an unpicklable value
            conn.send((index, "exception", None, f"result not picklable: {e}", time.perf_counter() - start))


class _Slot:
    def __init__(self, ctx, fn, threads, initializer):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, fn, threads, initializer), daemon=True)
        self.spawned = time.perf_counter()
        self.proc.start()
        child.close()
        self.ready = False
        self.index: int | None = None
        self.started = 0.0

    def give(self, index: int, item: Any) -> None:
        self.index, self.started = index, time.perf_counter()
        try:
            self.conn.send((index, item))
        except OSError:  # the worker just died; the run loop sees it and reports a crash
            pass

    def check_start(self, signalled: list, startup_timeout: float) -> None:
        """Marks the slot ready once the worker says so; raises if it failed to start,
        died, or has taken longer than ``startup_timeout``."""
        if self.conn in signalled:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                msg = None
            if msg == _READY:
                self.ready = True
                return
            if isinstance(msg, tuple) and msg[0] == _START_FAILED:
                raise RuntimeError(f"a worker process failed to start (pid {self.proc.pid}):\n{msg[1]}")
        if self.proc.sentinel in signalled or not self.proc.is_alive():
            self.proc.join(timeout=1)
            raise RuntimeError(
                f"a worker process exited during start-up (exit code {self.proc.exitcode}), before it could "
                f"run any item; its stderr says why (often: the function or the initializer cannot be "
                f"imported in a fresh interpreter)"
            )
        waited = time.perf_counter() - self.spawned
        if waited > startup_timeout:
            raise RuntimeError(
                f"a worker process was not ready after {waited:.0f} s (startup_timeout={startup_timeout:g} s): "
                f"importing torch or the initializer did not finish"
            )

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
    initializer: Callable[[], Any] | None = None,
    startup_timeout: float = 600.0,
) -> Iterator[Outcome]:
    """Yield an :class:`Outcome` for every item of ``items`` as checks finish (not in order).

    ``fn`` must be a module-level function (it is pickled into the workers); it gets one
    item and returns a picklable value. An item running longer than ``timeout`` seconds
    is stopped and reported as ``timeout``; the clock starts when a ready worker gets the
    item. ``initializer`` (module-level, no arguments) runs once in every worker before it
    takes items: slow imports and set-up belong there, outside the per-item timeout.
    Raises ``RuntimeError`` when a worker fails to start or is not ready within
    ``startup_timeout`` seconds.
    """
    for name, value in (("timeout", timeout), ("startup_timeout", startup_timeout)):
        if not value > 0:
            raise ValueError(f"{name} must be a number of seconds greater than 0, not {value!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers!r}")
    if initializer is not None and not callable(initializer):
        raise TypeError(f"initializer must be callable, not {type(initializer).__name__}")
    todo = list(enumerate(items))
    todo.reverse()
    lookup = dict(todo)
    ctx = mp.get_context("spawn")

    def spawn() -> _Slot:
        return _Slot(ctx, fn, threads_per_worker, initializer)

    n = max(1, min(workers or default_workers(), len(todo)))
    slots: list[_Slot] = []
    try:
        slots += [spawn() for _ in range(n)] if todo else []
        while True:
            busy = [s for s in slots if s.index is not None]
            # Workers still starting matter only while items wait for them.
            starting = [s for s in slots if not s.ready] if todo else []
            if not busy and not starting:
                break
            watched = busy + starting
            deadlines = [s.started + timeout for s in busy] + [s.spawned + startup_timeout for s in starting]
            wait_for = max(0.05, min(deadlines) - time.perf_counter())
            signalled = wait([s.conn for s in watched] + [s.proc.sentinel for s in watched], timeout=wait_for)
            for s in list(slots):
                if not s.ready:
                    if s in starting:
                        s.check_start(signalled, startup_timeout)
                        if s.ready and todo:
                            s.give(*todo.pop())
                    continue
                if s.index is None:
                    continue
                item = lookup[s.index]
                elapsed = time.perf_counter() - s.started
                outcome = None
                if s.conn in signalled:
                    try:
                        index, kind, value, error, seconds = s.conn.recv()
                        outcome = Outcome(item, kind, value, error, seconds)
                    except (EOFError, OSError):
                        pass
                if outcome is None and (s.proc.sentinel in signalled or not s.proc.is_alive()):
                    s.proc.join(timeout=1)
                    code = s.proc.exitcode
                    outcome = Outcome(item, "crash", error=f"worker process died (exit code {code})", seconds=elapsed)
                elif outcome is None and elapsed > timeout:
                    outcome = Outcome(item, "timeout", error=f"no result after {timeout:g} s", seconds=elapsed)
                if outcome is None:
                    continue
                if outcome.kind in ("crash", "timeout"):
                    s.stop(kill=True)
                    slots.remove(s)
                    if todo:
                        slots.append(spawn())
                else:
                    s.index = None
                    if todo:
                        s.give(*todo.pop())
                yield outcome
    finally:
        for s in slots:
            s.stop(kill=s.index is not None or not s.ready)

"""Launch a worker script under torchrun for multi-process tests.

Every launch gets a free rendezvous port (``--standalone``), ``OMP_NUM_THREADS=1``, a
hard timeout after which the whole process group is killed, and a check that the run
left nothing of ours in ``/dev/shm``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

DIST_DIR = Path(__file__).parent / "distributed" / "workers"
SHM_PREFIX = "torch_neuronx"  # shared-memory segments of the neuron backend start with this


def shm_entries() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)}
    except FileNotFoundError:
        return set()


def remove_leaked(before: set[str]) -> list[str]:
    """Unlinks our /dev/shm entries that appeared since ``before`` (so one failure does not
    cascade) and returns their names; callers fail when there are any."""
    leaked = sorted(shm_entries() - before)
    for name in leaked:
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass
    return leaked


def run_session(cmd: list[str], env: dict, timeout: float, what: str) -> tuple[int, str]:
    """Runs a launcher in its own session; kills the session after it exits or times out, so
    none of its processes outlive the test. Returns (returncode, combined output)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{what} did not finish in {timeout:.0f} s\n{out}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out


# torchrun's --tee prefixes every line with its rank ("[default3]:"); a progress bar that ends
# in "\r" without a newline leaves the next rank's line glued to its end
_GLUED_RANK_LINE = re.compile(r"(?<=[^\n])(?=\[default\d+\]:)")


class DistResult:
    def __init__(self, rc: int, out: str):
        self.rc, self.out = rc, _GLUED_RANK_LINE.sub("\n", out)

    def __repr__(self) -> str:
        return f"DistResult(rc={self.rc})\n{self.out}"


def torchrun(
    script: str,
    nprocs: int,
    *args: str,
    timeout: float = 300,
    env: dict | None = None,
    expect_ok: bool = True,
    launcher_args: tuple[str, ...] = (),
) -> DistResult:
    """Run ``tests/distributed/workers/<script>`` on ``nprocs`` local ranks; returns rc and combined output."""
    before = shm_entries()
    full_env = dict(os.environ)
    # progress bars (Transformers' weight loading, checkpoint writing) interleave across ranks
    full_env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                     "TQDM_DISABLE": "1"})
    full_env.update(env or {})
    # torchrun keeps its per-rank logs (a torchelastic_* directory in /tmp) unless told where
    with tempfile.TemporaryDirectory(prefix="torchrun-logs-") as log_dir:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
            "--tee=3", f"--log-dir={log_dir}", *launcher_args, str(DIST_DIR / script), *args,
        ]
        rc, out = run_session(cmd, full_env, timeout, f"{script} on {nprocs} ranks")
    res = DistResult(rc, out)
    leaked = remove_leaked(before)
    assert not leaked, f"{script} left shared memory behind: {leaked}\n{out}"
    if expect_ok and res.rc != 0:
        raise AssertionError(f"{script} on {nprocs} ranks exited with {res.rc}\n{out}")
    return res


def accelerate_launch(script: str, nprocs: int = 2, launch_args: tuple[str, ...] | list[str] = (),
                      script_args: tuple[str, ...] | list[str] = (), env: dict | None = None,
                      timeout: float = 300) -> str:
    """``accelerate launch --num_processes N <launch_args> tests/distributed/workers/<script> <script_args>`` with
    OMP_NUM_THREADS=1, a free port, an empty HF_HOME (no user accelerate config) and no Hub.
    Returns the output; fails on a non-zero exit, a timeout or shared memory left behind."""
    with tempfile.TemporaryDirectory(prefix="accelerate-launch-") as tmp:
        full_env = dict(os.environ)
        full_env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HOME": tmp, "HF_HUB_OFFLINE": "1",
                         "HF_HUB_DISABLE_TELEMETRY": "1", "ACCELERATE_DISABLE_RICH": "1"})
        full_env.update(env or {})
        # --log_dir goes to torchrun, which otherwise leaves a torchelastic_* directory in /tmp
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(nprocs),
               "--main_process_port", "0", "--log_dir", os.path.join(tmp, "logs"), *launch_args,
               str(DIST_DIR / script), *script_args]
        before = shm_entries()
        rc, out = run_session(cmd, full_env, timeout, f"accelerate launch {script}")
    leaked = remove_leaked(before)
    assert not leaked, f"accelerate launch {script} left shared memory behind: {leaked}\n{out}"
    assert rc == 0, f"accelerate launch {script} exited with {rc}\n{out}"
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(script: str, nprocs: int, *args: str, timeout: float = 180, env: dict | None = None):
    """Start ``nprocs`` ranks of ``tests/distributed/workers/<script>`` directly (no torchrun agent, which
    would kill the survivors as soon as one rank dies). Returns [(returncode, output)] by rank."""
    before = shm_entries()
    port = free_port()
    procs = []
    try:
        for r in range(nprocs):
            e = dict(os.environ)
            e.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "RANK": str(r), "LOCAL_RANK": str(r),
                      "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": str(port)})
            e.update(env or {})
            procs.append(subprocess.Popen([sys.executable, str(DIST_DIR / script), *args], env=e,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        results = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise AssertionError(f"{script}: a rank did not exit in {timeout:.0f} s")
            results.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    leaked = remove_leaked(before)
    assert not leaked, f"{script} left shared memory behind: {leaked}\n{results}"
    return results

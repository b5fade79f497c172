"""A job across two hosts, simulated on this machine.

Each host is a Linux network namespace (joined to the other by a veth pair, 10.77.0.1/24 and
10.77.0.2/24, plus its own loopback) with its own UTS namespace (hostname ``hostA`` /
``hostB``) and its own mount namespace: a private tmpfs on ``/dev/shm`` (separate hosts do
not share shared memory, so a transport that wrongly uses it across hosts fails here) and a
private ``/etc/hosts`` naming both hosts. Each host runs ``torchrun --nnodes 2
--nproc-per-node 2 --node-rank i`` with c10d rendezvous on hostA, and GLOO_SOCKET_IFNAME set
to its veth device. The worker is tests/distributed/workers/hosts_worker.py.

Everything (processes, namespaces, veth) is removed at the end, also when a test fails or
times out. Needs root, ``ip`` and ``unshare``; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from _dist import DIST_DIR, SHM_PREFIX, remove_leaked, shm_entries

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.77.0"
HOSTS = ("hostA", "hostB")
NPROC_PER_HOST = 2
LAUNCH_TIMEOUT = 300  # one launch: 2 agents + 4 workers, ~10 s of imports each on 2 cores
STEP_TIMEOUT = 20  # each `ip` / `unshare` plumbing command


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=STEP_TIMEOUT)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _why_no_namespaces() -> str | None:
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    # Probe: can we create (and delete) a namespace and a veth pair at all (e.g. not in a
    # container without CAP_SYS_ADMIN / CAP_NET_ADMIN)?
    tag = secrets.token_hex(3)
    ns, veth = f"tnxprobe-{tag}", f"tnxp{tag}"
    try:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "-n", ns, "link", "add", veth + "a", "type", "veth", "peer", "name", veth + "b")
        _sh("ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "true")
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        return f"cannot create network/UTS/mount namespaces or veth pairs here: {e}"
    finally:
        _sh("ip", "netns", "del", ns, check=False)
    return None


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


class TwoHosts:
    """Two namespaces ``ns[0]``, ``ns[1]`` joined by veth ``ifname[0]`` <-> ``ifname[1]``."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)  # unique per run: concurrent runs do not collide
        self.tag = tag
        self.ns = [f"tnx-{tag}-a", f"tnx-{tag}-b"]
        self.ifname = [f"tnx{tag}a", f"tnx{tag}b"]  # <= 15 characters
        self.addr = [f"{SUBNET}.1", f"{SUBNET}.2"]
        self.tmp = Path(tempfile.mkdtemp(prefix=f"tnx-hosts-{tag}-"))
        self.procs: list[subprocess.Popen] = []

    def up(self) -> None:
        for ns in self.ns:
            _sh("ip", "netns", "add", ns)
        # Create the pair inside the first namespace, then move its peer: nothing ever
        # appears in the host's own namespace.
        _sh("ip", "-n", self.ns[0], "link", "add", self.ifname[0], "type", "veth", "peer", "name", self.ifname[1])
        _sh("ip", "-n", self.ns[0], "link", "set", self.ifname[1], "netns", self.ns[1])
        for ns, ifname, addr in zip(self.ns, self.ifname, self.addr):
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _sh("ip", "-n", ns, "link", "set", ifname, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for a, h in zip(self.addr, HOSTS))
        (self.tmp / "hosts").write_text(hosts)
        # the link must be usable from both sides before anything is launched
        deadline = time.monotonic() + 10
        while True:
            out = _sh("ip", "-n", self.ns[0], "-o", "link", "show", self.ifname[0]).stdout
            if "LOWER_UP" in out:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"veth {self.ifname[0]} did not come up: {out}")
            time.sleep(0.1)

    def down(self) -> list[str]:
        """Removes everything. Returns the processes that outlived a run that had itself
        finished (a launch that failed or timed out is killed without being reported here)."""
        finished = all(p.poll() is not None for p in self.procs)
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the launcher's whole session
            except ProcessLookupError:
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        stray: list[str] = []
        deadline = time.monotonic() + 10
        while True:
            # anything still running in our own namespaces is ours: kill it by pid
            left = {ns: _sh("ip", "netns", "pids", ns, check=False).stdout.split() for ns in self.ns}
            if not any(left.values()) or time.monotonic() > deadline:
                break
            for ns, pids in left.items():
                for pid in pids:
                    if finished:
                        stray.append(f"pid {pid} in {ns}: {_cmdline(pid)}")
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
            finished = False  # report each survivor once
            time.sleep(0.2)
        _sh("ip", "-n", self.ns[0], "link", "del", self.ifname[0], check=False)
        for ns in self.ns:
            _sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return stray

    def node_command(self, i: int, port: int, script: str, env: dict[str, str]) -> list[str]:
        """The command that runs node ``i`` of the job as host ``HOSTS[i]``."""
        torchrun = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", str(NPROC_PER_HOST), "--node-rank", str(i),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.addr[0]}:{port}",
            "--rdzv-id", f"tnx-{self.tag}", "--rdzv-conf", "join_timeout=120",
            "--max-restarts", "0", "--tee", "3", "--log-dir", str(self.tmp / f"logs{i}"),
            str(DIST_DIR / script),
        ]
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # Inside the namespaces: a private /dev/shm and /etc/hosts for this host, its
        # hostname, then torchrun. Afterwards, shared memory left on this host fails the run.
        script_sh = f"""
set -e
mount -t tmpfs -o size=1g,mode=1777 tnxshm /dev/shm
mount --bind {shlex.quote(str(self.tmp / 'hosts'))} /etc/hosts
hostname {HOSTS[i]}
set +e
export {exports}
{shlex.join(torchrun)}
rc=$?
left=$(ls /dev/shm | grep '^{SHM_PREFIX}' || true)
if [ -n "$left" ]; then echo "LEFTOVER_SHM on {HOSTS[i]}:" $left; if [ $rc -eq 0 ]; then rc=97; fi; fi
exit $rc
"""
        return ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", script_sh]

    def run(self, script: str, env: dict[str, str] | None = None, timeout: float = LAUNCH_TIMEOUT):
        """Runs ``tests/distributed/workers/<script>`` on both hosts; returns ``(returncodes, outputs)``."""
        port = 20000 + secrets.randbelow(20000)  # the namespaces are fresh: every port is free
        outs = [self.tmp / f"node{i}.log" for i in range(2)]
        for i in range(2):
            node_env = {
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                "TORCH_NEURONX_TEST_DIST": "1",
                "GLOO_SOCKET_IFNAME": self.ifname[i],
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **(env or {}),
            }
            with open(outs[i], "w") as f:
                self.procs.append(subprocess.Popen(
                    self.node_command(i, port, script, node_env), stdout=f, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.tmp,
                ))
        deadline = time.monotonic() + timeout
        rcs: list[int | None] = [None, None]
        while any(rc is None for rc in rcs) and time.monotonic() < deadline:
            rcs = [p.poll() for p in self.procs]
            if any(rc not in (None, 0) for rc in rcs):
                # one host failed: give the other a moment to report, then stop waiting
                end = min(deadline, time.monotonic() + 30)
                while any(rc is None for rc in rcs) and time.monotonic() < end:
                    time.sleep(0.2)
                    rcs = [p.poll() for p in self.procs]
                break
            time.sleep(0.2)
        texts = [o.read_text(errors="replace") for o in outs]
        return rcs, texts


_SKIP = None


@pytest.fixture
def two_hosts():
    global _SKIP
    if _SKIP is None:
        _SKIP = _why_no_namespaces() or ""
    if _SKIP:
        pytest.skip(_SKIP)
    before = shm_entries()
    hosts = TwoHosts()
    try:
        hosts.up()
        yield hosts
    finally:
        stray = hosts.down()
        leaked = remove_leaked(before)
    assert not stray, f"processes outlived the run and were killed: {stray}"
    assert not leaked, f"shared memory left in the machine's /dev/shm: {leaked}"


def _describe(rcs, texts) -> str:
    return "\n".join(f"===== {h} (exit {rc}) =====\n{t}" for h, rc, t in zip(HOSTS, rcs, texts))


def _check_run(rcs, texts) -> str:
    out = _describe(rcs, texts)
    assert all(rc is not None for rc in rcs), f"the job did not finish in {LAUNCH_TIMEOUT} s\n{out}"
    assert rcs == [0, 0], f"the job failed\n{out}"
    joined = "\n".join(texts)
    for r in range(2 * NPROC_PER_HOST):
        assert f"rank {r}: ok" in joined, f"rank {r} did not finish\n{out}"
    return joined


def _stats(joined: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for m in re.finditer(r"rank (\d+): STATS (.*)", joined):
        found.setdefault(int(m.group(1)), []).append(m.group(2))
    return found


def test_two_hosts_neuron(two_hosts):
    """Backend ``neuron`` on neuron tensors across two hosts: shared memory between the two
    ranks of a host, gloo between hosts."""
    rcs, texts = two_hosts.run("hosts_worker.py")
    joined = _check_run(rcs, texts)
    assert re.search(r"rank 0: local_rank 0 host hostA device neuron:0 backend neuron", joined), joined
    assert re.search(r"rank 3: local_rank 1 host hostB device neuron:1 backend neuron", joined), joined
    stats = _stats(joined)
    assert sorted(stats) == [0, 1, 2, 3], f"torch_neuronx.distributed.stats() was not printed by every rank\n{joined}"
    _assert_all_reduce_used_both_transports(stats, joined)


def _assert_all_reduce_used_both_transports(stats: dict[int, list[str]], joined: str) -> None:
    """``torch_neuronx.distributed.stats()`` is ``{collective: {transport: calls}}``; the
    all_reduce is hierarchical: shared memory among a host's ranks, gloo between the hosts'
    leaders. Every rank used shm for it; on each host at least one rank (its leader) used gloo."""
    parsed = {}
    for rank, lines in sorted(stats.items()):
        first = lines[0]  # printed right after the all_reduces
        assert not first.startswith("unavailable"), f"rank {rank}: stats {first}\n{joined}"
        parsed[rank] = json.loads(first)
    for rank, st in parsed.items():
        ar = st.get("all_reduce", {})
        assert ar.get("shm", 0) > 0, f"rank {rank}: all_reduce never used shared memory: {st}\n{joined}"
    for h in range(2):
        ranks = range(h * NPROC_PER_HOST, (h + 1) * NPROC_PER_HOST)
        assert any(parsed[r].get("all_reduce", {}).get("gloo", 0) > 0 for r in ranks), (
            f"{HOSTS[h]}: no rank's all_reduce used gloo between hosts: {[parsed[r] for r in ranks]}\n{joined}"
        )

"""Distributed training on ``neuron`` with the ``neuron`` c10d backend, multi-process.

Two launches run everything (process start-up dominates on a small machine):

* ``tests/distributed/workers/parallel4.py`` on 4 ranks: DTensor on a 2x2 mesh, FSDP2 x TP(+SP) on a 2x2
  mesh, and a torch.distributed.checkpoint of an FSDP2 model + AdamW saved by 4 ranks and
  loaded back bitwise;
* ``tests/distributed/workers/parallel2.py`` on 2 ranks: DDP (SGD, AdamW), FSDP2 (reshard after forward or
  not, fp32 or bf16 mixed precision), DTensor, TP, TP+SP, pipeline parallel (GPipe, 1F1B),
  expert parallel (all-to-all with uneven splits), context parallel, and loading the
  4-rank checkpoint into 2 ranks.

Every check compares the distributed result with an oracle that each rank computes on CPU
from all ranks' data, and rank 0 prints ``CHECK <name> ok`` when it held on every rank;
each test below asserts one marker. ``TNX_DIST_DEVICE=cpu`` runs the same scripts with
device ``cpu`` and backend ``gloo`` (validates the scripts, not the backend).
"""

from __future__ import annotations

import re

import pytest

from _dist import torchrun

CHECKS_4 = ["dtensor_2d", "fsdp2_tp", "fsdp2_tp_ac", "dcp_save"]
CHECKS_2 = [
    "ddp_sgd", "ddp_adamw",
    "fsdp2", "fsdp2_no_reshard", "fsdp2_bf16", "fsdp2_bf16_no_reshard",
    "dtensor", "dtensor_random", "tp", "tp_sp",
    "pp_gpipe", "pp_1f1b",
    "ep", "ep_funcol",
    "cp",
    "dcp_reshard",
]


class Launch:
    def __init__(self, script: str, nprocs: int, *args: str, timeout: float):
        self.script, self.nprocs = script, nprocs
        self.error = None  # a hang or shared memory left behind, from tests/_dist.py
        try:
            res = torchrun(script, nprocs, *args, timeout=timeout, expect_ok=False)
            self.rc, self.out = res.rc, res.out
        except AssertionError as e:
            self.rc, self.out, self.error = None, str(e), str(e).splitlines()[0]

    def markers(self) -> dict[str, str]:
        """``{check: 'ok' | 'FAIL ...'}`` from every rank's markers."""
        found = {}
        for m in re.finditer(r"^(?:\[\w+\]:)?CHECK (\w+) (ok|FAIL.*?)(?:  \[[\d.]+ s\])?$",
                             self.out, re.M):
            found.setdefault(m.group(1), m.group(2))
        return found

    def check_output(self, name: str) -> str:
        """The lines the ranks printed about ``name``: its errors and tracebacks."""
        lines, keep = [], False
        for line in self.out.splitlines():
            body = re.sub(r"^\[\w+\]:", "", line)
            if f"CHECK {name} " in body:
                keep = True
            elif re.match(r"(rank \d+: )?CHECK \w+ ", body):
                keep = False
            if keep:
                lines.append(line)
        return "\n".join(lines[:200])

    def assert_check(self, name: str) -> None:
        result = self.markers().get(name)
        where = f"{self.script} on {self.nprocs} ranks"
        if result is None:
            tail = "\n".join(self.out.splitlines()[-80:])
            pytest.fail(f"{where} printed no result for check {name!r}"
                        f"{' (' + self.error + ')' if self.error else ''}:\n{tail}")
        if result == "ok":
            return
        pytest.fail(f"{where}: CHECK {name} {result}\n{self.check_output(name)}")


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("dcp")


@pytest.fixture(scope="module")
def launch4(ckpt_dir) -> Launch:
    return Launch("parallel4.py", 4, "--ckpt", str(ckpt_dir), timeout=300)


@pytest.fixture(scope="module")
def launch2(launch4, ckpt_dir) -> Launch:  # after launch4: loads its checkpoint
    return Launch("parallel2.py", 2, "--ckpt", str(ckpt_dir), timeout=300)


@pytest.mark.parametrize("check", CHECKS_4)
def test_four_ranks(launch4, check):
    launch4.assert_check(check)


@pytest.mark.parametrize("check", CHECKS_2)
def test_two_ranks(launch2, check):
    launch2.assert_check(check)


@pytest.mark.parametrize("nprocs", [4, 2])
def test_launch_exits_cleanly(request, nprocs):
    """No hang, no shared memory left behind, and every rank finished."""
    launch: Launch = request.getfixturevalue(f"launch{nprocs}")
    assert launch.error is None, launch.out
    markers = launch.markers()
    expected = CHECKS_4 if nprocs == 4 else CHECKS_2
    assert sorted(markers) == sorted(expected), (sorted(markers), launch.out[-5000:])
    if all(r == "ok" for r in markers.values()):
        assert launch.rc == 0, launch.out[-5000:]
        for r in range(nprocs):
            assert re.search(rf"^(\[\w+\]:)?rank {r}: ok$", launch.out, re.M), f"rank {r} did not finish"
    else:
        assert launch.rc != 0, "a check failed but the launch exited 0"

"""The neuron c10d backend: every collective, the ways to select it, misuse and faults.

Each test launches real processes (torchrun, or plain processes where a rank must die).
"""

from __future__ import annotations

import re

import pytest

from _dist import spawn_ranks, torchrun

CHECKS = ["all_reduce", "rooted", "gather_scatter", "all_to_all", "p2p", "functional", "groups", "misuse", "stats"]


def _assert_checks(out: str, names: list[str], nprocs: int) -> None:
    for name in names:
        n = len(re.findall(rf"CHECK {name} ok", out))
        assert n == nprocs, f"check {name!r} passed on {n} of {nprocs} ranks\n{out}"


@pytest.mark.parametrize(
    "nprocs,env",
    [
        # Small buffers and rings: multi-chunk collectives and p2p streaming through the ring.
        (2, {"TORCH_NEURONX_SHM_BUFFER_MB": "0.125", "TORCH_NEURONX_SHM_RING_MB": "0.0625"}),
        (4, {}),
    ],
    ids=["2ranks-small-buffers", "4ranks"],
)
def test_every_collective_matches_reference(nprocs, env):
    res = torchrun("collectives.py", nprocs, env=env, timeout=400)
    _assert_checks(res.out, CHECKS, nprocs)


def test_backend_selection_variants():
    res = torchrun("init_variants.py", 2, timeout=240)
    _assert_checks(res.out, ["default", "mixed", "named"], 2)
    assert "No backend of type" not in res.out, res.out


def test_killed_rank_makes_the_others_raise():
    results = spawn_ranks("fault.py", 4, "2", "120", timeout=200)
    assert results[2][0] == -9, results[2]
    for r in (0, 1, 3):
        rc, out = results[r]
        assert rc == 3, f"rank {r} exited with {rc}\n{out}"
        assert "has exited" in out and "local rank 2" in out, out


PARITY_CHECKS = ["profiler", "uneven_all_gather", "uneven_reduce_scatter", "self_p2p", "timeout_wording",
                 "pp_nonsymmetric", "pp_static_gpipe"]


def test_what_pytorch_distributed_tests_expect_of_a_backend():
    """Profiler events per collective (gloo in the same processes is the oracle), uneven
    all_gather / reduce_scatter, send/recv to oneself, c10d's timeout wording, and pipelines
    whose stages talk within one rank (tests/distributed/workers/c10d_parity.py)."""
    res = torchrun("c10d_parity.py", 2, timeout=300)
    _assert_checks(res.out, PARITY_CHECKS, 1)


def test_a_mesh_gives_a_process_without_a_device_its_ranks_device():
    # No set_device and no LOCAL_RANK: DeviceMesh puts rank r on neuron:r as it would on
    # cuda:r, and FSDP2 computes there (the threaded group's different rule must not leak here).
    results = spawn_ranks("mesh_device.py", 2, timeout=200)
    for r, (rc, out) in enumerate(results):
        assert rc == 0 and f"rank {r}: ok on neuron:{r}" in out, f"rank {r} exited with {rc}\n{out}"

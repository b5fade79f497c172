"""Distributed programs simulated in one process on ``neuron``: PyTorch's LocalTensorMode
(every rank of a DTensor program in one interpreter, over the ``fake`` process group), and
torch.testing's multi-threaded process group (every rank a thread, the ``threaded`` backend).
Oracle: the same program on a ``cpu`` mesh, and the computation on plain CPU tensors."""

from __future__ import annotations

import textwrap

_LOCAL_TENSOR_PROGRAM = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    W = 4
    dist.init_process_group("fake", world_size=W, rank=0)
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 12)


    def per_rank(t):
        assert isinstance(t, LocalTensor) and sorted(t._local_tensors) == list(range(W))
        return {r: v for r, v in t._local_tensors.items()}


    def run(dev):
        with LocalTensorMode(frozenset(range(W))):
            mesh = init_device_mesh(dev, (W,))
            # column-parallel matmul: each simulated rank holds 3 columns of b
            prod = distribute_tensor(a.to(dev), mesh, [Replicate()]) @ distribute_tensor(b.to(dev), mesh, [Shard(1)])
            assert prod.placements == (Shard(1),)
            shards, full = per_rank(prod.to_local()), per_rank(prod.full_tensor())
            torch.manual_seed(5)  # every simulated rank's generators, then a draw on each rank
            drawn = per_rank(torch.randn(6, 6, device=dev))
        assert {v.device.type for v in (*shards.values(), *full.values(), *drawn.values())} == {dev}
        return [{r: v.cpu() for r, v in d.items()} for d in (shards, full, drawn)]


    cpu, neuron = run("cpu"), run("neuron")
    for rank in range(W):
        torch.testing.assert_close(neuron[0][rank], (a @ b)[:, 3 * rank:3 * rank + 3], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(neuron[1][rank], a @ b, rtol=1e-5, atol=1e-5)
        for got, want in zip(neuron, cpu):
            assert torch.equal(got[rank], want[rank]), rank
    print("ok")
""")


def test_local_tensor_mode_tensor_parallel_matmul_and_random(run_python):
    # LocalTensorMode sets each simulated rank's RNG state (torch.neuron.set_rng_state) while
    # DTensor propagates shardings on fake tensors, and the neuron mesh runs over the "fake" group.
    out = run_python(_LOCAL_TENSOR_PROGRAM, env={"OMP_NUM_THREADS": "1"})
    assert out.strip().endswith("ok")


_THREADED_FSDP_PROGRAM = textwrap.dedent("""
    import sys, threading, unittest
    import torch, torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.common_fsdp import FSDPTestMultiThread

    WAIT = 60  # seconds; a rank that never signals fails the test instead of hanging it


    class Paramless(nn.Module):
        # FSDP2's root moves the forward inputs (tensors and nested tuples) to its device.
        def __init__(self, want):
            super().__init__()
            self.want = want

        def forward(self, x, ys):
            got = [x.device, ys[0].device, ys[1].device]
            assert got == [self.want] * 3, f"inputs on {got}, expected {self.want}"
            return x + ys[0] + ys[1] + 1


    def check_forward(test, model):
        x, ys = torch.randn(3), (torch.randn(3), torch.randn(3))
        out = model(x, ys)
        test.assertEqual(out.device, model.want)
        torch.testing.assert_close(out.cpu(), x + ys[0] + ys[1] + 1)


    class ThreadsKeepTheirDevice(FSDPTestMultiThread):
        rank1_sharded = threading.Event()

        @property
        def world_size(self):
            return 2

        def test_root_moves_inputs_to_the_current_device(self):
            # The user's device is neuron:0 on every thread. Rank 1 builds its mesh first, while
            # the device is not initialized yet: it must not be moved to neuron:1 by its rank.
            device = torch.device("neuron", 0)
            model = Paramless(device).to(device)  # no parameters: initializes nothing
            if self.rank == 1:
                try:
                    self.assertFalse(torch.neuron.is_initialized())
                    fully_shard(model)
                finally:
                    self.rank1_sharded.set()
            else:
                self.assertTrue(self.rank1_sharded.wait(WAIT), "rank 1 did not apply fully_shard")
                fully_shard(model)
            self.assertEqual(torch.neuron.current_device(), 0)
            check_forward(self, model)

        def test_a_device_the_thread_sets_is_kept(self):
            # As with torch.cuda.set_device before the mesh: each thread's own choice stands.
            torch.neuron.set_device(self.rank)
            device = torch.device("neuron", self.rank)
            model = Paramless(device)
            fully_shard(model)
            self.assertEqual(torch.neuron.current_device(), self.rank)
            check_forward(self, model)


    order = ["test_root_moves_inputs_to_the_current_device", "test_a_device_the_thread_sets_is_kept"]
    result = unittest.TextTestRunner(verbosity=2).run(unittest.TestSuite(ThreadsKeepTheirDevice(n) for n in order))
    print("ok" if result.wasSuccessful() and result.testsRun == len(order) else "FAILED")
    sys.exit(0 if result.wasSuccessful() else 1)
""")


def test_threaded_process_group_fsdp_moves_inputs_to_each_threads_current_device(run_python):
    # FSDPTestMultiThread (threads as ranks of one process): a DeviceMesh must not move a thread
    # to its rank's device; FSDP2 then takes the thread's current device for the forward inputs.
    out = run_python(_THREADED_FSDP_PROGRAM, env={"OMP_NUM_THREADS": "1"})
    assert out.strip().endswith("ok"), out

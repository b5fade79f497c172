"""Distributed programs simulated in one process on ``neuron``: PyTorch's LocalTensorMode
(every rank of a DTensor program in one interpreter, over the ``fake`` process group).
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

"""Neuron tensors sent between processes with torch.multiprocessing (spawn), as CUDA
tensors are: the receiver gets a neuron tensor on the same device index over the same
memory, so writes on one side are seen on the other."""

import pytest
import torch
import torch.multiprocessing as mp

TIMEOUT = 120


def _consumer(q, r):
    t = q.get(timeout=TIMEOUT)
    r.put(("tensor", str(t.device), t.cpu().tolist(), t.stride(), t.storage_offset()))
    t.add_(100)  # seen by the producer
    p = q.get(timeout=TIMEOUT)
    r.put(("param", type(p).__name__, p.requires_grad, str(p.device), p.detach().cpu().tolist()))
    s = q.get(timeout=TIMEOUT)
    r.put(("storage", str(s.device), s.nbytes()))
    big = q.get(timeout=TIMEOUT)
    r.put(("big", float(big.sum().cpu())))


@pytest.fixture
def ctx():
    c = mp.get_context("spawn")
    procs = []
    yield c, procs
    for p in procs:  # never leave a child behind, even when the test failed
        if p.is_alive():
            p.kill()
        p.join(10)


def test_queue_roundtrip_shares_memory(ctx, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    c, procs = ctx
    q, r = c.Queue(), c.Queue()
    p = c.Process(target=_consumer, args=(q, r), daemon=True)
    p.start()
    procs.append(p)
    base = torch.arange(12.0, device="neuron:1").view(3, 4)
    t = base[:, 1:3]  # a strided view with an offset
    q.put(t)
    kind, dev, values, stride, offset = r.get(timeout=TIMEOUT)
    assert (kind, dev, stride, offset) == ("tensor", "neuron:1", t.stride(), t.storage_offset())
    assert values == torch.arange(12.0).view(3, 4)[:, 1:3].tolist()  # as sent, before the consumer's add
    q.put(torch.nn.Parameter(torch.full((2,), 7.0, device="neuron")))
    assert r.get(timeout=TIMEOUT) == ("param", "Parameter", True, "neuron:0", [7.0, 7.0])
    # the consumer's in-place add landed in the producer's tensor (and its base)
    assert torch.equal(t.cpu(), torch.arange(12.0).view(3, 4)[:, 1:3] + 100)
    assert torch.equal(base.cpu()[:, 0], torch.tensor([0.0, 4.0, 8.0]))
    q.put(torch.ones(3, device="neuron").untyped_storage())
    assert r.get(timeout=TIMEOUT) == ("storage", "neuron:0", 12)
    big = torch.ones(1 << 20, device="neuron")
    q.put(big)
    assert r.get(timeout=TIMEOUT) == ("big", float(1 << 20))
    p.join(TIMEOUT)
    assert p.exitcode == 0
    # the producer's tensors keep working after sharing
    assert torch.equal((t * 2).cpu(), (torch.arange(12.0).view(3, 4)[:, 1:3] + 100) * 2)


def test_non_leaf_requiring_grad_is_refused_at_put():
    from multiprocessing.reduction import ForkingPickler

    x = torch.ones(2, device="neuron", requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="non-leaf tensor which requires_grad"):
        ForkingPickler.dumps(x)


def test_cpu_tensors_still_use_torch_sharing():
    from multiprocessing.reduction import ForkingPickler

    import pickle

    t = torch.arange(4.0)
    back = pickle.loads(ForkingPickler.dumps(t))
    assert torch.equal(back, t) and back.device.type == "cpu"

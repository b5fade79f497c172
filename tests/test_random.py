"""RNG: per-device default generators, seeding, state round trips, dropout on device."""

import pytest
import torch


def test_manual_seed_reproduces_and_matches_cpu():
    torch.manual_seed(123)
    a = torch.randn(1000, device="neuron")
    torch.manual_seed(123)
    b = torch.randn(1000, device="neuron")
    assert torch.equal(a.cpu(), b.cpu())
    # neuron generators draw the same mt19937 stream as CPU's
    torch.manual_seed(123)
    c = torch.randn(1000)
    assert torch.equal(a.cpu(), c)
    torch.neuron.manual_seed(7)
    u = torch.rand(10, device="neuron")
    torch.neuron.manual_seed(7)
    assert torch.equal(u.cpu(), torch.rand(10, device="neuron").cpu())


def test_generators_are_per_device():
    torch.neuron.manual_seed_all(5)
    x0 = torch.randn(8, device="neuron:0")
    x1 = torch.randn(8, device="neuron:1")
    assert torch.equal(x0.cpu(), x1.cpu())  # same seed, independent streams
    y0 = torch.randn(8, device="neuron:0")
    assert not torch.equal(x0.cpu(), y0.cpu())
    torch.neuron.manual_seed_all(5)
    torch.randn(8, device="neuron:0")
    torch.randn(8, device="neuron:0")
    assert torch.equal(torch.randn(8, device="neuron:1").cpu(), x1.cpu())  # device 1 untouched by device 0 draws
    assert torch.neuron.initial_seed() == 5
    assert len(torch.neuron.default_generators) == 4


def test_rng_state_round_trip():
    torch.manual_seed(0)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.rand(100, device="neuron")
    torch.neuron.set_rng_state(state)
    b = torch.rand(100, device="neuron")
    assert torch.equal(a.cpu(), b.cpu())
    states = torch.neuron.get_rng_state_all()
    assert len(states) == 4
    c = [torch.rand(3, device=f"neuron:{i}").cpu() for i in range(4)]
    torch.neuron.set_rng_state_all(states)
    assert all(torch.equal(c[i], torch.rand(3, device=f"neuron:{i}").cpu()) for i in range(4))
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.neuron.set_rng_state(torch.zeros(3))


def test_explicit_generator_objects():
    g = torch.Generator(device="neuron")
    assert g.device == torch.device("neuron", 0)
    g.manual_seed(42)
    a = torch.randn(50, device="neuron", generator=g)
    g.manual_seed(42)
    b = torch.randn(50, device="neuron", generator=g)
    assert torch.equal(a.cpu(), b.cpu())
    gc = torch.Generator().manual_seed(42)
    assert torch.equal(a.cpu(), torch.randn(50, generator=gc))
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator but found 'cpu'"):
        torch.randn(5, device="neuron", generator=torch.Generator())


@pytest.mark.parametrize("op", ["uniform", "normal", "bernoulli", "randint", "randperm", "multinomial", "exponential"])
def test_random_ops_match_cpu_under_the_same_seed(op):
    def draw(device):
        torch.manual_seed(99)
        if op == "uniform":
            return torch.empty(300, device=device).uniform_(-2, 3)
        if op == "normal":
            return torch.empty(300, device=device).normal_(1.0, 0.5)
        if op == "bernoulli":
            return torch.bernoulli(torch.full((300,), 0.3, device=device))
        if op == "randint":
            return torch.randint(0, 1000, (300,), device=device)
        if op == "randperm":
            return torch.randperm(300, device=device)
        if op == "multinomial":
            return torch.multinomial(torch.ones(50, device=device), 20)
        return torch.empty(300, device=device).exponential_(2.0)

    n, c = draw("neuron"), draw("cpu")
    assert n.device.type == "neuron" and n.dtype == c.dtype
    assert torch.equal(n.cpu(), c)


def test_dropout_on_device():
    x = torch.ones(10_000, device="neuron", requires_grad=True)
    torch.manual_seed(3)
    y = torch.nn.functional.dropout(x, p=0.25, training=True)
    assert y.device.type == "neuron"
    kept = (y != 0).float().mean().item()
    assert 0.72 < kept < 0.78
    assert torch.allclose(y[y != 0].cpu(), torch.full_like(y[y != 0].cpu(), 1 / 0.75))
    y.sum().backward()
    assert torch.equal((x.grad != 0).cpu(), (y != 0).cpu())
    torch.manual_seed(3)
    y2 = torch.nn.functional.dropout(torch.ones(10_000, device="neuron"), p=0.25, training=True)
    assert torch.equal(y.detach().cpu(), y2.cpu())
    assert torch.equal(torch.nn.functional.dropout(x, 0.5, training=False).detach().cpu(), x.detach().cpu())


def test_rng_state_is_seed_and_offset_as_on_cuda():
    # 16 bytes, (seed, offset) as little-endian uint64: the layout DTensor's random ops and
    # CUDA code read and write.
    torch.neuron.manual_seed(1234)
    state = torch.neuron.get_rng_state()
    assert state.shape == (16,)
    seed, offset = state.view(torch.int64).tolist()
    assert (seed, offset) == (1234, 0)
    assert torch.equal(torch.neuron.get_rng_state(), state)  # reading does not move the generator
    # offset 0 is the plain seed: the CPU's numbers
    torch.manual_seed(1234)
    assert torch.equal(torch.randn(64, device="neuron").cpu(), torch.randn(64))
    # after draws, the state read names a stream not used before and replays what follows it
    torch.neuron.manual_seed(1234)
    first = torch.randn(16, device="neuron").cpu()
    s1 = torch.neuron.get_rng_state()
    assert s1.view(torch.int64).tolist()[0] == 1234 and s1.view(torch.int64).tolist()[1] > 0
    a = torch.randn(16, device="neuron").cpu()
    assert not torch.equal(a, first)
    torch.neuron.set_rng_state(s1)
    assert torch.equal(torch.randn(16, device="neuron").cpu(), a)
    # a state written with another offset: another stream, reproducibly
    other = torch.tensor([1234, 1000], dtype=torch.int64).view(torch.uint8)
    torch.neuron.set_rng_state(other)
    b = torch.randn(16, device="neuron").cpu()
    torch.neuron.set_rng_state(other)
    assert torch.equal(torch.randn(16, device="neuron").cpu(), b)
    assert not torch.equal(b, a)
    g = torch.Generator(device="neuron")
    g.manual_seed(7)
    assert g.get_state().view(torch.int64).tolist() == [7, 0]
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.neuron.set_rng_state(torch.zeros(5, dtype=torch.uint8))


def test_fork_rng_and_checkpoint_replay_on_neuron():
    # torch.utils.checkpoint saves the device RNG state and restores it to recompute dropout.
    torch.manual_seed(0)
    x = torch.randn(32, 32, device="neuron", requires_grad=True)

    def f(t):
        return torch.nn.functional.dropout(t, 0.5, training=True).sin()

    out = torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False, preserve_rng_state=True)
    out.sum().backward()
    kept = out.detach() != 0  # sin(0) == 0 where dropped
    # the recomputed forward must drop the same elements: d sin(2x)/dx where kept, else 0
    expected = torch.where(kept, 2 * x.detach().mul(2).cos(), torch.zeros_like(x))
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-5)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        inside = torch.randn(4, device="neuron").cpu()
    outside = torch.randn(4, device="neuron").cpu()
    assert torch.equal(inside, outside)

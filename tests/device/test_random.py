"""RNG: per-device default generators, seeding, state round trips, every random op (dropout included)
on the device's generator, generator arguments."""

import copy

import pytest
import torch
import torch.nn.functional as F


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


# ---- every random op draws from the device's generator ---------------------------------------


def _random_ops():
    # name -> fn(device): one draw, as the same code runs on either device
    def ones(device, *shape):
        return torch.ones(*shape, device=device)

    def sdpa(device):
        q = torch.arange(2 * 2 * 16 * 8, dtype=torch.float32).reshape(2, 2, 16, 8).div(300).sin().to(device)
        return F.scaled_dot_product_attention(q, q, q, dropout_p=0.3)

    def rnn(kind):
        # made once, outside the seeded draws: only the dropout between layers draws from them
        m = kind(4, 5, num_layers=3, dropout=0.5)
        models = {"cpu": m, "neuron": copy.deepcopy(m).to("neuron")}
        return lambda device: models[device](torch.ones(6, 2, 4, device=device))[0]

    return {
        "F.dropout": lambda d: F.dropout(ones(d, 2000), 0.3),
        "native_dropout": lambda d: torch.native_dropout(ones(d, 2000), 0.3, True)[0],
        "nn.Dropout": lambda d: torch.nn.Dropout(0.4)(ones(d, 40, 50)),
        "dropout_": lambda d: F.dropout(ones(d, 2000), 0.3, inplace=True),
        "dropout1d": lambda d: F.dropout1d(ones(d, 4, 32, 10), 0.3),
        "dropout2d": lambda d: F.dropout2d(ones(d, 4, 32, 3, 3), 0.3),
        "dropout3d": lambda d: F.dropout3d(ones(d, 4, 32, 2, 3, 3), 0.3),
        "alpha_dropout": lambda d: F.alpha_dropout(ones(d, 2000), 0.3, True),
        "feature_alpha_dropout": lambda d: F.feature_alpha_dropout(ones(d, 4, 32, 3, 3), 0.3, True),
        "sdpa_dropout": sdpa,
        "lstm_dropout": rnn(torch.nn.LSTM),
        "gru_dropout": rnn(torch.nn.GRU),
        "rrelu": lambda d: F.rrelu(-ones(d, 2000), training=True),
        "bernoulli.p": lambda d: torch.bernoulli(ones(d, 2000), 0.3),
        "bernoulli": lambda d: torch.bernoulli(ones(d, 2000) * 0.3),
        "normal_": lambda d: ones(d, 500).normal_(1.0, 2.0),
        "normal.Tensor_float": lambda d: torch.normal(ones(d, 500), 2.0),
        "uniform_": lambda d: ones(d, 500).uniform_(-1, 2),
        "exponential_": lambda d: ones(d, 500).exponential_(3.0),
        "geometric_": lambda d: ones(d, 500).geometric_(0.2),
        "cauchy_": lambda d: ones(d, 500).cauchy_(),
        "log_normal_": lambda d: ones(d, 500).log_normal_(),
        "random_": lambda d: ones(d, 500).random_(0, 1000),
        "rand_like": lambda d: torch.rand_like(ones(d, 500)),
        "randn_like": lambda d: torch.randn_like(ones(d, 500)),
        "randint_like": lambda d: torch.randint_like(ones(d, 500), 1000),
        "randperm": lambda d: torch.randperm(500, device=d),
        "multinomial": lambda d: torch.multinomial(ones(d, 100), 30),
        "multinomial_replacement": lambda d: torch.multinomial(ones(d, 100), 30, replacement=True),
        "poisson": lambda d: torch.poisson(ones(d, 500) * 3),
        "_standard_gamma": lambda d: torch._standard_gamma(ones(d, 500) * 2),
        "binomial": lambda d: torch.binomial(ones(d, 500) * 10, ones(d, 500) * 0.3),
        "gumbel_softmax": lambda d: F.gumbel_softmax(ones(d, 50, 10)),
    }


_OPS = _random_ops()


@pytest.mark.parametrize("name", sorted(_OPS))
def test_random_op_draws_from_the_neuron_generator(name):
    fn = _OPS[name]
    # the project's rule: after torch.manual_seed(s), neuron draws the CPU's numbers
    torch.manual_seed(21)
    n = fn("neuron")
    torch.manual_seed(21)
    c = fn("cpu")
    assert n.device.type == "neuron"
    torch.testing.assert_close(n.detach().cpu(), c.detach(), rtol=1e-5, atol=1e-6)
    # the neuron generator governs it: the CPU generator's seed does not change it, nor is the
    # CPU generator moved
    runs = []
    for cpu_seed in (1, 2):
        torch.neuron.manual_seed(5)
        torch.random.default_generator.manual_seed(cpu_seed)
        cpu_state = torch.random.get_rng_state()
        runs.append(fn("neuron").detach().cpu())
        assert torch.equal(torch.random.get_rng_state(), cpu_state), "the op drew from the CPU generator"
    assert torch.equal(runs[0], runs[1])
    # get_rng_state / set_rng_state replay it, and the generator moves on
    state = torch.neuron.get_rng_state()
    a = fn("neuron").detach().cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(fn("neuron").detach().cpu(), a)
    assert not torch.equal(fn("neuron").detach().cpu(), a)


def test_every_generatorless_random_op_is_covered():
    # A random op without a generator argument that has a CPU kernel would draw from the CPU's
    # default generator when run on device memory. Each one must be known: a neuron kernel that
    # draws from the device's generator (csrc/aten/random_ops.cpp), or shown here to draw nothing.
    from torch._C import _dispatch_has_kernel_for_dispatch_key as has_kernel

    found = set()
    for qualname in torch._C._dispatch_get_all_op_names():
        if not qualname.startswith("aten::") or not has_kernel(qualname, "CPU"):
            continue
        name, _, overload = qualname[len("aten::"):].partition(".")
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        seeded = torch.Tag.nondeterministic_seeded in op.tags
        if seeded and not any(str(a.type) in ("Generator", "Optional[Generator]") for a in op._schema.arguments):
            found.add(qualname)
    known = {"aten::native_dropout", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_fused_sdp_choice"}
    assert found <= known, f"random ops without a generator argument not covered on neuron: {sorted(found - known)}"
    assert "aten::native_dropout" in found  # the enumeration finds what it looks for

    # the two that draw nothing: the CPU flash kernel refuses dropout; the choice is metadata
    q = torch.randn(1, 2, 8, 4, device="neuron")
    with pytest.raises(RuntimeError, match="dropout"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.5)
    state, cpu_state = torch.neuron.get_rng_state(), torch.random.get_rng_state()
    torch._fused_sdp_choice(q, q, q, dropout_p=0.5)
    assert torch.equal(torch.neuron.get_rng_state(), state)
    assert torch.equal(torch.random.get_rng_state(), cpu_state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p,train", [(0.3, True), (0.0, True), (1.0, True), (0.3, None), (0.3, False)])
def test_native_dropout_matches_the_cpu_kernel(p, train, dtype):
    x = torch.randn(7, 33, dtype=dtype)
    torch.manual_seed(8)
    out_c, mask_c = torch.native_dropout(x, p, train)
    torch.manual_seed(8)
    out_n, mask_n = torch.native_dropout(x.to("neuron"), p, train)
    assert out_n.device.type == mask_n.device.type == "neuron"
    assert mask_n.dtype == mask_c.dtype == torch.bool
    assert torch.equal(mask_n.cpu(), mask_c)
    assert torch.equal(out_n.cpu(), out_c)
    if p == 1.0:
        assert not out_n.isnan().any() and not out_n.cpu().any()
    if train is False or p == 0.0:
        assert torch.equal(out_n.cpu(), x) and bool(mask_n.all())
    # an empty input, as the CPU kernel returns it
    e = torch.native_dropout(torch.empty(0, 3, device="neuron", dtype=dtype), p, train)
    assert e[0].shape == e[1].shape == (0, 3) and e[0].device.type == "neuron"


def test_dropout_training_eval_and_backward_use_one_mask():
    drop = torch.nn.Dropout(0.5)
    x_c = torch.randn(64, 32, requires_grad=True)
    x_n = x_c.detach().to("neuron").requires_grad_()
    g = torch.randn(64, 32)
    for train in (True, False):
        drop.train(train)
        torch.manual_seed(13)
        y_c = drop(x_c)
        y_c.backward(g)
        torch.neuron.manual_seed(13)
        torch.random.default_generator.manual_seed(99)  # the CPU's generator plays no part on neuron
        y_n = drop(x_n)
        y_n.backward(g.to("neuron"))
        assert torch.equal(y_n.detach().cpu(), y_c.detach())
        # the gradient flows where the forward kept, scaled as the forward was
        assert torch.equal(x_n.grad.cpu(), x_c.grad)
        assert torch.equal(x_n.grad.cpu() != 0, y_n.detach().cpu() != 0)
        if not train:
            assert torch.equal(y_n.detach().cpu(), x_c.detach())
        x_c.grad = x_n.grad = None


def _generator_ops():
    # name -> fn(device, generator): ops that take a generator argument
    def ones(d, *shape):
        return torch.ones(*shape, device=d)

    return {
        "bernoulli": lambda d, g: torch.bernoulli(ones(d, 300) * 0.3, generator=g),
        "bernoulli.p": lambda d, g: torch.bernoulli(ones(d, 300), 0.3, generator=g),
        "bernoulli_": lambda d, g: ones(d, 300).bernoulli_(0.3, generator=g),
        "normal_": lambda d, g: ones(d, 300).normal_(generator=g),
        "normal.Tensor_Tensor": lambda d, g: torch.normal(ones(d, 300), ones(d, 300), generator=g),
        "uniform_": lambda d, g: ones(d, 300).uniform_(generator=g),
        "exponential_": lambda d, g: ones(d, 300).exponential_(generator=g),
        "geometric_": lambda d, g: ones(d, 300).geometric_(0.3, generator=g),
        "cauchy_": lambda d, g: ones(d, 300).cauchy_(generator=g),
        "log_normal_": lambda d, g: ones(d, 300).log_normal_(generator=g),
        "random_": lambda d, g: ones(d, 300).random_(0, 100, generator=g),
        "rand": lambda d, g: torch.rand(300, device=d, generator=g),
        "randint": lambda d, g: torch.randint(0, 100, (300,), device=d, generator=g),
        "randperm": lambda d, g: torch.randperm(300, device=d, generator=g),
        "multinomial": lambda d, g: torch.multinomial(ones(d, 100), 30, generator=g),
        "poisson": lambda d, g: torch.poisson(ones(d, 300) * 3, generator=g),
        "rrelu_with_noise": lambda d, g: torch.ops.aten.rrelu_with_noise(
            -ones(d, 300), torch.zeros(300, device=d), 0.1, 0.3, True, g
        ),
    }


_GEN_OPS = _generator_ops()


@pytest.mark.parametrize("name", sorted(_GEN_OPS))
def test_generator_argument_on_neuron(name):
    fn = _GEN_OPS[name]
    default_state = torch.neuron.get_rng_state()
    g = torch.Generator(device="neuron").manual_seed(17)
    n = fn("neuron", g)
    assert n.device.type == "neuron"
    # the generator's numbers are the CPU generator's under the same seed
    assert torch.equal(n.cpu(), fn("cpu", torch.Generator().manual_seed(17)))
    g.manual_seed(17)
    assert torch.equal(fn("neuron", g).cpu(), n.cpu())
    assert torch.equal(torch.neuron.get_rng_state(), default_state)  # the default generator untouched
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator but found 'cpu'"):
        fn("neuron", torch.Generator())

"""``nl.device_print``: the prefix and the tensor's values when the instruction runs, in program
order, for every program of a launch; results are the same with and without it. Oracles: numpy's
own printing of the same intermediate values computed on the host."""

import re
import sys

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
import torch_neuronx  # noqa: F401  (the neuron device)
from torch_neuronx._nki import nki_op

F32 = np.float32


def block(prefix, array) -> str:
    """What ``print(prefix, array)`` writes: the oracle of one device_print."""
    return f"{prefix} {array}\n"


@nki.jit
def steps(x, y, debug=True):
    """Prints HBM, SBUF (before and after it is changed in place), PSUM, and the output in HBM."""
    if debug:
        nl.device_print("x in HBM:", x)
    a = nl.load(x)
    b = nl.load(y)
    if debug:
        nl.device_print("a in SBUF:", a)
    nisa.tensor_scalar(dst=a, data=a, op0=nl.multiply, operand0=2.0)
    if debug:
        nl.device_print("a doubled:", a)
        nl.device_print("a[1:3, 2]:", a[1:3, 2])
    p = nl.matmul(a, b, transpose_x=True)
    if debug:
        nl.device_print("a.T @ b in PSUM:", p)
    out = nl.ndarray(p.shape, nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(p))
    if debug:
        nl.device_print("out in HBM:", out)
    return out


def test_prints_each_intermediate_in_program_order(capsys):
    rng = np.random.default_rng(0)
    x = rng.integers(-4, 5, (8, 4)).astype(F32)  # small integers: the matmul is exact in any order
    y = rng.integers(-4, 5, (8, 6)).astype(F32)
    print("before the kernel")
    got = nki.simulate(steps)(x, y)
    print("after the kernel")
    product = (2 * x).T @ y
    want = ("before the kernel\n" + block("x in HBM:", x) + block("a in SBUF:", x) + block("a doubled:", 2 * x)
            + block("a[1:3, 2]:", (2 * x)[1:3, 2:3])  # on-chip views stay 2-D
            + block("a.T @ b in PSUM:", product) + block("out in HBM:", product) + "after the kernel\n")
    assert capsys.readouterr().out == want
    np.testing.assert_array_equal(got, product)
    nki.simulate(steps)(x, y)  # every run prints (the program is cached, the print is an instruction)
    assert capsys.readouterr().out == want[len("before the kernel\n"):-len("after the kernel\n")]


def test_results_are_the_same_with_and_without_prints(capsys):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((128, 96)).astype(F32)
    y = rng.standard_normal((128, 200)).astype(F32)
    quiet = nki.simulate(steps)(x, y, debug=False)
    assert capsys.readouterr().out == ""
    loud = nki.simulate(steps)(x, y, debug=True)
    np.testing.assert_array_equal(loud, quiet)
    np.testing.assert_allclose(loud, (2 * x).T @ y, rtol=1e-4, atol=1e-3)
    assert "a.T @ b in PSUM:" in capsys.readouterr().out


@nki.jit
def exchange(x):
    """Each program prints its half, swaps it with the other program's, and prints what it got."""
    pid = nl.program_id(0)
    h = x.shape[0] // 2
    mine = nl.ndarray((h, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[pid * h:(pid + 1) * h, :])
    nl.device_print("mine:", mine)
    got = nl.ndarray(mine.shape, x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    nl.device_print("received:", got)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=got)
    return out


def by_program(text: str) -> dict:
    """{program label: [its blocks, in order]} from the output of a multi-program launch."""
    blocks = re.split(r"^(?=\[program )", text, flags=re.M)
    out = {}
    for b in filter(None, blocks):
        label, rest = b.split("] ", 1)
        out.setdefault(label + "]", []).append(rest)
    return out


def test_each_program_of_a_launch_prints_labelled_in_its_own_order(capsys):
    x = np.arange(4 * 3, dtype=F32).reshape(4, 3)
    got = nki.simulate(exchange[2])(x)
    np.testing.assert_array_equal(got, np.concatenate([x[2:], x[:2]]))
    progs = by_program(capsys.readouterr().out)
    assert progs == {
        "[program 0 of 2]": [block("mine:", x[:2]), block("received:", x[2:])],
        "[program 1 of 2]": [block("mine:", x[2:]), block("received:", x[:2])],
    }


@nki.jit
def grid_rows(x):
    i, j = nl.program_id(0), nl.program_id(1)
    k = i * nl.num_programs(1) + j
    t = nl.load(x[k:k + 1, :])
    nl.device_print("row:", t)
    out = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_a_two_dimensional_grid_names_each_program_by_its_ids(capsys):
    x = np.arange(4 * 5, dtype=F32).reshape(4, 5)
    nki.simulate(grid_rows[2, 2])(x)
    progs = by_program(capsys.readouterr().out)
    assert progs == {f"[program ({i}, {j}) of (2, 2)]": [block("row:", x[2 * i + j:2 * i + j + 1])]
                     for i in range(2) for j in range(2)}


@nki.jit
def show(x):
    t = nl.load(x)
    nl.device_print("tile:", t)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                                   torch.float8_e5m2, torch.int32, torch.int8, torch.uint8, torch.bool])
def test_neuron_tensors_of_every_dtype_print_their_exact_values(capsys, dtype):
    g = torch.Generator().manual_seed(2)
    if dtype.is_floating_point:
        x = (torch.randn(3, 5, generator=g) * 4).to(dtype)
        want = x.float().numpy()  # bf16 / fp16 / fp8 widen exactly to float32
    elif dtype == torch.bool:
        x = torch.randn(3, 5, generator=g) > 0
        want = x.numpy()
    else:
        x = torch.randint(0 if dtype == torch.uint8 else -100, 100, (3, 5), generator=g).to(dtype)
        want = x.to(torch.int64).numpy()
    got = show(x.to("neuron"))
    assert got.device.type == "neuron"
    assert torch.equal(got.cpu(), x)
    assert capsys.readouterr().out == block("tile:", want)


def test_large_tensors_are_summarized_as_numpy_prints_them(capsys):
    x = np.arange(16 * 80, dtype=F32).reshape(16, 80)  # 1280 elements: past numpy's threshold of 1000
    nki.simulate(show)(x)
    out = capsys.readouterr().out
    assert out == block("tile:", x)
    assert "..." in out and len(out) < 1000
    with np.printoptions(threshold=sys.maxsize):  # numpy's print options apply
        nki.simulate(show)(x)
        out = capsys.readouterr().out
        assert out == block("tile:", x) and "..." not in out


@nki.jit
def _tripled_with_print(x):
    s = nl.multiply(nl.load(x), 3.0)
    nl.device_print("tripled:", s)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, s)
    return out


@nki_op("nki_print_test::triple", mutates_args=())
def _triple(x: torch.Tensor) -> torch.Tensor:
    return _tripled_with_print(x)


def test_prints_from_a_kernel_inside_torch_compile(capsys):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    fn = torch.compile(lambda v: _triple(v + 1.0) - 1.0, backend="neuron")
    got = fn(x.to("neuron"))
    # Compiling traces the kernel on fake tensors (nothing runs, nothing prints); the call prints once.
    assert capsys.readouterr().out == block("tripled:", ((x + 1.0) * 3.0).numpy())
    torch.testing.assert_close(got.cpu(), (x + 1.0) * 3.0 - 1.0)
    fn(x.to("neuron"))
    assert capsys.readouterr().out.count("tripled:") == 1


def test_bad_arguments_are_clear_errors(monkeypatch):
    @nki.jit
    def prefix_not_a_string(x):
        nl.device_print(3, nl.load(x))

    @nki.jit
    def not_a_tensor(x):
        nl.device_print("x:", 1.0)

    x = np.zeros((2, 2), F32)
    with pytest.raises(TypeError, match="print_prefix must be a constant string"):
        nki.simulate(prefix_not_a_string)(x)
    with pytest.raises(TypeError, match="tensor must be a tensor"):
        nki.simulate(not_a_tensor)(x)
    with pytest.raises(RuntimeError, match="only valid inside a kernel"):
        nl.device_print("x:", x)

    class Closed:
        def write(self, s):
            raise ValueError("I/O operation on closed file")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Closed())
    with pytest.raises(RuntimeError, match="device_print could not write its output.*closed file"):
        nki.simulate(show)(x)

"""The programs of one NKI SPMD launch working together (``kernel[2]``, the two cores of a
logical NeuronCore): ``nisa.sendrecv``, ``nisa.core_barrier`` and shared HBM, and
``nisa.nonzero_with_count``; semantics from AWS's NKI ISA reference, checked against numpy."""

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
import torch_neuronx  # noqa: F401  (the neuron device)

F32 = np.float32


def table(rows, cols, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(F32)


@nki.jit
def swap_halves(x):
    """Each program sends its half of x to the other and writes what it receives to its half."""
    pid = nl.program_id(0)
    h = x.shape[0] // 2
    mine = nl.ndarray((h, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[pid * h:(pid + 1) * h, :])
    got = nl.ndarray(mine.shape, x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=got)
    return out


def test_sendrecv_exchanges_tiles_between_the_two_cores():
    x = table(64, 32)
    got = nki.simulate(swap_halves[2])(x)
    np.testing.assert_array_equal(got, np.concatenate([x[32:], x[:32]]))


def test_sendrecv_on_neuron_tensors():
    x = torch.randn(16, 8)
    got = swap_halves[2](x.to("neuron"))
    torch.testing.assert_close(got.cpu(), torch.cat([x[8:], x[:8]]), rtol=0, atol=0)


@nki.jit
def ring_steps(x):
    """Two rounds on one pipe: messages arrive in the order they were sent."""
    pid = nl.program_id(0)
    a = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    b = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x[pid:pid + 1, :])
    r1 = nl.ndarray(a.shape, x.dtype, buffer=nl.sbuf)
    r2 = nl.ndarray(a.shape, x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=a, dst=r1, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=3)
    nisa.tensor_scalar(dst=b, data=a, op0=nl.multiply, operand0=10.0)
    nisa.sendrecv(src=b, dst=r2, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=3)
    out = nl.ndarray((2, 2, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[pid, 0:1, :], src=r1)
    nisa.dma_copy(dst=out[pid, 1:2, :], src=r2)
    return out


def test_sendrecv_rounds_arrive_in_order():
    x = table(2, 4, seed=1)
    got = nki.simulate(ring_steps[2])(x)
    want = np.stack([np.stack([x[1], x[1] * F32(10)]), np.stack([x[0], x[0] * F32(10)])])
    np.testing.assert_array_equal(got, want)


@nki.jit
def barrier_then_read_other_half(x, scratch_in_output):
    """Each core writes its half of a shared HBM tensor; after the barrier each reads the other's."""
    pid = nl.program_id(0)
    h = x.shape[0] // 2
    shared = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm, name="shared")
    t = nl.ndarray((h, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[pid * h:(pid + 1) * h, :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=shared[pid * h:(pid + 1) * h, :], src=t)
    nisa.core_barrier(shared, cores=(0, 1))
    other = 1 - pid
    u = nl.ndarray((h, x.shape[1]), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=shared[other * h:(other + 1) * h, :])
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=u)
    if scratch_in_output:
        return out, shared
    return out


@pytest.mark.parametrize("scratch_in_output", [False, True], ids=["shared-scratch", "shared-output"])
def test_core_barrier_makes_the_other_cores_writes_visible(scratch_in_output):
    x = table(32, 16, seed=2)
    res = nki.simulate(barrier_then_read_other_half[2])(x, scratch_in_output)
    got = res[0] if scratch_in_output else res
    y = x + F32(1)
    np.testing.assert_array_equal(got, np.concatenate([y[16:], y[:16]]))
    if scratch_in_output:
        np.testing.assert_array_equal(res[1], y)


def test_a_program_waiting_for_one_that_never_answers_is_reported():
    @nki.jit
    def k(x):
        pid = nl.program_id(0)
        t = nl.ndarray((1, 4), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:1, :])
        if pid == 0:
            nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)
        return x

    with pytest.raises(RuntimeError, match=r"wait for each other forever:\s+program 0: waits in sendrecv for "
                                           r"program 1 .*\n\s+program 1: has ended"):
        nki.simulate(k[2])(table(2, 4))


def test_ranks_must_be_programs_of_the_launch():
    @nki.jit
    def k(x):
        t = nl.ndarray((1, 4), x.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)
        return x

    with pytest.raises(nki.NkiValidationError, match=r"send_to_rank must be a program of this launch \(0\.\.0\)"):
        nki.simulate(k)(table(2, 4))


def test_sendrecv_operands_must_match():
    @nki.jit
    def k(x):
        pid = nl.program_id(0)
        a = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((2, 4), nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=a, value=0.0)
        nisa.sendrecv(src=a, dst=b, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
        return x

    with pytest.raises(nki.NkiValidationError, match="same dtype"):
        nki.simulate(k[2])(table(2, 4))


# ---- nonzero_with_count ---------------------------------------------------------------------------

@nki.jit
def nonzero(x, index_offset, padding_val):
    s = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=x)
    d = nl.ndarray((x.shape[0], x.shape[1] + 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=d, value=7)
    nisa.nonzero_with_count(dst=d, src=s, index_offset=index_offset, padding_val=padding_val)
    out = nl.ndarray(d.shape, nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=d)
    return out


def nonzero_reference(x, index_offset, padding_val):
    out = np.full((x.shape[0], x.shape[1] + 1), 7, np.int32)
    for p in range(0, x.shape[0], 16):  # the first partition of each GpSimd core
        idx = np.flatnonzero(x[p]) + index_offset
        out[p] = padding_val
        out[p, :len(idx)] = idx
        out[p, -1] = len(idx)
    return out


def test_nonzero_with_count_example_from_the_reference():
    x = np.zeros((1, 8), F32)
    x[0, [1, 2, 5]] = 1
    np.testing.assert_array_equal(nki.simulate(nonzero)(x, 16, -1)[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_nonzero_with_count_reads_one_partition_per_gpsimd_core(dtype):
    rng = np.random.default_rng(3)
    x = (rng.random((64, 40)) < 0.3).astype(dtype) * rng.integers(1, 5, (64, 40)).astype(dtype)
    x[16] = 0  # a partition with no nonzero element
    np.testing.assert_array_equal(nki.simulate(nonzero)(x, 100, -5), nonzero_reference(x, 100, -5))


def test_nonzero_with_count_shapes_are_checked():
    @nki.jit
    def k(x):
        s = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        d = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.nonzero_with_count(dst=d, src=s)
        return x

    with pytest.raises(nki.NkiValidationError, match="one more element per partition"):
        nki.simulate(k)(table(16, 8))


# ---- what AWS's kernel library relies on beside the ISA ----------------------------------------------

def test_range_select_takes_fp32_min_written_as_a_decimal_literal():
    x = table(4, 8, seed=4)

    @nki.jit
    def k(xt):
        t = nl.ndarray(xt.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=xt)
        lo = nl.ndarray((4, 1), nl.float32, buffer=nl.sbuf)
        hi = nl.ndarray((4, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=lo, value=2.0)
        nisa.memset(dst=hi, value=5.0)
        d = nl.ndarray(xt.shape, nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=d, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=lo, bound1=hi,
                          on_false_value=-3.4028235e38)  # the literal AWS's kernels write
        out = nl.ndarray(xt.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    idx = np.arange(8)[None, :]
    want = np.where((idx >= 2) & (idx < 5), x, np.finfo(F32).min)
    np.testing.assert_array_equal(nki.simulate(k)(x), want)


def test_dma_transpose_with_dge_mode_none_is_the_direct_form():
    x = np.random.default_rng(5).standard_normal((16, 24)).astype(np.float16)

    @nki.jit
    def k(xt):
        d = nl.ndarray((24, 16), nl.float16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=xt, dge_mode=nisa.dge_mode.none)
        out = nl.ndarray(d.shape, d.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(x), x.T)


@nki.jit
def scale_rows(x, factor):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf, name=None)  # name=None as AWS's allocators pass it
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_kernel_called_while_tracing_another_is_inlined():
    @nki.jit
    def outer(x):
        return scale_rows(x, 3.0)  # a jit kernel called with the outer kernel's tensors

    x = table(8, 4, seed=6)
    np.testing.assert_array_equal(nki.simulate(outer)(x), x * F32(3))


def test_mx_dtype_names_exist_and_are_refused_when_used():
    assert nl.float4_e2m1fn_x4 and nl.float8_e4m3fn_x4 and nl.float8_e5m2_x4 and nl.float8_e8m0fnu

    @nki.jit
    def k(x):
        nl.ndarray((4, 4), nl.float8_e4m3fn_x4, buffer=nl.sbuf)

    with pytest.raises(NotImplementedError, match="packed MX dtypes"):
        nki.simulate(k)(table(1, 1))


def test_core_barrier_waits_only_for_cores_in_the_launch():
    @nki.jit
    def k(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        nisa.core_barrier(out, cores=(0, 1))  # written for LNC 2, launched alone: nothing to wait for
        return out

    x = table(4, 4, seed=8)
    np.testing.assert_array_equal(nki.simulate(k)(x), x)
    with pytest.raises(nki.NkiValidationError, match="cores are program numbers"):
        @nki.jit
        def bad(x):
            nisa.core_barrier(x, cores=(-1,))

        nki.simulate(bad)(x)


def test_nkiobject_dataclasses_are_built_as_aws_kernels_build_them():
    import dataclasses

    @dataclasses.dataclass
    class Section(nl.NKIObject):
        index = None  # not annotated: not a dataclass field, still a keyword
        offset = None

    @dataclasses.dataclass(frozen=True)
    class Sizes(nl.NKIObject):
        T: int
        H: int
        extra: int  # left out by the caller: None
        tiles: list = dataclasses.field(default_factory=list)
        scale: float = 2.0

        def __post_init__(self):
            object.__setattr__(self, "TH", self.T * self.H)

    class Dims(nl.NKIObject):  # not a dataclass: keyword attributes
        pass

    d = Dims(B=4, H=8, scale=4.0)
    assert (d.B, d.H) == (4, 8)
    s = Section(index=3, offset=5)
    assert (s.index, s.offset) == (3, 5)
    z = Sizes(4, H=8)
    assert (z.T, z.H, z.extra, z.tiles, z.scale, z.TH) == (4, 8, None, [], 2.0, 32)
    assert z == Sizes(4, 8, None)
    with pytest.raises(TypeError, match="multiple values"):
        Sizes(4, T=5)
    with pytest.raises(TypeError, match="positional"):
        Sizes(1, 2, 3, [], 1.0, 7)

    x = table(8, 4, seed=9)

    @nki.jit
    def k(x, sizes):
        return scale_rows(x, float(sizes.scale))

    np.testing.assert_array_equal(nki.simulate(k)(x, z), x * F32(2))
    np.testing.assert_array_equal(nki.simulate(k)(x, d), x * F32(4))


def test_memset_takes_a_whole_float_for_an_integer_tile():
    @nki.jit
    def k(x):
        t = nl.ndarray((4, 4), nl.uint32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)  # as AWS's cross-partition copy writes it
        u = nl.ndarray((4, 4), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=u, value=-3.0)
        o1 = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray(u.shape, u.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=t)
        nisa.dma_copy(dst=o2, src=u)
        return o1, o2

    o1, o2 = nki.simulate(k)(table(1, 1))
    np.testing.assert_array_equal(o1, np.zeros((4, 4), np.uint32))
    np.testing.assert_array_equal(o2, np.full((4, 4), -3, np.int32))

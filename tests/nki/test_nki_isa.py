"""NKI instructions (nki.isa) and convenience operations (nki.language) on the simulator,
each against an independent numpy / torch reference.

Where the simulator's arithmetic is IEEE fp32 with one rounding per step (add, multiply,
max, comparisons, copies, integer ops) the reference does the same steps in float32 and the
results must match bit for bit. Transcendentals and sums are compared to a float64
reference with fp32 tolerances. Semantics follow AWS's NKI specification (NKI 0.2+).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nki
import nki.isa as nisa
import nki.language as nl

F32 = np.float32


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(*shape, seed=0, scale=1.0):
    return (rng(seed).standard_normal(shape) * scale).astype(F32)


# ---- kernel helpers (plain functions are inlined into the kernel that calls them) --------------

def to_hbm(t):
    """A new kernel output holding on-chip tile ``t`` (PSUM goes through SBUF: DMA cannot read PSUM)."""
    if t.buffer == nl.psum:
        s = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=t)
        t = s
    o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o


def run_tiles(body, *inputs):
    """Loads every input into SBUF, calls ``body(*tiles)`` and returns its tile(s) as arrays."""

    def kernel(*args):
        res = body(*[nl.load(a) for a in args])
        return tuple(to_hbm(r) for r in res) if isinstance(res, tuple) else to_hbm(res)

    return nki.simulate(kernel)(*inputs)


def bits(x):
    """Bit patterns of a float tensor/array (NaN payloads, signed zeros count)."""
    if isinstance(x, torch.Tensor):
        return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()])
    return x.view({2: np.int16, 4: np.int32}[x.dtype.itemsize])


# ---- kernel I/O -----------------------------------------------------------------------------

def test_numpy_in_numpy_out_and_torch_in_torch_out():
    a = randn(128, 512)

    def k(x):
        return to_hbm(nl.load(x))

    r = nki.simulate(k)(a)
    assert isinstance(r, np.ndarray) and r.dtype == np.float32
    np.testing.assert_array_equal(r, a)
    rt = nki.simulate(k)(torch.from_numpy(a).to(torch.bfloat16))
    assert isinstance(rt, torch.Tensor) and rt.dtype == torch.bfloat16
    assert torch.equal(rt, torch.from_numpy(a).to(torch.bfloat16))


def test_neuron_device_tensors_run_in_place_and_return_on_device():
    import torch_neuronx  # noqa: F401  (registers the neuron device)

    a, b = torch.from_numpy(randn(64, 32, seed=1)), torch.from_numpy(randn(64, 32, seed=2))

    def k(x, y):
        return to_hbm(nl.add(nl.load(x), nl.load(y)))

    r = nki.simulate(k)(a.to("neuron"), b.to("neuron"))
    assert r.device.type == "neuron"
    assert torch.equal(r.cpu(), a + b)


def test_non_contiguous_torch_input():
    a = torch.from_numpy(randn(32, 64))

    def k(x):
        return to_hbm(nl.load(x))

    assert torch.equal(nki.simulate(k)(a.T), a.T)


def test_kernel_writes_into_its_arguments():
    # A kernel may write its HBM inputs; a non-contiguous numpy argument is written back too.
    base = np.zeros((8, 32), F32)
    view = base[:, ::2]
    src = randn(8, 16, seed=3)

    def k(dst, s):
        nisa.dma_copy(dst=dst, src=s)

    assert nki.simulate(k)(view, src) is None
    np.testing.assert_array_equal(base[:, ::2], src)
    np.testing.assert_array_equal(base[:, 1::2], 0)


def test_tensor_keyword_arguments():
    a, b = randn(8, 16, seed=1), randn(8, 16, seed=2)

    def k(x, y=None, scale=1.0):
        return to_hbm(nl.add(nl.multiply(nl.load(x), scale), nl.load(y)))

    np.testing.assert_array_equal(nki.simulate(k)(a, y=b, scale=3.0), a * F32(3) + b)


def test_uninitialized_memory_sentinels():
    # Fresh on-chip memory reads as NaN (float dtypes) or 4 (integer dtypes), as in AWS's simulator.
    def k(x):
        f = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        i = nl.ndarray((4, 8), nl.int32, buffer=nl.sbuf)
        b = nl.ndarray((4, 8), nl.bfloat16, buffer=nl.psum)
        return to_hbm(f), to_hbm(i), to_hbm(b)

    f, i, b = nki.simulate(k)(torch.zeros(1, 1))
    assert torch.isnan(f).all() and (i == 4).all() and torch.isnan(b.float()).all()


def test_memory_read_before_it_is_wholly_written_still_shows_sentinels():
    # Fresh memory that is wholly written before any read skips the sentinel fill; anything else
    # is filled, also where the arena reuses the bytes of a tile that held data a moment before.
    a = randn(4, 8, seed=5)

    def k(x):
        outs = []
        for step in range(3):
            t = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)  # the same arena bytes each step
            if step == 1:  # half written, then read whole
                nisa.dma_copy(dst=t[:, 0:4], src=x[:, 0:4])
            else:  # written in two halves, then read
                nisa.dma_copy(dst=t[:, 0:4], src=x[:, 0:4])
                nisa.dma_copy(dst=t[:, 4:8], src=x[:, 4:8])
            outs.append(to_hbm(t))
        acc = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)  # accumulate=True adds to the sentinels
        nisa.nc_matmul(dst=acc, stationary=nl.load(x), moving=nl.load(x), accumulate=True)
        outs.append(to_hbm(acc))
        return tuple(outs)

    kernel = nki.jit(k)
    for _ in range(2):  # and again on the cached program
        full, half, again, acc = kernel(a)
        np.testing.assert_array_equal(full, a)
        np.testing.assert_array_equal(again, a)
        np.testing.assert_array_equal(half[:, 0:4], a[:, 0:4])
        assert np.isnan(half[:, 4:8]).all()
        assert np.isnan(acc).all()


def test_a_cached_program_packs_new_operand_data_in_every_run():
    # The host GEMM keeps a program's packed operand tiles between runs for their storage only:
    # another run with other data (at the same places, in the same tile versions) uses that data.
    # Within a run, a stationary tile meets two moving tiles and a moving tile two stationary ones.
    def k(st, mv):
        s0, s1 = nl.load(st[:, 0:64]), nl.load(st[:, 64:128])
        m0, m1 = nl.load(mv[:, 0:512]), nl.load(mv[:, 512:1024])
        outs = []
        for s, m in ((s0, m0), (s0, m1), (s1, m1)):
            acc = nl.ndarray((64, 512), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=acc, stationary=s, moving=m)
            outs.append(to_hbm(acc))
        return tuple(outs)

    kernel = nki.jit(k)
    for seed in (2, 3, 4):
        a, b = randn(128, 128, seed=seed), randn(128, 1024, seed=seed + 10)
        got = kernel(a, b)
        for g, (i, j) in zip(got, ((0, 0), (0, 1), (1, 1))):
            want = a[:, 64 * i:64 * i + 64].astype(np.float64).T @ b[:, 512 * j:512 * j + 512]
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-4)


def test_tuple_outputs():
    a = randn(16, 8)

    def k(x):
        t = nl.load(x)
        return to_hbm(t), to_hbm(nl.multiply(t, 2.0))

    r1, r2 = nki.simulate(k)(a)
    np.testing.assert_array_equal(r1, a)
    np.testing.assert_array_equal(r2, a * F32(2))


# ---- dma_copy ------------------------------------------------------------------------------

def test_dma_copy_hbm_sbuf_hbm_exact():
    a = randn(128, 512)
    a[0, :4] = [np.inf, -np.inf, -0.0, np.float32(1e-45)]  # specials and a subnormal survive

    def k(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o

    np.testing.assert_array_equal(bits(nki.simulate(k)(a)), bits(a))


def test_dma_copy_hbm_to_hbm_with_reshape():
    a = randn(4, 6, 10)

    def k(x):
        o = nl.ndarray((24, 10), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=x.reshape((24, 10)))
        return o

    np.testing.assert_array_equal(nki.simulate(k)(a), a.reshape(24, 10))


def _convert_kernel(dtype):
    def k(x):
        t = nl.ndarray(x.shape, dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)  # fp32 -> dtype by the DMA
        o = nl.ndarray(x.shape, dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o

    return k


def _rounding_inputs():
    """fp32 values that exercise rounding: random magnitudes over the fp32 range, exact ties
    for bf16 (low 16 bits 0x8000) at even and odd mantissas, signed zeros and infinities."""
    r = rng(7)
    x = (r.standard_normal(4096) * 10.0 ** r.integers(-40, 38, 4096)).astype(F32)
    ties = (r.integers(0x3F800000, 0x47000000, 512, dtype=np.int64) & ~0xFFFF) | 0x8000
    x[:512] = ties.astype(np.uint32).view(F32)
    x[512:516] = [0.0, -0.0, np.inf, -np.inf]
    return x.reshape(32, 128)


def test_dma_copy_fp32_to_bf16_rounds_to_nearest_even():
    x = torch.from_numpy(_rounding_inputs())
    got = nki.simulate(_convert_kernel(nl.bfloat16))(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(bits(got), bits(x.to(torch.bfloat16)))


def test_dma_copy_fp32_to_fp16_rounds_to_nearest_even():
    x = _rounding_inputs()
    x[1, :6] = [65504, 65519.99, 65520, 1e-8, 2.0 ** -25, 3 * 2.0 ** -26]  # max, overflow edge, subnormals
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    got = nki.simulate(_convert_kernel(nl.float16))(x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("dtype,top", [(torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)])
def test_dma_copy_fp32_to_fp8_rounds_to_nearest_even(dtype, top):
    # Within the format's range (overflow conventions differ between libraries: see below).
    r = rng(8)
    x = (r.standard_normal(4096) * 2.0 ** r.integers(-22, 9, 4096)).astype(F32)
    x = np.clip(x, -top, top).reshape(32, 128)
    x[0, :4] = [top, -top, 0.0, -0.0]
    xt = torch.from_numpy(x)
    got = nki.simulate(_convert_kernel(dtype))(xt)
    assert got.dtype == dtype
    assert torch.equal(got.view(torch.uint8), xt.to(dtype).view(torch.uint8))


def test_fp8_overflow_follows_the_ocp_encodings():
    # float8_e4m3fn has no infinity: values past the rounding midpoint above 448 become NaN
    # (ml_dtypes' non-saturating conversion, which AWS's simulator uses); float8_e5m2
    # overflows to inf. Exactly 464 is a tie and rounds to the even 448.
    x = torch.tensor([[464.0, 465.0, 1e6, float("inf"), -1e6, 61440.0, 1e6, float("-inf")]])
    e4 = nki.simulate(_convert_kernel(torch.float8_e4m3fn))(x[:, :5]).float()
    assert e4[0, 0] == 448.0 and torch.isnan(e4[0, 1:]).all()
    e5 = nki.simulate(_convert_kernel(torch.float8_e5m2))(x[:, 5:]).float()
    assert e5.tolist() == [[math.inf, math.inf, -math.inf]]


def test_legacy_float8_e4m3_round_trip():
    # Legacy IEEE-style e4m3: the same grid as e4m3fn up to its largest finite value 240;
    # beyond the midpoint to 256 it overflows to inf. torch has no such dtype, so the value
    # goes fp32 -> e4m3 -> fp32 inside the kernel.
    r = rng(9)
    x = np.clip(r.standard_normal((16, 128)) * 2.0 ** r.integers(-12, 8, (16, 128)), -240, 240).astype(F32)
    x[0, :6] = [240.0, 247.9, 248.0, 300.0, -1e9, np.inf]

    def body(t):
        e = nl.ndarray(t.shape, nl.float8_e4m3, buffer=nl.sbuf)
        nisa.tensor_copy(dst=e, src=t)
        back = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=back, src=e)
        return back

    got = run_tiles(body, x)
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()
    want[0, :6] = [240.0, 240.0, np.inf, np.inf, -np.inf, np.inf]
    np.testing.assert_array_equal(got, want)


def test_fp32_to_int32_rounds_half_even_and_saturates():
    x = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3e9, -3e9, np.nan, 2147483520.0, -7.49, 7.51,
                   np.inf, -np.inf, 16777217.0, 0.49999997]], F32)
    want = np.clip(np.rint(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=2**40, neginf=-2**40)),
                   -2**31, 2**31 - 1).astype(np.int32)
    np.testing.assert_array_equal(nki.simulate(_convert_kernel(nl.int32))(x), want)


@pytest.mark.parametrize("dtype,lo,hi", [(nl.int8, -128, 127), (nl.uint8, 0, 255), (nl.int16, -32768, 32767),
                                         (nl.uint16, 0, 65535)])
def test_fp32_to_small_ints_saturate(dtype, lo, hi):
    x = np.array([[-1e5, -129.5, -0.5, 0.5, 127.5, 254.5, 255.5, 1e5]], F32)
    want = np.clip(np.rint(x.astype(np.float64)), lo, hi).astype(np.dtype(dtype))
    np.testing.assert_array_equal(nki.simulate(_convert_kernel(dtype))(x), want)


def test_dma_copy_int32_to_fp32_goes_through_fp32():
    x = np.array([[16777217, -16777219, 2**31 - 1, 7]], np.int32)
    np.testing.assert_array_equal(nki.simulate(_convert_kernel(nl.float32))(x), x.astype(F32))


def test_dma_copy_strided_and_sliced_views():
    a = randn(270, 300)

    def k(x):
        even = nl.ndarray((128, 99), x.dtype, buffer=nl.sbuf)
        odd = nl.ndarray((128, 99), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=even, src=x[10:266:2, 5:300:3])  # every other row, every third column
        nisa.dma_copy(dst=odd, src=x[11:267:2, 5:300:3])
        o = nl.ndarray((128, 198), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o[:, 0::2], src=even)  # interleaved output columns
        nisa.dma_copy(dst=o[:, 1::2], src=odd)
        return o

    got = nki.simulate(k)(a)
    want = np.empty((128, 198), F32)
    want[:, 0::2] = a[10:266:2, 5:300:3]
    want[:, 1::2] = a[11:267:2, 5:300:3]
    np.testing.assert_array_equal(got, want)


def test_dma_copy_sbuf_to_sbuf_with_other_partition_count():
    # DMA matches elements in row-major order; partitions need not line up.
    a = randn(128, 4, seed=5)

    def body(t):
        u = nl.ndarray((64, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=t)
        return u

    np.testing.assert_array_equal(run_tiles(body, a), a.reshape(64, 8))


def test_dma_copy_tiles_with_nl_ds():
    a = randn(96, 256)

    def k(x):
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        for i in range(3):
            for j in range(4):
                t = nl.ndarray((32, 64), x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=x[nl.ds(i * 32, 32), nl.ds(j * 64, 64)])
                # Column blocks land mirrored: block (i, j) -> (i, 3 - j).
                nisa.dma_copy(dst=o[nl.ds(i * 32, 32), nl.ds((3 - j) * 64, 64)], src=t)
        return o

    got = nki.simulate(k)(a)
    want = np.concatenate([a[:, (3 - j) * 64:(4 - j) * 64] for j in range(4)], axis=1)
    np.testing.assert_array_equal(got, want)


# ---- tensor_copy / memset / iota -------------------------------------------------------------

@pytest.mark.parametrize("engine", [nisa.engine.unknown, nisa.engine.vector, nisa.engine.scalar,
                                    nisa.engine.gpsimd])
def test_tensor_copy_same_dtype_is_bit_exact(engine):
    x = np.array([[2**31 - 1, -2**31, 16777217, -16777217, 2**24 + 3, 123456789, 0, -1]], np.int32)

    def k(a):
        t = nl.load(a)
        c = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=c, src=t, engine=engine)
        return to_hbm(c)

    np.testing.assert_array_equal(nki.simulate(k)(x), x)
    # fp32 NaN payloads and signed zeros as well
    f = np.array([[0x7FC00001, 0xFFC12345, 0x80000000, 0x00000001]], np.uint32).view(F32)
    np.testing.assert_array_equal(bits(nki.simulate(k)(f)), bits(f))


def test_tensor_copy_within_one_tile_shifting_up():
    a = randn(8, 16, seed=1)

    def body(t):
        u = nl.copy(t)
        nisa.tensor_copy(dst=u[0:7], src=u[1:8])
        nisa.tensor_copy(dst=u[:, 1:16], src=u[:, 0:15])
        return u

    want = a.copy()
    want[:-1] = want[1:].copy()
    want[:, 1:] = want[:, :-1].copy()
    np.testing.assert_array_equal(run_tiles(body, a), want)


def test_tensor_copy_within_one_tile_shifting_down():
    a = randn(8, 16, seed=1)

    def body(t):
        u = nl.copy(t)
        nisa.tensor_copy(dst=u[1:8], src=u[0:7])
        return u

    want = a.copy()
    want[1:] = a[:-1]
    np.testing.assert_array_equal(run_tiles(body, a), want)


def test_tensor_copy_converts_with_rne():
    x = torch.from_numpy(_rounding_inputs())

    def k(a):
        t = nl.load(a)
        c = nl.ndarray(t.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=c, src=t)
        return to_hbm(c)

    assert torch.equal(bits(nki.simulate(k)(x)), bits(x.to(torch.bfloat16)))


def test_tensor_copy_matches_elements_per_partition_across_ranks():
    a = randn(64, 24)

    def k(x):
        t = nl.load(x)
        c = nl.ndarray((64, 4, 6), t.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=c, src=t)  # same partitions and elements per partition
        return to_hbm(c)

    np.testing.assert_array_equal(nki.simulate(k)(a), a.reshape(64, 4, 6))


@pytest.mark.parametrize("dtype,value,want", [
    (nl.float32, 3.25, np.float32(3.25)),
    (nl.float32, -float("inf"), -np.inf),
    (nl.int32, -7, -7),
    (nl.uint8, 200, 200),
    (nl.bfloat16, 0.1, float(torch.tensor(0.1).to(torch.bfloat16))),
])
def test_memset(dtype, value, want):
    def k(x):
        t = nl.ndarray((128, 40), dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=value)
        return to_hbm(t)

    got = nki.simulate(k)(torch.zeros(1, 1))
    assert (got.float() == torch.tensor(want, dtype=torch.float64).float()).all()


def test_memset_int32_above_2_pow_24_is_exact():
    def k(x):
        t = nl.ndarray((4, 4), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=16777217)
        return to_hbm(t)

    np.testing.assert_array_equal(nki.simulate(k)(np.zeros((1, 1), np.int32)), np.full((4, 4), 16777217))


def _iota_ref(P, pattern, offset, cm):
    steps = [s for s, _ in pattern]
    nums = [n for _, n in pattern]
    idx = np.indices(nums).reshape(len(nums), -1)
    free = offset + (np.array(steps)[:, None] * idx).sum(0)
    return np.arange(P)[:, None] * cm + free[None, :]


@pytest.mark.parametrize("dtype", [nl.int32, nl.float32])
@pytest.mark.parametrize("pattern,offset,cm", [
    ([[1, 64]], 0, 0),
    ([[1, 1]], 0, 2),            # the docs' example: 0, 2, 4, ... down the partitions
    ([[16, 4], [1, 16]], 5, 64),
    ([[-3, 8], [2, 5]], -100, 7),
    ([[1, 2], [4, 2], [2, 2], [1, 2]], 1, -1),
])
def test_iota(dtype, pattern, offset, cm):
    n = math.prod(c for _, c in pattern)

    def k(x):
        t = nl.ndarray((96, n), dtype, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=pattern, offset=offset, channel_multiplier=cm)
        return to_hbm(t)

    got = nki.simulate(k)(np.zeros((1, 1), F32))
    np.testing.assert_array_equal(got, _iota_ref(96, pattern, offset, cm).astype(np.dtype(dtype)))


def test_iota_int32_above_2_pow_24_is_exact():
    def k(x):
        t = nl.ndarray((2, 4), nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=[[1, 4]], offset=16777217, channel_multiplier=1)
        return to_hbm(t)

    got = nki.simulate(k)(np.zeros((1, 1), np.int32))
    np.testing.assert_array_equal(got, 16777217 + np.arange(2)[:, None] + np.arange(4)[None, :])


# ---- nc_matmul / nc_transpose ----------------------------------------------------------------

def _matmul_kernel(accumulate=None):
    def k(st, mv):
        s, m = nl.load(st), nl.load(mv)
        acc = nl.ndarray((st.shape[1], mv.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=m, accumulate=accumulate)
        return to_hbm(acc)

    return k


@pytest.mark.parametrize("K,M,N", [(128, 128, 512), (64, 32, 100), (1, 1, 1), (128, 7, 3), (3, 128, 512)])
def test_nc_matmul_fp32(K, M, N):
    st, mv = randn(K, M, seed=K), randn(K, N, seed=N)
    got = nki.simulate(_matmul_kernel())(st, mv)
    want = st.astype(np.float64).T @ mv.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * math.sqrt(K))


@pytest.mark.parametrize("st_dtype,mv_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float16),
                                               (torch.float8_e5m2, torch.bfloat16)])
def test_nc_matmul_low_precision_operands(st_dtype, mv_dtype):
    # Products of 8/16-bit floats are exact in fp32, so only the fp32 accumulation rounds.
    st = torch.from_numpy(randn(128, 64, seed=1)).to(st_dtype)
    mv = torch.from_numpy(randn(128, 256, seed=2)).to(mv_dtype)
    got = nki.simulate(_matmul_kernel())(st, mv)
    assert got.dtype == torch.float32
    want = st.double().T @ mv.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_nc_matmul_default_accumulate_overwrites_first_then_adds():
    # accumulate=None: the first matmul write to a PSUM element overwrites the (NaN)
    # uninitialized memory, later writes add. The second matmul covers columns 128..383,
    # half of them already written.
    a, b, c = randn(32, 16, seed=1), randn(32, 256, seed=2), randn(32, 256, seed=3)

    def k(st, m1, m2):
        s, x, y = nl.load(st), nl.load(m1), nl.load(m2)
        acc = nl.ndarray((16, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc[:, 0:256], stationary=s, moving=x)
        nisa.nc_matmul(dst=acc[:, 128:384], stationary=s, moving=y)
        return to_hbm(acc)

    kernel = nki.jit(k)
    got = kernel(a, b, c)
    # A second run of the cached program starts from fresh PSUM again (first writes overwrite).
    np.testing.assert_array_equal(kernel(a, b, c), got)
    p1, p2 = a.astype(np.float64).T @ b, a.astype(np.float64).T @ c
    np.testing.assert_allclose(got[:, :128], p1[:, :128], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 128:256], p1[:, 128:] + p2[:, :128], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 256:384], p2[:, 128:], rtol=1e-5, atol=1e-5)
    assert np.isnan(got[:, 384:]).all()


def test_nc_matmul_explicit_accumulate_flags():
    a, b, c = randn(64, 32, seed=4), randn(64, 128, seed=5), randn(64, 128, seed=6)

    def k(st, m1, m2):
        s, x, y = nl.load(st), nl.load(m1), nl.load(m2)
        ovr = nl.ndarray((32, 128), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ovr, stationary=s, moving=x, accumulate=False)
        nisa.nc_matmul(dst=ovr, stationary=s, moving=y, accumulate=False)  # overwrites
        add = nl.ndarray((32, 128), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=add, stationary=s, moving=x, accumulate=False)
        nisa.nc_matmul(dst=add, stationary=s, moving=y, accumulate=True)
        nisa.nc_matmul(dst=add, stationary=s, moving=y)  # None: not the first write -> adds
        return to_hbm(ovr), to_hbm(add)

    ovr, add = nki.simulate(k)(a, b, c)
    p1, p2 = a.astype(np.float64).T @ b, a.astype(np.float64).T @ c
    np.testing.assert_allclose(ovr, p2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(add, p1 + 2 * p2, rtol=1e-5, atol=1e-5)


def test_tiled_matmul_example_from_the_docs():
    # The docs' nki_matmul_tiled_: PSUM accumulation over K tiles, a fresh PSUM tile per
    # output block (whose first write must overwrite again).
    lhsT, rhs = randn(256, 256, seed=9), randn(256, 1024, seed=10)

    def k(lhsT, rhs):
        K, M = lhsT.shape
        _, N = rhs.shape
        TM, TK, TN = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
        result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
        for m in nl.affine_range(M // TM):
            for n in nl.affine_range(N // TN):
                res_psum = nl.ndarray((TM, TN), nl.float32, buffer=nl.psum)
                for kk in nl.affine_range(K // TK):
                    lt = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                    rt = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=lt, src=lhsT[kk * TK:(kk + 1) * TK, m * TM:(m + 1) * TM])
                    nisa.dma_copy(dst=rt, src=rhs[kk * TK:(kk + 1) * TK, n * TN:(n + 1) * TN])
                    nisa.nc_matmul(dst=res_psum, stationary=lt, moving=rt)
                res_sb = nl.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=res_sb, src=res_psum)
                nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=res_sb)
        return result

    got = nki.simulate(k)(lhsT, rhs)
    np.testing.assert_allclose(got, lhsT.astype(np.float64).T @ rhs, rtol=1e-5, atol=2e-4)


def test_nc_matmul_on_views_at_a_partition_offset():
    st, mv = randn(128, 96, seed=2), randn(128, 700, seed=3)

    def body(s, m):
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc[32:64, 0:350], stationary=s[:, 10:42], moving=m[:, ::2])
        return acc

    got = run_tiles(body, st, mv)
    np.testing.assert_allclose(got[32:64, :350], st[:, 10:42].astype(np.float64).T @ mv[:, ::2], rtol=1e-5,
                               atol=1e-4)
    assert np.isnan(got[:32]).all() and np.isnan(got[64:]).all() and np.isnan(got[32:64, 350:]).all()


def test_nc_matmul_bf16_psum_accumulates_through_bf16_on_trn3(monkeypatch):
    # NeuronCore-v4 writes bf16 PSUM: each accumulation upcasts, adds in fp32, rounds back.
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    r = rng(16)
    s = torch.from_numpy(r.integers(-8, 8, (16, 32)).astype(F32)).to(torch.bfloat16)
    m1, m2 = (torch.from_numpy(r.integers(-64, 64, (16, 64)).astype(F32)).to(torch.bfloat16) for _ in range(2))

    def body(st, x, y):
        acc = nl.ndarray((32, 64), nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=st, moving=x)
        nisa.nc_matmul(dst=acc, stationary=st, moving=y)
        return acc

    got = run_tiles(body, s, m1, m2)
    r1, r2 = (s.double().T @ m.double() for m in (m1, m2))  # exact: small integers
    want = (r1.to(torch.bfloat16).double() + r2).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_nc_matmul_transpose_mode_is_bit_exact():
    # is_transpose: stationary = data, moving = identity, a 16-bit result of the data's dtype.
    x = torch.from_numpy(randn(64, 48, seed=4)).to(torch.bfloat16)

    def body(t):
        ident = nl.ndarray((64, 64), nl.bfloat16, buffer=nl.sbuf)
        nisa.affine_select(dst=ident, pattern=[[-1, 64]], channel_multiplier=1,
                           on_true_tile=nl.ones((64, 64), nl.bfloat16), on_false_value=0.0, cmp_op=nl.equal)
        d = nl.ndarray((48, 64), nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(dst=d, stationary=t, moving=ident, is_transpose=True)
        return d

    got = run_tiles(body, x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, x.T)


def test_nc_matmul_multi_dim_free_dims():
    # Stationary/moving free dims are flattened: [K, 4, 8] x [K, 2, 64] -> [32, 128].
    st, mv = randn(16, 4, 8, seed=11), randn(16, 2, 64, seed=12)

    def k(a, b):
        acc = nl.ndarray((32, 2, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=nl.load(a), moving=nl.load(b))
        return to_hbm(acc)

    got = nki.simulate(k)(st, mv)
    want = st.reshape(16, 32).astype(np.float64).T @ mv.reshape(16, 128)
    np.testing.assert_allclose(got.reshape(32, 128), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("P,Fr,engine,dst_buf", [(128, 64, nisa.engine.tensor, nl.psum),
                                                 (96, 128, nisa.engine.unknown, nl.psum),
                                                 (32, 16, nisa.engine.vector, nl.sbuf),
                                                 (20, 32, nisa.engine.vector, nl.psum)])
def test_nc_transpose_is_exact(P, Fr, engine, dst_buf):
    a = randn(P, Fr, seed=P)

    def k(x):
        t = nl.load(x)
        d = nl.ndarray((Fr, P), t.dtype, buffer=dst_buf)
        nisa.nc_transpose(dst=d, data=t, engine=engine)
        return to_hbm(d)

    np.testing.assert_array_equal(nki.simulate(k)(a), a.T)


def test_nc_transpose_bf16_keeps_dtype_and_bits():
    a = torch.from_numpy(randn(64, 48)).to(torch.bfloat16)

    def k(x):
        t = nl.load(x)
        d = nl.ndarray((48, 64), nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=d, data=t)
        return to_hbm(d)

    got = nki.simulate(k)(a)
    assert got.dtype == torch.bfloat16 and torch.equal(got, a.T)


# ---- tensor_tensor ----------------------------------------------------------------------------

_ARITH = {
    "add": (nl.add, np.add), "subtract": (nl.subtract, np.subtract), "multiply": (nl.multiply, np.multiply),
    "divide": (nl.divide, np.divide), "maximum": (nl.maximum, np.maximum), "minimum": (nl.minimum, np.minimum),
    "equal": (nl.equal, np.equal), "not_equal": (nl.not_equal, np.not_equal), "greater": (nl.greater, np.greater),
    "greater_equal": (nl.greater_equal, np.greater_equal), "less": (nl.less, np.less),
    "less_equal": (nl.less_equal, np.less_equal), "logical_and": (nl.logical_and, np.logical_and),
    "logical_or": (nl.logical_or, np.logical_or), "logical_xor": (nl.logical_xor, np.logical_xor),
}


def _tt_inputs():
    # Small integers (as floats) so that comparisons see ties and logical ops see zeros.
    r = rng(12)
    a = r.integers(-3, 4, (128, 256)).astype(F32) + (r.random((128, 256)) < 0.5) * randn(128, 256, seed=1)
    b = r.integers(-3, 4, (128, 256)).astype(F32)
    b[:, :32] = a[:, :32]  # exact ties
    b[b == 0] = 0.5  # keep divide finite
    return a, b


@pytest.mark.parametrize("name", sorted(_ARITH))
def test_tensor_tensor_fp32_ops_are_exact(name):
    op, ref = _ARITH[name]
    a, b = _tt_inputs()

    def body(x, y):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=x, data2=y, op=op)
        return d

    np.testing.assert_array_equal(run_tiles(body, a, b), ref(a, b).astype(F32))


def test_tensor_tensor_power():
    a, b = np.abs(randn(64, 64, seed=2)) + F32(0.1), randn(64, 64, seed=3)

    def body(x, y):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=x, data2=y, op=nl.power)
        return d

    np.testing.assert_allclose(run_tiles(body, a, b), np.power(a.astype(np.float64), b), rtol=2e-6)


def test_tensor_tensor_rounds_result_to_dst_dtype_and_comparisons_to_uint8():
    a, b = _tt_inputs()

    def body(x, y):
        s = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=x, data2=y, op=nl.add)
        c = nl.ndarray(x.shape, nl.uint8, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=c, data1=x, data2=y, op=nl.greater_equal)
        return s, c

    s, c = run_tiles(body, torch.from_numpy(a), torch.from_numpy(b))
    assert torch.equal(bits(s), bits(torch.from_numpy(a + b).to(torch.bfloat16)))
    assert torch.equal(c, torch.from_numpy((a >= b).astype(np.uint8)))


def test_tensor_tensor_across_partition_ranges():
    a = randn(128, 64, seed=1)

    def body(t):
        u = nl.zeros((128, 64), nl.float32)
        nisa.tensor_tensor(dst=u[32:64], data1=t[0:32], data2=t[64:96], op=nl.add)
        return u

    got = run_tiles(body, a)
    np.testing.assert_array_equal(got[32:64], a[0:32] + a[64:96])
    np.testing.assert_array_equal(np.delete(got, np.s_[32:64], axis=0), 0)


def test_tensor_tensor_psum_operand_and_psum_destination():
    a, b = randn(32, 64, seed=4), randn(32, 64, seed=5)

    def body(x, y):
        p = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=x)
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
        nisa.tensor_tensor(dst=d, data1=p, data2=y, op=nl.subtract)
        return d

    np.testing.assert_array_equal(run_tiles(body, a, b), a - b)


_BITWISE = {"bitwise_and": (nl.bitwise_and, np.bitwise_and), "bitwise_or": (nl.bitwise_or, np.bitwise_or),
            "bitwise_xor": (nl.bitwise_xor, np.bitwise_xor)}


@pytest.mark.parametrize("name", sorted(_BITWISE))
def test_tensor_tensor_bitwise_int32(name):
    op, ref = _BITWISE[name]
    r = rng(13)
    a = r.integers(-2**20, 2**20, (64, 128), dtype=np.int32)
    b = r.integers(-2**20, 2**20, (64, 128), dtype=np.int32)

    def body(x, y):
        d = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=x, data2=y, op=op)
        return d

    np.testing.assert_array_equal(run_tiles(body, a, b), ref(a, b))


def test_tensor_tensor_shifts_int32():
    r = rng(14)
    a = r.integers(0, 2**16, (16, 64), dtype=np.int32)
    s = r.integers(0, 8, (16, 64), dtype=np.int32)

    def body(x, y):
        left = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=left, data1=x, data2=y, op=nl.left_shift)
        right = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=right, data1=x, data2=y, op=nl.right_shift)
        return left, right

    left, right = run_tiles(body, a, s)
    np.testing.assert_array_equal(left, a << s)
    np.testing.assert_array_equal(right, a >> s)


def test_tensor_tensor_bitwise_int32_full_range():
    a = np.array([[16777217, 2**31 - 1, -2**31 + 5, 123456789]], np.int32)
    b = np.array([[1, 3, 1, 0x0F0F0F0F]], np.int32)

    def body(x, y):
        d = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=x, data2=y, op=nl.bitwise_xor)
        return d

    np.testing.assert_array_equal(run_tiles(body, a, b), a ^ b)


def test_tensor_tensor_int32_add_is_exact():
    a = np.array([[16777217, 2**30 + 1, -2**31 + 3, 100]], np.int32)
    b = np.array([[1, 2, -1, 7]], np.int32)

    def body(x, y):
        d = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=x, data2=y, op=nl.add)
        return d

    np.testing.assert_array_equal(run_tiles(body, a, b), a + b)


def test_tensor_scalar_left_shift_wraps_into_the_sign_bit():
    a = np.array([[-1, -5, 2**30, 3]], np.int32)

    def body(x):
        d = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=x, op0=nl.left_shift, operand0=1)
        return d

    np.testing.assert_array_equal(run_tiles(body, a), a << 1)


# ---- tensor_scalar / scalar_tensor_tensor -------------------------------------------------------

def test_tensor_scalar_immediates_two_ops():
    a = randn(128, 300)

    def body(x):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=x, op0=nl.multiply, operand0=2.5, op1=nl.add, operand1=-1.25)
        return d

    np.testing.assert_array_equal(run_tiles(body, a), a * F32(2.5) + F32(-1.25))


def test_tensor_scalar_column_operands_and_reverse():
    a, c0, c1 = randn(100, 64, seed=1), randn(100, 1, seed=2), randn(100, 1, seed=3)

    def body(x, col0, col1):
        d1 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d1, data=x, op0=nl.subtract, operand0=col0)
        d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)  # col0 - x, then col1 - that
        nisa.tensor_scalar(dst=d2, data=x, op0=nl.subtract, operand0=col0, reverse0=True,
                           op1=nl.subtract, operand1=col1, reverse1=True)
        d3 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)  # (x max col0) * 3
        nisa.tensor_scalar(dst=d3, data=x, op0=nl.maximum, operand0=col0, op1=nl.multiply, operand1=3.0)
        return d1, d2, d3

    d1, d2, d3 = run_tiles(body, a, c0, c1)
    np.testing.assert_array_equal(d1, a - c0)
    np.testing.assert_array_equal(d2, c1 - (c0 - a))
    np.testing.assert_array_equal(d3, np.maximum(a, c0) * F32(3))


@pytest.mark.parametrize("op,ref", [(nl.abs, np.abs), (nl.reciprocal, lambda x: F32(1) / x),
                                    (nl.square, np.square), (nl.relu, lambda x: np.maximum(x, F32(0)))])
def test_tensor_scalar_unary_op0(op, ref):
    a = randn(64, 80, seed=5)

    def body(x):
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=x, op0=op, operand0=None, op1=nl.add, operand1=1.0)
        return d

    np.testing.assert_array_equal(run_tiles(body, a), ref(a) + F32(1))


def test_tensor_scalar_bitwise_on_int32_and_comparison_to_int():
    a = rng(15).integers(-1000, 1000, (32, 64), dtype=np.int32)

    def body(x):
        d = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=x, op0=nl.bitwise_and, operand0=0xFF, op1=nl.right_shift, operand1=2)
        c = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=c, data=x, op0=nl.less, operand0=10.0)
        return d, c

    d, c = run_tiles(body, a)
    np.testing.assert_array_equal(d, (a & 0xFF) >> 2)
    np.testing.assert_array_equal(c, (a < 10).astype(np.int32))


def test_scalar_tensor_tensor():
    a, col, b = randn(64, 96, seed=1), randn(64, 1, seed=2), randn(64, 96, seed=3)

    def body(x, c, y):
        d1 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)  # (x * c) + y
        nisa.scalar_tensor_tensor(dst=d1, data=x, op0=nl.multiply, operand0=c, op1=nl.add, operand1=y)
        d2 = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)  # y - (0.5 - x)
        nisa.scalar_tensor_tensor(dst=d2, data=x, op0=nl.subtract, operand0=0.5, op1=nl.subtract, operand1=y,
                                  reverse0=True, reverse1=True)
        return d1, d2

    d1, d2 = run_tiles(body, a, col, b)
    np.testing.assert_array_equal(d1, a * col + b)
    np.testing.assert_array_equal(d2, b - (F32(0.5) - a))


# ---- activation --------------------------------------------------------------------------------

def _gelu_dx(x):
    return 0.5 * (1 + torch.special.erf(x / math.sqrt(2))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _silu_dx(x):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


_ACT = {  # name: (op, float64 reference, input domain)
    "copy": (nl.copy, lambda x: x, "any"),
    "exp": (nl.exp, torch.exp, "any"),
    "log": (nl.log, torch.log, "pos"),
    "tanh": (nl.tanh, torch.tanh, "any"),
    "sigmoid": (nl.sigmoid, torch.sigmoid, "any"),
    "relu": (nl.relu, torch.relu, "any"),
    "gelu": (nl.gelu, F.gelu, "any"),
    "gelu_apprx_tanh": (nl.gelu_apprx_tanh, lambda x: F.gelu(x, approximate="tanh"), "any"),
    "gelu_apprx_sigmoid": (nl.gelu_apprx_sigmoid, lambda x: x * torch.sigmoid(1.702 * x), "any"),
    "gelu_dx": (nl.gelu_dx, _gelu_dx, "any"),
    "silu": (nl.silu, F.silu, "any"),
    "silu_dx": (nl.silu_dx, _silu_dx, "any"),
    "sqrt": (nl.sqrt, torch.sqrt, "pos"),
    "rsqrt": (nl.rsqrt, torch.rsqrt, "pos"),
    "reciprocal": (nl.reciprocal, torch.reciprocal, "pos"),
    "square": (nl.square, torch.square, "any"),
    "abs": (nl.abs, torch.abs, "any"),
    "sign": (nl.sign, torch.sign, "any"),
    "sin": (nl.sin, torch.sin, "pi"),
    "cos": (nl.cos, torch.cos, "pi"),
    "arctan": (nl.arctan, torch.arctan, "any"),
    "softplus": (nl.softplus, F.softplus, "any"),
    "mish": (nl.mish, F.mish, "any"),
    "erf": (nl.erf, torch.special.erf, "any"),
    "erf_dx": (nl.erf_dx, lambda x: 2 / math.sqrt(math.pi) * torch.exp(-x * x), "any"),
    "negative": (nl.negative, torch.neg, "any"),
}


def _act_input(domain, shape=(128, 200), seed=0):
    r = rng(seed)
    if domain == "pos":
        return (r.random(shape) * 20 + 1e-3).astype(F32)
    if domain == "pi":
        return (r.uniform(-math.pi, math.pi, shape)).astype(F32)
    x = (r.standard_normal(shape) * 3).astype(F32)
    x[0, :3] = [0.0, -0.0, 1e-7]
    return x


@pytest.mark.parametrize("name", sorted(_ACT))
def test_activation_functions(name):
    op, ref, domain = _ACT[name]
    x = _act_input(domain)

    def body(t):
        d = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d, op=op, data=t)
        return d

    want = ref(torch.from_numpy(x).double()).numpy()
    np.testing.assert_allclose(run_tiles(body, x), want, rtol=1e-5, atol=1e-6)


def test_activation_scale_and_bias():
    x, sc, bi = randn(128, 64, seed=1), randn(128, 1, seed=2), randn(128, 1, seed=3)

    def body(t, s, b):
        d1 = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d1, op=nl.tanh, data=t, scale=0.5, bias=b)
        d2 = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d2, op=nl.exp, data=t, scale=s)
        d3 = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d3, op=nl.copy, data=t, scale=s, bias=b)
        return d1, d2, d3

    d1, d2, d3 = run_tiles(body, x, sc, bi)
    x64, s64, b64 = (v.astype(np.float64) for v in (x, sc, bi))
    np.testing.assert_allclose(d1, np.tanh(x64 * 0.5 + b64), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d2, np.exp(x64 * s64), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(d3, x * sc + bi)  # one fp32 multiply, one fp32 add


def test_activation_bf16_input_fp32_output():
    x = torch.from_numpy(randn(64, 64)).to(torch.bfloat16)

    def body(t):
        d = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d, op=nl.exp, data=t)
        return d

    torch.testing.assert_close(run_tiles(body, x), torch.exp(x.double()).float(), rtol=1e-6, atol=1e-6)


def test_activation_reduce_commands():
    # reset_reduce: registers = sum of this output; reduce: add to them; idle: leave them.
    x, y = randn(128, 100, seed=1), randn(128, 100, seed=2)

    def body(a, b):
        ea = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        s1 = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=ea, op=nl.exp, data=a, reduce_op=nl.add, reduce_res=s1,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        eb = nl.ndarray(b.shape, nl.float32, buffer=nl.sbuf)
        s2 = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=eb, op=nl.square, data=b, reduce_op=nl.add, reduce_res=s2,
                        reduce_cmd=nisa.reduce_cmd.reduce)
        tb = nl.ndarray(b.shape, nl.float32, buffer=nl.sbuf)
        s3 = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=tb, op=nl.tanh, data=b, reduce_res=s3, reduce_cmd=nisa.reduce_cmd.idle)
        return ea, s1, s2, s3

    ea, s1, s2, s3 = run_tiles(body, x, y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_allclose(ea, np.exp(x64), rtol=1e-6)
    e1 = np.exp(x64).sum(1, keepdims=True)
    e2 = e1 + (y64 ** 2).sum(1, keepdims=True)
    np.testing.assert_allclose(s1, e1, rtol=1e-5)
    np.testing.assert_allclose(s2, e2, rtol=1e-5)
    np.testing.assert_array_equal(s3, s2)


def test_activation_reduce():
    x, bias = randn(64, 256, seed=4), randn(64, 1, seed=5)

    def body(a, b):
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((64, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=d, op=nl.silu, data=a, reduce_op=nl.add, reduce_res=s, bias=b, scale=2.0)
        return d, s

    d, s = run_tiles(body, x, bias)
    want = F.silu(torch.from_numpy(x).double() * 2 + torch.from_numpy(bias).double()).numpy()
    np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, want.sum(1, keepdims=True), rtol=1e-5, atol=1e-4)


# ---- reductions, scans ---------------------------------------------------------------------------

@pytest.mark.parametrize("op,ref,exact", [(nl.add, np.sum, False), (nl.maximum, np.max, True),
                                          (nl.max, np.max, True), (nl.minimum, np.min, True),
                                          (nl.multiply, np.prod, False)])
@pytest.mark.parametrize("negate", [False, True])
def test_tensor_reduce_last_axis(op, ref, exact, negate):
    x = randn(128, 96, seed=3)
    if op is nl.multiply:
        x = (1 + x / 20).astype(F32)

    def body(t):
        d = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=d, op=op, data=t, axis=1, negate=negate)
        return d

    want = ref(x.astype(np.float64), axis=1, keepdims=True) * (-1 if negate else 1)
    got = run_tiles(body, x)
    if exact:
        np.testing.assert_array_equal(got, want.astype(F32))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_tensor_reduce_trailing_axes_of_3d():
    x = randn(64, 6, 40, seed=4)

    def body(t):
        inner = nl.ndarray((64, 6), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=inner, op=nl.maximum, data=t, axis=2)
        both = nl.ndarray((64, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=both, op=nl.add, data=t, axis=(1, 2))
        neg_axis = nl.ndarray((64, 6, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_axis, op=nl.minimum, data=t, axis=-1, keepdims=True)
        return inner, both, neg_axis

    inner, both, neg_axis = run_tiles(body, x)
    np.testing.assert_array_equal(inner, x.max(2))
    np.testing.assert_allclose(both, x.astype(np.float64).sum((1, 2))[:, None], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(neg_axis, x.min(2, keepdims=True))


def test_tensor_reduce_bitwise_or_int32():
    x = rng(5).integers(0, 2**20, (32, 24), dtype=np.int32)

    def body(t):
        d = nl.ndarray((32, 1), nl.int32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=d, op=nl.bitwise_or, data=t, axis=1)
        return d

    np.testing.assert_array_equal(run_tiles(body, x), np.bitwise_or.reduce(x, axis=1, keepdims=True))


def test_tensor_tensor_scan_cumsum_and_decay():
    # cumsum idiom: r[i] = 1 * r[i-1] + x[i]; decay: r[i] = a[i] * r[i-1] + x[i] from a (P, 1) start.
    x = rng(6).integers(-50, 50, (128, 300)).astype(F32)
    a = (rng(7).random((128, 300)) * 0.5 + 0.5).astype(F32)
    init = randn(128, 1, seed=8)

    def body(xt, at, it):
        ones = nl.ones(xt.shape, nl.float32)
        cs = nl.ndarray(xt.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=cs, data0=ones, data1=xt, initial=0.0, op0=nl.multiply, op1=nl.add)
        dec = nl.ndarray(xt.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=dec, data0=at, data1=xt, initial=it, op0=nl.multiply, op1=nl.add)
        return cs, dec

    cs, dec = run_tiles(body, x, a, init)
    np.testing.assert_array_equal(cs, np.cumsum(x, axis=1))  # integers: exact in fp32
    want = np.empty_like(x)
    r = init[:, 0].copy()
    for i in range(x.shape[1]):  # the same fp32 steps, in order
        r = a[:, i] * r + x[:, i]
        want[:, i] = r
    np.testing.assert_array_equal(dec, want)


def test_tensor_tensor_scan_reverse_flags():
    # reverse0: op0(r[i-1], data0[i]); reverse1: op1(data1[i], t). Here r[i] = x[i] - (r[i-1] - d[i]).
    x = rng(9).integers(-20, 20, (16, 50)).astype(F32)
    d = rng(10).integers(-20, 20, (16, 50)).astype(F32)

    def body(xt, dt):
        r = nl.ndarray(xt.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=r, data0=dt, data1=xt, initial=1.0, op0=nl.subtract, op1=nl.subtract,
                                reverse0=True, reverse1=True)
        return r

    want = np.empty_like(x)
    prev = np.ones(16, F32)
    for i in range(50):
        prev = x[:, i] - (prev - d[:, i])
        want[:, i] = prev
    np.testing.assert_array_equal(run_tiles(body, x, d), want)


def test_tensor_partition_reduce():
    x = randn(96, 40, seed=9)

    def body(t):
        outs = []
        for op in (nl.add, nl.maximum, nl.average):
            d = nl.ndarray((1, 40), nl.float32, buffer=nl.sbuf)
            nisa.tensor_partition_reduce(dst=d, op=op, data=t)
            outs.append(d)
        return tuple(outs)

    s, m, avg = run_tiles(body, x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(s, x64.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m, x.max(0, keepdims=True))
    np.testing.assert_allclose(avg, x64.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)


# ---- selection, statistics, top-8 ----------------------------------------------------------------

def test_affine_select_causal_mask():
    # Keep x[p, j] where p - j >= 0 (lower triangle), else the fp32 minimum.
    x = randn(128, 128, seed=10)
    fmin = float(np.finfo(F32).min)

    def body(t):
        d = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=d, pattern=[[-1, 128]], channel_multiplier=1, on_true_tile=t, on_false_value=fmin,
                           cmp_op=nl.greater_equal)
        return d

    np.testing.assert_array_equal(run_tiles(body, x), np.where(np.tri(128, dtype=bool), x, F32(fmin)))


def test_affine_select_offset_and_equal():
    # Keep the diagonal shifted right by 3: value = p*1 - j + 3 == 0.
    x = randn(64, 80, seed=11)

    def body(t):
        d = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=d, pattern=[[-1, 80]], channel_multiplier=1, on_true_tile=t, on_false_value=0.0,
                           cmp_op=nl.equal, offset=3)
        return d

    np.testing.assert_array_equal(run_tiles(body, x), np.where(np.eye(64, 80, k=3, dtype=bool), x, F32(0)))


def test_select_scalar_and_column_on_false():
    x, p, col = randn(64, 50, seed=1), (rng(2).random((64, 50)) < 0.5).astype(F32), randn(64, 1, seed=3)

    def body(xt, pt, ct):
        d1 = nl.ndarray(xt.shape, nl.float32, buffer=nl.sbuf)
        nisa.select(dst=d1, predicate=pt, on_true=xt, on_false=-5.0)
        d2 = nl.ndarray(xt.shape, nl.float32, buffer=nl.sbuf)
        nisa.select(dst=d2, predicate=pt, on_true=xt, on_false=ct)
        return d1, d2

    d1, d2 = run_tiles(body, x, p, col)
    np.testing.assert_array_equal(d1, np.where(p != 0, x, F32(-5)))
    np.testing.assert_array_equal(d2, np.where(p != 0, x, col))


@pytest.mark.parametrize("F_", [512, 301])
def test_bn_stats_and_bn_aggr(F_):
    x = randn(128, F_, seed=F_, scale=3.0) + F32(1.5)

    def body(t):
        st = nl.ndarray((128, 6), nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=st, data=t)
        ag = nl.ndarray((128, 2), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=ag, data=st)
        return st, ag

    st, ag = run_tiles(body, x)
    x64 = x.astype(np.float64)
    ev, od = x64[:, 0::2], x64[:, 1::2]
    want = np.stack([np.full(128, ev.shape[1]), ev.mean(1), ev.var(1) * ev.shape[1],
                     np.full(128, od.shape[1]), od.mean(1), od.var(1) * od.shape[1]], 1)
    np.testing.assert_allclose(st, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ag[:, 0], x64.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ag[:, 1], x64.var(1), rtol=1e-5)


def test_bn_aggr_over_several_bn_stats():
    x = randn(64, 1536, seed=12) * F32(2) - F32(0.5)

    def body(t):
        stats = nl.ndarray((64, 18), nl.float32, buffer=nl.sbuf)
        for i in range(3):
            nisa.bn_stats(dst=stats[:, i * 6:(i + 1) * 6], data=t[:, i * 512:(i + 1) * 512])
        ag = nl.ndarray((64, 2), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=ag, data=stats)
        return ag

    ag = run_tiles(body, x)
    np.testing.assert_allclose(ag[:, 0], x.astype(np.float64).mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ag[:, 1], x.astype(np.float64).var(1), rtol=1e-5)


def test_max8_and_nc_find_index8():
    r = rng(13)
    x = r.integers(0, 40, (64, 100)).astype(F32)  # many duplicates
    x[0, 50:] = 99.0  # the 8 largest of row 0 are all equal

    def body(t):
        m = nl.ndarray((64, 8), nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=m, src=t)
        idx = nl.ndarray((64, 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=t, vals=m)
        return m, idx

    m, idx = run_tiles(body, x)
    want_m = -np.sort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(m, want_m)
    want_idx = np.empty((64, 8), np.uint32)
    for p in range(64):  # duplicates of a value map to its successive occurrences
        seen = {}
        for j, v in enumerate(want_m[p]):
            occ = np.flatnonzero(x[p] == v)
            want_idx[p, j] = occ[seen.get(v, 0)]
            seen[v] = seen.get(v, 0) + 1
    np.testing.assert_array_equal(idx, want_idx)


def test_nc_find_index8_absent_value_is_all_ones():
    x = np.arange(32, dtype=F32).reshape(2, 16)
    vals = np.array([[3, 100, 15, -1, 0, 7, 7, 2], [16, 31, 50, 16, 17, 1, 0, 20]], F32)

    def body(t, v):
        i32 = nl.ndarray((2, 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=i32, data=t, vals=v)
        i16 = nl.ndarray((2, 8), nl.uint16, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=i16, data=t, vals=v)
        return i32, i16

    i32, i16 = run_tiles(body, x, vals)
    want = [[3, None, 15, None, 0, 7, None, 2], [0, 15, None, None, 1, None, None, 4]]
    for p in range(2):
        for j in range(8):
            w = want[p][j]
            assert i32[p, j] == (0xFFFFFFFF if w is None else w), (p, j)
            assert i16[p, j] == (0xFFFF if w is None else w), (p, j)


def test_reciprocal_is_correctly_rounded():
    x = randn(128, 128, seed=14)

    def body(t):
        d = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=d, data=t)
        return d

    np.testing.assert_array_equal(run_tiles(body, x), F32(1) / x)


# ---- nl.* convenience operations -----------------------------------------------------------------

def test_nl_load_store_copy():
    a = randn(128, 64)
    v = torch.from_numpy(randn(100)).to(torch.bfloat16)

    def k(x, vec):
        t = nl.load(x)
        c = nl.copy(t, dtype=nl.bfloat16)
        o = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(o, value=c)
        row = nl.load(vec)  # a 1-D HBM tensor loads as one partition
        o2 = nl.ndarray((1, 100), vec.dtype, buffer=nl.shared_hbm)
        nl.store(o2, value=row)
        return o, o2

    o, o2 = nki.simulate(k)(torch.from_numpy(a), v)
    assert torch.equal(o, torch.from_numpy(a).to(torch.bfloat16))
    assert torch.equal(o2, v[None])


def test_nl_binary_with_scalars_and_columns():
    a, b, col = randn(64, 32, seed=1), randn(64, 32, seed=2), randn(64, 1, seed=3)

    def body(x, y, c):
        return (nl.add(x, y), nl.subtract(2.0, x), nl.multiply(x, c), nl.subtract(c, x), nl.maximum(x, 0.0),
                nl.greater(x, c))

    r = run_tiles(body, a, b, col)
    np.testing.assert_array_equal(r[0], a + b)
    np.testing.assert_array_equal(r[1], F32(2) - a)
    np.testing.assert_array_equal(r[2], a * col)
    np.testing.assert_array_equal(r[3], col - a)
    np.testing.assert_array_equal(r[4], np.maximum(a, F32(0)))
    np.testing.assert_array_equal(r[5], (a > col).astype(F32))


def test_nl_binary_bf16_result_from_torch():
    a, b = torch.from_numpy(randn(32, 16, seed=1)), torch.from_numpy(randn(32, 16, seed=2))
    r = run_tiles(lambda x, y: nl.multiply(x, y, dtype=nl.bfloat16), a, b)
    assert r.dtype == torch.bfloat16 and torch.equal(bits(r), bits((a * b).to(torch.bfloat16)))


def test_nl_column_of_other_dtype_is_converted():
    a = randn(16, 8)
    col = torch.arange(16, dtype=torch.int32).reshape(16, 1)
    r = run_tiles(lambda x, c: nl.add(x, c), torch.from_numpy(a), col)
    assert torch.equal(r, torch.from_numpy(a) + col.float())


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sqrt", "sigmoid", "abs", "negative", "square"])
def test_nl_unary(name):
    op, ref, _ = _ACT[name]
    x = _act_input("pos" if name in ("log", "sqrt") else "any", (64, 48), seed=3)
    want = ref(torch.from_numpy(x).double()).numpy()
    np.testing.assert_allclose(run_tiles(op, x), want, rtol=1e-5, atol=1e-6)


def test_nl_reductions():
    x = randn(64, 5, 30, seed=4)
    xp = (1 + randn(64, 30, seed=5) / 20).astype(F32)

    def body(t, tp):
        return (nl.sum(t, axis=2), nl.max(t, axis=(1, 2)), nl.min(t, axis=-1), nl.mean(t, axis=(1, 2)),
                nl.prod(tp, axis=1), nl.var(tp, axis=1), nl.sum(t, axis=2, keepdims=True))

    s, mx, mn, mean, prod, var, skd = run_tiles(body, x, xp)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(s, x64.sum(2), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx, x.max((1, 2))[:, None])
    np.testing.assert_array_equal(mn, x.min(2))
    np.testing.assert_allclose(mean, x64.mean((1, 2))[:, None], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(prod, xp.astype(np.float64).prod(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(var, xp.astype(np.float64).var(1, keepdims=True), rtol=1e-4, atol=1e-8)
    assert skd.shape == (64, 5, 1)
    np.testing.assert_allclose(skd, x64.sum(2, keepdims=True), rtol=1e-5, atol=1e-5)


def test_nl_var_over_trailing_axes_of_3d():
    x = randn(32, 6, 20, seed=13, scale=2.0) + F32(3)

    def body(t):
        return nl.var(t, axis=2), nl.var(t, axis=(1, 2))

    v2, v12 = run_tiles(body, x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(v2, x64.var(2, keepdims=True), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(v12, x64.var((1, 2), keepdims=True), rtol=1e-4, atol=1e-7)


def test_nl_softmax():
    x = randn(128, 333, seed=6, scale=4.0)
    got = run_tiles(nl.softmax, x)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("axis", [-1, (1, 2)])
def test_nl_softmax_3d(axis):
    x = randn(32, 5, 40, seed=7, scale=3.0)
    got = run_tiles(lambda t: nl.softmax(t, axis=axis), x)
    ax = (2,) if axis == -1 else axis
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(ax, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(ax, keepdims=True), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("w_rows", [64, 1])
def test_nl_rms_norm(w_rows):
    x, w = randn(64, 256, seed=7), randn(w_rows, 256, seed=8)
    got = run_tiles(lambda a, b: nl.rms_norm(a, b, axis=1, n=256, epsilon=1e-5), x, w)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nl_rms_norm_over_the_last_axis_of_3d():
    x, w = randn(16, 4, 32, seed=9), randn(16, 4, 32, seed=10)
    got = run_tiles(lambda a, b: nl.rms_norm(a, b, axis=2, n=32), x, w)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(2, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nl_matmul_both_layouts():
    xT, x, y = randn(128, 64, seed=9), randn(96, 128, seed=10), randn(128, 300, seed=11)

    def body(at, a, b):
        return nl.matmul(at, b, transpose_x=True), nl.matmul(a, b, transpose_x=False)

    r1, r2 = run_tiles(body, xT, x, y)
    np.testing.assert_allclose(r1, xT.astype(np.float64).T @ y, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(r2, x.astype(np.float64) @ y, rtol=1e-5, atol=1e-4)


def test_nl_transpose_result_is_in_psum():
    x = randn(64, 128, seed=12)
    seen = []

    def body(t):
        r = nl.transpose(t)
        seen.append((r.buffer, r.shape))
        return r

    np.testing.assert_array_equal(run_tiles(body, x), x.T)
    assert seen == [(nl.psum, (128, 64))]


@pytest.mark.parametrize("make,dtype,want", [(lambda s, d: nl.zeros(s, d), nl.float32, 0.0),
                                             (lambda s, d: nl.ones(s, d), nl.int32, 1),
                                             (lambda s, d: nl.full(s, 2.5, d), nl.bfloat16, 2.5),
                                             (lambda s, d: nl.full(s, -3, d), nl.int16, -3)])
def test_nl_zeros_ones_full(make, dtype, want):
    def k(x):
        return to_hbm(make((128, 70), dtype))

    got = nki.simulate(k)(torch.zeros(1))
    assert got.shape == (128, 70) and (got.double() == want).all()


def test_nl_broadcast_to_free_and_partition_dims():
    col, row, one = randn(128, 1, seed=1), randn(1, 700, seed=2), randn(1, 1, seed=3)

    def body(c, r, o):
        return nl.broadcast_to(c, (128, 40)), nl.broadcast_to(r, (100, 700)), nl.broadcast_to(o, (32, 8))

    bc, br, bo = run_tiles(body, col, row, one)
    np.testing.assert_array_equal(bc, np.broadcast_to(col, (128, 40)))
    np.testing.assert_array_equal(br, np.broadcast_to(row, (100, 700)))
    np.testing.assert_array_equal(bo, np.broadcast_to(one, (32, 8)))


def test_nl_broadcast_to_partition_dim_bf16():
    row = torch.from_numpy(randn(1, 64)).to(torch.bfloat16)
    got = run_tiles(lambda r: nl.broadcast_to(r, (128, 64)), row)
    assert got.dtype == torch.bfloat16 and torch.equal(got, row.expand(128, 64))


def test_nl_broadcast_to_partition_dim_fills_ones_once_and_evacuates_psum_on_scalar_engine():
    rows, ints = randn(3, 600, seed=4), np.arange(-40, 40, dtype=np.int32).reshape(1, 80)

    def kernel(r, i):
        t, ti = nl.load(r), nl.load(i)
        outs = [to_hbm(nl.broadcast_to(t[k:k + 1, :], (128, 600))) for k in range(3)]
        return (*outs, to_hbm(nl.broadcast_to(ti, (64, 80))))

    *got, got_int = nki.simulate(kernel)(rows, ints)
    for k in range(3):
        np.testing.assert_array_equal(got[k], np.broadcast_to(rows[k:k + 1], (128, 600)))
    np.testing.assert_array_equal(got_int, np.broadcast_to(ints, (64, 80)))
    ops = [(engine, op) for _, _, engine, _, _, op, _, _ in nki.estimate(kernel, platform="trn1")(rows, ints)
           .instructions()]
    assert ops.count(("vector", "memset")) + ops.count(("gpsimd", "memset")) == 1  # one fp32 ones row for all four
    # 600 columns are two PSUM banks: 3 x 2 float evacuations on ScalarE, the int32 one on VectorE
    assert ops.count(("scalar", "activation")) == 6
    assert ops.count(("tensor", "nc_matmul")) == 7


def test_nl_where():
    x, y, col = randn(64, 40, seed=1), randn(64, 40, seed=2), randn(64, 1, seed=3)
    x[0, :4] = [np.inf, -np.inf, np.nan, 7.0]  # values never chosen must not leak into the result
    y[0, :4] = 1.0
    cond = (rng(4).random((64, 40)) < 0.5).astype(F32)
    cond[0, :4] = [0, 0, 0, 1]

    def body(c, a, b, cc):
        return nl.where(c, a, b), nl.where(c, a, 0.5), nl.where(c, a, cc), nl.where(c, -2.0, b)

    w1, w2, w3, w4 = run_tiles(body, cond, x, y, col)
    np.testing.assert_array_equal(w1, np.where(cond != 0, x, y))
    np.testing.assert_array_equal(w2, np.where(cond != 0, x, F32(0.5)))
    np.testing.assert_array_equal(w3, np.where(cond != 0, x, col))
    np.testing.assert_array_equal(w4, np.where(cond != 0, F32(-2), y))


# ---- SPMD -------------------------------------------------------------------------------------

def _spmd_info():
    """A (1, 1 + 2 + 2) int32 tile: program_ndim, program_id(0..1), num_programs(0..1) (-1 if absent)."""
    nd = nl.program_ndim()
    vals = [nd] + [nl.program_id(i) if i < nd else -1 for i in range(2)] + \
           [nl.num_programs(i) if i < nd else -1 for i in range(2)]
    t = nl.ndarray((1, 5), nl.int32, buffer=nl.sbuf)
    for j, v in enumerate(vals):
        nisa.memset(dst=t[:, j:j + 1], value=int(v))
    return t


def test_program_id_without_a_grid():
    def k(x):
        assert (nl.program_id(), nl.num_programs(), nl.program_ndim()) == (0, 1, 0)
        return to_hbm(_spmd_info())

    np.testing.assert_array_equal(nki.simulate(k)(np.zeros((1, 1), F32)), [[0, -1, -1, -1, -1]])


def test_program_id_1d_grid():
    a = randn(128, 32)

    @nki.jit
    def k(x):
        pid = nl.program_id(0)
        out = nl.ndarray((128, 32), x.dtype, buffer=nl.shared_hbm)
        info = nl.ndarray((2, 5), nl.int32, buffer=nl.shared_hbm)
        rows = x[pid * 64:(pid + 1) * 64, :]
        nisa.dma_copy(dst=out[pid * 64:(pid + 1) * 64, :], src=nl.add(nl.load(rows), float(pid * 100)))
        nisa.dma_copy(dst=info[pid:pid + 1, :], src=_spmd_info())
        return out, info

    out, info = nki.simulate(k[2])(a)
    np.testing.assert_array_equal(out[:64], a[:64])
    np.testing.assert_array_equal(out[64:], a[64:] + F32(100))
    np.testing.assert_array_equal(info, [[1, 0, -1, 2, -1], [1, 1, -1, 2, -1]])


def test_program_id_2d_grid():
    @nki.jit
    def k(x):
        i, j = nl.program_id(0), nl.program_id(1)
        info = nl.ndarray((2, 3, 5), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=info[i, j:j + 1, :], src=_spmd_info())
        return info

    info = nki.simulate(k[2, 3])(np.zeros((1, 1), F32))
    want = np.array([[[2, i, j, 2, 3] for j in range(3)] for i in range(2)])
    np.testing.assert_array_equal(info, want)


# ---- NkiTensor views --------------------------------------------------------------------------

def test_on_chip_integer_indexing_rules():
    shapes = {}

    def k(x):
        t = nl.ndarray((64, 64, 64), nl.float32, buffer=nl.sbuf)
        for key, view in {"t[0,0,10]": t[0, 0, 10], "t[:,0]": t[:, 0], "t[:,0,10]": t[:, 0, 10],
                          "t[:,:,::2]": t[:, :, ::2], "t[0,...,:]": t[0, ..., :], "t[-1]": t[-1]}.items():
            shapes[key] = view.shape
        h = nl.ndarray((4, 128, 32), nl.float32, buffer=nl.hbm)
        shapes["h[0,:,:]"] = h[0, :, :].shape
        shapes["h[1,2]"] = h[1, 2].shape
        return to_hbm(nl.load(x))

    nki.simulate(k)(np.zeros((1, 1), F32))
    assert shapes == {"t[0,0,10]": (1, 1), "t[:,0]": (64, 64), "t[:,0,10]": (64, 1), "t[:,:,::2]": (64, 64, 32),
                      "t[0,...,:]": (1, 64, 64), "t[-1]": (1, 64, 64), "h[0,:,:]": (128, 32), "h[1,2]": (32,)}


@pytest.mark.parametrize("index", ["a", None, [1, 2]])
def test_an_index_that_is_not_an_int_slice_or_ds_is_a_type_error(index):
    def k(x):
        return to_hbm(nl.copy(nl.load(x)[0:4, index]))

    with pytest.raises(TypeError, match=r"is not an int, a slice or nl\.ds"):
        nki.simulate(k)(randn(4, 8))


def test_view_indexing_reads_the_right_elements():
    a = randn(64, 4, 16)

    def k(x):
        t = nl.load(x)
        return (to_hbm(nl.copy(t[:, 1, 3])), to_hbm(nl.copy(t[:, ::2, 5:12:3])), to_hbm(nl.copy(t[5])),
                to_hbm(nl.copy(t[:, 2])), to_hbm(nl.copy(t[10:20, -1, nl.ds(4, 8)])),
                to_hbm(nl.copy(t[-20:-4, np.int64(1), -9:])), to_hbm(nl.copy(t[..., 3:5][:, 1:3])),
                to_hbm(nl.copy(t[10:23, 1, ...])))

    r = nki.simulate(k)(a)
    np.testing.assert_array_equal(r[0], a[:, 1, 3:4])
    np.testing.assert_array_equal(r[1], a[:, ::2, 5:12:3])
    np.testing.assert_array_equal(r[2], a[5:6])
    np.testing.assert_array_equal(r[3], a[:, 2])
    np.testing.assert_array_equal(r[4], a[10:20, -1, 4:12])
    np.testing.assert_array_equal(r[5], a[-20:-4, 1, -9:])
    np.testing.assert_array_equal(r[6], a[..., 3:5][:, 1:3])
    np.testing.assert_array_equal(r[7], a[10:23, 1])


def test_view_methods():
    a = randn(32, 4, 16)

    def k(x):
        t = nl.load(x)
        return (to_hbm(nl.copy(t.permute((0, 2, 1)))),
                to_hbm(nl.copy(t.reshape((32, 64)))),
                to_hbm(nl.copy(t[:, 0:1, :].broadcast(1, 3))),
                to_hbm(nl.copy(t.select(1, 2))),
                to_hbm(nl.copy(t.slice(2, 1, 15, 7))),
                to_hbm(nl.copy(t.flatten_dims(1, 2))),
                to_hbm(nl.copy(t.reshape_dim(2, (2, -1)))),
                to_hbm(nl.copy(t.expand_dim(1).squeeze_dim(1))))

    r = nki.simulate(k)(a)
    np.testing.assert_array_equal(r[0], a.transpose(0, 2, 1))
    np.testing.assert_array_equal(r[1], a.reshape(32, 64))
    np.testing.assert_array_equal(r[2], np.broadcast_to(a[:, 0:1, :], (32, 3, 16)))
    np.testing.assert_array_equal(r[3], a[:, 2, :])
    np.testing.assert_array_equal(r[4], a[:, :, 1:15:7])
    np.testing.assert_array_equal(r[5], a.reshape(32, 64))
    np.testing.assert_array_equal(r[6], a.reshape(32, 4, 2, 8))
    np.testing.assert_array_equal(r[7], a)


def test_view_metadata_from_the_docs():
    seen = {}

    def k(x):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        seen["fresh"] = (t.strides, t.offset)
        s = t.slice(1, 8, 24)
        seen["slice"] = (s.get_pattern(), s.offset)
        u = nl.ndarray((128, 4, 16), nl.float32, buffer=nl.sbuf)
        seen["compose"] = u[0:64, :, :].permute((0, 2, 1))[:, 0, :].shape
        seen["ap"] = t.ap([[64, 128], [1, 16]], offset=8).get_pattern()
        return to_hbm(nl.load(x))

    nki.simulate(k)(np.zeros((1, 1), F32))
    assert seen == {"fresh": ((64, 1), 0), "slice": ([[64, 128], [1, 16]], 8), "compose": (64, 4),
                    "ap": [[64, 128], [1, 16]]}


def test_ap_average_pool_from_the_docs():
    # The docs' tensor_avgpool_kernel: a 5-D access pattern over a (C, H, W) tile and a sum
    # over its two innermost dims; exact for these float16 values.
    x = np.arange(2 * 6 * 6, dtype=np.float16).reshape(2, 6, 6)

    def k(in_tensor, pool_size):
        sz_cin, sz_hin, sz_win = in_tensor.shape
        out_tensor = nl.ndarray((sz_cin, sz_hin // pool_size, sz_win // pool_size), dtype=in_tensor.dtype,
                                buffer=nl.shared_hbm)
        in_tile = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=in_tile, src=in_tensor)
        pool_view = in_tile.ap([[sz_hin * sz_win, sz_cin], [pool_size * sz_win, sz_hin // pool_size],
                                [pool_size, sz_win // pool_size], [sz_win, pool_size], [1, pool_size]])
        sum_tile = nl.sum(pool_view, axis=[3, 4])
        out_tile = nl.ndarray(sum_tile.shape, dtype=sum_tile.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=out_tile, data=sum_tile, op0=nl.multiply, operand0=1.0 / (pool_size * pool_size))
        nisa.dma_copy(dst=out_tensor, src=out_tile)
        return out_tensor

    got = nki.simulate(k)(x, 2)
    want = x.reshape(2, 3, 2, 3, 2).astype(np.float64).mean(axis=(2, 4)).astype(np.float16)
    np.testing.assert_array_equal(got, want)


def test_ap_every_other_element_and_max_pool():
    a = randn(128, 1024, seed=5)

    def k(x):
        t = nl.load(x)
        evens = nl.copy(t.ap([[1024, 128], [2, 512]]))
        odds = nl.copy(t.ap([[1024, 128], [2, 512]], offset=1))
        pooled = nl.max(t.ap([[1024, 128], [4, 256], [1, 4]]), axis=2)
        return to_hbm(evens), to_hbm(odds), to_hbm(pooled)

    ev, od, mp = nki.simulate(k)(a)
    np.testing.assert_array_equal(ev, a[:, 0::2])
    np.testing.assert_array_equal(od, a[:, 1::2])
    np.testing.assert_array_equal(mp, a.reshape(128, 256, 4).max(2))


def test_setitem_copies_and_fills():
    a = randn(16, 32)

    def k(x):
        t = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        t[:, 0:16] = 1.5                     # memset
        t[:, 16:32] = x[:, 0:16]             # DMA from HBM
        u = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        u[...] = t                           # on-chip copy
        return to_hbm(u)

    got = nki.simulate(k)(a)
    np.testing.assert_array_equal(got[:, :16], 1.5)
    np.testing.assert_array_equal(got[:, 16:], a[:, :16])


# ---- predicated copy, selection with reduction, accumulating Vector-engine instructions -------

def test_tensor_copy_predicated_keeps_dst_where_false():
    a, b = randn(16, 24, seed=1), randn(16, 24, seed=2)
    pred = (rng(3).random((16, 24)) > 0.5).astype(np.uint8)

    def k(x, y, p):
        d, s, pr = nl.load(x), nl.load(y), nl.load(p)
        nisa.tensor_copy_predicated(dst=d, src=s, predicate=pr)
        e = nl.load(x)
        nisa.tensor_copy_predicated(dst=e, src=-7.0, predicate=pr, reverse_pred=True)
        return to_hbm(d), to_hbm(e)

    got, got_rev = nki.simulate(k)(a, b, pred)
    np.testing.assert_array_equal(got, np.where(pred != 0, b, a))
    np.testing.assert_array_equal(got_rev, np.where(pred == 0, F32(-7.0), a))


def test_tensor_copy_predicated_int32_is_bit_exact():
    a = np.arange(8 * 8, dtype=np.int32).reshape(8, 8) + (1 << 30)
    b = -a
    pred = (np.arange(64).reshape(8, 8) % 3 == 0).astype(np.uint32)

    def k(x, y, p):
        d = nl.load(x)
        nisa.tensor_copy_predicated(dst=d, src=nl.load(y), predicate=nl.load(p))
        return to_hbm(d)

    np.testing.assert_array_equal(nki.simulate(k)(a, b, pred), np.where(pred != 0, b, a))


@pytest.mark.parametrize("column", [False, True])
def test_select_reduce(column):
    x = randn(32, 40, seed=4)
    pred = (rng(5).random((32, 40)) > 0.3).astype(np.uint8)
    off = randn(32, 1, seed=6)

    def k(xt, pt, ot):
        d = nl.ndarray((32, 40), nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((32, 1), nl.float32, buffer=nl.sbuf)
        on_false = nl.load(ot) if column else -2.5
        nisa.select_reduce(dst=d, predicate=nl.load(pt), on_true=nl.load(xt), on_false=on_false, reduce_res=r,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum)
        return to_hbm(d), to_hbm(r)

    d, r = nki.simulate(k)(x, pred, off)
    want = np.where(pred != 0, x, off if column else F32(-2.5))
    np.testing.assert_array_equal(d, want)
    np.testing.assert_array_equal(r, want.max(axis=1, keepdims=True))


def test_select_reduce_reverse_pred_and_chained_accumulation():
    x = randn(8, 16, seed=7)
    pred = (np.arange(128).reshape(8, 16) % 2).astype(np.int16)

    def k(xt, pt):
        t, p = nl.load(xt), nl.load(pt)
        d = nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((8, 1), nl.float32, buffer=nl.sbuf)
        # The first half resets the max, the second continues it (the engine's accumulator).
        nisa.select_reduce(dst=d[:, 0:8], predicate=p[:, 0:8], on_true=t[:, 0:8], on_false=-100.0,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reverse_pred=True)
        nisa.select_reduce(dst=d[:, 8:16], predicate=p[:, 8:16], on_true=t[:, 8:16], on_false=-100.0,
                           reduce_res=r, reduce_cmd=nisa.reduce_cmd.reduce, reverse_pred=True)
        return to_hbm(d), to_hbm(r)

    d, r = nki.simulate(k)(x, pred)
    want = np.where(pred == 0, x, F32(-100.0))
    np.testing.assert_array_equal(d, want)
    np.testing.assert_array_equal(r, want.max(axis=1, keepdims=True))


def test_range_select_causal_row_mask():
    # Row p keeps columns [p, p + 8) : the idiom of attention masks with per-row bounds.
    P, F_ = 16, 32
    x = randn(P, F_, seed=8)
    lo = np.arange(P, dtype=F32).reshape(P, 1)
    hi = lo + 8

    def k(xt, l, h):
        d = nl.ndarray((P, F_), nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=d, on_true_tile=nl.load(xt), comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=nl.load(l), bound1=nl.load(h), reduce_res=r, range_start=4)
        return to_hbm(d), to_hbm(r)

    d, r = nki.simulate(k)(x, lo, hi)
    idx = 4 + np.arange(F_, dtype=F32)[None, :]
    want = np.where((idx >= lo) & (idx < hi), x, np.finfo(F32).min)
    np.testing.assert_array_equal(d, want)
    np.testing.assert_array_equal(r, want.max(axis=1, keepdims=True))


def test_range_select_bf16_fill_becomes_minus_inf():
    x = randn(4, 8, seed=9)
    b = np.zeros((4, 1), F32)

    def k(xt, bt):
        d = nl.ndarray((4, 8), nl.bfloat16, buffer=nl.sbuf)
        nisa.range_select(dst=d, on_true_tile=nl.load(xt), comp_op0=nl.equal, comp_op1=nl.greater_equal,
                          bound0=nl.load(bt), bound1=nl.load(bt))
        return to_hbm(nl.copy(d, dtype=nl.float32))

    got = nki.simulate(k)(x, b)
    assert np.all(np.isneginf(got[:, 1:]))
    np.testing.assert_array_equal(got[:, 0], torch.tensor(x[:, 0]).bfloat16().float().numpy())


@pytest.mark.parametrize("op0,reduce_op,ref", [
    (nl.multiply, nl.add, lambda t: t.sum(axis=1, keepdims=True, dtype=np.float64)),
    (nl.subtract, nl.maximum, lambda t: t.max(axis=1, keepdims=True)),
    (nl.add, nl.minimum, lambda t: t.min(axis=1, keepdims=True)),
])
def test_tensor_scalar_reduce(op0, reduce_op, ref):
    x = randn(16, 24, seed=10)
    c = randn(16, 1, seed=11)
    npop = {nl.multiply: np.multiply, nl.subtract: np.subtract, nl.add: np.add}[op0]

    def k(xt, ct):
        d = nl.ndarray((16, 24), nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((16, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=d, data=nl.load(xt), op0=op0, operand0=nl.load(ct), reduce_op=reduce_op,
                                  reduce_res=r)
        return to_hbm(d), to_hbm(r)

    d, r = nki.simulate(k)(x, c)
    want = npop(x, c).astype(F32)
    np.testing.assert_array_equal(d, want)
    np.testing.assert_allclose(r, ref(want), rtol=1e-6, atol=1e-6)


def test_tensor_scalar_reduce_load_reduce_and_negate():
    x = randn(8, 16, seed=12)

    def k(xt):
        d = nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((8, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=d, data=nl.load(xt), op0=nl.multiply, operand0=2.0, reduce_op=nl.add,
                                  reduce_res=r, reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=10.0,
                                  reduce_res_negate=True)
        return to_hbm(r)

    np.testing.assert_allclose(nki.simulate(k)(x)[:, 0], -(10.0 + (2 * x).sum(axis=1)), rtol=1e-5)


def test_tensor_scalar_cumulative_cumsum_and_running_max():
    x = randn(16, 32, seed=13)

    def k(xt):
        t = nl.load(xt)
        s = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=s, src=t, op0=nl.multiply, op1=nl.add, imm0=1.0)
        m = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=m, src=t, op0=nl.add, op1=nl.maximum, imm0=0.0)
        # Two halves: the second continues the first's accumulator, then load_reduce starts at imm1.
        h = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=h[:, 0:16], src=t[:, 0:16], op0=nl.multiply, op1=nl.add, imm0=1.0)
        nisa.tensor_scalar_cumulative(dst=h[:, 16:32], src=t[:, 16:32], op0=nl.multiply, op1=nl.add, imm0=1.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        l = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=l, src=t, op0=nl.multiply, op1=nl.add, imm0=1.0, imm1=5.0,
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
        return to_hbm(s), to_hbm(m), to_hbm(h), to_hbm(l)

    s, m, h, l = nki.simulate(k)(x)
    cs = np.cumsum(x, axis=1, dtype=F32)  # left to right in fp32, as the engine
    np.testing.assert_array_equal(s, cs)
    np.testing.assert_array_equal(m, np.maximum.accumulate(x, axis=1))
    np.testing.assert_array_equal(h, cs)
    np.testing.assert_allclose(l, 5.0 + np.cumsum(x, axis=1, dtype=np.float64), rtol=1e-5, atol=1e-5)


def test_exponential_on_trn3_with_running_sum(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = randn(16, 64, seed=14)
    mx = x.max(axis=1, keepdims=True)

    def k(xt, mt):
        t, m = nl.load(xt), nl.load(mt)
        e = nl.ndarray((16, 64), nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((16, 1), nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=e[:, 0:32], src=t[:, 0:32], max_value=m, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(dst=e[:, 32:64], src=t[:, 32:64], max_value=m, reduce_res=s,
                         reduce_cmd=nisa.reduce_cmd.reduce)
        f = nl.ndarray((16, 64), nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=f, src=t, max_value=1.5)
        return to_hbm(e), to_hbm(s), to_hbm(f)

    e, s, f = nki.simulate(k)(x, mx)
    want = np.exp(x.astype(np.float64) - mx)
    np.testing.assert_allclose(e, want, rtol=1e-6)
    np.testing.assert_allclose(s[:, 0], want.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(f, np.exp(x.astype(np.float64) - 1.5), rtol=1e-6)


def test_activate2_on_trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = randn(16, 32, seed=15)
    sc = randn(16, 1, seed=16)

    def k(xt, st):
        t = nl.load(xt)
        a = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((16, 1), nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=a, op=nl.tanh, data=t, imm0=nl.load(st), imm1=0.5, op0=nl.multiply, op1=nl.add,
                       reduce_op=nl.maximum, reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        b = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=b, op=nl.exp, data=t, imm0=2.0, imm1=0.0, op0=nl.subtract, op1=nl.bypass, reverse0=True)
        return to_hbm(a), to_hbm(r), to_hbm(b)

    a, r, b = nki.simulate(k)(x, sc)
    want = np.tanh(x.astype(np.float64) * sc + 0.5)
    np.testing.assert_allclose(a, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(r[:, 0], want.max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(b, np.exp(2.0 - x.astype(np.float64)), rtol=1e-6)


def test_nc_match_replace8_docs_example_and_topk_idiom():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], F32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], F32)

    def k(d, v):
        dst = nl.ndarray((1, 11), nl.float32, buffer=nl.sbuf)
        idx = nl.ndarray((1, 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=dst, data=nl.load(d), vals=nl.load(v), imm=-1.0, dst_idx=idx)
        return to_hbm(dst), to_hbm(idx)

    dst, idx = nki.simulate(k)(data, vals)
    np.testing.assert_array_equal(idx[0], [2, 10, 9, 8, 7, 6, 5, 4])
    np.testing.assert_array_equal(dst[0], [1, 2, -1, 4] + [-1] * 7)

    # Top-16 per partition: max8, replace those with -inf, max8 again.
    x = randn(8, 64, seed=17)

    def top16(xt):
        t = nl.load(xt)
        m = nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=m[:, 0:8], src=t)
        rest = nl.ndarray((8, 64), nl.float32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=rest, data=t, vals=m[:, 0:8], imm=float("-inf"))
        nisa.max8(dst=m[:, 8:16], src=rest)
        return to_hbm(m)

    np.testing.assert_array_equal(nki.simulate(top16)(x), -np.sort(-x, axis=1)[:, :16])


def test_nc_stream_shuffle_per_quadrant_and_keep():
    x = randn(64, 8, seed=18)
    mask = [(i + 1) % 32 for i in range(32)]
    mask[5] = 255

    def k(xt):
        d = nl.ndarray((64, 8), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=d, value=0.0)
        nisa.nc_stream_shuffle(dst=d, src=nl.load(xt), shuffle_mask=mask)
        return to_hbm(d)

    got = nki.simulate(k)(x)
    want = np.zeros_like(x)
    for i in range(64):
        if mask[i % 32] != 255:
            want[i] = x[i // 32 * 32 + mask[i % 32]]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,hwdge", [((16, 48), True), ((32, 20), False), ((4, 12, 8), True),
                                         ((2, 3, 8, 5), True)])
def test_dma_transpose(shape, hwdge):
    x = (rng(19).standard_normal(shape)).astype(np.float16)
    perm = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}[len(shape)]
    mode = nisa.dge_mode.hwdge if hwdge else nisa.dge_mode.unknown

    def from_hbm(xt):
        d = nl.ndarray(tuple(shape[p] for p in perm), nl.float16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=xt, axes=perm, dge_mode=mode)
        return to_hbm(d)

    np.testing.assert_array_equal(nki.simulate(from_hbm)(x), np.transpose(x, perm))
    if len(shape) == 2:
        def from_sbuf(xt):
            d = nl.ndarray((shape[1], shape[0]), nl.float16, buffer=nl.sbuf)
            nisa.dma_transpose(dst=d, src=nl.load(xt))
            return to_hbm(d)

        np.testing.assert_array_equal(nki.simulate(from_sbuf)(x), x.T)


def _check_permuted_windows(x, tile_shape, windows):
    """DMA-copies each window ``x[r0:r0 + f, c0:c0 + p].permute((1, 0))`` of HBM into
    ``d[0:p, slot, 0:f]`` of a zeroed 3-D SBUF tile (the shipped matmul's a.T loads on
    NeuronCore-v3+) and compares every bit with numpy's transposes. ``windows``: (slot, r0, c0, p)."""
    f = tile_shape[2]

    def k(xt):
        d = nl.ndarray(tile_shape, xt.dtype, buffer=nl.sbuf)
        nisa.memset(dst=d, value=0)
        for slot, r0, c0, p in windows:
            nisa.dma_copy(dst=d[0:p, slot, 0:f], src=xt[r0:r0 + f, c0:c0 + p].permute((1, 0)))
        return to_hbm(d)

    want = np.zeros(tile_shape, x.dtype)
    for slot, r0, c0, p in windows:
        want[:p, slot, :] = x[r0:r0 + f, c0:c0 + p].T
    bits = np.dtype(f"u{x.dtype.itemsize}")
    np.testing.assert_array_equal(np.asarray(nki.simulate(k)(x)).view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8])
def test_dma_copy_of_a_permuted_window_transposes(dtype):
    # The executor copies such strided pairs in blocks; sizes not a multiple of them.
    x = (rng(23).standard_normal((50, 100)) * 20).astype(dtype)
    _check_permuted_windows(x, (70, 3, 37), [(1, 5, 20, 70), (2, 13, 30, 70)])


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_large_transposing_and_dense_copies_move_every_bit(dtype):
    # Large enough for the executor's threaded and SIMD copies (cpu/transpose.h); every 32-bit
    # pattern, NaN payloads included, lands in its place; ragged sizes leave partial 8 x 8 blocks.
    x = rng(31).integers(0, 2**32, (700, 200), dtype=np.uint64).astype(np.uint32).view(dtype)
    _check_permuted_windows(x, (128, 3, 605), [(1, 3, 70, 123), (2, 90, 0, 128)])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dma_copy_of_a_3d_access_pattern_transposes(dtype):
    # The shipped matmul's a.T load of every full K tile at once: [p, kt, i] = x[r0 + i, kt * 16 + p].
    x = (rng(29).standard_normal((40, 70)) * 20).astype(dtype)
    P, T, M, r0 = 16, 4, 9, 7

    def k(xt):
        d = nl.ndarray((P, T, M), xt.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=d, src=xt.ap([[1, P], [P, T], [70, M]], offset=r0 * 70))
        return to_hbm(d)

    want = x[r0:r0 + M, :P * T].reshape(M, T, P).transpose(2, 1, 0)
    np.testing.assert_array_equal(nki.simulate(k)(x), want)


def test_nc_n_gather_per_partition():
    x = randn(16, 4, 8, seed=20)
    idx = rng(21).integers(0, 32, (16, 10)).astype(np.uint32)

    def k(xt, it):
        d = nl.ndarray((16, 10), nl.float32, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=d, data=nl.load(xt), indices=nl.load(it))
        return to_hbm(d)

    np.testing.assert_array_equal(nki.simulate(k)(x, idx), np.take_along_axis(x.reshape(16, 32), idx, axis=1))


def test_local_gather_docs_reference():
    src = (rng(22).random((32, 64, 4)) * 100).astype(F32)
    per_core = rng(23).integers(0, 64, (16, 2)).astype(np.uint16)
    index = np.tile(per_core, (2, 1)) * 4          # element offsets of 4-element groups
    valid = 24

    def k(st, it):
        d = nl.ndarray((32, valid, 4), nl.float32, buffer=nl.sbuf)
        nisa.local_gather(dst=d, src_buffer=nl.load(st), index=nl.load(it), num_elem_per_idx=4,
                          num_valid_indices=valid)
        return to_hbm(d)

    got = nki.simulate(k)(src, index)
    want = np.empty((32, valid, 4), F32)
    for c in range(2):
        ids = index[c * 16:(c + 1) * 16].flatten(order="F")[:valid] // 4
        want[c * 16:(c + 1) * 16] = np.take(src[c * 16:(c + 1) * 16], ids, axis=1)
    np.testing.assert_array_equal(got, want)


# ---- front-end: kernel arguments and results, constants ---------------------------------------

class _Scale(nl.NKIObject):
    def __init__(self, factor):
        self.factor = factor


def test_nkiobject_argument_specializes_by_value():
    @nki.jit
    def k(x, cfg):
        t = nl.load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=float(cfg.factor))
        return to_hbm(t)

    a = randn(4, 8)
    np.testing.assert_array_equal(nki.simulate(k)(a, _Scale(2.0)), a * 2)
    np.testing.assert_array_equal(nki.simulate(k)(a, _Scale(2.0)), a * 2)
    np.testing.assert_array_equal(nki.simulate(k)(a, _Scale(3.0)), a * F32(3))
    assert len(k._cache) == 2  # equal configurations share one trace


def test_returning_a_reshape_of_a_whole_output():
    def k(x):
        o = nl.ndarray((1, 32), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=nl.load(x.reshape((1, 32))))
        return o.reshape((4, 8, 1))

    a = randn(4, 8)
    got = nki.simulate(k)(a)
    assert got.shape == (4, 8, 1)
    np.testing.assert_array_equal(got[..., 0], a)


def test_returning_a_written_argument():
    def k(x, out):
        t = nl.load(x)
        nisa.activation(dst=t, op=nl.exp, data=t)
        nl.store(out, t)
        return out

    a, o = randn(4, 8), np.zeros((4, 8), F32)
    got = nki.simulate(k)(a, o)
    assert got is o
    np.testing.assert_allclose(o, np.exp(a), rtol=1e-6)


@pytest.mark.parametrize("dtype", [nl.float32, nl.bfloat16, nl.uint8])
def test_shared_identity_matrix(dtype):
    def k():
        return to_hbm(nl.copy(nl.shared_identity_matrix(n=16, dtype=dtype), dtype=nl.float32))

    np.testing.assert_array_equal(nki.simulate(k)(), np.eye(16, dtype=F32))


def test_dtype_and_mutable_tensor_annotations():
    import nki.typing as nt

    def k(x: nt.tensor[4, 8], out: nt.mutable_tensor, dtype: nki.dtype = nl.float32):
        nl.store(out, nl.load(x, dtype=dtype))

    a, o = randn(4, 8), np.zeros((4, 8), F32)
    nki.simulate(k)(a, o)
    np.testing.assert_array_equal(o, a)
    assert nl.DType is str

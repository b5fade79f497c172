"""The NKI verifier: each hardware rule rejects a kernel that breaks it, naming the rule and
pointing at the kernel line that broke it; plus argument checking and the trace cache.

The offending line of each kernel carries the marker comment ``# <-``; the test checks that
the error's ``lineno`` is that line (for a rule about a tensor declaration, the line that
declared it). Where a limit has an exact boundary, the kernel just inside it must pass.
"""

import inspect
import os

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl

MARK = "# <-"
F32 = np.float32


def marked_line(fn) -> int:
    """The source line of ``fn`` that ends with the marker comment."""
    fn = getattr(fn, "func", fn)
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, text in enumerate(lines) if text.rstrip().endswith(MARK)]
    assert len(hits) == 1, f"{fn.__name__} needs exactly one '{MARK}' line"
    return hits[0]


def expect_error(kernel, rule, fragment, *args):
    """Runs ``kernel`` and checks the NkiValidationError it raises."""
    with pytest.raises(nki.NkiValidationError) as info:
        nki.simulate(kernel)(*args)
    e = info.value
    assert e.rule == rule, str(e)
    assert fragment in str(e), str(e)
    assert os.path.samefile(e.filename, __file__), e.filename
    assert e.lineno == marked_line(kernel), str(e)
    assert f"[{rule}]" in str(e) and f":{e.lineno}:" in str(e)
    return e


def z(*shape, dtype=F32):
    return np.zeros(shape, dtype)


@pytest.fixture
def target(monkeypatch):
    """Sets the NeuronCore generation kernels are traced for (read at every call)."""
    return lambda name: monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", name)


@pytest.fixture(autouse=True)
def _default_target(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")


# ---- tensor declarations -----------------------------------------------------------------------

def test_on_chip_rank():
    def k(x):
        t = nl.ndarray((128,), nl.float32, buffer=nl.sbuf)  # <-
        nisa.memset(dst=t, value=0.0)

    expect_error(k, "on-chip-rank", "is 1-D", z(1, 1))


def test_partition_limit_on_load():
    # A kernel that loads a [256, 512] tile into SBUF is rejected.
    def k(x):
        t = nl.load(x)  # <-
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(o, t)
        return o

    expect_error(k, "partition-limit", "has 256 partitions", z(256, 512))
    np.testing.assert_array_equal(nki.simulate(k)(np.ones((128, 512), F32)), 1.0)  # at the limit


def test_partition_limit_in_psum():
    def k(x):
        p = nl.ndarray((129, 4), nl.float32, buffer=nl.psum)  # <-
        nisa.memset(dst=p, value=0.0)

    expect_error(k, "partition-limit", "at most 128", z(1, 1))


@pytest.mark.parametrize("tgt,limit", [("trn2", 224 * 1024), ("trn3", 256 * 1024)])
def test_sbuf_capacity_of_one_tile(target, tgt, limit):
    target(tgt)

    def fits(x):
        t = nl.ndarray((128, limit // 4), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)

    def too_big(x):
        t = nl.ndarray((128, limit // 4 + 1), nl.float32, buffer=nl.sbuf)  # <-
        nisa.memset(dst=t, value=0.0)

    nki.simulate(fits)(z(1, 1))
    expect_error(too_big, "sbuf-capacity", f"needs {limit + 4} bytes per partition; {tgt} has {limit}", z(1, 1))


def test_sbuf_capacity_of_live_tiles():
    # Seven live 32 KiB tiles fill trn2's 224 KiB per partition; the eighth does not fit.
    def k(x):
        tiles = []
        for i in range(8):
            t = nl.ndarray((128, 8192), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=t, value=float(i))  # <-
            tiles.append(t)
        for t in tiles[1:]:  # keeps every tile live until here
            nisa.tensor_tensor(dst=tiles[0], data1=tiles[0], data2=t, op=nl.add)

    e = expect_error(k, "sbuf-capacity", "live SBUF tensors need 262144 bytes per partition; trn2 has 229376", z(1, 1))
    assert str(e).count("tensor[128, 8192]") == 6  # lists the live tiles (first six)


def test_sbuf_tiles_that_die_in_the_loop_fit():
    # The same eight tiles, each dead after its iteration, reuse memory.
    a = np.arange(128 * 8, dtype=F32).reshape(128, 8)

    def k(x):
        acc = nl.zeros((128, 8192), nl.float32)
        for i in range(8):
            t = nl.ndarray((128, 8192), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=t, value=float(i))
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        o = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=acc[:, 0:8])
        return o

    np.testing.assert_array_equal(nki.simulate(k)(a), 28.0)


def test_psum_capacity_counts_whole_banks():
    # Nine live PSUM tiles of one fp32 each still take nine 2 KiB banks; PSUM has eight.
    def k(x):
        tiles = []
        for i in range(9):
            p = nl.ndarray((128, 1), nl.float32, buffer=nl.psum)
            nisa.memset(dst=p, value=0.0)  # <-
            tiles.append(p)
        for p in tiles[1:]:
            nisa.tensor_copy(dst=tiles[0], src=p)

    def eight(x):
        tiles = []
        for i in range(8):
            p = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            nisa.memset(dst=p, value=0.0)
            tiles.append(p)
        for p in tiles[1:]:
            nisa.tensor_copy(dst=tiles[0], src=p)

    nki.simulate(eight)(z(1, 1))
    expect_error(k, "psum-capacity", "live PSUM tensors need 18432 bytes per partition; trn2 has 16384 (8 banks",
                 z(1, 1))


def test_psum_capacity_of_one_tile():
    def k(x):
        p = nl.ndarray((128, 4097), nl.float32, buffer=nl.psum)  # <-
        nisa.memset(dst=p, value=0.0)

    expect_error(k, "psum-capacity", "needs 16388 bytes per partition", z(1, 1))


# ---- accesses ------------------------------------------------------------------------------

def test_out_of_bounds_hbm_access():
    def k(x):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.ap([[512, 128], [1, 64]], offset=600))  # <-

    expect_error(k, "out-of-bounds", "of a tensor of shape [128, 512] (65536 elements)", z(128, 512))


def test_out_of_bounds_across_partitions():
    # 65 elements per partition of a 64-wide tile run into the next partition.
    def k(x):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t.ap([[64, 16], [1, 65]]), value=0.0)  # <-

    expect_error(k, "out-of-bounds", "crosses from one partition's free elements into another's", z(1, 1))


def test_partition_access_must_be_contiguous():
    def k(x):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t[::2, :], value=0.0)  # <-

    expect_error(k, "partition-access", "steps 128 elements along the partition dimension", z(1, 1))


def test_engine_memory():
    def k(x):
        t = nl.load(x)
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=t, data2=x, op=nl.add)  # <-

    expect_error(k, "engine-memory", "is in HBM; compute engines read and write SBUF/PSUM only", z(16, 16))


@pytest.mark.parametrize("case", ["tensor_copy", "iota", "memset", "tensor_scalar", "partition_reduce"])
def test_gpsimd_cannot_access_psum(case):
    def k(x):
        p = nl.ndarray((32, 32), nl.float32, buffer=nl.psum)
        s = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=1.0)
        if case == "tensor_copy":
            nisa.tensor_copy(dst=p, src=s, engine=nisa.engine.gpsimd)  # <-
        elif case == "iota":
            nisa.iota(dst=p, pattern=[[1, 32]], offset=0)  # <-
        elif case == "memset":
            nisa.memset(dst=p, value=0.0, engine=nisa.engine.gpsimd)  # <-
        elif case == "tensor_scalar":
            nisa.tensor_scalar(dst=p, data=s, op0=nl.multiply, operand0=2.0, engine=nisa.engine.gpsimd)  # <-
        else:
            r = nl.ndarray((1, 32), nl.float32, buffer=nl.psum)
            nisa.tensor_partition_reduce(dst=r, op=nl.add, data=s)  # <-

    # Several lines carry the marker; the offending one is the branch taken.
    lines, start = inspect.getsourcelines(k)
    want = next(start + i for i, text in enumerate(lines) if MARK in text and case in text)
    with pytest.raises(nki.NkiValidationError) as info:
        nki.simulate(k)(z(1, 1))
    assert info.value.rule == "gpsimd-psum" and "GpSimd engine cannot access" in str(info.value)
    assert info.value.lineno == want


def test_gpsimd_on_sbuf_and_vector_on_psum_pass():
    def k(x):
        p = nl.ndarray((32, 32), nl.float32, buffer=nl.psum)
        nisa.memset(dst=p, value=2.0, engine=nisa.engine.vector)
        s = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=p, engine=nisa.engine.vector)
        g = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=g, data=s, op0=nl.add, operand0=1.0, engine=nisa.engine.gpsimd)
        o = nl.ndarray((32, 32), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=g)
        return o

    np.testing.assert_array_equal(nki.simulate(k)(z(1, 1)), 3.0)


# ---- instruction operands ----------------------------------------------------------------------

def test_shape_mismatch_tensor_tensor():
    def k(x):
        a = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=a, value=1.0)
        nisa.memset(dst=b, value=1.0)
        nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)  # <-

    expect_error(k, "shape-mismatch", "differ in partitions or in elements per partition", z(1, 1))


def test_shape_mismatch_dma_element_count():
    def k(x):
        t = nl.ndarray((64, 65), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)  # <-

    expect_error(k, "shape-mismatch", "have different numbers of elements", z(64, 64))


def test_shape_mismatch_matmul_destination():
    def k(x):
        s = nl.ndarray((64, 32), nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((64, 100), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=1.0)
        nisa.memset(dst=m, value=1.0)
        acc = nl.ndarray((32, 128), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # <-

    expect_error(k, "shape-mismatch", "must be [32, 100]: stationary.T @ moving", z(1, 1))


def test_psum_operands():
    def k(x):
        a = nl.ndarray((32, 32), nl.float32, buffer=nl.psum)
        b = nl.ndarray((32, 32), nl.float32, buffer=nl.psum)
        nisa.memset(dst=a, value=1.0)
        nisa.memset(dst=b, value=1.0)
        d = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.add)  # <-

    expect_error(k, "psum-operands", "at most one input of an instruction can be read from PSUM", z(1, 1))


def test_dtype_bitwise_on_floats():
    def k(x):
        t = nl.load(x)
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=t, data2=t, op=nl.bitwise_and)  # <-

    expect_error(k, "dtype", "bitwise operators take integer tensors", z(8, 8))


def test_dtype_tensor_scalar_bitwise_op1_on_floats():
    def k(x):
        t = nl.load(x)
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=t, op0=nl.add, operand0=1.0, op1=nl.bitwise_and, operand1=3)  # <-

    expect_error(k, "dtype", "bitwise operators take integer tensors", z(8, 8))


@pytest.mark.parametrize("case", ["scan", "scalar_tensor_tensor"])
def test_dtype_bitwise_in_arithmetic_only_instructions(case):
    def k(x):
        t = nl.load(x)
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        if case == "scan":
            nisa.tensor_tensor_scan(dst=d, data0=t, data1=t, initial=0.0, op0=nl.bitwise_and, op1=nl.add)  # <-
        else:
            nisa.scalar_tensor_tensor(dst=d, data=t, op0=nl.bitwise_or, operand0=1.0, op1=nl.add, operand1=t)  # <-

    with pytest.raises(nki.NkiValidationError) as info:
        nki.simulate(k)(z(8, 8))
    assert info.value.rule == "dtype"


def test_dtype_tensor_scalar_column_operand_is_float32():
    def k(x):
        t = nl.load(x)
        col = nl.ndarray((8, 1), nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=col, value=1.0)
        d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=t, op0=nl.add, operand0=col)  # <-

    expect_error(k, "dtype", "tensor_scalar's vector operands are float32", z(8, 8))


def test_dtype_memset_float_into_int():
    def k(x):
        t = nl.ndarray((8, 8), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=2.5)  # <-

    expect_error(k, "dtype", "value 2.5 is not a whole number but dst is int32", z(1, 1))


def test_dtype_transpose_keeps_dtype():
    def k(x):
        t = nl.load(x)
        d = nl.ndarray((8, 16), nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=d, data=t)  # <-

    expect_error(k, "dtype", "destination dtype bfloat16 must equal the data's float32", z(16, 8))


@pytest.mark.parametrize("where", ["stationary", "dst"])
def test_matmul_memory(where):
    def k(x):
        s = nl.ndarray((64, 32), nl.float32, buffer=nl.psum if where == "stationary" else nl.sbuf)
        m = nl.ndarray((64, 100), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=1.0)
        nisa.memset(dst=m, value=1.0)
        acc = nl.ndarray((32, 100), nl.float32, buffer=nl.sbuf if where == "dst" else nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # <-

    expect_error(k, "matmul-memory", "must be in SBUF" if where == "stationary" else "must be in PSUM", z(1, 1))


def test_matmul_contraction():
    def k(x):
        s = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((64, 100), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=1.0)
        nisa.memset(dst=m, value=1.0)
        acc = nl.ndarray((32, 100), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # <-

    expect_error(k, "matmul-contraction", "must have the same contraction (partition) size", z(1, 1))


def test_matmul_stationary_free():
    def k(x):
        s = nl.ndarray((128, 129), nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=1.0)
        nisa.memset(dst=m, value=1.0)
        acc = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # <-

    expect_error(k, "matmul-stationary-free", "has 129 free elements; at most 128", z(1, 1))


def test_matmul_moving_free():
    def k(x):
        s = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((128, 513), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=1.0)
        nisa.memset(dst=m, value=1.0)
        acc = nl.ndarray((64, 513), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # <-

    expect_error(k, "matmul-moving-free", "has 513 free elements; at most 512", z(1, 1))


def test_matmul_moving_free_on_trn3_is_4096(target):
    target("trn3")

    def k(st, mv):
        acc = nl.ndarray((st.shape[1], mv.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=nl.load(st), moving=nl.load(mv))
        s = nl.ndarray(acc.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=acc)
        o = nl.ndarray(acc.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=s)
        return o

    st, mv = np.ones((4, 8), F32), np.ones((4, 1024), F32)
    np.testing.assert_array_equal(nki.simulate(k)(st, mv), 4.0)


def _matmul_dtypes_kernel(sdt, mdt, ddt=nl.float32):
    def k(x):
        s = nl.ndarray((32, 16), sdt, buffer=nl.sbuf)
        m = nl.ndarray((32, 64), mdt, buffer=nl.sbuf)
        nisa.memset(dst=s, value=1 if sdt.startswith(("int", "uint")) else 1.0)
        nisa.memset(dst=m, value=2.0)
        acc = nl.ndarray((16, 64), ddt, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # <-
        r = nl.ndarray((16, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=acc)
        o = nl.ndarray((16, 64), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=r)
        return o

    return k


def test_matmul_dtype_fp32_with_bf16():
    expect_error(_matmul_dtypes_kernel(nl.float32, nl.bfloat16), "matmul-dtype",
                 "a float32/tfloat32 operand pairs only with float32/tfloat32; got float32 and bfloat16", z(1, 1))


def test_matmul_dtype_integer_operands():
    k = _matmul_dtypes_kernel(nl.float32, nl.float32)
    k_int = _matmul_dtypes_kernel(nl.int8, nl.bfloat16)
    np.testing.assert_array_equal(nki.simulate(k)(z(1, 1)), 64.0)
    with pytest.raises(nki.NkiValidationError) as info:
        nki.simulate(k_int)(z(1, 1))
    assert info.value.rule == "matmul-dtype" and "operands must be floating point" in str(info.value)


def test_matmul_dtype_fp8_e4m3fn_needs_trn3(target):
    # The target is read at every call: one kernel object, rejected on trn2, run on trn3.
    k = nki.jit(_matmul_dtypes_kernel(nl.float8_e4m3fn, nl.float8_e4m3fn))
    expect_error(k, "matmul-dtype", "float8_e4m3fn operands need NeuronCore-v4 (trn3)", z(1, 1))
    target("trn3")
    np.testing.assert_array_equal(k(z(1, 1)), 64.0)
    target("trn2")
    expect_error(k, "matmul-dtype", "float8_e4m3fn", z(1, 1))


def test_matmul_dtype_bf16_psum_result_needs_trn3(target):
    k = nki.jit(_matmul_dtypes_kernel(nl.bfloat16, nl.bfloat16, nl.bfloat16))
    expect_error(k, "matmul-dtype", "the PSUM result is bfloat16; the Tensor engine writes float32 on trn2", z(1, 1))
    target("gen4")  # AWS's alias for trn3
    np.testing.assert_array_equal(k(z(1, 1)), 64.0)


def test_matmul_dtype_e4m3fn_with_legacy_e4m3(target):
    target("trn3")
    expect_error(_matmul_dtypes_kernel(nl.float8_e4m3fn, nl.float8_e4m3), "matmul-dtype", "float8_e4m3", z(1, 1))


def test_transpose_limit_vector_engine():
    def k(x):
        t = nl.load(x)
        d = nl.ndarray((64, 33), nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(dst=d, data=t, engine=nisa.engine.vector)  # <-

    expect_error(k, "transpose-limit", "Vector engine's transpose of at most [32, 32]", z(33, 64))


def test_transpose_limit_tensor_engine():
    def k(x):
        t = nl.ndarray((128, 129), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        d = nl.ndarray((129, 128), nl.float32, buffer=nl.psum)  # <-
        nisa.nc_transpose(dst=d, data=t, engine=nisa.engine.tensor)

    # The [129, 128] PSUM destination is itself illegal, and declarations are checked first.
    expect_error(k, "partition-limit", "has 129 partitions", z(1, 1))

    def k2(x):
        t = nl.ndarray((128, 129), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        d = nl.ndarray((128, 129), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=d, data=t, engine=nisa.engine.tensor)  # <-

    expect_error(k2, "transpose-limit", "Tensor engine's transpose of at most [128, 128]", z(1, 1))


@pytest.mark.parametrize("axis,fragment", [(0, "the partition axis 0 is never reduced"),
                                           (1, "must be the trailing free axes")])
def test_reduce_axis(axis, fragment):
    def k(x):
        t = nl.load(x)
        d = nl.ndarray((16, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=d, op=nl.add, data=t, axis=axis)  # <-

    expect_error(k, "reduce-axis", fragment, z(16, 8, 4))


def test_bn_stats_free_size():
    def k(x):
        t = nl.load(x)
        st = nl.ndarray((128, 6), nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=st, data=t)  # <-

    expect_error(k, "bn-stats-free", "has 513 elements per partition; bn_stats takes at most 512", z(128, 513))


def test_dma_cannot_read_psum():
    def k(x):
        p = nl.ndarray((32, 32), nl.float32, buffer=nl.psum)
        nisa.memset(dst=p, value=0.0)
        o = nl.ndarray((32, 32), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=p)  # <-
        return o

    expect_error(k, "dma-psum", "source a tensor ([32, 32] in psum) is in PSUM; DMA cannot access PSUM", z(1, 1))


def test_dma_cannot_write_psum():
    def k(x):
        p = nl.ndarray((32, 32), nl.float32, buffer=nl.psum, name="acc")
        nisa.dma_copy(dst=p, src=x)  # <-

    expect_error(k, "dma-psum", "destination 'acc' ([32, 32] in psum) is in PSUM", z(32, 32))


# ---- kernel outputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("buffer", [nl.hbm, nl.private_hbm, nl.sbuf])
def test_kernel_output_must_be_shared_hbm(buffer):
    def k(x):
        o = nl.ndarray(x.shape, x.dtype, buffer=buffer)  # <-
        nisa.dma_copy(dst=o, src=x)
        return o

    expect_error(k, "kernel-output", "kernel outputs are allocated with nl.ndarray(..., buffer=nl.shared_hbm)",
                 z(8, 8))


def test_kernel_output_is_a_whole_tensor():
    def k(x):
        o = nl.ndarray((16, 8), x.dtype, buffer=nl.shared_hbm)  # <-
        nisa.dma_copy(dst=o[0:8, :], src=x)
        return o[0:8, :]

    expect_error(k, "kernel-output", "return the whole tensor", z(8, 8))


# ---- arguments ---------------------------------------------------------------------------------

def _add_kernel():
    def k(a, b):
        o = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(o, nl.add(nl.load(a), nl.load(b)))
        return o

    return k


def test_numpy_float64_is_rejected():
    with pytest.raises(TypeError, match="float64 cannot be passed to an NKI kernel; NKI has no 64-bit types"):
        nki.simulate(_add_kernel())(np.zeros((4, 4)), np.zeros((4, 4)))


def test_torch_int64_is_rejected():
    with pytest.raises(TypeError, match="torch.int64 cannot be passed to an NKI kernel"):
        nki.simulate(_add_kernel())(torch.zeros(4, 4, dtype=torch.int64), torch.zeros(4, 4, dtype=torch.int64))


def test_numpy_and_torch_cannot_be_mixed():
    with pytest.raises(TypeError, match="either numpy arrays or torch tensors, not both"):
        nki.simulate(_add_kernel())(np.zeros((4, 4), F32), torch.zeros(4, 4))


@pytest.mark.parametrize("devices", [("neuron:0", "neuron:1"), ("cpu", "neuron:0")])
def test_tensors_on_two_devices_are_rejected(devices):
    import torch_neuronx  # noqa: F401  (registers the neuron device)

    a, b = (torch.ones(4, 4, device=d) for d in devices)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*" + devices[0]):
        nki.simulate(_add_kernel())(a, b)


def test_unsupported_target_is_rejected(target):
    target("trn9")
    with pytest.raises(ValueError, match="NKI target 'trn9' .*is not supported"):
        nki.simulate(_add_kernel())(z(4, 4), z(4, 4))


def test_platform_target_argument_was_removed():
    with pytest.raises(TypeError, match="platform_target"):
        nki.jit(_add_kernel(), platform_target="trn2")


# ---- the trace cache -----------------------------------------------------------------------------

def _counting_kernel():
    calls = 0

    def k(x, scale):
        nonlocal calls
        calls += 1
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(o, nl.multiply(nl.load(x), scale))
        return o

    return nki.jit(k), lambda: calls


def test_same_signature_does_not_retrace():
    k, calls = _counting_kernel()
    a, b = np.ones((8, 4), F32), np.full((8, 4), 2.0, F32)
    np.testing.assert_array_equal(k(a, 3.0), 3.0)
    np.testing.assert_array_equal(k(b, 3.0), 6.0)  # new data, same program
    np.testing.assert_array_equal(k(torch.from_numpy(b), 3.0).numpy(), 6.0)  # same shapes/dtypes from torch
    assert calls() == 1


@pytest.mark.parametrize("change", ["shape", "dtype", "static argument", "target", "grid"])
def test_a_different_signature_retraces(change, target):
    k, calls = _counting_kernel()
    a = np.ones((8, 4), F32)
    k(a, 3.0)
    if change == "shape":
        np.testing.assert_array_equal(k(np.ones((16, 4), F32), 3.0), np.full((16, 4), 3.0))
    elif change == "dtype":
        r = k(torch.ones(8, 4, dtype=torch.bfloat16), 3.0)
        assert r.dtype == torch.bfloat16 and (r == 3.0).all()
    elif change == "static argument":
        np.testing.assert_array_equal(k(a, 5.0), 5.0)  # a stale trace would still multiply by 3
    elif change == "target":
        target("trn3")
        k(a, 3.0)
    else:
        k[2](a, 3.0)  # traces each of the two programs
    assert calls() == (3 if change == "grid" else 2)
    target("trn2")
    k(a, 3.0)  # the first signature is still cached
    assert calls() == (3 if change == "grid" else 2)


def test_a_rejected_kernel_is_not_cached():
    calls = 0

    @nki.jit
    def k(x):
        nonlocal calls
        calls += 1
        t = nl.load(x)  # <-
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(o, t)
        return o

    for _ in range(2):
        expect_error(k, "partition-limit", "has 200 partitions", z(200, 4))
    assert calls == 2


# ---- predicated copy, selection, accumulation, shuffles, gathers, DMA transpose ----------------

def test_tensor_copy_predicated_predicate_dtype():
    def k(x):
        d = nl.ndarray((8, 8), nl.float32, buffer=nl.sbuf)
        p = nl.ndarray((8, 8), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=p, value=1.0)
        nisa.tensor_copy_predicated(dst=d, src=1.0, predicate=p)  # <-

    expect_error(k, "dtype", "predicate", z(1, 1))


def test_tensor_copy_predicated_same_dtype():
    def k(x):
        d = nl.ndarray((8, 8), nl.float32, buffer=nl.sbuf)
        s = nl.zeros((8, 8), nl.bfloat16)
        p = nl.zeros((8, 8), nl.uint8)
        nisa.tensor_copy_predicated(dst=d, src=s, predicate=p)  # <-

    expect_error(k, "dtype", "copies without conversion", z(1, 1))


def test_tensor_copy_predicated_not_both_in_psum():
    def k(x):
        d = nl.ndarray((8, 8), nl.float32, buffer=nl.sbuf)
        s = nl.zeros((8, 8), nl.float32, buffer=nl.psum)
        p = nl.zeros((8, 8), nl.uint8, buffer=nl.psum)
        nisa.tensor_copy_predicated(dst=d, src=s, predicate=p)  # <-

    expect_error(k, "psum-operands", "at most one", z(1, 1))


def test_select_reduce_rules():
    def bad_pred(x):
        d = nl.ndarray((8, 8), nl.float32, buffer=nl.sbuf)
        p = nl.zeros((8, 8), nl.int32)
        nisa.select_reduce(dst=d, predicate=p, on_true=d, on_false=0.0)  # <-

    def bad_res(x):
        d = nl.zeros((8, 8), nl.float32)
        p = nl.zeros((8, 8), nl.uint8)
        r = nl.ndarray((8, 2), nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=d, predicate=p, on_true=d, on_false=0.0, reduce_res=r)  # <-

    def bad_op(x):
        d = nl.zeros((8, 8), nl.float32)
        p = nl.zeros((8, 8), nl.uint8)
        nisa.select_reduce(dst=d, predicate=p, on_true=d, on_false=0.0, reduce_op=nl.add)  # <-

    expect_error(bad_pred, "dtype", "predicate", z(1, 1))
    expect_error(bad_res, "shape-mismatch", "reduce_res", z(1, 1))
    expect_error(bad_op, "alu-op", "nl.maximum", z(1, 1))


def test_range_select_rules():
    def bad_cmp(x):
        d = nl.zeros((8, 8), nl.float32)
        b = nl.zeros((8, 1), nl.float32)
        nisa.range_select(dst=d, on_true_tile=d, comp_op0=nl.not_equal, comp_op1=nl.less, bound0=b, bound1=b)  # <-

    def bad_fill(x):
        d = nl.zeros((8, 8), nl.float32)
        b = nl.zeros((8, 1), nl.float32)
        nisa.range_select(dst=d, on_true_tile=d, comp_op0=nl.less, comp_op1=nl.less, bound0=b, bound1=b,  # <-
                          on_false_value=0.0)

    def bad_bound(x):
        d = nl.zeros((8, 8), nl.float32)
        b = nl.zeros((8, 1), nl.bfloat16)
        nisa.range_select(dst=d, on_true_tile=d, comp_op0=nl.less, comp_op1=nl.less, bound0=b, bound1=b)  # <-

    expect_error(bad_cmp, "alu-op", "comp_op0", z(1, 1))
    expect_error(bad_fill, "alu-op", "FP32_MIN", z(1, 1))
    expect_error(bad_bound, "dtype", "must be float32", z(1, 1))


def test_tensor_scalar_reduce_and_cumulative_operators():
    def bad_reduce(x):
        d = nl.zeros((8, 8), nl.float32)
        nisa.tensor_scalar_reduce(dst=d, data=d, op0=nl.add, operand0=1.0, reduce_op=nl.subtract)  # <-

    def bitwise(x):
        d = nl.zeros((8, 8), nl.int16)
        nisa.tensor_scalar_cumulative(dst=d, src=d, op0=nl.bitwise_and, op1=nl.add, imm0=1.0)  # <-

    def int32(x):
        d = nl.zeros((8, 8), nl.int32)
        nisa.tensor_scalar_cumulative(dst=d, src=d, op0=nl.add, op1=nl.add, imm0=1.0)  # <-

    expect_error(bad_reduce, "alu-op", "reduce_op", z(1, 1))
    expect_error(bitwise, "dtype", "arithmetic operators only", z(1, 1))
    expect_error(int32, "dtype", "8/16-bit integers", z(1, 1))


def test_exponential_and_activate2_need_trn3(target):
    def exp_kernel(x):
        d = nl.zeros((8, 8), nl.float32)
        nisa.exponential(dst=d, src=d)  # <-

    def act2_kernel(x):
        d = nl.zeros((8, 8), nl.float32)
        nisa.activate2(dst=d, op=nl.exp, data=d, imm0=1.0, imm1=0.0, op0=nl.multiply, op1=nl.add)  # <-

    expect_error(exp_kernel, "nc-version", "exponential needs NeuronCore-v4 (trn3)", z(1, 1))
    expect_error(act2_kernel, "nc-version", "activate2 needs NeuronCore-v4 (trn3)", z(1, 1))
    target("trn3")
    nki.simulate(exp_kernel)(z(1, 1))
    nki.simulate(act2_kernel)(z(1, 1))


def test_activate2_operator_pairs(target):
    target("trn3")

    def k(x):
        d = nl.zeros((8, 8), nl.float32)
        nisa.activate2(dst=d, op=nl.exp, data=d, imm0=1.0, imm1=0.0, op0=nl.add, op1=nl.add)  # <-

    expect_error(k, "alu-op", "(op0, op1) must be one of", z(1, 1))


def test_nc_match_replace8_shapes():
    def k(x):
        d = nl.zeros((8, 16), nl.float32)
        v = nl.zeros((8, 4), nl.float32)
        nisa.nc_match_replace8(dst=d, data=d, vals=v, imm=0.0)  # <-

    expect_error(k, "shape-mismatch", "vals", z(1, 1))


def test_nc_stream_shuffle_start_partition():
    def ok(x):
        d = nl.zeros((128, 4), nl.float32)
        nisa.nc_stream_shuffle(dst=d[64:96, :], src=d[32:64, :], shuffle_mask=list(range(32)))

    def bad(x):
        d = nl.zeros((128, 4), nl.float32)
        nisa.nc_stream_shuffle(dst=d[32:96, :], src=d[0:64, :], shuffle_mask=list(range(32)))  # <-

    nki.simulate(ok)(z(1, 1))
    expect_error(bad, "quadrant", "starts at partition 32; with 64 active partitions", z(1, 1))


def test_nc_stream_shuffle_mask_range():
    def k(x):
        d = nl.zeros((32, 4), nl.float32)
        nisa.nc_stream_shuffle(dst=d, src=d, shuffle_mask=[40] + list(range(1, 32)))  # <-

    expect_error(k, "shuffle-mask", "shuffle_mask[0] = 40", z(1, 1))


def test_dma_transpose_rules():
    def psum_dst(x):
        d = nl.ndarray((8, 16), nl.bfloat16, buffer=nl.psum)
        nisa.dma_transpose(dst=d, src=x)  # <-

    def wrong_shape(x):
        d = nl.ndarray((16, 16), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=x)  # <-

    def wrong_axes(x):
        d = nl.ndarray((8, 16), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=x, axes=(0, 1))  # <-

    def hwdge_fp32(x):
        s = nl.zeros((16, 8), nl.float32)
        d = nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=s, dge_mode=nisa.dge_mode.hwdge)  # <-

    def hwdge_rows(x):
        s = nl.zeros((32, 8), nl.bfloat16)
        d = nl.ndarray((8, 32), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=s, dge_mode=nisa.dge_mode.hwdge)  # <-

    x = torch.zeros(16, 8, dtype=torch.bfloat16)
    expect_error(psum_dst, "dma-transpose", "must be in SBUF", x)
    expect_error(wrong_shape, "dma-transpose", "permuted source shape [8, 16]", x)
    expect_error(wrong_axes, "dma-transpose", "must be (1, 0)", x)
    expect_error(hwdge_fp32, "dma-transpose", "2-byte", x)
    expect_error(hwdge_rows, "dma-transpose", "src.shape[0] == 16", x)


def test_gathers_are_gpsimd_and_typed():
    def n_gather_psum(x):
        d = nl.ndarray((8, 4), nl.float32, buffer=nl.psum)
        s = nl.zeros((8, 16), nl.float32)
        i = nl.zeros((8, 4), nl.uint32)
        nisa.nc_n_gather(dst=d, data=s, indices=i)  # <-

    def n_gather_idx(x):
        d = nl.ndarray((8, 4), nl.float32, buffer=nl.sbuf)
        s = nl.zeros((8, 16), nl.float32)
        i = nl.zeros((8, 4), nl.int32)
        nisa.nc_n_gather(dst=d, data=s, indices=i)  # <-

    def local_partitions(x):
        d = nl.ndarray((8, 4), nl.float32, buffer=nl.sbuf)
        s = nl.zeros((8, 16), nl.float32)
        i = nl.zeros((8, 4), nl.uint16)
        nisa.local_gather(dst=d, src_buffer=s, index=i)  # <-

    def local_elem(x):
        d = nl.ndarray((16, 12), nl.float32, buffer=nl.sbuf)
        s = nl.zeros((16, 64), nl.float32)
        i = nl.zeros((16, 1), nl.uint16)
        nisa.local_gather(dst=d, src_buffer=s, index=i, num_elem_per_idx=3, num_valid_indices=4)  # <-

    expect_error(n_gather_psum, "gpsimd-psum", "GpSimd", z(1, 1))
    expect_error(n_gather_idx, "dtype", "indices", z(1, 1))
    expect_error(local_partitions, "shape-mismatch", "multiple of 16", z(1, 1))
    expect_error(local_elem, "shape-mismatch", "num_elem_per_idx must be", z(1, 1))

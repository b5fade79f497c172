"""NKI run-time offsets (``ap(scalar_offset=/vector_offset=)``, ``select`` / ``vector_select``
with an SBUF index, ``dma_copy``'s ``oob_mode``), ``nl.shared_constant`` and
``nki.isa.constants``, against numpy; semantics from AWS's NKI access-pattern guide."""

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
import torch_neuronx  # noqa: F401  (the neuron device)

F32 = np.float32


def load_index(idx_hbm):
    """An int32 HBM tensor -> the same values in SBUF, where run-time offsets are read from."""
    s = nl.ndarray(idx_hbm.shape, nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=idx_hbm)
    return s


def table(rows, cols, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(F32)


# ---- scalar offsets -----------------------------------------------------------------------------

@nki.jit
def scalar_block(a, idx):
    """The guide's example: A[idx:idx+128, 0:256] of a (512, 512) A, idx read at run time."""
    i = load_index(idx)
    out = nl.ndarray((128, 256), a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a.ap(pattern=[[512, 128], [1, 256]], offset=0, scalar_offset=i, indirect_dim=0))
    return out


@pytest.mark.parametrize("start", [0, 3 * 128, 17, 384])
def test_scalar_offset_reads_the_rows_the_index_names(start):
    a = table(512, 512)
    got = nki.simulate(scalar_block)(a, np.array([[start]], np.int32))
    np.testing.assert_array_equal(got, a[start:start + 128, :256])


def test_one_trace_serves_every_index_value():
    a = table(512, 512, seed=1)
    scalar_block(a, np.array([[5]], np.int32))
    n = len(scalar_block._cache)
    for start in (0, 100, 384):
        np.testing.assert_array_equal(scalar_block(a, np.array([[start]], np.int32)), a[start:start + 128, :256])
    assert len(scalar_block._cache) == n  # the index is data, not part of the signature


@nki.jit
def select_batch(a, idx):
    i = load_index(idx)
    out = nl.ndarray(a.shape[1:], a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(src=a.select(0, i), dst=out)
    return out


def test_select_with_an_sbuf_index_picks_a_batch():
    a = np.random.default_rng(2).standard_normal((4, 128, 64)).astype(F32)
    for b in range(4):
        np.testing.assert_array_equal(nki.simulate(select_batch)(a, np.array([[b]], np.int32)), a[b])


@nki.jit
def indirect_dim_one(a, idx):
    """ap(indirect_dim=1): the offset counts columns of the base tensor."""
    i = load_index(idx)
    out = nl.ndarray((8, 16), a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a.ap(pattern=[[a.shape[1], 8], [1, 16]], offset=a.shape[1], scalar_offset=i,
                                    indirect_dim=1))
    return out


def test_indirect_dim_counts_elements_of_that_dimension():
    a = table(16, 64, seed=3)
    got = nki.simulate(indirect_dim_one)(a, np.array([[20]], np.int32))
    np.testing.assert_array_equal(got, a[1:9, 20:36])


@nki.jit
def scalar_offset_on_sbuf(x, idx):
    """A run-time column offset on an on-chip tile read by a compute instruction."""
    i = load_index(idx)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray((x.shape[0], 8), x.dtype, buffer=nl.sbuf)
    src = t.ap(pattern=[[x.shape[1], x.shape[0]], [1, 8]], offset=0, scalar_offset=i, indirect_dim=1)
    nisa.tensor_scalar(dst=r, data=src, op0=nl.multiply, operand0=2.0)
    out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_scalar_offset_on_an_sbuf_operand_of_a_compute_instruction():
    x = table(32, 64, seed=4)
    got = nki.simulate(scalar_offset_on_sbuf)(x, np.array([[40]], np.int32))
    np.testing.assert_array_equal(got, x[:, 40:48] * F32(2))


# ---- vector offsets: gather and scatter ------------------------------------------------------------

@nki.jit
def gather_rows(a, idx):
    i = load_index(idx)
    n = idx.shape[0]
    t = nl.ndarray((n, a.shape[1]), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.vector_select(0, i))
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def gather_rows_ap(a, idx):
    """The guide's form: a.ap([[row, n], [1, row]], 0, vector_offset=idx, indirect_dim=0)."""
    i = load_index(idx)
    n, row = idx.shape[0], a.shape[1]
    t = nl.ndarray((n, row), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=a.ap([[row, n], [1, row]], 0, vector_offset=i, indirect_dim=0), dst=t)
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("kernel", [gather_rows, gather_rows_ap])
def test_vector_offset_gathers_one_row_per_partition(kernel):
    # An embedding lookup: more tokens than table rows, repeats, any order.
    emb = table(32, 48, seed=5)
    tokens = np.random.default_rng(6).integers(0, 32, size=(100, 1)).astype(np.int32)
    np.testing.assert_array_equal(nki.simulate(kernel)(emb, tokens), emb[tokens[:, 0]])


def test_gather_on_neuron_tensors():
    emb = torch.randn(32, 48)
    tokens = torch.randint(0, 32, (64, 1), dtype=torch.int32)
    got = gather_rows(emb.to("neuron"), tokens.to("neuron"))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), emb[tokens[:, 0].long()], rtol=0, atol=0)


@nki.jit
def scatter_rows(base, src, idx, skip):
    """out = base, then out[idx[p]] = src[p] by a vector-offset DMA destination."""
    i = load_index(idx)
    out = nl.ndarray(base.shape, base.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=base)
    t = nl.ndarray(src.shape, src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    n, row = src.shape
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    nisa.dma_copy(dst=out.ap([[row, n], [1, row]], 0, vector_offset=i, indirect_dim=0), src=t, oob_mode=mode)
    return out


def test_vector_offset_destination_scatters_rows():
    base, src = table(40, 24, seed=7), table(16, 24, seed=8)
    idx = np.random.default_rng(9).permutation(40)[:16].reshape(16, 1).astype(np.int32)
    want = base.copy()
    want[idx[:, 0]] = src
    np.testing.assert_array_equal(nki.simulate(scatter_rows)(base, src, idx, False), want)


def test_out_of_bounds_offset_raises_naming_the_fix():
    base, src = table(40, 24), table(4, 24, seed=1)
    idx = np.array([[1], [2], [40], [3]], np.int32)
    with pytest.raises(IndexError, match=r"run-time offset 40 .*oob_mode.skip"):
        nki.simulate(scatter_rows)(base, src, idx, False)
    with pytest.raises(IndexError, match="run-time offset"):
        nki.simulate(scalar_block)(table(512, 512), np.array([[385]], np.int32))


def test_oob_mode_skip_drops_only_the_rows_outside():
    base, src = table(40, 24, seed=2), table(4, 24, seed=3)
    idx = np.array([[1], [-1], [40], [3]], np.int32)
    want = base.copy()
    want[1], want[3] = src[0], src[3]
    np.testing.assert_array_equal(nki.simulate(scatter_rows)(base, src, idx, True), want)


# ---- the verifier's rules for run-time offsets ----------------------------------------------------

def test_index_must_be_in_sbuf():
    @nki.jit
    def k(a, idx):
        out = nl.ndarray((128, 256), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a.ap([[512, 128], [1, 256]], 0, scalar_offset=idx, indirect_dim=0))
        return out

    with pytest.raises(ValueError, match="must be an SBUF tensor"):
        nki.simulate(k)(table(512, 512), np.zeros((1, 1), np.int32))


def test_float_index_is_refused():
    @nki.jit
    def k(a, idx):
        i = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        out = nl.ndarray((128, 256), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a.ap([[512, 128], [1, 256]], 0, scalar_offset=i, indirect_dim=0))
        return out

    with pytest.raises(TypeError, match="int32"):
        nki.simulate(k)(table(512, 512), np.zeros((1, 1), F32))


def test_vector_offset_needs_as_many_rows_on_the_other_side():
    @nki.jit
    def k(a, idx):
        i = load_index(idx)
        t = nl.ndarray((4, 96), a.dtype, buffer=nl.sbuf)  # as many elements, but 4 rows
        nisa.dma_copy(dst=t, src=a.ap([[48, 8], [1, 48]], 0, vector_offset=i, indirect_dim=0))

    with pytest.raises(nki.NkiValidationError, match=r"\[dynamic-offset\].*8 offsets") as e:
        nki.simulate(k)(table(32, 48), np.zeros((8, 1), np.int32))
    assert e.value.rule == "dynamic-offset"


def test_vector_offset_outside_a_dma_is_refused():
    @nki.jit
    def k(a, idx):
        i = load_index(idx)
        t = nl.ndarray((8, 48), a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=a.vector_select(0, i))

    with pytest.raises(nki.NkiValidationError, match="DMA feature"):
        nki.simulate(k)(table(32, 48), np.zeros((8, 1), np.int32))


def test_index_views_cannot_be_chained_or_resliced():
    @nki.jit
    def chained(a, idx):
        i = load_index(idx)
        a.select(0, i).select(0, i)

    with pytest.raises(ValueError, match="only one is allowed"):
        nki.simulate(chained)(np.zeros((4, 4, 4), F32), np.zeros((1, 1), np.int32))

    @nki.jit
    def resliced(a, idx):
        i = load_index(idx)
        a.vector_select(0, i)[0:2]

    with pytest.raises(ValueError, match="cannot be sliced"):
        nki.simulate(resliced)(np.zeros((8, 4), F32), np.zeros((4, 1), np.int32))


# ---- nl.shared_constant, nki.isa.constants ---------------------------------------------------------

@nki.jit
def add_constant(x, path):
    c = nl.shared_constant(path)
    a = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=c)
    nisa.dma_copy(dst=b, src=x)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=c, src=a)  # a kernel may write its constant; the next run starts from the file again
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)
    return out


def test_shared_constant_from_a_npy_file(tmp_path):
    const = np.arange(24, dtype=F32).reshape(4, 6)
    path = tmp_path / "c.npy"
    np.save(path, const)
    x = table(4, 6)
    for _ in range(2):
        np.testing.assert_array_equal(nki.simulate(add_constant)(x, str(path)), const + x)
    got = add_constant(torch.from_numpy(x).to("neuron"), str(path))
    torch.testing.assert_close(got.cpu(), torch.from_numpy(const + x), rtol=0, atol=0)


def test_shared_constant_from_an_array_in_every_spmd_program():
    const = np.random.default_rng(0).standard_normal((2, 8)).astype(F32)

    @nki.jit
    def k(x):
        c = nl.shared_constant(const)
        pid = nl.program_id(0)
        t = nl.ndarray((1, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=c[pid:pid + 1, :])
        nisa.dma_copy(dst=x[pid:pid + 1, :], src=t)
        return x

    x = np.zeros((2, 8), F32)
    np.testing.assert_array_equal(nki.simulate(k[2])(x), const)


def test_shared_constant_bad_input():
    @nki.jit
    def k(x, c):
        nl.shared_constant(c)

    with pytest.raises(TypeError, match="64-bit"):
        nki.simulate(k)(np.zeros((1, 1), F32), np.zeros(3))  # float64
    with pytest.raises(ValueError, match="cannot load"):
        nki.simulate(k)(np.zeros((1, 1), F32), "/nonexistent/c.npy")


def test_isa_constants_module_is_the_isa_enums():
    from nki.isa import constants
    from nki.isa.constants import dge_mode, matmul_perf_mode, oob_mode

    assert oob_mode is nisa.oob_mode and dge_mode is nisa.dge_mode and matmul_perf_mode is nisa.matmul_perf_mode
    assert constants.engine.vector is nisa.engine.vector


def test_float8_e4m3_output_reaches_torch_as_e4m3fn():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, nl.float8_e4m3, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    x = torch.tensor([[0.5, -1.25, 3.0, 224.0]])
    got = k(x.to("neuron"))
    assert got.dtype == torch.float8_e4m3fn
    torch.testing.assert_close(got.cpu().float(), x, rtol=0, atol=0)


# ---- dma_compute ------------------------------------------------------------------------------------

def test_dma_compute_adds_sources_in_fp32_and_rounds_once():
    a, b, c = table(8, 16, seed=10), table(8, 16, seed=11), table(8, 16, seed=12)

    @nki.jit
    def k(a, b, c):
        t = nl.ndarray(b.shape, b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=b)
        out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=out, srcs=[a, t, c], reduce_op=nl.add)  # HBM and SBUF sources
        return out

    got = k(torch.from_numpy(a).to("neuron"), torch.from_numpy(b).to("neuron"), torch.from_numpy(c).to("neuron"))
    want = ((torch.from_numpy(a) + torch.from_numpy(b)) + torch.from_numpy(c)).to(torch.bfloat16)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@nki.jit
def scatter_add(base, src, idx):
    """out = base; out[idx[p]] += src[p] (read-modify-write through a vector offset)."""
    i = load_index(idx)
    out = nl.ndarray(base.shape, base.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=base)
    t = nl.ndarray(src.shape, src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    rows = out.vector_select(0, i)
    nisa.dma_compute(dst=rows, srcs=[rows, t], reduce_op=nl.add)
    return out


def test_dma_compute_scatter_read_modify_write():
    base, src = table(20, 8, seed=13), table(6, 8, seed=14)
    idx = np.array([[3], [0], [19], [7], [12], [5]], np.int32)
    want = base.copy()
    want[idx[:, 0]] += src
    np.testing.assert_array_equal(nki.simulate(scatter_add)(base, src, idx), want)


@nki.jit
def gather_add(acc, tab, idx):
    """acc (SBUF) += tab[idx[p]]."""
    i = load_index(idx)
    t = nl.ndarray(acc.shape, acc.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=acc)
    nisa.dma_compute(dst=t, srcs=[t, tab.vector_select(0, i)], reduce_op=nl.add)
    out = nl.ndarray(acc.shape, acc.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_dma_compute_gather_read_modify_write():
    acc, tab = table(5, 8, seed=15), table(30, 8, seed=16)
    idx = np.array([[29], [0], [4], [4], [17]], np.int32)
    np.testing.assert_array_equal(nki.simulate(gather_add)(acc, tab, idx), acc + tab[idx[:, 0]])


def test_dma_compute_takes_add_with_unit_scales_only():
    @nki.jit
    def k(a, scales, op):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=out, srcs=[a, a], reduce_op=op, scales=scales)
        return out

    a = table(2, 4)
    np.testing.assert_array_equal(nki.simulate(k)(a, (1.0, 1.0), nl.add), a + a)
    with pytest.raises(nki.NkiValidationError, match="scales"):
        nki.simulate(k)(a, (2.0, 1.0), nl.add)
    with pytest.raises(nki.NkiValidationError, match="reduce_op must be nl.add"):
        nki.simulate(k)(a, None, nl.maximum)


# ---- view(dtype) / ap(dtype=): the same bytes as another dtype ------------------------------------------

def test_view_of_an_hbm_argument_reads_its_bytes():
    x = table(4, 8, seed=20)

    @nki.jit
    def k(x):
        u = nl.ndarray((4, 32), nl.uint8, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=x.view(nl.uint8))
        out = nl.ndarray(u.shape, u.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(x), x.view(np.uint8))


def test_view_contracts_and_expands_on_chip_tiles():
    x = torch.randint(-2**31, 2**31 - 1, (16, 12), dtype=torch.int32)

    @nki.jit
    def k(x):
        t = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        as_bf16 = nl.ndarray((16, 8), nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=as_bf16, src=t[:, 2:6].view(nl.bfloat16))  # a column slice, 2x expansion
        back = nl.ndarray((16, 2), nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=back, src=as_bf16[:, 4:8].view(nl.int32))  # 2x contraction
        o1 = nl.ndarray(as_bf16.shape, nl.bfloat16, buffer=nl.shared_hbm)
        o2 = nl.ndarray(back.shape, nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=as_bf16)
        nisa.dma_copy(dst=o2, src=back)
        return o1, o2

    o1, o2 = k(x.to("neuron"))
    torch.testing.assert_close(o1.cpu().view(torch.int16), x[:, 2:6].contiguous().view(torch.int16), rtol=0, atol=0)
    torch.testing.assert_close(o2.cpu(), x[:, 4:6], rtol=0, atol=0)


def test_ap_with_dtype_from_the_guide():
    x = torch.randint(-2**31, 2**31 - 1, (128, 256), dtype=torch.int32)

    @nki.jit
    def k(x):
        t = nl.ndarray((128, 256), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        cast = t.ap(pattern=[[512, 128], [1, 512]], offset=0, dtype=nl.bfloat16)  # (128, 512) bf16
        out = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=cast)
        return out

    got = k(x.to("neuron")).cpu()
    torch.testing.assert_close(got.view(torch.int16), x.view(torch.int16), rtol=0, atol=0)


def test_writes_through_a_view_change_the_tensor():
    @nki.jit
    def k(x):
        t = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t.view(nl.int32), value=0x3F800000)  # the bits of 1.0f
        out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(np.zeros((1, 1), F32)), np.ones((2, 4), F32))


def test_view_needs_a_contiguous_aligned_last_dimension():
    @nki.jit
    def strided(x):
        t = nl.ndarray((2, 8), nl.uint8, buffer=nl.sbuf)
        t[:, 0:8:2].view(nl.float32)

    @nki.jit
    def misaligned(x):
        t = nl.ndarray((2, 8), nl.uint8, buffer=nl.sbuf)
        t[:, 1:5].view(nl.float32)

    with pytest.raises(ValueError, match="contiguous"):
        nki.simulate(strided)(np.zeros((1, 1), F32))
    with pytest.raises(ValueError, match="boundaries"):
        nki.simulate(misaligned)(np.zeros((1, 1), F32))


# ---- indirect dma_transpose (dge_mode=swdge) --------------------------------------------------------------

def test_indirect_dma_transpose_gathers_rows_then_transposes():
    # AWS's block-KV attention: the K blocks named at run time, loaded transposed (4-D, axes (3, 1, 2, 0)).
    blocks, block_len, d_head, n = 10, 4, 16, 8
    cache = np.random.default_rng(30).standard_normal((blocks, 1, block_len, d_head)).astype(np.float16)
    active = np.array([[7], [0], [3], [3], [9], [1], [5], [2]], np.int32)

    @nki.jit
    def k(cache, idx):
        i = load_index(idx)
        d = nl.ndarray((d_head, 1, block_len, n), nl.float16, buffer=nl.sbuf)
        src = cache.ap([[block_len * d_head, n], [1, 1], [d_head, block_len], [1, d_head]], offset=0,
                       vector_offset=i, indirect_dim=0)
        nisa.dma_transpose(dst=d, src=src, axes=(3, 1, 2, 0), dge_mode=nisa.dge_mode.swdge)
        out = nl.ndarray(d.shape, d.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(cache, active), cache[active[:, 0]].transpose(3, 1, 2, 0))


def test_indirect_dma_transpose_2d_and_its_rules():
    tab = np.random.default_rng(31).standard_normal((20, 12)).astype(np.float16)
    idx = np.array([[19], [4], [4], [0], [11]], np.int32)

    @nki.jit
    def k(tab, idx, mode):
        i = load_index(idx)
        d = nl.ndarray((12, 5), nl.float16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=tab.vector_select(0, i), dge_mode=mode)
        out = nl.ndarray(d.shape, d.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(tab, idx, nisa.dge_mode.swdge), tab[idx[:, 0]].T)
    with pytest.raises(nki.NkiValidationError, match="swdge"):
        nki.simulate(k)(tab, idx, nisa.dge_mode.unknown)
    with pytest.raises(IndexError, match="run-time offset 20"):
        nki.simulate(k)(tab, np.array([[1], [2], [20], [0], [3]], np.int32), nisa.dge_mode.swdge)

    @nki.jit
    def direct_swdge(tab):
        d = nl.ndarray((12, 20), nl.float16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=d, src=tab, dge_mode=nisa.dge_mode.swdge)

    with pytest.raises(nki.NkiValidationError, match="indirect form"):
        nki.simulate(direct_swdge)(tab)

"""NKI kernels shipped with torch-neuronx: tiled matmul, row softmax, RMSNorm, flash attention
(forward and backward). Written in AWS's NKI (0.2+ style), so they run on the simulated
NeuronCore here and on a real one; the PyTorch operators around them are in ``ops.py``."""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl
from nki._trace import itemsize

# Tile sizes are the target chip's (nl.tile_size, from the platform model), read while tracing.
NEG_BIG = -3.0e38  # "minus infinity" that stays finite: exp(NEG_BIG - m) == 0 without inf - inf


def _mm_dtype(dtype):
    """Matmul operands pair fp32 with fp32 only; anything narrower multiplies as bf16."""
    return nl.float32 if dtype in (nl.float32, nl.tfloat32) else dtype


B_RESIDENT_BYTES = 96 * 1024  # per partition: b stays in SBUF when it fits in this much


@nki.jit
def matmul_kernel(a, b):
    """``a @ b`` for a [M, K], b [K, N]: stationary tiles of a.T (128 x 128: pmax contraction
    rows by gemm_stationary_fmax columns), moving tiles of b gemm_moving_fmax (512) wide, K
    accumulated in PSUM. When b fits in SBUF it is loaded once and every row block of a is loaded
    once; otherwise each column block of b is loaded once and the a.T tiles are reloaded per
    column block."""
    M, K = a.shape
    _, N = b.shape
    P, TILE_M, TILE_N = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((M, N), dtype=a.dtype, buffer=nl.shared_hbm)
    n_k = (K + P - 1) // P
    # NeuronCore-v2 has no DMA transpose (a strided load would move one element per descriptor): there
    # a.T is made on TensorE from row-major tiles, as AWS's compiler does; v3+ transposes while loading.
    dma_transpose = nisa.get_nc_version() >= nisa.nc_version.gen3
    # SBUF per partition: a row block of a.T (and on v2 its row-major copy), one column block of b
    # over every K tile, and a few KiB for the result tile. A long K narrows the column blocks.
    a_bytes = n_k * TILE_M * itemsize(a.dtype) * (1 if dma_transpose else 2)
    b_budget = nl.tile_size.total_available_sbuf_size - a_bytes - 4 * TILE_N * 4
    b_bytes = n_k * itemsize(b.dtype)  # per column of a column block
    if b_budget < 64 * b_bytes:
        raise ValueError(f"matmul_kernel: K = {K} is too long to keep a row block of a.T and a column block of b "
                         f"in SBUF; split K into parts and add their products")
    tile_n = TILE_N if TILE_N * b_bytes <= b_budget else b_budget // b_bytes // 64 * 64
    col_blocks = [(n0, min(tile_n, N - n0)) for n0 in range(0, N, tile_n)]
    k_rows = [min(P, K - kt * P) for kt in range(n_k)]
    # load_a / load_b return a block's K tiles as views, made once: block() reuses them for every
    # row or column block, which keeps tracing a large product fast.

    def load_b(n0, n):
        b_t = nl.ndarray((P, n_k, n), dtype=b.dtype, buffer=nl.sbuf)
        tiles = [b_t[0:k, kt, 0:n] for kt, k in enumerate(k_rows)]
        for kt, k in enumerate(k_rows):
            nisa.dma_copy(dst=tiles[kt], src=b[kt * P:kt * P + k, n0:n0 + n])
        return tiles

    def load_a(m0, m):
        a_t = nl.ndarray((P, n_k, m), dtype=a.dtype, buffer=nl.sbuf)
        tiles = [a_t[0:k, kt, 0:m] for kt, k in enumerate(k_rows)]
        if dma_transpose:
            # Whole K tiles in one transposing DMA (a decode row's 128 tiny loads would each pay a
            # DMA's fixed cost), the ragged last tile on its own.
            full = K // P
            if full:
                src = a.ap([[1, P], [P, full], [K, m]], offset=m0 * K)  # [p, kt, i] = a[m0 + i, kt * P + p]
                nisa.dma_copy(dst=a_t[0:P, 0:full, 0:m], src=src)
            if full < n_k:
                nisa.dma_copy(dst=tiles[full], src=a[m0:m0 + m, full * P:K].permute((1, 0)))
            return tiles
        rows = nl.ndarray((m, K), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=a[m0:m0 + m, 0:K])
        for kt, k in enumerate(k_rows):
            t = nl.ndarray((k, m), dtype=a.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=t, data=rows[0:m, kt * P:kt * P + k])
            nisa.tensor_copy(dst=tiles[kt], src=t)
        return tiles

    def block(a_tiles, b_tiles, m0, m, n0, n):
        acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
        for a_kt, b_kt in zip(a_tiles, b_tiles):
            nisa.nc_matmul(dst=acc, stationary=a_kt, moving=b_kt)
        res = nl.ndarray((m, n), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[m0:m0 + m, n0:n0 + n], src=res)

    if n_k * N * itemsize(b.dtype) <= min(B_RESIDENT_BYTES, b_budget):
        b_blocks = [load_b(n0, n) for n0, n in col_blocks]
        for m0 in range(0, M, TILE_M):
            m = min(TILE_M, M - m0)
            a_tiles = load_a(m0, m)
            for (n0, n), b_tiles in zip(col_blocks, b_blocks):
                block(a_tiles, b_tiles, m0, m, n0, n)
    else:
        for n0, n in col_blocks:
            b_tiles = load_b(n0, n)
            for m0 in range(0, M, TILE_M):
                m = min(TILE_M, M - m0)
                block(load_a(m0, m), b_tiles, m0, m, n0, n)
    return out


@nki.jit
def softmax_kernel(x):
    """Softmax over the last axis of x [R, C], in fp32, 128 rows (one per partition) at a time."""
    R, C = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        p = min(P, R - r0)
        t = nl.ndarray((p, C), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + p, :])
        neg_max = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=t, axis=1, negate=True)
        e = nl.ndarray((p, C), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, bias=neg_max, reduce_op=nl.add, reduce_res=total,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=total)
        y = nl.ndarray((p, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[r0:r0 + p, :], src=y)
    return out


@nki.jit
def rmsnorm_kernel(x, w, eps):
    """``x / sqrt(mean(x**2, -1) + eps) * w`` for x [R, D], w [D]."""
    R, D = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((R, D), dtype=x.dtype, buffer=nl.shared_hbm)
    w_row = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_row, src=w.reshape((1, D)))
    w_all = nl.broadcast_to(w_row, (P, D))  # the weight on every partition
    for r0 in range(0, R, P):
        p = min(P, R - r0)
        t = nl.ndarray((p, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + p, :])
        sq = nl.ndarray((p, D), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=t, reduce_op=nl.add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rinv = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rinv, data=ss, op0=nl.multiply, operand0=1.0 / D, op1=nl.add, operand1=float(eps))
        nisa.activation(dst=rinv, op=nl.rsqrt, data=rinv)
        normed = nl.ndarray((p, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=normed, data=t, op0=nl.multiply, operand0=rinv)
        y = nl.ndarray((p, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=normed, data2=w_all[0:p, :], op=nl.multiply)
        nisa.dma_copy(dst=out[r0:r0 + p, :], src=y)
    return out


def _load_t(src, rows, dtype, name=""):
    """HBM rows [n, D] -> SBUF [D, n] (the contraction dimension on partitions)."""
    n, d = rows
    t = nl.ndarray((d, n), dtype=dtype, buffer=nl.sbuf, name=name)
    if nisa.get_nc_version() >= nisa.nc_version.gen3:
        nisa.dma_copy(dst=t, src=src.permute((1, 0)))
        return t
    # NeuronCore-v2: no DMA transpose; rows in, transposed on TensorE (as in matmul_kernel's load_a).
    r = _load(src, (n, d), dtype)
    p = nl.ndarray((d, n), dtype=dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=p, data=r)
    nisa.tensor_copy(dst=t, src=p)
    return t


def _load(src, shape, dtype, name=""):
    t = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf, name=name)
    nisa.dma_copy(dst=t, src=src)
    return t


def _attention_tile():
    """Queries and keys per block: the stationary q.T block's columns and the partitions the
    probabilities transpose onto (both 128)."""
    return min(nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax)


def _scores(q_t, k_t, m, n, q0, k0, scale, causal):
    """scale * q @ k.T for a [m, n] block, fp32 in SBUF, causally masked when the block
    reaches above the diagonal (key k0 + j visible to query q0 + i iff k0 + j <= q0 + i)."""
    s_ps = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps, stationary=q_t, moving=k_t)
    s = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=s, op=nl.copy, data=s_ps, scale=float(scale))
    if causal and k0 + n - 1 > q0:
        nisa.affine_select(dst=s, pattern=[[-1, n]], channel_multiplier=1, on_true_tile=s,
                           on_false_value=NEG_BIG, cmp_op=nl.greater_equal, offset=q0 - k0)
    return s


@nki.jit
def flash_attention_fwd_kernel(q, k, v, scale, causal):
    """Attention over q [BH, S, D], k/v [BH, Sk, D] (D <= 128) with online softmax, 128 queries
    by 128 keys at a time. Returns o [BH, S, D] and the log-sum-exp [BH, S] (fp32)."""
    BH, S, D = q.shape
    Sk = k.shape[1]
    P = _attention_tile()
    mm = _mm_dtype(q.dtype)
    o = nl.ndarray((BH, S, D), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((BH, S), dtype=nl.float32, buffer=nl.shared_hbm)
    for b in range(BH):
        for q0 in range(0, S, P):
            m = min(P, S - q0)
            q_t = _load_t(q[b, q0:q0 + m, :], (m, D), mm)
            run_max = nl.full((m, 1), NEG_BIG, nl.float32)
            run_sum = nl.zeros((m, 1), nl.float32)
            acc = nl.zeros((m, D), nl.float32)
            kv_end = min(Sk, q0 + m) if causal else Sk
            for k0 in range(0, kv_end, P):
                n = min(P, kv_end - k0)
                k_t = _load_t(k[b, k0:k0 + n, :], (n, D), mm)
                v_t = _load(v[b, k0:k0 + n, :], (n, D), mm)
                s = _scores(q_t, k_t, m, n, q0, k0, scale, causal)
                blk_max = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=blk_max, op=nl.maximum, data=s, axis=1)
                new_max = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=new_max, data1=run_max, data2=blk_max, op=nl.maximum)
                neg_max = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=neg_max, data=new_max, op0=nl.multiply, operand0=-1.0)
                p = nl.ndarray((m, n), dtype=mm, buffer=nl.sbuf)
                p_sum = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_max, reduce_op=nl.add, reduce_res=p_sum,
                                reduce_cmd=nisa.reduce_cmd.reset_reduce)
                corr = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=corr, op=nl.exp, data=run_max, bias=neg_max)
                nisa.scalar_tensor_tensor(dst=run_sum, data=run_sum, op0=nl.multiply, operand0=corr, op1=nl.add,
                                          operand1=p_sum)
                nisa.tensor_copy(dst=run_max, src=new_max)
                # P @ V contracts over keys: P.T on the partitions.
                p_tp = nl.ndarray((n, m), dtype=mm, buffer=nl.psum)
                nisa.nc_transpose(dst=p_tp, data=p)
                p_t = nl.ndarray((n, m), dtype=mm, buffer=nl.sbuf)
                nisa.tensor_copy(dst=p_t, src=p_tp)
                pv = nl.ndarray((m, D), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=pv, stationary=p_t, moving=v_t)
                nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=corr, op1=nl.add, operand1=pv)
            inv = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.reciprocal(dst=inv, data=run_sum)
            o_t = nl.ndarray((m, D), dtype=q.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=o_t, data=acc, op0=nl.multiply, operand0=inv)
            nisa.dma_copy(dst=o[b, q0:q0 + m, :], src=o_t)
            lse_t = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=lse_t, op=nl.log, data=run_sum)
            nisa.tensor_tensor(dst=lse_t, data1=lse_t, data2=run_max, op=nl.add)
            nisa.dma_copy(dst=lse[b, q0:q0 + m], src=lse_t)
    return o, lse


def _probs_and_dscores(q_t, k_t, v_t, do_t, o_rows, do_rows, lse_rows, m, n, D, q0, k0, scale, causal, mm):
    """Recomputes P = exp(S - lse) and dS = P * (dO @ V.T - rowsum(dO * O)) for one block."""
    s = _scores(q_t, k_t, m, n, q0, k0, scale, causal)
    neg_lse = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_lse, data=lse_rows, op0=nl.multiply, operand0=-1.0)
    p = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_lse)
    dp = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=dp, stationary=do_t, moving=v_t)
    prod = nl.ndarray((m, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=do_rows, data2=o_rows, op=nl.multiply)
    di = nl.ndarray((m, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=di, op=nl.add, data=prod, axis=1)
    ds = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ds, data=dp, op0=nl.subtract, operand0=di)
    ds_mm = nl.ndarray((m, n), dtype=mm, buffer=nl.sbuf)  # scale folded in: dS feeds dQ and dK
    nisa.scalar_tensor_tensor(dst=ds_mm, data=ds, op0=nl.multiply, operand0=float(scale), op1=nl.multiply,
                              operand1=p)
    p_mm = nl.ndarray((m, n), dtype=mm, buffer=nl.sbuf)
    nisa.tensor_copy(dst=p_mm, src=p)
    return p_mm, ds_mm


@nki.jit
def flash_attention_bwd_kernel(q, k, v, o, do, lse, scale, causal):
    """Gradients of flash_attention_fwd_kernel: dK and dV accumulate in PSUM over query tiles
    (keys outer); dQ in a second pass accumulates over key tiles (queries outer)."""
    BH, S, D = q.shape
    Sk = k.shape[1]
    P = _attention_tile()
    mm = _mm_dtype(q.dtype)
    dq = nl.ndarray((BH, S, D), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((BH, Sk, D), dtype=k.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((BH, Sk, D), dtype=v.dtype, buffer=nl.shared_hbm)
    for b in range(BH):
        for k0 in range(0, Sk, P):
            n = min(P, Sk - k0)
            k_t = _load_t(k[b, k0:k0 + n, :], (n, D), mm)
            v_t = _load_t(v[b, k0:k0 + n, :], (n, D), mm)
            dk_ps = nl.ndarray((n, D), dtype=nl.float32, buffer=nl.psum)
            dv_ps = nl.ndarray((n, D), dtype=nl.float32, buffer=nl.psum)
            for q0 in range((k0 // P) * P if causal else 0, S, P):
                m = min(P, S - q0)
                q_t = _load_t(q[b, q0:q0 + m, :], (m, D), mm)
                do_t = _load_t(do[b, q0:q0 + m, :], (m, D), mm)
                q_rows = _load(q[b, q0:q0 + m, :], (m, D), mm)
                do_rows = _load(do[b, q0:q0 + m, :], (m, D), mm)
                o_rows = _load(o[b, q0:q0 + m, :], (m, D), nl.float32)
                do_f32 = _load(do[b, q0:q0 + m, :], (m, D), nl.float32)
                lse_rows = _load(lse[b, q0:q0 + m], (m, 1), nl.float32)
                p_mm, ds_mm = _probs_and_dscores(q_t, k_t, v_t, do_t, o_rows, do_f32, lse_rows, m, n, D, q0, k0,
                                                 scale, causal, mm)
                nisa.nc_matmul(dst=dv_ps, stationary=p_mm, moving=do_rows)  # P.T @ dO
                nisa.nc_matmul(dst=dk_ps, stationary=ds_mm, moving=q_rows)  # dS.T @ Q
            for acc, dst in ((dk_ps, dk), (dv_ps, dv)):
                t = nl.ndarray((n, D), dtype=dst.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=t, src=acc)
                nisa.dma_copy(dst=dst[b, k0:k0 + n, :], src=t)
        for q0 in range(0, S, P):
            m = min(P, S - q0)
            q_t = _load_t(q[b, q0:q0 + m, :], (m, D), mm)
            do_t = _load_t(do[b, q0:q0 + m, :], (m, D), mm)
            o_rows = _load(o[b, q0:q0 + m, :], (m, D), nl.float32)
            do_f32 = _load(do[b, q0:q0 + m, :], (m, D), nl.float32)
            lse_rows = _load(lse[b, q0:q0 + m], (m, 1), nl.float32)
            dq_ps = nl.ndarray((m, D), dtype=nl.float32, buffer=nl.psum)
            kv_end = min(Sk, q0 + m) if causal else Sk
            for k0 in range(0, kv_end, P):
                n = min(P, kv_end - k0)
                k_t = _load_t(k[b, k0:k0 + n, :], (n, D), mm)
                v_t = _load_t(v[b, k0:k0 + n, :], (n, D), mm)
                k_rows = _load(k[b, k0:k0 + n, :], (n, D), mm)
                _, ds_mm = _probs_and_dscores(q_t, k_t, v_t, do_t, o_rows, do_f32, lse_rows, m, n, D, q0, k0,
                                              scale, causal, mm)
                ds_tp = nl.ndarray((n, m), dtype=mm, buffer=nl.psum)
                nisa.nc_transpose(dst=ds_tp, data=ds_mm)
                ds_t = nl.ndarray((n, m), dtype=mm, buffer=nl.sbuf)
                nisa.tensor_copy(dst=ds_t, src=ds_tp)
                nisa.nc_matmul(dst=dq_ps, stationary=ds_t, moving=k_rows)  # dS @ K
            t = nl.ndarray((m, D), dtype=dq.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=t, src=dq_ps)
            nisa.dma_copy(dst=dq[b, q0:q0 + m, :], src=t)
    return dq, dk, dv

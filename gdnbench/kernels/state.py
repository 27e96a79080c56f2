"""Inter-chunk state recurrence.

One program owns a [K, BV] column slab of one (sequence, value head) state and
walks the sequence's chunks in order, keeping the slab in registers as up to four
fp32 pieces of PIECE rows (h1..h4; pieces past K are compiled out).  Per chunk
(decays in log2 units, c = g_cs):

    h_chunk  <- h                                   (stored for the output kernel)
    v_new     = u - w h                             (stored for the output kernel)
    h         = exp2(c_last) h + k^T (exp2(c_last - c) * v_new)

PER_CHANNEL (KDA) is the same walk with per-channel gates: ``k`` is kg = k *
exp2(c_last - c) per element from the w/u kernel, with as many heads as v (and k's
rstd folded in under fused_qk), and each state row decays by its own channel's
exp2(c_last):  h = diag(exp2(c_last)) h + kg^T v_new.

GDN's fused_qk runs this kernel as it is, on raw k: the w/u kernel put k's rstd on the rows
of w and u, so v_new = u - w h carries it and k^T v_new is k_norm^T times the unscaled v_new.

PIECE is the config's BK (64 when unset), searched by the autotuner.  The loop is latency-bound:
under ncu (H200, h16_hv32_fixed8k, 64-row pieces) one warp per scheduler issues every 4.4 cycles, and
a fifth of the stall samples sit at the wgmma waits, one per piece and dot.  One 128-row piece halves
those waits; in a gdn-qwen6 run with the height searched the state kernel went 151.6 -> 144.9 us at
h16_hv32_fixed8k, 75.7 -> 70.5 at h2_hv8_serving and 585.5 -> 571.7 at 32K, while HV64 and KDA kept
64-row pieces.  In a prototype, K = 192 as one 256-row piece lost, 212 -> 250 us.
"""

import triton
import triton.language as tl

from .common import loop_bound


@triton.jit
def _piece_load(ptr, o_k, o_v, K: tl.constexpr, V: tl.constexpr):
    return tl.load(ptr + o_k[:, None] * V + o_v[None, :], mask=(o_k < K)[:, None] & (o_v < V)[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _piece_store(ptr, b_h, o_k, o_v, K: tl.constexpr, V: tl.constexpr):
    tl.store(ptr + o_k[:, None] * V + o_v[None, :], b_h.to(ptr.dtype.element_ty),
             mask=(o_k < K)[:, None] & (o_v < V)[None, :])


@triton.jit
def _sequence_span(cu_seqlens, i_n, T, IS_VARLEN: tl.constexpr):
    """(first token as int64, length) of sequence i_n: packed (cu_seqlens) or the dense layout's row."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        seq_len = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        bos = i_n.to(tl.int64) * T
        seq_len = T
    return bos, seq_len


@triton.jit
def _initial_pieces(h0, i_nh, o_v, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PIECE: tl.constexpr,
                    USE_H0: tl.constexpr):
    """The slab's four fp32 pieces of PIECE rows (those past K stay zero and unused): zeros, or h0's rows."""
    o_k = tl.arange(0, PIECE)
    b_h1 = tl.zeros([PIECE, BV], dtype=tl.float32)
    b_h2 = tl.zeros([PIECE, BV], dtype=tl.float32)
    b_h3 = tl.zeros([PIECE, BV], dtype=tl.float32)
    b_h4 = tl.zeros([PIECE, BV], dtype=tl.float32)
    if USE_H0:
        p0 = h0 + i_nh.to(tl.int64) * K * V
        b_h1 += _piece_load(p0, o_k, o_v, K, V)
        if K > PIECE:
            b_h2 += _piece_load(p0, o_k + PIECE, o_v, K, V)
        if K > 2 * PIECE:
            b_h3 += _piece_load(p0, o_k + 2 * PIECE, o_v, K, V)
        if K > 3 * PIECE:
            b_h4 += _piece_load(p0, o_k + 3 * PIECE, o_v, K, V)
    return b_h1, b_h2, b_h3, b_h4


@triton.jit
def _store_pieces(ptr, b_h1, b_h2, b_h3, b_h4, o_v, K: tl.constexpr, V: tl.constexpr, PIECE: tl.constexpr):
    """Store the slab's pieces that lie within K (ptr: the state's [K, V] base)."""
    o_k = tl.arange(0, PIECE)
    _piece_store(ptr, b_h1, o_k, o_v, K, V)
    if K > PIECE:
        _piece_store(ptr, b_h2, o_k + PIECE, o_v, K, V)
    if K > 2 * PIECE:
        _piece_store(ptr, b_h3, o_k + 2 * PIECE, o_v, K, V)
    if K > 3 * PIECE:
        _piece_store(ptr, b_h4, o_k + 3 * PIECE, o_v, K, V)


@triton.jit
def _w_times_h(wb, rows, m_t, o_k, b_h, acc, K: tl.constexpr, stride, PREC: tl.constexpr):
    """acc += w[:, piece] @ h_piece."""
    b_w = tl.load(wb + rows[:, None] * stride + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :], other=0.0)
    return tl.dot(b_w, b_h.to(b_w.dtype), acc, input_precision=PREC)


@triton.jit
def _add_kv(kb, rows, m_t, o_k, b_vd, b_h, K: tl.constexpr, stride, PREC: tl.constexpr):
    """h_piece += k[:, piece]^T @ v_decayed."""
    b_kt = tl.load(kb + rows[None, :] * stride + o_k[:, None], mask=(o_k < K)[:, None] & m_t[None, :], other=0.0)
    return tl.dot(b_kt, b_vd, b_h, input_precision=PREC)


@triton.jit
def _channel_decay(gl, o_k, K: tl.constexpr):
    """exp2(c_last) of a piece's channels as a column [piece rows, 1] (gl: the chunk's last row of g_cs)."""
    return tl.math.exp2(tl.load(gl + o_k, mask=o_k < K, other=0.0))[:, None]


@triton.jit(do_not_specialize=["T"])
def state_kernel(
    k, w, u, g_cs, h, v_new, h0, ht, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, PER_CHANNEL: tl.constexpr, USE_H0: tl.constexpr,
    STORE_HT: tl.constexpr, PREC: tl.constexpr, PIECE: tl.constexpr,
):
    """Grid (cdiv(V, BV), N*HV).  h: [num_chunks, HV, K, V] per-chunk states (k's dtype),
    v_new: like u, h0/ht: [N, HV, K, V] fp32.  PIECE: rows per state piece, K <= 4 PIECE."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, seq_len = _sequence_span(cu_seqlens, i_n, T, IS_VARLEN)
    if IS_VARLEN:
        boh = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        boh = i_n.to(tl.int64) * tl.cdiv(T, BT)
    n_chunks = tl.cdiv(seq_len, BT)

    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_k1 = tl.arange(0, PIECE)
    o_k2 = o_k1 + PIECE
    o_k3 = o_k2 + PIECE
    o_k4 = o_k3 + PIECE

    b_h1, b_h2, b_h3, b_h4 = _initial_pieces(h0, i_nh, o_v, K, V, BV, PIECE, USE_H0)

    rows = tl.arange(0, BT)
    for i_t in range(loop_bound(n_chunks)):
        # per-chunk base pointers (int64 scalars); element offsets below are int32 and chunk-local
        tok = bos + i_t * BT
        kb = k + tok * (H * K) + i_h * K
        wb = w + tok * (HV * K) + i_hv * K
        ub = u + tok * (HV * V) + i_hv * V
        vnb = v_new + tok * (HV * V) + i_hv * V
        if PER_CHANNEL:
            gb = g_cs + tok * (HV * K) + i_hv * K
        else:
            gb = g_cs + tok * HV + i_hv
        # state entering this chunk
        _store_pieces(h + ((boh + i_t) * HV + i_hv) * K * V, b_h1, b_h2, b_h3, b_h4, o_v, K, V, PIECE)

        n_valid = seq_len - i_t * BT
        m_t = rows < n_valid
        # v_new = u - w h
        b_wh = tl.zeros([BT, BV], dtype=tl.float32)
        b_wh = _w_times_h(wb, rows, m_t, o_k1, b_h1, b_wh, K, HV * K, PREC)
        if K > PIECE:
            b_wh = _w_times_h(wb, rows, m_t, o_k2, b_h2, b_wh, K, HV * K, PREC)
        if K > 2 * PIECE:
            b_wh = _w_times_h(wb, rows, m_t, o_k3, b_h3, b_wh, K, HV * K, PREC)
        if K > 3 * PIECE:
            b_wh = _w_times_h(wb, rows, m_t, o_k4, b_h4, b_wh, K, HV * K, PREC)
        m_tv = m_t[:, None] & m_v[None, :]
        p_uv = rows[:, None] * (HV * V) + o_v[None, :]
        b_vn = tl.load(ub + p_uv, mask=m_tv, other=0.0).to(tl.float32) - b_wh
        tl.store(vnb + p_uv, b_vn.to(v_new.dtype.element_ty), mask=m_tv)

        # decay to the chunk end, then add the chunk's keys/values
        last = tl.minimum(n_valid, BT) - 1
        if PER_CHANNEL:
            b_vd = b_vn.to(k.dtype.element_ty)
            gl = gb + last * (HV * K)
            d1 = _channel_decay(gl, o_k1, K)
            if K > PIECE:
                d2 = _channel_decay(gl, o_k2, K)
            if K > 2 * PIECE:
                d3 = _channel_decay(gl, o_k3, K)
            if K > 3 * PIECE:
                d4 = _channel_decay(gl, o_k4, K)
        else:
            c_last = tl.load(gb + last * HV)
            c = tl.load(gb + rows * HV, mask=m_t, other=0.0)
            row_f = tl.where(m_t, tl.math.exp2(c_last - c), 0.0)
            b_vd = (b_vn * row_f[:, None]).to(k.dtype.element_ty)
            d_last = tl.math.exp2(c_last)
            d1, d2, d3, d4 = d_last, d_last, d_last, d_last
        b_h1 = _add_kv(kb, rows, m_t, o_k1, b_vd, b_h1 * d1, K, H * K, PREC)
        if K > PIECE:
            b_h2 = _add_kv(kb, rows, m_t, o_k2, b_vd, b_h2 * d2, K, H * K, PREC)
        if K > 2 * PIECE:
            b_h3 = _add_kv(kb, rows, m_t, o_k3, b_vd, b_h3 * d3, K, H * K, PREC)
        if K > 3 * PIECE:
            b_h4 = _add_kv(kb, rows, m_t, o_k4, b_vd, b_h4 * d4, K, H * K, PREC)

    if STORE_HT:
        _store_pieces(ht + i_nh.to(tl.int64) * K * V, b_h1, b_h2, b_h3, b_h4, o_v, K, V, PIECE)

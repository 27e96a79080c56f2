"""KDA's state recurrence and output in one pass: the state kernel's walk (PER_CHANNEL) that also writes o.

The three-kernel path after the w/u kernel stores the state h of every chunk and v_new (state kernel) and
reads them back with q and the fp32 gates (output kernel).  Here the program that owns h's [K, BV] slab
writes o's [64, BV] slab as it walks, g the chunk-local gate cumsum in log2 units per channel:

    v_new = u - w h;   o = scale [r_q] ((exp2(g) * q) h + Aqk v_new);   h = diag(exp2(g_last)) h + kg^T v_new

so neither h per chunk nor v_new goes through memory (at kda-legacy6 h96_fixed, bf16: 0.40 GB of h and
0.20 GB of v_new, each written once and read once), and each V slab reads q and the gate tile itself,
cdiv(V, BV) times per chunk where the output kernel read them once.  w, u and kg come from the w/u kernel,
Aqk from kda_intra, as in the three-kernel path, whose rounding this keeps: the (exp2(g) q) h product takes
h rounded to 16 bits as the output kernel reads it, and A v_new takes v_new as the state kernel stores it.
Under fused_q / fused_qk q is raw and q's rstd, from the diagonal of q q^T accumulated with (exp2(g) q) h,
scales the whole output row once (as the output kernel does).  Runs where its tuned time beats state +
output (``tuned.kda_one_pass_choice``): on the H200 the H64 kda-legacy6 shapes under flag (515.2 against
542.0 us at h64_fixed); at H96, 1.45 waves of 132 SMs, it is slower (958.0 against 791.4).
"""

import triton
import triton.language as tl

from .common import loop_bound
from .output import _q_rstd, _qq_dot
from .state import _add_kv, _channel_decay, _initial_pieces, _sequence_span, _store_pieces


@triton.jit
def _wh_qgh(wb, qb, gb, rows, m_t, o_k, b_h, b_wh, b_qh, b_qq, K: tl.constexpr, H: tl.constexpr, HV: tl.constexpr,
            FUSE_Q: tl.constexpr, PREC: tl.constexpr):
    """One state piece's share of w h, (exp2(g) q) h and (FUSE_Q) q q^T."""
    msk = m_t[:, None] & (o_k < K)[None, :]
    b_w = tl.load(wb + rows[:, None] * (HV * K) + o_k[None, :], mask=msk, other=0.0)
    b_hh = b_h.to(b_w.dtype)  # h as the state kernel stores it for the output kernel
    b_wh = tl.dot(b_w, b_hh, b_wh, input_precision=PREC)
    b_q = tl.load(qb + rows[:, None] * (H * K) + o_k[None, :], mask=msk, other=0.0)
    if FUSE_Q:
        b_qq = _qq_dot(b_q, b_qq, PREC)
    b_g = tl.load(gb + rows[:, None] * (HV * K) + o_k[None, :], mask=msk, other=0.0)
    b_qg = (b_q.to(tl.float32) * tl.math.exp2(b_g)).to(b_q.dtype)  # |q exp(g)| <= |q|: no overflow
    b_qh = tl.dot(b_qg, b_hh, b_qh, input_precision=PREC)
    return b_wh, b_qh, b_qq


@triton.jit(do_not_specialize=["T"])
def kda_state_out_kernel(
    q, kg, w, u, g_cs, aqk, o, h0, ht, cu_seqlens, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, FUSE_Q: tl.constexpr,
    PREC: tl.constexpr, PIECE: tl.constexpr,
):
    """Grid (cdiv(V, BV), N*HV).  kg, w [B,T,HV,K] and u [B,T,HV,V] from the w/u kernel, g_cs [B,T,HV,K] fp32,
    aqk [B,T,HV,64] from kda_intra; o like u; h0/ht [N, HV, K, V] fp32.  K <= 4 PIECE (as the state kernel)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, seq_len = _sequence_span(cu_seqlens, i_n, T, IS_VARLEN)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_h1, b_h2, b_h3, b_h4 = _initial_pieces(h0, i_nh, o_v, K, V, BV, PIECE, USE_H0)
    rows = tl.arange(0, BT)
    o_k1, o_k2 = tl.arange(0, PIECE), tl.arange(0, PIECE) + PIECE
    o_k3, o_k4 = o_k2 + PIECE, o_k2 + 2 * PIECE
    for i_t in range(loop_bound(tl.cdiv(seq_len, BT))):
        tok = bos + i_t * BT
        n_valid = seq_len - i_t * BT
        m_t = rows < n_valid
        qb = q + tok * (H * K) + i_h * K
        kb = kg + tok * (HV * K) + i_hv * K
        wb = w + tok * (HV * K) + i_hv * K
        gb = g_cs + tok * (HV * K) + i_hv * K
        # w h, (exp2(g) q) h and q q^T from the state entering this chunk
        b_wh = tl.zeros([BT, BV], dtype=tl.float32)
        b_qh = tl.zeros([BT, BV], dtype=tl.float32)
        b_qq = tl.zeros([BT, BT], dtype=tl.float32)
        b_wh, b_qh, b_qq = _wh_qgh(wb, qb, gb, rows, m_t, o_k1, b_h1, b_wh, b_qh, b_qq, K, H, HV, FUSE_Q, PREC)
        if K > PIECE:
            b_wh, b_qh, b_qq = _wh_qgh(wb, qb, gb, rows, m_t, o_k2, b_h2, b_wh, b_qh, b_qq, K, H, HV, FUSE_Q, PREC)
        if K > 2 * PIECE:
            b_wh, b_qh, b_qq = _wh_qgh(wb, qb, gb, rows, m_t, o_k3, b_h3, b_wh, b_qh, b_qq, K, H, HV, FUSE_Q, PREC)
        if K > 3 * PIECE:
            b_wh, b_qh, b_qq = _wh_qgh(wb, qb, gb, rows, m_t, o_k4, b_h4, b_wh, b_qh, b_qq, K, H, HV, FUSE_Q, PREC)
        m_tv = m_t[:, None] & m_v[None, :]
        p_uv = rows[:, None] * (HV * V) + o_v[None, :]
        b_vn = tl.load(u + tok * (HV * V) + i_hv * V + p_uv, mask=m_tv, other=0.0).to(tl.float32) - b_wh

        # o = scale [r_q] ((exp2(g) q) h + Aqk v_new), v_new as the state kernel stores it
        b_A = tl.load(aqk + tok * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                      mask=m_t[:, None], other=0.0)
        b_vo = b_vn.to(u.dtype.element_ty).to(b_A.dtype)
        b_o = tl.dot(b_A, b_vo, b_qh, input_precision=PREC)
        if FUSE_Q:
            b_o = b_o * (_q_rstd(b_qq, qb, rows, m_t, K, H * K, PIECE, PREC) * scale)[:, None]
        else:
            b_o = b_o * scale
        tl.store(o + tok * (HV * V) + i_hv * V + p_uv, b_o.to(o.dtype.element_ty), mask=m_tv)

        # each state row decays by its channel's exp2(g_last), then the chunk's keys/values
        b_vd = b_vn.to(kg.dtype.element_ty)
        gl = gb + (tl.minimum(n_valid, BT) - 1) * (HV * K)
        b_h1 = _add_kv(kb, rows, m_t, o_k1, b_vd, b_h1 * _channel_decay(gl, o_k1, K), K, HV * K, PREC)
        if K > PIECE:
            b_h2 = _add_kv(kb, rows, m_t, o_k2, b_vd, b_h2 * _channel_decay(gl, o_k2, K), K, HV * K, PREC)
        if K > 2 * PIECE:
            b_h3 = _add_kv(kb, rows, m_t, o_k3, b_vd, b_h3 * _channel_decay(gl, o_k3, K), K, HV * K, PREC)
        if K > 3 * PIECE:
            b_h4 = _add_kv(kb, rows, m_t, o_k4, b_vd, b_h4 * _channel_decay(gl, o_k4, K), K, HV * K, PREC)

    if STORE_HT:
        _store_pieces(ht + i_nh.to(tl.int64) * K * V, b_h1, b_h2, b_h3, b_h4, o_v, K, V, PIECE)

"""GDN's one-pass state/output kernel with w h and u computed in the loop: no w/u kernel, no w, u in memory.

The one-pass path (kernels/state_out.py) reads w = A (beta exp2(c) k) and u = A (beta v) from the w/u
kernel, which writes both ([T, HV, K] and [T, HV, V], 16-bit) only for this loop to read them back.
Here the loop reads A itself and re-associates the product, so no program forms w:

    w h_slab = A (diag(beta exp2(c)) (k h_slab)),  so  v_new = A x,  x = beta v - beta exp2(c) (k h_slab)

k h_slab is a [64, K] x [K, BV] product, the size of the w h it replaces, and it reads the k tile the state
update reads anyway; A x ([64, 64] x [64, BV]) is the one product added per chunk.  Every term is
proportional to the V slab, so a program that owns a [K, BV] slab repeats nothing across the V slabs
except loads of A and k, which the slabs of one head share through L2; recomputing w per slab would
repeat a [64, 64] x [64, K] product per slab (four times at BV 32), and owning the whole V (BV = V, as
FlashQLA does) keeps a [K, V] fp32 state in registers (128 per thread at 4 warps for K = V = 128; offline,
sm_90, Triton 3.6: 136 B of stack at 8 warps, 840 at 16) and leaves 4 x fewer programs than state_out has
(h16_hv32_fixed8k: 32 programs for 132 SMs).  BV 32 at 4 warps and 3 stages: 152-174 registers, no stack,
160 KB of shared memory (results/offline-sm90/in_loop_sweep.md).

IN_LOOP_AQK: the chunk's gated causal q k^T is accumulated from the q and k tiles the loop loads for q h
and k h, so aqk_kernel goes too (one [64, K] x [K, 64] product per chunk and V slab, repeated per slab).
Otherwise Aqk (and, FUSE_Q, c_q) come from aqk_kernel as in state_out.

FUSE_K (fused_qk): k is raw and A is built on k's normalized rows (gram_solve); the w/u kernel's rows
carry k's rstd r (w h = r A (beta exp2(c) r (k_raw h)), u = r A (beta v)), so here
x = beta v - beta exp2(c) r (k_raw h) and v_new = r (A x), and the update runs on raw k as before.

Rounding: the two-kernel forms round w and u to k's and v's dtype; this form rounds x to A's dtype for the
A x product and keeps v_new in fp32 until the o product (cast to v's dtype there, as state_out does).
"""

import triton
import triton.language as tl

from .common import loop_bound
from .state import _initial_pieces, _sequence_span, _store_pieces


@triton.jit
def _piece_products(qb, kb, rows, m_t, o_k, b_h, b_kh, b_qh, b_s, K: tl.constexpr, stride,
                    QK: tl.constexpr, PREC: tl.constexpr):
    """One state piece's share of k h, q h and (QK) q k^T; returns the k tile too (the update's operand)."""
    msk = m_t[:, None] & (o_k < K)[None, :]
    b_k = tl.load(kb + rows[:, None] * stride + o_k[None, :], mask=msk, other=0.0)
    b_q = tl.load(qb + rows[:, None] * stride + o_k[None, :], mask=msk, other=0.0)
    b_hh = b_h.to(b_k.dtype)
    b_kh = tl.dot(b_k, b_hh, b_kh, input_precision=PREC)
    b_qh = tl.dot(b_q, b_hh, b_qh, input_precision=PREC)
    if QK:
        b_s = tl.dot(b_q, tl.trans(b_k), b_s, input_precision=PREC)
    return b_k, b_kh, b_qh, b_s


@triton.jit
def _update(b_k, b_vd, b_h, d_last, PREC: tl.constexpr):
    """h_piece = exp2(c_last) h_piece + k[:, piece]^T v_decayed."""
    return tl.dot(tl.trans(b_k), b_vd, b_h * d_last, input_precision=PREC)


@triton.jit(do_not_specialize=["T"])
def fused_state_out_kernel(
    q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, h0, ht, cu_seqlens, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, FUSE_Q: tl.constexpr,
    FUSE_K: tl.constexpr, IN_LOOP_AQK: tl.constexpr, PREC: tl.constexpr, PIECE: tl.constexpr,
):
    """Grid (cdiv(V, BV), N*HV).  o like v; h0/ht [N, HV, K, V] fp32; A [B,T,HV,64] from gram_solve; aqk and
    c_q from aqk_kernel unless IN_LOOP_AQK (then unused, and FUSE_Q is not allowed); rstd_k [B,T,H] fp32
    under FUSE_K.  PIECE rows per state piece, K <= 4 PIECE (as the state kernel)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, seq_len = _sequence_span(cu_seqlens, i_n, T, IS_VARLEN)
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
        tok = bos + i_t * BT
        qb = q + tok * (H * K) + i_h * K
        kb = k + tok * (H * K) + i_h * K
        gb = g_cs + tok * HV + i_hv
        n_valid = seq_len - i_t * BT
        m_t = rows < n_valid
        # k h, q h (and q k^T) from the state entering this chunk
        b_kh = tl.zeros([BT, BV], dtype=tl.float32)
        b_qh = tl.zeros([BT, BV], dtype=tl.float32)
        b_s = tl.zeros([BT, BT], dtype=tl.float32)
        b_k1, b_kh, b_qh, b_s = _piece_products(qb, kb, rows, m_t, o_k1, b_h1, b_kh, b_qh, b_s, K, H * K,
                                                IN_LOOP_AQK, PREC)
        if K > PIECE:
            b_k2, b_kh, b_qh, b_s = _piece_products(qb, kb, rows, m_t, o_k2, b_h2, b_kh, b_qh, b_s, K, H * K,
                                                    IN_LOOP_AQK, PREC)
        if K > 2 * PIECE:
            b_k3, b_kh, b_qh, b_s = _piece_products(qb, kb, rows, m_t, o_k3, b_h3, b_kh, b_qh, b_s, K, H * K,
                                                    IN_LOOP_AQK, PREC)
        if K > 3 * PIECE:
            b_k4, b_kh, b_qh, b_s = _piece_products(qb, kb, rows, m_t, o_k4, b_h4, b_kh, b_qh, b_s, K, H * K,
                                                    IN_LOOP_AQK, PREC)

        last = tl.minimum(n_valid, BT) - 1
        c_last = tl.load(gb + last * HV)
        if FUSE_Q:  # q h on raw q: its rows take q's rstd r, as exp2(c + log2 r) (see state_out.py)
            p_cq = c_q + (tok * HV + i_hv) * 2 + rows[:, None] * (HV * 2) + tl.arange(0, 2)[None, :]
            c, c_o = tl.split(tl.load(p_cq, mask=m_t[:, None], other=0.0))
        else:
            c = tl.load(gb + rows * HV, mask=m_t, other=0.0)
            c_o = c
        # v_new = A x,  x = beta v - beta exp2(c) (k h)   (= u - w h)
        b_beta = tl.load(beta + tok * HV + i_hv + rows * HV, mask=m_t, other=0.0).to(tl.float32)
        f_kh = b_beta * tl.math.exp2(c)
        if FUSE_K:
            r_k = tl.load(rstd_k + tok * H + i_h + rows * H, mask=m_t, other=0.0)
            f_kh = f_kh * r_k
        m_tv = m_t[:, None] & m_v[None, :]
        p_v = rows[:, None] * (HV * V) + o_v[None, :]
        b_v = tl.load(v + tok * (HV * V) + i_hv * V + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_x = b_v * b_beta[:, None] - b_kh * f_kh[:, None]
        p_A = tok * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :]
        b_A = tl.load(A + p_A, mask=m_t[:, None], other=0.0)
        b_vn = tl.dot(b_A, b_x.to(b_A.dtype), input_precision=PREC)
        if FUSE_K:
            b_vn = b_vn * r_k[:, None]

        # o = scale * (exp2(c) q h + Aqk v_new)
        if IN_LOOP_AQK:
            keep = (rows[:, None] >= rows[None, :]) & m_t[:, None] & m_t[None, :]
            # where() after the product: above the diagonal exp2 may overflow, never selected
            b_Aqk = tl.where(keep, b_s * tl.math.exp2(c[:, None] - c[None, :]), 0.0).to(q.dtype.element_ty)
        else:
            b_Aqk = tl.load(aqk + p_A, mask=m_t[:, None], other=0.0)
        b_vo = b_vn.to(v.dtype.element_ty).to(b_Aqk.dtype)  # v_new as the two-kernel path stores it
        b_o = tl.dot(b_Aqk, b_vo, b_qh * tl.math.exp2(c_o)[:, None], input_precision=PREC) * scale
        tl.store(o + tok * (HV * V) + i_hv * V + p_v, b_o.to(o.dtype.element_ty), mask=m_tv)

        # decay to the chunk end, then add the chunk's keys/values
        row_f = tl.where(m_t, tl.math.exp2(c_last - c), 0.0)
        b_vd = (b_vn * row_f[:, None]).to(k.dtype.element_ty)
        d_last = tl.math.exp2(c_last)
        b_h1 = _update(b_k1, b_vd, b_h1, d_last, PREC)
        if K > PIECE:
            b_h2 = _update(b_k2, b_vd, b_h2, d_last, PREC)
        if K > 2 * PIECE:
            b_h3 = _update(b_k3, b_vd, b_h3, d_last, PREC)
        if K > 3 * PIECE:
            b_h4 = _update(b_k4, b_vd, b_h4, d_last, PREC)

    if STORE_HT:
        _store_pieces(ht + i_nh.to(tl.int64) * K * V, b_h1, b_h2, b_h3, b_h4, o_v, K, V, PIECE)

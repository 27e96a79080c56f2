"""Output kernel: o = scale * (exp(g) * (q h) + causal(q k^T * exp(g_i - g_j)) v_new).

FUSE_Q folds q's l2 norm in: every q-dependent term is linear in q's row, so
the K-tile loop runs on the raw q, accumulates each row's sum of squares in
fp32, and one row factor 1/sqrt(ssq + eps) is applied at the end, before the
fp32 -> 16-bit cast of the intra-chunk gram.  FUSE_K normalizes each k^T tile
on load with rstd_k (so a huge raw k row cannot overflow q k^T).  Limitation:
the raw-q products can overflow fp32 only for |q| rows beyond ~1e36.

QN (experiment, H200 timing pending): 1 = overflow-safe pair of sums in the loop;
2 = one sum in the loop, the pre-scaled sum only when a row of the tile is huge;
3 = q normalized on load (one K tile), then the dots on normalized q; 4 = the sums as the
diagonal of an extra q q^T dot; 5 = like 2 from a second load of the q tile.
"""

import triton
import triton.language as tl

from .common import SSQ_BIG, SSQ_LO, chunk_coords, l2_rstd, sq_sums


@triton.jit
def _q_tile(qb, rows, m_t, o_k, K: tl.constexpr, stride):
    return tl.load(qb + rows[:, None] * stride + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :], other=0.0)


@triton.jit
def _rescue_lo(qb, rows, m_t, ssq, K: tl.constexpr, stride, BK: tl.constexpr):
    """Pre-scaled sums of squares (common.sq_sums' second sum), computed only when some row's
    plain sum reached SSQ_BIG (a row of magnitude ~1e15 and up: rare), by re-reading q."""
    lo = tl.zeros_like(ssq)
    if tl.max(ssq, 0) >= SSQ_BIG:
        for i_k in range(tl.cdiv(K, BK)):
            xl = _q_tile(qb, rows, m_t, i_k * BK + tl.arange(0, BK), K, stride).to(tl.float32) * SSQ_LO
            lo += tl.sum(xl * xl, 1)
    return lo


@triton.jit
def _qh_qk(qb, kb, hb, rows, m_t, o_v, r_k, K: tl.constexpr, V: tl.constexpr, stride,
           BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
           QN: tl.constexpr, FUSE_K: tl.constexpr, KCOL: tl.constexpr, PREC: tl.constexpr):
    """(q h, q k^T, q rows' sums of squares) accumulated over the K-tile loop."""
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_s = tl.zeros([BT, BT], dtype=tl.float32)
    ssq = tl.zeros([BT], dtype=tl.float32)
    lo = tl.zeros([BT], dtype=tl.float32)
    b_qq = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = _q_tile(qb, rows, m_t, o_k, K, stride)
        if QN == 1:
            a, b = sq_sums(b_q.to(tl.float32))
            ssq += a
            lo += b
        if QN == 2:
            qf = b_q.to(tl.float32)
            ssq += tl.sum(qf * qf, 1)
        if QN == 3:
            tl.static_assert(BK >= K, "QN=3 needs one K tile")
            qf = b_q.to(tl.float32)
            s1 = tl.sum(qf * qf, 1)
            r_q = l2_rstd(s1, _rescue_lo(qb, rows, m_t, s1, K, stride, BK))
            b_q = (qf * r_q[:, None]).to(b_q.dtype)
        if QN == 5:
            qf = _q_tile(qb, rows, m_t, o_k, K, stride).to(tl.float32)
            ssq += tl.sum(qf * qf, 1)
        b_kt = tl.load(kb + rows[None, :] * stride + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        if FUSE_K and not KCOL:
            b_kt = (b_kt.to(tl.float32) * r_k[None, :]).to(b_kt.dtype)
        b_h = tl.load(hb + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & (o_v < V)[None, :], other=0.0)
        b_o = tl.dot(b_q, b_h, b_o, input_precision=PREC)
        b_s = tl.dot(b_q, b_kt, b_s, input_precision=PREC)
        if QN == 4:
            b_qq = tl.dot(b_q, tl.trans(b_q), b_qq, input_precision=PREC)
    if QN == 4:
        ssq = tl.sum(tl.where(rows[:, None] == rows[None, :], b_qq, 0.0), 1)
    if QN == 2 or QN == 4 or QN == 5:
        lo = _rescue_lo(qb, rows, m_t, ssq, K, stride, BK)
    return b_o, b_s, ssq, lo


@triton.jit(do_not_specialize=["T", "NT"])
def output_kernel(
    q, k, v_new, h, g_cs, rstd_k, o, cu_seqlens, chunk_indices, scale, T, NT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, FUSE_Q: tl.constexpr, FUSE_K: tl.constexpr, PREC: tl.constexpr,
    QN: tl.constexpr = 0, KCOL: tl.constexpr = False,
):
    """Grid (cdiv(V, BV), chunks, B*HV)."""
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)

    rows = tl.arange(0, BT)
    m_t = rows < n_valid
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V

    qb = q + tok0 * (H * K) + i_h * K
    kb = k + tok0 * (H * K) + i_h * K
    hb = h + (i_g * HV + i_hv) * K * V
    r_k = tl.zeros([BT], dtype=tl.float32)
    if FUSE_K:
        r_k = tl.load(rstd_k + tok0 * H + i_h + rows * H, mask=m_t, other=0.0)
    b_o, b_s, ssq, lo = _qh_qk(qb, kb, hb, rows, m_t, o_v, r_k, K, V, H * K, BT, BK, BV, QN, FUSE_K, KCOL, PREC)

    if FUSE_K and KCOL:
        b_s = b_s * r_k[None, :]
    c = tl.load(g_cs + tok0 * HV + i_hv + rows * HV, mask=m_t, other=0.0)
    b_o = b_o * tl.math.exp2(c)[:, None]
    keep = (rows[:, None] >= rows[None, :]) & m_t[:, None] & m_t[None, :]
    b_s = tl.where(keep, b_s * tl.math.exp2(c[:, None] - c[None, :]), 0.0)
    if QN == 1 or QN == 2 or QN == 4 or QN == 5:
        # scale before the cast: an unnormalized fp16 row could overflow fp16
        r_q = l2_rstd(ssq, lo)
        b_o = b_o * r_q[:, None]
        b_s = b_s * r_q[:, None]

    m_tv = m_t[:, None] & m_v[None, :]
    p_tv = rows[:, None] * (HV * V) + o_v[None, :]
    b_vn = tl.load(v_new + tok0 * (HV * V) + i_hv * V + p_tv, mask=m_tv, other=0.0)
    b_o = tl.dot(b_s.to(b_vn.dtype), b_vn, b_o, input_precision=PREC) * scale
    tl.store(o + tok0 * (HV * V) + i_hv * V + p_tv, b_o.to(o.dtype.element_ty), mask=m_tv)

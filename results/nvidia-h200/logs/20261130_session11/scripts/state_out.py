"""Prototype: GDN state recurrence and output in one kernel (plain route: q, k normalized as given).
Per chunk, the program that owns h's [K, BV] slab also writes o's [64, BV] slab:
    o = scale * (exp2(c) * (q h) + causal(q k^T * exp2(c_i - c_j)) v_new)
so neither h per chunk nor v_new goes through memory.  K up to 128 (two 64-row pieces)."""
import triton
import triton.language as tl

PIECE = tl.constexpr(64)


@triton.jit
def _ld(ptr, rows, m_t, o_k, K: tl.constexpr, stride):
    return tl.load(ptr + rows[:, None] * stride + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :], other=0.0)


@triton.jit
def _ldT(ptr, rows, m_t, o_k, K: tl.constexpr, stride):
    return tl.load(ptr + rows[None, :] * stride + o_k[:, None], mask=(o_k < K)[:, None] & m_t[None, :], other=0.0)


@triton.jit(do_not_specialize=["T"])
def state_out_kernel(
    q, k, w, u, g_cs, o, h0, ht, cu_seqlens, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, PREC: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        seq_len = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        bos = i_n.to(tl.int64) * T
        seq_len = T
    n_chunks = tl.cdiv(seq_len, BT)

    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_k1 = tl.arange(0, PIECE)
    o_k2 = o_k1 + PIECE
    b_h1 = tl.zeros([PIECE, BV], dtype=tl.float32)
    if K > 64:
        b_h2 = tl.zeros([PIECE, BV], dtype=tl.float32)
    if USE_H0:
        p0 = h0 + i_nh.to(tl.int64) * K * V
        b_h1 += tl.load(p0 + o_k1[:, None] * V + o_v[None, :], mask=(o_k1 < K)[:, None] & m_v[None, :], other=0.0)
        if K > 64:
            b_h2 += tl.load(p0 + o_k2[:, None] * V + o_v[None, :], mask=(o_k2 < K)[:, None] & m_v[None, :],
                            other=0.0)

    rows = tl.arange(0, BT)
    for i_t in range(n_chunks):
        tok = bos + i_t * BT
        qb = q + tok * (H * K) + i_h * K
        kb = k + tok * (H * K) + i_h * K
        wb = w + tok * (HV * K) + i_hv * K
        ub = u + tok * (HV * V) + i_hv * V
        ob = o + tok * (HV * V) + i_hv * V
        gb = g_cs + tok * HV + i_hv
        n_valid = seq_len - i_t * BT
        m_t = rows < n_valid

        b_h1b = b_h1.to(k.dtype.element_ty)
        b_w1 = _ld(wb, rows, m_t, o_k1, K, HV * K)
        b_q1 = _ld(qb, rows, m_t, o_k1, K, H * K)
        b_kt1 = _ldT(kb, rows, m_t, o_k1, K, H * K)
        b_wh = tl.dot(b_w1, b_h1b, input_precision=PREC)
        b_qh = tl.dot(b_q1, b_h1b, input_precision=PREC)
        b_s = tl.dot(b_q1, b_kt1, input_precision=PREC)
        if K > 64:
            b_h2b = b_h2.to(k.dtype.element_ty)
            b_w2 = _ld(wb, rows, m_t, o_k2, K, HV * K)
            b_q2 = _ld(qb, rows, m_t, o_k2, K, H * K)
            b_kt2 = _ldT(kb, rows, m_t, o_k2, K, H * K)
            b_wh = tl.dot(b_w2, b_h2b, b_wh, input_precision=PREC)
            b_qh = tl.dot(b_q2, b_h2b, b_qh, input_precision=PREC)
            b_s = tl.dot(b_q2, b_kt2, b_s, input_precision=PREC)
        m_tv = m_t[:, None] & m_v[None, :]
        p_uv = rows[:, None] * (HV * V) + o_v[None, :]
        b_vn = tl.load(ub + p_uv, mask=m_tv, other=0.0).to(tl.float32) - b_wh
        b_vnb = b_vn.to(k.dtype.element_ty)  # what the two-kernel pipeline stores as v_new

        last = tl.minimum(n_valid, BT) - 1
        c_last = tl.load(gb + last * HV)
        c = tl.load(gb + rows * HV, mask=m_t, other=0.0)
        keep = (rows[:, None] >= rows[None, :]) & m_t[:, None] & m_t[None, :]
        b_s = tl.where(keep, b_s * tl.math.exp2(c[:, None] - c[None, :]), 0.0)
        b_o = tl.dot(b_s.to(b_vnb.dtype), b_vnb, b_qh * tl.math.exp2(c)[:, None], input_precision=PREC) * scale
        tl.store(ob + p_uv, b_o.to(o.dtype.element_ty), mask=m_tv)

        row_f = tl.where(m_t, tl.math.exp2(c_last - c), 0.0)
        b_vd = (b_vn * row_f[:, None]).to(k.dtype.element_ty)
        d_last = tl.math.exp2(c_last)
        b_h1 = tl.dot(b_kt1, b_vd, b_h1 * d_last, input_precision=PREC)
        if K > 64:
            b_h2 = tl.dot(b_kt2, b_vd, b_h2 * d_last, input_precision=PREC)

    if STORE_HT:
        pt = ht + i_nh.to(tl.int64) * K * V
        tl.store(pt + o_k1[:, None] * V + o_v[None, :], b_h1, mask=(o_k1 < K)[:, None] & m_v[None, :])
        if K > 64:
            tl.store(pt + o_k2[:, None] * V + o_v[None, :], b_h2, mask=(o_k2 < K)[:, None] & m_v[None, :])

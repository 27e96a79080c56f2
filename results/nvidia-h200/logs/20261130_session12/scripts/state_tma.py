"""Prototype: the state kernel (GDN, K <= 2 PIECE) with TMA descriptor loads of w, k, u (TMA_LOAD)
and/or a TMA descriptor store of the per-chunk h (TMA_H).  Rows past a sequence's end come from the
next sequence (or zero fill past the tensor): v_new's rows there are masked on store and v_d's are
selected to zero, so they add nothing to h."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def state_tma_kernel(
    k, w, u, g_cs, h, v_new, h0, ht, cu_seqlens, chunk_offsets, T,
    w_desc, k_desc, u_desc, h_desc,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr, PIECE: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, PREC: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_H: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        seq_len = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
        boh = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        seq_len = T
        boh = i_n.to(tl.int64) * tl.cdiv(T, BT)
    n_chunks = tl.cdiv(seq_len, BT)

    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_k1 = tl.arange(0, PIECE)
    o_k2 = o_k1 + PIECE
    b_h1 = tl.zeros([PIECE, BV], dtype=tl.float32)
    if K > PIECE:
        b_h2 = tl.zeros([PIECE, BV], dtype=tl.float32)
    if USE_H0:
        p0 = h0 + i_nh.to(tl.int64) * K * V
        b_h1 += tl.load(p0 + o_k1[:, None] * V + o_v[None, :], mask=(o_k1 < K)[:, None] & m_v[None, :], other=0.0)
        if K > PIECE:
            b_h2 += tl.load(p0 + o_k2[:, None] * V + o_v[None, :], mask=(o_k2 < K)[:, None] & m_v[None, :], other=0.0)

    rows = tl.arange(0, BT)
    for i_t in range(n_chunks):
        tok = bos + i_t * BT
        tok32 = tok.to(tl.int32)
        wb = w + tok * (HV * K) + i_hv * K
        kb = k + tok * (H * K) + i_h * K
        ub = u + tok * (HV * V) + i_hv * V
        vnb = v_new + tok * (HV * V) + i_hv * V
        gb = g_cs + tok * HV + i_hv
        hrow = (((boh + i_t) * HV + i_hv) * K).to(tl.int32)
        if TMA_H:
            h_desc.store([hrow, i_v * BV], b_h1.to(h.dtype.element_ty))
            if K > PIECE:
                h_desc.store([hrow + PIECE, i_v * BV], b_h2.to(h.dtype.element_ty))
        else:
            ph = h + ((boh + i_t) * HV + i_hv) * K * V
            tl.store(ph + o_k1[:, None] * V + o_v[None, :], b_h1.to(h.dtype.element_ty),
                     mask=(o_k1 < K)[:, None] & m_v[None, :])
            if K > PIECE:
                tl.store(ph + o_k2[:, None] * V + o_v[None, :], b_h2.to(h.dtype.element_ty),
                         mask=(o_k2 < K)[:, None] & m_v[None, :])

        n_valid = seq_len - i_t * BT
        m_t = rows < n_valid
        if TMA_LOAD:
            b_w1 = w_desc.load([tok32, i_hv * K])
            b_wh = tl.dot(b_w1, b_h1.to(b_w1.dtype), input_precision=PREC)
            if K > PIECE:
                b_w2 = w_desc.load([tok32, i_hv * K + PIECE])
                b_wh = tl.dot(b_w2, b_h2.to(b_w2.dtype), b_wh, input_precision=PREC)
            b_u = u_desc.load([tok32, i_hv * V + i_v * BV]).to(tl.float32)
        else:
            b_w1 = tl.load(wb + rows[:, None] * (HV * K) + o_k1[None, :], mask=m_t[:, None] & (o_k1 < K)[None, :], other=0.0)
            b_wh = tl.dot(b_w1, b_h1.to(b_w1.dtype), input_precision=PREC)
            if K > PIECE:
                b_w2 = tl.load(wb + rows[:, None] * (HV * K) + o_k2[None, :], mask=m_t[:, None] & (o_k2 < K)[None, :], other=0.0)
                b_wh = tl.dot(b_w2, b_h2.to(b_w2.dtype), b_wh, input_precision=PREC)
            b_u = tl.load(ub + rows[:, None] * (HV * V) + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0).to(tl.float32)
        b_vn = b_u - b_wh
        m_tv = m_t[:, None] & m_v[None, :]
        tl.store(vnb + rows[:, None] * (HV * V) + o_v[None, :], b_vn.to(v_new.dtype.element_ty), mask=m_tv)

        last = tl.minimum(n_valid, BT) - 1
        c_last = tl.load(gb + last * HV)
        c = tl.load(gb + rows * HV, mask=m_t, other=0.0)
        b_vd = tl.where(m_t[:, None], b_vn * tl.math.exp2(c_last - c)[:, None], 0.0).to(k.dtype.element_ty)
        d_last = tl.math.exp2(c_last)
        if TMA_LOAD:
            b_k1 = k_desc.load([tok32, i_h * K])
            b_h1 = tl.dot(tl.trans(b_k1), b_vd, b_h1 * d_last, input_precision=PREC)
            if K > PIECE:
                b_k2 = k_desc.load([tok32, i_h * K + PIECE])
                b_h2 = tl.dot(tl.trans(b_k2), b_vd, b_h2 * d_last, input_precision=PREC)
        else:
            b_kt1 = tl.load(kb + rows[None, :] * (H * K) + o_k1[:, None], mask=(o_k1 < K)[:, None] & m_t[None, :], other=0.0)
            b_h1 = tl.dot(b_kt1, b_vd, b_h1 * d_last, input_precision=PREC)
            if K > PIECE:
                b_kt2 = tl.load(kb + rows[None, :] * (H * K) + o_k2[:, None], mask=(o_k2 < K)[:, None] & m_t[None, :], other=0.0)
                b_h2 = tl.dot(b_kt2, b_vd, b_h2 * d_last, input_precision=PREC)

    if STORE_HT:
        pt = ht + i_nh.to(tl.int64) * K * V
        tl.store(pt + o_k1[:, None] * V + o_v[None, :], b_h1, mask=(o_k1 < K)[:, None] & m_v[None, :])
        if K > PIECE:
            tl.store(pt + o_k2[:, None] * V + o_v[None, :], b_h2, mask=(o_k2 < K)[:, None] & m_v[None, :])

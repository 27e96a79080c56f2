"""Variant: the state slab as ONE [KP, BV] tile (KP = next_pow2(K), rows >= K masked) instead of
64-row pieces, so w h and k^T v_d are one tl.dot each (one wgmma group and one wait per dot)."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def state_kernel(
    k, w, u, g_cs, h, v_new, h0, ht, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, PER_CHANNEL: tl.constexpr, USE_H0: tl.constexpr,
    STORE_HT: tl.constexpr, PREC: tl.constexpr, KP: tl.constexpr = 128,
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
    o_k = tl.arange(0, KP)
    m_k = o_k < K
    m_kv = m_k[:, None] & m_v[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.zeros([KP, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_nh.to(tl.int64) * K * V + p_kv, mask=m_kv, other=0.0)

    rows = tl.arange(0, BT)
    for i_t in range(n_chunks):
        tok = bos + i_t * BT
        kb = k + tok * (H * K) + i_h * K
        wb = w + tok * (HV * K) + i_hv * K
        ub = u + tok * (HV * V) + i_hv * V
        vnb = v_new + tok * (HV * V) + i_hv * V
        if PER_CHANNEL:
            gb = g_cs + tok * (HV * K) + i_hv * K
        else:
            gb = g_cs + tok * HV + i_hv
        ph = h + ((boh + i_t) * HV + i_hv) * K * V
        b_hb = b_h.to(h.dtype.element_ty)
        tl.store(ph + p_kv, b_hb, mask=m_kv)

        n_valid = seq_len - i_t * BT
        m_t = rows < n_valid
        b_w = tl.load(wb + rows[:, None] * (HV * K) + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_wh = tl.dot(b_w, b_hb.to(b_w.dtype), input_precision=PREC)
        m_tv = m_t[:, None] & m_v[None, :]
        p_uv = rows[:, None] * (HV * V) + o_v[None, :]
        b_vn = tl.load(ub + p_uv, mask=m_tv, other=0.0).to(tl.float32) - b_wh
        tl.store(vnb + p_uv, b_vn.to(v_new.dtype.element_ty), mask=m_tv)

        last = tl.minimum(n_valid, BT) - 1
        if PER_CHANNEL:
            b_vd = b_vn.to(k.dtype.element_ty)
            d = tl.math.exp2(tl.load(gb + last * (HV * K) + o_k, mask=m_k, other=0.0))[:, None]
        else:
            c_last = tl.load(gb + last * HV)
            c = tl.load(gb + rows * HV, mask=m_t, other=0.0)
            row_f = tl.where(m_t, tl.math.exp2(c_last - c), 0.0)
            b_vd = (b_vn * row_f[:, None]).to(k.dtype.element_ty)
            d = tl.math.exp2(c_last)
        b_kt = tl.load(kb + rows[None, :] * (H * K) + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_h = tl.dot(b_kt, b_vd, b_h * d, input_precision=PREC)

    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * K * V + p_kv, b_h, mask=m_kv)

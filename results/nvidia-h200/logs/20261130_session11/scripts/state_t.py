"""Prototype: the state recurrence on h^T [BV, K], so both dots take their chained operand
(h^T, then v_new^T) as the A operand straight from the previous dot's accumulator."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def state_t_kernel(
    k, w, u, g_cs, h, v_new, h0, ht, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, PER_CHANNEL: tl.constexpr, USE_H0: tl.constexpr,
    STORE_HT: tl.constexpr, PREC: tl.constexpr,
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
    o_k = tl.arange(0, BK)
    m_vk = (o_v < V)[:, None] & (o_k < K)[None, :]
    p_hT = o_k[None, :] * V + o_v[:, None]  # h^T's [BV, BK] tile inside a [K, V] state

    b_ht = tl.zeros([BV, BK], dtype=tl.float32)
    if USE_H0:
        b_ht += tl.load(h0 + i_nh.to(tl.int64) * K * V + p_hT, mask=m_vk, other=0.0).to(tl.float32)

    rows = tl.arange(0, BT)
    for i_t in range(n_chunks):
        tok = bos + i_t * BT
        kb = k + tok * (H * K) + i_h * K
        wb = w + tok * (HV * K) + i_hv * K
        ub = u + tok * (HV * V) + i_hv * V
        vnb = v_new + tok * (HV * V) + i_hv * V
        ph = h + ((boh + i_t) * HV + i_hv) * K * V
        tl.store(ph + p_hT, b_ht.to(h.dtype.element_ty), mask=m_vk)

        n_valid = seq_len - i_t * BT
        m_t = rows < n_valid
        m_kt = (o_k < K)[:, None] & m_t[None, :]
        b_wt = tl.load(wb + rows[None, :] * (HV * K) + o_k[:, None], mask=m_kt, other=0.0)  # [BK, BT]
        m_vt = (o_v < V)[:, None] & m_t[None, :]
        p_uT = rows[None, :] * (HV * V) + o_v[:, None]
        b_ut = tl.load(ub + p_uT, mask=m_vt, other=0.0).to(tl.float32)  # [BV, BT]
        b_vnt = b_ut - tl.dot(b_ht.to(b_wt.dtype), b_wt, input_precision=PREC)
        tl.store(vnb + p_uT, b_vnt.to(v_new.dtype.element_ty), mask=m_vt)

        last = tl.minimum(n_valid, BT) - 1
        b_k = tl.load(kb + rows[:, None] * (H * K) + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :],
                      other=0.0)  # [BT, BK]
        if PER_CHANNEL:
            gl = g_cs + (tok + last) * (HV * K) + i_hv * K
            d = tl.math.exp2(tl.load(gl + o_k, mask=o_k < K, other=0.0))[None, :]
            b_vdt = b_vnt.to(k.dtype.element_ty)
        else:
            gb = g_cs + tok * HV + i_hv
            c_last = tl.load(gb + last * HV)
            c = tl.load(gb + rows * HV, mask=m_t, other=0.0)
            row_f = tl.where(m_t, tl.math.exp2(c_last - c), 0.0)
            b_vdt = (b_vnt * row_f[None, :]).to(k.dtype.element_ty)
            d = tl.math.exp2(c_last)
        b_ht = tl.dot(b_vdt, b_k, b_ht * d, input_precision=PREC)

    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * K * V + p_hT, b_ht, mask=m_vk)

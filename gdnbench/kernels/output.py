"""Output kernel: o = scale * (exp(g) * (q h) + causal(q k^T * exp(g_i - g_j)) v_new).

FUSE_Q folds q's l2 norm in: every q-dependent term is linear in q's row, so the
K-tile loop runs on the raw q and one row factor 1/sqrt(ssq + eps) is applied at
the end, before the fp32 -> 16-bit cast of the intra-chunk gram.  The row sums
of squares are the diagonal of one more tensor-core product, q q^T, accumulated
in the same loop.  Measured on the H200 (B1 T8192 H16 HV32 K=V=128 bf16, Triton
3.6, the output stage alone, best config of each form): the q q^T diagonal
costs 104.7 us for the stage against 98.6 us unfused; summing the squares of the
loaded q tile instead (tl.sum in the loop) cost 117-121 us, and with the loop
software-pipelined (BK 64, 4 warps, 2 stages) it gave wrong sums (rel-RMS 0.23 of o),
as did a pair of such sums, while the dot is right in every config.

FUSE_K (GDN): v_new's rows carry k's rstd (the w/u kernel scales w and u by it), so the
loop runs on raw k and (q k^T) v_new is already (q k_norm^T) times the unscaled v_new: the
kernel does no work for k's norm.  A raw product can overflow fp32 only where |q| |k| does;
each program compares that bound (q's row sums of squares, the chunk's largest of k's from the
gram kernel) with 2^120; where it is reached the program starts again with k normalized on load,
in a call (_output_rare) on sm_90, or, on sm_100 and later, it writes a flag and a second launch
(FIXUP) redoes the flagged programs.  A row whose plain sum of squares reaches 2^100 (|x| ~ 1e15
and up) gets its rstd from a pre-scaled sum (common.row_rstd), re-read from q only then.
Limitation: the raw-q products can overflow fp32 only for |q| rows beyond ~1e36.

PER_CHANNEL (KDA): o = scale * ((q * exp(g)) h + Aqk v_new), with exp(g) per element
of the q tile and the gated causal q k^T (Aqk) precomputed by the KDA intra kernel
on q as given.  Under FUSE_Q that gram is in raw q's basis, so q's row factor
(from the same q q^T diagonal) scales the whole output row once, after Aqk v_new.
No k is read: k's norm is already inside Aqk and h.
"""

import triton
import triton.language as tl

from triton.language.target_info import cuda_capability_geq

from .common import FLAG_BLOCK, any_flagged, chunk_coords, diag_ssq, flagged, row_rstd, vec_max

# FUSE_K: a program whose |q|max |k|max reaches this runs again with k normalized on load
RAW_QK_MAX = tl.constexpr(2.0**120)
RAW_K_SSQ_MAX_FP16 = tl.constexpr(2.0**30)  # fp16: |k| >= 2^15 may take q_norm k^T out of fp16's range


@triton.jit
def _qq_dot(b_q, b_qq, PREC: tl.constexpr):
    """b_qq += q q^T (its diagonal: q's row sums of squares).  fp32 storage (tf32x3) takes it in
    ieee: on the H200 tf32x3 gave NaN outputs for fp32 q rows of 1e30 (1e25 and 1e33 were right,
    after common.diag_ssq), ieee none."""
    if PREC == "tf32x3":
        return tl.dot(b_q, tl.trans(b_q), b_qq, input_precision="ieee")
    return tl.dot(b_q, tl.trans(b_q), b_qq, input_precision=PREC)


@triton.jit
def _qh_qk(qb, kb, hb, rows, m_t, o_v, r_k, K: tl.constexpr, V: tl.constexpr, stride,
           BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FUSE_Q: tl.constexpr,
           K_ON_LOAD: tl.constexpr, PREC: tl.constexpr):
    """(q h, q k^T, q q^T) accumulated over the K-tile loop; q q^T only with FUSE_Q; K_ON_LOAD:
    k's columns multiplied by r_k on load."""
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_s = tl.zeros([BT, BT], dtype=tl.float32)
    b_qq = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(qb + rows[:, None] * stride + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_kt = tl.load(kb + rows[None, :] * stride + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        if K_ON_LOAD:
            b_kt = (b_kt.to(tl.float32) * r_k[None, :]).to(b_kt.dtype)
        b_h = tl.load(hb + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & (o_v < V)[None, :], other=0.0)
        b_o = tl.dot(b_q, b_h, b_o, input_precision=PREC)
        b_s = tl.dot(b_q, b_kt, b_s, input_precision=PREC)
        if FUSE_Q:
            b_qq = _qq_dot(b_q, b_qq, PREC)
    return b_o, b_s, b_qq


@triton.jit
def _qgh(qb, gb, hb, rows, m_t, o_v, K: tl.constexpr, V: tl.constexpr, stride, g_stride,
         BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FUSE_Q: tl.constexpr, PREC: tl.constexpr):
    """((q * exp2(g)) h, q q^T) accumulated over the K-tile loop, g per element; q q^T only with FUSE_Q.

    q q^T is issued first, as soon as q is loaded: on the H200 (kda-legacy6 h96_fixed, the stage
    alone, best of seven configs each) a copy of this kernel issuing it first cost 3.0 us over the
    plain kernel, this kernel issuing it after (q exp(g)) h 7.0 us (h64_fixed: 3.8 and 7.4 us)."""
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_qq = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_q = tl.load(qb + rows[:, None] * stride + o_k[None, :], mask=m_tk, other=0.0)
        b_g = tl.load(gb + rows[:, None] * g_stride + o_k[None, :], mask=m_tk, other=0.0)
        if FUSE_Q:
            b_qq = _qq_dot(b_q, b_qq, PREC)
        b_qg = (b_q.to(tl.float32) * tl.math.exp2(b_g)).to(b_q.dtype)  # |q exp(g)| <= |q|: no overflow
        b_h = tl.load(hb + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & (o_v < V)[None, :], other=0.0)
        b_o = tl.dot(b_qg, b_h, b_o, input_precision=PREC)
    return b_o, b_qq


@triton.jit
def _q_rstd(b_qq, qb, rows, m_t, K: tl.constexpr, stride, BK: tl.constexpr, PREC: tl.constexpr):
    """q's row rstd from the diagonal of q q^T (the rows' sums of squares)."""
    return row_rstd(qb, rows, m_t, diag_ssq(b_qq, rows, PREC), K, stride, BK)


@triton.jit
def _output(q, k, v_new, h, g_cs, rstd_k, ssq_k, aqk, o, risky, scale, tok0, n_valid, i_g, i_v, i_h, i_hv,
            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
            BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, FUSE_Q: tl.constexpr, FUSE_K: tl.constexpr,
            PER_CHANNEL: tl.constexpr, RARE: tl.constexpr, PREC: tl.constexpr):
    rows = tl.arange(0, BT)
    m_t = rows < n_valid
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V

    qb = q + tok0 * (H * K) + i_h * K
    if not PER_CHANNEL:
        kb = k + tok0 * (H * K) + i_h * K
    hb = h + (i_g * HV + i_hv) * K * V
    if PER_CHANNEL:
        b_o, b_qq = _qgh(qb, g_cs + tok0 * (HV * K) + i_hv * K, hb, rows, m_t, o_v, K, V, H * K, HV * K,
                         BT, BK, BV, FUSE_Q, PREC)
        m_tv = m_t[:, None] & m_v[None, :]
        p_tv = rows[:, None] * (HV * V) + o_v[None, :]
        b_vn = tl.load(v_new + tok0 * (HV * V) + i_hv * V + p_tv, mask=m_tv, other=0.0)
        b_A = tl.load(aqk + tok0 * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                      mask=m_t[:, None], other=0.0)
        b_o = tl.dot(b_A, b_vn.to(b_A.dtype), b_o, input_precision=PREC)
        if FUSE_Q:
            b_o = b_o * (_q_rstd(b_qq, qb, rows, m_t, K, H * K, BK, PREC) * scale)[:, None]
        else:
            b_o = b_o * scale
        tl.store(o + tok0 * (HV * V) + i_hv * V + p_tv, b_o.to(o.dtype.element_ty), mask=m_tv)
    else:
        if RARE:
            # k normalized on load, so no product can overflow
            r_k = tl.load(rstd_k + tok0 * H + i_h + rows * H, mask=m_t, other=1.0)
            b_o, b_s, b_qq = _qh_qk(qb, kb, hb, rows, m_t, o_v, r_k, K, V, H * K, BT, BK, BV, FUSE_Q, True, PREC)
        else:
            b_o, b_s, b_qq = _qh_qk(qb, kb, hb, rows, m_t, o_v, m_t, K, V, H * K, BT, BK, BV, FUSE_Q, False, PREC)
            r_k = m_t  # unused

        c = tl.load(g_cs + tok0 * HV + i_hv + rows * HV, mask=m_t, other=0.0)
        b_o = b_o * tl.math.exp2(c)[:, None]
        keep = (rows[:, None] >= rows[None, :]) & m_t[:, None] & m_t[None, :]
        b_s = tl.where(keep, b_s * tl.math.exp2(c[:, None] - c[None, :]), 0.0)
        if FUSE_Q:
            # scale before the cast: an unnormalized fp16 row could overflow fp16
            ssq = diag_ssq(b_qq, rows, PREC)
            r_q = row_rstd(qb, rows, m_t, ssq, K, H * K, BK)
            b_o = b_o * r_q[:, None]
            b_s = b_s * r_q[:, None]
        if FUSE_K and not RARE:
            # |q k^T| <= |q| |k|: where that bound reaches 2^120 (fp16: where |k| alone may take q_norm k^T
            # out of fp16's range) the program starts again with k normalized on load
            ssq_km = tl.load(ssq_k + i_g * H + i_h)
            flag = tl.sqrt(vec_max(ssq)) * tl.sqrt(ssq_km) >= RAW_QK_MAX
            if q.dtype.element_ty == tl.float16:
                flag = flag | (ssq_km >= RAW_K_SSQ_MAX_FP16)
            if cuda_capability_geq(10):
                # sm_100 (Triton 3.6): the call's dots fail to compile (ConvertNVGPUToLLVM), so the fix-up launch
                pid = (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + i_v
                tl.store(risky + pid, flag.to(tl.int8))
                _finish(v_new, o, b_o, b_s, r_k, scale, tok0, i_hv, rows, m_t, o_v, m_v, HV, V, False, PREC)
            else:
                if flag:
                    _output_rare(q, k, v_new, h, g_cs, rstd_k, o, scale, tok0, n_valid, i_g, i_v, i_h, i_hv,
                                 H, HV, K, V, BK, BV, BT, PREC)
                else:
                    _finish(v_new, o, b_o, b_s, r_k, scale, tok0, i_hv, rows, m_t, o_v, m_v, HV, V, False, PREC)
        else:
            _finish(v_new, o, b_o, b_s, r_k, scale, tok0, i_hv, rows, m_t, o_v, m_v, HV, V, RARE, PREC)


@triton.jit
def _finish(v_new, o, b_o, b_s, r_k, scale, tok0, i_hv, rows, m_t, o_v, m_v, HV: tl.constexpr, V: tl.constexpr,
            RARE: tl.constexpr, PREC: tl.constexpr):
    """GDN: o = (b_o + b_s v_new) * scale stored; RARE: v_new's rows carry r_k, divided out."""
    m_tv = m_t[:, None] & m_v[None, :]
    p_tv = rows[:, None] * (HV * V) + o_v[None, :]
    b_vn = tl.load(v_new + tok0 * (HV * V) + i_hv * V + p_tv, mask=m_tv, other=0.0)
    if RARE:
        b_vn = (b_vn.to(tl.float32) / r_k[:, None]).to(b_vn.dtype)
    b_o = tl.dot(b_s.to(b_vn.dtype), b_vn, b_o, input_precision=PREC) * scale
    tl.store(o + tok0 * (HV * V) + i_hv * V + p_tv, b_o.to(o.dtype.element_ty), mask=m_tv)


@triton.jit(noinline=True)
def _output_rare(q, k, v_new, h, g_cs, rstd_k, o, scale, tok0, n_valid, i_g, i_v, i_h, i_hv,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                 BV: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
    """_output's redo under FUSE_K on sm_90 (a program where a raw q k^T could overflow): the program again with
    k normalized on load, as a call, so the main path keeps its registers (offline sm_90: 168 and 32 B of stack;
    inlined, 384 B of spills).  H100, h2_hv8_serving, the output kernel's µs in the forward: 34.3-34.5 against
    35.6-35.9 for the main launch and the fix-up launch this replaces there."""
    _output(q, k, v_new, h, g_cs, rstd_k, None, None, o, None, scale, tok0, n_valid, i_g, i_v, i_h, i_hv,
            H, HV, K, V, BK, BV, BT, True, True, False, True, PREC)


@triton.jit
def _output_at(q, k, v_new, h, g_cs, rstd_k, ssq_k, aqk, o, risky, cu_seqlens, chunk_indices, scale, T, NT,
               i_v, i_c, i_bh, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr,
               FUSE_Q: tl.constexpr, FUSE_K: tl.constexpr, PER_CHANNEL: tl.constexpr, RARE: tl.constexpr,
               PREC: tl.constexpr):
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    _output(q, k, v_new, h, g_cs, rstd_k, ssq_k, aqk, o, risky, scale, tok0, n_valid, i_g, i_v, i_h, i_hv,
            H, HV, K, V, BK, BV, BT, FUSE_Q, FUSE_K, PER_CHANNEL, RARE, PREC)


@triton.jit(do_not_specialize=["T", "NT", "NC", "n_flags"])
def output_kernel(
    q, k, v_new, h, g_cs, rstd_k, ssq_k, aqk, o, risky, cu_seqlens, chunk_indices, scale, T, NT, NC, n_flags,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, FUSE_Q: tl.constexpr, FUSE_K: tl.constexpr, PER_CHANNEL: tl.constexpr,
    FIXUP: tl.constexpr, PREC: tl.constexpr,
):
    """Grid (cdiv(V, BV), NC chunks, B*HV).  PER_CHANNEL: g_cs is [B,T,HV,K], aqk [B,T,HV,BT], k unused.

    FUSE_K (GDN): ssq_k [chunks, H] from the gram kernel; every program writes its risky flag
    (int8, one per program: n_flags).  FIXUP: the second launch, grid cdiv(n_flags, FLAG_BLOCK),
    whose few programs read FLAG_BLOCK flags at once and redo only the flagged programs.  A fix-up
    launch of the full grid, each program reading its own flag, cost 7 us at 8K tokens and 26 us at
    32K (H200, gdn-qwen6): each of its programs carries the body's register and shared-memory
    footprint."""
    if FIXUP:
        if any_flagged(risky, n_flags):
            for j in range(FLAG_BLOCK):
                pid, is_set = flagged(risky, j, n_flags)
                if is_set:
                    i_v = pid % tl.cdiv(V, BV)
                    i_c = (pid // tl.cdiv(V, BV)) % NC
                    i_bh = pid // (tl.cdiv(V, BV) * NC)
                    _output_at(q, k, v_new, h, g_cs, rstd_k, ssq_k, aqk, o, risky, cu_seqlens, chunk_indices,
                               scale, T, NT, i_v, i_c, i_bh, H, HV, K, V, BK, BV, BT, IS_VARLEN,
                               True, True, False, True, PREC)
    else:
        _output_at(q, k, v_new, h, g_cs, rstd_k, ssq_k, aqk, o, risky, cu_seqlens, chunk_indices, scale, T, NT,
                   tl.program_id(0), tl.program_id(1), tl.program_id(2), H, HV, K, V, BK, BV, BT, IS_VARLEN,
                   FUSE_Q, FUSE_K, PER_CHANNEL, False, PREC)

"""KDA's forward in 16-token tiles, FlashKDA's decomposition (opt-in, ``GDNConfig.kda_chunk16``): two kernels.

Prepare, per (16-token tile, value head): the per-channel gate's tile-local cumsum c (log2 units, from the tile
start), k_d = k 2^c, k_i = k 2^-c, q_d = scale q 2^c, k_r = k 2^(c_last - c); the grams L = strict-lower(beta
k_d k_i^T) and M = lower(q_d k_i^T); INV = (I + L)^-1 by doubling, (I - L)(I + L^2)(I + L^4)(I + L^8) (L^16 = 0),
stored with beta folded into its columns.  With |g| <= 5 per token (the bounded-gate contract) 2^-c stays within
2^115 over 16 tokens, inside fp32's and bf16's range, so the grams are single products with no reference point.
NORM_Q / NORM_K fold the rows' l2 norm in (x / sqrt(sum x^2 + 1e-6), fp32): q's on q_d's row scale, k's rows
normalized as they load, so the loop is the same under every route (kda16_prep_kernel).

Loop, per (V block, sequence * value head): the state S [K, BV] in fp32 registers, 16 tokens a step:

    U = INV_beta (v - k_d S),  o = q_d S + M U,  S = diag(2^c_last) S + k_r^T U

so w, u, h and v_new never reach memory; per token the prepare kernel writes q_d, k_d, k_r (16-bit) and per tile
INV, M and 2^c_last.  (FlashKDA, MoonshotAI, CUTLASS: the same split; its recurrence is one program per sequence
and head, here V is split over programs as in the state kernels.)

Both kernels are searched by the autotuner (kda16_prep per norm variant, kda16_loop once), and the
`gdnbench` backend takes this form where their tuned times beat the kernels they replace (kernels/tuned.py,
kda16_choice).  On Hopper with bf16 storage and K = 128 the prepare kernel runs in CUDA C++ instead
(kda16_prep.cu, kda16_cuda.py: the same outputs, its norms at no measured cost); the Triton one here serves
everything else and the autotuner's searches.
"""

import triton
import triton.language as tl

from .common import LOG2E, chunk_coords
from .state import _sequence_span


@triton.jit
def _rstd(ptr, rows, valid, stride, K: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr, MMA: tl.constexpr):
    """1 / sqrt(sum x^2 + 1e-6) of the rows of a [16, K] head slice, BKS columns a step: the squares' row sums, or
    (MMA, 16-bit x, in steps) the diagonal of x x^T on the tensor cores (16-bit products are exact in fp32).
    Offline (sm_90, one warp, tf32_grams, BK 64) MMA takes fewer instructions and more registers: the prepare
    kernel's common path (to its first EXIT) 3751 SASS instructions at 255 registers and 16 B of stack under fused_q
    against 3900 at 210 (flag 3719 at 202), and under fused_qk, whose rows are normalized on load where K comes in
    steps, 4104 in all at 255 and 48 B against 4184 at 254; in one step it left 840 B of stack against the row sums' 232, so there
    the row sums stay.  Which wins is the search's (``KernelConfig.mma_sums``)."""
    xx = tl.zeros([16, 16], dtype=tl.float32)
    sq = tl.zeros([16, BKS], dtype=tl.float32)  # the squares summed over the steps, then over the row once
    for k0 in tl.static_range(0, BK, BKS):
        o_k = k0 + tl.arange(0, BKS)
        x = tl.load(ptr + rows[:, None] * stride + o_k[None, :], mask=valid[:, None] & (o_k < K)[None, :],
                    other=0.0)
        if not MMA or x.dtype == tl.float32 or BKS == BK:
            sq += x.to(tl.float32) * x.to(tl.float32)
        else:
            xx = tl.dot(x, tl.trans(x), xx)
    if MMA and ptr.dtype.element_ty != tl.float32 and BKS < BK:
        ssq = tl.sum(tl.where(rows[:, None] == rows[None, :], xx, 0.0), 1)
    else:
        ssq = tl.sum(sq, 1)
    return tl.rsqrt(ssq + 1e-6)


@triton.jit
def _tf32(x):
    """fp32 x rounded to tf32's 10 mantissa bits, to nearest: a tf32 product of it truncates nothing."""
    b = x.to(tl.uint32, bitcast=True)
    return ((b + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _tile_steps(p_q, p_k, g, qd, kd, kr, dec, t0, n, rows, valid, i_hv, slot, r_q, r_k, H: tl.constexpr,
                HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr, SCALE_K: tl.constexpr,
                TF32_GRAMS: tl.constexpr, ROW_Q: tl.constexpr = False, ROW_K: tl.constexpr = False):
    """A tile's BKS-channel steps: q_d (rows times r_q), k_d, k_r (rows times r_k where SCALE_K) and 2^c_last
    stored; returns the grams k_d k_i^T and q_d k_i^T, summed over the steps.  ROW_Q / ROW_K (one step): q's / k's
    rstd from the step's own load."""
    a_l = tl.zeros([16, 16], dtype=tl.float32)
    a_m = tl.zeros([16, 16], dtype=tl.float32)
    r_row = tl.full([16], 1.0, tl.float32)
    for k0 in tl.static_range(0, BK, BKS):
        o_k = k0 + tl.arange(0, BKS)
        m = valid[:, None] & (o_k < K)[None, :]
        c = tl.cumsum(tl.load(g + (t0 + rows[:, None]) * (HV * K) + i_hv * K + o_k[None, :], mask=m,
                              other=0.0).to(tl.float32), 0) * LOG2E
        c_last = tl.sum(tl.where(rows[:, None] == tl.minimum(n, 16) - 1, c, 0.0), 0)
        b_k = tl.load(p_k + rows[:, None] * (H * K) + o_k[None, :], mask=m, other=0.0).to(tl.float32)
        b_q = tl.load(p_q + rows[:, None] * (H * K) + o_k[None, :], mask=m, other=0.0).to(tl.float32)
        if ROW_K:  # normalized before the gates touch it: k 2^-c cannot overflow
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]
        elif SCALE_K:
            b_k = b_k * r_k[:, None]
        # rows past the tile's end load g = 0 and keep c_last; their k and q are zero
        e = tl.math.exp2(c)
        k_d = b_k * e
        k_i = b_k * tl.math.exp2(-c)
        if ROW_Q:  # one step: q's rstd from this load, applied to M's rows after the product
            r_row = tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)
            q_e = b_q * e
            q_d = q_e * (r_q * r_row)[:, None]
        else:
            q_e = b_q * e * r_q[:, None]
            q_d = q_e
        # k 2^(c_last - c) as k_i 2^c_last: one exp2 per element fewer (offline, sm_90, one warp, BK 64: flag 3896 ->
        # 3728 SASS instructions, 234 -> 202 registers); 2^c_last >= 2^-116 under bounded gates, a normal fp32
        d_last = tl.math.exp2(c_last)
        k_r = k_i * d_last[None, :]
        p_tok = (t0 + rows[:, None]) * (HV * K) + i_hv * K + o_k[None, :]
        tl.store(qd + p_tok, q_d.to(qd.dtype.element_ty), mask=m)
        tl.store(kd + p_tok, k_d.to(kd.dtype.element_ty), mask=m)
        tl.store(kr + p_tok, k_r.to(kr.dtype.element_ty), mask=m)
        # a tf32 product truncates its fp32 operands, which biased o by 7e-4 on the H200 (budget 8e-5): tf32x3, or
        # operands rounded to tf32 first (TF32_GRAMS, 16-bit storage)
        if TF32_GRAMS:
            k_t = tl.trans(_tf32(k_i))
            a_l = tl.dot(_tf32(k_d), k_t, a_l, input_precision="tf32")
            a_m = tl.dot(_tf32(q_e), k_t, a_m, input_precision="tf32")
        else:
            a_l = tl.dot(k_d, tl.trans(k_i), a_l, input_precision="tf32x3")
            a_m = tl.dot(q_e, tl.trans(k_i), a_m, input_precision="tf32x3")
        # after the products: stored before them it left the one-step form 752 B of stack at one warp, not 256
        tl.store(dec + slot * K + o_k, d_last, mask=o_k < K)
    if ROW_Q:
        a_m = a_m * (r_q * r_row)[:, None]
    return a_l, a_m


@triton.jit
def _solve_store(a_l, a_m, b_beta, inv, mqk, slot, rows):
    """L = strict-lower(diag(beta) G) from the k gram G = k_d k_i^T and M = lower(q_d k_i^T); INV = (I + L)^-1 by
    doubling, stored as INV diag(beta)."""
    lower = rows[:, None] > rows[None, :]
    a_l = tl.where(lower, a_l * b_beta[:, None], 0.0)
    a_m = tl.where(lower | (rows[:, None] == rows[None, :]), a_m, 0.0)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    x = eye - a_l
    p = tl.dot(a_l, a_l, input_precision="tf32x3")  # L^2, L^4, L^8: strictly lower, nilpotent
    x = x + tl.dot(x, p, input_precision="tf32x3")
    p = tl.dot(p, p, input_precision="tf32x3")
    x = x + tl.dot(x, p, input_precision="tf32x3")
    p = tl.dot(p, p, input_precision="tf32x3")
    x = x + tl.dot(x, p, input_precision="tf32x3")
    x = x * b_beta[None, :]  # U = INV diag(beta) (v - k_d S)
    p_tile = slot * 256 + rows[:, None] * 16 + rows[None, :]
    tl.store(inv + p_tile, x.to(inv.dtype.element_ty))
    tl.store(mqk + p_tile, a_m.to(mqk.dtype.element_ty))


@triton.jit
def _tile_beta(beta, t0, n, i_hv, HV: tl.constexpr):
    rows = tl.arange(0, 16)
    return tl.load(beta + (t0 + rows) * HV + i_hv, mask=rows < n, other=0.0).to(tl.float32)


@triton.jit(noinline=True)
def _prep_normed_steps(p_q, p_k, g, beta, qd, kd, kr, inv, mqk, dec, t0, n, i_hv, slot, scale, H: tl.constexpr,
                       HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr, NORM_Q: tl.constexpr,
                       TF32_GRAMS: tl.constexpr, MMA_SUMS: tl.constexpr):
    """NORM_K with K in steps, where k_r is stored a step at a time: the rows' rstd first (_rstd), then the steps
    on rows normalized as they load.  A call, the form searched on the H200 (fused_qk at BK 64: 534.9 us at
    h96_fixed against flag's 567.2); a noinline call takes scalars only (Triton 3.6), so q's rstd, the rows and
    beta are formed here, not passed (the caller's beta goes unused on this path)."""
    rows = tl.arange(0, 16)
    valid = rows < n
    r_q = tl.full([16], 1.0, tl.float32) * scale
    if NORM_Q:
        r_q = r_q * _rstd(p_q, rows, valid, H * K, K, BK, BKS, MMA_SUMS)
    r_k = _rstd(p_k, rows, valid, H * K, K, BK, BKS, MMA_SUMS)
    a_l, a_m = _tile_steps(p_q, p_k, g, qd, kd, kr, dec, t0, n, rows, valid, i_hv, slot, r_q, r_k, H, HV, K, BK,
                           BKS, True, TF32_GRAMS)
    _solve_store(a_l, a_m, _tile_beta(beta, t0, n, i_hv, HV), inv, mqk, slot, rows)


@triton.jit
def kda16_prep_kernel(q, k, g, beta, qd, kd, kr, inv, mqk, dec, cu_seqlens, chunk_indices, T, NT, scale,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr,
                      IS_VARLEN: tl.constexpr, NORM_Q: tl.constexpr, NORM_K: tl.constexpr,
                      TF32_GRAMS: tl.constexpr, MMA_SUMS: tl.constexpr):
    """Grid (64-token chunks, B*HV, 4): tile i_s of chunk i_c.  q, k [B,T,H,K]; g [B,T,HV,K] natural-log gates;
    beta [B,T,HV]; qd, kd, kr [B,T,HV,K] in k's dtype; inv, mqk [chunks*4, HV, 16, 16] in k's dtype; dec
    [chunks*4, HV, K] fp32 (2^c_last).  The grams take fp32 operands (fp32's exponent range holds k 2^-c; a
    16-bit k would not in fp16), as tf32x3 products or (TF32_GRAMS) one tf32 product of rounded operands.
    BKS of the K channels a step (``KernelConfig.BK``; the gate's cumsum runs per channel, the grams accumulate
    over the steps).  NORM_Q: q's row sums come first, in steps of their own (MMA_SUMS: on the tensor cores), and
    its rstd rides on q_d's scale; under NORM_K in one step the rstd comes from the step's own load and scales M's
    rows after the product (on the H200, the prepare op alone at h96_fixed, that form took fused_q 556.7 us against
    524.0 for the sums first; fused_qk in it 535.7).  NORM_K: k's rows normalized as they load,
    before the gates touch them (k 2^-c cannot overflow, and the loop needs no rstd), their sums in one step from
    the step's own load (ROW_K), in K steps first (_prep_normed_steps).  In one step (offline, sm_90, one warp,
    tf32_grams, T 8192) fused_q compiles to 3920 SASS instructions at 112 B of stack and fused_qk to 4112 at 72 B,
    against flag's 3768 at 136 B (packed sequences: 3920 at 128 B, 4088 at 64 B, flag 3792 at 160 B).  Keeping k's rows raw in the grams instead
    (r from the k gram's diagonal folded into L, M and k_r, the loop applying it to k_d S, a rare path for |k| >=
    2^12) passed the gate on the H200 with the same errors but compiled to 4167 SASS instructions at 176 B of stack
    (one step, dense, offline); carrying r on U against raw M and k_r had raised fused_qk's final-state scale error
    4-20x (1.15e-4 against a budget of 1.07e-4 at h96_uniform)."""
    i_c, i_bh, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, 64, IS_VARLEN)
    t0 = tok0 + i_s * 16
    n = n_valid - i_s * 16
    rows = tl.arange(0, 16)
    valid = rows < n
    p_q = q + t0 * (H * K) + i_h * K
    p_k = k + t0 * (H * K) + i_h * K
    r_q = tl.full([16], 1.0, tl.float32) * scale  # q_d's row scale: the attention scale, times q's rstd
    if NORM_Q and not NORM_K:  # fused_qk forms it from the step's own load (ROW_Q) or in _prep_normed_steps
        r_q = r_q * _rstd(p_q, rows, valid, H * K, K, BK, BKS, MMA_SUMS)
    b_beta = _tile_beta(beta, t0, n, i_hv, HV)
    slot = (i_g * 4 + i_s) * HV + i_hv
    if NORM_K and BKS < BK:
        _prep_normed_steps(p_q, p_k, g, beta, qd, kd, kr, inv, mqk, dec, t0, n, i_hv, slot, scale, H, HV, K, BK, BKS,
                           NORM_Q, TF32_GRAMS, MMA_SUMS)
    else:
        a_l, a_m = _tile_steps(p_q, p_k, g, qd, kd, kr, dec, t0, n, rows, valid, i_hv, slot, r_q, r_q, H, HV, K, BK,
                               BKS, False, TF32_GRAMS, NORM_Q and NORM_K and BKS == BK, NORM_K)
        _solve_store(a_l, a_m, b_beta, inv, mqk, slot, rows)


# The same kernel compiled for any T (``KernelConfig.generic_t``, searched).  Specialized on T % 16 == 0 (the
# default, as every T of a contract shape is), the one-step form for a dense batch compiles with more stack than for
# packed sequences (offline, sm_90, one warp, tf32_grams: flag 3936 SASS instructions at 288 B against 3792 at 160 B;
# unspecialized 3768 at 136 B).  On the H200, the prepare op alone at h96_fixed: flag in one step 713.6 us
# specialized, 518.5 not (searched: 499.8; specialized its best was BK 64, 568.1); fused_qk at BK 64 and a cap of 160
# registers 539.4 specialized, 552.4 not.  Whole forwards: flag 1452 -> 1393, fused_q 1363 -> 1319 (kda-legacy6).
kda16_prep_kernel_any_t = triton.jit(do_not_specialize=["T"])(kda16_prep_kernel.fn)


@triton.jit(do_not_specialize=["T"])
def kda16_loop_kernel(qd, kd, kr, v, inv, mqk, dec, o, h0, ht, cu_seqlens, chunk_offsets, T, NT,
                      HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                      IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, PREC: tl.constexpr):
    """Grid (cdiv(V, BV), N*HV).  o like v; h0 / ht [N, HV, K, V] fp32."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    bos, seq_len = _sequence_span(cu_seqlens, i_n, T, IS_VARLEN)
    if IS_VARLEN:
        tile0 = tl.load(chunk_offsets + i_n).to(tl.int64) * 4
    else:
        tile0 = i_n.to(tl.int64) * NT * 4
    rows = tl.arange(0, 16)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_s += tl.load(h0 + i_nh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :],
                       mask=m_k[:, None] & m_v[None, :], other=0.0)
    for j in range(tl.cdiv(seq_len, 16)):
        tok = bos + j * 16
        m_t = rows < seq_len - j * 16
        p_tok = tok * (HV * K) + i_hv * K + rows[:, None] * (HV * K) + o_k[None, :]
        m_tk = m_t[:, None] & m_k[None, :]
        b_kd = tl.load(kd + p_tok, mask=m_tk, other=0.0)
        b_qd = tl.load(qd + p_tok, mask=m_tk, other=0.0)
        b_kr = tl.load(kr + p_tok, mask=m_tk, other=0.0)
        slot = (tile0 + j) * HV + i_hv
        b_inv = tl.load(inv + slot * 256 + rows[:, None] * 16 + rows[None, :])
        b_m = tl.load(mqk + slot * 256 + rows[:, None] * 16 + rows[None, :])
        b_dec = tl.load(dec + slot * K + o_k, mask=m_k, other=0.0)
        m_tv = m_t[:, None] & m_v[None, :]
        p_v = tok * (HV * V) + i_hv * V + rows[:, None] * (HV * V) + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_sd = b_s.to(b_kd.dtype)
        b_x = b_v - tl.dot(b_kd, b_sd, input_precision=PREC)
        b_u = tl.dot(b_inv, b_x.to(b_inv.dtype), input_precision=PREC)
        b_uo = b_u.to(v.dtype.element_ty).to(b_m.dtype)  # U as a two-kernel path would store it
        b_o = tl.dot(b_m, b_uo, tl.dot(b_qd, b_sd, input_precision=PREC), input_precision=PREC)
        tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_tv)
        b_s = tl.dot(tl.trans(b_kr), b_u.to(b_kr.dtype), b_s * b_dec[:, None], input_precision=PREC)
    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :], b_s,
                 mask=m_k[:, None] & m_v[None, :])

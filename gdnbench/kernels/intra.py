"""Intra-chunk kernels: gate cumsum, beta*K K^T gram, (I + A)^-1, and w/u.

Per chunk of BT = 64 tokens and value head, with L = strictly-lower part of
``diag(beta) (K K^T * exp(g_i - g_j))``, the delta rule's WY form is

    A = (I + L)^-1,   w = A (beta * exp(g) * k),   u = A (beta * v).

The gram is accumulated as ten 16x16 blocks (four diagonal, six below), once per
key head for all its value heads where there are programs enough; each diagonal
block is inverted by doubling, (I - L)(I + L^2)(I + L^4)(I + L^8), and the
off-diagonal blocks of the inverse follow from (I + L) A = I block row by
block row, using tl.dot.  A is stored in k's dtype for the w/u kernel.

KDA gates each key channel: its gram kernel (``kda_intra_kernel``) builds the gated
grams sum_c k_ic k_jc exp(g_ic - g_jc) and the same with q (Aqk, for the output
kernel), then runs the same solve; the w/u kernel takes the gate kind as a
constexpr (PER_CHANNEL) and, for KDA, also writes kg = k * exp(g_last - g), the
state update's key operand.
"""

import triton
import triton.language as tl

from .common import (FLAG_BLOCK, L2_EPS, LOG2E, SSQ_BIG, any_flagged, chunk_coords, diag_ssq, flagged, l2_rstd,
                     row_rstd, row_sq_sums, vec_max)

# KDA, fused_qk: above this sum of squares a raw k row times its e^75 gate factor may overflow fp32
RAW_K_SSQ_MAX = tl.constexpr(2.0**38)


@triton.jit
def _load_rows(base, rows, m_t, o_k, K: tl.constexpr, stride):
    return tl.load(base + rows[:, None] * stride + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :], other=0.0)


@triton.jit
def _normalized(x, r, NORMALIZE: tl.constexpr):
    if NORMALIZE:
        x = (x.to(tl.float32) * r[:, None]).to(x.dtype)
    return x


@triton.jit
def _gram_blocks(kb, r0, r1, r2, r3, m0, m1, m2, m3, n0, n1, n2, n3, stride,
                 K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, NORMALIZE: tl.constexpr,
                 PREC: tl.constexpr):
    """Lower blocks G_ij = K_i K_j^T (i >= j) of one chunk's gram; NORMALIZE: rows multiplied
    by their rstd n_i on load."""
    g00 = tl.zeros([BC, BC], dtype=tl.float32)
    g10 = tl.zeros([BC, BC], dtype=tl.float32)
    g11 = tl.zeros([BC, BC], dtype=tl.float32)
    g20 = tl.zeros([BC, BC], dtype=tl.float32)
    g21 = tl.zeros([BC, BC], dtype=tl.float32)
    g22 = tl.zeros([BC, BC], dtype=tl.float32)
    g30 = tl.zeros([BC, BC], dtype=tl.float32)
    g31 = tl.zeros([BC, BC], dtype=tl.float32)
    g32 = tl.zeros([BC, BC], dtype=tl.float32)
    g33 = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        k0 = _normalized(_load_rows(kb, r0, m0, o_k, K, stride), n0, NORMALIZE)
        k1 = _normalized(_load_rows(kb, r1, m1, o_k, K, stride), n1, NORMALIZE)
        k2 = _normalized(_load_rows(kb, r2, m2, o_k, K, stride), n2, NORMALIZE)
        k3 = _normalized(_load_rows(kb, r3, m3, o_k, K, stride), n3, NORMALIZE)
        g00 = tl.dot(k0, tl.trans(k0), g00, input_precision=PREC)
        g10 = tl.dot(k1, tl.trans(k0), g10, input_precision=PREC)
        g11 = tl.dot(k1, tl.trans(k1), g11, input_precision=PREC)
        g20 = tl.dot(k2, tl.trans(k0), g20, input_precision=PREC)
        g21 = tl.dot(k2, tl.trans(k1), g21, input_precision=PREC)
        g22 = tl.dot(k2, tl.trans(k2), g22, input_precision=PREC)
        g30 = tl.dot(k3, tl.trans(k0), g30, input_precision=PREC)
        g31 = tl.dot(k3, tl.trans(k1), g31, input_precision=PREC)
        g32 = tl.dot(k3, tl.trans(k2), g32, input_precision=PREC)
        g33 = tl.dot(k3, tl.trans(k3), g33, input_precision=PREC)
    return g00, g10, g11, g20, g21, g22, g30, g31, g32, g33


@triton.jit
def _rows_rstd(kb, rows, m_t, K: tl.constexpr, stride, BK: tl.constexpr):
    """Overflow-safe rstd of the rows of k from both sums of squares, read from k."""
    ssq, lo = row_sq_sums(kb, rows, m_t, K, stride, BK, True, True)
    return l2_rstd(ssq, lo)


@triton.jit
def _rows_ssq(kb, rows, m_t, K: tl.constexpr, stride, BK: tl.constexpr):
    """Exact fp32 sums of squares of rows of k, read from k.  With fp32 storage a tf32x3 gram's
    diagonal is no such sum for a huge row: its split products overflow with either sign (H200: KDA
    fused_qk k rows of 1e25 gave a NaN rstd, 1e20 and 1e30 did not), so fp32 takes the sums from here."""
    ssq, _ = row_sq_sums(kb, rows, m_t, K, stride, BK, True, False)
    return ssq


@triton.jit
def _keep(m_i, m_j, o, DIAG: tl.constexpr, STRICT: tl.constexpr):
    """Valid entries of block (i, j); on a diagonal block only the lower (STRICT: strictly lower) part."""
    keep = m_i[:, None] & m_j[None, :]
    if DIAG:
        if STRICT:
            keep = keep & (o[:, None] > o[None, :])
        else:
            keep = keep & (o[:, None] >= o[None, :])
    return keep


@triton.jit
def _gate_block(G, b_i, c_i, c_j, m_i, m_j, DIAG: tl.constexpr, o):
    """L_ij = beta_i * G_ij * exp2(c_i - c_j) on valid (and, on the diagonal, strictly lower) entries."""
    keep = _keep(m_i, m_j, o, DIAG, True)
    # where() after the product: exp2 of an out-of-range difference may be inf, never selected
    return tl.where(keep, G * tl.math.exp2(c_i[:, None] - c_j[None, :]) * b_i[:, None], 0.0)


@triton.jit
def _unit_lower_inverse_doubling(L, o, PREC: tl.constexpr):
    """(I + L)^-1 of a strictly lower-triangular [16, 16] block as (I - L)(I + L^2)(I + L^4)(I + L^8)
    (L^16 = 0): four dependent dots where substitution takes fifteen dependent row steps."""
    eye = (o[:, None] == o[None, :]).to(tl.float32)
    L2 = tl.dot(L, L, input_precision=PREC)
    L4 = tl.dot(L2, L2, input_precision=PREC)
    X = tl.dot(eye - L, eye + L2, input_precision=PREC)
    X = tl.dot(X, eye + L4, input_precision=PREC)
    return tl.dot(X, eye + tl.dot(L4, L4, input_precision=PREC), input_precision=PREC)


@triton.jit
def _store_block(base, rows, m_t, col0, blk, stride, o):
    tl.store(base + rows[:, None] * stride + (col0 + o)[None, :], blk.to(base.dtype.element_ty), mask=m_t[:, None])


@triton.jit
def _scale_blocks(g00, g10, g11, g20, g21, g22, g30, g31, g32, g33, a0, a1, a2, a3, n0, n1, n2, n3):
    """diag(a) G diag(n) on the lower blocks (a = n: the gram of rows scaled by n)."""
    g00 = g00 * a0[:, None] * n0[None, :]
    g10 = g10 * a1[:, None] * n0[None, :]
    g11 = g11 * a1[:, None] * n1[None, :]
    g20 = g20 * a2[:, None] * n0[None, :]
    g21 = g21 * a2[:, None] * n1[None, :]
    g22 = g22 * a2[:, None] * n2[None, :]
    g30 = g30 * a3[:, None] * n0[None, :]
    g31 = g31 * a3[:, None] * n1[None, :]
    g32 = g32 * a3[:, None] * n2[None, :]
    g33 = g33 * a3[:, None] * n3[None, :]
    return g00, g10, g11, g20, g21, g22, g30, g31, g32, g33


@triton.jit
def _unit_lower_solve(l00, l10, l11, l20, l21, l22, l30, l31, l32, l33, o, BC: tl.constexpr, PREC: tl.constexpr):
    """(I + L)^-1 of a strictly lower [4 BC, 4 BC] matrix given as its ten lower blocks: the diagonal
    blocks by doubling (:func:`_unit_lower_inverse_doubling`), then the block rows of (I + L) X = I.

    Doubling, not forward substitution, since the substitution's fifteen dependent row steps per
    block, each two cross-lane reductions, were half of GDN gram_solve's time: H200, gdn-qwen6, this
    kernel alone, 165.5 -> 80.0 us at h16_hv64_fixed8k, 331.6 -> 163.2 at h16_hv32_fixed32k, 22 -> 11
    on the small shapes; A against the fp64 inverse rel-RMS 5.4e-5 (5.1e-5 substituting; A is bf16)."""
    x00 = _unit_lower_inverse_doubling(l00, o, PREC)
    x11 = _unit_lower_inverse_doubling(l11, o, PREC)
    x22 = _unit_lower_inverse_doubling(l22, o, PREC)
    x33 = _unit_lower_inverse_doubling(l33, o, PREC)
    x10 = -tl.dot(x11, tl.dot(l10, x00, input_precision=PREC), input_precision=PREC)
    x21 = -tl.dot(x22, tl.dot(l21, x11, input_precision=PREC), input_precision=PREC)
    x20 = -tl.dot(x22, tl.dot(l20, x00, input_precision=PREC) + tl.dot(l21, x10, input_precision=PREC),
                  input_precision=PREC)
    x32 = -tl.dot(x33, tl.dot(l32, x22, input_precision=PREC), input_precision=PREC)
    x31 = -tl.dot(x33, tl.dot(l31, x11, input_precision=PREC) + tl.dot(l32, x21, input_precision=PREC),
                  input_precision=PREC)
    x30 = -tl.dot(x33, tl.dot(l30, x00, input_precision=PREC) + tl.dot(l31, x10, input_precision=PREC)
                  + tl.dot(l32, x20, input_precision=PREC), input_precision=PREC)
    return x00, x10, x11, x20, x21, x22, x30, x31, x32, x33


@triton.jit
def _store_lower(ab, r0, r1, r2, r3, m0, m1, m2, m3, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33,
                 st, o, BC: tl.constexpr):
    """Store all 16 blocks of a block-lower [4 BC, 4 BC] tile (zeros above), so it needs no memset."""
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    _store_block(ab, r0, m0, 0, x00, st, o)
    _store_block(ab, r0, m0, BC, zero, st, o)
    _store_block(ab, r0, m0, 2 * BC, zero, st, o)
    _store_block(ab, r0, m0, 3 * BC, zero, st, o)
    _store_block(ab, r1, m1, 0, x10, st, o)
    _store_block(ab, r1, m1, BC, x11, st, o)
    _store_block(ab, r1, m1, 2 * BC, zero, st, o)
    _store_block(ab, r1, m1, 3 * BC, zero, st, o)
    _store_block(ab, r2, m2, 0, x20, st, o)
    _store_block(ab, r2, m2, BC, x21, st, o)
    _store_block(ab, r2, m2, 2 * BC, x22, st, o)
    _store_block(ab, r2, m2, 3 * BC, zero, st, o)
    _store_block(ab, r3, m3, 0, x30, st, o)
    _store_block(ab, r3, m3, BC, x31, st, o)
    _store_block(ab, r3, m3, 2 * BC, x32, st, o)
    _store_block(ab, r3, m3, 3 * BC, x33, st, o)


@triton.jit
def _gram_solve(k, g, beta, g_cs, A, rstd_k, ssq_k, tok0, n_valid, i_g, i_h, hv0,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
                BT: tl.constexpr, BC: tl.constexpr, FUSE_K: tl.constexpr, RARE: tl.constexpr, PREC: tl.constexpr,
                N_HV: tl.constexpr):
    """One chunk of key head i_h: the gram once, then gate, solve and store for value heads hv0 .. hv0 + N_HV."""
    o = tl.arange(0, BC)  # rows of sub-block j are j*BC + o within the chunk
    r0 = o
    r1 = o + BC
    r2 = o + 2 * BC
    r3 = o + 3 * BC
    m0, m1, m2, m3 = r0 < n_valid, r1 < n_valid, r2 < n_valid, r3 < n_valid

    # ---- gram K K^T; with FUSE_K, k's rstd from its diagonal blocks (the rows' sums of squares,
    # free), applied to the gram's rows and columns and written here, where k is first read
    kb = k + tok0 * (H * K) + i_h * K
    if RARE:
        # the rare path, for a chunk whose largest sum of squares reached SSQ_BIG (the raw gram may
        # have overflowed): overflow-safe rstd read from k, and the gram of rows normalized on load
        n0 = _rows_rstd(kb, r0, m0, K, H * K, BK)
        n1 = _rows_rstd(kb, r1, m1, K, H * K, BK)
        n2 = _rows_rstd(kb, r2, m2, K, H * K, BK)
        n3 = _rows_rstd(kb, r3, m3, K, H * K, BK)
        g00, g10, g11, g20, g21, g22, g30, g31, g32, g33 = _gram_blocks(
            kb, r0, r1, r2, r3, m0, m1, m2, m3, n0, n1, n2, n3, H * K, K, BK, BC, True, PREC)
        _rstd_and_solves(g, beta, g_cs, A, rstd_k, tok0, i_h, hv0, g00, g10, g11, g20, g21, g22, g30, g31, g32, g33,
                         n0, n1, n2, n3, r0, r1, r2, r3, m0, m1, m2, m3, o, H, HV, BT, BC, True, PREC, N_HV)
    else:
        one = tl.full([BC], 1.0, dtype=tl.float32)
        g00, g10, g11, g20, g21, g22, g30, g31, g32, g33 = _gram_blocks(
            kb, r0, r1, r2, r3, m0, m1, m2, m3, one, one, one, one, H * K, K, BK, BC, False, PREC)
        if FUSE_K:
            if PREC == "tf32x3":
                s0, s1 = _rows_ssq(kb, r0, m0, K, H * K, BK), _rows_ssq(kb, r1, m1, K, H * K, BK)
                s2, s3 = _rows_ssq(kb, r2, m2, K, H * K, BK), _rows_ssq(kb, r3, m3, K, H * K, BK)
            else:
                s0, s1 = diag_ssq(g00, o, PREC), diag_ssq(g11, o, PREC)
                s2, s3 = diag_ssq(g22, o, PREC), diag_ssq(g33, o, PREC)
            sm = tl.maximum(tl.maximum(tl.max(s0, 0), tl.max(s1, 0)), tl.maximum(tl.max(s2, 0), tl.max(s3, 0)))
            if hv0 % (HV // H) == 0:  # one writer per key head
                tl.store(ssq_k + i_g * H + i_h, sm)
            if sm >= SSQ_BIG:
                # BK 16: the call's own shared memory stays within the main path's
                _gram_solve_rare(k, g, beta, g_cs, A, rstd_k, ssq_k, tok0, n_valid, i_g, i_h, hv0,
                                 H, HV, K, 16, BT, BC, PREC, N_HV)
            else:
                n0 = 1.0 / tl.sqrt(s0 + L2_EPS)
                n1 = 1.0 / tl.sqrt(s1 + L2_EPS)
                n2 = 1.0 / tl.sqrt(s2 + L2_EPS)
                n3 = 1.0 / tl.sqrt(s3 + L2_EPS)
                g00, g10, g11, g20, g21, g22, g30, g31, g32, g33 = _scale_blocks(
                    g00, g10, g11, g20, g21, g22, g30, g31, g32, g33, n0, n1, n2, n3, n0, n1, n2, n3)
                _rstd_and_solves(g, beta, g_cs, A, rstd_k, tok0, i_h, hv0,
                                 g00, g10, g11, g20, g21, g22, g30, g31, g32, g33, n0, n1, n2, n3,
                                 r0, r1, r2, r3, m0, m1, m2, m3, o, H, HV, BT, BC, True, PREC, N_HV)
        else:
            _rstd_and_solves(g, beta, g_cs, A, rstd_k, tok0, i_h, hv0, g00, g10, g11, g20, g21, g22, g30, g31, g32, g33,
                             one, one, one, one, r0, r1, r2, r3, m0, m1, m2, m3, o, H, HV, BT, BC, False, PREC, N_HV)


@triton.jit(noinline=True)
def _gram_solve_rare(k, g, beta, g_cs, A, rstd_k, ssq_k, tok0, n_valid, i_g, i_h, hv0, H: tl.constexpr,
                     HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                     PREC: tl.constexpr, N_HV: tl.constexpr):
    """_gram_solve's rare path (FUSE_K, a chunk with a k row whose sum of squares reached SSQ_BIG) as a call,
    not inlined: its registers and stack are its own, so the main path keeps its allocation.  H200, gram alone
    at the shipped fused_qk entries against the main launch plus the fix-up launch this replaced, µs:
    h16_hv32_fixed8k 44.8 -> 42.8, h4_hv8_mixed 16.8-18.7 -> 15.2-15.8, h2_hv8_serving 16.8-17.7 -> 15.6-17.2,
    32K within 1; HV48 and HV64 +0.6 and +1.5 at register caps searched for the launch form.  The same path
    inlined (a branch in the main program) cost 44.6 -> 49.5 at HV32 8K and 72.1 -> 76.4 at HV64."""
    _gram_solve(k, g, beta, g_cs, A, rstd_k, ssq_k, tok0, n_valid, i_g, i_h, hv0, H, HV, K, BK, BT, BC, True, True,
                PREC, N_HV)


@triton.jit
def _rstd_and_solves(g, beta, g_cs, A, rstd_k, tok0, i_h, hv0, g00, g10, g11, g20, g21, g22, g30, g31, g32, g33,
                     n0, n1, n2, n3, r0, r1, r2, r3, m0, m1, m2, m3, o, H: tl.constexpr, HV: tl.constexpr,
                     BT: tl.constexpr, BC: tl.constexpr, FUSE_K: tl.constexpr, PREC: tl.constexpr,
                     N_HV: tl.constexpr):
    """k's rstd n0..n3 stored (FUSE_K, one writer per key head), then gate, solve and store per value head."""
    if FUSE_K:
        if hv0 % (HV // H) == 0:
            rb = rstd_k + tok0 * H + i_h
            tl.store(rb + r0 * H, n0, mask=m0)
            tl.store(rb + r1 * H, n1, mask=m1)
            tl.store(rb + r2 * H, n2, mask=m2)
            tl.store(rb + r3 * H, n3, mask=m3)
    for r in range(N_HV):
        _gate_solve_store(g, beta, g_cs, A, tok0, hv0 + r, g00, g10, g11, g20, g21, g22, g30, g31, g32, g33,
                          r0, r1, r2, r3, m0, m1, m2, m3, o, HV, BT, BC, PREC)


@triton.jit
def _gate_solve_store(g, beta, g_cs, A, tok0, i_hv, g00, g10, g11, g20, g21, g22, g30, g31, g32, g33,
                      r0, r1, r2, r3, m0, m1, m2, m3, o, HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                      PREC: tl.constexpr):
    """Value head i_hv of a chunk: its gate cumsum (stored), L = strict-lower(beta * gram * decay),
    A = (I + L)^-1 stored in A's dtype."""
    gb = g + tok0 * HV + i_hv
    g0 = tl.load(gb + r0 * HV, mask=m0, other=0.0).to(tl.float32)
    g1 = tl.load(gb + r1 * HV, mask=m1, other=0.0).to(tl.float32)
    g2 = tl.load(gb + r2 * HV, mask=m2, other=0.0).to(tl.float32)
    g3 = tl.load(gb + r3 * HV, mask=m3, other=0.0).to(tl.float32)
    c0 = tl.cumsum(g0, 0)
    c1 = tl.cumsum(g1, 0) + tl.sum(g0, 0)
    c2 = tl.cumsum(g2, 0) + tl.sum(g0, 0) + tl.sum(g1, 0)
    c3 = tl.cumsum(g3, 0) + tl.sum(g0, 0) + tl.sum(g1, 0) + tl.sum(g2, 0)
    c0, c1, c2, c3 = c0 * LOG2E, c1 * LOG2E, c2 * LOG2E, c3 * LOG2E
    gcb = g_cs + tok0 * HV + i_hv
    tl.store(gcb + r0 * HV, c0, mask=m0)
    tl.store(gcb + r1 * HV, c1, mask=m1)
    tl.store(gcb + r2 * HV, c2, mask=m2)
    tl.store(gcb + r3 * HV, c3, mask=m3)

    bb = beta + tok0 * HV + i_hv
    b0 = tl.load(bb + r0 * HV, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(bb + r1 * HV, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(bb + r2 * HV, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(bb + r3 * HV, mask=m3, other=0.0).to(tl.float32)

    l00 = _gate_block(g00, b0, c0, c0, m0, m0, True, o)
    l11 = _gate_block(g11, b1, c1, c1, m1, m1, True, o)
    l22 = _gate_block(g22, b2, c2, c2, m2, m2, True, o)
    l33 = _gate_block(g33, b3, c3, c3, m3, m3, True, o)
    l10 = _gate_block(g10, b1, c1, c0, m1, m0, False, o)
    l20 = _gate_block(g20, b2, c2, c0, m2, m0, False, o)
    l21 = _gate_block(g21, b2, c2, c1, m2, m1, False, o)
    l30 = _gate_block(g30, b3, c3, c0, m3, m0, False, o)
    l31 = _gate_block(g31, b3, c3, c1, m3, m1, False, o)
    l32 = _gate_block(g32, b3, c3, c2, m3, m2, False, o)

    x00, x10, x11, x20, x21, x22, x30, x31, x32, x33 = _unit_lower_solve(
        l00, l10, l11, l20, l21, l22, l30, l31, l32, l33, o, BC, PREC)
    _store_lower(A + tok0 * (HV * BT) + i_hv * BT, r0, r1, r2, r3, m0, m1, m2, m3,
                 x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, HV * BT, o, BC)


@triton.jit(do_not_specialize=["T", "NT"])
def gram_solve_kernel(
    k, g, beta, g_cs, A, rstd_k, ssq_k, cu_seqlens, chunk_indices, T, NT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,
    IS_VARLEN: tl.constexpr, FUSE_K: tl.constexpr, PREC: tl.constexpr, SHARE: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
):
    """Grid (chunks, B*HV), or (chunks, B*H) with SHARE (one program per key head computes the gram
    once for its HV / H value heads).  Writes g_cs (chunk-local cumsum of g, times log2 e), A = (I + L)^-1,
    and, with FUSE_K, rstd_k = 1/||k_row|| and ssq_k, the largest sum of squares of each chunk's
    k rows ([chunks, H]), both computed here where k is first read.  FUSE_K's rare case (a sum of
    squares reached SSQ_BIG, rows of |x| ~ 1e15 and up) redoes the chunk overflow-safe in a call
    (_gram_solve_rare).

    HEADS_FIRST (KernelConfig.heads_first): the grid is (B*HV or B*H, chunks), so the programs launched in a row are
    one chunk's heads, whose k rows (and fused_qk's rstd_k, [B,T,H]) lie together, not one head's chunks, H * K
    elements apart.  H200, the kernel alone at the shipped entries, chunks first -> heads first (us):
    h16_hv32_fixed32k 147.2 -> 140.7 (fused_qk 156.0 -> 144.9), HV64 67.6 -> 67.1 (70.0 -> 69.2), the other
    shapes within 0.6 (fused_qk HV48 55.7 -> 54.3); so it is searched."""
    if HEADS_FIRST:
        i_c, i_bh = tl.program_id(1), tl.program_id(0)
    else:
        i_c, i_bh = tl.program_id(0), tl.program_id(1)
    if SHARE:
        i_b, i_h = i_bh // H, i_bh % H
        hv0 = i_h * (HV // H)
    else:
        i_b, hv0 = i_bh // HV, i_bh % HV
        i_h = hv0 // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    _gram_solve(k, g, beta, g_cs, A, rstd_k, ssq_k, tok0, n_valid, i_g, i_h, hv0,
                H, HV, K, BK, BT, BC, FUSE_K, False, PREC, HV // H if SHARE else 1)


@triton.jit(do_not_specialize=["T", "NT"])
def wu_kernel(
    k, v, beta, g_cs, A, rstd_k, w, u, kg, cu_seqlens, chunk_indices, T, NT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, FUSE_K: tl.constexpr, PER_CHANNEL: tl.constexpr, PREC: tl.constexpr,
):
    """Grid (chunks, B*HV).  w = A (beta * exp(g) * k_norm) and u = A (beta * v).

    With FUSE_K the row factor rstd_k is folded into the per-row scale of k,
    so the normalized k is never materialized; for GDN w's and u's rows are also multiplied
    by it, so v_new = u - w h carries k's rstd on its rows and the state and output kernels
    use raw k: (diag(r) k)^T v_new = k^T (diag(r) v_new).  PER_CHANNEL (KDA): g_cs is
    [B,T,HV,K], exp(g) scales k per element, and kg = k_norm * exp(g_last - g) is written."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)

    rows = tl.arange(0, BT)
    m_t = rows < n_valid
    b_A = tl.load(A + tok0 * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                  mask=m_t[:, None], other=0.0)
    b_beta = tl.load(beta + tok0 * HV + i_hv + rows * HV, mask=m_t, other=0.0).to(tl.float32)

    if FUSE_K and not PER_CHANNEL:  # (u's rows are scaled too)
        r_k = tl.load(rstd_k + tok0 * H + i_h + rows * H, mask=m_t, other=0.0)
    vb = v + tok0 * (HV * V) + i_hv * V
    ub = u + tok0 * (HV * V) + i_hv * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        msk = m_t[:, None] & (o_v < V)[None, :]
        b_v = tl.load(vb + rows[:, None] * (HV * V) + o_v[None, :], mask=msk, other=0.0)
        b_vb = (b_v * b_beta[:, None]).to(b_A.dtype)
        b_u = tl.dot(b_A, b_vb, input_precision=PREC)
        if FUSE_K and not PER_CHANNEL:
            b_u *= r_k[:, None]
        tl.store(ub + rows[:, None] * (HV * V) + o_v[None, :], b_u.to(u.dtype.element_ty), mask=msk)

    row_scale = b_beta
    if not PER_CHANNEL:
        row_scale = b_beta * tl.math.exp2(tl.load(g_cs + tok0 * HV + i_hv + rows * HV, mask=m_t, other=0.0))
    if FUSE_K:
        if PER_CHANNEL:
            r_k = tl.load(rstd_k + tok0 * H + i_h + rows * H, mask=m_t, other=0.0)
        row_scale *= r_k
    kb = k + tok0 * (H * K) + i_h * K
    wb = w + tok0 * (HV * K) + i_hv * K
    if PER_CHANNEL:
        gb = g_cs + tok0 * (HV * K) + i_hv * K
        kgb = kg + tok0 * (HV * K) + i_hv * K
        last = tl.minimum(n_valid, BT) - 1
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        msk = m_t[:, None] & (o_k < K)[None, :]
        b_k = tl.load(kb + rows[:, None] * (H * K) + o_k[None, :], mask=msk, other=0.0)
        if PER_CHANNEL:
            b_g = tl.load(gb + rows[:, None] * (HV * K) + o_k[None, :], mask=msk, other=0.0)
            g_last = tl.load(gb + last * (HV * K) + o_k, mask=o_k < K, other=0.0)
            b_kg = b_k.to(tl.float32) * tl.math.exp2(g_last[None, :] - b_g)
            if FUSE_K:
                b_kg *= r_k[:, None]
            tl.store(kgb + rows[:, None] * (HV * K) + o_k[None, :], b_kg.to(kg.dtype.element_ty), mask=msk)
            b_kb = (b_k.to(tl.float32) * tl.math.exp2(b_g) * row_scale[:, None]).to(b_A.dtype)
        else:
            b_kb = (b_k.to(tl.float32) * row_scale[:, None]).to(b_A.dtype)
        b_w = tl.dot(b_A, b_kb, input_precision=PREC)
        if FUSE_K and not PER_CHANNEL:
            b_w *= r_k[:, None]
        tl.store(wb + rows[:, None] * (HV * K) + o_k[None, :], b_w.to(w.dtype.element_ty), mask=msk)


# ----------------------------------------------------------------------------- KDA (per-channel gates)
@triton.jit
def _split_rows(x):
    """[BC, BC, 2, 2] indexed (i, j, a, b) -> the four [BC, BC] blocks of row block 2a + b."""
    xb0, xb1 = tl.split(x)
    x0, x2 = tl.split(xb0)
    x1, x3 = tl.split(xb1)
    return x0, x1, x2, x3


@triton.jit
def _lower_blocks(x, BC: tl.constexpr):
    """The ten lower [BC, BC] blocks (row block >= column block) of a [4 BC, 4 BC] tile."""
    # row 32a + 16b + i, column 32c + 16d + j -> (i, j, a, b, c, d)
    x = tl.permute(tl.reshape(x, (2, 2, BC, 2, 2, BC)), (2, 5, 0, 1, 3, 4))
    xd0, xd1 = tl.split(x)
    c0, c2 = tl.split(xd0)
    c1, c3 = tl.split(xd1)
    x00, x10, x20, x30 = _split_rows(c0)
    _, x11, x21, x31 = _split_rows(c1)
    _, _, x22, x32 = _split_rows(c2)
    _, _, _, x33 = _split_rows(c3)
    return x00, x10, x11, x20, x21, x22, x30, x31, x32, x33


@triton.jit(do_not_specialize=["T", "NT"])
def kda_cumsum_kernel(g, g_cs, cu_seqlens, chunk_indices, T, NT, HV: tl.constexpr, K: tl.constexpr,
                      BK: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Grid (chunks, B*HV, K / BK): g_cs = per-channel chunk-local cumsum of g, times log2 e."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    rows = tl.arange(0, BT)
    o_k = tl.program_id(2) * BK + tl.arange(0, BK)
    m = (rows < n_valid)[:, None] & (o_k < K)[None, :]
    offs = (tok0 + rows[:, None]) * (HV * K) + i_hv * K + o_k[None, :]
    c = tl.cumsum(tl.load(g + offs, mask=m, other=0.0).to(tl.float32), 0) * LOG2E
    tl.store(g_cs + offs, c, mask=m)


@triton.jit
def _dot(a, b, acc, DOT_BF16: tl.constexpr, PREC: tl.constexpr):
    if DOT_BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _c_row(gcb, r: tl.constexpr, o_k, n_valid, K: tl.constexpr, stride: tl.constexpr):
    """Row r of the chunk's cumsum over the channels o_k (zero where the chunk has no row r)."""
    exists = (tl.zeros_like(o_k) + r) < n_valid
    return tl.load(gcb + r * stride + o_k, mask=(o_k < K) & exists, other=0.0)


@triton.jit
def _diagonal_exact(xr, kb, gcb, c, rows, valid, n_valid, o_k, n, H: tl.constexpr, HV: tl.constexpr,
                    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, NORMALIZE: tl.constexpr):
    """One K tile's diagonal 16-blocks, sum_c x_ic k_jc exp2(c_ic - c_jc) for j <= i in i's block, per
    entry in fp32 (exponents <= 0: no overflow for any gate); [BT, BT], zeros off those entries.
    Step jj takes column jj of every block at once: row i meets k's row (i's block) * BC + jj.
    NORMALIZE: k's rows times n on load (n gathered for the selected rows)."""
    cols = tl.arange(0, BT)
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    for jj in range(BC):
        sel = (rows // BC) * BC + jj
        m_sel = (sel < n_valid)[:, None] & (o_k < K)[None, :]
        k_sel = tl.load(kb + sel[:, None] * (H * K) + o_k[None, :], mask=m_sel, other=0.0).to(tl.float32)
        if NORMALIZE:
            k_sel = k_sel * tl.sum(tl.where(cols[None, :] == sel[:, None], n[None, :], 0.0), 1)[:, None]
        c_sel = tl.load(gcb + sel[:, None] * (HV * K) + o_k[None, :], mask=m_sel, other=0.0)
        keep = valid & (rows % BC >= jj)
        # where() after exp2: above the diagonal the exponent is positive and may overflow, never selected
        f = tl.where(keep[:, None], tl.math.exp2(c - c_sel), 0.0)
        entry = tl.sum(xr * k_sel * f, 1)
        acc += tl.where(cols[None, :] == sel[:, None], entry[:, None], 0.0)
    return acc


@triton.jit
def _kda_grams(qb, kb, gcb, rows, valid, n_valid, n, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
               BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, WANT_K: tl.constexpr, WANT_Q: tl.constexpr,
               NORMALIZE: tl.constexpr, SSQ: tl.constexpr, DOT_BF16: tl.constexpr, PREC: tl.constexpr,
               UNBOUNDED: tl.constexpr):
    """One chunk's gated grams sum_c x_ic k_jc exp2(c_ic - c_jc) for x = k (WANT_K) and / or x = q
    (WANT_Q; both only for bounded gates) as dots per K tile, c the per-channel cumsum (g_cs, written
    by kda_cumsum_kernel).  Returns (ak, aq, ss): the wanted grams' diagonal 16-blocks and the
    blocks below them (the callers take their causal part), and ss, k's rows' sums of squares (SSQ;
    16-bit storage, whose squares are exact in fp32; fp32 storage takes them from _rows_ssq).
    NORMALIZE: k rows times n on load.  DOT_BF16 (bf16 storage): the gated operands are rounded to bf16,
    so the dot operands are 16-bit (half the shared-memory staging of tf32 ones).

    exp2(c_i - c_j) is split at a reference p, a row of c, so that neither factor leaves fp32 (nor
    bf16, whose exponent range is fp32's): p_b = c's first row in 16-block b.  Column block j, with
    the rows of block j and below: x_i exp2(c_i - p_j) (<= 1) against k_j exp2(p_j - c_j) (at most 15
    tokens of growth: e^75 when every g >= -5), formed from two exp2 tiles at each row's own block and
    per-channel block factors exp2(p_a - p_j) <= 1.  A column block of k is zero outside block j, so the
    four column blocks, diagonal and below, share one [BT, BT] accumulator, and both grams share k's
    operands and every exp2.  (A row factor that underflows stands for an entry below 2^-18 of |x| |k|.)

    UNBOUNDED (gates without a lower bound): no factor may exceed 1.  The diagonal blocks are summed
    per entry, exp2(c_i - c_j) with j <= i in the same 16-block (_diagonal_exact); below the diagonal
    the column factors are taken against p_(j+1) directly, k_j exp2(p_(j+1) - c_j) <= 1, and the row
    factors are the same products of factors <= 1.  A factor that underflows to 0 stands for an entry
    smaller than it, so below fp32's range."""
    blk = (rows // BC)[:, None]
    ak = tl.zeros([BT, BT], dtype=tl.float32)
    aq, od = ak, ak  # (od: unbounded gates only)
    ss = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m = valid[:, None] & (o_k < K)[None, :]
        c = tl.load(gcb + rows[:, None] * (HV * K) + o_k[None, :], mask=m, other=0.0)
        p0, p1 = _c_row(gcb, 0, o_k, n_valid, K, HV * K), _c_row(gcb, BC, o_k, n_valid, K, HV * K)
        p2, p3 = _c_row(gcb, 2 * BC, o_k, n_valid, K, HV * K), _c_row(gcb, 3 * BC, o_k, n_valid, K, HV * K)
        pd = tl.where(blk == 0, p0[None, :], tl.where(blk == 1, p1[None, :], tl.where(blk == 2, p2[None, :],
                                                                                         p3[None, :])))
        # rows past the chunk's end: c = 0 when loaded, so exp2(c - pd) could overflow; they are zero
        e = tl.where(valid[:, None], tl.math.exp2(c - pd), 0.0)
        kx = _normalized(tl.load(kb + rows[:, None] * (H * K) + o_k[None, :], mask=m, other=0.0), n, NORMALIZE)
        kf = kx.to(tl.float32)
        if SSQ:
            if PREC != "tf32x3":  # (fp32 storage reads its sums in _k_rstd_full)
                ss += tl.sum(kf * kf, 1)
        if UNBOUNDED:
            xr = kf
            if not WANT_K:
                xr = tl.load(qb + rows[:, None] * (H * K) + o_k[None, :], mask=m, other=0.0).to(tl.float32)
            xl = xr * e
            ak += _diagonal_exact(xr, kb, gcb, c, rows, valid, n_valid, o_k, n, H, HV, K, BT, BC, NORMALIZE)
            # column block j against p_(j+1) (a block past the chunk's end reads p = 0: no valid row meets
            # it, and min(., 0) keeps its factor finite); block 3 has no block below it
            pc = tl.where(blk == 0, p1[None, :], tl.where(blk == 1, p2[None, :], p3[None, :]))
            kc = tl.where(valid[:, None] & (blk < 3), kf * tl.math.exp2(tl.minimum(pc - c, 0.0)), 0.0)
            f21 = tl.math.exp2(tl.minimum(p2 - p1, 0.0))[None, :]
            f31 = tl.math.exp2(tl.minimum(p3 - p1, 0.0))[None, :]
            f32 = tl.math.exp2(tl.minimum(p3 - p2, 0.0))[None, :]
            od = _dot(xl * tl.where(blk == 0, 0.0, tl.where(blk == 1, 1.0, tl.where(blk == 2, f21, f31))),
                      tl.trans(tl.where(blk == 0, kc, 0.0)), od, DOT_BF16, PREC)
            od = _dot(xl * tl.where(blk <= 1, 0.0, tl.where(blk == 2, 1.0, f32)),
                      tl.trans(tl.where(blk == 1, kc, 0.0)), od, DOT_BF16, PREC)
            od = _dot(tl.where(blk == 3, xl, 0.0), tl.trans(tl.where(blk == 2, kc, 0.0)), od, DOT_BF16, PREC)
        else:
            kr = kf * tl.math.exp2(pd - c)
            f10 = tl.math.exp2(p1 - p0)[None, :]
            f20 = tl.math.exp2(p2 - p0)[None, :]
            f30 = tl.math.exp2(p3 - p0)[None, :]
            f21 = tl.math.exp2(p2 - p1)[None, :]
            f31 = tl.math.exp2(p3 - p1)[None, :]
            f32 = tl.math.exp2(p3 - p2)[None, :]
            # column block j: k_j exp2(p_j - c_j); rows of block j and below: x exp2(c - p_j) = x e r_j
            r0 = e * tl.where(blk == 0, 1.0, tl.where(blk == 1, f10, tl.where(blk == 2, f20, f30)))
            r1 = e * tl.where(blk == 0, 0.0, tl.where(blk == 1, 1.0, tl.where(blk == 2, f21, f31)))
            r2 = e * tl.where(blk <= 1, 0.0, tl.where(blk == 2, 1.0, f32))
            r3 = tl.where(blk == 3, e, 0.0)
            k0, k1 = tl.trans(tl.where(blk == 0, kr, 0.0)), tl.trans(tl.where(blk == 1, kr, 0.0))
            k2, k3 = tl.trans(tl.where(blk == 2, kr, 0.0)), tl.trans(tl.where(blk == 3, kr, 0.0))
            if WANT_K:
                ak = _dot(kf * r0, k0, ak, DOT_BF16, PREC)
                ak = _dot(kf * r1, k1, ak, DOT_BF16, PREC)
                ak = _dot(kf * r2, k2, ak, DOT_BF16, PREC)
                ak = _dot(kf * r3, k3, ak, DOT_BF16, PREC)
            if WANT_Q:
                qf = tl.load(qb + rows[:, None] * (H * K) + o_k[None, :], mask=m, other=0.0).to(tl.float32)
                aq = _dot(qf * r0, k0, aq, DOT_BF16, PREC)
                aq = _dot(qf * r1, k1, aq, DOT_BF16, PREC)
                aq = _dot(qf * r2, k2, aq, DOT_BF16, PREC)
                aq = _dot(qf * r3, k3, aq, DOT_BF16, PREC)
    if UNBOUNDED:
        ak = tl.where((blk == (rows // BC)[None, :]), ak, od)
        if not WANT_K:
            aq = ak
    return ak, aq, ss


@triton.jit
def _k_rstd_full(kb, rstd_k, tok0, i_h, i_hv, rows, valid, ss, H: tl.constexpr, HV: tl.constexpr,
                 K: tl.constexpr, BK: tl.constexpr, STORE: tl.constexpr, PREC: tl.constexpr):
    """k's row rstd from its sums of squares ss, summed where the grams read k (fp32 storage: from k,
    _rows_ssq; stored to rstd_k by one writer per key head when STORE) and whether a row's sum of
    squares reached RAW_K_SSQ_MAX (an overflowed square reads inf, so it does)."""
    if PREC == "tf32x3":
        ssq = _rows_ssq(kb, rows, valid, K, H * K, BK)
    else:
        ssq = ss
    n = row_rstd(kb, rows, valid, ssq, K, H * K, BK)
    if STORE:
        if i_hv % (HV // H) == 0:
            tl.store(rstd_k + (tok0 + rows) * H + i_h, n, mask=valid)
    return n, vec_max(ssq) >= RAW_K_SSQ_MAX


@triton.jit
def _kda_gram_normed(qb, kb, gcb, rstd_k, risky, tok0, i_h, i_hv, rows, valid, n_valid, H: tl.constexpr,
                     HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                     WANT_K: tl.constexpr, WANT_Q: tl.constexpr, FUSE_K: tl.constexpr, REDO: tl.constexpr,
                     DOT_BF16: tl.constexpr, PREC: tl.constexpr, UNBOUNDED: tl.constexpr):
    """_kda_grams' (ak, aq); FUSE_K: in k's normalized basis (ak's rows too), k's rstd from the sums of
    squares taken as the grams read k, stored by the program that forms ak.  Whether a row's sum of
    squares reached RAW_K_SSQ_MAX (a k row of norm >= 2^19, whose e^75 gate factor may have overflowed)
    goes to *risky; the fix-up launch redoes those programs (REDO) on rows normalized on load."""
    if REDO:
        n = row_rstd(kb, rows, valid, _rows_ssq(kb, rows, valid, K, H * K, BK), K, H * K, BK)
        ak, aq, _ = _kda_grams(qb, kb, gcb, rows, valid, n_valid, n, H, HV, K, BK, BT, BC, WANT_K, WANT_Q,
                               True, False, DOT_BF16, PREC, UNBOUNDED)
    else:
        one = tl.full([BT], 1.0, dtype=tl.float32)  # (not read: no NORMALIZE)
        ak, aq, ss = _kda_grams(qb, kb, gcb, rows, valid, n_valid, one, H, HV, K, BK, BT, BC, WANT_K, WANT_Q,
                                False, FUSE_K, DOT_BF16, PREC, UNBOUNDED)
        if FUSE_K:
            n, huge = _k_rstd_full(kb, rstd_k, tok0, i_h, i_hv, rows, valid, ss, H, HV, K, BK, WANT_K, PREC)
            tl.store(risky, huge.to(tl.int8))
            ak = ak * n[None, :] * n[:, None]
            aq = aq * n[None, :]
    return ak, aq


@triton.jit
def _solve_store(ak, beta, A, tok0, i_hv, rows, valid, causal, n_valid, HV: tl.constexpr, BT: tl.constexpr,
                 BC: tl.constexpr, PREC: tl.constexpr):
    """A = (I + L)^-1, L = strict-lower(beta * ak), stored in A's dtype."""
    b = tl.load(beta + (tok0 + rows) * HV + i_hv, mask=valid, other=0.0).to(tl.float32)
    # where() after the product: entries outside the causal part may be inf or NaN, never selected
    L = tl.where(causal & ~(rows[:, None] == rows[None, :]) & valid[:, None], ak * b[:, None], 0.0)
    l00, l10, l11, l20, l21, l22, l30, l31, l32, l33 = _lower_blocks(L, BC)
    o = tl.arange(0, BC)
    x00, x10, x11, x20, x21, x22, x30, x31, x32, x33 = _unit_lower_solve(
        l00, l10, l11, l20, l21, l22, l30, l31, l32, l33, o, BC, PREC)
    _store_lower(A + tok0 * (HV * BT) + i_hv * BT, o, o + BC, o + 2 * BC, o + 3 * BC,
                 o < n_valid, o + BC < n_valid, o + 2 * BC < n_valid, o + 3 * BC < n_valid,
                 x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, HV * BT, o, BC)


@triton.jit
def _store_aqk(aq, Aqk, tok0, i_hv, rows, valid, causal, HV: tl.constexpr, BT: tl.constexpr):
    """Aqk: aq's causal part (diagonal included), zeros above."""
    tl.store(Aqk + (tok0 + rows[:, None]) * (HV * BT) + i_hv * BT + rows[None, :],
             tl.where(causal, aq, 0.0).to(Aqk.dtype.element_ty), mask=valid[:, None])


@triton.jit
def _kda_intra_at(q, k, beta, g_cs, A, Aqk, rstd_k, risky, cu_seqlens, chunk_indices, T, NT, i_c, i_bh, which,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
                  BC: tl.constexpr, IS_VARLEN: tl.constexpr, FUSE_K: tl.constexpr, REDO: tl.constexpr,
                  DOT_BF16: tl.constexpr, PREC: tl.constexpr, UNBOUNDED: tl.constexpr, ONE_PROGRAM: tl.constexpr):
    """The program (chunk i_c, value head i_bh, gram `which`) of kda_intra_kernel."""
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)

    rows = tl.arange(0, BT)
    valid = rows < n_valid
    qb = q + tok0 * (H * K) + i_h * K
    kb = k + tok0 * (H * K) + i_h * K
    gcb = g_cs + tok0 * (HV * K) + i_hv * K
    causal = rows[:, None] >= rows[None, :]
    if ONE_PROGRAM:
        ak, aq = _kda_gram_normed(qb, kb, gcb, rstd_k, risky, tok0, i_h, i_hv, rows, valid, n_valid, H, HV, K, BK,
                                  BT, BC, True, True, FUSE_K, REDO, DOT_BF16, PREC, UNBOUNDED)
        _solve_store(ak, beta, A, tok0, i_hv, rows, valid, causal, n_valid, HV, BT, BC, PREC)
        _store_aqk(aq, Aqk, tok0, i_hv, rows, valid, causal, HV, BT)
    elif which == 0:
        ak, _ = _kda_gram_normed(qb, kb, gcb, rstd_k, risky, tok0, i_h, i_hv, rows, valid, n_valid, H, HV, K, BK,
                                 BT, BC, True, False, FUSE_K, REDO, DOT_BF16, PREC, UNBOUNDED)
        _solve_store(ak, beta, A, tok0, i_hv, rows, valid, causal, n_valid, HV, BT, BC, PREC)
    else:
        _, aq = _kda_gram_normed(qb, kb, gcb, rstd_k, risky, tok0, i_h, i_hv, rows, valid, n_valid, H, HV, K, BK,
                                 BT, BC, False, True, FUSE_K, REDO, DOT_BF16, PREC, UNBOUNDED)
        _store_aqk(aq, Aqk, tok0, i_hv, rows, valid, causal, HV, BT)


@triton.jit(do_not_specialize=["T", "NT", "n_grid", "n_flags"])
def kda_intra_kernel(
    q, k, beta, g_cs, A, Aqk, rstd_k, risky, cu_seqlens, chunk_indices, T, NT, n_grid, n_flags,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,
    IS_VARLEN: tl.constexpr, FUSE_K: tl.constexpr, DOT_BF16: tl.constexpr, PREC: tl.constexpr,
    UNBOUNDED: tl.constexpr, ONE_PROGRAM: tl.constexpr, FIXUP: tl.constexpr,
):
    """Grid (chunks, B*HV, 2), after kda_cumsum_kernel; (chunks, B*HV, 1) with ONE_PROGRAM (bounded gates
    only), whose program forms both grams from one pass over k and the gates.  KDA's intra-chunk step:
    A = (I + L)^-1 with L = strict-lower(beta * gated K K^T) and, with FUSE_K, rstd_k (k's norm is folded
    into the grams here, where k is first read), by program 0 of the last axis; Aqk = lower(gated Q K^T)
    on q as given (raw under the fused routes, where the output kernel scales each row once at the end),
    by program 1.

    FUSE_K: every program writes its risky flag (int8, n_flags of them, program (i_c, i_bh, which) at
    (i_bh * chunks + i_c) * programs per chunk + which).  FIXUP: the second launch, grid
    cdiv(n_flags, FLAG_BLOCK), whose few programs read FLAG_BLOCK flags at once and redo only the
    flagged programs, so the main program's body holds one copy of the grams.

    H200, kda-legacy6 h96_fixed, this stage alone: twenty
    16x16-block dots per K tile 2218 us; [64, 64] dots, both grams in one program 1882 us (4 warps);
    one gram per program 1795 us (2 warps); + c from a separate cumsum kernel instead of a scan and
    row reductions here 1480 us; + bf16 dot operands 988 us (FLA's whole forward: 2597 us with its
    l2norm flag).  Nsight Compute on the tf32 version: bound by the shared-memory staging of the
    fp32 dot operands, not by the dots."""
    PER_CHUNK: tl.constexpr = 1 if ONE_PROGRAM else 2
    if FIXUP:
        if any_flagged(risky, n_flags):
            for j in range(FLAG_BLOCK):
                pid, is_set = flagged(risky, j, n_flags)
                if is_set:
                    which = pid % PER_CHUNK
                    i_c = (pid // PER_CHUNK) % n_grid
                    i_bh = pid // (PER_CHUNK * n_grid)
                    _kda_intra_at(q, k, beta, g_cs, A, Aqk, rstd_k, risky, cu_seqlens, chunk_indices, T, NT,
                                  i_c, i_bh, which, H, HV, K, BK, BT, BC, IS_VARLEN, True, True, DOT_BF16, PREC,
                                  UNBOUNDED, ONE_PROGRAM)
    else:
        i_c, i_bh, which = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        flag = risky
        if FUSE_K:
            flag = risky + (i_bh * tl.num_programs(0) + i_c) * PER_CHUNK + which
        _kda_intra_at(q, k, beta, g_cs, A, Aqk, rstd_k, flag, cu_seqlens, chunk_indices, T, NT, i_c, i_bh, which,
                      H, HV, K, BK, BT, BC, IS_VARLEN, FUSE_K, False, DOT_BF16, PREC, UNBOUNDED, ONE_PROGRAM)

"""Intra-chunk kernels: gate cumsum, beta*K K^T gram, (I + A)^-1, and w/u.

Per chunk of BT = 64 tokens and value head, with L = strictly-lower part of
``diag(beta) (K K^T * exp(g_i - g_j))``, the delta rule's WY form is

    A = (I + L)^-1,   w = A (beta * exp(g) * k),   u = A (beta * v).

The gram is accumulated as ten 16x16 blocks (four diagonal, six below); each
diagonal block is inverted by forward substitution in exact fp32 and the
off-diagonal blocks of the inverse follow from (I + L) A = I block row by
block row, using tl.dot.  A is stored in k's dtype for the w/u kernel.
"""

import triton
import triton.language as tl

from .common import LOG2E, SSQ_BIG, chunk_coords
from .output import row_rstd


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
def _diag(G, o):
    return tl.sum(tl.where(o[:, None] == o[None, :], G, 0.0), 1)


@triton.jit
def _gate_block(G, b_i, c_i, c_j, m_i, m_j, DIAG: tl.constexpr, o):
    """L_ij = beta_i * G_ij * exp2(c_i - c_j) on valid (and, on the diagonal, strictly lower) entries."""
    keep = m_i[:, None] & m_j[None, :]
    if DIAG:
        keep = keep & (o[:, None] > o[None, :])
    # where() after the product: exp2 of an out-of-range difference may be inf, never selected
    return tl.where(keep, G * tl.math.exp2(c_i[:, None] - c_j[None, :]) * b_i[:, None], 0.0)


@triton.jit
def _unit_lower_inverse(L, o, BC: tl.constexpr):
    """(I + L)^-1 of a strictly lower-triangular [BC, BC] block by forward substitution (fp32).

    Row i of X = (I + L)^-1 is e_i - sum_{j<i} L_ij X_j; rows are filled top-down.
    """
    X = (o[:, None] == o[None, :]).to(tl.float32)
    for i in range(1, BC):
        l_i = tl.sum(tl.where(o[:, None] == i, L, 0.0), 0)  # row i of L, indexed by column j
        x_i = tl.where(o == i, 1.0, 0.0) - tl.sum(l_i[:, None] * X, 0)
        X = tl.where(o[:, None] == i, x_i[None, :], X)
    return X


@triton.jit
def _store_block(base, rows, m_t, col0, blk, stride, o):
    tl.store(base + rows[:, None] * stride + (col0 + o)[None, :], blk.to(base.dtype.element_ty), mask=m_t[:, None])


@triton.jit(do_not_specialize=["T", "NT"])
def gram_solve_kernel(
    k, g, beta, g_cs, A, rstd_k, cu_seqlens, chunk_indices, T, NT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,
    IS_VARLEN: tl.constexpr, FUSE_K: tl.constexpr, PREC: tl.constexpr,
):
    """Grid (chunks, B*HV).  Writes g_cs (chunk-local cumsum of g, times log2 e), A = (I + L)^-1,
    and, with FUSE_K, rstd_k = 1/||k_row|| (computed here, where k is first read)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)

    o = tl.arange(0, BC)  # rows of sub-block j are j*BC + o within the chunk
    r0 = o
    r1 = o + BC
    r2 = o + 2 * BC
    r3 = o + 3 * BC
    m0, m1, m2, m3 = r0 < n_valid, r1 < n_valid, r2 < n_valid, r3 < n_valid

    # ---- gate: chunk-local cumsum, carried across the four sub-blocks
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

    # ---- gram K K^T on raw k; with FUSE_K, rstd_k from the diagonal blocks (the rows' sums
    # of squares, free), written here where k is first read
    kb = k + tok0 * (H * K) + i_h * K
    one = tl.full([BC], 1.0, dtype=tl.float32)
    g00, g10, g11, g20, g21, g22, g30, g31, g32, g33 = _gram_blocks(
        kb, r0, r1, r2, r3, m0, m1, m2, m3, one, one, one, one, H * K, K, BK, BC, False, PREC)
    if FUSE_K:
        s0, s1, s2, s3 = _diag(g00, o), _diag(g11, o), _diag(g22, o), _diag(g33, o)
        n0 = row_rstd(kb, r0, m0, s0, K, H * K, BK)
        n1 = row_rstd(kb, r1, m1, s1, K, H * K, BK)
        n2 = row_rstd(kb, r2, m2, s2, K, H * K, BK)
        n3 = row_rstd(kb, r3, m3, s3, K, H * K, BK)
        if i_hv % (HV // H) == 0:  # one writer per key head
            rb = rstd_k + tok0 * H + i_h
            tl.store(rb + r0 * H, n0, mask=m0)
            tl.store(rb + r1 * H, n1, mask=m1)
            tl.store(rb + r2 * H, n2, mask=m2)
            tl.store(rb + r3 * H, n3, mask=m3)
        sm = tl.maximum(tl.maximum(tl.max(s0, 0), tl.max(s1, 0)), tl.maximum(tl.max(s2, 0), tl.max(s3, 0)))
        if sm >= SSQ_BIG:
            # rare: a huge row may have overflowed the raw gram; redo it on rows normalized on load
            g00, g10, g11, g20, g21, g22, g30, g31, g32, g33 = _gram_blocks(
                kb, r0, r1, r2, r3, m0, m1, m2, m3, n0, n1, n2, n3, H * K, K, BK, BC, True, PREC)
        else:
            # gram of normalized rows = diag(n) G diag(n)
            g00 = g00 * n0[:, None] * n0[None, :]
            g10 = g10 * n1[:, None] * n0[None, :]
            g11 = g11 * n1[:, None] * n1[None, :]
            g20 = g20 * n2[:, None] * n0[None, :]
            g21 = g21 * n2[:, None] * n1[None, :]
            g22 = g22 * n2[:, None] * n2[None, :]
            g30 = g30 * n3[:, None] * n0[None, :]
            g31 = g31 * n3[:, None] * n1[None, :]
            g32 = g32 * n3[:, None] * n2[None, :]
            g33 = g33 * n3[:, None] * n3[None, :]

    # ---- L = strict-lower(beta * gram * decay)
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

    # ---- (I + L)^-1: diagonal blocks by substitution, then block rows of (I + L) X = I
    x00 = _unit_lower_inverse(l00, o, BC)
    x11 = _unit_lower_inverse(l11, o, BC)
    x22 = _unit_lower_inverse(l22, o, BC)
    x33 = _unit_lower_inverse(l33, o, BC)
    x10 = -tl.dot(x11, tl.dot(l10, x00, input_precision=PREC), input_precision=PREC)
    x21 = -tl.dot(x22, tl.dot(l21, x11, input_precision=PREC), input_precision=PREC)
    x20 = -tl.dot(x22, tl.dot(l20, x00, input_precision=PREC) + tl.dot(l21, x10, input_precision=PREC),
                  input_precision=PREC)
    x32 = -tl.dot(x33, tl.dot(l32, x22, input_precision=PREC), input_precision=PREC)
    x31 = -tl.dot(x33, tl.dot(l31, x11, input_precision=PREC) + tl.dot(l32, x21, input_precision=PREC),
                  input_precision=PREC)
    x30 = -tl.dot(x33, tl.dot(l30, x00, input_precision=PREC) + tl.dot(l31, x10, input_precision=PREC)
                  + tl.dot(l32, x20, input_precision=PREC), input_precision=PREC)

    # ---- store all 16 blocks (zeros above the diagonal) so A needs no memset
    ab = A + tok0 * (HV * BT) + i_hv * BT
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    st = HV * BT
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


@triton.jit(do_not_specialize=["T", "NT"])
def wu_kernel(
    k, v, beta, g_cs, A, rstd_k, w, u, cu_seqlens, chunk_indices, T, NT,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, FUSE_K: tl.constexpr, PREC: tl.constexpr,
):
    """Grid (chunks, B*HV).  w = A (beta * exp(g) * k_norm) and u = A (beta * v).

    With FUSE_K the row factor rstd_k is folded into the per-row scale of k,
    so the normalized k is never materialized."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)

    rows = tl.arange(0, BT)
    m_t = rows < n_valid
    b_A = tl.load(A + tok0 * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                  mask=m_t[:, None], other=0.0)
    b_beta = tl.load(beta + tok0 * HV + i_hv + rows * HV, mask=m_t, other=0.0).to(tl.float32)

    vb = v + tok0 * (HV * V) + i_hv * V
    ub = u + tok0 * (HV * V) + i_hv * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        msk = m_t[:, None] & (o_v < V)[None, :]
        b_v = tl.load(vb + rows[:, None] * (HV * V) + o_v[None, :], mask=msk, other=0.0)
        b_vb = (b_v * b_beta[:, None]).to(b_A.dtype)
        b_u = tl.dot(b_A, b_vb, input_precision=PREC)
        tl.store(ub + rows[:, None] * (HV * V) + o_v[None, :], b_u.to(u.dtype.element_ty), mask=msk)

    row_scale = b_beta * tl.math.exp2(tl.load(g_cs + tok0 * HV + i_hv + rows * HV, mask=m_t, other=0.0))
    if FUSE_K:
        row_scale *= tl.load(rstd_k + tok0 * H + i_h + rows * H, mask=m_t, other=0.0)
    kb = k + tok0 * (H * K) + i_h * K
    wb = w + tok0 * (HV * K) + i_hv * K
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        msk = m_t[:, None] & (o_k < K)[None, :]
        b_k = tl.load(kb + rows[:, None] * (H * K) + o_k[None, :], mask=msk, other=0.0)
        b_kb = (b_k.to(tl.float32) * row_scale[:, None]).to(b_A.dtype)
        b_w = tl.dot(b_A, b_kb, input_precision=PREC)
        tl.store(wb + rows[:, None] * (HV * K) + o_k[None, :], b_w.to(w.dtype.element_ty), mask=msk)

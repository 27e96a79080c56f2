"""Small Triton helpers shared by the GDN kernels.

Portability: only plain pointer arithmetic with masks (no block pointers, which
Triton 3.9 removed), so the same source runs on Triton 3.6 (GPU) and under
``TRITON_INTERPRET=1``.

Gates: the gram kernel stores the chunk-local cumsum of g multiplied by log2(e),
so every later kernel decays with ``exp2`` (one MUFU op on NVIDIA).

L2 norm: ``x / sqrt(sum(x^2) + eps)`` in fp32.  Kernels that see a row in
tiles accumulate two sums, sum(x^2) and sum((x * 2^-70)^2).  When the first
reaches 2^100 (a row of magnitude ~1e15 and up; at ~1e19 it overflows fp32 and
``x / sqrt(inf)`` would give 0, or 0 * inf = NaN downstream) the rstd comes
from the pre-scaled sum instead, where eps is negligible anyway.  Otherwise it
is the plain formula.  Scaling by a power of two is exact.
"""

import os

import triton
import triton.language as tl
from triton.language.target_info import cuda_capability_geq

# kernels run under TRITON_INTERPRET=1 (read when this module is imported, as Triton reads it)
INTERPRETING = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
LOG2E = tl.constexpr(1.4426950408889634)
L2_EPS = tl.constexpr(1e-6)
SSQ_BIG = tl.constexpr(2.0**100)  # above this sum of squares, use the pre-scaled one
SSQ_LO = tl.constexpr(2.0**-70)  # pre-scale: (2^128 * 2^-70)^2 * 256 = 2^124 stays finite
FLAG_BLOCK = tl.constexpr(1024)  # flags one program of a fix-up launch reads at once


@triton.jit
def any_flagged(risky, n_flags):
    """Whether any of the FLAG_BLOCK int8 flags this fix-up program reads is set (one load for all)."""
    offs = tl.program_id(0) * FLAG_BLOCK + tl.arange(0, FLAG_BLOCK)
    return tl.max(tl.load(risky + offs, mask=offs < n_flags, other=0), 0) != 0


@triton.jit
def flagged(risky, j, n_flags):
    """(pid, set): the program index of this fix-up program's j-th flag and whether the flag is set."""
    pid = tl.program_id(0) * FLAG_BLOCK + j
    return pid, tl.load(risky + pid, mask=pid < n_flags, other=0) != 0


@triton.jit
def chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Locate chunk ``i_c`` (grid index) of batch ``i_b``.

    Returns (tok0, n_valid, i_g): the chunk's first token in the flattened
    [B*T] token axis (int64: kernels add ``tok0 * stride`` to their base
    pointers as a scalar, so per-element offsets stay int32 and small), the
    number of valid rows in the chunk (<= BT at a sequence's tail), and the
    chunk's global index (row of the per-chunk state buffer).
    Varlen (B == 1): ``chunk_indices`` is the host-built [NC, 2] int32 table
    (sequence id, chunk id within the sequence), in sequence order.
    """
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + 2 * i_c).to(tl.int64)
        i_t = tl.load(chunk_indices + 2 * i_c + 1).to(tl.int64)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        seq_len = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
        i_g = i_c.to(tl.int64)
    else:
        bos = i_b.to(tl.int64) * T
        seq_len = T
        i_t = i_c.to(tl.int64)
        i_g = i_b.to(tl.int64) * NT + i_t
    return bos + i_t * BT, (seq_len - i_t * BT).to(tl.int32), i_g


@triton.jit
def loop_bound(n):
    """``n`` (a runtime scalar) as a ``range`` bound: ``for i in range(loop_bound(n))``.  Triton 3.6's
    interpreter holds every runtime scalar as a 1-element array (reductions too) and its ``range`` calls
    int() on it, which numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python
    scalars"; Triton 3.9 squeezes first).  There this returns a Python int, read from the interpreter's
    array; it must go straight into ``range``: the interpreter turns the right side of every assignment
    back into a tensor.  Compiled (INTERPRETING is a constexpr), it is ``n`` itself."""
    if INTERPRETING:
        return n.handle.data.item()
    return n


@triton.jit
def pair_offsets(tok, rows, i_hv, H: tl.constexpr, HV: tl.constexpr, W: tl.constexpr = 2):
    """Element offsets of rows tok + rows of value head i_hv (scalar or tile) in a row-factor tensor (chunk_aqk's
    c_q), laid out [cdiv(tokens, 64), H, 64, G, W] fp32 (G = HV / H; W 2: pairs, 4: quads): a 64-token block's
    factors of the G value heads that share a key head are one contiguous [64, W G] tile, the one aqk_kernel's
    program writes (see ops.chunk_aqk for the measured layouts)."""
    G: tl.constexpr = HV // H
    t = tok + rows
    return (t // 64) * (HV * 64 * W) + (i_hv // G) * (G * 64 * W) + (t % 64) * (W * G) + (i_hv % G) * W


@triton.jit
def row_pairs(ptr, tok, i_hv, rows, m_t, H: tl.constexpr, HV: tl.constexpr):
    """The two fp32 columns of a pair tensor (:func:`pair_offsets`, W 2) at rows tok + rows of value head i_hv,
    loaded as one [rows, 2] tile (8 contiguous bytes per row) and split."""
    p = ptr + pair_offsets(tok, rows, i_hv, H, HV)[:, None] + tl.arange(0, 2)[None, :]
    return tl.split(tl.load(p, mask=m_t[:, None], other=0.0))


@triton.jit
def row_quads(ptr, tok, i_hv, rows, m_t, H: tl.constexpr, HV: tl.constexpr):
    """The four fp32 columns of a quad tensor (:func:`pair_offsets`, W 4) at rows tok + rows of value head i_hv,
    loaded as one [rows, 4] tile (16 contiguous bytes per row) and split."""
    p = ptr + pair_offsets(tok, rows, i_hv, H, HV, 4)[:, None] + tl.arange(0, 4)[None, :]
    x = tl.reshape(tl.load(p, mask=m_t[:, None], other=0.0), [rows.shape[0], 2, 2])
    a, b = tl.split(x)
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    return a0, b0, a1, b1


# aqk_kernel writes a factor tile through pair_ptrs (row start plus column: at G = 4 its pair rows are stored as
# 128-bit pieces; through pair_offsets' per-element // G and % G they were 64-bit).  The loops read through
# row_pairs and pair_offsets: their rows in pair_ptrs' int32 shifts and masks measured slower in the in-loop
# kernel with the k tile (H200, autotuner times at the same config, strong gates: h16_hv32_fixed8k 181.3 ->
# 205.4 us, h16_hv32_fixed32k 651.8 -> 752.6) though its sm_90 SASS had fewer instructions and spills.
@triton.jit
def pair_ptrs(ptr, tok, rows, i_h, H: tl.constexpr, HV: tl.constexpr, W: tl.constexpr = 2):
    """Pointers to the first factor of key head i_h's G value heads at rows tok + rows of a row-factor tensor
    (:func:`pair_offsets`, W columns a value head): a 64-token block's factors of the G value heads that share a
    key head are one contiguous [64, W G] tile, the one aqk_kernel's program writes.  The block's start is a
    scalar; per row only int32 arithmetic (r < 128)."""
    G: tl.constexpr = HV // H
    r = (tok & 63).to(tl.int32) + rows
    return ptr + ((tok >> 6) * (HV * 64 * W) + i_h * (G * 64 * W)) + (r >> 6) * (HV * 64 * W) + (r & 63) * (W * G)


@triton.jit
def vec_max(x):
    """The largest element of a 1-D tensor, as a scalar.  On sm_100 and up, Triton 3.6's
    TritonNvidiaGPUOptimizeTMemLayoutsPass fails ("parent layout must have at least rank >= 2") on a
    rank-1 reduce to a scalar anywhere downstream of a tensor-memory load (a tcgen05 dot's
    accumulator, its row sums): its forward walk from the load gives that reduce a slice of a slice
    layout.  There the reduce takes no axis, so Triton flattens first with a reshape that may
    reorder, where that walk stops.  sm_90 keeps the plain reduce: the reshape there costs a
    shared-memory round trip and two more barriers (PTX of a probe kernel), so its code is unchanged."""
    if cuda_capability_geq(10):
        return tl.max(x)
    return tl.max(x, 0)


@triton.jit
def sq_sums(xf):
    """Row sums of squares of an fp32 tile: (sum(x^2), sum((x * 2^-70)^2))."""
    xl = xf * SSQ_LO
    return tl.sum(xf * xf, 1), tl.sum(xl * xl, 1)


@triton.jit
def l2_rstd(ssq, ssq_lo):
    """1/sqrt(sum(x^2) + eps), overflow-safe given both sums from :func:`sq_sums`."""
    big = ssq >= SSQ_BIG
    return tl.where(big, SSQ_LO / tl.sqrt(tl.where(big, ssq_lo, 1.0)), 1.0 / tl.sqrt(tl.where(big, 1.0, ssq) + L2_EPS))


@triton.jit
def row_sq_sums(xb, rows, m_t, K: tl.constexpr, stride, BK: tl.constexpr, PLAIN: tl.constexpr,
                SCALED: tl.constexpr):
    """Rows of x (base xb, row stride ``stride``) read in K tiles: (sum(x^2) if PLAIN, sum((x 2^-70)^2)
    if SCALED), zeros where not asked."""
    ssq = tl.zeros_like(rows).to(tl.float32)
    lo = tl.zeros_like(rows).to(tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        xf = tl.load(xb + rows[:, None] * stride + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :],
                     other=0.0).to(tl.float32)
        xl = xf * SSQ_LO
        if PLAIN:
            ssq += tl.sum(xf * xf, 1)
        if SCALED:
            lo += tl.sum(xl * xl, 1)
    return ssq, lo


@triton.jit
def row_rstd(xb, rows, m_t, ssq, K: tl.constexpr, stride, BK: tl.constexpr):
    """1/sqrt(ssq + eps) of the rows of x (base xb, row stride ``stride``) given their plain
    sums of squares; the pre-scaled sums are computed, by re-reading x, only when some row's
    plain sum reached SSQ_BIG (inf included): a rare path."""
    lo = tl.zeros_like(ssq)
    if vec_max(ssq) >= SSQ_BIG:
        _, lo = row_sq_sums(xb, rows, m_t, K, stride, BK, False, True)
    return l2_rstd(ssq, lo)


@triton.jit
def diag_ssq(G, o, PREC: tl.constexpr):
    """Row sums of squares as the diagonal of a gram X X^T (o = arange of its rows).  Under tf32x3
    (fp32 storage) the split products of a row beyond ~1e21 overflow with both signs and its
    diagonal entry comes out NaN (H200: fp32 q rows of 1e25 gave NaN outputs, 1e20 did not): read
    as inf, so the caller's huge-row path takes the row."""
    s = tl.sum(tl.where(o[:, None] == o[None, :], G, 0.0), 1)
    if PREC == "tf32x3":
        s = tl.where(s == s, s, float("inf"))
    return s


@triton.jit
def l2norm_kernel(x, y, M, D: tl.constexpr, DP: tl.constexpr, BR: tl.constexpr):
    """y[r] = x[r] / sqrt(sum(x[r]^2) + eps) for BR rows of a contiguous [M, D] matrix."""
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, DP)
    mask = (rows < M)[:, None] & (cols < D)[None, :]
    offs = rows[:, None] * D + cols[None, :]
    xf = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    ssq, ssq_lo = sq_sums(xf)
    big = (ssq >= SSQ_BIG)[:, None]
    huge = (xf * SSQ_LO) / tl.sqrt(tl.where(big, ssq_lo[:, None], 1.0))
    out = tl.where(big, huge, xf / tl.sqrt(ssq + L2_EPS)[:, None])
    tl.store(y + offs, out.to(y.dtype.element_ty), mask=mask)

"""GDN's one-pass state/output kernel with w h and u computed in the loop: no w/u kernel, no w, u in memory.

The one-pass path (kernels/state_out.py) reads w = A (beta exp2(c) k) and u = A (beta v) from the w/u
kernel, which writes both ([T, HV, K] and [T, HV, V], 16-bit) only for this loop to read them back.
Here the loop reads A itself and re-associates the product, so no program forms w:

    w h_slab = A (diag(beta exp2(c)) (k h_slab)),  so  v_new = A x,  x = beta v - beta exp2(c) (k h_slab)

k h_slab is a [64, K] x [K, BV] product, the size of the w h it replaces, and it reads the k tile the state
update reads anyway; A x ([64, 64] x [64, BV]) is the one product added per chunk.  Every term is
proportional to the V slab, so a program that owns a [K, BV] slab repeats nothing across the V slabs
except loads of A and k, which the slabs of one head share through L2; recomputing w per slab would
repeat a [64, 64] x [64, K] product per slab (four times at BV 32), and owning the whole V (BV = V, as
FlashQLA does) keeps a [K, V] fp32 state in registers (128 per thread at 4 warps for K = V = 128; offline,
sm_90, Triton 3.6: 136 B of stack at 8 warps, 840 at 16) and leaves 4 x fewer programs than state_out has
(h16_hv32_fixed8k: 32 programs for 132 SMs).  BV 32 at 4 warps and 3 stages: 152-174 registers, no stack,
160 KB of shared memory.

IN_LOOP_AQK: the chunk's gated causal q k^T is accumulated from the q and k tiles the loop loads for q h
and k h, so aqk_kernel goes too (one [64, K] x [K, 64] product per chunk and V slab, repeated per slab).
Otherwise Aqk (and, FUSE_Q, c_q) come from aqk_kernel as in state_out.

FUSE_K (fused_qk): k is raw and A is built on k's normalized rows (gram_solve), so here
x = beta v - beta exp2(c) r (k_raw h) and v_new = A x, with k's row rstd r.  Aqk comes with r on its
columns (aqk_kernel's K_COLS: Aqk on normalized k), so o takes v_new as it is, and the update runs on raw k
with r on v_new's rows in the decay factor it takes anyway: k_n^T v_new = k_raw^T (diag(r) v_new).  Against
r on v_new's [64, BV] rows after A x (H200, the loop alone at the shipped fused_qk entries, both gate
regimes' geomean, the autotuner's gate and timing): n_spills 18 -> 6 at HV32 8K and 32K, 14 -> 4 at HV64,
16 -> 6 at h4_hv8_mixed; 213.5 -> 210.1 us, 800.2 -> 787.1, 323.2 -> 316.3, 111.0 -> 111.0, and
h16_hv48_uniform 192.3 -> 188.1.
K_TILE (KernelConfig.k_rstd_tile): r comes in aqk_kernel's c_q tile, each row's (c, c + log2 r_q, c + log2 r, r)
in one 16-byte load, not as its own [64] vector from gram_solve's rstd_k [B,T,H], a plain load the step waits on,
as q's rstd was (state_out.py).
H200, the loop alone under fused_qk, CUDA graphs, strong / long gates: searched, 642.8 / 966.5 us at
h16_hv32_fixed32k against the vector form's 676.3 / 1166.5 at that config, 181.8 / 249.9 at HV32 8K against the
vector entry's 172.3 / 269.6; at the vector form's entries with 2 stages a tile cost 192 -> 346 us at
h16_hv48_uniform and 333 -> 475 at HV64: there the tile needs 4 B more shared memory than two programs per SM
allow (115716 B against 115712 at HV64's entry, offline sm_90), so one program runs per SM.  So it is searched.
C_LAST_TILE (KernelConfig.c_last_from_tile, with K_TILE only): the chunk's last c, the state's decay, is taken from
the tile's c rows (a sum over the rows, all but the last masked; the same value bitwise), not loaded on its own:
Triton turns that scalar load into an asynchronous copy with a 4-byte buffer and a wait every step.  Offline
(sm_90, Triton 3.6) it frees the 4 B above: HV48's 2-stage entry with the tile 115716 -> 115712 B.  H100, fused_qk's
loop with the tile, strong gates: h16_hv32_fixed32k 641.0 -> 609.9 us, HV32 8K 180.9 -> 175.1; at h4_hv8_mixed (BK
64) slower, fused_qk / floor 1.032 -> 1.055.  So it is searched.

Rounding: the two-kernel forms round w and u to k's and v's dtype; this form rounds x to A's dtype for the
A x product and keeps v_new in fp32 until the o product (cast to v's dtype there, as state_out does).

Context parallelism (``segments`` > 1): each sequence's chunks are cut into that many segments, one program
per (segment, head, V slab), so a long sequence with few heads fills the SMs (h16_hv32_fixed32k: 64
programs of 512 chunks each on 132 SMs at BV 64).  A segment needs the state entering its first chunk c0:

- warm-up: where the gates' total decay over chunks [w0, c0) falls below 2^-WARM_UP_LOG2 within one
  segment's length of chunks back, the program walks [w0, c0) from an empty state (the state update only,
  no output) and then its own chunks.  With unit-norm k rows and beta in [0, 2] each token's transition
  exp(g) (I - beta k k^T) has norm <= exp(g), so the dropped state reaches c0 scaled by at most 2^-32: exact
  to that bound (below fp32 rounding).  Where c0 itself is within reach, the walk starts at the sequence
  start (exact).  Unit-norm k: every route normalizes k (norm "none" callers pass normalized k).
- hand-over: where the gates do not decay that far (long-memory heads), the program waits for the previous
  segment's final state (a flag per program, fp32 state in ``hand``) and continues from it: exact, and as
  serial as one program per sequence for those heads.  Programs take tickets from an atomic counter and
  decode their (sequence, segment, head, V slab) from it, so the one a program waits for started earlier:
  no deadlock whatever order the hardware starts programs in.
- V-split (``split_v``): a head one of whose segments would wait is not cut along the sequence at all; its
  segment programs of a V slab take split_width columns each (those past the slab idle) and each walks the
  whole sequence from the initial state: exact, no program waits, and the head keeps the parallelism of the
  segments at narrower slabs (H200, HV32 8K long-memory gates, BV 64, 4 segments: 418.8 us handing over,
  332.7 split).

H200, this kernel alone, explicit route, BV 64, 64-row pieces, 2 stages: HV32 8K 399.6 us as one segment,
137.1 in four on strong gates, 414.2 on long-memory gates (its never-forgetting heads wait and run in series
at BV 64, where one segment of the tuned BV 32 took 250); 32K 1597.8 -> 533.3 on strong gates.  The tuner
ranks segment counts by the geometric mean over both gate regimes (autotune/bench.py).

beta (KernelConfig.early_beta): its rows are 16-bit values HV apart, below the 4-byte minimum of an
asynchronous copy, so beta is the loop's one plain load.  Issued after k h's product, the step waits for it
there; issued before the step's first product, its latency hides behind that product.  H200, the loop alone at
the shipped entries, strong / long gates (us): h16_hv32_fixed8k fused_q 190.6 / 253.6 -> 172.1 / 245.4, plain
180.7 / 273.9 -> 160.8 / 255.6; h16_hv48_uniform fused_qk 217.9 / 217.8 -> 196.7 / 196.3; h16_hv64_fixed8k
fused_q 267.7 / 417.6 -> 248.0 / 394.3; 32K fused_q 655.6 / 994.4 -> 640.7 / 948.8; the same at HV32 8K's
fused_qk entry and at h4_hv8_mixed; slower at h16_hv48_uniform fused_q (212.6 / 213.5 -> 216.1 / 221.2).
So it is searched, not fixed.  Why fused_q lost (sm_90 SASS, Triton 3.6, H16 HV48 K = V = 128 bf16, BK 64 BV 64, 4
warps, 2 stages): there ptxas puts beta's bf16 -> fp32 conversion, which waits on the load, between the 3rd and 4th
wgmma of k h's first product, so each step waits out the load there; under plain and fused_qk the first use comes
after all four k h / q h products.  BETA_AHEAD (KernelConfig.beta_ahead) takes the placement out of ptxas's hands:
each step loads the next chunk's rows and uses the ones the step before loaded (their first use in fused_q's
loop now comes after q h's second product, 350 and 620 instructions after the two loads).
"""

import triton
import triton.language as tl

from .common import loop_bound, row_pairs, row_quads
from .state import _initial_pieces, _sequence_span, _store_pieces

WARM_UP_LOG2 = 32  # a warm-up starts where the gates have decayed by 2^-32


@triton.jit
def _piece_products(qb, kb, rows, m_t, o_k, b_h, b_kh, b_qh, b_s, K: tl.constexpr, stride,
                    QK: tl.constexpr, PREC: tl.constexpr, Q: tl.constexpr):
    """One state piece's share of k h, (Q) q h and (Q and QK) q k^T; returns the k tile too (the update's
    operand)."""
    msk = m_t[:, None] & (o_k < K)[None, :]
    b_k = tl.load(kb + rows[:, None] * stride + o_k[None, :], mask=msk, other=0.0)
    b_hh = b_h.to(b_k.dtype)
    b_kh = tl.dot(b_k, b_hh, b_kh, input_precision=PREC)
    if Q:
        b_q = tl.load(qb + rows[:, None] * stride + o_k[None, :], mask=msk, other=0.0)
        b_qh = tl.dot(b_q, b_hh, b_qh, input_precision=PREC)
        if QK:
            b_s = tl.dot(b_q, tl.trans(b_k), b_s, input_precision=PREC)
    return b_k, b_kh, b_qh, b_s


@triton.jit
def _update(b_k, b_vd, b_h, d_last, PREC: tl.constexpr):
    """h_piece = exp2(c_last) h_piece + k[:, piece]^T v_decayed."""
    return tl.dot(tl.trans(b_k), b_vd, b_h * d_last, input_precision=PREC)


@triton.jit
def _beta_rows(beta, tok, n_valid, rows, i_hv, HV: tl.constexpr):
    """beta's rows tok + rows of value head i_hv in their storage dtype (none from n_valid on)."""
    return tl.load(beta + tok * HV + i_hv + rows * HV, mask=rows < n_valid, other=0.0)


@triton.jit
def _chunk_step(q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, tok, n_valid, rows, o_v, m_v, i_h, i_hv,
                b_h1, b_h2, b_h3, b_h4, scale, b_beta_in, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, FUSE_Q: tl.constexpr, FUSE_K: tl.constexpr,
                IN_LOOP_AQK: tl.constexpr, PREC: tl.constexpr, PIECE: tl.constexpr, OUT: tl.constexpr,
                EARLY_BETA: tl.constexpr, K_TILE: tl.constexpr, BETA_AHEAD: tl.constexpr, C_LAST_TILE: tl.constexpr):
    """One chunk of the loop: o's rows (OUT) and the state carried past the chunk; OUT False is a warm-up
    step (the state only: no q, Aqk or o).  EARLY_BETA: beta's rows are loaded before the step's first
    product, not after k h; BETA_AHEAD: they are b_beta_in, loaded by the step before (module docstring)."""
    o_k1 = tl.arange(0, PIECE)
    qb = q + tok * (H * K) + i_h * K
    kb = k + tok * (H * K) + i_h * K
    gb = g_cs + tok * HV + i_hv
    m_t = rows < n_valid
    if EARLY_BETA:
        b_beta = _beta_rows(beta, tok, n_valid, rows, i_hv, HV).to(tl.float32)
    if BETA_AHEAD:
        b_beta = b_beta_in.to(tl.float32)
    # k h, q h (and q k^T) from the state entering this chunk
    b_kh = tl.zeros([BT, BV], dtype=tl.float32)
    b_qh = tl.zeros([BT, BV], dtype=tl.float32)
    b_s = tl.zeros([BT, BT], dtype=tl.float32)
    b_k1, b_kh, b_qh, b_s = _piece_products(qb, kb, rows, m_t, o_k1, b_h1, b_kh, b_qh, b_s, K, H * K,
                                            IN_LOOP_AQK, PREC, OUT)
    if K > PIECE:
        b_k2, b_kh, b_qh, b_s = _piece_products(qb, kb, rows, m_t, o_k1 + PIECE, b_h2, b_kh, b_qh, b_s, K, H * K,
                                                IN_LOOP_AQK, PREC, OUT)
    if K > 2 * PIECE:
        b_k3, b_kh, b_qh, b_s = _piece_products(qb, kb, rows, m_t, o_k1 + 2 * PIECE, b_h3, b_kh, b_qh, b_s, K,
                                                H * K, IN_LOOP_AQK, PREC, OUT)
    if K > 3 * PIECE:
        b_k4, b_kh, b_qh, b_s = _piece_products(qb, kb, rows, m_t, o_k1 + 3 * PIECE, b_h4, b_kh, b_qh, b_s, K,
                                                H * K, IN_LOOP_AQK, PREC, OUT)

    last = tl.minimum(n_valid, BT) - 1
    if not C_LAST_TILE:
        c_last = tl.load(gb + last * HV)
    if K_TILE:  # c_q's quads: k's rstd r_k in the tile that brings c and q's rstd
        c, c_o, c_k, r_k = row_quads(c_q, tok, i_hv, rows, m_t, H, HV)
        if C_LAST_TILE:  # the chunk's last c from the tile's rows, not a load of its own
            c_last = tl.sum(tl.where(rows == last, c, 0.0), 0)
    elif FUSE_Q:  # q h on raw q: its rows take q's rstd r, as exp2(c + log2 r) (see state_out.py)
        c, c_o = row_pairs(c_q, tok, i_hv, rows, m_t, H, HV)
    else:
        c = tl.load(gb + rows * HV, mask=m_t, other=0.0)
        c_o = c
    # v_new = A x,  x = beta v - beta exp2(c) (k h)   (= u - w h)
    if not EARLY_BETA:
        if not BETA_AHEAD:
            b_beta = _beta_rows(beta, tok, n_valid, rows, i_hv, HV).to(tl.float32)
    if K_TILE:  # f_kh = beta exp2(c + log2 r_k)
        f_kh = b_beta * tl.math.exp2(c_k)
    else:
        f_kh = b_beta * tl.math.exp2(c)
        if FUSE_K:
            r_k = tl.load(rstd_k + tok * H + i_h + rows * H, mask=m_t, other=0.0)
            f_kh = f_kh * r_k
    m_tv = m_t[:, None] & m_v[None, :]
    p_v = rows[:, None] * (HV * V) + o_v[None, :]
    b_v = tl.load(v + tok * (HV * V) + i_hv * V + p_v, mask=m_tv, other=0.0).to(tl.float32)
    b_x = b_v * b_beta[:, None] - b_kh * f_kh[:, None]
    p_A = tok * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :]
    b_A = tl.load(A + p_A, mask=m_t[:, None], other=0.0)
    b_vn = tl.dot(b_A, b_x.to(b_A.dtype), input_precision=PREC)

    if OUT:  # o = scale * (exp2(c) q h + Aqk v_new)
        if IN_LOOP_AQK:
            keep = (rows[:, None] >= rows[None, :]) & m_t[:, None] & m_t[None, :]
            # where() after the product: above the diagonal exp2 may overflow, never selected
            b_Aqk = tl.where(keep, b_s * tl.math.exp2(c[:, None] - c[None, :]), 0.0).to(q.dtype.element_ty)
        else:
            b_Aqk = tl.load(aqk + p_A, mask=m_t[:, None], other=0.0)
        b_vo = b_vn.to(v.dtype.element_ty).to(b_Aqk.dtype)  # v_new as the two-kernel path stores it
        b_o = tl.dot(b_Aqk, b_vo, b_qh * tl.math.exp2(c_o)[:, None], input_precision=PREC) * scale
        tl.store(o + tok * (HV * V) + i_hv * V + p_v, b_o.to(o.dtype.element_ty), mask=m_tv)

    # decay to the chunk end, then add the chunk's keys/values
    row_f = tl.where(m_t, tl.math.exp2(c_last - c), 0.0)
    if FUSE_K:  # the update runs on raw k: v_new's rows times k's rstd (Aqk's columns carry it for o)
        row_f = row_f * r_k
    b_vd = (b_vn * row_f[:, None]).to(k.dtype.element_ty)
    d_last = tl.math.exp2(c_last)
    b_h1 = _update(b_k1, b_vd, b_h1, d_last, PREC)
    if K > PIECE:
        b_h2 = _update(b_k2, b_vd, b_h2, d_last, PREC)
    if K > 2 * PIECE:
        b_h3 = _update(b_k3, b_vd, b_h3, d_last, PREC)
    if K > 3 * PIECE:
        b_h4 = _update(b_k4, b_vd, b_h4, d_last, PREC)
    return b_h1, b_h2, b_h3, b_h4


@triton.jit
def _warm_start(gl, c0, cap, stride, THRESH: tl.constexpr, CB: tl.constexpr):
    """Where a segment starting at chunk c0 starts its warm-up: the latest w0 in [c0 - cap, c0] whose chunks
    [w0, c0) decay by more than 2^-THRESH in total; 0 where none does but c0 <= cap (a walk from the
    sequence start, exact); -1 where none does within cap chunks (the segment waits for its predecessor's
    state).  c_last of chunk j (log2 units) at gl + j * stride."""
    lo = tl.maximum(c0 - cap, 0)
    w0 = c0 * 0 - 1
    found = c0 * 0
    jb = c0
    acc = tl.sum(tl.zeros([CB], dtype=tl.float32), 0)
    while (jb > lo) & (found == 0):
        js = jb - 1 - tl.arange(0, CB)
        ok = js >= lo
        cl = tl.load(gl + js.to(tl.int64) * stride, mask=ok, other=0.0)
        cs = acc + tl.cumsum(cl, 0)
        jhit = tl.max(tl.where((cs < -THRESH) & ok, js, -1), 0)
        w0 = tl.where(jhit >= 0, jhit, w0)
        found = tl.where(jhit >= 0, 1, found)
        acc += tl.sum(cl, 0)
        jb -= CB
    return tl.where((found == 0) & (lo == 0), 0, w0)


@triton.jit
def _handed_pieces(ptr, o_v, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PIECE: tl.constexpr):
    """The [K, V] fp32 state another program handed over at ptr, read through L2 (.cg)."""
    o_k = tl.arange(0, PIECE)
    b_h1 = tl.zeros([PIECE, BV], dtype=tl.float32)
    b_h2 = tl.zeros([PIECE, BV], dtype=tl.float32)
    b_h3 = tl.zeros([PIECE, BV], dtype=tl.float32)
    b_h4 = tl.zeros([PIECE, BV], dtype=tl.float32)
    m_v = (o_v < V)[None, :]
    b_h1 += tl.load(ptr + o_k[:, None] * V + o_v[None, :], mask=(o_k < K)[:, None] & m_v, other=0.0,
                    cache_modifier=".cg")
    if K > PIECE:
        b_h2 += tl.load(ptr + (o_k + PIECE)[:, None] * V + o_v[None, :], mask=((o_k + PIECE) < K)[:, None] & m_v,
                        other=0.0, cache_modifier=".cg")
    if K > 2 * PIECE:
        b_h3 += tl.load(ptr + (o_k + 2 * PIECE)[:, None] * V + o_v[None, :],
                        mask=((o_k + 2 * PIECE) < K)[:, None] & m_v, other=0.0, cache_modifier=".cg")
    if K > 3 * PIECE:
        b_h4 += tl.load(ptr + (o_k + 3 * PIECE)[:, None] * V + o_v[None, :],
                        mask=((o_k + 3 * PIECE) < K)[:, None] & m_v, other=0.0, cache_modifier=".cg")
    return b_h1, b_h2, b_h3, b_h4


@triton.jit
def _head_waits(gl, n_chunks, per_seg, stride, THRESH: tl.constexpr, SEG: tl.constexpr):
    """1 where one of the head's segments would wait for its predecessor's state (the test each makes)."""
    waits = n_chunks * 0
    for i_s in tl.static_range(1, SEG):
        c0 = tl.minimum(i_s * per_seg, n_chunks)
        w0 = _warm_start(gl, c0, per_seg, stride, THRESH, 64)
        waits = tl.where((w0 < 0) & (c0 < n_chunks), 1, waits)
    return waits


@triton.jit
def _walk(q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, h0, ht, sync, hand, scale, t, i_s, i_h, i_hv, i_nh, bos,
          seq_len, n_chunks, o_v, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
          BV: tl.constexpr, NV: tl.constexpr, BT: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
          FUSE_Q: tl.constexpr, FUSE_K: tl.constexpr, IN_LOOP_AQK: tl.constexpr, PREC: tl.constexpr,
          PIECE: tl.constexpr, SEG: tl.constexpr, THRESH: tl.constexpr, EARLY_BETA: tl.constexpr,
          K_TILE: tl.constexpr, BETA_AHEAD: tl.constexpr, C_LAST_TILE: tl.constexpr):
    """One program's walk over its V slab o_v (BV wide): SEG 1 the whole sequence, else segment i_s of SEG
    (warm-up or hand-over first, module docstring)."""
    m_v = o_v < V
    b_h1, b_h2, b_h3, b_h4 = _initial_pieces(h0, i_nh, o_v, K, V, BV, PIECE, USE_H0)
    rows = tl.arange(0, BT)
    c0 = n_chunks * 0
    c1 = n_chunks
    if SEG > 1:
        per_seg = tl.cdiv(n_chunks, SEG)
        c0 = tl.minimum(i_s * per_seg, n_chunks)
        c1 = tl.minimum(c0 + per_seg, n_chunks)
        gl = g_cs + (bos + BT - 1) * HV + i_hv  # every chunk before a segment's start is full
        w0 = _warm_start(gl, c0, per_seg, BT * HV, THRESH, 64)
        if (w0 < 0) & (c0 < c1):  # wait for the previous segment's state
            p_flag = sync + 1 + t - NV * HV
            ready = tl.atomic_add(p_flag, 0, sem="acquire")
            while ready == 0:
                ready = tl.atomic_add(p_flag, 0, sem="acquire")
            b_h1, b_h2, b_h3, b_h4 = _handed_pieces(hand + (t // NV - HV).to(tl.int64) * K * V, o_v, K, V, BV,
                                                    PIECE)
        elif w0 > 0:  # warm up from an empty state
            b_h1, b_h2, b_h3, b_h4 = b_h1 * 0.0, b_h2 * 0.0, b_h3 * 0.0, b_h4 * 0.0
        if BETA_AHEAD:
            b_nb = _beta_rows(beta, bos + tl.maximum(w0, 0) * BT, seq_len - tl.maximum(w0, 0) * BT, rows, i_hv, HV)
        for i_t in range(loop_bound(tl.maximum(w0, 0)), loop_bound(tl.where(w0 < 0, 0, c0))):
            b_cur = scale  # read only under BETA_AHEAD
            if BETA_AHEAD:
                b_cur = b_nb
                b_nb = _beta_rows(beta, bos + (i_t + 1) * BT, seq_len - (i_t + 1) * BT, rows, i_hv, HV)
            b_h1, b_h2, b_h3, b_h4 = _chunk_step(q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, bos + i_t * BT,
                                                 seq_len - i_t * BT, rows, o_v, m_v, i_h, i_hv, b_h1, b_h2, b_h3,
                                                 b_h4, scale, b_cur, H, HV, K, V, BV, BT, FUSE_Q, FUSE_K, IN_LOOP_AQK,
                                                 PREC, PIECE, False, EARLY_BETA, K_TILE, BETA_AHEAD, C_LAST_TILE)
    if BETA_AHEAD:
        b_nb = _beta_rows(beta, bos + c0 * BT, seq_len - c0 * BT, rows, i_hv, HV)
    for i_t in range(loop_bound(c0), loop_bound(c1)):
        b_cur = scale  # read only under BETA_AHEAD
        if BETA_AHEAD:
            b_cur = b_nb
            b_nb = _beta_rows(beta, bos + (i_t + 1) * BT, seq_len - (i_t + 1) * BT, rows, i_hv, HV)
        b_h1, b_h2, b_h3, b_h4 = _chunk_step(q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, bos + i_t * BT,
                                             seq_len - i_t * BT, rows, o_v, m_v, i_h, i_hv, b_h1, b_h2, b_h3, b_h4,
                                             scale, b_cur, H, HV, K, V, BV, BT, FUSE_Q, FUSE_K, IN_LOOP_AQK, PREC,
                                             PIECE, True, EARLY_BETA, K_TILE, BETA_AHEAD, C_LAST_TILE)
    if SEG > 1:
        if c1 < n_chunks:  # hand the state over where the next segment waits for it (the same test it makes)
            if _warm_start(gl, c1, per_seg, BT * HV, THRESH, 64) < 0:
                _store_pieces(hand + (t // NV).to(tl.int64) * K * V, b_h1, b_h2, b_h3, b_h4, o_v, K, V, PIECE)
                tl.debug_barrier()
                tl.atomic_xchg(sync + 1 + t, 1, sem="release")
    if STORE_HT:
        if (c1 == n_chunks) & ((c0 < c1) | (i_s == 0)):  # the sequence's last segment
            _store_pieces(ht + i_nh.to(tl.int64) * K * V, b_h1, b_h2, b_h3, b_h4, o_v, K, V, PIECE)


@triton.jit(do_not_specialize=["T"])
def fused_state_out_kernel(
    q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, h0, ht, cu_seqlens, sync, hand, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, FUSE_Q: tl.constexpr,
    FUSE_K: tl.constexpr, IN_LOOP_AQK: tl.constexpr, PREC: tl.constexpr, PIECE: tl.constexpr,
    SEG: tl.constexpr, THRESH: tl.constexpr, SPLIT_V: tl.constexpr, BVS: tl.constexpr, EARLY_BETA: tl.constexpr,
    K_TILE: tl.constexpr, BETA_AHEAD: tl.constexpr, C_LAST_TILE: tl.constexpr,
):
    """SEG 1: grid (cdiv(V, BV), N*HV).  o like v; h0/ht [N, HV, K, V] fp32; A [B,T,HV,64] from gram_solve; aqk
    and c_q from aqk_kernel unless IN_LOOP_AQK (then unused, and FUSE_Q is not allowed); under FUSE_K rstd_k
    [B,T,H] fp32, or with K_TILE in c_q (fp32 quads) from aqk_kernel.  PIECE rows per state piece, K <= 4 PIECE
    (as the state kernel).

    SEG > 1 (context parallelism, module docstring): grid (N*SEG*HV*cdiv(V, BV),); sync int32 zeros, one
    ticket counter then a flag per program; hand fp32 [N*SEG*HV, K, V], the states handed between segments.
    SPLIT_V (SEG >= 4): a head one of whose segments would wait is not cut along the sequence; its SEG programs
    of a V slab take BVS columns each (those past BV idle) and walk the whole sequence."""
    NV: tl.constexpr = (V + BV - 1) // BV
    if SEG == 1:
        i_v, i_nh = tl.program_id(0), tl.program_id(1)
        i_n, i_hv = i_nh // HV, i_nh % HV
        i_s = 0
        t = 0
    else:
        # tickets in start order: the program a segment waits for took a lower ticket, so it runs
        t = tl.atomic_add(sync, 1)
        i_v = t % NV
        i_hv = (t // NV) % HV
        i_s = (t // (NV * HV)) % SEG
        i_n = t // (NV * HV * SEG)
        i_nh = i_n * HV + i_hv
    i_h = i_hv // (HV // H)
    bos, seq_len = _sequence_span(cu_seqlens, i_n, T, IS_VARLEN)
    n_chunks = tl.cdiv(seq_len, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    if SPLIT_V:
        gl = g_cs + (bos + BT - 1) * HV + i_hv
        if _head_waits(gl, n_chunks, tl.cdiv(n_chunks, SEG), BT * HV, THRESH, SEG) > 0:
            if i_s * BVS < BV:
                _walk(q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, h0, ht, sync, hand, scale, t, i_s * 0, i_h,
                      i_hv, i_nh, bos, seq_len, n_chunks, i_v * BV + i_s * BVS + tl.arange(0, BVS), H, HV, K, V, BVS, NV,
                      BT, USE_H0, STORE_HT, FUSE_Q, FUSE_K, IN_LOOP_AQK, PREC, PIECE, 1, THRESH, EARLY_BETA,
                      K_TILE, BETA_AHEAD, C_LAST_TILE)
        else:
            _walk(q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, h0, ht, sync, hand, scale, t, i_s, i_h, i_hv,
                  i_nh, bos, seq_len, n_chunks, o_v, H, HV, K, V, BV, NV, BT, USE_H0, STORE_HT, FUSE_Q, FUSE_K,
                  IN_LOOP_AQK, PREC, PIECE, SEG, THRESH, EARLY_BETA, K_TILE, BETA_AHEAD, C_LAST_TILE)
    else:
        _walk(q, k, v, beta, g_cs, A, rstd_k, aqk, c_q, o, h0, ht, sync, hand, scale, t, i_s, i_h, i_hv, i_nh,
              bos, seq_len, n_chunks, o_v, H, HV, K, V, BV, NV, BT, USE_H0, STORE_HT, FUSE_Q, FUSE_K, IN_LOOP_AQK,
              PREC, PIECE, SEG, THRESH, EARLY_BETA, K_TILE, BETA_AHEAD, C_LAST_TILE)

"""GDN's state recurrence and output in one pass, with q k^T out of the serial loop.

The two-kernel path stores the state h of every chunk and v_new (state kernel) and reads them back
(output kernel).  Here aqk_kernel first writes each chunk's gated causal q k^T (Aqk [B,T,HV,64],
unscaled), which does not depend on the state; then state_out_kernel walks a sequence's chunks as
the state kernel does, and the program that owns h's [K, BV] slab also writes o's [64, BV] slab:

    v_new = u - w h;   o = scale * (exp2(c) * (q h) + Aqk v_new);   h = exp2(c_last) h + k^T (...)

so neither h per chunk nor v_new goes through memory.  Measured on the H200 (gdn-qwen6, Triton 3.6,
a prototype of these kernels, CUDA graphs): aqk +
state_out against state + output at their tuned configs 0.918 (h16_hv32_fixed8k), 0.834
(h16_hv64_fixed8k), 0.978 (h4_hv8_mixed), 0.836 (h16_hv48_uniform), 0.850 (32K), and 1.103 on
h2_hv8_serving: each chunk step is longer, which the longest sequence pays once per chunk, while
the work saved grows with the tokens of all sequences and heads (ops picks the path; see
``ops.one_pass``).  Outputs were bitwise equal to the two kernels'.

FUSE_Q (fused_q, fused_qk): q is raw.  aqk_kernel accumulates q k^T and q's row sums of squares in
one pass over the chunk's rows, takes q's rstd r from them (overflow-safe), scales Aqk's rows by it
and writes c_q (a pair tensor, common.pair_offsets), each row's (c, c + log2 r); state_out loads that
pair where the plain form loads c, and q h's rows take exp2(c + log2 r) = exp2(c) r.  Measured on the
H200 (state_out alone, fused tuned configs, CUDA graphs): r loaded as its own
[64] vector beside c cost 187 -> 248 us at h16_hv32_fixed8k and 727 -> 968 at 32K (about a program per SM
and four warps: nothing hides a load's latency in the serial loop, and prefetching it a chunk ahead
still left 227 / 874); in the tile that brings c it costs 189 / 731.  An earlier form that normalized
q's tiles before every dot cost 29 us more at h16_hv32_fixed8k and 110-112 at 32K (tuned).
Under fused_qk k is raw and v_new's rows carry k's rstd (the w/u kernel puts it on w and u), so Aqk is
built on raw k; where a raw product could overflow fp32 (a q or k row's sum of squares reaching 2^100)
aqk_kernel redoes the chunk with q normalized on load (|q_norm . k| <= |k|), and with fp16 storage ops
keeps Aqk in fp32 (raw k may leave fp16's range).  As in the output kernel, q h on raw q limits q rows
to |q| below ~1e36.
"""

import triton
import triton.language as tl
from triton.language.target_info import cuda_capability_geq

from .common import (L2_EPS, SSQ_BIG, chunk_coords, l2_rstd, loop_bound, pair_ptrs, row_pairs, row_sq_sums,
                     vec_max)
from .state import _add_kv, _initial_pieces, _sequence_span, _store_pieces, _w_times_h


@triton.jit
def _scaled_rows(xb, rows, m_t, o_k, r, K: tl.constexpr, stride, SCALE: tl.constexpr):
    """A [rows, o_k] tile of x; SCALE: each row times r (in fp32, then back to x's dtype)."""
    b_x = tl.load(xb + rows[:, None] * stride + o_k[None, :], mask=m_t[:, None] & (o_k < K)[None, :], other=0.0)
    if SCALE:
        b_x = (b_x.to(tl.float32) * r[:, None]).to(b_x.dtype)
    return b_x


@triton.jit
def _qk_dots(qb, kb, rows, m_t, r, K: tl.constexpr, stride, BT: tl.constexpr, BK: tl.constexpr,
             SCALE: tl.constexpr, SSQ: tl.constexpr, SSQ_K: tl.constexpr, PREC: tl.constexpr):
    """(q k^T, q's row sums of squares if SSQ, k's if SSQ_K, else zeros) over the K tiles of one chunk;
    SCALE: q's rows times r on load.  The sums come from the q and k tiles already loaded, in fp32 (inf
    where a row overflows: aqk_kernel's rare path); k's in the layout of q k^T's columns."""
    b_s = tl.zeros([BT, BT], dtype=tl.float32)
    ssq = tl.zeros([BT], dtype=tl.float32)
    ssq_k = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        b_q = _scaled_rows(qb, rows, m_t, o_k, r, K, stride, SCALE)
        b_kt = tl.load(kb + rows[None, :] * stride + o_k[:, None], mask=(o_k < K)[:, None] & m_t[None, :], other=0.0)
        b_s = tl.dot(b_q, b_kt, b_s, input_precision=PREC)
        if SSQ:
            b_qf = b_q.to(tl.float32)
            ssq += tl.sum(b_qf * b_qf, 1)
        if SSQ_K:
            b_kf = b_kt.to(tl.float32)
            ssq_k += tl.sum(b_kf * b_kf, 0)
    return b_s, ssq, ssq_k


@triton.jit
def _gate_rows(g_cs, tok0, i_h, rows, m_t, HV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr):
    """The chunk's gate cumsums of q head i_h's G value heads, [BT, GP] (columns past G zero)."""
    o_g = tl.arange(0, GP)
    return tl.load(g_cs + tok0 * HV + i_h * G + rows[:, None] * HV + o_g[None, :],
                   mask=m_t[:, None] & (o_g < G)[None, :], other=0.0)


@triton.jit(do_not_specialize=["T", "NT"])
def aqk_kernel(q, k, g_cs, aqk, c_q, ssq_k, rstd_k, cu_seqlens, chunk_indices, T, NT,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
               IS_VARLEN: tl.constexpr, FUSE_Q: tl.constexpr, FUSE_K: tl.constexpr, PREC: tl.constexpr,
               GP: tl.constexpr, K_TILE: tl.constexpr, K_COLS: tl.constexpr, EARLY: tl.constexpr,
               HEADS_FIRST: tl.constexpr):
    """Grid (chunks, B*H): Aqk = causal(q k^T * exp2(c_i - c_j)) of one chunk for the HV / H value heads
    that share q head i_h.  q k^T (and under FUSE_Q q's rstd) is formed once per q head; only the gates
    differ between its value heads (H200, gdn-qwen6, against one program per value head at tuned
    configs: HV64 57.8 -> 48.5 us, 32K 133.1 -> 118.2; fused_qk HV64 101.7 -> 60.4, HV48 78.7 -> 54.7).

    FUSE_Q: one pass over raw q accumulates q k^T and q's row sums of squares (from the q tiles the dot
    loads), whose rstd r then scales the rows.  It also writes c_q (fp32 pairs, common.pair_ptrs): each row's
    (c, c + log2 r) for state_out, for all G value heads of the q head in one [64, 2 GP] tile (GP: G
    rounded up to a power of two); against a [64, 2] tile per value head (H200, the kernel alone at the
    fused entries' configs, CUDA graphs; the ssq test below in both): HV32 8K 36.9 -> 34.9 us, HV64
    56.2 -> 50.2, HV48 46.9 -> 44.0, 32K 130.0 -> 127.5; plain aqk there 33.1, 50.4, 42.5, 112.0.
    K_COLS (under FUSE_K, for the in-loop kernel): Aqk's columns times k's rstd r_k, so Aqk is on k's normalized
    rows and the loop's v_new needs no r_k (fused_fwd.py).  r_k comes from the k tiles the dot loads, as q's
    (gram_solve's vector only on the rare path).
    K_TILE (under K_COLS): c_q holds quads, each row's (c, c + log2 r, c + log2 r_k, r_k), in the same tile form
    ([64, 4 GP]), for the in-loop kernel's k_rstd_tile (fused_fwd.py), which reads them in one load.

    The rare path (a chunk with a q row whose sum of squares reached SSQ_BIG, or under FUSE_K a k row
    whose did: under K_COLS its own sums, else gram_solve's ssq_k) redoes the chunk with q's rows normalized
    on load, their rstd overflow-safe (under K_COLS in a call, _aqk_rare).  Below those bounds no raw product
    can overflow fp32 (|q . k| <= |q| |k| < 2^100; fused_q's k has unit rows), so one test of the sums replaces
    a test of every product of the tile (H200, the kernel alone at the fused entries' configs: 32K 136.9 ->
    130.3 us, HV32 8K 38.2 -> 36.9).

    EARLY (KernelConfig.early_gates): the G value heads' gate rows are loaded once,
    before q k^T's products, and each head's column is taken from that tile; otherwise they are loaded after the
    products, where the program waits on them (per head in the Aqk loop).  Same values either way: searched.

    HEADS_FIRST (KernelConfig.heads_first): grid (B*H, chunks), a chunk's q heads launched in a row, as in
    gram_solve_kernel.  H200, aqk alone at the shipped entries (us): h16_hv32_fixed32k plain 105.6 -> 98.0, fused_q
    114.3 -> 110.0, fused_qk 114.2 -> 111.0; HV64 42.0 -> 40.3, 41.1 -> 39.2, 42.8 -> 41.3; the other shapes
    within 1.1; searched."""
    if HEADS_FIRST:
        i_c, i_bh = tl.program_id(1), tl.program_id(0)
    else:
        i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    rows = tl.arange(0, BT)
    m_t = rows < n_valid
    qb = q + tok0 * (H * K) + i_h * K
    kb = k + tok0 * (H * K) + i_h * K
    if EARLY:
        c_g = _gate_rows(g_cs, tok0, i_h, rows, m_t, HV, HV // H, GP)
    else:  # loaded in _aqk_store
        c_g = tl.zeros([BT, GP], dtype=tl.float32)
    b_s, ssq, kss = _qk_dots(qb, kb, rows, m_t, m_t.to(tl.float32), K, H * K, BT, BK, False, FUSE_Q, K_COLS, PREC)
    if K_COLS:  # the rare path a call: its registers and stack are its own (_aqk_rare)
        if (vec_max(ssq) >= SSQ_BIG) | (vec_max(kss) >= SSQ_BIG):
            if cuda_capability_geq(10):  # Triton 3.6 fails to lower a tensor-memory dot in a call (sm_100, sm_103)
                _aqk_redo(q, k, g_cs, aqk, c_q, rstd_k, tok0, n_valid, i_h, H, HV, K, BK, BT, PREC, GP, K_TILE)
            else:
                _aqk_rare(q, k, g_cs, aqk, c_q, rstd_k, tok0, n_valid, i_h, H, HV, K, BK, BT, PREC, GP, K_TILE)
        else:
            r = 1.0 / tl.sqrt(ssq + L2_EPS)
            _aqk_store(b_s * r[:, None], r, 1.0 / tl.sqrt(kss + L2_EPS), c_g, g_cs, aqk, c_q, tok0, rows, m_t,
                       i_h, H, HV, BT, GP, True, K_TILE, True, EARLY)
    else:
        r = m_t.to(tl.float32)
        if FUSE_Q:
            rare = vec_max(ssq) >= SSQ_BIG
            if FUSE_K:
                rare = rare | (tl.load(ssq_k + i_g * H + i_h) >= SSQ_BIG)
            if rare:
                r = l2_rstd(ssq, row_sq_sums(qb, rows, m_t, K, H * K, BK, False, True)[1])
                b_s = _qk_dots(qb, kb, rows, m_t, r, K, H * K, BT, BK, True, False, False, PREC)[0]
            else:
                r = 1.0 / tl.sqrt(ssq + L2_EPS)
                b_s = b_s * r[:, None]
        _aqk_store(b_s, r, r, c_g, g_cs, aqk, c_q, tok0, rows, m_t, i_h, H, HV, BT, GP, FUSE_Q, False, False,
                   EARLY)


@triton.jit(noinline=True)
def _aqk_rare(q, k, g_cs, aqk, c_q, rstd_k, tok0, n_valid, i_h, H: tl.constexpr, HV: tl.constexpr,
              K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, GP: tl.constexpr,
              K_TILE: tl.constexpr):
    """aqk_kernel's rare path under K_COLS (a chunk with a q or k row whose sum of squares reached SSQ_BIG) as a
    call, not inlined: q k^T again with q's rows normalized on load, their rstd overflow-safe, and r_k from
    gram_solve's overflow-safe vector; then the chunk's stores.  Inlined, this path took registers from the
    main one (offline sm_90, HV32 8K's fused_qk entry: 2792 -> about 1940 SASS instructions, 32 -> 0 B of
    stack as a call).  H200, aqk alone, inlined -> call: HV32 8K 36.7 -> 35.0 us, HV48 44.4 -> 41.9, 32K 121.1
    -> 118.3, HV64 48.6 -> 48.9; under fused_q alone the call lost at every shape, so it serves fused_qk only.
    On sm_100 and up the same path is inlined (Triton 3.6's ConvertNVGPUToLLVM fails on the call, offline)."""
    _aqk_redo(q, k, g_cs, aqk, c_q, rstd_k, tok0, n_valid, i_h, H, HV, K, BK, BT, PREC, GP, K_TILE)


@triton.jit
def _aqk_redo(q, k, g_cs, aqk, c_q, rstd_k, tok0, n_valid, i_h, H: tl.constexpr, HV: tl.constexpr,
              K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, GP: tl.constexpr,
              K_TILE: tl.constexpr):
    """_aqk_rare's work: the chunk redone overflow-safe, then its stores."""
    rows = tl.arange(0, BT)
    m_t = rows < n_valid
    qb = q + tok0 * (H * K) + i_h * K
    kb = k + tok0 * (H * K) + i_h * K
    c_g = _gate_rows(g_cs, tok0, i_h, rows, m_t, HV, HV // H, GP)
    ssq, lo = row_sq_sums(qb, rows, m_t, K, H * K, BK, True, True)
    r = l2_rstd(ssq, lo)
    b_s = _qk_dots(qb, kb, rows, m_t, r, K, H * K, BT, BK, True, False, False, PREC)[0]
    r_k = tl.load(rstd_k + (tok0 + rows) * H + i_h, mask=m_t, other=1.0)
    _aqk_store(b_s, r, r_k, c_g, g_cs, aqk, c_q, tok0, rows, m_t, i_h, H, HV, BT, GP, True, K_TILE, True, True)


@triton.jit
def _aqk_store(b_s, r, r_k, c_g, g_cs, aqk, c_q, tok0, rows, m_t, i_h, H: tl.constexpr, HV: tl.constexpr,
               BT: tl.constexpr, GP: tl.constexpr, FUSE_Q: tl.constexpr, K_TILE: tl.constexpr,
               K_COLS: tl.constexpr, EARLY: tl.constexpr):
    """The chunk's stores given q k^T (b_s, rows already times q's rstd r under FUSE_Q): c_q's pairs (FUSE_Q) or
    quads (K_TILE), and each value head's gated causal Aqk, its columns times r_k under K_COLS.  c_g: the
    gate rows when EARLY loaded them, else loaded here."""
    G: tl.constexpr = HV // H
    o_g = tl.arange(0, GP)
    if FUSE_Q:  # the G value heads' factors are one contiguous [BT, W G] tile of c_q
        if not EARLY:
            c_g = _gate_rows(g_cs, tok0, i_h, rows, m_t, HV, G, GP)
        pairs = tl.reshape(tl.join(c_g, c_g + tl.log2(r)[:, None]), [BT, 2 * GP])
        o_p = tl.arange(0, 2 * GP)
        m_p = m_t[:, None] & (o_p < 2 * G)[None, :]
        if K_TILE:  # each value head's quad (c, c + log2 r, c + log2 r_k, r_k), stored as two pairs
            r_kg = tl.broadcast_to(r_k[:, None], [BT, GP])
            k_pairs = tl.reshape(tl.join(c_g + tl.log2(r_k)[:, None], r_kg), [BT, 2 * GP])
            o_q = (o_p // 2) * 4 + o_p % 2
            p_q = pair_ptrs(c_q, tok0, rows, i_h, H, HV, 4)[:, None] + o_q[None, :]
            tl.store(p_q, pairs, mask=m_p)
            tl.store(p_q + 2, k_pairs, mask=m_p)
        else:
            tl.store(pair_ptrs(c_q, tok0, rows, i_h, H, HV)[:, None] + o_p[None, :], pairs, mask=m_p)
    if K_COLS:  # Aqk on k's normalized rows: its columns times k's rstd
        b_s = b_s * r_k[None, :]
    keep = (rows[:, None] >= rows[None, :]) & m_t[:, None] & m_t[None, :]
    for j in tl.static_range(G):
        i_hv = i_h * G + j
        if EARLY:
            c = tl.sum(tl.where(o_g[None, :] == j, c_g, 0.0), 1)
        else:
            c = tl.load(g_cs + tok0 * HV + i_hv + rows * HV, mask=m_t, other=0.0)
        b_a = tl.where(keep, b_s * tl.math.exp2(c[:, None] - c[None, :]), 0.0)
        tl.store(aqk + tok0 * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                 b_a.to(aqk.dtype.element_ty), mask=m_t[:, None])


@triton.jit(do_not_specialize=["T"])
def state_out_kernel(
    q, k, w, u, g_cs, aqk, c_q, o, h0, ht, cu_seqlens, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, FUSE_Q: tl.constexpr,
    PREC: tl.constexpr, PIECE: tl.constexpr,
):
    """Grid (cdiv(V, BV), N*HV).  o like u; h0/ht [N, HV, K, V] fp32; PIECE rows per state piece,
    K <= 4 PIECE (as the state kernel)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, seq_len = _sequence_span(cu_seqlens, i_n, T, IS_VARLEN)
    n_chunks = tl.cdiv(seq_len, BT)

    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_k1 = tl.arange(0, PIECE)
    o_k2 = o_k1 + PIECE
    o_k3 = o_k2 + PIECE
    o_k4 = o_k3 + PIECE
    b_h1, b_h2, b_h3, b_h4 = _initial_pieces(h0, i_nh, o_v, K, V, BV, PIECE, USE_H0)

    rows = tl.arange(0, BT)
    for i_t in range(loop_bound(n_chunks)):
        tok = bos + i_t * BT
        qb = q + tok * (H * K) + i_h * K
        kb = k + tok * (H * K) + i_h * K
        wb = w + tok * (HV * K) + i_hv * K
        gb = g_cs + tok * HV + i_hv
        n_valid = seq_len - i_t * BT
        m_t = rows < n_valid
        # v_new = u - w h and q h, from the state entering this chunk
        b_wh = tl.zeros([BT, BV], dtype=tl.float32)
        b_qh = tl.zeros([BT, BV], dtype=tl.float32)
        b_wh = _w_times_h(wb, rows, m_t, o_k1, b_h1, b_wh, K, HV * K, PREC)
        b_qh = _w_times_h(qb, rows, m_t, o_k1, b_h1, b_qh, K, H * K, PREC)  # q h, as w h
        if K > PIECE:
            b_wh = _w_times_h(wb, rows, m_t, o_k2, b_h2, b_wh, K, HV * K, PREC)
            b_qh = _w_times_h(qb, rows, m_t, o_k2, b_h2, b_qh, K, H * K, PREC)  # q h, as w h
        if K > 2 * PIECE:
            b_wh = _w_times_h(wb, rows, m_t, o_k3, b_h3, b_wh, K, HV * K, PREC)
            b_qh = _w_times_h(qb, rows, m_t, o_k3, b_h3, b_qh, K, H * K, PREC)  # q h, as w h
        if K > 3 * PIECE:
            b_wh = _w_times_h(wb, rows, m_t, o_k4, b_h4, b_wh, K, HV * K, PREC)
            b_qh = _w_times_h(qb, rows, m_t, o_k4, b_h4, b_qh, K, H * K, PREC)  # q h, as w h
        m_tv = m_t[:, None] & m_v[None, :]
        p_uv = rows[:, None] * (HV * V) + o_v[None, :]
        b_vn = tl.load(u + tok * (HV * V) + i_hv * V + p_uv, mask=m_tv, other=0.0).to(tl.float32) - b_wh

        # o = scale * (exp2(c) q h + Aqk v_new)
        last = tl.minimum(n_valid, BT) - 1
        c_last = tl.load(gb + last * HV)
        if FUSE_Q:  # q h on raw q: its rows take q's rstd r, as exp2(c + log2 r), in the tile that brings c
            c, c_o = row_pairs(c_q, tok, i_hv, rows, m_t, H, HV)
        else:
            c = tl.load(gb + rows * HV, mask=m_t, other=0.0)
            c_o = c
        b_A = tl.load(aqk + tok * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                      mask=m_t[:, None], other=0.0)
        b_vo = b_vn.to(u.dtype.element_ty).to(b_A.dtype)  # v_new as the two-kernel path stores it
        b_o = tl.dot(b_A, b_vo, b_qh * tl.math.exp2(c_o)[:, None], input_precision=PREC) * scale
        tl.store(o + tok * (HV * V) + i_hv * V + p_uv, b_o.to(o.dtype.element_ty), mask=m_tv)

        # decay to the chunk end, then add the chunk's keys/values
        row_f = tl.where(m_t, tl.math.exp2(c_last - c), 0.0)
        b_vd = (b_vn * row_f[:, None]).to(k.dtype.element_ty)
        d_last = tl.math.exp2(c_last)
        b_h1 = _add_kv(kb, rows, m_t, o_k1, b_vd, b_h1 * d_last, K, H * K, PREC)
        if K > PIECE:
            b_h2 = _add_kv(kb, rows, m_t, o_k2, b_vd, b_h2 * d_last, K, H * K, PREC)
        if K > 2 * PIECE:
            b_h3 = _add_kv(kb, rows, m_t, o_k3, b_vd, b_h3 * d_last, K, H * K, PREC)
        if K > 3 * PIECE:
            b_h4 = _add_kv(kb, rows, m_t, o_k4, b_vd, b_h4 * d_last, K, H * K, PREC)

    if STORE_HT:
        _store_pieces(ht + i_nh.to(tl.int64) * K * V, b_h1, b_h2, b_h3, b_h4, o_v, K, V, PIECE)

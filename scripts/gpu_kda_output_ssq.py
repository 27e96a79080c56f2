#!/usr/bin/env python
"""KDA fused_q output kernel: q's sums of squares from the q q^T diagonal (the kernel's way) or
from the gated-q pass's own fp32 tile (issue #4).

    python scripts/gpu_kda_output_ssq.py                       # H200: h96_fixed, h64_fixed
    TRITON_INTERPRET=1 python scripts/gpu_kda_output_ssq.py --tiny   # CPU smoke test
    python scripts/gpu_kda_output_ssq.py --offline             # registers / stack for sm_90, no GPU

Under KDA the output kernel already converts each q tile to fp32 to gate it (q * exp2(g)), so the
squares can be summed there: an fp32 [BT, BK] accumulator, one row sum after the K loop, no extra
tensor-core product.  On GDN a tl.sum of the loaded q tile cost more than the q q^T dot and gave
wrong sums once the loop was software-pipelined (logs/20261130_output_variants.log); GDN's q goes
straight into a dot, KDA's does not, so this measures whether KDA differs.

For each shape and config: the output stage alone (CUDA-graph replay, median us) for
  plain  - the explicit route's kernel on normalized q (and Aqk from normalized q),
  qq     - gdnbench's fused_q kernel (q q^T diagonal),
  sum    - the kernel below, squares into an fp32 [BT, BK] tile, one row sum after the loop,
  rowsum - the same with a row sum per K tile into [BT] (fewer registers),
  qq_copy, qq_pre, plain_pre - this script's copy of the q q^T and the plain kernels, the last two with
           v_new and Aqk loaded before the K loop (PRELOAD),
and the fused outputs' rel-RMS error against plain's.  The gap fused - plain is what the fold
costs; the KDA routes' q pass is what it saves.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gdnbench.kernels import ops  # noqa: E402
from gdnbench.kernels.common import chunk_coords, row_rstd  # noqa: E402
from gdnbench.kernels.config import KernelConfig, default_config  # noqa: E402

CPU = os.environ.get("TRITON_INTERPRET") == "1"
T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


@triton.jit(do_not_specialize=["T", "NT"])
def kda_output_sum_kernel(q, v_new, h, g_cs, aqk, o, cu_seqlens, chunk_indices, scale, T, NT,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr,
                          SSQ_MODE: tl.constexpr, PRELOAD: tl.constexpr, PREC: tl.constexpr):
    """gdnbench's output kernel, PER_CHANNEL and FUSE_Q, with q's squares summed from the gated pass:
    into an fp32 [BT, BK] tile reduced once after the loop (SSQ_MODE 0), or reduced per K tile into
    [BT] (1); or from the q q^T diagonal as gdnbench's kernel does (2); or not at all (3: q given
    normalized, the plain kernel).  PRELOAD: the after-loop operands (v_new, Aqk) are loaded before
    the K loop, so their latency overlaps it (registers permitting)."""
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    tok0, n_valid, i_g = chunk_coords(i_c, i_b, T, NT, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    rows = tl.arange(0, BT)
    m_t = rows < n_valid
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    qb = q + tok0 * (H * K) + i_h * K
    gb = g_cs + tok0 * (HV * K) + i_hv * K
    hb = h + (i_g * HV + i_hv) * K * V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_sq = tl.zeros([BT, BK], dtype=tl.float32)
    ssq = tl.zeros([BT], dtype=tl.float32)
    b_qq = tl.zeros([BT, BT], dtype=tl.float32)
    m_tv = m_t[:, None] & m_v[None, :]
    p_tv = rows[:, None] * (HV * V) + o_v[None, :]
    if PRELOAD:
        b_vn = tl.load(v_new + tok0 * (HV * V) + i_hv * V + p_tv, mask=m_tv, other=0.0)
        b_A = tl.load(aqk + tok0 * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                      mask=m_t[:, None], other=0.0)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_q = tl.load(qb + rows[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
        b_g = tl.load(gb + rows[:, None] * (HV * K) + o_k[None, :], mask=m_tk, other=0.0)
        b_qf = b_q.to(tl.float32)
        if SSQ_MODE == 1:
            ssq += tl.sum(b_qf * b_qf, 1)
        elif SSQ_MODE == 0:
            b_sq += b_qf * b_qf
        elif SSQ_MODE == 2:
            b_qq = tl.dot(b_q, tl.trans(b_q), b_qq, input_precision=PREC)
        b_qg = (b_qf * tl.math.exp2(b_g)).to(b_q.dtype)
        b_h = tl.load(hb + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o = tl.dot(b_qg, b_h, b_o, input_precision=PREC)
    if not PRELOAD:
        b_vn = tl.load(v_new + tok0 * (HV * V) + i_hv * V + p_tv, mask=m_tv, other=0.0)
        b_A = tl.load(aqk + tok0 * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                      mask=m_t[:, None], other=0.0)
    b_o = tl.dot(b_A, b_vn.to(b_A.dtype), b_o, input_precision=PREC)
    if SSQ_MODE == 0:
        ssq = tl.sum(b_sq, 1)
    elif SSQ_MODE == 2:
        ssq = tl.sum(tl.where(rows[:, None] == rows[None, :], b_qq, 0.0), 1)
    if SSQ_MODE == 3:
        b_o = b_o * scale
    else:
        b_o = b_o * (row_rstd(qb, rows, m_t, ssq, K, H * K, BK) * scale)[:, None]
    tl.store(o + tok0 * (HV * V) + i_hv * V + p_tv, b_o.to(o.dtype.element_ty), mask=m_tv)


def sum_output(q, v_new, h, g_cs, aqk, scale, cfg, varlen, mode=0, preload=False):
    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    n_grid, NT = ops._chunk_grid(B, T, varlen)
    o = torch.empty_like(v_new)
    BV = min(cfg.BV, triton.next_power_of_2(V))
    ops._launch(kda_output_sum_kernel, (triton.cdiv(V, BV), n_grid, B * HV), cfg,
                q, v_new, h, g_cs, aqk, o, *ops._varlen_args(varlen), float(scale), T, NT,
                H=H, HV=HV, K=K, V=V, BK=min(cfg.BK, triton.next_power_of_2(K)), BV=BV, BT=64,
                IS_VARLEN=varlen is not None, SSQ_MODE=mode, PRELOAD=preload, PREC=ops._precision(q.dtype))
    return o


def rel_rms(x, ref):
    x, ref = x.float(), ref.float()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def bench(fn):
    if CPU:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_gdn_check import bench_graph
    return bench_graph(fn) * 1e3


def stage_inputs(T, H, K, V, dtype, dev):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, H, d, generator=gen).to(dev, dtype) for d in (K, K, V))
    g = (-5.0 * torch.sigmoid(torch.randn(1, T, H, K, generator=gen))).to(dev)
    beta = torch.sigmoid(torch.randn(1, T, H, generator=gen)).to(dev, dtype)
    cfg = default_config(K, V, q.element_size(), "kda")
    qn, kn = ops.l2norm(q), ops.l2norm(k)
    g_cs, A, aqk_n, _ = ops.kda_intra(qn, kn, g, beta, config=cfg)
    _, _, aqk_raw, _ = ops.kda_intra(q, kn, g, beta, raw_q=True, config=cfg)
    w, u, kg = ops.recompute_wu(kn, v, beta, A, g_cs, config=cfg)
    h, v_new, _ = ops.state_recurrence(kg, w, u, g_cs, config=cfg)
    return q, qn, v_new, h, g_cs, aqk_n, aqk_raw, cfg


VARIANTS = ("plain", "qq", "sum", "rowsum", "qq_copy", "qq_pre", "plain_pre")


def calls(q, qn, v_new, h, g_cs, aqk_n, aqk_raw, base, c, scale):
    """{variant: zero-argument call} for one output config ``c``."""
    cfg = base.__class__(**{**base.__dict__, "output": c, "output_fused": c})
    return {
        "plain": lambda: ops.chunk_output(qn, None, v_new, h, g_cs, scale=scale, config=cfg, aqk=aqk_n),
        "qq": lambda: ops.chunk_output(q, None, v_new, h, g_cs, scale=scale, fuse_q=True, config=cfg, aqk=aqk_raw),
        "sum": lambda: sum_output(q, v_new, h, g_cs, aqk_raw, scale, c, None),
        "rowsum": lambda: sum_output(q, v_new, h, g_cs, aqk_raw, scale, c, None, mode=1),
        "qq_copy": lambda: sum_output(q, v_new, h, g_cs, aqk_raw, scale, c, None, mode=2),
        "qq_pre": lambda: sum_output(q, v_new, h, g_cs, aqk_raw, scale, c, None, mode=2, preload=True),
        "plain_pre": lambda: sum_output(qn, v_new, h, g_cs, aqk_n, scale, c, None, mode=3, preload=True),
    }


def offline(configs, H=96, T=256, K=128, V=128):
    """Registers and stack of each variant x config for sm_90 (no GPU: launches intercepted and compiled
    with scripts/offline_compile.py's compile_launch)."""
    from offline_compile import compile_launch, record_launches

    launches = []
    real_launch = record_launches(launches)
    try:
        bf = torch.bfloat16
        q, v_new = torch.zeros(1, T, H, K, dtype=bf), torch.zeros(1, T, H, V, dtype=bf)
        h = torch.zeros(T // 64, H, K, V, dtype=bf)
        g_cs, aqk = torch.zeros(1, T, H, K), torch.zeros(1, T, H, 64, dtype=bf)
        base = default_config(K, V, 2, "kda")
        print(f"triton {triton.__version__}, sm_90, H={H} K={K} V={V} bf16")
        for c in configs:
            for variant, fn in calls(q, q, v_new, h, g_cs, aqk, aqk, base, c, K ** -0.5).items():
                launches.clear()
                fn()
                kernel, a, kw, opts = launches[0]
                try:
                    res = compile_launch(kernel, a, kw, opts)
                except Exception as e:  # report and go on
                    res = f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                print(f"  {variant:7s} BK={c.BK} w={c.num_warps} s={c.num_stages} r={c.maxnreg}: {res}", flush=True)
    finally:
        ops._launch = real_launch


def main():
    global VARIANTS
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="small fp32 shape (CPU interpreter smoke test)")
    ap.add_argument("--offline", action="store_true", help="registers and stack per variant and config (no GPU)")
    ap.add_argument("--variants", help=f"comma-separated subset of {','.join(VARIANTS)} (plain always runs)")
    args = ap.parse_args()
    if args.variants:
        VARIANTS = ("plain",) + tuple(v for v in args.variants.split(",") if v in VARIANTS and v != "plain")
    configs = [KernelConfig(BK=bk, BV=128, num_warps=w, num_stages=s, maxnreg=r)
               for bk, w, s, r in ((32, 4, 3, 168), (32, 4, 3, None), (32, 4, 3, 200), (64, 4, 3, 168),
                                   (64, 4, 2, None), (128, 4, 2, None), (64, 8, 2, None))]
    if args.offline:
        offline(configs)
        return
    dev = "cpu" if CPU else "cuda"
    if args.tiny:
        shapes = [("tiny", 100, 2, 32, 32, torch.float32)]
        configs = [KernelConfig(BK=16, BV=32, num_warps=4, num_stages=1)]
    else:
        shapes = [("h96_fixed", 8192, 96, 128, 128, torch.bfloat16), ("h64_fixed", 8192, 64, 128, 128, torch.bfloat16)]
    rows = []
    for name, T, H, K, V, dtype in shapes:
        log(f"{name}: stage inputs")
        q, qn, v_new, h, g_cs, aqk_n, aqk_raw, base = stage_inputs(T, H, K, V, dtype, dev)
        for c in configs:
            res = {}
            for variant, fn in calls(q, qn, v_new, h, g_cs, aqk_n, aqk_raw, base, c, K ** -0.5).items():
                if variant not in VARIANTS:
                    continue
                try:
                    out = fn()
                    res[variant] = (bench(fn), out)
                except Exception as e:  # a config that fails to compile or run: report, go on
                    res[variant] = (float("nan"), None)
                    log(f"  {variant} {c}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            ref = res["plain"][1]
            err = {v: (rel_rms(res[v][1], ref) if res[v][1] is not None and ref is not None else float("nan"))
                   for v in VARIANTS[1:]}
            rows.append((name, c, {v: res[v][0] for v in VARIANTS}, err))
            log(f"  {name} BK={c.BK} w={c.num_warps} s={c.num_stages} r={c.maxnreg}: "
                + " ".join(f"{v} {res[v][0]:.1f}" for v in VARIANTS) + " us; err "
                + " ".join(f"{v} {err[v]:.1e}" for v in VARIANTS[1:]))
    print()
    print(f"{'shape':10s} {'config':26s} " + " ".join(f"{v:>8s}" for v in VARIANTS)
          + " " + " ".join(f"{'err ' + v:>10s}" for v in VARIANTS[1:]))
    for name, c, t, err in rows:
        cs = f"BK={c.BK} w={c.num_warps} s={c.num_stages} r={c.maxnreg}"
        print(f"{name:10s} {cs:26s} " + " ".join(f"{t[v]:8.1f}" for v in VARIANTS)
              + " " + " ".join(f"{err[v]:10.1e}" for v in VARIANTS[1:]))
    for name in dict.fromkeys(r[0] for r in rows):
        best = {v: min((r[2][v] for r in rows if r[0] == name and r[2][v] == r[2][v]), default=float("nan"))
                for v in VARIANTS}
        print(f"{name}: best " + ", ".join(f"{v} {best[v]:.1f}" + ("" if v == "plain" else
                                                                   f" (+{best[v] - best['plain']:.1f})")
                                           for v in VARIANTS) + " us")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""KDA fused_q output kernel: q's sums of squares from the q q^T diagonal (the kernel's way) or
from the gated-q pass's own fp32 tile (issue #4).

    python scripts/gpu_kda_output_ssq.py                       # H200: h96_fixed, h64_fixed
    TRITON_INTERPRET=1 python scripts/gpu_kda_output_ssq.py --tiny   # CPU smoke test

Under KDA the output kernel already converts each q tile to fp32 to gate it (q * exp2(g)), so the
squares can be summed there: an fp32 [BT, BK] accumulator, one row sum after the K loop, no extra
tensor-core product.  On GDN a tl.sum of the loaded q tile cost more than the q q^T dot and gave
wrong sums once the loop was software-pipelined (logs/20261130_output_variants.log); GDN's q goes
straight into a dot, KDA's does not, so this measures whether KDA differs.

For each shape and config: the output stage alone (CUDA-graph replay, median us) for
  plain  - the explicit route's kernel on normalized q (and Aqk from normalized q),
  qq     - gdnbench's fused_q kernel (q q^T diagonal),
  sum    - the variant below,
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

from gdnbench import ops  # noqa: E402
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
                          PREC: tl.constexpr):
    """gdnbench's output kernel, PER_CHANNEL and FUSE_Q, with q's squares summed from the gated pass."""
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
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_q = tl.load(qb + rows[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
        b_g = tl.load(gb + rows[:, None] * (HV * K) + o_k[None, :], mask=m_tk, other=0.0)
        b_qf = b_q.to(tl.float32)
        b_sq += b_qf * b_qf
        b_qg = (b_qf * tl.math.exp2(b_g)).to(b_q.dtype)
        b_h = tl.load(hb + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o = tl.dot(b_qg, b_h, b_o, input_precision=PREC)
    m_tv = m_t[:, None] & m_v[None, :]
    p_tv = rows[:, None] * (HV * V) + o_v[None, :]
    b_vn = tl.load(v_new + tok0 * (HV * V) + i_hv * V + p_tv, mask=m_tv, other=0.0)
    b_A = tl.load(aqk + tok0 * (HV * BT) + i_hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                  mask=m_t[:, None], other=0.0)
    b_o = tl.dot(b_A, b_vn.to(b_A.dtype), b_o, input_precision=PREC)
    r_q = row_rstd(qb, rows, m_t, tl.sum(b_sq, 1), K, H * K, BK)
    b_o = b_o * (r_q * scale)[:, None]
    tl.store(o + tok0 * (HV * V) + i_hv * V + p_tv, b_o.to(o.dtype.element_ty), mask=m_tv)


def sum_output(q, v_new, h, g_cs, aqk, scale, cfg, varlen):
    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    n_grid, NT = ops._chunk_grid(B, T, varlen)
    o = torch.empty_like(v_new)
    BV = min(cfg.BV, triton.next_power_of_2(V))
    ops._launch(kda_output_sum_kernel, (triton.cdiv(V, BV), n_grid, B * HV), cfg,
                q, v_new, h, g_cs, aqk, o, *ops._varlen_args(varlen), float(scale), T, NT,
                H=H, HV=HV, K=K, V=V, BK=min(cfg.BK, triton.next_power_of_2(K)), BV=BV, BT=64,
                IS_VARLEN=varlen is not None, PREC=ops._precision(q.dtype))
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="small fp32 shape (CPU interpreter smoke test)")
    args = ap.parse_args()
    dev = "cpu" if CPU else "cuda"
    if args.tiny:
        shapes = [("tiny", 100, 2, 32, 32, torch.float32)]
        configs = [KernelConfig(BK=16, BV=32, num_warps=4, num_stages=1)]
    else:
        shapes = [("h96_fixed", 8192, 96, 128, 128, torch.bfloat16), ("h64_fixed", 8192, 64, 128, 128, torch.bfloat16)]
        configs = [KernelConfig(BK=bk, BV=128, num_warps=4, num_stages=s, maxnreg=r)
                   for bk, s in ((32, 3), (64, 2), (64, 3), (128, 2)) for r in (None, 168)]
    rows = []
    for name, T, H, K, V, dtype in shapes:
        log(f"{name}: stage inputs")
        q, qn, v_new, h, g_cs, aqk_n, aqk_raw, base = stage_inputs(T, H, K, V, dtype, dev)
        scale = K ** -0.5
        for c in configs:
            cfg = base.__class__(**{**base.__dict__, "output": c, "output_fused": c})
            res = {}
            for variant, fn in (
                ("plain", lambda: ops.chunk_output(qn, None, v_new, h, g_cs, scale=scale, config=cfg, aqk=aqk_n)),
                ("qq", lambda: ops.chunk_output(q, None, v_new, h, g_cs, scale=scale, fuse_q=True, config=cfg,
                                                aqk=aqk_raw)),
                ("sum", lambda: sum_output(q, v_new, h, g_cs, aqk_raw, scale, c, None)),
            ):
                try:
                    out = fn()
                    res[variant] = (bench(fn), out)
                except Exception as e:  # a config that fails to compile or run: report, go on
                    res[variant] = (float("nan"), None)
                    log(f"  {variant} {c}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            ref = res["plain"][1]
            err = {v: (rel_rms(res[v][1], ref) if res[v][1] is not None and ref is not None else float("nan"))
                   for v in ("qq", "sum")}
            rows.append((name, c, res["plain"][0], res["qq"][0], res["sum"][0], err["qq"], err["sum"]))
            log(f"  {name} BK={c.BK} s={c.num_stages} r={c.maxnreg}: plain {res['plain'][0]:.1f} qq {res['qq'][0]:.1f} "
                f"sum {res['sum'][0]:.1f} us; err qq {err['qq']:.1e} sum {err['sum']:.1e}")
    print()
    print(f"{'shape':10s} {'config':22s} {'plain':>8s} {'qq':>8s} {'sum':>8s} {'qq-plain':>9s} {'sum-plain':>9s}"
          f" {'err qq':>8s} {'err sum':>8s}")
    for name, c, tp, tq, ts, eq, es in rows:
        cs = f"BK={c.BK} s={c.num_stages} r={c.maxnreg}"
        print(f"{name:10s} {cs:22s} {tp:8.1f} {tq:8.1f} {ts:8.1f} {tq - tp:9.1f} {ts - tp:9.1f} {eq:8.1e} {es:8.1e}")
    for name in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == name]
        best = {v: min((r[i] for r in mine if r[i] == r[i]), default=float("nan")) for v, i in
                (("plain", 2), ("qq", 3), ("sum", 4))}
        print(f"{name}: best plain {best['plain']:.1f}, qq {best['qq']:.1f} (+{best['qq'] - best['plain']:.1f}), "
              f"sum {best['sum']:.1f} (+{best['sum'] - best['plain']:.1f}) us")


if __name__ == "__main__":
    main()

"""Locate (a) the illegal memory access of KDA at K=32/V=16 fp32 and (b) the NaN of KDA fp32 fused_qk with k rows x1e25.
usage: kda_diag.py iam FAMILY NORM HUGE | nan"""
import os, sys
sys.path.insert(0, "tests"); sys.path.insert(0, os.environ.get("GDN_ROOT", "."))
import torch
from gdnbench import ops
import test_ops_kda as t
import test_ops_gdn as tg

def finite(name, x):
    if x is None:
        return
    bad = (~torch.isfinite(x)).nonzero()
    print(f"   {name:8s} {tuple(x.shape)} nonfinite {bad.shape[0]}" + (f" first {bad[0].tolist()}" if bad.shape[0] else ""), flush=True)

if sys.argv[1] == "iam":
    fam, norm, huge = sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    mod = t if fam == "kda" else tg
    K, V = int(os.environ.get("KK", 32)), int(os.environ.get("VV", 16))
    dt = getattr(torch, os.environ.get("DT", "float32"))
    q, k, v, g, beta, _ = mod.make_inputs(1, 100, 1, 1, K, V, dt, seed=9)
    if huge:
        q[0, [2, 66]] *= 1e30; k[0, [7, 40]] *= 1e30
        if fam == "kda":
            g[0, 64:80] = -5.0
        k[0, 79] *= 1e7
    op = ops.chunk_kda if fam == "kda" else ops.chunk_gdn
    import dataclasses
    cfg = ops.default_config(K, V, q.element_size(), fam)
    if os.environ.get("WU_WARPS"):
        cfg = dataclasses.replace(cfg, wu=dataclasses.replace(cfg.wu, num_warps=int(os.environ["WU_WARPS"])))
    if os.environ.get("WU_STAGES"):
        cfg = dataclasses.replace(cfg, wu=dataclasses.replace(cfg.wu, num_stages=int(os.environ["WU_STAGES"])))
    o, fs = op(*(x.cuda() for x in (q, k, v, g, beta)), norm=norm, output_final_state=True, config=cfg)
    torch.cuda.synchronize()
    print(f"{fam} K32 V16 huge={huge} {norm}: ok, finite {bool(torch.isfinite(o).all())}", flush=True)
else:
    q, k, v, g, beta, _ = t.make_inputs(1, 200, 2, 4, 128, 128, torch.float32, seed=3)
    k[0, [2, 66, 130]] *= 1e25
    q, k, v, g, beta = (x.cuda() for x in (q, k, v, g, beta))
    cfg = ops.default_config(128, 128, 4, "kda")
    g_cs, A, aqk, rk = ops.kda_intra(q, k, g, beta, fuse_k=True, raw_q=True, config=cfg)
    for n, x in (("g_cs", g_cs), ("A", A), ("Aqk", aqk), ("rstd_k", rk)):
        finite(n, x)
    print("   rstd_k at rows 2,66,130:", rk[0, [2, 66, 130]].tolist())
    w, u, kg = ops.recompute_wu(k, v, beta, A, g_cs, rstd_k=rk, config=cfg)
    for n, x in (("w", w), ("u", u), ("kg", kg)):
        finite(n, x)
    h, vn, ht = ops.state_recurrence(kg, w, u, g_cs, output_final_state=True, config=cfg)
    for n, x in (("h", h), ("v_new", vn)):
        finite(n, x)
    nanA = (~torch.isfinite(A[0])).nonzero()
    print("   A nonfinite rows/heads:", sorted(set((r, hh) for r, hh, _ in nanA.tolist()))[:12])

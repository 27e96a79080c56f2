"""KDA at small heads on the GPU: each stage's output in DT storage against the same stage run in fp32
storage on the same (rounded) inputs, so the first stage that goes wrong stands out.
env: DT, KK, VV, NORM, SET (as mc_case.py)."""
import dataclasses, os, sys
sys.path.insert(0, "tests")
import torch
from gdnbench import ops
import test_ops_kda as tk

DEV = "cuda" if torch.cuda.is_available() else "cpu"
K, V = int(os.environ.get("KK", 32)), int(os.environ.get("VV", 16))
dt = getattr(torch, os.environ.get("DT", "bfloat16"))
norm = os.environ.get("NORM", "fused_qk")
q, k, v, g, beta, _ = tk.make_inputs(1, 100, 1, 1, K, V, dt, seed=9)
q, k, v, g, beta = (x.to(DEV) for x in (q, k, v, g, beta))

def cfg_for(esize):
    cfg = ops.default_config(K, V, esize, "kda")
    for spec in filter(None, os.environ.get("SET", "").split(";")):
        name, fields = spec.split("=", 1)
        kw = {f: None if x == "None" else int(x) for f, x in (it.split(":") for it in fields.split(","))}
        cfg = dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **kw)})
    return cfg

def stages(q, k, v, cfg):
    fuse_k, fuse_q = norm == "fused_qk", norm in ("fused_q", "fused_qk")
    if norm in ("flag", "fused_q"):
        k = ops.l2norm(k)
    if norm == "flag":
        q = ops.l2norm(q)
    g_cs, A, aqk, rk = ops.kda_intra(q, k, g, beta, fuse_k=fuse_k, raw_q=fuse_q, config=cfg)
    w, u, kg = ops.recompute_wu(k, v, beta, A, g_cs, rstd_k=rk, config=cfg)
    h, vn, ht = ops.state_recurrence(kg, w, u, g_cs, output_final_state=True, config=cfg)
    o = ops.chunk_output(q, None, vn, h, g_cs, scale=K ** -0.5, fuse_q=fuse_q, config=cfg, aqk=aqk)
    return dict(g_cs=g_cs, A=A, aqk=aqk, rstd_k=rk, w=w, u=u, kg=kg, h=h, v_new=vn, ht=ht, o=o)

lo = stages(q, k, v, cfg_for(q.element_size()))
hi = stages(q.float(), k.float(), v.float(), cfg_for(4))
torch.cuda.synchronize() if DEV == "cuda" else None
ref = tk.reference(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), normalize=True)[0]
print(f"STAGES kda {norm} {os.environ.get('DT', 'bfloat16')} K{K} V{V} {os.environ.get('SET', '')}: " + " ".join(
    f"{n} {tk.rel_rms(lo[n].float().cpu(), hi[n].float().cpu()):.1e}" for n in lo if lo[n] is not None)
      + f" | o vs fp64 {tk.rel_rms(lo['o'].float().cpu(), ref):.1e}, fp32 o vs fp64 {tk.rel_rms(hi['o'].cpu(), ref):.1e}", flush=True)

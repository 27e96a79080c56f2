"""Session 14: aqk per q head (grid chunks x B*H, q k^T and q's rstd once, then each of the HV/H value
heads' gate: .devrun/s14/var/_aqk_g.py) against the committed aqk (grid chunks x B*HV); plain and FUSE_Q,
at the committed tuned config of each and at a few others; outputs compared; CUDA graphs, rounds alternated.
With --cpu: correctness only, under the interpreter, fp32."""
import dataclasses, importlib, math, shutil, statistics, sys, os
cpu = "--cpu" in sys.argv
if cpu:
    os.environ["TRITON_INTERPRET"] = "1"
import torch
shutil.copy(".devrun/s14/var/_aqk_g.py", "gdnbench/kernels/")
from gdnbench import ops, timing as TM
from gdnbench.kernels.config import KernelConfig
mod = importlib.import_module("gdnbench.kernels._aqk_g")


def grouped(q, k, g_cs, fuse_q, fuse_k, varlen, cfg):
    B, T, H, K = q.shape
    HV = g_cs.shape[2]
    n_grid, NT = ops._chunk_grid(B, T, varlen)
    dtype = torch.float32 if fuse_k and q.dtype == torch.float16 else q.dtype
    aqk = torch.empty(B, T, HV, 64, device=q.device, dtype=dtype)
    c_q = torch.empty(B, T, HV, 2, device=q.device, dtype=torch.float32) if fuse_q else None
    ops._launch(mod.aqk_kernel, (n_grid, B * H), cfg, q, k, g_cs, aqk, c_q, *ops._varlen_args(varlen), T, NT,
                H=H, HV=HV, K=K, BK=ops.block(cfg.BK, K), BT=64, IS_VARLEN=varlen is not None, FUSE_Q=fuse_q,
                PREC=ops._precision(q.dtype))
    return aqk, c_q


def committed(q, k, g_cs, fuse_q, fuse_k, varlen, cfg):
    return ops.chunk_aqk(q, k, g_cs, fuse_q=fuse_q, fuse_k=fuse_k, varlen=varlen,
                         config=dataclasses.replace(ops.DEFAULT_CONFIG, aqk=cfg))


def check(dev, dtype, T, H, HV, K, lens=None):
    torch.manual_seed(0)
    q = torch.randn(1, T, H, K, device=dev, dtype=dtype) * 3
    k = ops.l2norm(torch.randn(1, T, H, K, device=dev, dtype=dtype))
    g = -torch.rand(1, T, HV, device=dev) * 0.5
    beta = torch.rand(1, T, HV, device=dev, dtype=dtype)
    info = ops.prepare_varlen(torch.tensor(lens, device=dev), 64) if lens else None
    g_cs = ops.gram_solve(k, g, beta, varlen=info)[0]
    cfg = KernelConfig(BK=32, num_warps=4, num_stages=2)
    worst = 0.0
    for fq in (False, True):
        a0, c0 = committed(q, k, g_cs, fq, False, info, cfg)
        a1, c1 = grouped(q, k, g_cs, fq, False, info, cfg)
        worst = max(worst, (a0.float() - a1.float()).abs().max().item())
        if fq:
            worst = max(worst, (c0 - c1).abs().max().item())
    return worst


if cpu:
    for args in ((torch.float32, 150, 2, 6, 32, None), (torch.float16, 200, 1, 3, 48, [0, 37, 100, 200])):
        print("interpreter", args[0], args[1:], "max |committed - grouped|", check("cpu", *args))
    sys.exit()
from gdnbench import shapes as S
from gdnbench.inputs import make_inputs
from gdnbench.backends.gdnbench import GdnbenchBackend
print("cuda bf16 max |committed - grouped|", check("cuda", torch.bfloat16, 1000, 4, 16, 128, [0, 300, 1000]))
ss = {s.id: s for s in S.load("gdn-qwen6").shapes}
be = GdnbenchBackend()
extra = [KernelConfig(BK=64, num_warps=4, num_stages=2), KernelConfig(BK=32, num_warps=4, num_stages=3, maxnreg=128)]
for sid in sys.argv[1:]:
    sh = ss[sid]
    x = make_inputs(sh).to("cuda")
    info = ops.prepare_varlen(x.cu_seqlens, 64) if x.cu_seqlens is not None else None
    k = ops.l2norm(x.k); qn = ops.l2norm(x.q)
    g_cs = ops.gram_solve(k, x.g, x.beta, varlen=info)[0]
    for route, q, fq in (("flag", qn, False), ("fused_q", x.q, True)):
        tcfg = be._config(sh, route, "cuda")[0].aqk
        calls = {"committed@tuned": lambda c=tcfg: committed(q, k, g_cs, fq, False, info, c),
                 "grouped@tuned": lambda c=tcfg: grouped(q, k, g_cs, fq, False, info, c)}
        for i, c in enumerate(extra):
            calls[f"grouped@{c.BK}/{c.num_warps}/{c.num_stages}/{c.maxnreg}"] = lambda c=c: grouped(q, k, g_cs, fq, False, info, c)
        ref = calls["committed@tuned"]()
        graphs, diffs = {}, {}
        for n, c in list(calls.items()):
            try:
                out = c()
                diffs[n] = (out[0].float() - ref[0].float()).abs().max().item()
                graphs[n] = TM.capture_graph(c)
            except Exception as e:
                print(sid, route, n, "failed", type(e).__name__, str(e).splitlines()[0][:150])
        best = {n: math.inf for n in graphs}
        for rnd in range(4):
            for n in (list(graphs) if rnd % 2 == 0 else list(graphs)[::-1]):
                best[n] = min(best[n], statistics.median(TM.time_graph(graphs[n], 40)))
        b0 = best["committed@tuned"]
        for n in graphs:
            print(f"{sid:18s} {route:8s} {n:22s} {best[n]:7.1f} us  x{best[n] / b0:.3f}  maxdiff {diffs[n]:.1e}", flush=True)
        print(f"  tuned: {tcfg}")

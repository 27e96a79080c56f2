"""Session 14: state_out's FUSE_Q cost. Variants of kernels/state_out.py (.devrun/s14/var/_so_*.py copied
into gdnbench/kernels/): v0 as committed, v1 r_q loaded at the top of each chunk, v2 r_q prefetched a chunk
ahead, v5 no r_q load (a constant; timing only), v6 r_q on o's rows after the dot (timing only); against the
plain kernel (FUSE_Q off). Stage alone, CUDA graphs, the fused tuned config; rounds alternated."""
import dataclasses, importlib, math, shutil, statistics, sys, glob, os
import torch
for f in glob.glob(".devrun/s14/var/_so_*.py"):
    shutil.copy(f, "gdnbench/kernels/")
from gdnbench import ops, shapes as S, timing as TM
from gdnbench.inputs import make_inputs
from gdnbench.backends.gdnbench import GdnbenchBackend

VARS = ["v0", "v2", "v5", "v7", "v8", "v9"]
mods = {v: importlib.import_module(f"gdnbench.kernels._so_{v}") for v in VARS}
ss = {s.id: s for s in S.load("gdn-qwen6").shapes}
be = GdnbenchBackend()
for sid in sys.argv[1:]:
    sh = ss[sid]
    x = make_inputs(sh).to("cuda")
    info = ops.prepare_varlen(x.cu_seqlens, 64) if x.cu_seqlens is not None else None
    cfg_f, _ = be._config(sh, "fused_q", "cuda")
    cfg_p, _ = be._config(sh, "flag", "cuda")
    k = ops.l2norm(x.k)
    qn = ops.l2norm(x.q)
    g_cs, A, rk, ssq = ops.gram_solve(k, x.g, x.beta, varlen=info, config=cfg_f)
    w, u, _ = ops.recompute_wu(k, x.v, x.beta, A, g_cs, rstd_k=rk, varlen=info, config=cfg_f)
    a_f, rq = ops.chunk_aqk(x.q, k, g_cs, fuse_q=True, varlen=info, config=cfg_f)
    a_p, _ = ops.chunk_aqk(qn, k, g_cs, varlen=info, config=cfg_p)
    h0 = None if x.initial_state is None else x.initial_state.float().contiguous()
    kw = dict(scale=x.scale, initial_state=h0, output_final_state=True, varlen=info)
    calls = {}
    def mk(kernel, q, a, r, cfg):
        def call():
            ops.state_out_kernel = kernel
            return ops.state_output(q, k, w, u, g_cs, a, r, config=cfg, **kw)
        return call
    calls["plain"] = mk(mods["v0"].state_out_kernel, qn, a_p, None, cfg_p)
    calls["plain@fusedcfg"] = mk(mods["v0"].state_out_kernel, qn, a_p, None, cfg_f)
    c_o = g_cs + torch.log2(rq)
    r_arg = {"v7": torch.stack([g_cs, c_o], -1).contiguous(), "v9": rq[0].transpose(0, 1).contiguous()}
    for v in VARS:
        calls[v] = mk(mods[v].state_out_kernel, x.q, a_f, r_arg.get(v, rq), cfg_f)
    outs = {}
    for n, c in list(calls.items()):
        try:
            outs[n] = c()[0].float()
        except Exception as e:  # a variant that does not compile: say so, time the rest
            print(f"{sid} {n} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            del calls[n]
    ref = outs["v0"]
    graphs = {}
    for n, c in calls.items():
        c()
        g = TM.capture_graph(c)
        graphs[n] = (g, c)
    best = {n: math.inf for n in calls}
    names = list(calls)
    for rnd in range(4):
        for n in (names if rnd % 2 == 0 else names[::-1]):
            ops.state_out_kernel = None
            best[n] = min(best[n], statistics.median(TM.time_graph(graphs[n][0], 40)))
    for n in names:
        d = (outs[n] - ref).abs().max().item()
        print(f"{sid:18s} {n:15s} {best[n]:8.1f} us  x{best[n] / best['plain']:.3f} of plain  maxdiff vs v0 {d:.2e}",
              flush=True)
    print(f"  configs: fused {cfg_f.state_out}  plain {cfg_p.state_out}")
    del graphs, calls, outs
    torch.cuda.empty_cache()

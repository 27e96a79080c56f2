"""Session 14: aqk's FUSE_Q cost. a0 as committed; a1 without the overflow redo branch (timing only);
a2 = a1 with q's sums of squares by a second tiled read (tl.sum) instead of the q q^T dot; against plain.
Stage alone, CUDA graphs, the fused tuned config (and the plain one); rounds alternated."""
import importlib, math, shutil, statistics, sys, glob
import torch
for f in glob.glob(".devrun/s14/var/_aqk_*.py"):
    shutil.copy(f, "gdnbench/kernels/")
from gdnbench import ops, shapes as S, timing as TM
from gdnbench.inputs import make_inputs
from gdnbench.backends.gdnbench import GdnbenchBackend

VARS = ["a0", "a1", "a2"]
mods = {v: importlib.import_module(f"gdnbench.kernels._aqk_{v}") for v in VARS}
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
    g_cs = ops.gram_solve(k, x.g, x.beta, varlen=info, config=cfg_f)[0]
    def mk(kernel, q, fuse, cfg):
        def call():
            ops.aqk_kernel = kernel
            return ops.chunk_aqk(q, k, g_cs, fuse_q=fuse, varlen=info, config=cfg)
        return call
    calls = {"plain": mk(mods["a0"].aqk_kernel, qn, False, cfg_p),
             "plain@fusedcfg": mk(mods["a0"].aqk_kernel, qn, False, cfg_f)}
    for v in VARS:
        calls[v] = mk(mods[v].aqk_kernel, x.q, True, cfg_f)
        calls[v + "@plaincfg"] = mk(mods[v].aqk_kernel, x.q, True, cfg_p)
    outs = {}
    for n, c in list(calls.items()):
        try:
            outs[n] = c()
        except Exception as e:  # a variant that does not compile: say so, time the rest
            print(f"{sid} {n} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            del calls[n]
    graphs = {n: TM.capture_graph(c) for n, c in calls.items()}
    best = {n: math.inf for n in calls}
    names = list(calls)
    for rnd in range(4):
        for n in (names if rnd % 2 == 0 else names[::-1]):
            best[n] = min(best[n], statistics.median(TM.time_graph(graphs[n], 40)))
    ref_a, ref_r = outs["a0"]
    for n in names:
        a, r = outs[n]
        d = (a.float() - ref_a.float()).abs().max().item()
        dr = (r.float() - ref_r).abs().max().item() if r is not None else float("nan")
        print(f"{sid:18s} {n:15s} {best[n]:8.1f} us  x{best[n] / best['plain']:.3f} of plain  maxdiff Aqk {d:.2e} r_q {dr:.2e}",
              flush=True)
    print(f"  configs: fused {cfg_f.aqk}  plain {cfg_p.aqk}")
    del graphs, calls, outs
    torch.cuda.empty_cache()

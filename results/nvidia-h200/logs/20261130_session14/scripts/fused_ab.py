"""Session 14: GDN's fused routes, one pass (FUSE_Q aqk + state_out) against two kernels (state +
output_fused), on each gdn-qwen6 shape, beside explicit on the rule's path; tuned configs (cache),
CUDA graph replay, rounds alternated, best round median; outputs against explicit; kernel split."""
import dataclasses, math, statistics, sys
import torch
from gdnbench import shapes as S, timing as TM
from gdnbench.inputs import make_inputs
from gdnbench.backends.gdnbench import GdnbenchBackend


def gm(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


ids = sys.argv[1:] or [s.id for s in S.load("gdn-qwen6").shapes]
ss = {s.id: s for s in S.load("gdn-qwen6").shapes}
be = GdnbenchBackend()
VARIANTS = [("explicit", None), ("fused_q", False), ("fused_q", True), ("fused_qk", False), ("fused_qk", True)]
ratios = {v: [] for v in VARIANTS[1:]}
for sid in ids:
    sh = ss[sid]
    x = make_inputs(sh).to("cuda")
    calls, labels = {}, {}
    for route, one in VARIANTS:
        cfg, label = be._config(sh, route, "cuda")
        if one is not None:
            cfg = dataclasses.replace(cfg, one_pass=one)
            be._resolved[(sid, route)] = (cfg, label)
        calls[(route, one)] = be.prepare(sh, route, x)
        be._resolved.pop((sid, route), None)
        labels[(route, one)] = "one" if cfg.one_pass else "two"
    ref = calls[VARIANTS[0]]()[0].float()
    pool = TM.graph_pool()
    graphs, errs = {}, {}
    for v, call in calls.items():
        o = call()[0].float()
        errs[v] = ((o - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
        graphs[v] = TM.capture_graph(call, pool)
    best = {v: math.inf for v in calls}
    for rnd in range(4):
        order = list(calls) if rnd % 2 == 0 else list(reversed(list(calls)))
        for v in order:
            best[v] = min(best[v], statistics.median(TM.time_graph(graphs[v], 60)))
    for v in calls:
        split = TM.profiler_kernels(calls[v], 20)
        top = ", ".join(f"{k.replace('_kernel', '')} {t:.1f}" for k, t in split.items())
        r = best[v] / best[VARIANTS[0]]
        if v != VARIANTS[0]:
            ratios[v].append(r)
        print(f"{sid:18s} {v[0]:9s} {labels[v]:3s} {best[v]:8.1f} us  /explicit {r:.3f}  rel-rms vs explicit "
              f"{errs[v]:.2e}  | {top}", flush=True)
    del calls, graphs, x
    torch.cuda.empty_cache()
print("geomean over", len(ids), "shapes:")
for v, rs in ratios.items():
    print(f"  {v[0]:9s} {'one pass' if v[1] else 'two kernels'}: /explicit {gm(rs):.3f}  ({', '.join(f'{r:.3f}' for r in rs)})")

"""Host time and wall per call: old tree (gdnbench_old, HEAD) vs this tree, same tuned configs, alternated."""
import importlib, math, statistics, sys, time
sys.path.insert(0, ".devrun/old")
import torch
from gdnbench import shapes as S
from gdnbench.inputs import make_inputs

pk = {t: importlib.import_module(f"{p}.backends.gdnbench").GdnbenchBackend() for t, p in (("old", "gdnbench_old"), ("new", "gdnbench"))}

def host_and_wall(call, n=40):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    hs, ws = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter(); e0.record(); call(); e1.record(); t1 = time.perf_counter()
        e1.synchronize()
        hs.append((t1 - t0) * 1e6); ws.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(hs), statistics.median(ws)

ss = {s.id: s for s in S.load("gdn-qwen6").shapes}
rows = []
for sid in ("h2_hv8_serving", "h4_hv8_mixed", "h16_hv48_uniform", "h16_hv32_fixed8k"):
    sh = ss[sid]
    x = make_inputs(sh).to("cuda")
    for route in ("explicit", "fused_q", "fused_qk"):
        calls = {t: b.prepare(sh, route, x) for t, b in pk.items()}
        best = {t: [math.inf, math.inf] for t in calls}
        for _ in range(4):
            for t in ("old", "new"):
                h, w = host_and_wall(calls[t])
                best[t] = [min(best[t][0], h), min(best[t][1], w)]
        rows.append((sid, route, *best["old"], *best["new"]))
        print(f"{sid:18s} {route:9s} host old {best['old'][0]:6.1f} new {best['new'][0]:6.1f}  "
              f"wall old {best['old'][1]:6.1f} new {best['new'][1]:6.1f}", flush=True)
geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
print(f"geomean host new/old {geo([r[4] / r[2] for r in rows]):.3f}, wall new/old {geo([r[5] / r[3] for r in rows]):.3f} over {len(rows)}")
for route in ("fused_q", "fused_qk"):
    for i, t in ((3, "old"), (5, "new")):
        pairs = [(a[i], b[i]) for a in rows if a[1] == route for b in rows if b[1] == "explicit" and b[0] == a[0]]
        print(f"wall {route}/explicit {t}: {geo([p / q for p, q in pairs]):.3f} over {len(pairs)}")

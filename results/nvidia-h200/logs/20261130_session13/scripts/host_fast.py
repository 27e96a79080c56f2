"""Session 13: host time and wall per call, Triton's JIT launch path against gdnbench.kernels.launch's
direct launch of the cached compiled kernel (tuned configs, contract inputs), alternated in rounds;
outputs compared bitwise; then a cProfile of the direct path's forward."""
import cProfile, io, math, os, pstats, statistics, sys, time
import torch
from gdnbench import shapes as S
from gdnbench.inputs import make_inputs
from gdnbench.backends.gdnbench import GdnbenchBackend
from gdnbench.kernels import launch as L


def set_path(direct):
    os.environ["GDNBENCH_JIT_LAUNCH"] = "0" if direct else "1"
    L._direct_launch_api.cache_clear()


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


def gm(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


ss = {s.id: s for s in S.load("gdn-qwen6").shapes}
be = GdnbenchBackend()
ROUTES = ("explicit", "flag", "fused_q", "fused_qk")
res = {}
for sid in ("h2_hv8_serving", "h4_hv8_mixed", "h16_hv48_uniform", "h16_hv32_fixed8k"):
    sh = ss[sid]
    x = make_inputs(sh).to("cuda")
    for route in ROUTES:
        call = be.prepare(sh, route, x)
        outs = {}
        for direct in (False, True):
            set_path(direct)
            o, st = call(); o2, st2 = call()
            outs[direct] = (o.clone(), st.clone(), o2.clone())
        same = all(torch.equal(a, b) for a, b in zip(outs[False], outs[True]))
        best = {False: [math.inf, math.inf], True: [math.inf, math.inf]}
        for rnd in range(4):
            for direct in ((False, True) if rnd % 2 == 0 else (True, False)):
                set_path(direct)
                h, w = host_and_wall(call)
                best[direct] = [min(best[direct][0], h), min(best[direct][1], w)]
        res[(sid, route)] = best
        print(f"{sid:18s} {route:9s} host jit {best[False][0]:6.1f} direct {best[True][0]:6.1f}  "
              f"wall jit {best[False][1]:6.1f} direct {best[True][1]:6.1f}  bitwise-equal {same}", flush=True)
        del call
    del x
    torch.cuda.empty_cache()
keys = list(res)
print(f"geomean host direct/jit {gm([res[k][True][0] / res[k][False][0] for k in keys]):.3f}, "
      f"wall direct/jit {gm([res[k][True][1] / res[k][False][1] for k in keys]):.3f} over {len(keys)}")
for direct in (False, True):
    for r in ("fused_q", "fused_qk", "flag"):
        vals = [res[(s, r)][direct][1] / res[(s, "explicit")][direct][1] for s, rr in keys if rr == r]
        print(f"wall {r}/explicit {'direct' if direct else 'jit'}: {gm(vals):.3f} over {len(vals)}")
# where the direct path's host time goes
sh = ss["h2_hv8_serving"]; x = make_inputs(sh).to("cuda")
set_path(True)
for route in ("explicit", "fused_qk"):
    call = be.prepare(sh, route, x)
    for _ in range(5): call()
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(200): call()
    pr.disable(); torch.cuda.synchronize()
    buf = io.StringIO(); pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
    print(f"--- cProfile, 200 calls of {route} on h2_hv8_serving, direct path"); print(buf.getvalue()[-3500:])
print(torch.__version__, torch.cuda.get_device_name())

"""Host cost per call and per launch of our GDN routes (tuned configs), and fused_qk without fix-ups."""
import statistics, sys, time, collections
import torch
from gdnbench import ops, shapes as S
from gdnbench.inputs import make_inputs
from gdnbench.backends.gdnbench import GdnbenchBackend

ss = S.load("gdn-qwen6")
want = sys.argv[1].split(",") if len(sys.argv) > 1 else ["h2_hv8_serving", "h4_hv8_mixed", "h16_hv32_fixed8k"]
be = GdnbenchBackend()
orig_launch = ops._launch
per = collections.defaultdict(list)
SKIP_FIX = [False]

def timed_launch(kernel, grid, cfg, *a, hooks=True, **kw):
    if SKIP_FIX[0] and kw.get("FIXUP"):
        return
    t0 = time.perf_counter()
    orig_launch(kernel, grid, cfg, *a, hooks=hooks, **kw)
    per[(kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel)) + ("+fix" if kw.get("FIXUP") else "")].append(time.perf_counter() - t0)

def host_and_wall(call, n=60):
    for _ in range(5):
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

rows = []
for sh in ss.shapes:
    if sh.id not in want:
        continue
    x = make_inputs(sh, "cuda")
    for route in ("explicit", "fused_q", "fused_qk"):
        call = be.prepare(sh, route, x)
        for skip in ((False, True) if route == "fused_qk" else (False,)):
            SKIP_FIX[0] = skip
            ops._launch = orig_launch
            h, w = host_and_wall(call)
            per.clear(); ops._launch = timed_launch
            h2, _ = host_and_wall(call, 30)
            ops._launch = orig_launch
            launches = "; ".join(f"{k} {statistics.median(v)*1e6:.1f}" for k, v in per.items())
            tot_l = sum(statistics.median(v) * 1e6 for v in per.values())
            rows.append((sh.id, route + ("-nofix" if skip else ""), h, w, tot_l))
            print(f"{sh.id:18s} {route + ('-nofix' if skip else ''):15s} host {h:6.1f} wall {w:6.1f} | launches {tot_l:6.1f}: {launches}", flush=True)
    SKIP_FIX[0] = False

# Python-side pieces outside the launches
sh = [s for s in ss.shapes if s.id == want[0]][0]
x = make_inputs(sh, "cuda")
cfg, _ = be._config(sh, "fused_qk", "cuda")
def t(f, n=200):
    f(); ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6
from gdnbench.kernels.config import validate
print(f"validate {t(lambda: validate(cfg, 128, 128, 2, 'gdn')):.1f} us; empty {t(lambda: torch.empty(1000, device='cuda')):.1f} us")

"""Prototype: GDN gram+w/u in one kernel (ops.gram_wu) against gram_solve + recompute_wu (tuned configs)."""
import dataclasses, math, os, statistics, sys, time, multiprocessing as mp
sys.path.insert(0, "scripts")
import torch
from gdnbench import ops, shapes as S, tuned
from gdnbench.inputs import make_inputs
from gdnbench.check import rel_rms
from gdnbench.kernels.config import KernelConfig
from gpu_gdn_check import bench_graph

T0 = time.time()
CONFIGS = [KernelConfig(BK=bk, BV=bv, num_warps=w, num_stages=s, maxnreg=r) for bk, bv, w, s, r in [
    (64, 64, 1, 2, None), (64, 128, 1, 2, None), (32, 64, 1, 2, None), (64, 64, 1, 1, None), (64, 64, 1, 3, 168),
    (64, 64, 2, 2, None), (64, 128, 2, 2, None), (64, 128, 2, 1, None), (64, 64, 4, 2, None), (64, 128, 4, 2, None),
    (32, 32, 1, 2, None), (128, 64, 1, 2, None), (64, 32, 2, 2, None), (32, 64, 2, 2, None)]]

def compile_one(args):
    i, fuse_k, varlen = args
    torch.cuda.set_device(0)
    T = 256
    k = torch.randn(1, T, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, T, 4, 128, device="cuda", dtype=torch.bfloat16)
    g = -torch.rand(1, T, 4, device="cuda"); b = torch.rand(1, T, 4, device="cuda", dtype=torch.bfloat16)
    info = ops.prepare_varlen(torch.tensor([0, 100, T], device="cuda")) if varlen else None
    cfg = dataclasses.replace(ops.DEFAULT_CONFIG, gram=CONFIGS[i])
    ops.gram_wu(k, v, g, b, varlen=info, fuse_k=fuse_k, config=cfg)
    torch.cuda.synchronize()
    return i

if __name__ == "__main__":
    jobs = [(i, f, vl) for i in range(len(CONFIGS)) for f in (False, True) for vl in (False, True)]
    with mp.get_context("spawn").Pool(14) as pool:
        list(pool.imap_unordered(compile_one, jobs))
    print(f"compiled {len(jobs)} in {time.time() - T0:.0f} s", flush=True)
    env = tuned.device_env()
    sys.path.insert(0, ".devrun/old")
    import importlib
    old_tuned = importlib.import_module("gdnbench_old.tuned")
    from gpu_ab import convert
    order = ["h16_hv32_fixed8k", "h4_hv8_mixed", "h2_hv8_serving", "h16_hv48_uniform", "h16_hv64_fixed8k", "h16_hv32_fixed32k"]
    ss = {s.id: s for s in S.load("gdn-qwen6").shapes}
    summary = []
    for sid in order:
        sh = ss[sid]
        x = make_inputs(sh).to("cuda")
        info = ops.prepare_varlen(x.cu_seqlens) if x.cu_seqlens is not None else None
        for fuse_k, route in ((False, "flag"), (True, "fused_qk")):
            if time.time() - T0 > 520:
                break
            cfg, label = old_tuned.tuned_config(sh, route, env, cache_dir=tuned.TUNED_DIR)
            cfg = convert(cfg, {})
            k = x.k if fuse_k else ops.l2norm(x.k)
            def sep():
                g_cs, A, rk, ssq = ops.gram_solve(k, x.g, x.beta, varlen=info, fuse_k=fuse_k, config=cfg)
                return ops.recompute_wu(k, x.v, x.beta, A, g_cs, rstd_k=rk, varlen=info, config=cfg)
            w0, u0, _ = sep()
            t_sep = bench_graph(sep) * 1e3
            t_gram = bench_graph(lambda: ops.gram_solve(k, x.g, x.beta, varlen=info, fuse_k=fuse_k, config=cfg)) * 1e3
            res = []
            for c in [dataclasses.replace(cfg.gram, BV=64), dataclasses.replace(cfg.gram, BV=128)] + CONFIGS:
                cf = dataclasses.replace(cfg, gram=c)
                fn = lambda: ops.gram_wu(k, x.v, x.g, x.beta, varlen=info, fuse_k=fuse_k, config=cf)
                _, w1, u1, _, _ = fn()
                t = bench_graph(fn) * 1e3
                res.append((t, c, rel_rms(w1, w0), rel_rms(u1, u0)))
            res.sort(key=lambda r: r[0])
            t, c, dw, du = res[0]
            summary.append((sid, route, t_sep, t))
            print(f"{sid:18s} {'fuse_k' if fuse_k else 'plain':6s} sep {t_sep:7.1f} (gram {t_gram:6.1f}) fused best {t:7.1f} "
                  f"ratio {t / t_sep:.3f} [{c}] dw {dw:.1e} du {du:.1e}", flush=True)
            for t, c, dw, du in res[1:5]:
                print(f"      {t:7.1f} {c} dw {dw:.1e} du {du:.1e}")
        del x
        torch.cuda.empty_cache()
    for v in ("flag", "fused_qk"):
        r = [s[3] / s[2] for s in summary if s[1] == v]
        if r:
            print(f"geomean fused/sep {v}: {math.exp(sum(map(math.log, r)) / len(r)):.3f} over {len(r)}")

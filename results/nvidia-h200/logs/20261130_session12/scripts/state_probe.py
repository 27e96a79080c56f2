"""Session 12: where the state kernel's per-chunk step goes.  Leave-one-out variants of
gdnbench/kernels/state.py (text edits of the source, loaded as separate modules), CUDA-graph us
at the tuned state config, three gdn-qwen6 shapes.  NCU=1: run the base kernel twice on one shape
(for ncu to capture the second launch)."""
import importlib.util, math, os, sys, time
sys.path.insert(0, "scripts")
import torch
from gdnbench import ops, shapes as S, tuned
from gdnbench.inputs import make_inputs
from gdnbench.kernels.config import cdiv, block, CHUNK_SIZE, KernelConfig, next_pow2
from gdnbench.check import rel_rms
from gpu_gdn_check import bench_graph

SRC = open("gdnbench/kernels/state.py").read()
EDITS = {
    "base": [],
    "no_h_store": [("        _piece_store(ph, b_h1, o_k1, o_v, K, V)\n        if K > 64:\n            _piece_store(ph, b_h2, o_k2, o_v, K, V)\n",
                    "        pass\n")],
    "no_vn_store": [("        tl.store(vnb + p_uv, b_vn.to(v_new.dtype.element_ty), mask=m_tv)\n", "")],
    "no_wh_dot": [("        b_wh = _w_times_h(wb, rows, m_t, o_k1, b_h1, b_wh, K, HV * K, PREC)\n        if K > 64:\n            b_wh = _w_times_h(wb, rows, m_t, o_k2, b_h2, b_wh, K, HV * K, PREC)\n", "")],
    "no_kv_dot": [("        b_h1 = _add_kv(kb, rows, m_t, o_k1, b_vd, b_h1 * d1, K, H * K, PREC)\n        if K > 64:\n            b_h2 = _add_kv(kb, rows, m_t, o_k2, b_vd, b_h2 * d2, K, H * K, PREC)\n",
                   "        b_h1 = b_h1 * d1 + tl.sum(b_vd.to(tl.float32), 0)[None, :]\n        if K > 64:\n            b_h2 = b_h2 * d2\n")],
    # h entering the chunk stored after the k^T v update of the previous chunk is the same value;
    # here: store it at the end of the loop body (for the next chunk) instead of the top
    "h_store_last": [("        _piece_store(ph, b_h1, o_k1, o_v, K, V)\n        if K > 64:\n            _piece_store(ph, b_h2, o_k2, o_v, K, V)\n", "        pass\n"),
                     ("        if K > 128:\n            b_h3 = _add_kv(", "        ph2 = h + ((boh + i_t + 1) * HV + i_hv) * K * V\n        if i_t + 1 < n_chunks:\n            _piece_store(ph2, b_h1, o_k1, o_v, K, V)\n            if K > 64:\n                _piece_store(ph2, b_h2, o_k2, o_v, K, V)\n        if K > 128:\n            b_h3 = _add_kv(")],
}
SKIP = set(os.environ.get("SKIP", "").split(","))


def load_variant(name):
    src = SRC
    for a, b in EDITS[name]:
        assert src.count(a) == 1, (name, a[:60])
        src = src.replace(a, b)
    if name == "h_store_last":  # first chunk's h (h0 or zeros) stored before the loop
        a = "    rows = tl.arange(0, BT)\n    for i_t in range(n_chunks):\n"
        b = ("    ph0 = h + (boh * HV + i_hv) * K * V\n    _piece_store(ph0, b_h1, o_k1, o_v, K, V)\n"
             "    if K > 64:\n        _piece_store(ph0, b_h2, o_k2, o_v, K, V)\n" + a)
        assert src.count(a) == 1
        src = src.replace(a, b)
    path = f"/tmp/state_{name}.py"
    open(path, "w").write(src.replace("from .common", "from gdnbench.kernels.common"))
    spec = importlib.util.spec_from_file_location(f"state_{name}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.state_kernel


def run(kernel, k, w, u, g_cs, s0, info, cfg, T, **extra):
    B, _, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    N = info.num_seqs if info is not None else B
    n_chunks = info.num_chunks if info is not None else B * cdiv(T, CHUNK_SIZE)
    h = torch.empty(n_chunks, HV, K, V, device=k.device, dtype=k.dtype)
    v_new = torch.empty_like(u)
    ht = torch.empty(N, HV, K, V, device=k.device, dtype=torch.float32)
    BV = block(cfg.BV, V)
    ops._launch(kernel, (cdiv(V, BV), N * HV), cfg, k, w, u, g_cs, h, v_new, s0, ht,
                None if info is None else info.cu_seqlens, None if info is None else info.chunk_offsets, T,
                H=H, HV=HV, K=K, V=V, BV=BV, BT=CHUNK_SIZE, IS_VARLEN=info is not None, PER_CHANNEL=False,
                USE_H0=s0 is not None, STORE_HT=True, PREC=ops._precision(k.dtype), **extra)
    return h, v_new, ht


def stage_inputs(sh, env):
    x = make_inputs(sh).to("cuda")
    info = ops.prepare_varlen(x.cu_seqlens) if x.cu_seqlens is not None else None
    cfg, label = tuned.tuned_config(sh, "flag", env)
    k = ops.l2norm(x.k)
    g_cs, A, _, _ = ops.gram_solve(k, x.g, x.beta, varlen=info, config=cfg)
    w, u, _ = ops.recompute_wu(k, x.v, x.beta, A, g_cs, varlen=info, config=cfg)
    s0 = x.initial_state.float().contiguous() if x.initial_state is not None else None
    return k, w, u, g_cs, s0, info, cfg.state, x.k.shape[1]


def one_tile():
    sys.path.insert(0, ".devrun/s12")
    import state_one
    return state_one.state_kernel


ONE_CFGS = [KernelConfig(BV=bv, num_warps=nw, num_stages=ns, maxnreg=r) for bv, nw, ns, r in
            [(32, 4, 4, None), (32, 4, 3, None), (32, 4, 2, None), (64, 4, 2, None), (64, 4, 3, None), (64, 4, 4, 240),
             (64, 4, 3, 240), (16, 4, 4, None), (16, 4, 3, None), (32, 8, 3, None), (64, 8, 3, None)]]


if __name__ == "__main__":
    env = tuned.device_env()
    ss = {s.id: s for s in S.load("gdn-qwen6").shapes}
    if os.environ.get("NCU"):
        sh = ss[os.environ.get("SHAPE", "h16_hv32_fixed8k")]
        k, w, u, g_cs, s0, info, cfg, T = stage_inputs(sh, env)
        kern, extra = ops.state_kernel, {}
        if os.environ.get("NCU") == "one":
            kern, extra = one_tile(), {"KP": next_pow2(k.shape[-1])}
        print("state cfg", cfg, flush=True)
        for _ in range(2):
            run(kern, k, w, u, g_cs, s0, info, cfg, T, **extra)
        torch.cuda.synchronize()
        sys.exit(0)
    one = one_tile()
    summary = []
    import dataclasses
    for kv in filter(None, os.environ.get("SYNTH", "").split(";")):
        K_, V_ = map(int, kv.split(","))
        base_sh = ss["h16_hv32_fixed8k"]
        ss[f"k{K_}v{V_}_fixed8k"] = dataclasses.replace(base_sh, id=f"k{K_}v{V_}_fixed8k", K=K_, V=V_)
    BASE_CFGS = [KernelConfig(BV=bv, num_warps=nw, num_stages=ns, maxnreg=r) for bv, nw, ns, r in
                 [(32, 4, 4, None), (32, 4, 3, None), (64, 4, 3, None), (64, 4, 4, 240), (16, 4, 4, None), (32, 8, 3, None)]]
    for sid in os.environ.get("SHAPES", "h16_hv32_fixed8k,h4_hv8_mixed,h2_hv8_serving,h16_hv48_uniform,h16_hv64_fixed8k,h16_hv32_fixed32k").split(","):
        sh = ss[sid]
        k, w, u, g_cs, s0, info, cfg, T = stage_inputs(sh, env)
        KP = next_pow2(k.shape[-1])
        ref = run(ops.state_kernel, k, w, u, g_cs, s0, info, cfg, T)
        t_ref = bench_graph(lambda: run(ops.state_kernel, k, w, u, g_cs, s0, info, cfg, T)) * 1e3
        if os.environ.get("BASE_SWEEP"):
            bres = []
            for c in BASE_CFGS:
                try:
                    run(ops.state_kernel, k, w, u, g_cs, s0, info, c, T)
                    bres.append((bench_graph(lambda: run(ops.state_kernel, k, w, u, g_cs, s0, info, c, T)) * 1e3, c))
                except Exception as e:
                    print(f"  base {sid} {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            bres.sort(key=lambda r: r[0])
            print(f"  base sweep: " + ", ".join(f"{t:.1f} BV{c.BV}w{c.num_warps}s{c.num_stages}r{c.maxnreg}" for t, c in bres), flush=True)
            if bres and bres[0][0] < t_ref:
                t_ref = bres[0][0]
        res = []
        for c in ONE_CFGS:
            try:
                out = run(one, k, w, u, g_cs, s0, info, c, T, KP=KP)
                err = max(rel_rms(a.float(), b.float()) for a, b in zip(out, ref))
                t = bench_graph(lambda: run(one, k, w, u, g_cs, s0, info, c, T, KP=KP)) * 1e3
                res.append((t, c, err))
            except Exception as e:
                print(f"  {sid} {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        res.sort(key=lambda r: r[0])
        summary.append((sid, t_ref, res[0][0]))
        print(f"{sid:18s} state {t_ref:7.1f} [{cfg}]\n   one_tile best {res[0][0]:7.1f} ratio {res[0][0] / t_ref:.3f} [{res[0][1]}] max rel-RMS {res[0][2]:.1e}", flush=True)
        for t, c, e in res[1:]:
            print(f"      {t:7.1f} BV{c.BV} w{c.num_warps} s{c.num_stages} rel-RMS {e:.1e}")
    r = [s[2] / s[1] for s in summary]
    print(f"geomean one_tile/state: {math.exp(sum(map(math.log, r)) / len(r)):.3f} over {len(r)}")

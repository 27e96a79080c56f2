#!/usr/bin/env python
"""Check and time gdnbench's own chunked GDN forward against FLA on an NVIDIA GPU (H200).

    python scripts/gpu_gdn_check.py            # correctness + timing, three bf16 shapes
    python scripts/gpu_gdn_check.py --sweep    # also time a few configs of each stage kernel
    python scripts/gpu_gdn_check.py --shapes 0 --no-ref32

For each shape and norm route this prints, against FLA 0.6.0's
chunk_gated_delta_rule (use_qk_l2norm_in_kernel=True for the normalized routes;
the "none" route gets pre-normalized q/k on both sides):
  * relative RMS error of o and of the final state, ours vs FLA, and both vs an
    fp32 run of our op ("ref32": IEEE fp32 dots), so one can tell whose error it is;
  * median time of triton.testing.do_bench (L2 flushed) and of CUDA-graph replay;
then the time of each stage kernel on its own (ours and FLA's counterparts).
The first run includes Triton compilation and FLA's autotuning (cached on disk
afterwards); all timings are taken after warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from gdnbench.kernels import ops  # noqa: E402
from gdnbench.kernels.config import CHUNK_SIZE, GDNConfig, KernelConfig  # noqa: E402

K = V = 128
SHAPES = [
    dict(name="B1 T8192 H16 HV32", H=16, HV=32, lens=[8192], packed=False),
    dict(name="packed6 H4 HV8", H=4, HV=8, lens=[1300, 547, 2048, 963, 271, 3063], packed=True),
    dict(name="B1 T8192 H16 HV64", H=16, HV=64, lens=[8192], packed=False),
]
ROUTES = ("none", "flag", "fused_q", "fused_qk")
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.float(), ref.float()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def bench_graph(fn, n_inner: int = 10, reps: int = 15) -> float:
    """Median ms per call of ``fn`` replayed from a CUDA graph holding ``n_inner`` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n_inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / n_inner)
    return statistics.median(times)


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def try_bench(fn, graph: bool = False) -> str:
    try:
        return f"{(bench_graph(fn) if graph else bench(fn)) * 1e3:8.1f}"
    except Exception as e:  # keep the table going (e.g. a backend that cannot be graph-captured)
        return f"{'n/a':>8s}" + ("" if graph else f" ({type(e).__name__})")


def make_inputs(shape, device="cuda", seed=0):
    torch.manual_seed(seed)
    T, H, HV = sum(shape["lens"]), shape["H"], shape["HV"]
    N = len(shape["lens"])
    q = torch.randn(1, T, H, K, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, T, H, K, device=device, dtype=torch.bfloat16)
    v = torch.randn(1, T, HV, V, device=device, dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(1, T, HV, device=device, dtype=torch.float32))
    beta = torch.rand(1, T, HV, device=device, dtype=torch.float32).sigmoid().to(torch.bfloat16)
    h0 = 0.1 * torch.randn(N, HV, K, V, device=device, dtype=torch.float32)
    cu = None
    if shape["packed"]:
        cu = torch.tensor([0] + shape["lens"], device=device).cumsum(0).to(torch.int64)
    return q, k, v, g, beta, h0, cu


def fla_chunk_indices(cu):
    if cu is None:
        return None
    from fla.ops.utils.index import prepare_chunk_indices
    return prepare_chunk_indices(cu, CHUNK_SIZE)


def check_shape(shape, fla_fn, ref32: bool, rows: list) -> None:
    q, k, v, g, beta, h0, cu = make_inputs(shape)
    info = ops.prepare_varlen(cu) if cu is not None else None
    fla_ci = fla_chunk_indices(cu)
    qn, kn = ops.l2norm(q), ops.l2norm(k)

    def ours(norm, dtype=None):
        a, b = (qn, kn) if norm == "none" else (q, k)
        c, d = v, beta
        if dtype is not None:
            a, b, c = a.to(dtype), b.to(dtype), c.to(dtype)
        return lambda: ops.chunk_gdn(a, b, c, g, d, initial_state=h0, output_final_state=True,
                                     cu_seqlens=cu, norm=norm, chunk_indices=info)

    def fla(normalized_inputs: bool):
        a, b = (qn, kn) if normalized_inputs else (q, k)
        return lambda: fla_fn(a, b, v, g, beta, initial_state=h0, output_final_state=True,
                              use_qk_l2norm_in_kernel=not normalized_inputs, cu_seqlens=cu, chunk_indices=fla_ci)

    route_rows(shape["name"], ours, fla, ref32, rows)


def route_rows(name: str, ours, fla, ref32: bool, rows: list) -> None:
    """Rows of the route table for one shape: each of our routes against FLA (and, with ref32, both
    against an fp32 run of ours), then FLA's two; ``ours(norm, dtype=None)`` and ``fla(normalized)``
    return zero-argument calls giving (o, final_state)."""
    o_ref32 = s_ref32 = None
    if ref32:
        o_ref32, s_ref32 = ours("flag", torch.float32)()
    fla_out = {True: fla(True)(), False: fla(False)()}
    for norm in ROUTES:
        o, s = ours(norm)()
        fo, fs = fla_out[norm == "none"]
        row = dict(shape=name, impl=f"ours:{norm}", o_vs_fla=rel_rms(o, fo), ht_vs_fla=rel_rms(s, fs),
                   nan=not (torch.isfinite(o).all() and torch.isfinite(s).all()))
        if ref32:
            row.update(o_vs_32=rel_rms(o, o_ref32), ht_vs_32=rel_rms(s, s_ref32))
        row.update(bench=try_bench(ours(norm)), graph=try_bench(ours(norm), graph=True))
        rows.append(row)
    for normalized in (True, False):
        fo, fs = fla_out[normalized]
        row = dict(shape=name, impl="fla:" + ("none" if normalized else "l2norm_in_kernel"))
        if ref32:
            row.update(o_vs_32=rel_rms(fo, o_ref32), ht_vs_32=rel_rms(fs, s_ref32))
        row.update(bench=try_bench(fla(normalized)), graph=try_bench(fla(normalized), graph=True))
        rows.append(row)


def print_route_table(rows) -> None:
    cols = ("o~fla", "ht~fla", "o~ref32", "ht~ref32", "bench us", "graph us")
    hdr = f"{'shape':20s} {'impl':24s} " + " ".join(f"{c:>9s}" for c in cols)
    print(hdr)
    print("-" * len(hdr))

    def f(x):
        return f"{x:9.2e}" if isinstance(x, float) else f"{'':9s}"
    for r in rows:
        flag = "  NaN/inf!" if r.get("nan") else ""
        print(f"{r['shape']:20s} {r['impl']:24s} {f(r.get('o_vs_fla'))} {f(r.get('ht_vs_fla'))} "
              f"{f(r.get('o_vs_32'))} {f(r.get('ht_vs_32'))} {r['bench']:>9s} {r['graph']:>9s}{flag}")


def stage_times(shape, config: GDNConfig, fuse: bool) -> dict[str, float]:
    """Median us of each of our stage kernels on its own, inputs precomputed."""
    q, k, v, g, beta, h0, cu = make_inputs(shape)
    info = ops.prepare_varlen(cu) if cu is not None else None
    if not fuse:
        q, k = ops.l2norm(q), ops.l2norm(k)
    g_cs, A, rk, ssq = ops.gram_solve(k, g, beta, varlen=info, fuse_k=fuse, config=config)
    w, u, _ = ops.recompute_wu(k, v, beta, A, g_cs, rstd_k=rk, varlen=info, config=config)
    h, vn, _ = ops.state_recurrence(k, w, u, g_cs, initial_state=h0, output_final_state=True,
                                    varlen=info, config=config)
    t = {}
    if not fuse:
        t["l2norm(q)"] = bench(lambda: ops.l2norm(q, config.l2norm))
    t["gram+solve"] = bench(lambda: ops.gram_solve(k, g, beta, varlen=info, fuse_k=fuse, config=config))
    t["w,u"] = bench(lambda: ops.recompute_wu(k, v, beta, A, g_cs, rstd_k=rk, varlen=info, config=config))
    t["state"] = bench(lambda: ops.state_recurrence(k, w, u, g_cs, initial_state=h0,
                                                    output_final_state=True, varlen=info, config=config))
    t["output"] = bench(lambda: ops.chunk_output(q, k, vn, h, g_cs, scale=K**-0.5, rstd_k=rk, ssq_k=ssq, fuse_q=fuse,
                                                 varlen=info, config=config))
    return {n: x * 1e3 for n, x in t.items()}


def fla_stage_times(shape) -> dict[str, float]:
    """FLA 0.6.0's forward stages on the same inputs (l2norm, cumsum, intra, h, o)."""
    from fla.modules.norm.l2norm import l2norm_fwd
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2
    q, k, v, g, beta, h0, cu = make_inputs(shape)
    ci = fla_chunk_indices(cu)
    qn, _ = l2norm_fwd(q)
    kn, _ = l2norm_fwd(k)
    gc = chunk_local_cumsum(g, chunk_size=CHUNK_SIZE, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=ci)
    w, u, _ = chunk_gated_delta_rule_fwd_intra(k=kn, v=v, g=gc, beta=beta, cu_seqlens=cu, chunk_indices=ci)
    h, vn, _ = chunk_gated_delta_rule_fwd_h(k=kn, w=w, u=u, g=gc, initial_state=h0, output_final_state=True,
                                            cu_seqlens=cu, chunk_indices=ci)
    t = {
        "l2norm(q)": bench(lambda: l2norm_fwd(q)),
        "cumsum": bench(lambda: chunk_local_cumsum(g, chunk_size=CHUNK_SIZE, scale=RCP_LN2, cu_seqlens=cu,
                                                   chunk_indices=ci)),
        "gram+solve+w,u": bench(lambda: chunk_gated_delta_rule_fwd_intra(k=kn, v=v, g=gc, beta=beta, cu_seqlens=cu,
                                                                          chunk_indices=ci)),
        "state": bench(lambda: chunk_gated_delta_rule_fwd_h(k=kn, w=w, u=u, g=gc, initial_state=h0,
                                                             output_final_state=True, cu_seqlens=cu,
                                                             chunk_indices=ci)),
        "output": bench(lambda: chunk_fwd_o(q=qn, k=kn, v=vn, h=h, g=gc, scale=K**-0.5, cu_seqlens=cu,
                                            chunk_indices=ci)),
    }
    return {n: x * 1e3 for n, x in t.items()}


def sweep(shape) -> None:
    """Time a handful of configs per stage kernel (route flag) to re-pick GDNConfig defaults."""
    base = GDNConfig()
    cands = {
        "gram": [KernelConfig(BK=bk, num_warps=w) for bk in (32, 64) for w in (2, 4, 8)],
        "wu": [KernelConfig(BK=64, BV=64, num_warps=w, num_stages=s) for w in (4, 8) for s in (2, 3)]
        + [KernelConfig(BK=128, BV=128, num_warps=8, num_stages=2)],
        "state": [KernelConfig(BV=bv, num_warps=w, num_stages=s)
                  for bv in (32, 64) for w in (2, 4, 8) for s in (2, 3)],
        "output": [KernelConfig(BK=bk, BV=bv, num_warps=w, num_stages=s)
                   for bk, bv in ((64, 64), (128, 64), (64, 128), (128, 128)) for w in (4, 8) for s in (2, 3)],
    }
    stage_of = {"gram": "gram+solve", "wu": "w,u", "state": "state", "output": "output"}
    for kernel, configs in cands.items():
        results = []
        for c in configs:
            cfg = GDNConfig(**{**{f: getattr(base, f) for f in ("l2norm", "gram", "wu", "state", "output")}, kernel: c})
            try:
                ops.validate(cfg, K, V)
                results.append((stage_times(shape, cfg, fuse=False)[stage_of[kernel]], c))
            except Exception as e:  # invalid or failing config: report and go on
                print(f"  {kernel} {c}: {type(e).__name__}: {str(e)[:80]}")
        results.sort(key=lambda r: r[0])
        print(f"sweep {kernel:6s} ({shape['name']}): " + "  ".join(
            f"{t:7.1f}us BK={c.BK} BV={c.BV} w={c.num_warps} s={c.num_stages}" for t, c in results[:4]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=int, nargs="*", default=list(range(len(SHAPES))), help="indices into SHAPES")
    ap.add_argument("--no-ref32", action="store_true", help="skip the fp32 reference run of our op")
    ap.add_argument("--sweep", action="store_true", help="time a few configs of each stage kernel (shape 0)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    import triton
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  K=V={K} bf16")
    print(f"config: {GDNConfig()}")

    rows: list = []
    for i in args.shapes:
        log(f"checking {SHAPES[i]['name']} ...")
        check_shape(SHAPES[i], chunk_gated_delta_rule, not args.no_ref32, rows)
    print()
    print_route_table(rows)

    print()
    names = ["l2norm(q)", "gram+solve", "w,u", "state", "output"]
    print(f"{'stage us (median)':34s} " + " ".join(f"{n:>10s}" for n in names) + f" {'sum':>8s}")
    for i in args.shapes:
        for fuse in (False, True):
            t = stage_times(SHAPES[i], GDNConfig(), fuse)
            print(f"{SHAPES[i]['name'] + (' ours:fused_qk' if fuse else ' ours:flag'):34s} "
                  + " ".join(f"{t[n]:10.1f}" if n in t else f"{'-':>10s}" for n in names) + f" {sum(t.values()):8.1f}")
        try:
            t = fla_stage_times(SHAPES[i])
            print(f"{SHAPES[i]['name'] + ' fla':34s} " + "  ".join(f"{n}={x:.1f}" for n, x in t.items())
                  + f"  sum={sum(t.values()):.1f}")
        except Exception as e:  # FLA internals are not a stable API
            print(f"{SHAPES[i]['name'] + ' fla':34s} stage timing unavailable: {type(e).__name__}: {e}")
    if args.sweep:
        print()
        sweep(SHAPES[args.shapes[0]])
    log("done")


if __name__ == "__main__":
    main()

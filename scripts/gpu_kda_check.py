#!/usr/bin/env python
"""Check and time gdnbench's own chunked KDA forward against FLA on an NVIDIA GPU (H200).

    python scripts/gpu_kda_check.py            # correctness + timing, the KDA contract shapes (bf16)
    python scripts/gpu_kda_check.py --sweep    # also time a few configs of each stage kernel (shape 0)
    python scripts/gpu_kda_check.py --sweep kda_intra --shapes 0 2   # one kernel's configs
    python scripts/gpu_kda_check.py --shapes 0 2 --no-ref32

For each shape and norm route this prints, against FLA 0.6.0's chunk_kda (safe_gate,
lower_bound -5; use_qk_l2norm_in_kernel=True for the normalized routes, pre-normalized
q/k on both sides for "none"):
  * relative RMS error of o and of the final state, ours vs FLA, and both vs an fp32
    run of our op ("ref32": fp32 storage, tf32x3 dots), so one can tell whose error it is;
  * median time of triton.testing.do_bench and of CUDA-graph replay;
then the time of each of our stage kernels on its own (kda_intra, w/u/kg, state, output).
The first run includes Triton compilation and FLA's autotuning; timings are after warm-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gdnbench import ops  # noqa: E402
from gdnbench.kernels.config import GDNConfig, KernelConfig, default_config  # noqa: E402
from gpu_gdn_check import bench, log, print_route_table, route_rows  # noqa: E402

K = V = 128
LOWER_BOUND = -5.0
MIXED = [1300, 547, 2048, 963, 271, 3063]
SHAPES = [
    dict(name="h96_fixed", H=96, lens=[8192]),
    dict(name="h96_mixed", H=96, lens=MIXED),
    dict(name="h64_fixed", H=64, lens=[8192]),
    dict(name="h64_uniform", H=64, lens=[1024] * 8),
]


def make_inputs(shape, device="cuda", seed=0):
    """As gdnbench.inputs for kda-legacy6: bf16 q/k/v/beta, fp32 bounded gate, fp32 states, packed."""
    gen = torch.Generator().manual_seed(seed)
    T, H, N = sum(shape["lens"]), shape["H"], len(shape["lens"])

    def randn(*size):
        return torch.randn(*size, generator=gen)

    q, k, v = randn(1, T, H, K).bfloat16(), randn(1, T, H, K).bfloat16(), randn(1, T, H, V).bfloat16()
    g = LOWER_BOUND * torch.sigmoid(randn(1, T, H, K))
    beta = torch.sigmoid(randn(1, T, H)).bfloat16()
    h0 = (0.25 * randn(N, H, K, V)).bfloat16().float()
    cu = torch.tensor([0] + shape["lens"]).cumsum(0).to(torch.int64) if N > 1 else None
    return [None if x is None else x.to(device) for x in (q, k, v, g, beta, h0, cu)]


def check_shape(shape, fla_fn, ref32: bool, rows: list) -> None:
    q, k, v, g, beta, h0, cu = make_inputs(shape)
    info = ops.prepare_varlen(cu) if cu is not None else None
    qn, kn = ops.l2norm(q), ops.l2norm(k)
    fla_kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, safe_gate=True, lower_bound=LOWER_BOUND)
    if cu is not None:
        fla_kw["cu_seqlens_cpu"] = cu.cpu()

    def ours(norm, dtype=None):
        a, b, c = (qn, kn, v) if norm == "none" else (q, k, v)
        if dtype is not None:
            a, b, c = a.to(dtype), b.to(dtype), c.to(dtype)
        return lambda: ops.chunk_kda(a, b, c, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                     norm=norm, lower_bound=LOWER_BOUND, chunk_indices=info,
                                     check_gates=False)

    def fla(normalized_inputs: bool):
        a, b = (qn, kn) if normalized_inputs else (q, k)
        return lambda: fla_fn(a, b, v, g, beta, use_qk_l2norm_in_kernel=not normalized_inputs, **fla_kw)

    route_rows(shape["name"], ours, fla, ref32, rows)


def stage_times(shape, config: GDNConfig, norm: str) -> dict[str, float]:
    """Median us of each of our stage kernels on its own for route ``norm``, inputs precomputed."""
    q, k, v, g, beta, h0, cu = make_inputs(shape)
    info = ops.prepare_varlen(cu) if cu is not None else None
    fuse_k, fuse_q = norm == "fused_qk", norm in ("fused_q", "fused_qk")
    if not fuse_k:
        k = ops.l2norm(k)
    if not fuse_q:
        q = ops.l2norm(q)
    g_cs, A, aqk, rk = ops.kda_intra(q, k, g, beta, varlen=info, fuse_k=fuse_k, raw_q=fuse_q, config=config)
    w, u, kg = ops.recompute_wu(k, v, beta, A, g_cs, rstd_k=rk, varlen=info, config=config)
    h, vn, _ = ops.state_recurrence(kg, w, u, g_cs, initial_state=h0, output_final_state=True, varlen=info,
                                    config=config)
    t = {
        "kda_intra": bench(lambda: ops.kda_intra(q, k, g, beta, varlen=info, fuse_k=fuse_k, raw_q=fuse_q,
                                                 config=config)),
        "w,u,kg": bench(lambda: ops.recompute_wu(k, v, beta, A, g_cs, rstd_k=rk, varlen=info, config=config)),
        "state": bench(lambda: ops.state_recurrence(kg, w, u, g_cs, initial_state=h0, output_final_state=True,
                                                    varlen=info, config=config)),
        "output": bench(lambda: ops.chunk_output(q, None, vn, h, g_cs, scale=K**-0.5, fuse_q=fuse_q, varlen=info,
                                                 config=config, aqk=aqk)),
    }
    return {n: x * 1e3 for n, x in t.items()}


def sweep(shape, kernels) -> None:
    """Time a handful of configs per stage kernel (route flag; output_fused under fused_q)."""
    base = default_config(K, V, 2, "kda")
    cands = {
        "kda_intra": [KernelConfig(BK=bk, num_warps=w, num_stages=s, maxnreg=r) for bk in (16, 32) for w in (4,)
                      for s in (1, 2) for r in (None, 128, 168)]
                     + [KernelConfig(BK=32, num_warps=w, num_stages=1) for w in (2, 8)],
        "wu": [KernelConfig(BK=bk, BV=bv, num_warps=w, num_stages=s)
               for bk, bv in ((64, 64), (128, 128)) for w in (4, 8) for s in (2, 3)],
        "state": [KernelConfig(BV=bv, num_warps=w, num_stages=s) for bv in (32, 64) for w in (4, 8) for s in (2, 3)],
        "output": [KernelConfig(BK=bk, BV=bv, num_warps=w, num_stages=s)
                   for bk, bv in ((64, 64), (64, 128), (128, 64), (128, 128)) for w in (4, 8) for s in (2, 3)],
        "output_fused": [KernelConfig(BK=bk, BV=bv, num_warps=w, num_stages=s, maxnreg=r)
                         for bk, bv in ((32, 128), (64, 64), (64, 128)) for w in (4, 8) for s in (2, 3)
                         for r in (None, 168)],
    }
    stage_of = {"kda_intra": "kda_intra", "wu": "w,u,kg", "state": "state", "output": "output",
                "output_fused": "output"}
    for kernel, configs in cands.items():
        if kernel not in kernels:
            continue
        results = []
        for c in configs:
            cfg = dataclasses.replace(base, **{kernel: c})
            try:
                ops.validate(cfg, K, V, 2, "kda")
                norm = "fused_q" if kernel == "output_fused" else "flag"
                results.append((stage_times(shape, cfg, norm)[stage_of[kernel]], c))
            except Exception as e:  # invalid or failing config: report and go on
                print(f"  {kernel} {c}: {type(e).__name__}: {str(e)[:80]}")
        results.sort(key=lambda r: r[0])
        print(f"sweep {kernel:12s} ({shape['name']}): " + "  ".join(
            f"{t:7.1f}us BK={c.BK} BV={c.BV} w={c.num_warps} s={c.num_stages} r={c.maxnreg}" for t, c in results[:4]))
        for t, c in results:
            print(f"  {kernel} {t:8.1f} us  {c}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=int, nargs="*", default=list(range(len(SHAPES))), help="indices into SHAPES")
    ap.add_argument("--no-ref32", action="store_true", help="skip the fp32 reference run of our op")
    ap.add_argument("--sweep", nargs="*", metavar="KERNEL",
                    help="time a few configs of these stage kernels (all when none named; first shape)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    from fla.ops.kda import chunk_kda
    import triton
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  K=V={K} bf16")
    print(f"config: {default_config(K, V, 2, 'kda')}")

    rows: list = []
    for i in args.shapes:
        log(f"checking {SHAPES[i]['name']} ...")
        check_shape(SHAPES[i], chunk_kda, not args.no_ref32, rows)
    print()
    print_route_table(rows)

    print()
    names = ["kda_intra", "w,u,kg", "state", "output"]
    print(f"{'stage us (median)':28s} " + " ".join(f"{n:>10s}" for n in names) + f" {'sum':>8s}")
    for i in args.shapes:
        for norm in ("flag", "fused_q", "fused_qk"):
            t = stage_times(SHAPES[i], default_config(K, V, 2, "kda"), norm)
            print(f"{SHAPES[i]['name'] + ' ours:' + norm:28s} " + " ".join(f"{t[n]:10.1f}" for n in names)
                  + f" {sum(t.values()):8.1f}")
    if args.sweep is not None:
        print()
        sweep(SHAPES[args.shapes[0]], args.sweep or ["kda_intra", "wu", "state", "output", "output_fused"])
    log("done")


if __name__ == "__main__":
    main()

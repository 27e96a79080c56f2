"""Which wu_kernel configs fault on fp32 small heads (one config per process; a fault ends it)."""
import dataclasses, sys
sys.path.insert(0, "tests"); sys.path.insert(0, ".")
import torch
from gdnbench import ops
from gdnbench.kernels.config import KernelConfig
import test_ops_kda as tk, test_ops_gdn as tg
w, s, dt = int(sys.argv[1]), int(sys.argv[2]), getattr(torch, sys.argv[3])
for K, V in ((32, 16), (16, 16), (64, 32), (32, 64), (128, 16), (16, 128)):
    for fam, fuse in (("gdn", False), ("gdn", True), ("kda", False), ("kda", True)):
        mod = tk if fam == "kda" else tg
        q, k, v, g, beta, _ = mod.make_inputs(1, 100, 1, 1, K, V, dt, seed=9)
        q, k, v, g, beta = (x.cuda() for x in (q, k, v, g, beta))
        base = ops.default_config(K, V, k.element_size(), fam)
        cfg = dataclasses.replace(base, wu=dataclasses.replace(base.wu, num_warps=w, num_stages=s))
        kn = k if fuse else ops.l2norm(k)
        if fam == "kda":
            g_cs, A, aqk, rk = ops.kda_intra(q, kn, g, beta, fuse_k=fuse, raw_q=fuse, config=cfg)
        else:
            g_cs, A, rk, ssq = ops.gram_solve(kn, g, beta, fuse_k=fuse, config=cfg)
        torch.cuda.synchronize()
        print(f"w{w} s{s} {sys.argv[3]} K{K} V{V} {fam} fuse_k={fuse}: ", end="", flush=True)
        ops.recompute_wu(kn, v, beta, A, g_cs, rstd_k=rk, config=cfg)
        torch.cuda.synchronize()
        print("ok", flush=True)

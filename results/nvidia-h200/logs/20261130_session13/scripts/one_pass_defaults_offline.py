"""Offline (Triton 3.6, sm_90, no GPU): compile GDN's one-pass kernels at their default configs for every
storage dtype, K in 16..128, and every route, forced on; report registers, stack and shared memory."""
import dataclasses, sys, os
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch
from gdnbench import ops
from offline_compile import record_launches, compile_sm90
launches = []
record_launches(launches)
bad = 0
for dt in (torch.bfloat16, torch.float16, torch.float32):
    for K, V in ((16, 16), (32, 48), (64, 64), (96, 128), (128, 128), (128, 256)):
        for norm in ("flag", "fused_q", "fused_qk"):
            launches.clear()
            cfg = dataclasses.replace(ops.default_config(K, V, dt.itemsize), one_pass=True)
            T, H, HV = 130, 1, 2
            q, k = torch.randn(1, T, H, K, dtype=dt), torch.randn(1, T, H, K, dtype=dt)
            v, beta = torch.randn(1, T, HV, V, dtype=dt), torch.rand(1, T, HV, dtype=dt)
            ops.chunk_gdn(q, k, v, -torch.rand(1, T, HV), beta, initial_state=torch.zeros(1, HV, K, V),
                          output_final_state=True, norm=norm, config=cfg)
            for kern, a, kw, opts in launches:
                if kern.fn.__name__ not in ("aqk_kernel", "state_out_kernel"):
                    continue
                try:
                    c = compile_sm90(kern, a, kw, opts)
                    sh = c.metadata.shared
                    res = f"regs {c.n_regs if hasattr(c, 'n_regs') and c.n_regs else '?'} smem {sh}"
                    if sh > 227 * 1024:
                        res += " OVER"; bad += 1
                except Exception as e:
                    bad += 1
                    res = f"FAILED {type(e).__name__}: {str(e.__cause__ or e).strip().splitlines()[-1][:120]}"
                print(f"{str(dt)[6:]:9s} K{K:<3d} V{V:<3d} {norm:8s} {kern.fn.__name__:17s} {opts} {res}", flush=True)
print("problems:", bad)

import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(__file__))
import torch
from gdnbench import ops
from gdnbench.check import rel_rms
from gdnbench.kernels.config import KernelConfig
from so_common import state_out, two_kernels
for dt in (torch.float32, torch.float16):
    for K, V, varlen, h0 in ((128, 128, False, False), (96, 64, True, True), (64, 48, True, False)):
        torch.manual_seed(0)
        T = 200
        q = ops.l2norm(torch.randn(1, T, 2, K, dtype=dt)); k = ops.l2norm(torch.randn(1, T, 2, K, dtype=dt))
        v = torch.randn(1, T, 4, V, dtype=dt); g = torch.nn.functional.logsigmoid(torch.randn(1, T, 4)); beta = torch.rand(1, T, 4)
        info = ops.prepare_varlen(torch.tensor([0, 70, T])) if varlen else None
        s0 = torch.randn(2 if varlen else 1, 4, K, V) if h0 else None
        g_cs, A, _, _ = ops.gram_solve(k, g, beta, varlen=info)
        w, u, _ = ops.recompute_wu(k, v, beta, A, g_cs, varlen=info)
        a = two_kernels(q, k, w, u, g_cs, scale=K**-0.5, initial_state=s0, output_final_state=True, varlen=info)
        ref = ops.chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=None if info is None else info.cu_seqlens, norm="none")
        for bv in (16, 64):
            b = state_out(q, k, w, u, g_cs, scale=K**-0.5, initial_state=s0, output_final_state=True, varlen=info, cfg=KernelConfig(BV=bv))
            print(dt, K, V, varlen, h0, bv, f"o {rel_rms(b[0], a[0]):.1e} ht {rel_rms(b[1], a[1]):.1e} (two-kernel vs chunk_gdn {rel_rms(a[0], ref[0]):.1e})", flush=True)

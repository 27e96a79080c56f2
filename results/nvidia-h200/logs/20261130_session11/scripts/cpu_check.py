import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, ".devrun/st")
import torch
from gdnbench import ops
from gdnbench.check import rel_rms
from gdnbench.kernels.config import KernelConfig
import sweep
for dt in (torch.float32, torch.float16):
    for K, V, varlen, h0 in ((128, 128, False, False), (96, 64, True, True), (32, 48, True, False), (256, 32, False, True)):
        torch.manual_seed(0)
        T = 200
        k = torch.randn(1, T, 2, K, dtype=dt) * 0.1
        w = torch.randn(1, T, 4, K, dtype=dt) * 0.1
        u = torch.randn(1, T, 4, V, dtype=dt)
        g = (-torch.rand(1, T, 4)).cumsum(1) * 0  # small local decays
        g = -torch.rand(1, T, 4) * 0.5
        info = ops.prepare_varlen(torch.tensor([0, 70, T])) if varlen else None
        N = 2 if varlen else 1
        s0 = torch.randn(N, 4, K, V) if h0 else None
        a = ops.state_recurrence(k, w, u, g, initial_state=s0, output_final_state=True, varlen=info)
        for bv in (16, 64):
            b = sweep.state_t(k, w, u, g, initial_state=s0, output_final_state=True, varlen=info,
                              cfg=KernelConfig(BV=bv, num_warps=4, num_stages=2))
            print(dt, K, V, varlen, h0, bv, f"h {rel_rms(b[0], a[0]):.1e} vn {rel_rms(b[1], a[1]):.1e} ht {rel_rms(b[2], a[2]):.1e}")
        # per-channel (KDA): g_cs [B,T,HV,K], k with HV heads
        kg = torch.randn(1, T, 4, K, dtype=dt) * 0.1
        gc = -torch.rand(1, T, 4, K)
        a = ops.state_recurrence(kg, w, u, gc, initial_state=s0, output_final_state=True, varlen=info)
        b = sweep.state_t(kg, w, u, gc, initial_state=s0, output_final_state=True, varlen=info, cfg=KernelConfig(BV=32))
        print("  kda", f"h {rel_rms(b[0], a[0]):.1e} vn {rel_rms(b[1], a[1]):.1e} ht {rel_rms(b[2], a[2]):.1e}")

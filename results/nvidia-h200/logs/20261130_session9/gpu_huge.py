"""GPU check of the fused_qk fix-up launches: huge rows (fp32 and bf16) against the fp64 recurrence (small
shape) and against the flag route (8K tokens, so the fix-ups' flags span several FLAG_BLOCKs); and a
probe of fp32 fused_q with huge q rows under tf32x3 and ieee dots."""
import os, sys
sys.path.insert(0, "tests")
import torch
from gdnbench import ops  # kernels decorated for the GPU before the test module sets TRITON_INTERPRET=1
import test_ops_gdn as t
os.environ["TRITON_INTERPRET"] = "0"
cuda = lambda *xs: [x.cuda() for x in xs]
for dtype in (torch.float32, torch.bfloat16):
    for huge_k in (True, False):
        q, k, v, g, beta, _ = t.make_inputs(1, 200, 2, 4, 128, 128, torch.float32, seed=3)
        q[0, [2, 66, 130]] *= 1e30
        k[0, [7, 66, 131]] *= 1e30 if huge_k else 1e10
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        ro, rf = t.reference(q.float(), k.float(), v.float(), g, beta)
        for norm in ("flag", "fused_q", "fused_qk"):
            o, fs = ops.chunk_gdn(*cuda(q, k, v, g, beta), norm=norm, output_final_state=True)
            print(f"small {str(dtype):15s} huge_k={huge_k!s:5s} {norm:8s} finite={torch.isfinite(o).all().item()} "
                  f"o {t.rel_rms(o.cpu(), ro):.2e} state {t.rel_rms(fs.cpu(), rf):.2e}", flush=True)
for huge_k in (True, False):
    q, k, v, g, beta, _ = t.make_inputs(1, 8192, 16, 32, 128, 128, torch.float32, seed=4)
    rows = [5, 4000, 8100, 8191]
    q[0, rows] *= 1e30
    k[0, rows] *= 1e30 if huge_k else 1e10
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    of, ff = ops.chunk_gdn(*cuda(q, k, v, g, beta), norm="flag", output_final_state=True)
    o, fs = ops.chunk_gdn(*cuda(q, k, v, g, beta), norm="fused_qk", output_final_state=True)
    print(f"8K bf16 huge_k={huge_k!s:5s} fused_qk vs flag: finite={torch.isfinite(o).all().item()} "
          f"o {t.rel_rms(o, of):.2e} state {t.rel_rms(fs, ff):.2e}", flush=True)
real_prec = ops._precision
for prec in ("tf32x3", "ieee"):
    ops._precision = lambda d, p=prec: p if d == torch.float32 else real_prec(d)
    for s in (1e15, 1e20, 1e25, 1e30):
        q, k, v, g, beta, _ = t.make_inputs(1, 200, 2, 4, 128, 128, torch.float32, seed=3)
        q[0, [2, 66, 130]] *= s
        ro, rf = t.reference(q, k, v, g, beta)
        for norm in ("fused_q",):
            try:
                o, fs = ops.chunk_gdn(*cuda(q, k, v, g, beta), norm=norm, output_final_state=True)
                bad = (~torch.isfinite(o)).nonzero()[:, 1].unique().tolist()
                print(f"fp32 {prec} q rows x{s:.0e} {norm}: nonfinite at tokens {bad[:8]} o {t.rel_rms(o.cpu(), ro):.2e}",
                      flush=True)
            except Exception as e:
                print(f"fp32 {prec} q rows x{s:.0e} {norm}: {type(e).__name__} {str(e)[:100]}", flush=True)
ops._precision = real_prec

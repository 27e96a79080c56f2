"""KDA fp32 with huge q/k rows on the GPU (tf32x3 dots): non-finite tokens and rel-RMS against fp64."""
import os, sys
sys.path.insert(0, "tests"); sys.path.insert(0, ".")
import torch
from gdnbench import ops
import test_ops_kda as t
for s in (1e20, 1e25, 1e30, 1e33):
    for which in ("q", "k"):
        q, k, v, g, beta, _ = t.make_inputs(1, 200, 2, 4, 128, 128, torch.float32, seed=3)
        (q if which == "q" else k)[0, [2, 66, 130]] *= s
        ro, rf = t.reference(q, k, v, g, beta)
        for norm in ("flag", "fused_q", "fused_qk"):
            o, fs = ops.chunk_kda(*(x.cuda() for x in (q, k, v, g, beta)), norm=norm, output_final_state=True)
            bad = (~torch.isfinite(o)).nonzero()[:, 1].unique().tolist()
            print(f"KDA fp32 {which} rows x{s:.0e} {norm:8s}: nonfinite tokens {bad[:6]} o {t.rel_rms(o.cpu(), ro):.2e} "
                  f"state {t.rel_rms(fs.cpu(), rf):.2e}", flush=True)
# the interpreter test's case, on the GPU
q, k, v, g, beta, _ = t.make_inputs(1, 100, 1, 1, 32, 16, torch.float32, seed=9)
q[0, [2, 66]] *= 1e30; k[0, [7, 40]] *= 1e30; g[0, 64:80] = -5.0; k[0, 79] *= 1e7
ro, rf = t.reference(q, k, v, g, beta)
for norm in ("flag", "fused_q", "fused_qk"):
    o, fs = ops.chunk_kda(*(x.cuda() for x in (q, k, v, g, beta)), norm=norm, output_final_state=True)
    print(f"KDA test_huge_rows_finite case {norm:8s}: finite {bool(torch.isfinite(o).all())} o {t.rel_rms(o.cpu(), ro):.2e} state {t.rel_rms(fs.cpu(), rf):.2e}")

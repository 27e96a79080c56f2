"""fp32 fused_q / fused_qk with huge q rows on the GPU: which tokens come out non-finite (this tree's ops)."""
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests")); sys.path.insert(0, sys.argv[1])
import torch
from gdnbench import ops
import test_ops_gdn as t
os.environ["TRITON_INTERPRET"] = "0"
print(ops.__file__)
for s in (1e25, 1e28, 1e30, 1e33):
    for seed in (3, 5):
        q, k, v, g, beta, _ = t.make_inputs(1, 200, 2, 4, 128, 128, torch.float32, seed=seed)
        q[0, [2, 66, 130]] *= s
        ro, rf = t.reference(q, k, v, g, beta)
        for norm in ("fused_q", "fused_qk"):
            o, fs = ops.chunk_gdn(*(x.cuda() for x in (q, k, v, g, beta)), norm=norm, output_final_state=True)
            bad = (~torch.isfinite(o)).nonzero()[:, 1].unique().tolist()
            print(f"q rows x{s:.0e} seed {seed} {norm}: nonfinite tokens {bad[:8]} o {t.rel_rms(o.cpu(), ro):.2e}", flush=True)

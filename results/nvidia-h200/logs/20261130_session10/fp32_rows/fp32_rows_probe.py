"""fp32 huge q / k rows on the GPU, GDN and KDA, every route: non-finite tokens and rel-RMS against fp64."""
import sys
sys.path.insert(0, "tests"); sys.path.insert(0, ".")
import torch
from gdnbench import ops
import test_ops_kda as tk, test_ops_gdn as tg
worst = {}
for fam, mod, op in (("gdn", tg, ops.chunk_gdn), ("kda", tk, ops.chunk_kda)):
    for s in (1e20, 1e25, 1e28, 1e30, 1e33):
        for which in ("q", "k"):
            for seed in (3, 5):
                q, k, v, g, beta, _ = mod.make_inputs(1, 200, 2, 4, 128, 128, torch.float32, seed=seed)
                (q if which == "q" else k)[0, [2, 66, 130]] *= s
                ro, rf = mod.reference(q, k, v, g, beta)
                for norm in ("flag", "fused_q", "fused_qk"):
                    o, fs = op(*(x.cuda() for x in (q, k, v, g, beta)), norm=norm, output_final_state=True)
                    bad = (~torch.isfinite(o)).nonzero()[:, 1].unique().tolist()
                    eo, es = mod.rel_rms(o.cpu(), ro), mod.rel_rms(fs.cpu(), rf)
                    key = (fam, norm)
                    worst[key] = max(worst.get(key, 0.0), eo if eo == eo else float("inf"), es if es == es else float("inf"))
                    print(f"{fam} fp32 {which} rows x{s:.0e} seed {seed} {norm:8s}: nonfinite {bad[:4]} o {eo:.2e} state {es:.2e}", flush=True)
for key, w in worst.items():
    print(f"worst rel-RMS {key[0]} {key[1]}: {w:.2e}")

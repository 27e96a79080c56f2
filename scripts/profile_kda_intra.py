"""Launch our kda_intra kernel a few times on one kda-legacy6 shape, for Nsight Compute:

    ncu --clock-control none -k regex:kda_intra --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters \
        python scripts/profile_kda_intra.py [--shape 2] [--norm flag]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gdnbench.kernels import ops  # noqa: E402
from gpu_kda_check import SHAPES, make_inputs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shape", type=int, default=2)
ap.add_argument("--norm", default="flag", choices=("flag", "fused_q", "fused_qk"))
args = ap.parse_args()
q, k, v, g, beta, h0, cu = make_inputs(SHAPES[args.shape])
info = ops.prepare_varlen(cu) if cu is not None else None
if args.norm != "fused_qk":
    k = ops.l2norm(k)
if args.norm == "flag":
    q = ops.l2norm(q)
for _ in range(4):
    ops.kda_intra(q, k, g, beta, varlen=info, fuse_k=args.norm == "fused_qk", raw_q=args.norm != "flag")
torch.cuda.synchronize()

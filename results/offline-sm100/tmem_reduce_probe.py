"""The construct that fails on sm_100 / sm_103 under Triton 3.6: a reduction to a scalar of a
row reduction of a tl.dot accumulator (on Blackwell a tensor-memory accumulator).  Our q-norm
fused kernels do this in row_rstd (tl.max(ssq, 0) of diag_ssq's row sums of q q^T) and aqk's
overflow test (tl.max(tl.max(overflowed, 1), 0)).

    python results/offline-sm100/tmem_reduce_probe.py 100   # arch: 90, 100, 103
"""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from gdnbench.kernels.offline import target_driver  # noqa: E402

CASES = ("row sums stored (no scalar)", "max(row sums) in a branch", "max(row sums) stored",
         "max(max(acc, 1), 0) stored", "max(max(diag, 0), 0) (columns first)", "max(diag) in one reduce (axis None)")


@triton.jit
def probe(x, out, flag, MODE: tl.constexpr):
    r = tl.arange(0, 64)
    a = tl.load(x + r[:, None] * 64 + r[None, :])
    acc = tl.dot(a, tl.trans(a), tl.zeros([64, 64], dtype=tl.float32))
    d = tl.where(r[:, None] == r[None, :], acc, 0.0)
    s = tl.sum(d, 1)
    if MODE == 0:
        tl.store(out + r, s)
    elif MODE == 1:
        if tl.max(s, 0) > 1.0:
            s = s * 2
        tl.store(out + r, s)
    elif MODE == 2:
        tl.store(flag, tl.max(s, 0))
    elif MODE == 3:
        tl.store(flag, tl.max(tl.max(acc, 1), 0))
    elif MODE == 4:
        tl.store(flag, tl.max(tl.max(d, 0), 0))
    else:
        tl.store(flag, tl.max(d))


arch = int(sys.argv[1]) if len(sys.argv) > 1 else 100
x, o, f = torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(64), torch.zeros(1)
print(f"Triton {triton.__version__}, sm_{arch}")
with target_driver(arch):
    for mode, name in enumerate(CASES):
        try:
            probe.warmup(x, o, f, MODE=mode, grid=(1,), num_warps=4)
            verdict = "compiles"
        except Exception as e:
            verdict = "FAILED " + str(e.__cause__ or e).strip().splitlines()[-1][:80]
        print(f"  {mode} {name:40s} {verdict}", flush=True)

"""Hashes of the GDN kernels' sm_90 PTX (line info stripped) and SASS, from an offline compile with the
Triton installed here (no GPU needed): run it on two revisions to show a refactor left GDN's code alone.

    git worktree add /tmp/gdn-base <rev>
    python scripts/offline_gdn_identity.py --repo /tmp/gdn-base > /tmp/base.txt
    python scripts/offline_gdn_identity.py > /tmp/head.txt && diff /tmp/base.txt /tmp/head.txt

Eighteen specializations: gram, w/u, state, output x fixed/varlen x plain/fuse_k (/fuse_q for the
output), bf16, K = V = 128, the default GDN configs.  Parameters a revision's kernel lacks are skipped,
new constexpr parameters get None (for the gate-kind flag: the GDN path).
"""
import argparse
import hashlib
import inspect
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

P = "*bf16"
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def digests(kernel, args: dict, consts: dict, cfg) -> tuple[str, str]:
    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: args.get(n, "constexpr") for n in names}
    constexprs = {(names.index(n),): consts.get(n) for n in names if sig[n] == "constexpr"}
    compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    return tuple(hashlib.sha256(x.encode()).hexdigest()[:16] for x in normalized_code(compiled))


def normalized_code(compiled) -> tuple[str, str]:
    """(PTX without line info and comments, SASS instructions) of a compiled kernel: equal for two
    sources exactly when they compiled to the same code."""
    ptx = re.sub(r"\.section\s+\.debug_\w+\s*\{.*?\}", "", compiled.asm["ptx"], flags=re.S)
    ptx = "\n".join(ln for ln in ptx.splitlines()
                    if not re.match(r"\s*(\.loc|\.file|//|\$L__tmp\d+:)", ln))
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([CUOBJDUMP, "--dump-sass", f.name], capture_output=True, text=True).stdout
    return ptx, "\n".join(ln for ln in sass.splitlines() if "Function" in ln or "/*0" in ln)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, ap.parse_args().repo)
    from gdnbench.kernels.config import DEFAULT_CONFIG as cfg
    from gdnbench.kernels.intra import gram_solve_kernel, wu_kernel
    from gdnbench.kernels.output import output_kernel
    from gdnbench.kernels.state import state_kernel

    print(f"triton {triton.__version__}, sm_90, bf16 H16 HV32 K=V=128: kernel ptx sass")
    base = dict(H=16, HV=32, K=128, V=128, BT=64, BC=16, PREC="tf32", USE_H0=True, STORE_HT=True)
    for varlen in (False, True):
        vl = dict(cu_seqlens="*i64", chunk_indices="*i32") if varlen else {}
        svl = dict(cu_seqlens="*i64", chunk_offsets="*i32") if varlen else {}
        for fk in (False, True):
            c = dict(base, IS_VARLEN=varlen, FUSE_K=fk)
            rk = {"rstd_k": "*fp32", "ssq_k": "*fp32", "risky": "*i8"} if fk else {}
            tag = f"{'varlen' if varlen else 'fixed'}_{'fuse_k' if fk else 'plain'}"
            jobs = [
                ("gram", gram_solve_kernel, dict(k=P, g="*fp32", beta=P, g_cs="*fp32", A=P, T="i32", NT="i32"),
                 dict(BK=cfg.gram.BK), cfg.gram),
                ("wu", wu_kernel, dict(k=P, v=P, beta=P, g_cs="*fp32", A=P, w=P, u=P, T="i32", NT="i32"),
                 dict(BK=cfg.wu.BK, BV=cfg.wu.BV), cfg.wu),
                ("state", state_kernel, dict(k=P, w=P, u=P, g_cs="*fp32", h=P, v_new=P, h0="*fp32", ht="*fp32",
                                             T="i32", **svl), dict(BV=cfg.state.BV), cfg.state),
            ]
            for fq in ((False, True) if not fk else (True,)):
                oc = cfg.output_fused if fq else cfg.output
                jobs.append((f"output_{'fuse_q' if fq else 'plain_q'}", output_kernel,
                             dict(q=P, k=P, v_new=P, h=P, g_cs="*fp32", o=P, scale="fp32", T="i32", NT="i32"),
                             dict(BK=oc.BK, BV=oc.BV, FUSE_Q=fq), oc))
            for name, kernel, args, consts, kc in jobs:
                extra = {} if name == "state" else vl
                print(f"{name}_{tag}", *digests(kernel, {**args, **rk, **extra}, {**c, **consts}, kc), flush=True)


if __name__ == "__main__":
    main()

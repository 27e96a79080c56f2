"""Compile every kernel a chunk_gdn / chunk_kda route launches for sm_90 with the Triton installed
here, without a GPU, and print registers and stack bytes per launch: a cheap check, before device time
is spent, that the kernels build with another Triton (the H200 image has 3.6) and do not spill.

    python scripts/offline_compile.py --family kda --norm fused_qk
    python scripts/offline_compile.py --family gdn --norm flag --T 300 --lens 100,200
    python scripts/offline_compile.py --family kda --set kda_intra=BK:64,num_warps:8,num_stages:2
    python scripts/offline_compile.py --family kda --norm fused_qk --unbounded

The op runs on CPU tensors with every launch intercepted (nothing executes); each intercepted launch
is compiled with its own arguments' dtypes and constexprs and the config's warps/stages/maxnreg.
"""
import argparse
import dataclasses
import inspect
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gdnbench import ops  # noqa: E402

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64", torch.int8: "i8",
          torch.int32: "i32"}
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def arg_type(v) -> str:
    if isinstance(v, torch.Tensor):
        return "*" + DTYPES[v.dtype]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -2**31 <= v < 2**31 else "i64"
    if isinstance(v, float):
        return "fp32"
    return "constexpr"


def compile_sm90(kernel, args, kwargs, opts):
    """Triton's compiled kernel for sm_90 of one intercepted launch (its arguments' dtypes, constexprs)."""
    names = list(inspect.signature(kernel.fn).parameters)
    bound = dict(zip(names, args), **kwargs)
    const_names = {p.name for p in kernel.params if p.is_constexpr}
    sig, consts = {}, {}
    for i, n in enumerate(names):
        v = bound.get(n)
        t = "constexpr" if n in const_names or v is None else arg_type(v)
        sig[n] = t
        if t == "constexpr":
            consts[(i,)] = v
    return triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def compile_launch(kernel, args, kwargs, opts, sass_dir=None) -> str:
    compiled = compile_sm90(kernel, args, kwargs, opts)
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", f.name],
                             capture_output=True, text=True).stdout
        if sass_dir:
            sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-sass", f.name], capture_output=True,
                                  text=True).stdout
            with open(os.path.join(sass_dir, kernel.fn.__name__ + ".sass"), "w") as fh:
                fh.write(sass)
            with open(os.path.join(sass_dir, kernel.fn.__name__ + ".ttgir"), "w") as fh:
                fh.write(compiled.asm["ttgir"])
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out)
    return f"registers {m.group(1):>3}  stack {m.group(2):>4} B" if m else out[-200:]


def record_launches(launches: list):
    """Make ops._launch append (kernel, args, kwargs, compile options) to ``launches`` instead of
    launching; returns the real _launch (to put back)."""
    def record(kernel, grid, cfg, *a, **kw):
        opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        if cfg.maxnreg is not None:
            opts["maxnreg"] = cfg.maxnreg
        launches.append((kernel, a, kw, opts))

    real, ops._launch = ops._launch, record
    return real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("gdn", "kda"), default="kda")
    ap.add_argument("--norm", default="flag", choices=ops.NORM_MODES)
    ap.add_argument("--lens", default="", help="comma-separated packed lengths (varlen); default one fixed row")
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--HV", type=int, default=8)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--set", action="append", default=[], metavar="KERNEL=FIELD:VALUE,...",
                    help="replace one kernel's config, e.g. kda_intra=BK:64,num_warps:8")
    ap.add_argument("--sass", metavar="DIR", help="also write each kernel's SASS and TTGIR there")
    ap.add_argument("--unbounded", action="store_true", help="KDA: lower_bound=None (kda_intra's UNBOUNDED form)")
    args = ap.parse_args()

    launches = []
    record_launches(launches)
    config = ops.default_config(args.K, args.V, 2, args.family)
    for spec in args.set:
        name, fields = spec.split("=", 1)
        kc = ops.KernelConfig(**{f: None if v == "None" else int(v) for f, v in
                                 (item.split(":") for item in fields.split(","))})
        config = dataclasses.replace(config, **{name: kc})
    ops.validate(config, args.K, args.V, 2, args.family)
    lens = [int(x) for x in args.lens.split(",")] if args.lens else None
    T = sum(lens) if lens else args.T
    bf = torch.bfloat16
    q, k = torch.randn(1, T, args.H, args.K, dtype=bf), torch.randn(1, T, args.H, args.K, dtype=bf)
    v = torch.randn(1, T, args.HV, args.V, dtype=bf)
    beta = torch.rand(1, T, args.HV, dtype=bf)
    cu = torch.tensor([0] + lens).cumsum(0) if lens else None
    N = len(lens) if lens else 1
    h0 = torch.zeros(N, args.HV, args.K, args.V)
    if args.family == "kda":
        g = -torch.rand(1, T, args.HV, args.K)
        ops.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, norm=args.norm,
                      lower_bound=None if args.unbounded else -5.0, config=config)
    else:
        g = -torch.rand(1, T, args.HV)
        ops.chunk_gdn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, norm=args.norm,
                      config=config)
    print(f"triton {triton.__version__}, sm_90, {args.family} {args.norm} K={args.K} V={args.V} bf16")
    for kernel, a, kw, opts in launches:
        name = kernel.fn.__name__
        try:
            res = compile_launch(kernel, a, kw, opts, args.sass)
        except Exception as e:  # report and go on: the point is to see every kernel's outcome
            cause = e.__cause__ or e  # Triton's CompilationError puts the real error in its cause
            res = f"FAILED {type(cause).__name__}: {str(cause).strip().splitlines()[-1][:200] if str(cause) else ''}"
        print(f"  {name:20s} {str(opts):52s} {res}", flush=True)


if __name__ == "__main__":
    main()

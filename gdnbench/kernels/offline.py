"""Compile every Triton kernel of chunk_gdn / chunk_kda for a GPU that is not here (sm_90, sm_100,
sm_103) at its default config, and report registers, local (spill/stack) bytes and shared memory
against the per-block limit; on sm_90 also the CUDA C++ prepare kernel (kernels/kda16_prep.cu, through
NVRTC where the nvidia-cuda-nvrtc wheel is installed).  Nothing runs: the check that a kernel builds
and fits on a device we do not have.

    python -m gdnbench.kernels.offline --arch sm_100,sm_90 [--out FILE.md] [--in-loop-sweep]

Each route (GDN and KDA; norm none / flag / fused_q / fused_qk; fixed and varlen; GDN's two-pass
and one-pass paths) runs on small CPU tensors with the op's launches intercepted; each launch is
compiled through the kernel's own JIT path (``warmup``) under a stand-in driver that names the
target, so the argument specialization (constexprs, 16-byte divisibility) is the one a real launch
of this shape gets.  Registers and local bytes are read from the cubin with the wheel's cuobjdump;
shared bytes are Triton's ``metadata.shared``, which its launcher checks against the device limit.
A kernel with local bytes (its stack frame, where spills go) is "spills".  ``--in-loop-sweep`` compiles
GDN's opt-in in_loop kernel (kernels/fused_fwd.py) at a list of candidate configs instead.
CPU-heavy (tens of compiles): a tool, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..vocab import NORM_MODES

ARCHS = {"sm_90": 90, "sm_100": 100, "sm_103": 103}
# opt-in shared memory per block: 227 KB on H100/H200 (sm_90) and B200/GB200/B300/GB300 (sm_100/sm_103)
SMEM_LIMIT = {90: 232448, 100: 232448, 103: 232448}
REGISTERS_PER_BLOCK = 64 * 1024
FLAGS = ("IS_VARLEN", "PER_CHANNEL", "FUSE_Q", "FUSE_K", "NORM_Q", "NORM_K", "FIXUP", "DOT_BF16", "USE_H0",
         "STORE_HT", "IN_LOOP_AQK", "UNBOUNDED")


@dataclass(frozen=True)
class Row:
    """One compiled specialization: a kernel at one set of constexprs and launch options."""

    kernel: str
    specialization: str
    options: str
    routes: tuple[str, ...]
    registers: int | None = None
    threads: int = 0
    local_bytes: int | None = None
    shared_bytes: int | None = None
    limit: int = 0
    error: str = ""

    @property
    def verdict(self) -> str:
        if self.error:
            return "FAILED"
        if self.shared_bytes > self.limit:
            return "over shared"
        if self.registers * self.threads > REGISTERS_PER_BLOCK:
            return "over registers"
        if self.local_bytes:
            return "spills"
        return "fits"


def specialization(kwargs: dict) -> str:
    """The boolean constexprs that are set, the label of a kernel's variant ("plain" if none)."""
    on = [f for f in FLAGS if kwargs.get(f) is True]
    return "+".join(on) or "plain"


class _TargetDriver:
    """Just enough of a Triton driver for JITFunction.warmup to compile for ``arch``; the device id is
    the arch, so JIT caches of different targets never mix."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget
        self.arch, self.target = arch, GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return self.arch

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


@contextlib.contextmanager
def target_driver(arch: int):
    from triton.runtime.driver import driver
    previous = driver._active  # reset_active() would build the default driver, which needs a GPU
    driver.set_active(_TargetDriver(arch))
    try:
        yield
    finally:
        driver._active = previous


def routes():
    """(label, family, norm, varlen, one_pass, in_loop) of every route whose kernels differ in specialization;
    GDN's one-pass path also in its opt-in in_loop forms ("wu_aqk" takes norm none / flag only), KDA's also in
    16-token tiles (in_loop "chunk16": GDNConfig.kda_chunk16)."""
    for family in ("gdn", "kda"):
        for norm in NORM_MODES:
            for varlen in (False, True):
                paths = [(None, None), (True, None), (None, "chunk16")]  # KDA: also both in one pass, 16-token tiles
                if family == "gdn":
                    paths = [(False, None), (True, None), (True, "wu")]
                    paths += [(True, "wu_aqk")] if norm in ("none", "flag") else []
                for one_pass, in_loop in paths:
                    path = "" if one_pass is None else (" 1-pass" if one_pass else " 2-pass")
                    path += (" 16-token tiles" if in_loop == "chunk16" else f" in-loop {in_loop}") if in_loop else ""
                    yield (f"{family} {norm}{' varlen' if varlen else ''}{path}", family, norm, varlen, one_pass,
                           in_loop)


def _recording(ops):
    """(launches, label cell, restore): ops._launch intercepted, each launch recorded under the label."""
    launches, label = [], [""]

    def intercept(kernel, grid, cfg, *args, hooks=True, **kwargs):
        launches.append((label[0], kernel, grid, cfg, args, kwargs))

    real, ops._launch = ops._launch, intercept
    return launches, label, lambda: setattr(ops, "_launch", real)


def record(K: int = 128, V: int = 128, arch: int = 90) -> list:
    """(route, kernel, grid, cfg, args, kwargs) of every launch of every route, bf16, nothing run, as a GPU of
    ``arch`` launches them (fused_qk's output fix-up launch: sm_100 and later)."""
    import torch

    from . import ops
    launches, label, restore = _recording(ops)
    fixup, ops._fixup_output = ops._fixup_output, lambda device: arch >= 100
    try:
        for label[0], family, norm, varlen, one_pass, in_loop in routes():
            _run_route(ops, torch, family, norm, varlen, one_pass, K, V, in_loop=in_loop)
    finally:
        restore()
        ops._fixup_output = fixup
    return launches


# candidate configs of the in_loop kernel (fused_state_out_kernel) for --in-loop-sweep: (BK, BV, warps, stages)
IN_LOOP_CANDIDATES = ((None, 32, 4, 2), (None, 32, 4, 3), (128, 32, 4, 2), (128, 32, 4, 3), (None, 64, 4, 2),
                      (None, 64, 8, 2), (None, 64, 8, 3), (128, 64, 8, 2), (None, 128, 8, 2), (None, 128, 16, 2))


def record_in_loop_sweep(K: int = 128, V: int = 128) -> list:
    """The launches of fused_state_out_kernel, both in_loop forms, norm flag, fixed length, at each of
    IN_LOOP_CANDIDATES (bf16, nothing run)."""
    import torch

    from . import ops
    from .config import KernelConfig
    launches, label, restore = _recording(ops)
    try:
        for form in ("wu", "wu_aqk"):
            for bk, bv, warps, stages in IN_LOOP_CANDIDATES:
                label[0] = f"gdn flag 1-pass in-loop {form} BK={bk} BV={bv}"
                cfg = KernelConfig(BK=bk, BV=bv, num_warps=warps, num_stages=stages)
                _run_route(ops, torch, "gdn", "flag", False, True, K, V, in_loop=form, fused_out=cfg)
    finally:
        restore()
    return [x for x in launches if x[1].fn.__name__ == "fused_state_out_kernel"]


def _run_route(ops, torch, family, norm, varlen, one_pass, K, V, H=4, HV=8, in_loop=None, fused_out=None):
    lens = [96, 160] if varlen else None  # T = 256 either way (a multiple of 16, like most real T)
    T, N = 256, (len(lens) if lens else 1)
    bf = torch.bfloat16
    q, k = torch.randn(1, T, H, K, dtype=bf), torch.randn(1, T, H, K, dtype=bf)
    v, beta = torch.randn(1, T, HV, V, dtype=bf), torch.rand(1, T, HV, dtype=bf)
    cu = torch.tensor([0] + lens).cumsum(0) if lens else None
    h0 = torch.zeros(N, HV, K, V)
    config = ops.default_config(K, V, 2, family)
    if family == "kda":
        g = -torch.rand(1, T, HV, K)
        # the bounded form (the contract shapes' gates), then the unbounded one; chunk_kda's own default config
        # for each (the unbounded form's takes more warps)
        if one_pass or in_loop == "chunk16":  # the one pass is the same for both gate forms; 16-token tiles are
            # bounded only: the bounded form, that path on
            ops.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, norm=norm,
                          lower_bound=-5.0,
                          config=dataclasses.replace(config, one_pass=one_pass, kda_chunk16=in_loop == "chunk16"))
            return
        for lower_bound in (-5.0, None):
            ops.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, norm=norm,
                          lower_bound=lower_bound)
    else:
        g = -torch.rand(1, T, HV)
        config = dataclasses.replace(config, one_pass=one_pass, in_loop=in_loop,
                                     fused_out=fused_out or config.fused_out)
        ops.chunk_gdn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, norm=norm,
                      config=config)


def _options(cfg) -> dict:
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.maxnreg is not None:
        opts["maxnreg"] = cfg.maxnreg
    return opts


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, local bytes per thread: stack frame, where spills go, plus local arrays) of a cubin's one
    kernel, from the Triton wheel's cuobjdump.  Its LOCAL alone stays 0 for a spilling kernel: fp32
    fused_state_out_kernel at BV 16 printed REG:32 STACK:14192 LOCAL:0."""
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?LOCAL:(\d+)", out)
    if not m:
        raise RuntimeError(f"cuobjdump gave no resource usage: {out.strip()[-200:]}")
    return int(m.group(1)), int(m.group(2)) + int(m.group(3))


def compile_all(arch: int, launches: list, progress=None) -> list[Row]:
    """One Row per distinct (kernel, constexprs, options), with every route that launches it."""
    groups: dict = {}
    for route, kernel, grid, cfg, args, kwargs in launches:
        opts = _options(cfg)
        key = (kernel.fn.__name__, tuple(sorted((k, str(v)) for k, v in kwargs.items())),
               tuple(type(a).__name__ if a is None else str(getattr(a, "dtype", "")) for a in args),
               tuple(sorted(opts.items())))
        groups.setdefault(key, [kernel, grid, args, kwargs, opts, []])[5].append(route)
    rows = []
    with target_driver(arch):
        for kernel, grid, args, kwargs, opts, used in groups.values():
            rows.append(_compile_one(arch, kernel, grid, args, kwargs, opts, tuple(used)))
            if progress:
                progress(rows[-1])
    return rows


@contextlib.contextmanager
def _native_stderr():
    """Collect what the compiler's C++ side writes to fd 2 (MLIR diagnostics, IR dumps of a failed
    pass): the yielded list holds that text once the block has exited."""
    sys.stderr.flush()
    saved, text = os.dup(2), []
    with tempfile.TemporaryFile("w+") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield text
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            text.append(f.read())


def _mlir_failure(log: str) -> str:
    """'Pass: first error' of a failed MLIR pipeline from its stderr, '' if none is named."""
    passes = re.findall(r"Pipeline failed while executing \[`(\w+)`", log)
    errors = re.findall(r"error: (?!Failures have been detected)(.*)", log)
    return f"{passes[0]}: {errors[0].strip()[:120] if errors else ''}" if passes else ""


def _compile_one(arch, kernel, grid, args, kwargs, opts, used) -> Row:
    base = dict(kernel=kernel.fn.__name__, specialization=specialization(kwargs),
                options=" ".join(f"{k}={v}" for k, v in opts.items()), routes=used,
                threads=32 * opts["num_warps"], limit=SMEM_LIMIT[arch])
    failure = None
    with _native_stderr() as log:
        try:
            compiled = kernel.warmup(*args, grid=grid, **kwargs, **opts)
            regs, local = resource_usage(compiled.asm["cubin"])
        except Exception as e:  # a failure is a row: the point is every kernel's outcome
            failure = e.__cause__ or e  # Triton's CompilationError keeps the real error in its cause
    if failure is not None:
        lines = str(failure).strip().splitlines()
        return Row(**base, error=_mlir_failure(log[0]) or f"{type(failure).__name__}: "
                   f"{lines[-1][:160] if lines else ''}")
    return Row(**base, registers=regs, local_bytes=local, shared_bytes=compiled.metadata.shared)


def compress_routes(used: tuple[str, ...]) -> str:
    """Routes as 'family norm[,norm..] [varlen] [path]' groups, one per distinct suffix."""
    groups: dict = {}
    for r in dict.fromkeys(used):
        family, norm, *rest = r.split(" ")
        groups.setdefault((family, " ".join(rest)), []).append(norm)
    return "; ".join(f"{f} {','.join(n)}{' ' + rest if rest else ''}" for (f, rest), n in groups.items())


def table(rows: list[Row]) -> str:
    """A markdown table of the rows, then one line counting verdicts."""
    head = "| kernel | specialization | options | registers | local B | shared B | limit B | verdict | routes |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        if r.error:
            cells = [r.kernel, r.specialization, r.options, "", "", "", str(r.limit), f"FAILED ({r.error})"]
        else:
            cells = [r.kernel, r.specialization, r.options, str(r.registers), str(r.local_bytes),
                     str(r.shared_bytes), str(r.limit), r.verdict]
        lines.append("| " + " | ".join(cells + [compress_routes(r.routes)]) + " |")
    counts: dict = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    kernels = len({r.kernel for r in rows})
    lines.append("")
    lines.append(f"{kernels} kernels, {len(rows)} specializations: "
                 + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    return "\n".join(lines)


def header(arch: int, sweep: bool = False) -> str:
    import torch
    import triton
    from triton.backends.nvidia.compiler import get_ptxas
    ptxas = get_ptxas(arch)
    release = re.search(r"V[\d.]+", subprocess.run([ptxas.path, "--version"], capture_output=True, text=True).stdout)
    return (f"Offline compile for sm_{arch} (nothing run): Triton {triton.__version__}, torch {torch.__version__}, "
            f"{os.path.basename(ptxas.path)} {release.group(0) if release else ptxas.version}; bf16, K = V = 128, "
            + ("fused_state_out_kernel at each of offline.IN_LOOP_CANDIDATES (norm flag, fixed length)" if sweep else
               "default configs (kernels/config.py default_config)")
            + ", B 1, T 256, H 4, HV 8, varlen lengths 96,160.")


def _nvrtc():
    """libnvrtc from the nvidia-cuda-nvrtc wheel (a test dependency), or None where it is not installed."""
    import ctypes
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except ModuleNotFoundError:
        return None
    dirs = spec.submodule_search_locations or [] if spec else []
    libs = sorted(p for d in dirs for p in (Path(d) / "lib").glob("libnvrtc.so*")
                  if "builtins" not in p.name and ".alt." not in p.name)
    return ctypes.CDLL(str(libs[0])) if libs else None


def _nvrtc_ptx(lib, source: str, arch: int, options: list[str]) -> str:
    import ctypes

    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kda16_prep.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture=compute_{arch}", *options]
    arr = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
    ok = lib.nvrtcCompileProgram(prog, len(opts), arr) == 0
    size = ctypes.c_size_t()
    (lib.nvrtcGetPTXSize if ok else lib.nvrtcGetProgramLogSize)(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    (lib.nvrtcGetPTX if ok else lib.nvrtcGetProgramLog)(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if not ok:
        raise RuntimeError(buf.value.decode().strip()[-300:])
    return buf.value.decode()


def compile_cuda(arch: int) -> list[Row]:
    """kernels/kda16_prep.cu (the CUDA C++ prepare kernel, kernels/kda16_cuda.py) under every norm mode, dense and
    packed: NVRTC to PTX, the Triton wheel's ptxas to a cubin.  Empty where NVRTC is not installed."""
    from triton.backends.nvidia.compiler import get_ptxas

    from . import kda16_cuda
    lib = _nvrtc()
    if lib is None:
        return []
    rows = []
    for norms, (norm_q, norm_k) in ((("none", "flag"), (0, 0)), (("fused_q",), (1, 0)), (("fused_qk",), (1, 1))):
        for varlen in (False, True):
            defines = dict(NORM_Q=norm_q, NORM_K=norm_k, VARLEN=int(varlen))
            base = dict(kernel="kda16_prep_cuda", specialization="+".join(k for k, v in defines.items() if v) or "plain",
                        options=f"{32 * kda16_cuda.WARPS} threads",
                        routes=tuple(f"kda {n}{' varlen' if varlen else ''} 16-token tiles (CUDA)" for n in norms),
                        threads=32 * kda16_cuda.WARPS, limit=SMEM_LIMIT[arch])
            try:
                ptx = _nvrtc_ptx(lib, kda16_cuda.SOURCE.read_text(), arch,
                                 kda16_cuda.compile_options(norm_q, norm_k, varlen))
                with tempfile.TemporaryDirectory() as d:
                    Path(d, "k.ptx").write_text(ptx)
                    r = subprocess.run([get_ptxas(arch).path, f"-arch=sm_{arch}", "-v", f"{d}/k.ptx", "-o",
                                        f"{d}/k.cubin"], capture_output=True, text=True)
                    if r.returncode:
                        raise RuntimeError(r.stderr.strip()[-300:])
                    regs, local = resource_usage(Path(d, "k.cubin").read_bytes())
                smem = re.search(r"(\d+) bytes smem", r.stderr)
                rows.append(Row(**base, registers=regs, local_bytes=local, shared_bytes=int(smem.group(1)) if smem else 0))
            except Exception as e:  # a failure is a row
                rows.append(Row(**base, error=f"{type(e).__name__}: {str(e).splitlines()[-1][:160] if str(e) else ''}"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gdnbench.kernels.offline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_100", help=f"comma-separated, of {', '.join(ARCHS)}")
    ap.add_argument("--out", help="also write the tables (markdown) to this file")
    ap.add_argument("--in-loop-sweep", action="store_true",
                    help="instead: fused_state_out_kernel (GDNConfig.in_loop) at each of IN_LOOP_CANDIDATES")
    a = ap.parse_args(argv)
    bad = [x for x in a.arch.split(",") if x not in ARCHS]
    if bad:
        print(f"--arch: {bad[0]!r} is not one of {', '.join(ARCHS)}", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("TRITON_INTERPRET=1: the interpreter compiles nothing; unset it", file=sys.stderr)
        return 2
    from . import kda16_cuda
    sections, ok = [], True
    for arch in (ARCHS[x] for x in a.arch.split(",")):
        launches = record_in_loop_sweep() if a.in_loop_sweep else record(arch=arch)
        print(header(arch, a.in_loop_sweep), file=sys.stderr, flush=True)
        rows = compile_all(arch, launches, progress=lambda r: print(
            f"  {r.kernel:18s} {r.specialization:36s} {r.verdict}", file=sys.stderr, flush=True))
        if not a.in_loop_sweep and divmod(arch, 10) in kda16_cuda.CAPABILITIES:  # where the CUDA C++ kernel runs
            rows += compile_cuda(arch)
        sections.append(f"## sm_{arch}\n\n" + header(arch, a.in_loop_sweep) + "\n\n" + table(rows) + "\n")
        ok = ok and all(r.verdict == "fits" for r in rows)
    text = "\n".join(sections)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

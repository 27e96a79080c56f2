"""Carry tuned cache entries across a kernel edit that left their compiled code alone.

An edit to a kernel file changes the source hash of every entry of that kernel, though for most
specializations (constexpr branches compiled out, a helper that compiles to its argument) the
machine code is the same.  For each entry whose source hash is the old tree's and not this tree's,
this compiles the entry's winning config offline for sm_90 (no GPU; run it with the device's Triton)
in both trees, in every forward path that launches the kernel (``run_paths``: GDN's aqk in the one-pass
and the in-loop forms), and when the PTX (line info stripped) and the SASS of every launch of the kernel are
identical, moves the entry to this tree's hash, recording the old hash and why under "rekeyed" (an
earlier record nested under its "before").
Entries whose code changed are listed and left stale for `gdnbench autotune`.

    git archive <old-rev> gdnbench | tar -x -C /tmp/old
    python -m gdnbench.autotune.rekey --old /tmp/old [--write] [--cache DIR]

Each tree compiles in its own child process (each has its own ``gdnbench``), serially; the launches
are recorded by intercepting ``ops._launch`` and compiled as gdnbench.kernels.offline does (the
kernel's own JIT path under a stand-in sm_90 driver).  The child runs this file by path with
PYTHONPATH=<tree>, so it imports only ``gdnbench`` modules both trees have.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ARCH = 90
THIS_TREE = Path(__file__).resolve().parents[2]

Digests = Callable[[dict], "list[str] | str"]  # entry -> launch digests, or the reason none came


@dataclass(frozen=True)
class Outcome:
    """What became of one entry: rekeyed, stale (code changed / compile failed) or skipped."""

    kernel: str
    label: str
    action: str
    reason: str = ""


def entry_label(entry: dict) -> str:
    key = entry["key"]
    return f"{key['variant']} {key['shape_key']}"


def decide(entry: dict, old_hash: str, new_hash: str, triton_version: str,
           old_digests: Digests, new_digests: Digests) -> Outcome:
    """The outcome of one entry (pure but for the two digest functions, called only when needed)."""
    kernel, key, label = entry["kernel"], entry["key"], entry_label(entry)
    if key.get("source_hash") == new_hash:
        return Outcome(kernel, label, "skipped", "current already")
    if key.get("source_hash") != old_hash:
        return Outcome(kernel, label, "skipped", "stale before the old tree, left as it is")
    if key.get("triton") != triton_version:
        return Outcome(kernel, label, "skipped",
                       f"tuned with Triton {key.get('triton')}, compiling with {triton_version}")
    a = old_digests(entry)
    b = new_digests(entry) if isinstance(a, list) else ""
    if isinstance(a, str) or isinstance(b, str):
        return Outcome(kernel, label, "stale", f"compile failed: {a if isinstance(a, str) else b}")
    if not a or a != b:
        return Outcome(kernel, label, "stale", "code changed: " + ", ".join(x for x in b if x not in a))
    return Outcome(kernel, label, "rekeyed", ", ".join(b))


def rekey_entries(entries: list[dict], old_hash: str, new_hash: str, triton_version: str,
                  old_digests: Digests, new_digests: Digests) -> list[Outcome]:
    """Decide every entry; move the identical ones to ``new_hash`` in place (with a "rekeyed" record)."""
    outcomes = []
    for e in entries:
        o = decide(e, old_hash, new_hash, triton_version, old_digests, new_digests)
        if o.action == "rekeyed":
            e["key"]["source_hash"] = new_hash
            record = {"from": old_hash, "why": f"identical sm_{ARCH} PTX and SASS of the winning config "
                      f"(Triton {triton_version}, offline): {o.reason}"}
            if "rekeyed" in e:  # an earlier move (its own why) stays readable behind this one
                record["before"] = e["rekeyed"]
            e["rekeyed"] = record
        outcomes.append(o)
    return outcomes


# ----------------------------------------------------------------------------- compiling (child side)
def normalized_code(ptx: str, sass: str) -> str:
    """PTX without line info (.loc/.file, debug sections and their labels) + the SASS instructions only."""
    body = ptx.split("\t.section\t.debug", 1)[0]
    keep = [ln for ln in body.splitlines()
            if not re.match(r"\s*(\.loc|\.file|\$L__(tmp|func_begin|func_end)\d+:)", ln)]
    instructions = [ln.strip() for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    return "\n".join(keep) + "\0" + "\n".join(instructions)


def dump_sass(cubin: bytes) -> str:
    import tempfile

    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout


def launch_digests(kernel: str, shape: dict | None, route: str, point: dict, tokens: int) -> list[str]:
    """'<jit function>:<sha256 prefix>' of every main (non fix-up) launch of ``kernel`` when the route
    runs at ``point`` on a small stand-in of the shape (``shape``: the fields of its parsed shape key:
    same family, K, V, heads, dtype, mix, and token count modulo 16, which Triton specializes on)."""
    import torch

    from gdnbench.kernels import offline, ops, tuned

    if shape is None:
        raise ValueError("its shape key names no shape")
    family, K, V = shape["family"], shape["K"], shape["V"]
    dt = getattr(torch, shape["dtype"])
    cfg = ops.default_config(K, V, dt.itemsize, family)
    cfg = dataclasses.replace(cfg, **{kernel: tuned.kernel_config(kernel, point)})
    launches = []
    for path in run_paths(kernel, family, route, cfg, tuned):
        launches += _recorded_launches(ops, torch, family, shape, route, path, tokens, dt)
    names = set(tuned.KERNEL_FUNCTIONS[kernel][1])
    out = []
    with offline.target_driver(ARCH):
        for kern, grid, c, a, kw in launches:
            if kern.fn.__name__ in names and not kw.get("FIXUP", False):  # fix-up launches are not tuned
                compiled = kern.warmup(*a, grid=grid, **kw, **offline._options(c))
                code = normalized_code(compiled.asm["ptx"], dump_sass(compiled.asm["cubin"]))
                out.append(f"{kern.fn.__name__}:" + hashlib.sha256(code.encode()).hexdigest()[:20])
    return out


def run_paths(kernel: str, family: str, route: str, cfg, tuned) -> list:
    """The configs of every forward path that launches ``kernel`` (``cfg`` holds its point): an entry is carried
    only if each of them compiles to the same code.  GDN's aqk runs in the one-pass path and in the in-loop one,
    where under fused_qk it also puts k's rstd on Aqk's columns and, when the loop reads it, writes the k tile."""
    if family == "kda":
        if kernel == "kda_state_out":
            return [dataclasses.replace(cfg, one_pass=True)]
        if kernel in getattr(tuned, "KDA16_KERNELS", ()):  # (older trees have no 16-token form)
            return [dataclasses.replace(cfg, kda_chunk16=True)]
        return [cfg]
    paths = [dataclasses.replace(cfg, one_pass=kernel in tuned.ONE_PASS_KERNELS, in_loop=tuned.IN_LOOP_OF.get(kernel))]
    if kernel == "aqk":
        loop = dataclasses.replace(cfg, one_pass=True, in_loop="wu")
        paths.append(loop)
        if route == "fused_qk" and hasattr(cfg.fused_out, "k_rstd_tile"):
            paths.append(dataclasses.replace(loop, fused_out=dataclasses.replace(cfg.fused_out, k_rstd_tile=True)))
    return paths


def _recorded_launches(ops, torch, family, shape, route, cfg, tokens, dt) -> list:
    """The launches (kernel, grid, config, args, kwargs) of one forward on a small stand-in of the shape."""
    H, HV, K, V = shape["H"], shape["HV"], shape["K"], shape["V"]
    lens = [100, 200 + (tokens - 300) % 16] if shape["varlen"] else None
    T = sum(lens) if lens else 256 + tokens % 16
    q, k = torch.randn(1, T, H, K, dtype=dt), torch.randn(1, T, H, K, dtype=dt)
    v, beta = torch.randn(1, T, HV, V, dtype=dt), torch.rand(1, T, HV, dtype=dt)
    cu = torch.tensor([0] + lens).cumsum(0) if lens else None
    h0 = torch.zeros(len(lens) if lens else 1, HV, K, V)
    norm = "none" if route == "explicit" else route
    launches = []
    real = ops._launch
    ops._launch = lambda kern, grid, c, *a, hooks=True, **kw: launches.append((kern, grid, c, a, kw))
    try:
        if family == "kda":  # the bounded form: the one tuned
            ops.chunk_kda(q, k, v, -torch.rand(1, T, HV, K), beta, initial_state=h0, output_final_state=True,
                          cu_seqlens=cu, norm=norm, lower_bound=-5.0, config=cfg)
        else:
            ops.chunk_gdn(q, k, v, -torch.rand(1, T, HV), beta, initial_state=h0, output_final_state=True,
                          cu_seqlens=cu, norm=norm, config=cfg)
    finally:
        ops._launch = real
    return launches


# ----------------------------------------------------------------------------- parent side
def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a child that imports ``tree``'s gdnbench.  The path is absolute: the child runs
    in the tree, so a relative one would miss it and the installed gdnbench would be imported instead."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    env.pop("TRITON_INTERPRET", None)
    return env


def tree_digests(tree: Path, entries: list[dict]) -> Digests:
    """Digests of entries compiled in ``tree``: one child process (PYTHONPATH=tree) compiles all of
    ``entries`` serially on first use (one import of torch and the kernels, not one per entry)."""
    done: dict[int, list[str] | str] = {}

    def compile_all() -> None:
        from gdnbench.kernels.cache_key import ShapeKey  # this tree's: the child imports only what both trees have

        shapes = [ShapeKey.parse(e["key"]["shape_key"]) for e in entries]
        jobs = [[e["kernel"], s and dataclasses.asdict(s), e["route"], e["best"]["config"],
                 e.get("shape", {}).get("tokens", 256)] for e, s in zip(entries, shapes)]
        r = subprocess.run([sys.executable, __file__, "--child", json.dumps(jobs)], capture_output=True, text=True,
                           env=tree_env(tree), cwd=str(tree))
        if r.returncode:
            why = (r.stderr.strip().splitlines() or ["?"])[-1][:200]
            done.update({id(e): why for e in entries})
        else:
            done.update(zip(map(id, entries), json.loads(r.stdout.strip().splitlines()[-1])))

    def run(entry: dict) -> list[str] | str:
        if not done:
            compile_all()
        return done.get(id(entry), "not compiled")
    return run


def child(jobs: list) -> list:
    """Each job's digests, or its error as one line."""
    out = []
    for job in jobs:
        try:
            out.append(launch_digests(*job))
        except Exception as e:  # a failure is an outcome: the entry stays stale with the reason
            cause = e.__cause__ or e
            lines = str(cause).strip().splitlines()
            out.append(f"{type(cause).__name__}: {lines[-1][:160] if lines else ''}")
    return out


def source_hashes(tree: Path) -> dict[str, str]:
    """kernel -> source hash, as ``tree``'s gdnbench computes it."""
    code = ("import json; from gdnbench.kernels import tuned; "
            "print(json.dumps({k: tuned.source_hash(k) for k in tuned.KERNELS}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tree),
                       env=tree_env(tree), check=True)
    return json.loads(r.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gdnbench.autotune.rekey", description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="root of the old tree (holding its gdnbench/ package)")
    ap.add_argument("--cache", help="the cache root (default: the shipped kernels/tuned_configs)")
    ap.add_argument("--write", action="store_true", help="rewrite the cache files (else only report)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    old = Path(a.old or "")
    if not a.old or not (old / "gdnbench" / "kernels" / "tuned.py").is_file():
        print(f"--old: {a.old!r} holds no gdnbench/kernels/tuned.py", file=sys.stderr)
        return 2
    cache = Path(a.cache) if a.cache else THIS_TREE / "gdnbench" / "kernels" / "tuned_configs"
    if not cache.is_dir():
        print(f"--cache: {str(cache)!r} is not a directory", file=sys.stderr)
        return 2
    import triton

    start = time.monotonic()
    old_hash, new_hash = source_hashes(old), source_hashes(THIS_TREE)
    counts: dict[str, int] = {}
    for path in sorted(cache.glob("*/*.json")):
        doc = json.loads(path.read_text())
        kernel = doc.get("kernel")
        if kernel not in new_hash or old_hash.get(kernel) == new_hash[kernel]:
            continue
        entries = doc.get("entries", [])
        todo = [e for e in entries if e["key"].get("source_hash") == old_hash.get(kernel)]
        outcomes = rekey_entries(entries, old_hash.get(kernel, ""), new_hash[kernel], triton.__version__,
                                 tree_digests(old, todo), tree_digests(THIS_TREE, todo))
        for o in outcomes:
            counts[o.action] = counts.get(o.action, 0) + 1
            print(f"{o.kernel:12s} {o.label}: {o.action} ({o.reason})", flush=True)
        if a.write and any(o.action == "rekeyed" for o in outcomes):
            path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{', '.join(f'{n} {k}' for k, n in sorted(counts.items())) or 'nothing to do'} "
          f"in {time.monotonic() - start:.0f} s (Triton {triton.__version__}, sm_{ARCH})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

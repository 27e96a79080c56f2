"""Carry autotune cache entries across a kernel edit that left their compiled code alone.

An edit to a kernel file changes the source hash of every entry of that kernel, though for most
specializations (constexpr branches compiled out) the machine code is the same.  For each entry
whose source hash is the old tree's and not this tree's, this compiles the entry's winning config
offline for sm_90 (no GPU; run it with the Triton of the device, e.g. 3.6) in both trees, and when
the PTX (line info stripped) and the SASS of every launch of the kernel are identical, moves the
entry to this tree's hash, recording the old hash and why under "rekeyed".  Entries whose code
changed are listed and left stale for `gdnbench autotune`.

    git archive <old-rev> gdnbench | tar -x -C /tmp/old
    /tmp/t36/bin/python scripts/rekey_identical.py --old /tmp/old [--write]
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _digests(tree: str, kernel: str, shape: dict, route: str, point: dict) -> list[str]:
    """(child process, PYTHONPATH=tree) sha256 of PTX and SASS of every main launch of ``kernel``."""
    sys.path.insert(0, tree)
    import dataclasses

    import torch

    from gdnbench.kernels import ops, tuned
    sys.path.insert(0, str(ROOT / "scripts"))
    from offline_compile import record_launches

    shape = argparse.Namespace(**shape)
    elt = {"float32": 4}.get(shape.dtype, 2)
    cfg = ops.default_config(shape.K, shape.V, elt, shape.family)
    cfg = dataclasses.replace(cfg, **{kernel: tuned.kernel_config(kernel, point)})
    if hasattr(cfg, "one_pass") and shape.family == "gdn":  # GDN: take the path that runs ``kernel``
        cfg = dataclasses.replace(cfg, one_pass=kernel in tuned.ONE_PASS_KERNELS)
    launches = []
    record_launches(launches)
    dt = getattr(torch, shape.dtype)
    lens = [100, 200] if shape.varlen else None
    T = 300 if lens else 256
    q, k = torch.randn(1, T, shape.H, shape.K, dtype=dt), torch.randn(1, T, shape.H, shape.K, dtype=dt)
    v, beta = torch.randn(1, T, shape.HV, shape.V, dtype=dt), torch.rand(1, T, shape.HV, dtype=dt)
    cu = torch.tensor([0] + lens).cumsum(0) if lens else None
    h0 = torch.zeros(len(lens) if lens else 1, shape.HV, shape.K, shape.V)
    norm = "none" if route == "explicit" else route
    if shape.family == "kda":
        ops.chunk_kda(q, k, v, -torch.rand(1, T, shape.HV, shape.K), beta, initial_state=h0, output_final_state=True,
                      cu_seqlens=cu, norm=norm, lower_bound=-5.0, config=cfg)
    else:
        ops.chunk_gdn(q, k, v, -torch.rand(1, T, shape.HV), beta, initial_state=h0, output_final_state=True,
                      cu_seqlens=cu, norm=norm, config=cfg)
    names = set(tuned.KERNEL_FUNCTIONS[kernel][1])
    out = []
    for kern, a, kw, opts in launches:
        if kern.fn.__name__ in names and not kw.get("FIXUP", False):  # the fix-up launches: not tuned
            out.append(_compiled_digest(kern, a, {n: x for n, x in kw.items() if n != "hooks"}, opts))
    return out


def _compiled_digest(kern, a, kw, opts) -> str:
    from offline_compile import compile_sm90
    from offline_gdn_identity import normalized_code

    ptx, sass = normalized_code(compile_sm90(kern, a, kw, opts))
    return f"{kern.fn.__name__}:" + hashlib.sha256((ptx + "\0" + sass).encode()).hexdigest()[:20]


def digests(tree: str, entry: dict) -> list[str] | str:
    """The entry's launch digests compiled in ``tree`` (a child process: each tree has its gdnbench)."""
    from gdnbench.data import shapes

    s = next(s for s in shapes.load(entry["shape"]["set"]).shapes if s.id == entry["shape"]["id"])
    shape = dict(family=s.family, K=s.K, V=s.V, H=s.H, HV=s.HV, dtype=s.dtype, varlen=s.varlen)
    job = json.dumps([tree, entry["kernel"], shape, entry["route"], entry["best"]["config"]])
    r = subprocess.run([sys.executable, __file__, "--child", job], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": tree})
    if r.returncode:
        return "compile failed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:200]
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", help="root of the old tree (its gdnbench/ package)")
    ap.add_argument("--cache", default=str(ROOT / "results" / "tuned" / "nvidia-h200"))
    ap.add_argument("--write", action="store_true", help="rewrite the cache files (else only report)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_digests(*json.loads(args.child))))
        return
    sys.path.insert(0, str(ROOT))
    from gdnbench.kernels import tuned

    old_hash = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from gdnbench import tuned; "
         "print(json.dumps({k: tuned.source_hash(k) for k in tuned.KERNELS}))"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": args.old}, cwd=args.old, check=True).stdout)
    import triton
    for path in sorted(Path(args.cache).glob("*.json")):
        doc = json.loads(path.read_text())
        kernel, changed = doc["kernel"], False
        new_hash = tuned.source_hash(kernel)
        for e in doc["entries"]:
            key = e["key"]
            what = f"{kernel:12s} {key['variant']:8s} {key['shape_key']}"
            if key["source_hash"] == new_hash:
                continue
            if key["source_hash"] != old_hash[kernel]:
                print(f"{what}: stale before the edit, left as it is")
                continue
            if key.get("triton") != triton.__version__:
                print(f"{what}: tuned with Triton {key.get('triton')}, compiling with {triton.__version__}: skipped")
                continue
            a, b = digests(args.old, e), digests(str(ROOT), e)
            if isinstance(a, list) and a and a == b:
                key["source_hash"] = new_hash
                e["rekeyed"] = {"from": old_hash[kernel], "why": f"identical sm_90 PTX and SASS of the winning "
                                f"config (Triton {triton.__version__}, offline): {', '.join(b)}"}
                changed = True
                print(f"{what}: identical code, re-keyed")
            else:
                print(f"{what}: code changed ({a if isinstance(a, str) else ''}{b if isinstance(b, str) else ''}),"
                      " left stale")
        if changed and args.write:
            path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

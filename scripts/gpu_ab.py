#!/usr/bin/env python
"""A/B of two trees of our kernels on the GPU: the whole forward of each route, both trees run with
the same stage configs (the autotune cache's winners as the old tree resolves them), on one shape set.

    git archive HEAD gdnbench | tar -x -C /tmp/old && mv /tmp/old/gdnbench /tmp/old/gdnbench_old
    python scripts/gpu_ab.py --old /tmp/old --shapes kda-legacy6 --routes explicit,fused_q,fused_qk
    python scripts/gpu_ab.py --old /tmp/old --new-config output_fused=output   # a stage's config from another
    python scripts/gpu_ab.py --old /tmp/old --shapes gdn-qwen6 --shape-id h16_hv32_fixed8k --routes fused_qk

A kernel edit makes its cache entries stale for the new tree, so `gdnbench run` alone would compare a
tuned old tree with a default new one; here both get the old tree's configs.  Per shape and route:
CUDA-graph median µs of old and new (alternated, the better of two rounds), new/old, the rel-RMS difference
of o and of the final state (new against old), and torch.profiler's per-kernel µs of both.  Geomeans of
new/old per route, and of fused / explicit per tree, close the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from gdnbench.data import inputs as inputs_mod  # noqa: E402
from gdnbench.data import shapes  # noqa: E402
from gdnbench.bench import timing
from gdnbench.kernels import tuned
from gdnbench.oracle.check import rel_rms  # noqa: E402
from gdnbench.kernels import config as cfg_mod  # noqa: E402
from gpu_gdn_check import bench_graph  # noqa: E402


def convert(cfg, take: dict[str, str]):
    """The old tree's GDNConfig as this tree's (same fields; each stage config by its class name),
    stage ``a`` given stage ``b``'s config for each a=b in ``take``."""
    kw = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, take.get(f.name, f.name))
        kw[f.name] = getattr(cfg_mod, type(v).__name__)(**dataclasses.asdict(v))
    return cfg_mod.GDNConfig(**kw)


def call_of(package: str, shape, route, x, cfg):
    """The zero-argument forward that ``package``'s gdnbench backend times, run with ``cfg``."""
    base = importlib.import_module(f"{package}.backends.gdnbench").GdnbenchBackend

    class Fixed(base):
        def _config(self, shape, route, device):
            return cfg, "fixed"

    return Fixed().prepare(shape, route, x)


def geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="directory holding the old tree's package as gdnbench_old")
    ap.add_argument("--shapes", default="kda-legacy6")
    ap.add_argument("--shape-id", default="", help="comma-separated shape ids of the set (default: all)")
    ap.add_argument("--routes", default="explicit,fused_q,fused_qk")
    ap.add_argument("--new-config", action="append", default=[], metavar="STAGE=FROM",
                    help="the new tree runs STAGE with the config of stage FROM (repeatable)")
    args = ap.parse_args()
    take = dict(s.split("=", 1) for s in args.new_config)
    sys.path.insert(0, args.old)
    old_tuned = importlib.import_module("gdnbench_old.tuned")
    routes = args.routes.split(",")
    env = tuned.device_env()
    rows = []
    ids = [i for i in args.shape_id.split(",") if i]
    chosen = [s for s in shapes.load(args.shapes).shapes if not ids or s.id in ids]
    if not chosen:
        sys.exit(f"--shape-id: none of {args.shape_id} is in {args.shapes}")
    for shape in chosen:
        x = inputs_mod.make_inputs(shape).to("cuda")
        for route in routes:
            old_cfg, label = old_tuned.tuned_config(shape, route, env, cache_dir=tuned.SHIPPED_TUNED_DIR)
            calls = {"old": call_of("gdnbench_old", shape, route, x, old_cfg),
                     "new": call_of("gdnbench", shape, route, x, convert(old_cfg, take))}
            outs = {k: fn() for k, fn in calls.items()}
            t = {"old": math.inf, "new": math.inf}
            for k in ("old", "new", "old", "new"):
                t[k] = min(t[k], bench_graph(calls[k]) * 1e3)
            split = {k: timing.profiler_kernels(fn, 5) for k, fn in calls.items()}
            d_o, d_s = rel_rms(outs["new"][0], outs["old"][0]), rel_rms(outs["new"][1], outs["old"][1])
            rows.append((shape.id, route, t["old"], t["new"], d_o, d_s))
            print(f"{shape.id:12s} {route:9s} old {t['old']:8.1f} new {t['new']:8.1f} new/old {t['new'] / t['old']:.3f}"
                  f"  diff o {d_o:.1e} state {d_s:.1e}  [{label[:60]}]", flush=True)
            for k in ("old", "new"):
                print(f"    {k}: " + "; ".join(f"{n} {us:.1f}" for n, us in split[k].items()), flush=True)
        del x
        torch.cuda.empty_cache()
    print()
    for route in routes:
        r = [row for row in rows if row[1] == route]
        print(f"geomean new/old {route:9s}: {geo([row[3] / row[2] for row in r]):.4f} over {len(r)} shapes")
    for route in routes:
        if route == "explicit":
            continue
        for i, tree in ((2, "old"), (3, "new")):
            pairs = [(a[i], b[i]) for a in rows if a[1] == route for b in rows if b[1] == "explicit" and b[0] == a[0]]
            print(f"geomean {route}/explicit {tree}: {geo([p / q for p, q in pairs]):.4f} over {len(pairs)} shapes")


if __name__ == "__main__":
    main()

"""Render the autotuner's plan and cache: dry-run rows, report table, per-entry chart.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from ..kernels import tuned
from ..kernels.cache_key import shape_key, source_hash
from .space import build_space, count_valid, KERNELS, restricted
from .plan import cached_on, entry_summary, EXHAUSTIVE_MAX, has_winner, Task, unique_shapes
from .search import is_ok


def fmt_values(values) -> str:
    """Values of a dimension, arithmetic runs of more than four written as a..b step c."""
    vals = ["none" if v is None else str(v) for v in values if v is None]
    nums = [v for v in values if v is not None]
    if len(nums) > 4 and all(b - a == nums[1] - nums[0] for a, b in zip(nums, nums[1:])):
        vals.append(f"{nums[0]}..{nums[-1]} step {nums[1] - nums[0]}")
    else:
        vals += [str(v) for v in nums]
    return ",".join(vals)


def dry_run_rows(shapes: list, tasks: list[Task], exhaustive_max: int = EXHAUSTIVE_MAX,
                 cache_dir: Path | None = None, only: tuple[str, ...] = ()) -> list[dict]:
    """Per shape key and task of its family: the dimensions, their values, the candidate counts, the
    strategy, and (with ``cache_dir``) the GPU folders whose cache holds it (:func:`cached_on`). With
    ``only``, the space restricted at the default (a run fixes the other dimensions at its first seed)."""
    rows = []
    for s in unique_shapes(shapes):
        for t in (t for t in tasks if t.family == s.family):
            space = build_space(t.kernel, s.K, s.V, s.dtype, s.family, t.variant)
            n_valid = count_valid(t.kernel, s.K, s.V, s.dtype, s.family, t.variant)
            if only:
                space = restricted(space, only, space.start)
                n_valid = len(space.valid_points())
            cached = cached_on(cache_dir, t, s) if cache_dir is not None else {}
            rows.append({
                "kernel": t.kernel, "variant": t.variant, "route": t.route, "shape_id": s.id,
                "shape_key": shape_key(s), "dims": {d: list(v) for d, v in space.dims},
                "start": space.start, "total": space.total, "valid": n_valid,
                "strategy": "exhaustive" if n_valid <= exhaustive_max else "coordinate_descent",
                "per_pass": space.pass_size(),
                "cached": {gpu: entry_summary(e) for gpu, e in cached.items()},
            })
    return rows


@dataclass
class Tally:
    """What a sweep did, counted from tune()'s events. run: searched and saved with a working config;
    failed: saved without one, or not run (the shape's worker did not start); skipped: cached;
    written: entries saved; search_s: the searches' own seconds (space, candidates, saving)."""

    run: int = 0
    skipped: int = 0
    failed: int = 0
    written: int = 0
    search_s: float = 0.0

    @staticmethod
    def sum(tallies: list["Tally"]) -> "Tally":
        """All ranks' tallies as one (search_s: the ranks' searches added up)."""
        return Tally(*(sum(getattr(t, f.name) for t in tallies) for f in dataclasses.fields(Tally)))

    def count(self, kind: str, info: dict) -> None:
        if kind == "cached":
            self.skipped += 1
        elif kind == "skip":
            self.failed += len(info["tasks"])
        elif kind == "entry":
            self.written += 1
            self.search_s += info["seconds"]
            if has_winner(info["entry"]):
                self.run += 1
            else:
                self.failed += 1


def cache_entries(cache_dir=None, kernels=None):
    """(gpu folder, entry) of every cache entry under every root of tuned.read_dirs; only ``kernels``' where
    given."""
    for path in [p for root in tuned.read_dirs(cache_dir) for p in sorted(root.glob("*/*.json"))]:
        for e in tuned.load_entries(path):
            if not kernels or e.get("kernel") in kernels:
                yield path.parent.name, e


def report_rows(cache_dir=None, kernels=None) -> list[dict]:
    """Per cache entry (:func:`cache_entries`): default vs tuned stage time, their ratio and the winning config."""
    rows = []
    for gpu, e in cache_entries(cache_dir, kernels):
        d, b = (e.get("default") or {}).get("time_us"), (e.get("best") or {}).get("time_us")
        win = tuned.winner(e)
        key = e.get("key", {})
        rows.append({
            "gpu": gpu, "kernel": e.get("kernel"), "variant": e.get("variant"),
            "shape_key": key.get("shape_key"), "shape_id": (e.get("shape") or {}).get("id"),
            "default_us": d, "tuned_us": b, "ratio": (b / d) if b and d else None,
            "winner": tuned.point_label(win) if win else "default",
            "evaluated": (e.get("search") or {}).get("evaluated"), "failed": (e.get("search") or {}).get("failed"),
            "stale": key.get("source_hash") != source_hash(e["kernel"]) if e.get("kernel") in KERNELS else True,
        })
    return rows


def report_table(cache_dir=None, kernels=None):
    """The report rows as a gdnbench.analysis.report.Table (µs; ratio = tuned / default, < 1 is faster)."""
    from ..analysis.report import Table

    def us(t):
        return "-" if t is None else f"{t:.1f}"

    rows = report_rows(cache_dir, kernels)
    body = [[r["gpu"], r["kernel"], r["variant"], r["shape_key"], us(r["default_us"]), us(r["tuned_us"]),
             "-" if r["ratio"] is None else f"{r['ratio']:.3f}", r["winner"], f"{r['evaluated']}/{r['failed']}",
             "stale" if r["stale"] else ""] for r in rows]
    notes = ["time: the stage kernel alone (CUDA-graph replay), median µs; ratio = tuned/default",
             "stale entries (kernel source changed since tuning) are ignored by gdnbench run"]
    return Table("autotuned stage kernels", ["gpu", "kernel", "variant", "shape key", "default µs", "tuned µs",
                                             "ratio", "winner", "evaluated/failed", ""], body, notes)


def tested_runs(xs: list, ticks: list, none_x) -> list[list]:
    """``xs`` (one series' tested maxnreg values, sorted) cut into runs of neighbours on ``ticks`` (every
    value some series tested): a line joins two points only when no value between them went untested
    by this series, and never joins the compiler's choice (``none_x``) to a number."""
    have, runs, cur = set(xs), [], []
    for x in ticks:
        if x in have and x != none_x:
            cur.append(x)
        else:
            runs, cur = runs + [cur] if len(cur) > 1 else runs, []
    return runs + [cur] if len(cur) > 1 else runs


def chart(entry: dict, out: str | Path) -> Path:
    """Stage time against maxnreg, markers per num_warps (best over the other dimensions), joined by a
    line only across maxnreg values that series tested side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    none_x = 256  # where 'maxnreg = None' (the compiler's choice) is drawn
    best: dict[tuple, float] = {}
    for r in entry.get("candidates", []):
        if not is_ok(r):
            continue
        c = r["config"]
        k = (c.get("num_warps"), c.get("maxnreg") if c.get("maxnreg") is not None else none_x)
        best[k] = min(best.get(k, math.inf), r["time_us"])
    if not best:
        raise ValueError("nothing to plot: no ok candidates")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ticks = sorted({k[1] for k in best})
    cmap = plt.get_cmap("tab10")
    for i, w in enumerate(sorted({k[0] for k in best})):
        pts = sorted((x, t) for (ww, x), t in best.items() if ww == w)
        ax.plot([x for x, _ in pts], [t for _, t in pts], "o", color=cmap(i % 10), label=f"{w} warps")
        for run in tested_runs([x for x, _ in pts], ticks, none_x):
            ax.plot(run, [best[(w, x)] for x in run], "-", color=cmap(i % 10))
    d = (entry.get("default") or {}).get("time_us")
    if d:
        ax.axhline(d, color="black", lw=0.8, ls="--", label="default config")
    ax.set_xticks(ticks)
    ax.set_xticklabels(["none" if x == none_x else str(x) for x in ticks], rotation=90, fontsize=7)
    ax.set_xlabel("maxnreg (none = compiler's choice)")
    ax.set_ylabel("stage time, median (µs)")
    key = entry.get("key", {})
    ax.set_title(f"{entry.get('kernel')} [{entry.get('variant')}] {key.get('shape_key')} on {key.get('gpu')}",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    from ..analysis.plot import save_figure

    return save_figure(fig, out)

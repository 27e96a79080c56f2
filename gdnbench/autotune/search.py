"""Search a space: exhaustive when small, coordinate descent otherwise; seeds from related cache entries.

Search. A space of at most ``exhaustive_max`` valid points is searched exhaustively, the points nearest the
default or a seed first (fewest dimensions changed from the closer one), so a search its budget cuts short has
tried every single change from each. (kda16_prep on the H200, 30 s budgets stopping at 32-64 of 250 points, nearest
the default alone: tf32_grams ran once per search, at the default's 4 warps, 0.70-0.74x of that default's time,
never beside the seed's 2 warps, which won at 0.61-0.64x.) Larger
ones by coordinate descent: start at the default config; sweep one dimension at a time over all
its values with the others fixed, moving to the fastest point of the sweep when it beats the
current best by more than ``min_gain`` (1 %: timing noise must not move the search); repeat
passes over the dimensions until a pass moves nothing, or the budget (seconds per kernel and
shape) is spent - checked between sweeps, so one sweep may overrun it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..kernels import tuned
from ..kernels.cache_key import CacheKey, ShapeKey, source_hash
from .space import Point, point_key, Space
from .plan import DEFAULT_BUDGET_S, Evaluate, EXHAUSTIVE_MAX, has_winner, MIN_GAIN, Task


MAX_ROUNDS = 10
OK_STATUSES = ("ok",)


@dataclass
class SearchResult:
    strategy: str  # exhaustive | coordinate_descent
    stopped: str  # done | converged | budget | max_rounds
    results: list[dict] = field(default_factory=list)  # every evaluated candidate, in order
    default: dict | None = None
    best: dict | None = None
    spent_s: float = 0.0
    rounds: int = 0
    pruned: int = 0  # distinct points met during the search that validate() rejected


def is_ok(result: dict | None) -> bool:
    return bool(result) and result.get("status") in OK_STATUSES and result.get("time_us") is not None


class _Run:
    """Evaluates points once each, counts pruned ones and the time spent (shared by the strategies)."""

    def __init__(self, space: Space, evaluate: Evaluate, out: SearchResult, on_result):
        self.space, self.evaluate, self.out, self.on_result = space, evaluate, out, on_result
        self.seen: dict[tuple, dict] = {}
        self.invalid: set[tuple] = set()

    def __call__(self, points: list[Point]) -> None:
        todo, keys = [], set()
        for p in points:
            k = point_key(p)
            if k in self.seen or k in keys or k in self.invalid:
                continue
            if not self.space.is_valid(p):
                self.invalid.add(k)
                self.out.pruned += 1
                continue
            keys.add(k)
            todo.append(p)
        if not todo:
            return
        results, seconds = self.evaluate(todo)
        self.out.spent_s += seconds
        for p, r in zip(todo, results):
            r = {**r, "config": dict(p), "index": len(self.out.results)}
            self.seen[point_key(p)] = r
            self.out.results.append(r)
            if is_ok(r) and (self.out.best is None or r["time_us"] < self.out.best["time_us"]):
                self.out.best = r
            if self.on_result:
                self.on_result(r)

    def get(self, p: Point) -> dict | None:
        return self.seen.get(point_key(p))


def _as_point(space: Space, p: Point) -> Point | None:
    """A seed as a full point in dimension order (a seed from before a dimension was added takes the default's
    value for it); None where it names a dimension the space lacks or is not valid."""
    if not set(p) <= set(space.start):
        return None
    p = {**space.start, **p}
    return {name: p[name] for name, _ in space.dims} if space.is_valid(p) else None


def _anchors(space: Space, seeds: list[Point]) -> list[Point]:
    """The default, then each distinct valid seed as a full point."""
    out = [dict(space.start)]
    for p in (_as_point(space, s) for s in seeds):
        if p is not None and p not in out:
            out.append(p)
    return out


def _new_dimensions(space: Space, seeds: list[Point], have: list[Point]) -> list[Point]:
    """The first seed (a --retune's own winner) at each other value of each dimension added since it was found,
    valid and not in ``have``.  A descent times its anchors before its first step, and on the H200 a 15 s
    --retune of fused_out (fused_q, h16_hv48_uniform) spent its budget on its ten anchors, never reaching
    beta_ahead, which took that loop from 213.5 to 188.3 us."""
    if not seeds:
        return []
    first, out = seeds[0], []
    for name, values in space.dims:
        if name in first:
            continue
        for v in values:
            q = _as_point(space, {**first, name: v})
            if q is not None and q not in have and q not in out:
                out.append(q)
    return out


def _changed(p: Point, anchor: Point, space: Space) -> int:
    return sum(p[d] != anchor[d] for d, _ in space.dims)


def search(space: Space, evaluate: Evaluate, budget_s: float = DEFAULT_BUDGET_S,
           exhaustive_max: int = EXHAUSTIVE_MAX, min_gain: float = MIN_GAIN, on_result=None,
           max_rounds: int = MAX_ROUNDS, batch: int = 32, seeds: list[Point] = ()) -> SearchResult:
    """Search ``space`` with ``evaluate``: exhaustive when small, else coordinate descent (from the
    fastest of the default and the valid ``seeds``)."""
    valid = space.valid_points(limit=exhaustive_max + 1)
    if len(valid) <= exhaustive_max:
        out = SearchResult("exhaustive", "done")
        run = _Run(space, evaluate, out, on_result)
        anchors = _anchors(space, seeds)
        ordered = anchors + sorted((p for p in valid if p not in anchors),
                                   key=lambda p: min(_changed(p, a, space) for a in anchors))
        for i in range(0, len(ordered), batch):
            if i and out.spent_s >= budget_s:
                out.stopped = "budget"
                break
            run(ordered[i:i + batch])
        out.default = run.get(space.start)
        out.rounds = 1
        return out
    return coordinate_descent(space, evaluate, budget_s, min_gain, on_result, max_rounds, seeds)


def coordinate_descent(space: Space, evaluate: Evaluate, budget_s: float, min_gain: float = MIN_GAIN,
                       on_result=None, max_rounds: int = MAX_ROUNDS, seeds: list[Point] = ()) -> SearchResult:
    """Start at the fastest of the default and the seeds; per dimension, try all its values with the
    others fixed and move to the fastest when it beats the best by more than min_gain; repeat until a
    pass moves nothing.

    Seeds are other searches' winners (see :func:`seed_points`); one searched before a dimension was
    added (the state kernel's BK) takes the start point's value for it.  fuse_k variants compile several
    times slower than plain ones, and a 15 s budget stopped them after their first dimension on the
    H200 (GDN gram fuse_k kept its 208 µs default where plain moved to 123 µs with 1 warp)."""
    out = SearchResult("coordinate_descent", "max_rounds")
    run = _Run(space, evaluate, out, on_result)
    first = _anchors(space, seeds)
    first += _new_dimensions(space, seeds, first)
    run(first)
    out.default = run.get(first[0])
    ok = [r for r in map(run.get, first) if is_ok(r)]
    best = min(ok, key=lambda r: r["time_us"]) if ok else None
    cur = dict(best["config"]) if best else dict(space.start)
    for rnd in range(1, max_rounds + 1):
        out.rounds = rnd
        moved = False
        for name, values in space.dims:
            if out.spent_s >= budget_s:
                out.stopped = "budget"
                return out
            line = [{**cur, name: v} for v in values]
            run(line)
            cands = [r for r in map(run.get, line) if is_ok(r)]
            if not cands:
                continue
            top = min(cands, key=lambda r: r["time_us"])
            if best is None or top["time_us"] < best["time_us"] * (1 - min_gain):
                best, cur, moved = top, dict(top["config"]), True
        if not moved:
            out.stopped = "converged"
            break
    return out


MAX_SEEDS = 6
# kernels whose winners seed each other's searches (same config fields): the output kernel with and
# without the fused norm (KDA's output_fused kept its GDN-derived default, BK 32 / 3 stages / cap 168,
# 264 B of stack offline, while the plain output kernel won at BK 128 / 2 stages / no cap)
# and the in-loop form's loop with state_out, whose config fields it shares (H200, B1 T8192 H16 HV64: 350 us
# at state_out's tuned BV 64 / 4 warps / 3 stages, 549 at its own default, BV 32); KDA's one pass with the
# state kernel it extends
SEED_KERNELS = {"output": ("output", "output_fused"), "output_fused": ("output_fused", "output"),
                "fused_out": ("fused_out", "state_out"), "kda_state_out": ("kda_state_out", "state")}


# measured starting points a coordinate descent from the seeds above does not reach: the loop in segments pays
# at BV 64 with 64-row pieces and 2 stages, a point far from one segment's best (H200, strong gates, the loop
# alone: HV32 8K 399.6 us there as one segment, 137.1 in four; at BV 32,
# 128-row pieces, 3 stages 315.7 and 257.7 in two; HV32 32K 1597.8 -> 533.3 in four); and the same with split_v,
# which long-memory heads need to gain from segments (HV32 8K long gates, 4 segments: 418.8 us handing states
# over, 332.7 split)
_SEGMENTED = tuple({"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2, "segments": s} for s in (4, 2))
START_POINTS = {"fused_out": _SEGMENTED + tuple(dict(p, split_v=True) for p in _SEGMENTED)}


def seed_points(cache_dir: Path, env: dict, task: Task, shape, limit: int = MAX_SEEDS) -> list[Point]:
    """Distinct best configs of the same kernel's current cache entries on this machine (and of its
    SEED_KERNELS partner) for shapes of the same family, head sizes and dtype: this very search's
    winner first (a --retune starts where the last search ended, so a short budget cannot end it on a slower
    point: H200, fused_out fused_qk at h16_hv32_fixed8k, 30 s without it: 236.1 us against the entry's 214.1),
    then its winner on older code (an edit made it stale), then its winner on another GPU of the same compute
    capability (what `gdnbench run` borrows there, so a search ends no slower on this GPU), then this shape's
    other variants, then other shapes, then the kernel's START_POINTS. The pool compiles them with the default
    in one batch, so they cost one compile wave."""
    want = CacheKey.of(env, task.kernel, shape, task.variant)
    heads = ShapeKey.of(shape)
    current, previous, same, other = [], [], [], []
    entries = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tuned.StaleEntry)
        for kernel in SEED_KERNELS.get(task.kernel, (task.kernel,)):
            entries += [(kernel, e) for root in tuned.read_dirs(cache_dir)
                        for e in tuned.load_entries(tuned.cache_path(root, want.machine.gpu or "unknown", kernel))]
    for kernel, e in entries:
        key = CacheKey.from_dict(e.get("key", {}))
        if key.machine != want.machine or not has_winner(e):
            continue
        fresh = key.source_hash == source_hash(kernel)
        if key.same_search(want) and kernel == task.kernel:
            (current if fresh else previous).append(e["best"]["config"])
            continue
        if not fresh or not heads.same_heads(ShapeKey.parse(key.shape_key)):
            continue
        (same if key.shape_key == want.shape_key else other).append(e["best"]["config"])
    lent = tuned.borrowed_entry(cache_dir, want, task.kernel)
    borrowed = [lent["best"]["config"]] if has_winner(lent) else []
    out: list[Point] = []
    for p in current + previous + borrowed + same + other:
        if p not in out:
            out.append(p)
    return out[:limit] + [p for p in START_POINTS.get(task.kernel, ()) if p not in out[:limit]]

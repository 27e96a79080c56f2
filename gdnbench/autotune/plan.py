"""The autotuner's shared vocabulary: tasks (kernel x variant x family), options, budgets, what counts as a
winner, and the cache look-ups.

Families. A shape's family picks its kernels (KDA runs kda_intra where GDN runs gram and shares
the others with per-channel gates), their specializations (:func:`gdnbench.kernels.tuned.variant_of`), its
default config and validity rules, and its cache key; so each task is planned for one family.

Resume. Each search's entry is saved as soon as the search ends, so an interrupted sweep keeps
every finished one; a later run skips a search whose current entry (same GPU, compute capability,
Triton, kernel source, variant and shape key) found a working config (:func:`cached_entry`),
unless ``retune``.

"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..backends.base import one_line
from ..kernels import tuned
from ..kernels.cache_key import CacheKey, shape_key, source_hash
from .space import Point


EXHAUSTIVE_MAX = 256
MIN_GAIN = 0.01
DEFAULT_BUDGET_S = 300.0
Evaluate = Callable[[list], tuple]  # points -> (results, seconds spent)


def shard(n: int, rank: int, world: int) -> list[int]:
    """Indices of a batch of n candidates that ``rank`` of ``world`` evaluates: round-robin."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world {world}")
    return list(range(rank, n, world))


def per_candidate(fn: Callable[[Point], dict]) -> Evaluate:
    """An evaluator calling fn(point) for each point; an exception becomes that candidate's
    ``error`` result, so one failure never ends the sweep."""
    def evaluate(points):
        t0 = time.monotonic()
        out = []
        for p in points:
            try:
                out.append(fn(p))
            except Exception as e:
                out.append({"status": "error", "reason": one_line(e)})
        return out, time.monotonic() - t0
    return evaluate


@dataclass(frozen=True)
class Task:
    """One kernel specialization to tune, and the route it is gated and timed under, for the
    shapes of one family."""

    kernel: str
    variant: str
    route: str
    family: str = "gdn"


def plan_tasks(routes: list[str], kernels: list[str], family: str = "gdn") -> list[Task]:
    """The distinct (kernel, variant) pairs the routes run for ``family``, restricted to ``kernels``."""
    out: list[Task] = []
    for route in routes:
        for kernel in tuned.ROUTE_KERNELS[family][route]:
            if kernel not in kernels:
                continue
            variant = tuned.variant_of(kernel, route, family)
            if all((t.kernel, t.variant) != (kernel, variant) for t in out):
                out.append(Task(kernel, variant, tuned.MEASURE_ROUTE[variant], family))
    return out


def unique_shapes(shapes: list) -> list:
    """One shape per shape key (the first), since the cache holds one entry per key."""
    seen, out = set(), []
    for s in shapes:
        k = shape_key(s)
        if k not in seen:
            seen.add(k)
            out.append(s)
    return out


def unique_shapes_pairs(pairs: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """unique_shapes for (shape-set path, shape) pairs."""
    keep = {id(s) for s in unique_shapes([s for _, s in pairs])}
    return [(p, s) for p, s in pairs if id(s) in keep]


@dataclass
class TuneOptions:
    device: str = "cuda"
    budget_s: float = DEFAULT_BUDGET_S
    exhaustive_max: int = EXHAUSTIVE_MAX
    min_gain: float = MIN_GAIN
    check_tokens: int = 8192
    warmup: int = 5
    rounds: int = 3
    iters: int = 20
    timeout_s: float = 600.0
    cache_dir: Path | None = None  # None: write the user cache, read it then the shipped winners
    retune: bool = False  # search again where a current cache entry exists
    compile_workers: int = 0  # per rank; see CompilePool
    seeds: bool = True  # seed_points(): descent starts at the fastest; exhaustive tries near them first
    shard: str = "searches"  # under torchrun: 'searches' or 'candidates' (see tune())
    only: tuple[str, ...] = ()  # search these dimensions alone, the others at the first seed (space.restricted)


def has_winner(entry: dict | None) -> bool:
    """Whether a cache entry's search found a working config (one that found none is searched again)."""
    return bool(entry) and (entry.get("best") or {}).get("time_us") is not None


def entry_summary(entry: dict) -> str:
    """An entry's outcome in a few words, e.g. 'BV=64 w=4 s=3 r=128: 120.0 µs, default 160.0 µs'."""
    best, d = entry["best"]["time_us"], (entry.get("default") or {}).get("time_us")
    win = tuned.winner(entry)
    if win is None:
        return f"default config kept ({best:.1f} µs)"
    return f"{tuned.point_label(win)}: {best:.1f} µs, " + ("default failed" if d is None else f"default {d:.1f} µs")


def cached_entry(cache_dir: Path, env: dict, task: Task, shape) -> dict | None:
    """The current cache entry of a search on the machine ``env`` describes, when it found a working config."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tuned.StaleEntry)  # a stale entry is simply searched again
        e = tuned.find_entry(cache_dir, env, task.kernel, shape, task.variant)
    return e if has_winner(e) else None


def cached_tasks(tasks: list[Task], shape, env: dict, opts: TuneOptions) -> dict[int, str]:
    """Index of each task a run skips -> the reason ('cached: <winner>'); none with opts.retune."""
    if opts.retune:
        return {}
    found = {i: cached_entry(opts.cache_dir, env, t, shape) for i, t in enumerate(tasks)}
    return {i: "cached: " + entry_summary(e) for i, e in found.items() if e}


def cached_on(cache_dir, task: Task, shape) -> dict[str, dict]:
    """GPU folder -> entry, for the folders under the roots of ``cache_dir`` (tuned.read_dirs) holding a
    working entry of this search
    for the current kernel source: what --dry-run, which knows no GPU, marks as cached (a real run
    also matches the compute capability and Triton version)."""
    want = CacheKey(None, source_hash(task.kernel), shape_key(shape), task.variant)
    out = {}
    for path in [p for root in tuned.read_dirs(cache_dir) for p in sorted(root.glob(f"*/{task.kernel}.json"))]:
        for e in tuned.load_entries(path):
            key = CacheKey.from_dict(e.get("key", {}))
            if key.same_search(want) and key.source_hash == want.source_hash and has_winner(e):
                out.setdefault(path.parent.name, e)
    return out

"""Autotune the stage kernels of gdnbench.kernels.ops.chunk_gdn and chunk_kda: per shape, correctness-gated, cached.

The sweep: plan the searches of each shape, run them in worker subprocesses, save each entry as it ends
(space, plan, search, dist, bench and report hold the parts).
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Callable

from ..kernels import tuned
from ..kernels.cache_key import device_identity, entry_key
from ..bench.worker import CompilePool, WorkerClient
from .bench import REPLAY_MIN_US, STAGE_CALLS_MAX
from .space import build_space, restricted, Space
from .plan import cached_tasks, per_candidate, Task, TuneOptions
from .search import is_ok, search, SearchResult, seed_points
from .dist import Dist, rank_gpu, sharded


def make_entry(env: dict, task: Task, shape, set_name: str, space: Space, res: SearchResult, opts: TuneOptions) -> dict:
    """The cache entry of one search: its key, the default and the winner, and every candidate."""
    from ..data.results import git_info, utc_stamp

    default_t = res.default.get("time_us") if is_ok(res.default) else None
    best = res.best
    failed = sum(1 for r in res.results if not is_ok(r))
    return {
        "key": entry_key(env, task.kernel, shape, task.variant),
        "kernel": task.kernel, "variant": task.variant, "route": task.route,
        "shape": {"set": set_name, "id": shape.id, "label": shape.label(), "tokens": shape.tokens},
        "created_utc": utc_stamp(), "git": git_info(),
        "search": {"strategy": res.strategy, "stopped": res.stopped, "rounds": res.rounds,
                   "budget_s": opts.budget_s, "spent_s": round(res.spent_s, 3), "min_gain": opts.min_gain,
                   "exhaustive_max": opts.exhaustive_max, "dims": {d: list(v) for d, v in space.dims},
                   "space_total": space.total, "evaluated": len(res.results), "failed": failed,
                   "pruned_met": res.pruned, "compile_workers": opts.compile_workers,
                   **({"only": list(opts.only)} if opts.only else {})},
        "gate": f"whole chunk_{shape.family} forward of the route under the candidate config vs the fp64 recurrence "
                "(gdnbench.oracle.check, data-derived budget); err_vs_default: rel-RMS against the default config",
        "timing": {"what": "the stage kernel alone, stage inputs precomputed with the default config",
                   "method": f"median per call of CUDA-graph replays of as many stage calls as take {REPLAY_MIN_US:.0f} µs "
                             f"(1 to {STAGE_CALLS_MAX})",
                   "warmup": opts.warmup, "rounds": opts.rounds, "iters": opts.iters, "device": opts.device},
        "default": {"config": space.start, "time_us": default_t},
        "best": {"config": best["config"], "time_us": best["time_us"]} if best else None,
        "speedup": (default_t / best["time_us"]) if default_t and best else None,
        "candidates": res.results,
    }


def tune(shapes: list[tuple[str, object]], tasks: list[Task], opts: TuneOptions, dist: Dist = Dist(),
         on_event: Callable[[str, dict], None] = lambda kind, info: None, client_factory=None,
         env: dict | None = None) -> list[dict]:
    """Run every task of a shape's family on every (shape-set path, shape); each entry is written as
    its search ends. A task whose current cache entry exists is skipped unless ``opts.retune``; rank 0
    decides for all ranks, from ``env`` (this machine's tuning identity, default
    :func:`device_identity`). A shape whose tasks are all cached starts no worker.

    Under torchrun (``dist.world`` > 1) the work is split by ``opts.shard``: 'searches' (default) lets
    each rank claim searches one at a time (:func:`claim_searches`), run on its own GPU with its own
    compile pool and saved by that rank, and gathers every entry to rank 0 at the end (rank 0 returns them all);
    'candidates' runs each search on all ranks in lockstep, splitting every batch of candidates.

    ``on_event(kind, info)`` reports progress: 'cached' (a search skipped, with the reason), 'search'
    (a search starts, with an estimate of its candidates), 'result' (one candidate), 'entry' (a search
    ended and was saved, with its seconds), 'skip' (a shape's tasks not run: its worker did not start)."""
    factory = client_factory or (lambda spec: WorkerClient(
        spec, opts.device, rank_gpu(dist.local_rank) if opts.device == "cuda" else None, opts.timeout_s))
    if env is None and dist.rank == 0 and not opts.retune:
        env = device_identity(opts.device)
    families = [(p, s, [t for t in tasks if t.family == s.family]) for p, s in shapes]
    families = [f for f in families if f[2]]
    decided = dist.all_gather([cached_tasks(m, s, env, opts) for _, s, m in families] if dist.rank == 0 else None)[0]
    plan = []
    for (set_path, shape, mine), cached in zip(families, decided):
        for i, reason in cached.items() if dist.rank == 0 else ():
            on_event("cached", {"task": mine[i], "shape": shape, "reason": reason})
        todo = [t for i, t in enumerate(mine) if i not in cached]
        if todo:
            plan.append((set_path, shape, todo))
    if dist.world > 1 and opts.shard == "searches":
        return _tune_searches_sharded(plan, opts, dist, on_event, factory)
    entries = []
    for set_path, shape, todo in plan:
        entries += _tune_shape(set_path, shape, todo, opts, dist, on_event, factory)
    return entries


def claim_searches(sizes: list[int], dist: Dist, tag: str):
    """Yield (shape index, search index) pairs for this rank to run, claimed one at a time from a
    counter per shape (``dist.fetch_add``), so every search runs exactly once over all ranks.

    Rank r starts on shape r * n // world and stays on a shape while it has searches left (its
    worker and compiled kernels are reused); then it moves to the shape with the most left."""
    n = len(sizes)
    if n == 0:
        return
    k = dist.rank * n // dist.world
    while True:
        i = dist.fetch_add(f"{tag}/{k}", 1) - 1
        if i < sizes[k]:
            yield k, i
            continue
        left = [sizes[j] - dist.fetch_add(f"{tag}/{j}", 0) for j in range(n)]
        k = max(range(n), key=lambda j: left[j])
        if left[k] <= 0:
            return


def _tune_searches_sharded(plan, opts: TuneOptions, dist: Dist, on_event, factory) -> list[dict]:
    tag = "gdnbench-searches/" + dist.all_gather(os.urandom(8).hex() if dist.rank == 0 else None)[0]
    claimed = claim_searches([len(todo) for _, _, todo in plan], dist, tag)
    entries: list[dict] = []
    for k, group in itertools.groupby(claimed, key=lambda u: u[0]):
        set_path, shape, todo = plan[k]
        entries += _tune_shape(set_path, shape, (todo[i] for _, i in group), opts, Dist(), on_event, factory)
    gathered = dist.all_gather(entries)
    if dist.rank != 0:
        return entries
    for es in gathered[1:]:  # already saved by their ranks where the cache is shared; not across nodes
        for e in es:
            tuned.save_entry(opts.cache_dir, e)
    return [e for es in gathered for e in es]


def _tune_shape(set_path: str, shape, todo, opts: TuneOptions, dist: Dist, on_event, factory) -> list[dict]:
    """Run the tasks ``todo`` (an iterable, consumed one search at a time) on one shape: one timing
    worker and one compile pool for all its searches."""
    spec = {"shape_set": set_path, "shape_id": shape.id, "device": opts.device, "check_tokens": opts.check_tokens,
            "params": {"warmup": opts.warmup, "rounds": opts.rounds, "iters": opts.iters},
            "cache_dir": None if opts.cache_dir is None else str(opts.cache_dir)}
    client = factory(spec)
    pool = CompilePool(spec, opts.compile_workers, factory)
    try:
        envs = dist.all_gather(client.ensure_started())
        if envs[0] is None:
            on_event("skip", {"shape": shape, "tasks": list(todo),
                              "reason": client.last_error or "worker failed on rank 0"})
            return []
        return [_tune_one(client, envs[0], task, shape, set_path, opts, dist, on_event, pool) for task in todo]
    finally:
        client.close()
        pool.close()


def _tune_one(client, env, task: Task, shape, set_path: str, opts: TuneOptions, dist: Dist, on_event,
              pool: CompilePool | None = None) -> dict:
    t0 = time.monotonic()
    space = build_space(task.kernel, shape.K, shape.V, shape.dtype, shape.family, task.variant)
    on_event("search", {"task": task, "shape": shape, "estimate": space.pass_size()})
    one_by_one = per_candidate(lambda p: client.evaluate(task.kernel, task.route, p))
    seeds = dist.all_gather(seed_points(opts.cache_dir, env, task, shape) if opts.seeds and dist.rank == 0
                            else None)[0] or []
    if opts.only:  # the others at the first seed: under --retune this search's cached winner
        anchor = seeds[0] if seeds else space.start
        space, seeds = restricted(space, opts.only, anchor), seeds[:1]

    def local(points):
        t = time.monotonic()
        if pool is not None:
            pool.warm(task.kernel, task.route, points)
        results, _ = one_by_one(points)
        return results, time.monotonic() - t

    evaluate = local if dist.world == 1 else sharded(local, dist)
    res = search(space, evaluate, opts.budget_s, opts.exhaustive_max, opts.min_gain,
                 on_result=lambda r: on_event("result", {"task": task, "shape": shape, "result": r}), seeds=seeds)
    entry = make_entry(env, task, shape, Path(set_path).stem, space, res, opts)
    entry["search"]["seeds"] = seeds
    path = tuned.save_entry(opts.cache_dir, entry) if dist.rank == 0 else None
    on_event("entry", {"task": task, "shape": shape, "entry": entry, "path": path,
                       "seconds": time.monotonic() - t0})
    return entry

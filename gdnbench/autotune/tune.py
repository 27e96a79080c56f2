"""Autotune the stage kernels of gdnbench.kernels.ops.chunk_gdn and chunk_kda: per shape, correctness-gated, cached.

Space. Per kernel: its block sizes (BR for l2norm; BK and/or BV for the others, powers of two
from 16 up to the head size rounded up to a power of two: larger blocks are clamped by the
kernel to the same code), num_warps 1..16, num_stages 1..4 (1 for l2norm, which has no loop)
and maxnreg: None (the compiler's choice) plus caps 64, 72, .., 248 (every multiple of 8 that
ptxas accepts between 64 and 255). Points that :func:`gdnbench.kernels.config.validate` (the
same function the defaults pass) rejects - shared memory, block divisibility, register file -
are pruned before anything runs. The other kernels keep the shape's default config.

Search. A space of at most ``exhaustive_max`` valid points is searched exhaustively. Larger
ones by coordinate descent: start at the default config; sweep one dimension at a time over all
its values with the others fixed, moving to the fastest point of the sweep when it beats the
current best by more than ``min_gain`` (1 %: timing noise must not move the search); repeat
passes over the dimensions until a pass moves nothing, or the budget (seconds per kernel and
shape) is spent - checked between sweeps, so one sweep may overrun it.

Candidate. Run in a worker subprocess (one per shape and rank, restarted when it dies, so an
illegal memory access or a hang costs one candidate, recorded as ``crashed`` / ``timeout``):
compiled and gated on the whole forward of the shape's family (``chunk_gdn`` or ``chunk_kda``) on
the kernel's route under the candidate config, against the fp64 recurrence with gdnbench.oracle.check's
data-derived budget (the rel-RMS error against the default config's output is recorded too); then
the stage kernel alone is timed by gdnbench.bench.timing: CUDA-graph replay of one stage call on the full
input (stage inputs precomputed with the default config), median over rounds. Every candidate yields a result with a status
(ok, incorrect, compile_error, error, crashed, timeout) and a reason; none is dropped.

Compile pool. A candidate's first call took 0.8-1.0 s on the H200 (search of 38 candidates: 37 s), nearly all
of it Triton's compile, while the gate and the timing take milliseconds. So before a batch of candidates is
evaluated, ``compile_workers`` extra worker processes on the same GPU run each candidate's forward once, in
parallel, filling Triton's on-disk cache; the timing worker then loads the binaries. Nothing is timed while the
pool runs, and a pool failure only costs the warm-up: the timing worker's own call records what went wrong.

Families. A shape's family picks its kernels (KDA runs kda_intra where GDN runs gram and shares
the others with per-channel gates), their specializations (:func:`gdnbench.kernels.tuned.variant_of`), its
default config and validity rules, and its cache key; so each task is planned for one family.

Scale-out. Under torchrun the searches are shared out by default (``shard='searches'``): each rank
claims one search at a time (:func:`claim_searches`, an atomic counter per shape in torchrun's store,
so a rank that drew short searches takes more, and a rank stays on one shape, with its worker, while
that shape has searches left), runs it on its own GPU with its own compile pool, saves each entry as
it ends, and all entries are gathered to rank 0 at the end. A fixed share per rank would leave ranks
idle, since search lengths vary: on the H200 a kda_intra compile wave took ~20 s, while an l2norm search
evaluated 1-7 candidates. With ``shard='candidates'`` every
rank runs the same search in lockstep; each batch of points is split round-robin by index
(:func:`shard`), each rank evaluates its share, and the results are all-gathered, so every rank takes
the same next step; rank 0 writes the cache. Candidate sharding scaled poorly once compiles ran in a
pool: most batches (a dimension's 4-5 values) fit one compile wave on one GPU already (H200 pair,
wu search: 0.87 s per candidate on 1 GPU, 0.67 on 2).

Resume. Each search's entry is saved as soon as the search ends, so an interrupted sweep keeps
every finished one; a later run skips a search whose current entry (same GPU, compute capability,
Triton, kernel source, variant and shape key) found a working config (:func:`cached_entry`),
unless ``retune``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..kernels import tuned
from ..backends.base import one_line

KERNELS = tuned.KERNELS
ROUTES = tuned.ROUTES
MAXNREG_CAPS = tuple(range(64, 256, 8))  # 64, 72, ..., 248
MAXNREG_VALUES = (None,) + MAXNREG_CAPS
WARPS = (1, 2, 4, 8, 16)
STAGES = (1, 2, 3, 4)
BR_VALUES = (1, 2, 4, 8, 16, 32, 64)
BLOCKS = (16, 32, 64, 128, 256)
EXHAUSTIVE_MAX = 256
MIN_GAIN = 0.01
DEFAULT_BUDGET_S = 300.0
MAX_ROUNDS = 10
KERNEL_FUNCTIONS = {"l2norm": "l2norm_kernel", "gram": "gram_solve_kernel", "kda_intra": "kda_intra_kernel",
                    "wu": "wu_kernel", "state": "state_kernel", "output": "output_kernel",
                    "output_fused": "output_kernel", "aqk": "aqk_kernel", "state_out": "state_out_kernel"}
OK_STATUSES = ("ok",)

Point = dict  # dimension name -> value, in the space's dimension order
Evaluate = Callable[[list], tuple]  # points -> (results, seconds spent)


# ----------------------------------------------------------------------------- space
def dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _blocks_for(dim: int) -> tuple[int, ...]:
    """Block sizes that give distinct code for a head dimension (larger ones are clamped)."""
    top = 1 << max(dim - 1, 0).bit_length()
    return tuple(b for b in BLOCKS if b <= max(top, BLOCKS[0]))


def dimensions(kernel: str, K: int, V: int) -> list[tuple[str, tuple]]:
    """The tuned dimensions of a kernel and their values, in coordinate-descent order."""
    tail = [("num_warps", WARPS), ("num_stages", (1,) if kernel == "l2norm" else STAGES),
            ("maxnreg", MAXNREG_VALUES)]
    if kernel == "l2norm":
        return [("BR", BR_VALUES)] + tail
    blocks = {"gram": ("BK",), "kda_intra": ("BK",), "wu": ("BK", "BV"), "state": ("BK", "BV"), "output": ("BK", "BV"),
              "output_fused": ("BK", "BV"), "aqk": ("BK",), "state_out": ("BK", "BV")}[kernel]
    return [(b, _blocks_for(K if b == "BK" else V)) for b in blocks] + tail


def point_key(point: Point) -> tuple:
    return tuple(point.items())


@dataclass
class Space:
    """A kernel's search space for one shape: its dimensions, the start point, the validity test."""

    kernel: str
    dims: list[tuple[str, tuple]]
    start: Point
    is_valid: Callable[[Point], bool]

    def points(self):
        names = [d for d, _ in self.dims]
        for values in itertools.product(*(v for _, v in self.dims)):
            yield dict(zip(names, values))

    @property
    def total(self) -> int:
        return math.prod(len(v) for _, v in self.dims)

    def valid_points(self) -> list[Point]:
        return [p for p in self.points() if self.is_valid(p)]

    def pass_size(self) -> int:
        """Points one coordinate-descent pass visits at most."""
        return 1 + sum(len(v) - 1 for _, v in self.dims)


# GDN's path pinned while a kernel of one path is tuned, so its gate runs that kernel (ops.one_pass)
_PATH_OF = {"aqk": True, "state_out": True, "state": False, "output": False, "output_fused": False}


def full_config(kernel: str, point: Point, base):
    """``base`` (a GDNConfig) with ``kernel``'s config replaced by the point's, and GDN's path pinned to the
    one that runs ``kernel`` (KDA ignores it; ops.validate rejects the one-pass path where it is not built)."""
    return dataclasses.replace(base, **{kernel: tuned.kernel_config(kernel, point)},
                               one_pass=_PATH_OF.get(kernel) if base.one_pass is None else base.one_pass)


def _start_point(kernel: str, base, dims, K: int, V: int) -> Point:
    """The base config of the kernel as a point, blocks clamped as the kernel clamps them."""
    from ..kernels.config import block, state_piece

    c = getattr(base, kernel)
    out = {}
    for name, _ in dims:
        v = getattr(c, name)
        if kernel in ("state", "state_out") and name == "BK":
            v = block(state_piece(c, K), K)
        elif name in ("BK", "BV"):
            v = block(v, K if name == "BK" else V)
        out[name] = v
    return out


def build_space(kernel: str, K: int, V: int, dtype: str, family: str = "gdn") -> Space:
    """The space of ``kernel`` for head sizes K, V, a storage dtype and a family, pruned by validate()
    (KDA's kernels stream fp32 gate tiles too: their shared-memory estimates differ)."""
    from ..kernels.config import default_config, validate

    elt = dtype_bytes(dtype)
    base = default_config(K, V, elt, family)
    dims = dimensions(kernel, K, V)

    def is_valid(point: Point) -> bool:
        try:
            validate(full_config(kernel, point, base), K, V, elt, family)
        except (ValueError, TypeError):
            return False
        return True

    return Space(kernel, dims, _start_point(kernel, base, dims, K, V), is_valid)


@functools.lru_cache(maxsize=None)
def count_valid(kernel: str, K: int, V: int, dtype: str, family: str = "gdn") -> int:
    return len(build_space(kernel, K, V, dtype, family).valid_points())


# ----------------------------------------------------------------------------- search
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


def search(space: Space, evaluate: Evaluate, budget_s: float = DEFAULT_BUDGET_S,
           exhaustive_max: int = EXHAUSTIVE_MAX, min_gain: float = MIN_GAIN, on_result=None,
           max_rounds: int = MAX_ROUNDS, batch: int = 32, seeds: list[Point] = ()) -> SearchResult:
    """Search ``space`` with ``evaluate``: exhaustive when small, else coordinate descent (from the
    fastest of the default and the valid ``seeds``)."""
    valid = space.valid_points()
    if len(valid) <= exhaustive_max:
        out = SearchResult("exhaustive", "done")
        run = _Run(space, evaluate, out, on_result)
        ordered = [space.start] + [p for p in valid if p != space.start]
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
    first = [dict(space.start)]
    for p in seeds:
        # a seed from before a dimension was added takes the start's value for it
        p = {**space.start, **p} if set(p) <= set(space.start) else None
        if p is not None and space.is_valid(p):
            p = {name: p[name] for name, _ in space.dims}
            if p not in first:
                first.append(p)
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


# ----------------------------------------------------------------------------- evaluators, sharding
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


def local_counters() -> Callable[[str, int], int]:
    """fetch_add(key, n) -> the key's count after adding n, for one process (threads share it)."""
    import threading

    counts: dict[str, int] = {}
    lock = threading.Lock()

    def fetch_add(key: str, n: int) -> int:
        with lock:
            counts[key] = counts.get(key, 0) + n
            return counts[key]
    return fetch_add


@dataclass
class Dist:
    """This process's place among torchrun ranks; all_gather(obj) returns every rank's obj;
    fetch_add(key, n) adds n to a counter every rank sees (torchrun's store) and returns its new value."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    all_gather: Callable[[object], list] = lambda obj: [obj]
    fetch_add: Callable[[str, int], int] = field(default_factory=local_counters)


def sharded(local: Evaluate, dist: Dist) -> Evaluate:
    """Evaluate this rank's share of each batch, gather all shares, return them in batch order.
    The time spent is the slowest rank's, so every rank sees the same budget use."""
    def evaluate(points):
        mine = [points[i] for i in shard(len(points), dist.rank, dist.world)]
        results, seconds = local(mine) if mine else ([], 0.0)
        gathered = dist.all_gather((results, seconds))
        merged: list = [None] * len(points)
        for r, (res_r, _) in enumerate(gathered):
            for i, res in zip(shard(len(points), r, dist.world), res_r):
                merged[i] = res
        return merged, max(s for _, s in gathered)
    return evaluate


def torch_dist() -> Dist:
    """The Dist of a torchrun rank (gloo: only Python objects travel), or a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as td

    if not td.is_initialized():
        import datetime

        # ranks sharing searches meet only at the end, possibly long after the first one finished
        td.init_process_group("gloo", timeout=datetime.timedelta(hours=12))

    def all_gather(obj):
        out = [None] * world
        td.all_gather_object(out, obj)
        return out

    store = td.distributed_c10d._get_default_store()
    return Dist(td.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0")), all_gather,
                lambda key, n: int(store.add(key, n)))


# ----------------------------------------------------------------------------- tasks
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
        k = tuned.shape_key(s)
        if k not in seen:
            seen.add(k)
            out.append(s)
    return out


def unique_shapes_pairs(pairs: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """unique_shapes for (shape-set path, shape) pairs."""
    keep = {id(s) for s in unique_shapes([s for _, s in pairs])}
    return [(p, s) for p, s in pairs if id(s) in keep]


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
                 cache_dir: Path | None = None) -> list[dict]:
    """Per shape key and task of its family: the dimensions, their values, the candidate counts, the
    strategy, and (with ``cache_dir``) the GPU folders whose cache holds it (:func:`cached_on`)."""
    rows = []
    for s in unique_shapes(shapes):
        for t in (t for t in tasks if t.family == s.family):
            space = build_space(t.kernel, s.K, s.V, s.dtype, s.family)
            n_valid = count_valid(t.kernel, s.K, s.V, s.dtype, s.family)
            cached = cached_on(cache_dir, t, s) if cache_dir is not None else {}
            rows.append({
                "kernel": t.kernel, "variant": t.variant, "route": t.route, "shape_id": s.id,
                "shape_key": tuned.shape_key(s), "dims": {d: list(v) for d, v in space.dims},
                "start": space.start, "total": space.total, "valid": n_valid,
                "strategy": "exhaustive" if n_valid <= exhaustive_max else "coordinate_descent",
                "per_pass": space.pass_size(),
                "cached": {gpu: entry_summary(e) for gpu, e in cached.items()},
            })
    return rows


# ----------------------------------------------------------------------------- worker (child process)
class _Bench:
    """Everything one shape's candidates share: inputs, oracle, default outputs, stage inputs."""

    def __init__(self, spec: dict):
        import torch

        from ..kernels import ops
        from ..oracle.check import build_oracle
        from ..data.inputs import make_inputs
        from ..kernels.config import default_config
        from ..data.shapes import load_file
        from ..bench.timing import TimingParams

        self.torch, self.ops = torch, ops
        self.device = spec["device"]
        self.shape = load_file(spec["shape_set"]).get(spec["shape_id"])
        self.params = TimingParams(**spec["params"])
        s = self.shape
        self.kda = s.family == "kda"
        self.base = default_config(s.K, s.V, dtype_bytes(s.dtype), s.family)
        check_shape = s.shortened(spec["check_tokens"])
        self.full = make_inputs(s, self.device)
        self.small = self.full if check_shape is s else make_inputs(check_shape, self.device)
        self.info = {id(x): (ops.prepare_varlen(x.cu_seqlens) if x.cu_seqlens is not None else None)
                     for x in (self.full, self.small)}
        self.oracle = None
        if not spec.get("warm_only"):
            with torch.no_grad():
                self.oracle = build_oracle(check_shape, self.small, s)
        self._default_o: dict[str, object] = {}
        self._stage: dict[str, dict] = {}

    def forward(self, inputs, route: str, cfg):
        """The whole chunk_gdn / chunk_kda forward of a route, as the gdnbench backend runs it."""
        ops, x = self.ops, inputs
        kw = dict(scale=x.scale, initial_state=x.initial_state, output_final_state=True, config=cfg)
        op = ops.chunk_gdn
        if self.kda:
            op = ops.chunk_kda
            kw["lower_bound"] = x.lower_bound
        if x.cu_seqlens is not None:
            kw.update(cu_seqlens=x.cu_seqlens, chunk_indices=self.info[id(x)])
        if route == "explicit":
            return op(ops.l2norm(x.q, cfg.l2norm), ops.l2norm(x.k, cfg.l2norm), x.v, x.g, x.beta, norm="none", **kw)
        return op(x.q, x.k, x.v, x.g, x.beta, norm=route, **kw)

    def default_output(self, route: str):
        if route not in self._default_o:
            self._default_o[route] = self.forward(self.small, route, self.base)[0]
        return self._default_o[route]

    def stage_inputs(self, route: str) -> dict:
        """The inputs of every stage on the full shape, computed once with the default config, chained
        as ops._forward chains them. KDA: kda_intra also gives Aqk (for the output kernel, which then
        reads no k), and the state kernel reads w/u's kg as its k, with k's rstd already in it."""
        if route in self._stage:
            return self._stage[route]
        ops, x, cfg, info = self.ops, self.full, self.base, self.info[id(self.full)]
        fuse_k, fuse_q = route == "fused_qk", route in ("fused_q", "fused_qk")
        k = x.k if fuse_k else ops.l2norm(x.k)
        q = x.q if fuse_q else ops.l2norm(x.q)
        h0 = None if x.initial_state is None else x.initial_state.float().contiguous()
        aqk = None
        if self.kda:
            g_cs, A, aqk, rk = ops.kda_intra(q, k, x.g, x.beta, varlen=info, fuse_k=fuse_k, raw_q=fuse_q, config=cfg)
        else:
            g_cs, A, rk, ssq = ops.gram_solve(k, x.g, x.beta, varlen=info, fuse_k=fuse_k, config=cfg)
        w, u, kg = ops.recompute_wu(k, x.v, x.beta, A, g_cs, rstd_k=rk, varlen=info, config=cfg)
        # the operands of the state and output kernels that differ by family
        state_k = kg if self.kda else k
        out_k, out_rk, out_ssq = (None, None, None) if self.kda else (k, rk, ssq)
        h, vn, _ = ops.state_recurrence(state_k, w, u, g_cs, initial_state=h0,
                                        output_final_state=True, varlen=info, config=cfg)
        # GDN's one pass: its own q k^T gram (and q's rstd under the fused routes) for state_out
        a1, cq = (None, None) if self.kda else ops.chunk_aqk(q, k, g_cs, fuse_q=fuse_q, fuse_k=fuse_k,
                                                             varlen=info, config=cfg)
        self._stage[route] = dict(q=q, k=k, g_cs=g_cs, A=A, aqk=aqk, rk=rk, w=w, u=u, h0=h0, h=h, vn=vn,
                                  info=info, fuse_k=fuse_k, fuse_q=fuse_q, state_k=state_k,
                                  out_k=out_k, out_rk=out_rk, out_ssq=out_ssq, a1=a1, cq=cq)
        return self._stage[route]

    def stage_call(self, kernel: str, route: str, cfg):
        """A zero-argument call of the one stage kernel under ``cfg`` (what is timed)."""
        ops, x, st = self.ops, self.full, self.stage_inputs(route)
        info = st["info"]
        if kernel == "l2norm":
            return lambda: ops.l2norm(x.k, cfg.l2norm)
        if kernel == "gram":
            return lambda: ops.gram_solve(st["k"], x.g, x.beta, varlen=info, fuse_k=st["fuse_k"], config=cfg)
        if kernel == "kda_intra":
            return lambda: ops.kda_intra(st["q"], st["k"], x.g, x.beta, varlen=info, fuse_k=st["fuse_k"],
                                         raw_q=st["fuse_q"], config=cfg)
        if kernel == "wu":
            return lambda: ops.recompute_wu(st["k"], x.v, x.beta, st["A"], st["g_cs"], rstd_k=st["rk"],
                                            varlen=info, config=cfg)
        if kernel == "state":
            return lambda: ops.state_recurrence(st["state_k"], st["w"], st["u"], st["g_cs"],
                                                initial_state=st["h0"], output_final_state=True, varlen=info,
                                                config=cfg)
        if kernel == "aqk":
            return lambda: ops.chunk_aqk(st["q"], st["k"], st["g_cs"], fuse_q=st["fuse_q"], fuse_k=st["fuse_k"],
                                         varlen=info, config=cfg)
        if kernel == "state_out":
            return lambda: ops.state_output(st["q"], st["k"], st["w"], st["u"], st["g_cs"], st["a1"], st["cq"],
                                            scale=x.scale, initial_state=st["h0"], output_final_state=True,
                                            varlen=info, config=cfg)
        return lambda: ops.chunk_output(st["q"], st["out_k"], st["vn"], st["h"], st["g_cs"], scale=x.scale,
                                        rstd_k=st["out_rk"], ssq_k=st["out_ssq"], fuse_q=st["fuse_q"], varlen=info,
                                        config=cfg, aqk=st["aqk"])

    def time_us(self, fn) -> tuple[float, str]:
        """Median µs per call: CUDA-graph replays on the GPU (events where capture fails)."""
        from ..bench import timing

        p = self.params
        for _ in range(p.warmup):
            fn()
        if self.device != "cuda":
            return statistics.median(timing.time_cpu(fn, p.iters * p.rounds)), "cpu perf_counter"
        try:
            graph = timing.capture_graph(fn)
        except timing.GraphUnsafe:
            samples = [t for _ in range(p.rounds) for t in timing.time_wall(fn, p.iters)]
            return statistics.median(samples), "cuda events per eager call (graph capture failed)"
        samples = [t for _ in range(p.rounds) for t in timing.time_graph(graph, p.iters)]
        del graph
        return statistics.median(samples), "cuda graph replay of one stage call"

    def warm(self, kernel: str, route: str, point: Point) -> dict:
        """Compile one candidate (its forward on the gate's input, run once) to fill Triton's cache."""
        t0 = time.monotonic()
        try:
            with self.torch.no_grad():
                self.forward(self.small, route, full_config(kernel, point, self.base))
                self._sync()
        except Exception as e:
            return {"status": "error", "reason": one_line(e), "seconds": round(time.monotonic() - t0, 3),
                    "context_lost": not self._context_ok()}
        return {"status": "ok", "reason": "", "seconds": round(time.monotonic() - t0, 3)}

    def evaluate(self, kernel: str, route: str, point: Point) -> dict:
        """Compile -> gate -> time one candidate; every outcome is a result dict."""
        from ..oracle.check import judge, rel_rms

        torch = self.torch
        res: dict = {"status": "error", "reason": "", "time_us": None}
        seen: dict = {}
        hook = lambda k, ck: seen.__setitem__(getattr(getattr(k, "fn", k), "__name__", ""), ck)  # noqa: E731
        self.ops.LAUNCH_HOOKS.append(hook)
        t0 = time.monotonic()
        stage = "compile"
        try:
            with torch.no_grad():
                cfg = full_config(kernel, point, self.base)
                ref = self.default_output(route)
                o, s = self.forward(self.small, route, cfg)
                self._sync()
                res["first_call_s"] = round(time.monotonic() - t0, 3)
                self._registers(res, seen.get(KERNEL_FUNCTIONS[kernel]))
                stage = "gate"
                v = judge(self.oracle, o, s)
                res.update(err_o=v.err_o, err_state=v.err_state, budget_o=v.budget_o, budget_state=v.budget_state,
                           err_vs_default=rel_rms(o, ref) if o.shape == ref.shape else None, check_tokens=v.tokens)
                del o, s
                if not v.passed:
                    res.update(status="incorrect", reason=v.reason)
                    return res
                stage = "timing"
                res["time_us"], res["timing_method"] = self.time_us(self.stage_call(kernel, route, cfg))
                self._registers(res, seen.get(KERNEL_FUNCTIONS[kernel]))
                res["status"] = "ok"
        except Exception as e:  # a failing candidate is data
            res["status"] = "compile_error" if stage == "compile" and _is_compile_error(e) else "error"
            res["reason"] = f"{stage}: {one_line(e)}"
            res["traceback"] = traceback.format_exc()[-1500:]
            res["time_us"] = None
            if not self._context_ok():
                res["context_lost"] = True
        finally:
            self.ops.LAUNCH_HOOKS.remove(hook)
            res["seconds"] = round(time.monotonic() - t0, 3)
        return res

    def _sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def _context_ok(self) -> bool:
        try:
            self._sync()
            return True
        except Exception:
            return False

    @staticmethod
    def _registers(res: dict, compiled) -> None:
        for attr in ("n_regs", "n_spills"):
            try:
                val = getattr(compiled, attr, None)
            except Exception:
                val = None
            if val is not None:
                res[attr] = int(val)


def _is_compile_error(e: BaseException) -> bool:
    names = {"CompilationError", "CompileTimeAssertionFailure", "OutOfResources", "PTXASError"}
    return type(e).__name__ in names or type(e).__module__.startswith("triton.compiler")


def device_identity(device: str) -> dict:
    import triton

    if device != "cuda":
        return {"gpu": "cpu", "compute_capability": None, "triton": triton.__version__}
    env = tuned.device_env(0)
    return dict(env) if env else {"gpu": "unknown", "compute_capability": None, "triton": triton.__version__}


def worker_main(spec_json: str) -> int:
    """Child process: answer one JSON line per candidate request read from stdin.

    The protocol uses the original stdout; everything printed otherwise goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    spec = json.loads(spec_json)
    try:
        bench = _Bench(spec)
        proto.write(json.dumps({"hello": True, "env": device_identity(spec["device"])}) + "\n")
    except Exception as e:
        traceback.print_exc()
        proto.write(json.dumps({"hello": False, "reason": one_line(e)}) + "\n")
        return 1
    for line in sys.stdin:
        req = json.loads(line)
        run = bench.warm if req.get("warm") else bench.evaluate
        res = run(req["kernel"], req["route"], req["point"])
        proto.write(json.dumps(res, default=str) + "\n")
        if res.get("context_lost"):
            return 3  # the CUDA context is poisoned: the parent starts a fresh worker
    return 0


# ----------------------------------------------------------------------------- worker (parent side)
class WorkerDied(RuntimeError):
    pass


class WorkerClient:
    """Talks to one worker subprocess; starts a fresh one after a crash or a timeout."""

    def __init__(self, spec: dict, device: str, gpu: str | None = None, timeout_s: float = 600.0,
                 start_timeout_s: float = 600.0):
        self.spec, self.device, self.gpu = spec, device, gpu
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.env: dict | None = None
        self.start_failures = 0
        self.last_error = ""
        self.eof = False
        self._buf = b""
        self._err = tempfile.TemporaryFile()

    def _environ(self) -> dict:
        from ..bench.runner import worker_env

        env = worker_env(self.device)
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env

    def _start(self) -> None:
        self._buf = b""
        self._err.seek(0)
        self._err.truncate()
        self.proc = subprocess.Popen([sys.executable, "-m", "gdnbench.autotune.tune", "--worker", json.dumps(self.spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     env=self._environ(), bufsize=0)
        hello = self._read(self.start_timeout_s)
        if hello is None or not hello.get("hello"):
            reason = (hello or {}).get("reason") or self._death("worker did not start")
            self._kill()
            self.start_failures += 1
            self.last_error = f"worker failed to start: {reason}"
            raise WorkerDied(self.last_error)
        self.start_failures = 0
        self.env = hello["env"]

    def ensure_started(self) -> dict | None:
        """Start the worker if needed; its device identity, or None when it cannot start."""
        try:
            if self.proc is None:
                self._start()
        except WorkerDied:
            return None
        return self.env

    def _read(self, timeout: float) -> dict | None:
        """The next JSON line; None on timeout or end of file (self.eof says which)."""
        self.eof = False
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self.eof = True
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _death(self, what: str) -> str:
        rc = self.proc.poll() if self.proc else None
        self._err.seek(0)
        lines = [l.strip() for l in self._err.read().decode(errors="replace").splitlines() if l.strip()]
        last = lines[-1][:300] if lines else "no output"
        return f"{what} (exit code {rc}): {last}"

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        self.proc = None

    def evaluate(self, kernel: str, route: str, point: Point, warm: bool = False) -> dict:
        """One candidate's result; a dead or hung worker is recorded as the candidate's result.
        ``warm``: only compile it (a compile-pool worker)."""
        if self.proc is None:
            if self.start_failures >= 2:
                return {"status": "error", "reason": "worker cannot start (failed twice)", "time_us": None}
            try:
                self._start()
            except WorkerDied as e:
                return {"status": "error", "reason": str(e), "time_us": None}
        try:
            req = {"kernel": kernel, "route": route, "point": point, "warm": warm}
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            res = self._read(self.timeout_s)
        except (BrokenPipeError, OSError, json.JSONDecodeError):
            res, self.eof = None, True
        if res is None:
            hung = not self.eof
            if not hung:
                try:
                    self.proc.wait(timeout=10)  # reap it, for its exit code
                except subprocess.TimeoutExpired:
                    pass
            reason = self._death(f"worker hung over {self.timeout_s:.0f} s" if hung else "worker died")
            self._kill()
            return {"status": "timeout" if hung else "crashed", "reason": reason, "time_us": None}
        if res.get("context_lost"):
            self._kill()
        return res

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill()
        self._err.close()


class CompilePool:
    """``n`` compile-only workers (clients from ``make_client``, started on first use);
    :meth:`warm` compiles a batch of candidates in parallel to fill Triton's on-disk cache."""

    def __init__(self, spec: dict, n: int, make_client):
        self.clients = [make_client({**spec, "warm_only": True}) for _ in range(max(0, n))]

    def warm(self, kernel: str, route: str, points: list[Point]) -> list[dict]:
        if not self.clients or not points:
            return []
        import queue
        from concurrent.futures import ThreadPoolExecutor

        free: queue.Queue = queue.Queue()
        for c in self.clients:
            free.put(c)

        def one(p):
            c = free.get()
            try:
                return c.evaluate(kernel, route, p, warm=True)
            finally:
                free.put(c)

        with ThreadPoolExecutor(len(self.clients)) as ex:
            return list(ex.map(one, points))

    def close(self) -> None:
        for c in self.clients:
            c.close()


def ranks_on_node(dist: Dist) -> int:
    """How many ranks share this node's cores: torchrun's LOCAL_WORLD_SIZE (multi-node runs), else
    every rank."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or dist.world)


def default_compile_workers(device: str, ranks: int = 1) -> int:
    """Compile-pool size per rank: the node's cores shared among its ranks, two kept for the
    timing workers and torchrun, at most 8 (each worker holds a CUDA context and the shape's
    inputs); none off the GPU (the interpreter compiles nothing)."""
    if device != "cuda":
        return 0
    return max(0, min(8, (os.cpu_count() or 1) // max(1, ranks) - 2))


def rank_gpu(local_rank: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of this rank's GPU (respecting one already set)."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[local_rank] if local_rank < len(visible) else str(local_rank)


# ----------------------------------------------------------------------------- one tuning run
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
    cache_dir: Path = tuned.TUNED_DIR
    retune: bool = False  # search again where a current cache entry exists
    compile_workers: int = 0  # per rank; see CompilePool
    seeds: bool = True  # start coordinate descent from the fastest of the default and seed_points()
    shard: str = "searches"  # under torchrun: 'searches' or 'candidates' (see tune())


def make_entry(env: dict, task: Task, shape, set_name: str, space: Space, res: SearchResult, opts: TuneOptions) -> dict:
    """The cache entry of one search: its key, the default and the winner, and every candidate."""
    from ..data.results import git_info, utc_stamp

    default_t = res.default.get("time_us") if is_ok(res.default) else None
    best = res.best
    failed = sum(1 for r in res.results if not is_ok(r))
    return {
        "key": tuned.entry_key(env, task.kernel, shape, task.variant),
        "kernel": task.kernel, "variant": task.variant, "route": task.route,
        "shape": {"set": set_name, "id": shape.id, "label": shape.label(), "tokens": shape.tokens},
        "created_utc": utc_stamp(), "git": git_info(),
        "search": {"strategy": res.strategy, "stopped": res.stopped, "rounds": res.rounds,
                   "budget_s": opts.budget_s, "spent_s": round(res.spent_s, 3), "min_gain": opts.min_gain,
                   "exhaustive_max": opts.exhaustive_max, "dims": {d: list(v) for d, v in space.dims},
                   "space_total": space.total, "evaluated": len(res.results), "failed": failed,
                   "pruned_met": res.pruned, "compile_workers": opts.compile_workers},
        "gate": f"whole chunk_{shape.family} forward of the route under the candidate config vs the fp64 recurrence "
                "(gdnbench.oracle.check, data-derived budget); err_vs_default: rel-RMS against the default config",
        "timing": {"what": "the stage kernel alone, stage inputs precomputed with the default config",
                   "method": "median of CUDA-graph replays of one stage call", "warmup": opts.warmup,
                   "rounds": opts.rounds, "iters": opts.iters, "device": opts.device},
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
            "params": {"warmup": opts.warmup, "rounds": opts.rounds, "iters": opts.iters}}
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
    space = build_space(task.kernel, shape.K, shape.V, shape.dtype, shape.family)
    on_event("search", {"task": task, "shape": shape, "estimate": space.pass_size()})
    one_by_one = per_candidate(lambda p: client.evaluate(task.kernel, task.route, p))
    seeds = dist.all_gather(seed_points(opts.cache_dir, env, task, shape) if opts.seeds and dist.rank == 0
                            else None)[0] or []

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


# ----------------------------------------------------------------------------- seeds
MAX_SEEDS = 6
# kernels whose winners seed each other's searches (same config fields): the output kernel with and
# without the fused norm (KDA's output_fused kept its GDN-derived default, BK 32 / 3 stages / cap 168,
# 264 B of stack offline, while the plain output kernel won at BK 128 / 2 stages / no cap)
SEED_KERNELS = {"output": ("output", "output_fused"), "output_fused": ("output_fused", "output")}


def seed_points(cache_dir: Path, env: dict, task: Task, shape, limit: int = MAX_SEEDS) -> list[Point]:
    """Distinct best configs of the same kernel's current cache entries on this machine (and of its
    SEED_KERNELS partner) for shapes of the same family, head sizes and dtype: this very search's
    winner on older code first (an edit made it stale), then this shape's other variants, then other
    shapes. The pool compiles them with the default in one batch, so they cost one compile wave."""
    want = tuned.entry_key(env, task.kernel, shape, task.variant)
    prefix = f"{shape.family}_K{shape.K}_V{shape.V}_"
    previous, same, other = [], [], []
    entries = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tuned.StaleEntry)
        for kernel in SEED_KERNELS.get(task.kernel, (task.kernel,)):
            entries += [(kernel, e) for e in tuned.load_entries(tuned.cache_path(cache_dir, want["gpu"] or "unknown",
                                                                                 kernel))]
    for kernel, e in entries:
        key = e.get("key", {})
        if any(key.get(k) != want[k] for k in ("gpu", "compute_capability", "triton")):
            continue
        sk = key.get("shape_key", "")
        this_search = sk == want["shape_key"] and key.get("variant") == task.variant and kernel == task.kernel
        if not has_winner(e):
            continue
        if key.get("source_hash") != tuned.source_hash(kernel):
            if this_search:
                previous.append(e["best"]["config"])
            continue
        if this_search or not sk.startswith(prefix) or f"_{shape.dtype}_" not in sk:
            continue
        (same if sk == want["shape_key"] else other).append(e["best"]["config"])
    out: list[Point] = []
    for p in previous + same + other:
        if p not in out:
            out.append(p)
    return out[:limit]


# ----------------------------------------------------------------------------- resume
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


def cached_on(cache_dir: Path, task: Task, shape) -> dict[str, dict]:
    """GPU folder -> entry, for the folders under ``cache_dir`` holding a working entry of this search
    for the current kernel source: what --dry-run, which knows no GPU, marks as cached (a real run
    also matches the compute capability and Triton version)."""
    want = {"shape_key": tuned.shape_key(shape), "variant": task.variant, "source_hash": tuned.source_hash(task.kernel)}
    out = {}
    for path in sorted(Path(cache_dir).glob(f"*/{task.kernel}.json")):
        for e in tuned.load_entries(path):
            key = e.get("key", {})
            if all(key.get(k) == v for k, v in want.items()) and has_winner(e):
                out.setdefault(path.parent.name, e)
    return out


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


# ----------------------------------------------------------------------------- report
def report_rows(cache_dir: Path = tuned.TUNED_DIR) -> list[dict]:
    """Per cache entry: default vs tuned stage time, their ratio and the winning config."""
    rows = []
    for path in sorted(Path(cache_dir).glob("*/*.json")):
        for e in tuned.load_entries(path):
            d, b = (e.get("default") or {}).get("time_us"), (e.get("best") or {}).get("time_us")
            win = tuned.winner(e)
            key = e.get("key", {})
            rows.append({
                "gpu": path.parent.name, "kernel": e.get("kernel"), "variant": e.get("variant"),
                "shape_key": key.get("shape_key"), "shape_id": (e.get("shape") or {}).get("id"),
                "default_us": d, "tuned_us": b, "ratio": (b / d) if b and d else None,
                "winner": tuned.point_label(win) if win else "default",
                "evaluated": (e.get("search") or {}).get("evaluated"), "failed": (e.get("search") or {}).get("failed"),
                "stale": key.get("source_hash") != tuned.source_hash(e["kernel"]) if e.get("kernel") in KERNELS else True,
            })
    return rows


def report_table(cache_dir: Path = tuned.TUNED_DIR):
    """The report rows as a gdnbench.analysis.report.Table (µs; ratio = tuned / default, < 1 is faster)."""
    from ..analysis.report import Table

    def us(t):
        return "-" if t is None else f"{t:.1f}"

    rows = report_rows(cache_dir)
    body = [[r["gpu"], r["kernel"], r["variant"], r["shape_key"], us(r["default_us"]), us(r["tuned_us"]),
             "-" if r["ratio"] is None else f"{r['ratio']:.3f}", r["winner"], f"{r['evaluated']}/{r['failed']}",
             "stale" if r["stale"] else ""] for r in rows]
    notes = ["time: the stage kernel alone (CUDA-graph replay), median µs; ratio = tuned/default",
             "stale entries (kernel source changed since tuning) are ignored by gdnbench run"]
    return Table("autotuned stage kernels", ["gpu", "kernel", "variant", "shape key", "default µs", "tuned µs",
                                             "ratio", "winner", "evaluated/failed", ""], body, notes)


def chart(entry: dict, out: str | Path) -> Path:
    """Stage time against maxnreg, one line per num_warps (best over the other dimensions)."""
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
    for w in sorted({k[0] for k in best}):
        pts = sorted((x, t) for (ww, x), t in best.items() if ww == w)
        ax.plot([x for x, _ in pts], [t for _, t in pts], marker="o", label=f"{w} warps")
    d = (entry.get("default") or {}).get("time_us")
    if d:
        ax.axhline(d, color="black", lw=0.8, ls="--", label="default config")
    ticks = sorted({k[1] for k in best})
    ax.set_xticks(ticks)
    ax.set_xticklabels(["none" if x == none_x else str(x) for x in ticks], rotation=90, fontsize=7)
    ax.set_xlabel("maxnreg (none = compiler's choice)")
    ax.set_ylabel("stage time, median (µs)")
    key = entry.get("key", {})
    ax.set_title(f"{entry.get('kernel')} [{entry.get('variant')}] {key.get('shape_key')} on {key.get('gpu')}",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    from ..analysis.plot import save_figure

    return save_figure(fig, out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(worker_main(sys.argv[2]))
    sys.exit("usage: python -m gdnbench.autotune.tune --worker SPEC_JSON (started by gdnbench autotune)")

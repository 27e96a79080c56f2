"""Scale-out: ranks, their GPUs, shared counters and sharded evaluation.

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
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from .plan import Evaluate, shard


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

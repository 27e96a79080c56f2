"""The one timing method. Two times per row:

`wall`: a CUDA event pair around each eager call, calls queued back to back with no
host sync between them (the seeds' contract). When the host cannot enqueue work as
fast as the GPU runs it, this measures the host: launch overhead, Python dispatch,
host syncs inside the call.

`gpu`: the kernels' own time. The call is captured once in a CUDA graph and each
replay is bracketed by an event pair (replays queued back to back, so the GPU never
waits for the host). When capture fails (the backend syncs or allocates on the host
inside the call), the per-call sum of kernel durations that torch.profiler records
is used instead; `gpu.method` says which.

`profiler_us`: that profiler sum is also recorded for every row, as a cross-check
of the graph time (inter-kernel gaps are the difference), and `kernels_us` splits it by
kernel: which stage a route's time goes to (a fused route's gain or loss, stage by stage).

Rounds: the runner interleaves routes round-robin, `iters` calls each per round, so
drift hits all alike; each round's median is kept to show the spread. `l2="cold"`
writes a buffer larger than L2 before each call, outside the event pair.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

L2_FLUSH_BYTES = 256 * 1024 * 1024  # H200 L2 is 60 MB; B200/GB300 126 MB
HOST_BOUND_MARGIN = 0.20  # wall over gpu by more than 20 % = host-bound


@dataclass(frozen=True)
class TimingParams:
    warmup: int = 10
    rounds: int = 5
    iters: int = 20
    l2: str = "warm"
    profiler_iters: int = 10

    def describe(self) -> dict:
        return {
            "wall": "CUDA event pair around each eager call, calls queued back to back (CPU: perf_counter)",
            "gpu": "CUDA event pair around each CUDA-graph replay of one call; torch.profiler kernel sum "
                   "per call where capture fails",
            "profiler": "torch.profiler: sum of CUDA kernel/memcpy/memset durations per call",
            "warmup_calls": self.warmup,
            "rounds": self.rounds,
            "iters_per_round": self.iters,
            "profiler_iters": self.profiler_iters,
            "l2": self.l2,
            "l2_flush_bytes": L2_FLUSH_BYTES if self.l2 == "cold" else 0,
            "interleave": "round-robin over routes of a shape within each round",
            "graph_pool": "one CUDA-graph memory pool shared by a shape's routes",
            "host_bound_margin": HOST_BOUND_MARGIN,
            "statistic": "median (p20, p80, min, mean, per-round medians kept)",
        }


def host_bound(wall_us: float, gpu_us: float) -> bool:
    """Whether the host, not the GPU, set a row's wall time: wall over gpu by more than the margin."""
    return bool(gpu_us > 0 and wall_us > gpu_us * (1 + HOST_BOUND_MARGIN))


def summarize(samples_us: list[float], round_size: int | None = None) -> dict:
    s = sorted(samples_us)
    n = len(s)

    def pct(p):
        return s[min(n - 1, max(0, round(p * (n - 1))))]

    out = {
        "median_us": statistics.median(s),
        "p20_us": pct(0.2),
        "p80_us": pct(0.8),
        "min_us": s[0],
        "mean_us": statistics.fmean(s),
        "n": n,
        "samples_us": [round(x, 3) for x in samples_us],
    }
    if round_size:
        rounds = [samples_us[i:i + round_size] for i in range(0, n, round_size)]
        meds = [statistics.median(r) for r in rounds if r]
        out["round_medians_us"] = [round(m, 3) for m in meds]
        out["round_spread"] = (max(meds) - min(meds)) / statistics.median(meds) if len(meds) > 1 else 0.0
    return out


class _Flusher:
    def __init__(self, cold: bool):
        self.buf = None
        if cold:
            import torch

            self.buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def __call__(self):
        if self.buf is not None:
            self.buf.zero_()


def time_cpu(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _event_pairs(launch, iters: int, flush) -> list[float]:
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        flush()
        starts[i].record()
        launch()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def time_wall(fn, iters: int, l2: str = "warm") -> list[float]:
    return _event_pairs(fn, iters, _Flusher(l2 == "cold"))


class GraphUnsafe(RuntimeError):
    pass


def capture_graph(fn, pool=None):
    """A CUDA graph of one call (warm it first: autotuning must not happen under capture).

    ``pool``: a graph memory pool shared by the graphs of one shape's routes. Each graph otherwise
    keeps a private pool as large as its call's peak: a 32K-token KDA fwd+bwd step holds ~25 GB, so
    four routes' graphs ran the H200 out of memory. The graphs are only replayed one at a time on
    one stream, for timing, so their scratch memory may overlap."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=pool):
            fn()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as e:  # capture rejects host syncs / pageable copies with various errors
        torch.cuda.synchronize()
        raise GraphUnsafe(f"{type(e).__name__}: {e}".splitlines()[0][:200]) from None
    return graph


def graph_pool():
    import torch

    return torch.cuda.graph_pool_handle()


def time_graph(graph, iters: int, l2: str = "warm") -> list[float]:
    return _event_pairs(graph.replay, iters, _Flusher(l2 == "cold"))


def kernel_name(name: str) -> str:
    """A profiler event's kernel name without template arguments or a signature, at most 60 chars."""
    for cut in ("<", "("):
        name = name.split(cut, 1)[0]
    name = name.removeprefix("void ").strip()
    return name[:60] or "?"


def profiler_kernels(fn, iters: int) -> dict[str, float]:
    """Mean device µs per call of each kernel (memcpy, memset) torch.profiler records, by
    :func:`kernel_name`, largest first: where a call's time goes, stage by stage."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    split: dict[str, float] = {}
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            name = kernel_name(evt.name)
            split[name] = split.get(name, 0.0) + evt.device_time / iters
    return dict(sorted(split.items(), key=lambda kv: -kv[1]))


def profiler_kernel_us(fn, iters: int) -> float:
    """Mean per call of the device time torch.profiler records (kernels, memcpy, memset)."""
    return sum(profiler_kernels(fn, iters).values())


def first_call_ms(fn) -> tuple[float, object]:
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, out

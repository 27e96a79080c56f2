"""Measure one shape: support -> first call -> correctness gate -> interleaved timing.

Every (backend, route) pair asked for yields exactly one row, whatever happens:
`skipped` (with the reason), `error` (the exception, one line), `incorrect` (the
gate's figures, no times) or `ok` (gate figures and both times). Rows are built as
`records.Row`, which refuses any other combination, and leave as their JSON objects
(`emit` takes dicts: the worker's stream and the runner's callbacks carry JSON).
"""

from __future__ import annotations

import time
import traceback
from dataclasses import fields
from types import SimpleNamespace
from typing import Callable

from . import timing
from ..backends.base import Backend, one_line
from ..data.records import Check, ResultsError, Row, Stats
from ..data.shapes import Shape

ROW_FIELDS = {f.name for f in fields(Row)} - {"extras", "nulls"}


def make_row(shape: Shape, backend: str, route: str, mode: str, status: str, reason: str = "", **parts) -> Row:
    """A row of ``shape``: ``parts`` are Row fields by name (None: written as null) or, for any other
    name, extras (saved_bytes, traceback, ...). ResultsError when the parts break a row's rules."""
    typed = {k: v for k, v in parts.items() if k in ROW_FIELDS}
    return Row(shape.id, shape.family, backend, route, mode, status, reason, **typed,
               extras={k: v for k, v in parts.items() if k not in ROW_FIELDS},
               nulls=frozenset(k for k, v in typed.items() if v is None))


def base_row(shape: Shape, backend: str, route: str, mode: str, status: str, reason: str = "", **parts) -> dict:
    """`make_row`'s row as its JSON object (the runner's rows for a worker that died)."""
    return make_row(shape, backend, route, mode, status, reason, **parts).to_dict()


def _finite(out) -> bool:
    import torch

    return all(t is None or bool(torch.isfinite(t).all()) for t in out[:2])


def _same_outputs(a, b) -> bool | None:
    """Whether two calls' outputs (o, final state) are bitwise equal; None where the second call returned the first
    one's memory (a backend writing into a buffer it keeps: nothing to compare)."""
    import torch

    pairs = [(x, y) for x, y in zip(a[:2], b[:2]) if x is not None or y is not None]
    if any(x is not None and y is not None and x.data_ptr() == y.data_ptr() for x, y in pairs):
        return None
    return all(x is not None and y is not None and torch.equal(x, y) for x, y in pairs)


def _no_layer(verdict, oracle, backend, shape, route, inputs):
    return verdict


def _mode_ops(mode: str) -> SimpleNamespace:
    """What differs between modes: the timed closure, the oracle, the gate, the finiteness check
    and the fields a passing row adds (`extras` before timing, `finish` after). `stateful`: each
    call changes the closure's own state (decode steps its pool), so the gate gets a fresh closure.
    `judge_layer` adds a layer's gradients around the route to the verdict (fwd_bwd only).
    The rest of a row's life is the same for every mode."""
    same = dict(finish=lambda shape, route, times: {}, stateful=False)
    if mode == "fwd_bwd":
        from .modes import layer, train

        return SimpleNamespace(prepare=train.prepare_step, oracle=train.build_grad_oracle, judge=train.judge_step,
                               judge_layer=layer.judge_route, finite=train.finite, extras=train.row_extras,
                               nan_reason="NaN/Inf in the output or gradients on the full input", **same)
    if mode == "decode":
        from .modes import decode

        return SimpleNamespace(prepare=decode.prepare_step, oracle=decode.build_oracle, judge=decode.judge_step,
                               judge_layer=_no_layer, finite=decode.finite, extras=lambda fn, device: {},
                               finish=decode.finish, stateful=True,
                               nan_reason="NaN/Inf in the output or the state pool on the full input")
    from ..oracle.check import build_oracle, judge

    return SimpleNamespace(prepare=lambda b, shape, r, inputs: b.prepare(shape, r, inputs), oracle=build_oracle,
                           judge=lambda oracle, out: judge(oracle, out[0], out[1]), judge_layer=_no_layer,
                           finite=_finite, extras=lambda fn, device: {},
                           nan_reason="NaN/Inf in the output on the full input", **same)


def gate_shape(shape: Shape, mode: str, device: str, check_tokens: int) -> Shape:
    """The shape the gate judges. On CUDA in mode fwd, the shape itself: the gate judges the timed
    closure at full length, so a long-sequence path (FLA's at 32K) is what gets checked. The oracle
    is a token loop (gdnbench.oracle.reference), launch-bound on the GPU and linear in tokens: on the
    H200 at HV 32, K = V = 128 the fp64 and the bf16 runs took 8.7 s each at 32768 tokens (~260 us per
    token, 1.0 s at 4096), peak 6.9 GiB, once per shape.
    Elsewhere (the CPU's oracle; fwd_bwd's autograd oracle, which keeps ~2 states per token) at
    most ~check_tokens."""
    if mode == "fwd" and device == "cuda":
        return shape
    return shape.shortened(check_tokens)


def measure_shape(shape: Shape, backends: list[Backend], routes: list[str], mode: str, device: str,
                  check_tokens: int, params: timing.TimingParams, emit: Callable[[dict], None]) -> None:
    import torch

    from ..data.inputs import make_inputs

    active: list[tuple[Backend, str]] = []
    for b in backends:
        avail = b.is_available()
        for r in routes:
            sup = b.supports(shape, r, mode, device) if avail else avail
            info = {"backend_version": b.version()}
            if not sup:
                emit(base_row(shape, b.name, r, mode, "skipped", sup.reason, **info))
            else:
                active.append((b, r))
    if not active:
        return

    ops = _mode_ops(mode)
    with torch.no_grad():
        full = make_inputs(shape, device)
        check_shape = gate_shape(shape, mode, device, check_tokens)
        small = full if check_shape is shape else make_inputs(check_shape, device)
        t0 = time.perf_counter()
        oracle = ops.oracle(check_shape, small, shape)
        oracle_s = round(time.perf_counter() - t0, 3)

        ready: dict[tuple[str, str], dict] = {}
        for b, r in active:
            t0 = time.perf_counter()
            # where a run's time goes: the shape's oracle (shared by its rows), this row's check
            # (prepare, first call, gate) and, added by _time_all, its share of the timing loop
            seconds = {"oracle": oracle_s}
            info = {"backend_version": b.version(), "variant": b.variant(shape, r),
                    "config": b.config_label(shape, r, device), "seconds": seconds}
            try:
                fn = ops.prepare(b, shape, r, full)
                first_ms, out = timing.first_call_ms(fn)
                info["variant"] = b.variant(shape, r)  # again: some backends learn what ran on the first call
                if not ops.finite(out):
                    emit(base_row(shape, b.name, r, mode, "incorrect", ops.nan_reason,
                                  check=Check(False, ops.nan_reason, {"finite": False}), first_call_ms=first_ms,
                                  **info))
                    continue
                check_fn = fn if small is full and not ops.stateful else ops.prepare(b, check_shape, r, small)
                first = out if check_fn is fn and mode == "fwd" else None
                del out
                checked = check_fn()
                same = None if first is None else _same_outputs(first, checked)
                if same is not None:  # the gate judges the second call on the inputs of the first
                    info["deterministic"] = same
                del first
                verdict = ops.judge(oracle, checked)
                del checked
                verdict = ops.judge_layer(verdict, oracle, b, check_shape, r, small)
                seconds["check"] = round(time.perf_counter() - t0, 3)
                del check_fn
                check = Check.from_dict(verdict.to_dict())
                if not verdict.passed:
                    emit(base_row(shape, b.name, r, mode, "incorrect", verdict.reason, check=check,
                                  first_call_ms=first_ms, **info))
                    continue
                info.update(ops.extras(fn, device))
                ready[(b.name, r)] = {"fn": fn, "backend": b, "first_ms": first_ms, "check": check, "info": info}
            except Exception as e:  # a backend failure is data: record it and go on
                emit(base_row(shape, b.name, r, mode, "error", one_line(e), traceback=traceback.format_exc()[-2000:],
                              **info))
        del oracle
        if device == "cuda":
            torch.cuda.synchronize()
        _time_all(shape, ready, mode, device, params, emit, ops.finish)


def _time_all(shape, ready: dict, mode: str, device: str, params: timing.TimingParams, emit,
              finish: Callable[[Shape, str, dict], dict] = lambda shape, route, times: {}) -> None:
    cuda = device == "cuda"
    failed: dict[tuple[str, str], str] = {}
    pool = timing.graph_pool() if cuda else None
    for key, st in ready.items():
        st["wall"], st["gpu"], st["graph"] = [], [], None
        t0 = time.perf_counter()
        try:
            for _ in range(params.warmup):
                st["fn"]()
            if cuda and st["backend"].graph_safe:
                try:
                    st["graph"] = timing.capture_graph(st["fn"], pool)
                except timing.GraphUnsafe as e:
                    st["graph_error"] = str(e)
        except Exception as e:
            failed[key] = one_line(e)
        st["timing_s"] = time.perf_counter() - t0
    for _ in range(params.rounds):
        for key, st in ready.items():
            if key in failed:
                continue
            t0 = time.perf_counter()
            try:
                if not cuda:
                    st["wall"] += timing.time_cpu(st["fn"], params.iters)
                    continue
                st["wall"] += timing.time_wall(st["fn"], params.iters, params.l2)
                if st["graph"] is not None:
                    st["gpu"] += timing.time_graph(st["graph"], params.iters, params.l2)
                else:
                    st["gpu"].append(timing.profiler_kernel_us(st["fn"], params.iters))
            except Exception as e:
                failed[key] = one_line(e)
            st["timing_s"] += time.perf_counter() - t0
    for key, st in ready.items():
        b, r = st["backend"], key[1]
        st["info"]["seconds"]["timing"] = round(st["timing_s"], 3)
        common = dict(check=st["check"], first_call_ms=st["first_ms"], **st["info"])
        if key not in failed:
            try:
                times = _times(st, params, cuda)
                times.update(finish(shape, r, {k: t.median_us for k, t in times.items() if isinstance(t, Stats)}))
                emit(base_row(shape, b.name, r, mode, "ok", "", timing_meaningful=cuda, **common, **times))
            except ResultsError as e:  # times a row cannot carry (a zero or NaN median): data too
                failed[key] = f"the times are not a valid row: {e}"
        if key in failed:
            emit(base_row(shape, b.name, r, mode, "error", f"while timing: {failed[key]}", **common))
        st["graph"] = None


def _times(st: dict, params: timing.TimingParams, cuda: bool) -> dict:
    """An ok row's time fields: wall and gpu stats, the profiler's split, host_bound (on the CPU:
    no gpu time, no host_bound)."""
    wall = Stats.from_dict(timing.summarize(st["wall"], params.iters))
    if not cuda:
        return {"wall": wall, "gpu": None, "host_bound": None}
    per_round = params.iters if st["graph"] is not None else 1
    g = timing.summarize(st["gpu"], per_round)
    g["method"] = "graph" if st["graph"] is not None else "profiler"
    if "graph_error" in st:
        g["graph_error"] = st["graph_error"]
    out = {"wall": wall, "gpu": Stats.from_dict(g)}
    try:
        split = timing.profiler_kernels(st["fn"], params.profiler_iters)
        out["profiler_us"] = sum(split.values())
        out["kernels_us"] = {n: round(t, 2) for n, t in split.items()}
    except Exception as e:
        out["profiler_us"] = None
        out["profiler_error"] = one_line(e)
    out["host_bound"] = timing.host_bound(wall.median_us, out["gpu"].median_us)
    return out

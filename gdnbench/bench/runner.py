"""Run a shape set: one long-lived worker subprocess per run, crash isolation, rows streamed back.

An illegal memory access poisons the whole CUDA context, so the backends run in a child process
(`python -m gdnbench.bench.runner`, spoken to through gdnbench.bench.protocol: a task per request,
each row streamed back the moment it exists). If the child dies, the rows it sent are kept, each
backend with missing rows is run again alone in a fresh child, what is still missing becomes an
`error` row carrying the tail of the child's output, and a fresh worker takes the next shape.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Callable

from .. import backends as registry
from ..backends.base import BackendOptions
from ..data.shapes import Shape, ShapeSet, load_file
from ..data.journal import Stopped
from .measure import base_row, measure_shape
from .protocol import Child, module_command, serve, worker_env  # noqa: F401  (worker_env: the runner's too)
from .timing import TimingParams

DEFAULT_WORKER_TIMEOUT_S = 1800
OUTPUT_TAIL = 1500  # characters of a dead worker's output kept in its error rows


class Worker:
    """One worker process that measures shape after shape (a task per request, its rows streamed back).

    Started once per run, not once per shape: worker start and imports took 91 s of a 96 s CPU
    smoke run on 2 cores with one fresh process per shape. A worker that dies is replaced by the
    caller; the rows it sent are kept."""

    def __init__(self, device: str, env: dict | None = None):
        self.child = Child(module_command("gdnbench.bench.runner"), worker_env(device, env))

    def run(self, task: dict, timeout_s: float, on_row: Callable[[dict], None]) -> tuple[list[dict], int, str]:
        """The rows of one task, the exit code (0: the task finished, the worker lives on) and, when it
        died, the tail of its output. A stop signal here, or one that killed the worker (the whole
        process group was told to stop: timeout, Ctrl-C, a closed terminal), raises Stopped."""
        reply = self.child.request(task, timeout_s, on_row)
        rows = list(reply.messages)
        if reply.answered:
            return rows, 0, ""
        tail = reply.output[-OUTPUT_TAIL:]
        if reply.ended == "timeout":
            return rows, -9, f"worker timed out after {timeout_s:.0f} s\n" + tail
        if reply.stop_signal:
            raise Stopped(reply.stop_signal)
        return rows, reply.exit_code or 1, tail  # exit code 0 without the task's end: still a failure

    def close(self) -> None:
        self.child.close()


def _run_child(task: dict, timeout_s: float, on_row: Callable[[dict], None], device: str,
               env: dict | None = None) -> tuple[list[dict], int, str]:
    """One task in a fresh worker of its own."""
    worker = Worker(device, env)
    try:
        return worker.run(task, timeout_s, on_row)
    finally:
        worker.close()


def _summary_line(tail: str, rc: int) -> str:
    lines = [l.strip() for l in tail.strip().splitlines() if l.strip()]
    last = lines[-1] if lines else "no output"
    return f"worker exited with code {rc}: {last[:300]}"


def run_shape_isolated(ss: ShapeSet, shape: Shape, backend_names: list[str], routes: list[str], mode: str,
                       device: str, check_tokens: int, params: TimingParams, on_row, timeout_s: float,
                       worker: Worker | None = None, env: dict | None = None,
                       options: BackendOptions = BackendOptions()) -> tuple[list[dict], bool]:
    """A shape's rows, measured in ``worker`` (a fresh one when None), and whether that worker lives on.

    If it dies, the rows it wrote are kept, each backend with missing rows is run again alone in a
    fresh worker, and what is still missing becomes an `error` row with the tail of its output."""
    task = {"shape_set": ss.path, "shape_id": shape.id, "backends": backend_names, "routes": routes, "mode": mode,
            "device": device, "check_tokens": check_tokens, "params": asdict(params), "options": asdict(options)}
    if worker is None:
        rows, rc, tail = _run_child(task, timeout_s, on_row, device, env)
    else:
        rows, rc, tail = worker.run(task, timeout_s, on_row)
    if rc == 0:
        return rows, True
    have = {(r["backend"], r["route"]) for r in rows}
    for spec in backend_names:
        name = registry.get(spec).name  # a 'module:Class' spec names itself differently in rows
        missing = [r for r in routes if (name, r) not in have]
        if not missing:
            continue
        if len(backend_names) > 1:  # run the backend alone so its neighbours' crash can't take it down
            alone, rc2, tail2 = _run_child({**task, "backends": [spec], "routes": missing}, timeout_s, on_row, device,
                                           env)
            rows += alone
            got = {(r["backend"], r["route"]) for r in alone}
            reason = _summary_line(tail2, rc2)
        else:
            got, reason, tail2 = set(), _summary_line(tail, rc), tail
        for r in missing:
            if (name, r) not in got:
                row = base_row(shape, name, r, mode, "error", reason, stderr_tail=tail2)
                rows.append(row)
                on_row(row)
    return rows, False


def env_groups(backend_names: list[str]) -> list[tuple[dict, list[str]]]:
    """Backends grouped by the worker environment they need, in first-seen order: a group shares a worker."""
    groups: dict[tuple, list[str]] = {}
    for spec in backend_names:
        groups.setdefault(tuple(sorted(registry.get(spec).worker_env.items())), []).append(spec)
    return [(dict(key), specs) for key, specs in groups.items()]


def run_set(ss: ShapeSet, backend_names: list[str], routes: list[str], mode: str = "fwd", device: str = "cuda",
            check_tokens: int = 8192, params: TimingParams = TimingParams(), shape_ids: list[str] | None = None,
            isolate: bool = True, on_row: Callable[[dict], None] = lambda r: None,
            on_shape: Callable[[Shape], None] = lambda s: None, timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
            backend_objects: list | None = None, options: BackendOptions = BackendOptions()) -> list[dict]:
    """All rows of a set. `backend_objects` (in-process only) lets tests pass fake backends. Isolated,
    one worker per worker environment (`env_groups`) measures shape after shape; a worker that dies is
    replaced for the next shape. ``options`` build the backends, in each worker too (its tasks carry them)."""
    shapes = [ss.get(i) for i in shape_ids] if shape_ids else list(ss.shapes)
    rows: list[dict] = []
    workers: dict[tuple, Worker] = {}
    try:
        for shape in shapes:
            on_shape(shape)
            if isolate and backend_objects is None:
                for env, specs in env_groups(backend_names):
                    key = tuple(sorted(env.items()))
                    worker = workers.get(key) or workers.setdefault(key, Worker(device, env))
                    got, alive = run_shape_isolated(ss, shape, specs, routes, mode, device, check_tokens, params,
                                                    on_row, timeout_s, worker, env, options)
                    rows += got
                    if not alive:
                        workers.pop(key).close()
                continue
            objs = backend_objects or [registry.get(n, options) for n in backend_names]

            def emit(row, _rows=rows):
                _rows.append(row)
                on_row(row)

            measure_shape(shape, objs, routes, mode, device, check_tokens, params, emit)
    finally:
        for worker in workers.values():
            worker.close()
    return rows


def _serve() -> int:
    """The worker: a task per request until stdin closes, each row streamed back as it is measured."""
    sets: dict[str, ShapeSet] = {}
    objs: dict[tuple, object] = {}

    def answer(task: dict, send) -> dict:
        if task["shape_set"] not in sets:
            sets[task["shape_set"]] = load_file(task["shape_set"])
        options = BackendOptions(**task["options"])
        for n in task["backends"]:
            objs[n, options] = objs.get((n, options)) or registry.get(n, options)
        backends = [objs[n, options] for n in task["backends"]]
        measure_shape(sets[task["shape_set"]].get(task["shape_id"]), backends, task["routes"], task["mode"],
                      task["device"], task["check_tokens"], TimingParams(**task["params"]), send)
        return {"shape_id": task["shape_id"]}

    return serve(answer)


if __name__ == "__main__":
    sys.exit(_serve())

"""Run a shape set: one worker subprocess per shape, crash isolation, rows streamed back.

An illegal memory access poisons the whole CUDA context, so a shape's backends run in
a child process (`python -m gdnbench.runner TASK.json`) that writes each row as a JSON
line the moment it exists. If the child dies, the rows it wrote are kept, each backend
with missing rows is run again alone in a fresh child, and what is still missing
becomes an `error` row carrying the tail of the child's stderr.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from . import backends as registry
from .journal import STOP_SIGNALS, Stopped
from .measure import base_row, measure_shape
from .shapes import Shape, ShapeSet, load_file
from .timing import TimingParams

PKG_PARENT = str(Path(__file__).resolve().parent.parent)
DEFAULT_WORKER_TIMEOUT_S = 1800
STOP_SIGNUMS = {int(getattr(signal, n)) for n in STOP_SIGNALS if hasattr(signal, n)}


def worker_env(device: str) -> dict:
    env = dict(os.environ)
    env.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _read_rows(path: Path, seen: int) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for line in lines[seen:]:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a half-written last line from a dying child
    return out


def _run_child(task: dict, timeout_s: float, on_row: Callable[[dict], None], device: str) -> tuple[list[dict], int, str]:
    with tempfile.TemporaryDirectory(prefix="gdnbench-") as tmp:
        out_path = Path(tmp) / "rows.jsonl"
        task_path = Path(tmp) / "task.json"
        err_path = Path(tmp) / "stderr.txt"
        task = {**task, "out": str(out_path)}
        task_path.write_text(json.dumps(task))
        rows: list[dict] = []
        with open(err_path, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "gdnbench.runner", str(task_path)],
                                    stdout=err, stderr=subprocess.STDOUT, env=worker_env(device))
            start = time.monotonic()
            try:
                while True:
                    rc = proc.poll()
                    for row in _read_rows(out_path, len(rows)):
                        rows.append(row)
                        on_row(row)
                    if rc is not None:
                        break
                    if time.monotonic() - start > timeout_s:
                        proc.kill()
                        proc.wait()
                        rc = -9
                        break
                    time.sleep(0.2)
            finally:  # a stop signal in the parent: the worker goes too
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for row in _read_rows(out_path, len(rows)):
            rows.append(row)
            on_row(row)
        tail = err_path.read_text()[-1500:] if err_path.exists() else ""
        if -rc in STOP_SIGNUMS:  # the whole process group was told to stop (timeout, Ctrl-C, a closed terminal)
            raise Stopped(signal.Signals(-rc).name)
        if rc == -9 and time.monotonic() - start > timeout_s:
            tail = f"worker timed out after {timeout_s:.0f} s\n" + tail
        return rows, rc, tail


def _summary_line(tail: str, rc: int) -> str:
    lines = [l.strip() for l in tail.strip().splitlines() if l.strip()]
    last = lines[-1] if lines else "no output"
    return f"worker exited with code {rc}: {last[:300]}"


def run_shape_isolated(ss: ShapeSet, shape: Shape, backend_names: list[str], routes: list[str], mode: str,
                       device: str, check_tokens: int, params: TimingParams, on_row, timeout_s: float) -> list[dict]:
    task = {"shape_set": ss.path, "shape_id": shape.id, "backends": backend_names, "routes": routes, "mode": mode,
            "device": device, "check_tokens": check_tokens, "params": asdict(params)}
    rows, rc, tail = _run_child(task, timeout_s, on_row, device)
    if rc == 0:
        return rows
    have = {(r["backend"], r["route"]) for r in rows}
    for spec in backend_names:
        name = registry.get(spec).name  # a 'module:Class' spec names itself differently in rows
        missing = [r for r in routes if (name, r) not in have]
        if not missing:
            continue
        if len(backend_names) > 1:  # run the backend alone so its neighbours' crash can't take it down
            alone, rc2, tail2 = _run_child({**task, "backends": [spec], "routes": missing}, timeout_s, on_row, device)
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
    return rows


def run_set(ss: ShapeSet, backend_names: list[str], routes: list[str], mode: str = "fwd", device: str = "cuda",
            check_tokens: int = 8192, params: TimingParams = TimingParams(), shape_ids: list[str] | None = None,
            isolate: bool = True, on_row: Callable[[dict], None] = lambda r: None,
            on_shape: Callable[[Shape], None] = lambda s: None, timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
            backend_objects: list | None = None) -> list[dict]:
    """All rows of a set. `backend_objects` (in-process only) lets tests pass fake backends."""
    shapes = [ss.get(i) for i in shape_ids] if shape_ids else list(ss.shapes)
    rows: list[dict] = []
    for shape in shapes:
        on_shape(shape)
        if isolate and backend_objects is None:
            rows += run_shape_isolated(ss, shape, backend_names, routes, mode, device, check_tokens, params, on_row,
                                       timeout_s)
        else:
            objs = backend_objects or [registry.get(n) for n in backend_names]

            def emit(row, _rows=rows):
                _rows.append(row)
                on_row(row)

            measure_shape(shape, objs, routes, mode, device, check_tokens, params, emit)
    return rows


def _worker_main(task_path: str) -> int:
    task = json.loads(Path(task_path).read_text())
    ss = load_file(task["shape_set"])
    shape = ss.get(task["shape_id"])
    params = TimingParams(**task["params"])
    objs = [registry.get(n) for n in task["backends"]]
    with open(task["out"], "a") as fh:
        def emit(row):
            fh.write(json.dumps(row) + "\n")
            fh.flush()

        measure_shape(shape, objs, task["routes"], task["mode"], task["device"], task["check_tokens"], params, emit)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1]))

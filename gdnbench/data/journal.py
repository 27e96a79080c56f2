"""A run's journal and its stop signals: no measured row is lost to SIGTERM, SIGHUP or SIGINT.

The results document is written once, at the end, by an atomic rename, so the final path never
holds an empty or partial document. Until then each row is appended, the moment it exists, to
a journal beside it (`<name>.jsonl`): a header line (the document without its rows), then one
line per row. A stopped run still writes its document (marked interrupted) and drops the
journal; a killed one (SIGKILL, a lost machine) leaves the journal, which `--resume` reads.
A `timeout 470 gdnbench run ...` once ended with a 0-byte file and every row lost.
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

from .records import ResultsError, Row, RunDocument

JOURNAL_SUFFIX = ".jsonl"
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def journal_path(results_path: str | Path) -> Path:
    """The journal beside a results file: `x.json` -> `x.jsonl`."""
    p = Path(results_path)
    return p.with_name(p.stem + JOURNAL_SUFFIX)


def results_path_of(path: str | Path) -> Path:
    """The results file a path names: itself, or for a journal the document beside it."""
    p = Path(path)
    return p.with_suffix(".json") if p.suffix == JOURNAL_SUFFIX else p


class Journal:
    """Append-only rows of one run; each line flushed and synced as it is written."""

    def __init__(self, path: Path, header: RunDocument | None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        self._fh = open(self.path, "a")
        if fresh and header is not None:
            self._write({"journal": 1, **header.header()})

    def _write(self, obj: dict) -> None:
        self._fh.write(json.dumps(obj, allow_nan=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def append(self, row: Row) -> None:
        self._write(row.to_dict())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def remove(self) -> None:
        """Drop the journal once its rows are in a document written beside it."""
        self.close()
        self.path.unlink(missing_ok=True)


def read(path: str | Path) -> tuple[RunDocument | None, list[Row]]:
    """The header (a document without rows; None when absent) and the rows of a journal; a
    half-written last line (a process killed mid-write) is dropped. A line that is whole but not a
    row raises ResultsError naming the journal and the line."""
    header, rows = None, []
    with open(path) as fh:
        for i, line in enumerate(fh):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                break
            if not isinstance(obj, dict):
                break
            if i == 0 and "journal" in obj:
                obj = {k: v for k, v in obj.items() if k != "journal"}
                header = RunDocument.from_dict({**obj, "rows": []}, f"{path}: line 1")
                continue
            try:
                rows.append(Row.from_dict(obj))
            except ResultsError as e:
                raise e.at(f"{path}: line {i + 1}") from None
    return header, rows


class Stopped(BaseException):
    """A stop signal arrived while measuring; `name` is the signal's (SIGTERM, ...)."""

    def __init__(self, name: str):
        super().__init__(f"interrupted by {name}")
        self.name = name

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.name))


@contextmanager
def stop_on_signals():
    """Within the block SIGINT, SIGTERM and SIGHUP raise :class:`Stopped` (once: a second signal
    while the caller writes what was measured is ignored). Outside it the old handlers are back."""
    fired: list[str] = []

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if not fired:
            fired.append(name)
            raise Stopped(name)

    old = {}
    for name in STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            try:
                old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread: signals stay as they were
                pass
    try:
        yield fired
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


@contextmanager
def deferred_signals():
    """Stop signals wait until the block ends (the results document is being written)."""
    pending: list[int] = []
    old = {}
    for name in STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            try:
                old[sig] = signal.signal(sig, lambda s, f: pending.append(s))
            except ValueError:
                pass
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)

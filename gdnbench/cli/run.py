"""`gdnbench run`'s measuring and writing: each row journaled as it comes, the document written
by atomic rename at the end (complete, or marked interrupted when a stop signal or an error cut
the run short), and the exit code that says which. See gdnbench.data.journal for the why.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

from rich.text import Text

from ..analysis import report as rep
from ..backends.base import one_line
from ..data.journal import Journal, Stopped, deferred_signals, journal_path, stop_on_signals
from .console import EXIT_NOTHING_MEASURED, EXIT_OK, EXIT_STOPPED_BY_ERROR, console, err_console, say
from .options import UsageError
from .tables import print_tables


def fresh_path(out: Optional[Path], named: Path) -> Path:
    """Where a new run writes: --out FILE.json, else a fresh name (held by its journal) in --out DIR or
    results/<gpu>/."""
    if out is None or out.suffix != ".json":
        from ..data.results import claim_path

        return claim_path(out / named.name if out is not None else named)
    if journal_path(out).exists():
        raise UsageError(f"{journal_path(out)}: the journal of an earlier run of this file; continue it with "
                         f"--resume {out}, or remove it")
    return out


def measure_and_write(ss, wanted, backend_names, routes_l, header, path: Path, resume, stamp, plot_chart, mode,
                      go, card: str | None = None) -> int:
    """Measure, journaling each row; write the document (complete or marked interrupted); the exit code.
    ``header``: the document measured rows join (a new run's, without rows; a resumed run's, with its
    rows); ``card``: this process's GPU UUID, which a resumption records."""
    from dataclasses import replace

    from ..data import results

    journal = Journal(journal_path(path), header)
    started = time.monotonic()
    try:
        rows, stopped = _run_with_progress(ss, len(wanted) * len(backend_names) * len(routes_l), go, journal.append)
    finally:
        journal.close()
    spent, wall = rep.time_spent(rows), time.monotonic() - started
    interrupted = str(stopped) if stopped is not None else None
    with deferred_signals():
        if resume is not None:
            doc = results.merge_resumed(header, rows, wanted, {"argv": sys.argv[1:], "utc": stamp, "shapes": wanted,
                                                               "interrupted": interrupted,
                                                               **({"gpu_uuid": card} if card else {})})
        else:
            doc = replace(header, run={**(header.run or {}), "interrupted": interrupted}, rows=rows)
        written = results.write_atomic(doc, path)
        journal.remove()
    say("wrote", "green", str(written))
    print_tables(console, rep.report_tables(doc))
    console.print(f"{len(wanted)} shape(s) in {wall:.0f} s: oracles {spent['oracle']:.0f} s, checks (first calls "
                  f"included) {spent['check']:.0f} s, timing {spent['timing']:.0f} s, the rest (worker start, "
                  f"imports, inputs) {max(wall - sum(spent.values()), 0):.0f} s", highlight=False, soft_wrap=True)
    if plot_chart and any(r.status == "ok" for r in doc.rows):
        from ..analysis.plot import plot

        say("chart", "green", str(plot(doc, Path(written).with_suffix(".png"), mode=mode)))
    if stopped is not None:
        err_console.print(Text("error: ", style="red") + Text(
            f"{interrupted}; the {len(rows)} rows measured so far were written to {written} (continue with: "
            f"gdnbench run --resume {written})"), highlight=False, soft_wrap=True)
        return stopped.exit_code if isinstance(stopped, Stopped) else EXIT_STOPPED_BY_ERROR
    return EXIT_OK if any(r.status == "ok" for r in rows) else EXIT_NOTHING_MEASURED


class _RunError(Exception):
    """An unexpected error that stopped the runner (not a row's failure); `exit_code` 1."""


def _run_with_progress(ss, total: int, go, journal_row):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ..data.records import Row

    collected: list[Row] = []
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=False) as progress:
        task = progress.add_task(ss.name, total=total)

        def on_row(obj: dict):
            row = Row.from_dict(obj)  # the runner's rows are JSON objects
            # kept before it is journaled: a stop signal that lands in the journal's write (its fsync) still
            # finds the row here, where the document is written from, and the journal is dropped after that
            collected.append(row)
            journal_row(row)
            progress.update(task, advance=1, description=f"{ss.name} {row.shape_id} {row.spec} {row.status}")

        def on_shape(shape):
            progress.update(task, description=f"{ss.name} {shape.id}")

        try:
            with stop_on_signals():
                go(on_row, on_shape)
        except Stopped as e:
            return collected, e
        except Exception as e:  # the rows measured so far are still written by the caller
            return collected, _RunError(one_line(e, "stopped by"))
    return collected, None

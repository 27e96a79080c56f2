"""Report tables on a terminal console (the run, report, compare and autotune commands)."""

from __future__ import annotations

from ..analysis import report as rep


def print_tables(console, tables) -> None:
    for t in tables:
        console.print(rep.to_rich(t))

"""Report tables on the console (the run, report, compare, env and autotune commands), or as a format.

On a terminal Rich draws boxes sized to its width; where stdout is no terminal (a pipe, a file, CI) Rich
would still wrap cells at 80 columns into fragments ("fla:expl / icit"), so there the tables are plain
aligned text at full width."""

from __future__ import annotations

from pathlib import Path

from ..analysis.tables import FORMATS, to_rich, to_text

FORMAT_NAMES = ("table", *FORMATS)


def print_tables(console, tables) -> None:
    if console.is_terminal:
        for t in tables:
            console.print(to_rich(t))
    else:
        console.print(to_text(tables), markup=False, highlight=False, soft_wrap=True, emoji=False)


def emit(console, tables, fmt: str = "table", out: Path | None = None) -> None:
    """``tables`` in ``fmt`` (table: the console's form; markdown, csv, json, text) to stdout or ``out``."""
    if fmt == "table" and out is None:
        print_tables(console, tables)
        return
    text = FORMATS["text" if fmt == "table" else fmt](tables)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        console.print(f"wrote {out}", markup=False, highlight=False, soft_wrap=True)
    else:
        console.file.write(text if text.endswith("\n") else text + "\n")

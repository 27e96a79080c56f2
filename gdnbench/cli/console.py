"""The CLI's consoles, its exit codes, its one way of printing a styled word before plain text and its one-line
error (``fail``: print, then exit)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.text import Text

console = Console()
err_console = Console(stderr=True)

EXIT_OK = 0
EXIT_STOPPED_BY_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_NO_DEVICE = 3
EXIT_NOTHING_MEASURED = 4
EXIT_INTERRUPTED = 130  # autotune stopped by SIGINT / SIGTERM (its finished searches are saved)
EXIT_ABOVE_LIMIT = 1  # compare --fail-above: a B/A ratio over the limit (or nothing to hold to it)
EXIT_CODES_HELP = ("Exit codes: 0 every shape measured (rows that failed their check or were skipped are "
                   "results too); 1 stopped by an unexpected error; 2 bad input (file, field, option value); "
                   "3 no CUDA device; 4 nothing measured (no row passed its check and was timed); "
                   "128+N stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP). A stopped run writes what "
                   "it measured, marked interrupted; continue it with --resume.")


def say(word: str, style: str, text: str = "") -> None:
    """A styled word, then text printed as it is (a path or name with brackets keeps them)."""
    console.print(Text(word, style=style) + Text(f" {text}" if text else ""), highlight=False, soft_wrap=True)


def print_error(msg: str) -> None:
    """The one-line error: ``error:`` and the message printed as it is."""
    err_console.print(Text("error: ", style="red") + Text(msg), highlight=False, soft_wrap=True)


def fail(msg: str, code: int = EXIT_BAD_INPUT):
    """The one-line error and the command's exit with ``code``."""
    print_error(msg)
    raise typer.Exit(code)

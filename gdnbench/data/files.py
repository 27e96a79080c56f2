"""Reading a user's file (shape set, results, calibration) with one-line errors naming it."""

from __future__ import annotations

from pathlib import Path


def read_text(path: str | Path, error: type[ValueError], what: str, fmt: str) -> str:
    """The UTF-8 text of ``path``; a missing, unreadable or binary file raises ``error`` with one line
    naming the path (``what``: 'shape file'; ``fmt``: 'TOML')."""
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: a directory, not a {what}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text (UTF-8 {fmt}) file") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None

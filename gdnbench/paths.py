"""Where gdnbench reads and writes: package data, the per-user cache, results, its own source tree.

- package data ships inside the package (a wheel carries it): the frozen shape sets (``shapes/`` in a
  checkout, installed as ``gdnbench/shape_sets``) and the tuned winners measured on the GPUs we ran
  (``gdnbench/kernels/tuned_configs``);
- what gdnbench writes at run time (autotune entries, Helion configs) goes to the per-user cache
  ``$GDNBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/gdnbench``, else ``~/.cache/gdnbench``: an
  installed package's folder may not be writable, and a user's tuning is not the shipped one;
- results go under ``./results`` of the current directory unless ``--out`` says otherwise.

No torch import here.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# installed: gdnbench/shape_sets (pyproject.toml maps shapes/ there); a checkout: shapes/ beside the package
_INSTALLED_SHAPE_SETS = PACKAGE_DIR / "shape_sets"
SHAPE_SETS_DIR = _INSTALLED_SHAPE_SETS if _INSTALLED_SHAPE_SETS.is_dir() else PACKAGE_DIR.parent / "shapes"
SHIPPED_TUNED_DIR = PACKAGE_DIR / "kernels" / "tuned_configs"
CACHE_ENV = "GDNBENCH_CACHE_DIR"


def user_cache_dir() -> Path:
    """The per-user cache root (read at each call, so the environment decides)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "gdnbench"


def user_tuned_dir() -> Path:
    """Where autotune writes its entries and the Helion backend its configs: <cache>/tuned."""
    return user_cache_dir() / "tuned"


def tuned_read_dirs(cache_dir: Path | None = None) -> list[Path]:
    """The tuning caches a lookup reads, first match wins: ``cache_dir`` alone when given, else the
    user cache, then the shipped winners."""
    if cache_dir is not None:
        return [Path(cache_dir)]
    return [user_tuned_dir(), SHIPPED_TUNED_DIR]


def results_dir() -> Path:
    """The default results root: ./results of the current directory."""
    return Path.cwd() / "results"

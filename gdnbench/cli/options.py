"""The CLI's option vocabularies, each defined once, and the one check of an option's value.

Every command refuses a value outside its option's vocabulary the same way: one line naming
the option, the value and the choices, exit code 2 (`env --device gpu` was once accepted).
"""

from __future__ import annotations

from ..vocab import FAMILIES as _FAMILIES

DEVICES = ("auto", "cuda", "cpu")
L2_MODES = ("warm", "cold")
HELION_EFFORTS = ("none", "quick", "full")
FAMILIES = _FAMILIES + ("all",)  # autotune --family
SHARDS = ("searches", "candidates")


class UsageError(ValueError):
    """An option or argument value the command cannot use; the message names it."""


def _choices(values: tuple) -> str:
    quoted = [str(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def choice(option: str, value, values: tuple):
    """``value`` when it is one of ``values``, else UsageError('--option 'x': use a, b or c')."""
    if value not in values:
        raise UsageError(f"{option} {value!r}: use {_choices(values)}")
    return value

"""The CLI's option vocabularies, each defined once, and the one check of an option's value.

Every command refuses a value outside its option's vocabulary or range the same way: one line naming
the option, the value and what it takes, exit code 2 (`env --device gpu` was once accepted; `run
--worker-timeout -1` timed every shape out and `--check-tokens -5` judged 2 tokens).
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


def at_least(option: str, value, low):
    """``value`` when it is None (the option's default) or at least ``low``, else UsageError('--option -3: use a
    value of at least 1')."""
    if value is not None and value < low:
        raise UsageError(f"{option} {value}: use a value of at least {low}")
    return value

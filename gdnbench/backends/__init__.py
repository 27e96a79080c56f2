"""The explicit backend registry: name -> adapter factory (imports stay lazy)."""

from __future__ import annotations

from .base import (ALL_ROUTES, DECODE_ROUTES, MODES, ROUTES, ROUTES_BY_MODE, TRAIN_ROUTES, Backend,  # noqa: F401
                   Support)


def _reference():
    from .reference import ReferenceBackend

    return ReferenceBackend()


def _fla():
    from .fla import FlaBackend

    return FlaBackend()


def _fla_dispatch():
    from .fla_dispatch import FlaDispatchBackend

    return FlaDispatchBackend()


def _flashqla():
    from .flashqla import FlashQLABackend

    return FlashQLABackend()


def _gdnbench():
    from .gdnbench import GdnbenchBackend

    return GdnbenchBackend()


def _gdnbench_default():
    from .gdnbench import GdnbenchDefaultBackend

    return GdnbenchDefaultBackend()


def _gdnbench_fusedwu():
    from .gdnbench_inloop import GdnbenchFusedWuBackend

    return GdnbenchFusedWuBackend()


def _gdnbench_fusedwu_aqk():
    from .gdnbench_inloop import GdnbenchFusedWuAqkBackend

    return GdnbenchFusedWuAqkBackend()


def _helion():
    from .helion import HelionBackend

    return HelionBackend()


def _helion_linear():
    from .helion import HelionLinearBackend

    return HelionLinearBackend()


def _flashinfer():
    from .flashinfer import FlashinferBackend

    return FlashinferBackend()


REGISTRY = {
    "gdnbench": _gdnbench,
    "gdnbench-default": _gdnbench_default,
    "gdnbench-fusedwu": _gdnbench_fusedwu,
    "gdnbench-fusedwu-aqk": _gdnbench_fusedwu_aqk,
    "fla": _fla,
    "fla-dispatch": _fla_dispatch,
    "flashqla": _flashqla,
    "helion": _helion,
    "helion-linear": _helion_linear,
    "flashinfer": _flashinfer,
    "reference": _reference,
}
DEFAULT_BACKENDS = {"cuda": ("gdnbench", "fla", "fla-dispatch", "flashqla", "helion", "helion-linear", "flashinfer"), "cpu": ("reference", "gdnbench")}


class UnknownBackend(ValueError):
    pass


def get(name: str) -> Backend:
    """A registered backend by name, or a user's adapter class given as 'package.module:Class'."""
    if ":" in name:
        import importlib

        mod, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)()
        except (ImportError, AttributeError) as e:
            raise UnknownBackend(f"backend {name!r}: {e}") from None
    if name not in REGISTRY:
        raise UnknownBackend(f"unknown backend {name!r} (known: {', '.join(REGISTRY)})")
    return REGISTRY[name]()

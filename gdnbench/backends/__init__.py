"""The explicit backend registry: name -> adapter factory of the run's BackendOptions (imports stay lazy)."""

from __future__ import annotations

from .base import (ALL_ROUTES, DECODE_ROUTES, MODES, ROUTES, ROUTES_BY_MODE, TRAIN_ROUTES, Backend,  # noqa: F401
                   BackendOptions, Support)


def _reference(options: BackendOptions):
    from .reference import ReferenceBackend

    return ReferenceBackend()


def _fla(options: BackendOptions):
    from .fla import FlaBackend

    return FlaBackend()


def _fla_safe_gate(options: BackendOptions):
    from .fla import FlaSafeGateBackend

    return FlaSafeGateBackend()


def _fla_dispatch(options: BackendOptions):
    from .fla_dispatch import FlaDispatchBackend

    return FlaDispatchBackend()


def _flashqla(options: BackendOptions):
    from .flashqla import FlashQLABackend

    return FlashQLABackend()


def _gdnbench(options: BackendOptions):
    from .gdnbench import GdnbenchBackend

    return GdnbenchBackend()


def _gdnbench_default(options: BackendOptions):
    from .gdnbench import GdnbenchDefaultBackend

    return GdnbenchDefaultBackend()


def _gdnbench_fusedwu(options: BackendOptions):
    from .gdnbench_inloop import GdnbenchFusedWuBackend

    return GdnbenchFusedWuBackend()


def _gdnbench_fusedwu_aqk(options: BackendOptions):
    from .gdnbench_inloop import GdnbenchFusedWuAqkBackend

    return GdnbenchFusedWuAqkBackend()


def _gdnbench_kda16(options: BackendOptions):
    from .gdnbench_kda16 import GdnbenchKda16Backend

    return GdnbenchKda16Backend()


def _helion(options: BackendOptions):
    from .helion import HelionBackend

    return HelionBackend(effort=options.helion_effort)


def _helion_linear(options: BackendOptions):
    from .helion import HelionLinearBackend

    return HelionLinearBackend(options.helion_examples)


def _flashinfer(options: BackendOptions):
    from .flashinfer import FlashinferBackend

    return FlashinferBackend()


REGISTRY = {
    "gdnbench": _gdnbench,
    "gdnbench-default": _gdnbench_default,
    "gdnbench-fusedwu": _gdnbench_fusedwu,
    "gdnbench-fusedwu-aqk": _gdnbench_fusedwu_aqk,
    "gdnbench-kda16": _gdnbench_kda16,
    "fla": _fla,
    "fla-safe-gate": _fla_safe_gate,
    "fla-dispatch": _fla_dispatch,
    "flashqla": _flashqla,
    "helion": _helion,
    "helion-linear": _helion_linear,
    "flashinfer": _flashinfer,
    "reference": _reference,
}
DEFAULT_BACKENDS = {"cuda": ("gdnbench", "fla", "fla-safe-gate", "fla-dispatch", "flashqla", "helion", "helion-linear", "flashinfer"), "cpu": ("reference", "gdnbench")}


class UnknownBackend(ValueError):
    pass


def get(name: str, options: BackendOptions = BackendOptions()) -> Backend:
    """A registered backend by name, built with ``options``, or a user's adapter class given as
    'package.module:Class' (built without arguments)."""
    if ":" in name:
        import importlib

        mod, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)()
        except (ImportError, AttributeError) as e:
            raise UnknownBackend(f"backend {name!r}: {e}") from None
    if name not in REGISTRY:
        raise UnknownBackend(f"unknown backend {name!r} (known: {', '.join(REGISTRY)})")
    return REGISTRY[name](options)

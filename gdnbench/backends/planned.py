"""Backends whose adapters are not written yet: they appear as skipped rows with the reason."""

from __future__ import annotations

from .base import Backend, no
from ..results import dist_version


class PlannedBackend(Backend):
    def __init__(self, name: str, dist: str, routes: tuple[str, ...], why: str):
        self.name, self.dist, self.routes, self.why = name, dist, routes, why

    def version(self):
        return dist_version(self.dist)

    def is_available(self):
        installed = "installed" if self.version() else "not installed"
        return no(f"{self.why} ({self.dist} {installed})")

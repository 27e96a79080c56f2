"""What a backend adapter is: availability, support per (shape, route, mode), and a prepared call.

`prepare` does every layout, gate and state conversion and any host-side precomputation
outside the timed region and returns a zero-argument closure; calling it runs the
backend once and returns (o [B,T,HV,V], final_state [N,HV,K,V] fp32 or None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

ROUTES = ("explicit", "flag", "fused_q", "fused_qk")
MODES = ("fwd",)


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


YES = Support(True)


def no(reason: str) -> Support:
    return Support(False, reason)


class Backend:
    name: str = "base"
    routes: tuple[str, ...] = ()
    families: tuple[str, ...] = ("gdn", "kda")
    devices: tuple[str, ...] = ("cuda",)
    graph_safe: bool = True

    def is_available(self) -> Support:
        return YES

    def version(self) -> str | None:
        return None

    def supports(self, shape, route: str, mode: str, device: str) -> Support:
        """The common checks; adapters add their own after calling this."""
        if route not in self.routes:
            return no(f"{self.name} has no route {route!r} (its routes: {', '.join(self.routes)})")
        if mode not in MODES:
            return no(f"mode {mode!r} is not implemented yet")
        if shape.family not in self.families:
            return no(f"{self.name} has no {shape.family} kernel")
        if device not in self.devices:
            return no(f"{self.name} does not run on {device}")
        return YES

    def variant(self, shape, route: str) -> str:
        """What actually runs for this route (recorded in every row)."""
        return self.name

    def config_label(self, shape, route: str, device: str) -> str:
        """Which launch config runs (recorded in every row as `config`): 'default' unless tuned."""
        return "default"

    def prepare(self, shape, route: str, inputs) -> Callable[[], tuple]:
        raise NotImplementedError

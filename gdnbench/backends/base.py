"""What a backend adapter is: availability, support per (shape, route, mode), and a prepared call.

`prepare` does every layout, gate and state conversion and any host-side precomputation
outside the timed region and returns a zero-argument closure; calling it runs the
backend once and returns (o [B,T,HV,V], final_state [N,HV,K,V] fp32 or None).

Training mode (`fwd_bwd`, gdnbench/bench/modes/train.py) wraps the same forward closures in a
forward + loss + backward step; its caller compositions (`megatron*`) wrap `kernel`.
Forward-mode routes and training routes are separate lists so that a forward run
asks for exactly what it always asked for.

Decode mode (`decode`, gdnbench/bench/modes/decode.py) runs decode shapes only: `prepare_decode` returns a
closure that advances N sequences by one token, reading and updating their states in place in
the pool `inputs.state_pool` at `inputs.state_indices` (the adapter may convert the pool in
prepare_decode, outside the timed region), and returns (o [1,N,HV,V], the pool as
[P,HV,K,V] at the shape's state dtype: the updated pool itself, or a view of the adapter's copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..vocab import (ALL_ROUTES, DECODE_ROUTES, FAMILIES, FUSED_ROUTES, MODES, NO_BACKWARD_ROUTES,  # noqa: F401
                     PLAIN_ROUTES, ROUTES, ROUTES_BY_MODE, TRAIN_ROUTES)


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


YES = Support(True)


@dataclass(frozen=True)
class BackendOptions:
    """What the command line tells the backends that take options; a run hands them to its workers with
    each task. ``helion_effort``: autotuning of our Helion kernels (none, quick, full);
    ``helion_examples``: a Helion checkout for helion-linear (None: $GDNBENCH_HELION_EXAMPLES)."""

    helion_effort: str = "none"
    helion_examples: str | None = None


def no(reason: str) -> Support:
    return Support(False, reason)


def one_line(e: BaseException, prefix: str = "") -> str:
    """An exception as one line of at most 300 characters (failures are stored as row data)."""
    lines = f"{type(e).__name__}: {e}".strip().splitlines()
    text = lines[0] if lines else type(e).__name__
    return (f"{prefix}: {text}" if prefix else text)[:300]


class Backend:
    name: str = "base"
    routes: tuple[str, ...] = ()
    families: tuple[str, ...] = FAMILIES
    devices: tuple[str, ...] = ("cuda",)
    graph_safe: bool = True
    worker_env: dict[str, str] = {}  # environment its worker process needs (backends that differ run apart)
    train_routes: tuple[str, ...] = ()  # routes with a backward (mode fwd_bwd)
    no_backward: str = "has no backward"  # why fwd_bwd is unsupported when train_routes is empty
    decode_routes: tuple[str, ...] = ()  # routes with a decode step (mode decode)
    no_decode: str = "has no decode step"  # why decode is unsupported when decode_routes is empty

    def is_available(self) -> Support:
        return YES

    def version(self) -> str | None:
        return None

    def supports(self, shape, route: str, mode: str, device: str) -> Support:
        """The common checks; adapters add their own after calling this."""
        if mode not in MODES:
            return no(f"mode {mode!r} is not implemented yet")
        if mode == "decode":
            if not getattr(shape, "decode", False):
                return no(f"shape {shape.id!r} is not a decode shape: mode decode runs decode sets "
                          "(e.g. -s gdn-decode)")
            why = self._decode_route_support(route)
            if not why:
                return why
        elif getattr(shape, "decode", False):
            return no(f"shape {shape.id!r} is a decode shape: run it with --mode decode")
        elif mode == "fwd_bwd":
            why = self._train_route_support(route)
            if not why:
                return why
        elif route not in self.routes:
            if route in TRAIN_ROUTES:
                return no(f"route {route!r} is a training composition: run it with --mode fwd_bwd")
            return no(f"{self.name} has no route {route!r} (its routes: {', '.join(self.routes)})")
        if shape.family not in self.families:
            return no(f"{self.name} has no {shape.family} kernel")
        if device not in self.devices:
            return no(f"{self.name} does not run on {device}")
        return YES

    def _train_route_support(self, route: str) -> Support:
        if route in NO_BACKWARD_ROUTES:
            return no(f"route {route!r} has no backward: it exists only as gdnbench's forward-only Triton "
                      "kernels (no autograd)")
        if not self.train_routes:
            return no(f"{self.name} {self.no_backward}: mode fwd_bwd unsupported")
        if route not in self.train_routes:
            return no(f"{self.name} has no training route {route!r} (its training routes: "
                      f"{', '.join(self.train_routes)})")
        return YES

    def _decode_route_support(self, route: str) -> Support:
        if route in TRAIN_ROUTES and route not in ROUTES:
            return no(f"route {route!r} is a training composition: run it with --mode fwd_bwd")
        if not self.decode_routes:
            return no(f"{self.name} {self.no_decode}: mode decode unsupported")
        if route not in self.decode_routes:
            return no(f"{self.name} has no decode step on route {route!r} (its decode routes: "
                      f"{', '.join(self.decode_routes)})")
        return YES

    def variant(self, shape, route: str) -> str:
        """What actually runs for this route (recorded in every row)."""
        return self.name

    def config_label(self, shape, route: str, device: str) -> str:
        """Which launch config runs (recorded in every row as `config`): 'default' unless tuned."""
        return "default"

    def prepare(self, shape, route: str, inputs) -> Callable[[], tuple]:
        raise NotImplementedError

    def prepare_decode(self, shape, route: str, inputs) -> Callable[[], tuple]:
        """Mode decode: a closure running one decode step in place on the pool (module docstring)."""
        raise NotImplementedError

    def kernel(self, shape, inputs, flag: bool) -> Callable:
        """The bare kernel as fn(q, k) -> (o, final_state), v / g / beta / state / options fixed from
        `inputs`: what the caller compositions (routes megatron*) wrap. q and k may come with HV heads
        (H = HV); `flag` asks the kernel to l2-normalize them itself."""
        raise NotImplementedError

    def caller_l2norm(self, x):
        """The l2norm a caller of this backend runs on q / k outside the kernel (differentiable)."""
        raise NotImplementedError

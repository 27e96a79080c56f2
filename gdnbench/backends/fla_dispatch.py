"""FLA as a user gets it: fla-core with its backend dispatch on.

FLA 0.6.0 hands a call to another package's kernels when that package imports and accepts the
call: FlashQLA for GDN (K = V = 128, fp16/bf16), FlashKDA for chunk_kda without grad, TileLang for
some backward kernels. `fla` pins FLA's own Triton kernels (FLA_DISABLE_BACKEND_DISPATCH=1, read
once at import), so this backend runs in a worker process of its own with dispatch on
(`worker_env`), and its row's variant names what FLA chose: every accepted dispatch
(operation:function -> backend) that FLA logged during the row's first call.
"""

from __future__ import annotations

import os
import sys

from ..data.results import dist_version
from .base import PLAIN_ROUTES, TRAIN_ROUTES, YES, Support, no, one_line
from .fla import HOPPER_BWD_REFUSED, INSTALL_HINT, FlaBackend, gdn_backward_refused
from .flashqla import leader_support

DISPATCH_ON = {"FLA_DISABLE_BACKEND_DISPATCH": "0"}
DISPATCH_TARGETS = (("flash_qla", "flash-qla"), ("flash_kda", "flash-kda"), ("tilelang", "tilelang"))


def _imported_pinned() -> bool:
    """FLA reads its dispatch switch once, at import: pinned if imported (or about to be) with it set."""
    mod = sys.modules.get("fla.backends")
    if mod is not None:
        return bool(mod._DISPATCH_DISABLED)
    return os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1"


def _registries() -> list:
    from fla import backends

    return list(backends._operation_registries.values()) + list(backends._function_registries.values())


def clear_dispatch_log() -> None:
    """Forget what FLA logged, so the next call's dispatches are logged (and read) afresh."""
    for reg in _registries():
        reg._logged.clear()


def dispatch_log() -> list[str]:
    """What FLA dispatched since the last clear: 'operation:function -> backend', in a stable order."""
    taken = set()
    for reg in _registries():
        for key in reg._logged:
            parts = key.split(":")
            if len(parts) == 3:  # 'op:function:backend'; rejections end in ':fail'
                taken.add(f"{parts[0]}:{parts[1]} -> {parts[2]}")
    return sorted(taken)


class FlaDispatchBackend(FlaBackend):
    name = "fla-dispatch"
    routes = PLAIN_ROUTES
    train_routes = TRAIN_ROUTES
    decode_routes = ()
    no_decode = "is measured in prefill only (mode decode runs `fla`)"
    worker_env = DISPATCH_ON

    def __init__(self):
        self._called: set[str] = set()  # shape ids whose op was built (the dispatch log cleared)

    def is_available(self):
        if self.version() is None:
            return no(f"fla-core is not installed ({INSTALL_HINT})")
        targets = [f"{name} {dist_version(dist)}" for name, dist in DISPATCH_TARGETS if dist_version(dist)]
        return Support(True, "dispatch targets installed: " + ", ".join(targets) if targets else
                       "no dispatch target installed: FLA runs its own Triton kernels")

    def supports(self, shape, route, mode, device):
        base = super(FlaBackend, self).supports(shape, route, mode, device)
        if not base:
            return base
        if _imported_pinned():
            return no("FLA was imported with dispatch disabled in this process (fla-dispatch runs in a worker "
                      "of its own: run isolated)")
        if mode == "fwd_bwd" and shape.family == "gdn" and leader_support(shape) and not self._flashqla_imports():
            import torch
            import triton

            if gdn_backward_refused(torch.cuda.get_device_capability(), triton.__version__):
                return no(HOPPER_BWD_REFUSED + "; no dispatch target took the call")
        return YES

    @staticmethod
    def _flashqla_imports() -> bool:
        try:
            import flash_qla  # noqa: F401
        except Exception:
            return False
        return True

    def variant(self, shape, route):
        text = super().variant(shape, route)
        text = text.replace("dispatch ENABLED: may run FlashQLA/FlashKDA/TileLang", "dispatch on")
        if shape.id not in self._called:
            return f"{text}: not yet called"
        try:
            taken = dispatch_log()
        except Exception as e:
            return f"{text}: {one_line(e, 'dispatch log unreadable')}"
        return f"{text}: " + ("; ".join(taken) if taken else "no backend took the call (FLA Triton)")

    def _op(self, shape, inputs, flag):
        for key, value in self.worker_env.items():  # in-process too: FLA's pin is a setdefault at first import
            os.environ.setdefault(key, value)
        op, kw = super()._op(shape, inputs, flag)
        clear_dispatch_log()
        self._called.add(shape.id)
        return op, kw

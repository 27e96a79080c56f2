"""Our GDN kernels with the one-pass loop computing w h and u itself (``GDNConfig.in_loop``, kernels/fused_fwd.py):
opt-in variants to time beside `gdnbench`, e.g. ``gdnbench run -s gdn-qwen6 -b gdnbench,gdnbench-fusedwu``.

`gdnbench-fusedwu`: in_loop "wu" (no w/u kernel; w and u never reach memory), every route.
`gdnbench-fusedwu-aqk`: in_loop "wu_aqk" (q k^T in the loop too, no aqk kernel), routes explicit and flag.
Both take the tuned configs `gdnbench` takes for the kernels they share (l2norm, gram, aqk) and the
default config of the new loop (BV 32, 4 warps, 3 stages), at 2 stages for "wu_aqk": at 3 its varlen
specialization spills (sm_90, Triton 3.6, offline: 255 registers and 8 B of stack; 206 and none at 2), on
the one-pass path on every shape (the form implies it).
"""

from __future__ import annotations

import dataclasses

from .base import no
from .gdnbench import GdnbenchBackend


class GdnbenchFusedWuBackend(GdnbenchBackend):
    name = "gdnbench-fusedwu"
    families = ("gdn",)
    in_loop = "wu"

    def supports(self, shape, route, mode, device):
        base = super().supports(shape, route, mode, device)
        if base and shape.K > 128:
            return no(f"K={shape.K}: the one-pass loop is built for K <= 128")
        return base

    def variant(self, shape, route):
        return super().variant(shape, route) + f" in_loop={self.in_loop}"

    def _config(self, shape, route, device):
        """`gdnbench`'s (config, label) for the shape and route (resolved once there), in this loop's form."""
        cfg, label = super()._config(shape, route, device)
        return (dataclasses.replace(cfg, one_pass=True, in_loop=self.in_loop),
                f"{label.split('; ')[0]}; one pass, in loop: {self.in_loop}")


class GdnbenchFusedWuAqkBackend(GdnbenchFusedWuBackend):
    name = "gdnbench-fusedwu-aqk"
    routes = ("explicit", "flag")
    in_loop = "wu_aqk"

    def _config(self, shape, route, device):
        cfg, label = super()._config(shape, route, device)
        return dataclasses.replace(cfg, fused_out=dataclasses.replace(cfg.fused_out, num_stages=2)), label

"""Our GDN kernels with the one-pass loop computing w h and u itself (``GDNConfig.in_loop``, kernels/fused_fwd.py):
opt-in variants to time beside `gdnbench`, e.g. ``gdnbench run -s gdn-qwen6 -b gdnbench,gdnbench-fusedwu``.

`gdnbench-fusedwu`: in_loop "wu" (no w/u kernel; w and u never reach memory), every route.
`gdnbench-fusedwu-aqk`: in_loop "wu_aqk" (q k^T in the loop too, no aqk kernel), routes explicit and flag.
Both take the tuned configs `gdnbench` takes for the kernels they share (l2norm, gram, aqk), on the
one-pass path on every shape (the form implies it). The loop's config: its tuned winner (fused_out) where
the cache holds one; else, for "wu", state_out's tuned config, and for "wu_aqk" the default (BV 32, 4 warps)
at 2 stages: at 3 its varlen specialization spills (sm_90, Triton 3.6, offline: 255 registers and 8 B of
stack; 206 and none at 2).

H200, gdn-qwen6, the loop at its default config against state_out + wu tuned (gpu µs): equal where
state_out's winner is the same BV 32 (h16_hv32_fixed8k 263 vs 262, fixed32k 1044 vs 1057), 1.42x slower
where it is BV 64 (h16_hv64_fixed8k 549 vs 386); at state_out's BV 64 / 4 warps / 3 stages, 0.90x
(B1 T8192 H16 HV64: 350 vs 391; HV48: 322 vs 364).
"""

from __future__ import annotations

import dataclasses

from .base import PLAIN_ROUTES, no
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

    def _forms(self, shape, route, env, cfg, won):
        """`gdnbench`'s tuned config for the shape and route in this loop's form."""
        cfg = cfg or _defaults(shape)[0]
        cfg, how = self._loop_config(dataclasses.replace(cfg, one_pass=True, in_loop=self.in_loop), shape)
        return cfg, f"; one pass, in loop: {self.in_loop}{how}"

    def _loop_config(self, cfg, shape):
        """(config, note): the loop at state_out's tuned config unless the loop has its own winner."""
        from ..kernels.config import validate

        default, elt = _defaults(shape)
        if cfg.fused_out != default.fused_out or cfg.state_out == default.state_out:
            return cfg, ""
        new = dataclasses.replace(cfg, fused_out=cfg.state_out)
        try:
            validate(new, shape.K, shape.V, elt)
        except ValueError:
            return cfg, ""
        return new, " at state_out's config"


class GdnbenchFusedWuAqkBackend(GdnbenchFusedWuBackend):
    name = "gdnbench-fusedwu-aqk"
    routes = PLAIN_ROUTES
    in_loop = "wu_aqk"
    untuned = ("fused_out",)  # its loop runs at the default config: fused_out's winners are the "wu" form's

    def _loop_config(self, cfg, shape):
        """The default loop at 2 stages (tuned fused_out winners are the "wu" form's)."""
        loop = _defaults(shape)[0].fused_out
        return dataclasses.replace(cfg, fused_out=dataclasses.replace(loop, num_stages=2)), ""


def _defaults(shape):
    """(the built-in GDNConfig for the shape's heads and dtype, the dtype's bytes)."""
    from ..data.inputs import torch_dtype
    from ..kernels.config import default_config

    elt = torch_dtype(shape.dtype).itemsize
    return default_config(shape.K, shape.V, elt), elt

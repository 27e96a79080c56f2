"""Our KDA forward in 16-token tiles (``GDNConfig.kda_chunk16``, kernels/kda16.py): an opt-in variant to time beside
`gdnbench`, e.g. ``gdnbench run -s kda-legacy6 -b gdnbench,gdnbench-kda16,fla``.

Two kernels (a prepare per tile and head, one loop per V block and sequence*head that forms u and o itself) at
their tuned configs where the cache has them, else their built-in ones, as every kernel `gdnbench` runs.  Bounded gates only:
a shape without a lower_bound is refused with the reason.
"""

from __future__ import annotations

import dataclasses

from .base import no
from .gdnbench import GdnbenchBackend


class GdnbenchKda16Backend(GdnbenchBackend):
    name = "gdnbench-kda16"
    families = ("kda",)

    def supports(self, shape, route, mode, device):
        base = super().supports(shape, route, mode, device)
        if base and shape.lower_bound is None:
            return no("the 16-token form takes bounded gates only (the shape has no lower_bound)")
        return base

    def variant(self, shape, route):
        return super().variant(shape, route) + " kda_chunk16"

    def _forms(self, shape, route, env, cfg, won):
        from ..data.inputs import torch_dtype
        from ..kernels.config import default_config

        base = cfg or default_config(shape.K, shape.V, torch_dtype(shape.dtype).itemsize, "kda")
        return dataclasses.replace(base, kda_chunk16=True), "; kda_chunk16"

"""The pure-torch fp64 recurrence as a backend: the CPU smoke runs' backend (slow by design)."""

from __future__ import annotations

from .base import Backend


class ReferenceBackend(Backend):
    name = "reference"
    routes = ("explicit", "flag")
    devices = ("cpu", "cuda")
    graph_safe = False

    def version(self) -> str | None:
        from .. import __version__

        return __version__

    def variant(self, shape, route: str) -> str:
        return "torch fp64 token recurrence" + (" (caller l2norm)" if route == "explicit" else " (l2norm inside)")

    def prepare(self, shape, route, inputs):
        import torch

        from ..reference import l2norm, recurrence

        q, k = inputs.q, inputs.k
        normalize = route == "flag"
        out_dtype = inputs.v.dtype

        def call():
            qq, kk = (q, k) if normalize else (l2norm(q), l2norm(k))
            o, s = recurrence(qq, kk, inputs.v, inputs.g, inputs.beta, scale=inputs.scale,
                              initial_state=inputs.initial_state, cu_seqlens=inputs.cu_seqlens_list,
                              normalize=normalize, dtype=torch.float64)
            return o.to(out_dtype), s.float()

        return call

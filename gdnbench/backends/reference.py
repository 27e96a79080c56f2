"""The pure-torch fp64 recurrence as a backend: the CPU smoke runs' backend (slow by design).

It is plain torch, so autograd runs through it: it is also the CPU backend of mode fwd_bwd,
for every training route."""

from __future__ import annotations

from .base import TRAIN_ROUTES, Backend

VARIANTS = {"explicit": " (caller l2norm)", "flag": " (l2norm inside)",
            "megatron": " (megatron: l2norm on fused q|k, split, repeat_interleave to HV heads)",
            "megatron_flag": " (megatron_flag: fused q|k split, repeat_interleave to HV heads, l2norm inside)"}


class ReferenceBackend(Backend):
    name = "reference"
    routes = ("explicit", "flag")
    train_routes = TRAIN_ROUTES
    devices = ("cpu", "cuda")
    graph_safe = False

    def version(self) -> str | None:
        from .. import __version__

        return __version__

    def variant(self, shape, route: str) -> str:
        return "torch fp64 token recurrence" + VARIANTS.get(route, "")

    def caller_l2norm(self, x):
        from ..reference import l2norm

        return l2norm(x)

    def kernel(self, shape, inputs, flag):
        import torch

        from ..reference import recurrence

        out_dtype = inputs.v.dtype

        def call(q, k):
            o, s = recurrence(q, k, inputs.v, inputs.g, inputs.beta, scale=inputs.scale,
                              initial_state=inputs.initial_state, cu_seqlens=inputs.cu_seqlens_list,
                              normalize=flag, dtype=torch.float64)
            return o.to(out_dtype), s.float()

        return call

    def prepare(self, shape, route, inputs):
        q, k = inputs.q, inputs.k
        kern = self.kernel(shape, inputs, flag=route == "flag")
        if route == "flag":
            return lambda: kern(q, k)
        return lambda: kern(self.caller_l2norm(q), self.caller_l2norm(k))

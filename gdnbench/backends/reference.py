"""The pure-torch fp64 recurrence as a backend: the CPU smoke runs' backend (slow by design).

It is plain torch, so autograd runs through it: it is also the CPU backend of mode fwd_bwd,
for every training route, and of mode decode (gather the N states, one fp64 step, store them
back in place at the pool's dtype)."""

from __future__ import annotations

from .base import DECODE_ROUTES, PLAIN_ROUTES, TRAIN_ROUTES, Backend

VARIANTS = {"explicit": " (caller l2norm)", "flag": " (l2norm inside)",
            "megatron": " (megatron: l2norm on fused q|k, split, repeat_interleave to HV heads)",
            "megatron_flag": " (megatron_flag: fused q|k split, repeat_interleave to HV heads, l2norm inside)"}


class ReferenceBackend(Backend):
    name = "reference"
    routes = PLAIN_ROUTES
    train_routes = TRAIN_ROUTES
    decode_routes = DECODE_ROUTES
    devices = ("cpu", "cuda")
    graph_safe = False

    def version(self) -> str | None:
        from .. import __version__

        return __version__

    def variant(self, shape, route: str) -> str:
        what = "torch fp64 one-token step on pool[idx], stored back with index_copy_" if shape.decode else \
            "torch fp64 token recurrence"
        return what + VARIANTS.get(route, "")

    def caller_l2norm(self, x):
        from ..oracle.reference import l2norm

        return l2norm(x)

    def kernel(self, shape, inputs, flag):
        import torch

        from ..oracle.reference import recurrence

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

    def prepare_decode(self, shape, route, inputs):
        from ..oracle.reference import decode_step

        pool, idx = inputs.state_pool, inputs.state_indices
        q, k, v, g, beta = inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta
        flag = route == "flag"

        def call():
            qq, kk = (q, k) if flag else (self.caller_l2norm(q), self.caller_l2norm(k))
            o, s = decode_step(qq, kk, v, g, beta, pool.index_select(0, idx), scale=inputs.scale, normalize=flag)
            pool.index_copy_(0, idx, s.to(pool.dtype))
            return o.to(v.dtype), pool

        return call

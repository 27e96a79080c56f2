"""flash-linear-attention (fla-core 0.6.0): chunk_gated_delta_rule / chunk_kda.

KDA: `fla` calls chunk_kda as FLA ships it (safe_gate off: its token-parallel intra-chunk kernel, any
gates); `fla-safe-gate` opts into its tensor-core sub-chunk intra for gates bounded by the shape's
lower_bound.  On the H200 the safe gate is 0.89x the default's time (h96_fixed 2604.5 against 2936.8
us) but its o is biased on every kda-legacy6 shape (scale error 7.4e-4 against a budget of 7.6e-5;
the default's 3.4e-5), which the gate rejects.

Routes: `explicit` = FLA's l2norm on q and k by the caller, then the kernel;
`flag` = use_qk_l2norm_in_kernel=True (FLA runs the same l2norm kernels inside its
autograd Function, so both routes launch the same kernels; the difference is host work).

Mode decode (one token per sequence, states in a pool): `fused_recurrent_gated_delta_rule` for
GDN and `fused_recurrent_kda_fwd` for KDA, both with a truly in-kernel l2norm on route `flag`.
FLA 0.6.0's GDN recurrence takes no slot indices: the step gathers pool[idx], runs it (int64
cu_seqlens 0..N, beta by keyword: the 5th positional argument is gk) and scatters its fp32 final
state back with index_copy_ at the pool's dtype, all inside the timed step, as a caller of that
API must. Its KDA recurrence (the function vLLM's decode kernel became) reads and updates the
pool in place through `ssm_state_indices` with `inplace_final_state=True`.

FLA 0.6.0 silently hands calls to FlashQLA / FlashKDA / TileLang when those import.
We pin its own Triton kernels with FLA_DISABLE_BACKEND_DISPATCH=1, which FLA reads at
import: set before the first `import fla` (the worker process does so) and recorded
in every row's variant.
"""

from __future__ import annotations

import os
import re

from ..data.results import dist_version
from .base import DECODE_ROUTES, PLAIN_ROUTES, TRAIN_ROUTES, YES, Backend, no, one_line

CHUNK = 64
DISTS = ("fla-core", "flash-linear-attention")  # FLA's wheel, under either name
INSTALL_HINT = "pip install fla-core==0.6.0"


def fla_version() -> str | None:
    """The installed FLA wheel's version (either name), or None."""
    return next((v for v in map(dist_version, DISTS) if v), None)


HOPPER_BWD_REFUSED = "FLA 0.6.0 refuses gated GDN backward on Hopper with Triton < 3.7.1 (fla issue #640)"


def _pin_dispatch() -> None:
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def gdn_backward_refused(capability: tuple[int, int], triton_version: str) -> bool:
    """FLA 0.6.0's chunk_bwd_dqkwg raises for a gate on Hopper (sm 9.x) with Triton in [3.4, 3.7.1):
    those Tritons miscompile it (fla issue #640). KDA's backward does not go through it."""
    return capability[0] == 9 and (3, 4, 0) <= _version_tuple(triton_version) < (3, 7, 1)


class FlaBackend(Backend):
    name = "fla"
    routes = PLAIN_ROUTES
    train_routes = TRAIN_ROUTES
    decode_routes = DECODE_ROUTES
    devices = ("cuda",)
    kda_safe_gate = False  # chunk_kda(safe_gate=True, lower_bound=shape's)

    def is_available(self):
        if self.version() is None:
            return no(f"fla-core is not installed ({INSTALL_HINT})")
        _pin_dispatch()
        try:
            import fla  # noqa: F401
        except Exception as e:  # an import can fail in many ways (missing deps, bad triton)
            return no(one_line(e, "import fla failed"))
        return YES

    def version(self):
        return fla_version()

    def variant(self, shape, route):
        try:
            from fla.backends import _DISPATCH_DISABLED
        except ImportError:
            _DISPATCH_DISABLED = None
        op = ("chunk_gated_delta_rule" if shape.family == "gdn" else
              "chunk_kda(safe_gate, lower_bound)" if self.kda_safe_gate else "chunk_kda")
        if shape.decode:
            op = ("fused_recurrent_gated_delta_rule on pool[idx] gathered, fp32 final state scattered back "
                  "(index_copy_) at the pool dtype" if shape.family == "gdn" else
                  "fused_recurrent_kda_fwd(ssm_state_indices, inplace_final_state) in place on the pool")
        pin = {True: "dispatch disabled: FLA Triton", False: "dispatch ENABLED: may run FlashQLA/FlashKDA/TileLang",
               None: "dispatch state unknown"}[_DISPATCH_DISABLED]
        how = {"explicit": "caller l2norm", "flag": "use_qk_l2norm_in_kernel=True" + (" (in-kernel)" if shape.decode else ""),
               "megatron": "megatron: l2norm on fused q|k, split, repeat_interleave to HV heads, flag off",
               "megatron_flag": "megatron_flag: fused q|k split, repeat_interleave to HV heads, "
                                "use_qk_l2norm_in_kernel=True"}[route]
        return f"fla {self.version()} {op}, {how}, {pin}"

    def supports(self, shape, route, mode, device):
        base = super().supports(shape, route, mode, device)
        if not base:
            return base
        if self.kda_safe_gate and shape.family == "kda" and shape.lower_bound is None:
            return no("chunk_kda's safe gate needs a lower_bound")
        if mode == "fwd_bwd" and shape.family == "gdn":
            import torch
            import triton

            if gdn_backward_refused(torch.cuda.get_device_capability(), triton.__version__):
                return no(HOPPER_BWD_REFUSED)
        return YES

    def _op(self, shape, inputs, flag: bool):
        """(FLA op, its keyword arguments) for q / k given with or without the in-kernel l2norm."""
        _pin_dispatch()
        kw = dict(scale=inputs.scale, initial_state=inputs.initial_state, output_final_state=True,
                  use_qk_l2norm_in_kernel=flag)
        if inputs.cu_seqlens is not None:
            # host-side index work done here, outside the timed call (else FLA syncs per call)
            kw.update(cu_seqlens=inputs.cu_seqlens, cu_seqlens_cpu=inputs.cu_seqlens.cpu())
        if shape.family == "gdn":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as op

            if inputs.cu_seqlens is not None:
                from fla.ops.utils.index import prepare_chunk_indices

                kw["chunk_indices"] = prepare_chunk_indices(inputs.cu_seqlens, CHUNK,
                                                            cu_seqlens_cpu=kw["cu_seqlens_cpu"])
        else:
            from fla.ops.kda import chunk_kda as op

            if self.kda_safe_gate:
                kw.update(safe_gate=True, lower_bound=inputs.lower_bound)
        return op, kw

    def caller_l2norm(self, x):
        from fla.modules.norm.l2norm import l2norm

        return l2norm(x)

    def kernel(self, shape, inputs, flag):
        op, kw = self._op(shape, inputs, flag)
        v, g, beta = inputs.v, inputs.g, inputs.beta
        return lambda q, k: op(q, k, v, g, beta, **kw)

    def prepare(self, shape, route, inputs):
        l2norm = self.caller_l2norm
        op, kw = self._op(shape, inputs, route == "flag")
        q, k, v, g, beta = inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta

        if route == "explicit":
            def call():
                return op(l2norm(q), l2norm(k), v, g, beta, **kw)
        else:
            def call():
                return op(q, k, v, g, beta, **kw)
        return call

    def prepare_decode(self, shape, route, inputs):
        import torch

        op, l2norm = _decode_op(shape.family), _l2norm_fn()
        pool, idx, cu = inputs.state_pool, inputs.state_indices, inputs.cu_seqlens.to(torch.int64)  # FLA wants int64
        q, k, v, g, beta = inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta
        flag = route == "flag"
        if shape.family == "gdn":
            def step(q, k):
                o, ht = op(q, k, v, g, beta=beta, scale=inputs.scale, initial_state=pool.index_select(0, idx),
                           output_final_state=True, use_qk_l2norm_in_kernel=flag, cu_seqlens=cu)
                pool.index_copy_(0, idx, ht.to(pool.dtype))
                return o, pool
        else:
            def step(q, k):
                o, _ = op(q=q, k=k, v=v, g=g, beta=beta, scale=inputs.scale, initial_state=pool,
                          inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx,
                          use_qk_l2norm_in_kernel=flag)
                return o, pool

        if flag:
            return lambda: step(q, k)
        return lambda: step(l2norm(q), l2norm(k))


class FlaSafeGateBackend(FlaBackend):
    """FLA's KDA with its safe gate (prefill only; GDN has none)."""

    name = "fla-safe-gate"
    decode_routes = ()
    no_decode = "is measured in prefill only (decode does not use chunk_kda; mode decode runs `fla`)"
    kda_safe_gate = True

    def supports(self, shape, route, mode, device):
        if shape.family != "kda":
            return no("the safe gate is chunk_kda's (GDN runs on `fla`)")
        return super().supports(shape, route, mode, device)


# Module-level so tests can replace them (FLA's Triton kernels need a GPU).
def _decode_op(family: str):
    """FLA's decode entry point: GDN's fused recurrence, or KDA's with pool indices."""
    _pin_dispatch()
    if family == "gdn":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        return fused_recurrent_gated_delta_rule
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    return fused_recurrent_kda_fwd


def _l2norm_fn():
    from fla.modules.norm.l2norm import l2norm

    return l2norm

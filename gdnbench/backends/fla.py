"""flash-linear-attention (fla-core 0.6.0): chunk_gated_delta_rule / chunk_kda.

Routes: `explicit` = FLA's l2norm on q and k by the caller, then the kernel;
`flag` = use_qk_l2norm_in_kernel=True (FLA runs the same l2norm kernels inside its
autograd Function, so both routes launch the same kernels; the difference is host work).

FLA 0.6.0 silently hands calls to FlashQLA / FlashKDA / TileLang when those import.
We pin its own Triton kernels with FLA_DISABLE_BACKEND_DISPATCH=1, which FLA reads at
import: set before the first `import fla` (the worker process does so) and recorded
in every row's variant.
"""

from __future__ import annotations

import os

from .base import YES, Backend, no

CHUNK = 64


def _pin_dispatch() -> None:
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


class FlaBackend(Backend):
    name = "fla"
    routes = ("explicit", "flag")
    devices = ("cuda",)

    def is_available(self):
        if _dist_version("fla-core") is None and _dist_version("flash-linear-attention") is None:
            return no("fla-core is not installed (pip install fla-core==0.6.0)")
        _pin_dispatch()
        try:
            import fla  # noqa: F401
        except Exception as e:  # an import can fail in many ways (missing deps, bad triton)
            return no(f"import fla failed: {type(e).__name__}: {e}".splitlines()[0])
        return YES

    def version(self):
        return _dist_version("fla-core") or _dist_version("flash-linear-attention")

    def variant(self, shape, route):
        try:
            from fla.backends import _DISPATCH_DISABLED
        except ImportError:
            _DISPATCH_DISABLED = None
        op = "chunk_gated_delta_rule" if shape.family == "gdn" else "chunk_kda(safe_gate, lower_bound)"
        pin = {True: "dispatch disabled: FLA Triton", False: "dispatch ENABLED: may run FlashQLA/FlashKDA/TileLang",
               None: "dispatch state unknown"}[_DISPATCH_DISABLED]
        how = "caller l2norm" if route == "explicit" else "use_qk_l2norm_in_kernel=True"
        return f"fla {self.version()} {op}, {how}, {pin}"

    def supports(self, shape, route, mode, device):
        base = super().supports(shape, route, mode, device)
        if not base:
            return base
        if shape.family == "kda" and shape.lower_bound is None:
            return no("chunk_kda's safe gate needs a lower_bound")
        return YES

    def prepare(self, shape, route, inputs):
        _pin_dispatch()
        from fla.modules.norm.l2norm import l2norm

        kw = dict(scale=inputs.scale, initial_state=inputs.initial_state, output_final_state=True,
                  use_qk_l2norm_in_kernel=(route == "flag"))
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

            kw.update(safe_gate=True, lower_bound=inputs.lower_bound)
        q, k, v, g, beta = inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta

        if route == "explicit":
            def call():
                return op(l2norm(q), l2norm(k), v, g, beta, **kw)
        else:
            def call():
                return op(q, k, v, g, beta, **kw)
        return call

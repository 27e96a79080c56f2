"""Our own Triton kernels (gdnbench.kernels.ops): GDN (chunk_gdn) and KDA (chunk_kda) forwards with the
normalization routes.

`explicit` = our l2norm on q and k by the caller, then norm="none"; `flag` = the op's
standalone l2norm pass; `fused_q` / `fused_qk` = the norm folded into the kernels.
On the CPU the kernels run under TRITON_INTERPRET=1 (the worker sets it for --device cpu).
"""

from __future__ import annotations

from .base import ROUTES, YES, Backend, no, one_line


class GdnbenchBackend(Backend):
    name = "gdnbench"
    routes = ROUTES
    families = ("gdn", "kda")
    devices = ("cuda", "cpu")
    no_backward = "has no backward (gdnbench.kernels.ops is a forward-only Triton op, no autograd)"
    no_decode = "has no decode kernel (gdnbench.kernels.ops is a chunked forward)"
    untuned: tuple[str, ...] = ()  # kernels whose tuned winners this backend's form does not run (not in its label)

    def __init__(self):
        self._resolved: dict = {}

    def is_available(self):
        try:
            from ..kernels import ops  # noqa: F401
        except Exception as e:  # triton missing or broken
            return no(one_line(e, "import gdnbench.kernels.ops failed"))
        return YES

    def version(self):
        from .. import __version__

        return __version__

    def supports(self, shape, route, mode, device):
        base = super().supports(shape, route, mode, device)
        if not base:
            return base
        if not (16 <= shape.K <= 256 and 16 <= shape.V <= 256):
            return no(f"K={shape.K}, V={shape.V}: our kernels take head sizes in [16, 256]")
        if device == "cpu" and shape.dtype == "bfloat16":
            return no("bf16 dots are wrong under TRITON_INTERPRET=1 on the CPU; use fp32/fp16 shapes")
        return YES

    def variant(self, shape, route):
        bound = f" lower_bound={shape.lower_bound}" if shape.family == "kda" else ""
        return f"gdnbench.kernels.ops.chunk_{shape.family} norm={'none' if route == 'explicit' else route}{bound}"

    def _config(self, shape, route, device):
        """(GDNConfig or None for the built-in default, label): the autotune cache's config on CUDA in this
        backend's form (:meth:`_forms`); the label lists the winners of the kernels that run, then the forms'
        notes.

        Resolved once per (shape id, route): the gate's shortened copy of a shape must run the
        config that the full shape is timed with, though its token count keys another entry."""
        key = (shape.id, route)
        if key not in self._resolved:
            from ..kernels.tuned import Winners

            cfg, won, env = None, Winners(), None
            if device == "cuda":
                from ..kernels.cache_key import device_env
                from ..kernels.tuned import tuned_winners

                env = device_env()
                cfg, won = tuned_winners(shape, route, env)
            cfg, notes = self._forms(shape, route, env, cfg if won else None, won)
            cuda_prep = _cuda_prepare(shape, cfg, device)
            label = "default"
            if won:
                from ..kernels import ops

                skip = set(self.untuned) | ({"kda16_prep"} if cuda_prep else set())  # its Triton winner unused
                label = won.label([k for k in ops.stage_kernels(cfg, shape.family, route) if k not in skip])
            notes += "; prepare kernel in CUDA C++ (kernels/kda16_prep.cu)" if cuda_prep else ""
            self._resolved[key] = cfg, _with_stale(shape, route, env, label + notes)
        return self._resolved[key]

    def _forms(self, shape, route, env, cfg, won):
        """(config, notes): GDN's path pinned (:func:`_pin_path`), KDA's forms and GDN's in-loop form where their
        tuned times win on this machine. ``cfg``: the tuned config, None where the lookup found no winner."""
        cfg, path = _pin_path(shape, route, cfg)
        cfg, forms = _kda_forms(shape, route, env, cfg, won)
        cfg, loop = _in_loop(shape, route, env, cfg, won)
        return cfg, path + forms + loop

    def config_label(self, shape, route, device):
        return self._config(shape, route, device)[1]

    def prepare(self, shape, route, inputs):
        from ..kernels import ops

        cfg, _ = self._config(shape, route, "cuda" if inputs.q.is_cuda else "cpu")
        kw = dict(scale=inputs.scale, initial_state=inputs.initial_state, output_final_state=True, config=cfg)
        op = ops.chunk_gdn
        if shape.family == "kda":
            op = ops.chunk_kda
            kw["lower_bound"] = inputs.lower_bound
            if inputs.lower_bound is not None:  # checked once here, not in every timed call
                ops.check_kda_gates(inputs.g, inputs.lower_bound)
                kw["check_gates"] = False
        if inputs.cu_seqlens is not None:
            kw["cu_seqlens"] = inputs.cu_seqlens
            if hasattr(ops, "prepare_varlen"):
                kw["chunk_indices"] = ops.prepare_varlen(inputs.cu_seqlens, 64)
        q, k, v, g, beta = inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta
        norm_cfg = cfg.l2norm if cfg is not None else None
        if route == "explicit":
            def call():
                return op(ops.l2norm(q, norm_cfg), ops.l2norm(k, norm_cfg), v, g, beta, norm="none", **kw)
        else:
            def call():
                return op(q, k, v, g, beta, norm=route, **kw)
        return call


class GdnbenchDefaultBackend(GdnbenchBackend):
    """Our kernels with the built-in default configs even where the autotune cache holds a winner:
    run beside `gdnbench` it measures the whole forward's tuned / default ratio in one file."""

    name = "gdnbench-default"

    def _config(self, shape, route, device):
        cfg, path = _pin_path(shape, route, None)
        return cfg, "default" + path


def _with_stale(shape, route: str, env, label: str) -> str:
    """``label`` naming the kernels whose tuned entries no longer match their code (kernels/tuned.py,
    ``stale_kernels``): they ran untuned."""
    from ..kernels.tuned import stale_kernels

    stale = stale_kernels(shape, route, env)
    return f"{label}; stale tuned entries ignored: {', '.join(stale)}" if stale else label


def _in_loop(shape, route: str, env, cfg, won):
    """(config, note) with the in-loop form (kernels/fused_fwd.py) where the autotuner timed it faster than
    the one-pass pair it replaces on this machine (kernels/tuned.py, ``in_loop_choice``)."""
    if env is None or cfg is None or not cfg.one_pass or cfg.in_loop is not None:
        return cfg, ""
    import dataclasses

    from ..kernels.tuned import in_loop_choice

    form, why = in_loop_choice(shape, route, env)
    if form is None:
        return cfg, _not_taken(won, ("fused_out",), "in-loop form", why)
    return dataclasses.replace(cfg, in_loop=form), f", in loop: {form} ({why})"


# KDA's forms the autotuner may time faster than the kernels they replace: (choice in kernels/tuned.py, the
# GDNConfig field it sets, what the label says, the kernels only that form runs)
_KDA_FORMS = (("kda_one_pass_choice", "one_pass", "one pass", ("kda_state_out",)),
              ("kda16_choice", "kda_chunk16", "16-token tiles", ("kda16_prep", "kda16_loop")))


def _not_taken(won, kernels, what: str, why: str) -> str:
    """The note saying why a form was not taken, where the lookup found tuned winners (tuned.Winners) of its
    kernels (the row's label lists only the kernels that ran: an H100 with a tuned kda16_prep but no kda16_loop
    had read 'tuned: kda16_prep[...]' over five default kernels)."""
    return f"; {what} not taken ({why})" if why and any(k in won for k in kernels) else ""


def _kda_forms(shape, route: str, env, cfg, won):
    """(config, notes) with KDA's state and output in one pass (kernels/state_out_kda.py) and in 16-token tiles
    (kernels/kda16.py) each where the autotuner timed it faster than the kernels it replaces on this machine
    (kernels/tuned.py: kda_one_pass_choice, kda16_choice; the second weighs the first's pick)."""
    if shape.family != "kda" or env is None or cfg is None:
        return cfg, ""
    import dataclasses

    from ..kernels import tuned

    notes = ""
    for choice, field, what, own in _KDA_FORMS:
        take, why = getattr(tuned, choice)(shape, route, env)
        if take:
            cfg, notes = dataclasses.replace(cfg, **{field: True}), f"{notes}; {what} ({why})"
        else:
            notes += _not_taken(won, own, what, why)
    return cfg, notes


def _cuda_prepare(shape, cfg, device) -> bool:
    """Whether KDA's 16-token form runs its prepare kernel in CUDA C++ here (kernels/kda16_cuda.py)."""
    if shape.family != "kda" or device != "cuda" or cfg is None or not (cfg.kda_chunk16 and cfg.kda16_prep_cuda):
        return False
    from ..kernels import kda16_cuda

    return kda16_cuda.serves(shape.dtype, shape.K)


def _pin_path(shape, route: str, cfg):
    """(config, note) with GDN's path (one pass or two kernels, ops.one_pass) decided on this shape,
    the full one: the gate's shortened copy then runs the path that is timed."""
    if shape.family != "gdn":
        return cfg, ""
    import dataclasses

    from ..kernels import ops
    from ..data.inputs import torch_dtype

    base = cfg or ops.default_config(shape.K, shape.V, torch_dtype(shape.dtype).itemsize)
    one = ops.one_pass(base, shape.K, shape.HV, shape.tokens, max(shape.lens))
    return dataclasses.replace(base, one_pass=one), f"; {'one pass' if one else 'two kernels'}"

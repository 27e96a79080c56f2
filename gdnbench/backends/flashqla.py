"""FlashQLA (PyPI `flash-qla`, Qwen team, TileLang): `flash_qla.chunk_gated_delta_rule`.

It takes FLA's arguments and layout (q, k [B,T,H,K], v [B,T,HV,V], g natural-log decay and beta
[B,T,HV], fp32 states [N,HV,K,V], int64 cu_seqlens with B = 1), so the adapter is FLA's with
another op. Routes as FLA's: `explicit` = FLA's l2norm by the caller; `flag` =
use_qk_l2norm_in_kernel=True (FlashQLA runs its own l2norm pass before the kernels and its
backward). GDN only, K = V = 128, fp16/bf16, on sm90 / sm100 / sm103 / sm120 (forward only on
sm120). Its Hopper forward is three TileLang kernels (chunk-local cumsum, β·KKᵀ and its inverse,
one fused kernel per (sequence, head) for w/u, the state recurrence and o); TileLang compiles
them with nvcc on first call (tens of seconds per shape; nvcc must be on PATH).

`auto_cp=True` (its default) splits long sequences with few heads across SMs (intra-card context
parallelism). The decision depends on the sequence lengths and head count only, so the row's
variant says whether it was taken, from FlashQLA's own decision function.

Its l2norm pass (route flag) is a torch.compile'd function over rows marked dynamic: the launch config
Inductor picks at the first call in a process serves every later size.  H200, [8192 x 16, 128] bf16, kernel
time per call: 80.2 us where the first call had that size (or 64 x 16 rows), 18.4 where it had 32768 x 16
rows (then 66.3 at that size against 316.6).  So before its first flag call in a process the adapter calls
the pass once on PRIME_ROWS rows (and its backward, in fwd_bwd), and each leader runs at its best.
"""

from __future__ import annotations

from ..data.results import dist_version
from .base import PLAIN_ROUTES, TRAIN_ROUTES, YES, no, one_line
from .fla import INSTALL_HINT as FLA_INSTALL_HINT
from .fla import FlaBackend, fla_version

DIST = "flash-qla"
HEAD_DIM = 128
ARCHS = {(9, 0): "sm90", (10, 0): "sm100", (10, 3): "sm103", (12, 0): "sm120", (12, 1): "sm121"}
CHUNK = 64
CALLER_NORM_ROUTES = ("explicit", "megatron")  # the routes whose q, k the caller normalizes (FLA's l2norm)
PRIME_ROWS = 32768 * 16  # rows of the first call of FlashQLA's l2norm pass in a process (module docstring)
_primed: set = set()


def prime_l2norm(dtype, device, backward: bool = False) -> None:
    """Call FlashQLA's compiled l2norm pass (and its backward) once on PRIME_ROWS rows of ``dtype``, once per
    process, so the launch config Inductor keeps is the one it picks for a large call."""
    import torch
    from flash_qla.utils import l2norm_bwd, l2norm_fwd

    key = (dtype, str(device), backward)
    if key in _primed:
        return
    x = torch.randn(PRIME_ROWS, HEAD_DIM, dtype=dtype, device=device)
    y, rstd = l2norm_fwd(x)
    if backward:
        l2norm_bwd(y, rstd, torch.randn_like(x))
    _primed.add(key)


def _capability() -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability())


def leader_support(shape) -> str:
    """Why FlashQLA cannot run `shape` ('' when it can): the limits its own entry point asserts."""
    if shape.family != "gdn":
        return "FlashQLA has GDN kernels only"
    if shape.K != HEAD_DIM or shape.V != HEAD_DIM:
        return f"FlashQLA needs K = V = {HEAD_DIM} (got K={shape.K}, V={shape.V})"
    if shape.dtype not in ("bfloat16", "float16"):
        return f"FlashQLA takes bf16 / fp16 only (shape dtype {shape.dtype})"
    return ""


def cp_decision(shape, device: str = "cuda") -> str:
    """FlashQLA's intra-card context-parallel decision for a shape's lengths and heads, as text."""
    import torch
    from flash_qla.ops.gated_delta_rule.chunk import _auto_intra_cp_context

    B = 1 if shape.varlen else shape.B
    T = shape.tokens if shape.varlen else shape.lens[0]
    k = torch.empty(B, T, shape.H, 0, device=device)
    v = torch.empty(B, T, shape.HV, 0, device=device)
    cu = None
    if shape.varlen:
        offsets = [0]
        for n in shape.lens:
            offsets.append(offsets[-1] + n)
        cu = torch.tensor(offsets, dtype=torch.int64, device=device)
    ctx = _auto_intra_cp_context(k, v, cu, CHUNK, True, False)
    if not ctx.is_intra:
        return "intra-card CP not taken"
    segments = ctx.intra_cp_cu_seqlens.numel() - 1
    return f"intra-card CP taken ({shape.n_seqs} sequences split into {segments} segments)"


class FlashQLABackend(FlaBackend):
    name = "flashqla"
    routes = PLAIN_ROUTES
    families = ("gdn",)
    train_routes = TRAIN_ROUTES
    decode_routes = ()
    no_decode = "has no decode step (FlashQLA is a chunked prefill)"

    def is_available(self):
        if dist_version(DIST) is None:
            return no("flash-qla is not installed (pip install flash-qla; needs nvcc at run time)")
        try:
            import flash_qla  # noqa: F401
        except Exception as e:  # tilelang / tvm-ffi / libz3 can each fail to load
            return no(one_line(e, "import flash_qla failed"))
        return YES

    def version(self):
        return dist_version(DIST)

    def supports(self, shape, route, mode, device):
        base = super(FlaBackend, self).supports(shape, route, mode, device)
        if not base:
            return base
        why = leader_support(shape)
        if why:
            return no(why)
        cap = _capability()
        if cap not in ARCHS:
            return no(f"FlashQLA runs on sm90, sm100, sm103 and sm120 only (this GPU: sm{cap[0]}{cap[1]})")
        if mode == "fwd_bwd" and cap[0] == 12:
            return no("FlashQLA has no backward on sm120")
        if route in CALLER_NORM_ROUTES and fla_version() is None:
            return no(f"route {route} normalizes q, k with FLA's l2norm, and FLA is not installed "
                      f"({FLA_INSTALL_HINT})")
        return YES

    def variant(self, shape, route):
        primed = f"its l2norm pass, first called on {PRIME_ROWS} rows"
        how = {"explicit": "caller l2norm (FLA's)", "flag": f"use_qk_l2norm_in_kernel=True ({primed})",
               "megatron": "megatron: l2norm on fused q|k, split, repeat_interleave to HV heads, flag off",
               "megatron_flag": "megatron_flag: fused q|k split, repeat_interleave to HV heads, "
                                f"use_qk_l2norm_in_kernel=True ({primed})"}[route]
        try:
            cp = cp_decision(shape)
        except Exception as e:  # the decision needs CUDA and FlashQLA's internals
            cp = one_line(e, "CP decision unknown")
        return f"flash-qla {self.version()} chunk_gated_delta_rule(auto_cp=True): {cp}, {how}"

    def _op(self, shape, inputs, flag):
        from flash_qla import chunk_gated_delta_rule as op

        if flag:
            prime_l2norm(inputs.q.dtype, inputs.q.device, backward=inputs.q.requires_grad)
        kw = dict(scale=inputs.scale, initial_state=inputs.initial_state, output_final_state=True,
                  use_qk_l2norm_in_kernel=flag, auto_cp=True)
        if inputs.cu_seqlens is not None:
            kw["cu_seqlens"] = inputs.cu_seqlens
        return op, kw

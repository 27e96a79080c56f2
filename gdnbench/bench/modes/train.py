"""Mode fwd_bwd: one training step per route, its gradient gate, and what it keeps in memory.

The step (what is timed): run the route's forward, build the scalar loss
(o * do).sum() + (state * dstate).sum() with fixed seeded cotangents, and take the
gradients of q, k, v, g, beta with torch.autograd.grad. The gradients are returned, not
accumulated into `.grad`: nothing needs zeroing between calls and the step holds no state
outside itself, so one CUDA graph can capture it whole (where capture fails, the profiler
fallback of timing.py applies).

Routes: `explicit` and `flag` as in forward mode; `megatron` and `megatron_flag` are the
caller composition of Megatron's GDN layer: one fused q|k tensor [B,T,2H,K] (the leaf,
as a projection would produce it), l2-normalized by the caller (`megatron`) or by the
kernel's flag (`megatron_flag`), split, q/k heads expanded to HV heads with
repeat_interleave, then the kernel with H = HV.

The gate compares the output, the final state and dq, dk, dv, dg, dbeta with the fp64
recurrence's autograd gradients; each budget is built as check.py builds the forward
ones: 2 x the error of the same computation (forward and backward) at storage precision.
It then adds the weight gradients of a small layer around the route (gdnbench/bench/modes/layer.py),
budgeted the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from ...oracle.check import Oracle, Verdict, budget, judge, make_oracle, rel_rms, storage_precision
from ...data.shapes import Shape
from ...vocab import MEGATRON_ROUTES
from .routes import megatron_forward

if TYPE_CHECKING:
    import torch

    from .layer import LayerOracle

GRADS = ("q", "k", "v", "g", "beta")
COTANGENT_SEED_OFFSET = 7919  # cotangents come from their own stream, not the inputs'


def cotangents(shape: Shape, inputs) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Seeded do [B,T,HV,V] (storage dtype) and dstate [N,HV,K,V] (fp32), drawn on the CPU like the inputs."""
    import torch

    gen = torch.Generator().manual_seed(shape.seed + COTANGENT_SEED_OFFSET)
    v = inputs.v
    do = torch.randn(tuple(v.shape), generator=gen, dtype=torch.float32).to(v.dtype)
    dstate = torch.randn((shape.n_seqs, shape.HV, shape.K, shape.V), generator=gen, dtype=torch.float32)
    return do.to(v.device), dstate.to(v.device)


def with_leaves(inputs):
    """A copy of the inputs whose q, k, v, g, beta are fresh leaves that require grad."""
    leaf = lambda t: t.detach().clone().requires_grad_()  # noqa: E731
    return replace(inputs, q=leaf(inputs.q), k=leaf(inputs.k), v=leaf(inputs.v), g=leaf(inputs.g),
                   beta=leaf(inputs.beta))


def training_step(forward: Callable[[], tuple], leaves: tuple, do, dstate) -> Callable[[], tuple]:
    """forward -> scalar loss -> autograd.grad; returns (o, state, grads in the order of `leaves`)."""
    import torch

    def step():
        with torch.enable_grad():
            o, s = forward()[:2]
            loss = (o * do).sum()
            if s is not None:
                loss = loss + (s * dstate).sum()
            return o, s, torch.autograd.grad(loss, leaves)

    return step


def prepare_step(backend, shape: Shape, route: str, inputs) -> Callable[[], tuple]:
    """The timed closure of mode fwd_bwd for one backend and route (leaves and cotangents made here)."""
    import torch

    x = with_leaves(inputs)
    if route in MEGATRON_ROUTES:
        qk = torch.cat([x.q, x.k], dim=2).detach().requires_grad_()
        forward = megatron_forward(backend, shape, x, qk, flag=route == "megatron_flag")
        leaves = (qk, x.v, x.g, x.beta)
    else:
        forward = backend.prepare(shape, route, x)
        leaves = (x.q, x.k, x.v, x.g, x.beta)
    do, dstate = cotangents(shape, inputs)
    return training_step(forward, leaves, do, dstate)


def named_grads(grads) -> dict:
    """{'q': dq, ...} from a step's gradients; the megatron routes' one fused dq|dk is split in two."""
    if len(grads) == len(GRADS) - 1:
        dq, dk = grads[0].chunk(2, dim=2)
        grads = (dq, dk, *grads[1:])
    return dict(zip(GRADS, grads))


def finite(out) -> bool:
    import torch

    o, s, grads = out
    return all(t is None or bool(torch.isfinite(t).all()) for t in (o, s, *grads))


# ----------------------------------------------------------------------------- the gate
@dataclass
class GradOracle:
    fwd: Oracle
    grads: dict  # name -> fp64 gradient
    lowp_err: dict  # name -> rel-RMS error of the storage-precision gradient
    layer: "LayerOracle | None" = None  # the small layer's fp64 gradients and their budgets

    def budget(self, name: str) -> float:
        return budget(self.lowp_err[name])


@dataclass
class TrainVerdict:
    fwd: Verdict
    grads: dict  # 'dq' -> {err, budget, lowp_err}
    passed: bool
    reason: str
    layer: dict = field(default_factory=dict)  # 'W_qk' -> {err, budget, lowp_err}, added by layer.judge_route
    layer_width: int | None = None

    def to_dict(self) -> dict:
        d = {**self.fwd.to_dict(), "passed": self.passed, "reason": self.reason, "grads": self.grads}
        if self.layer:
            d.update(layer=self.layer, layer_width=self.layer_width)
        return d


def reference_step(inputs, do, dstate, dtype, tf32: bool = False):
    """The token recurrence with autograd at `dtype`: (o, state, {name: grad}).

    fp64: the leaves are fp64 copies (so the gradients are not rounded back to storage);
    lower precision: the leaves keep the storage dtype, as a kernel's gradients do."""
    import torch

    from ...oracle.reference import recurrence

    cast = (lambda t: t.detach().to(torch.float64)) if dtype == torch.float64 else (lambda t: t.detach().clone())
    leaves = [cast(getattr(inputs, n)).requires_grad_() for n in GRADS]
    with torch.enable_grad():
        o, s = recurrence(*leaves, scale=inputs.scale, initial_state=inputs.initial_state,
                          cu_seqlens=inputs.cu_seqlens_list, dtype=dtype, tf32=tf32)
        loss = (o * do.to(o.dtype)).sum() + (s * dstate.to(s.dtype)).sum()
        grads = torch.autograd.grad(loss, leaves)
    return o.detach(), s.detach(), dict(zip(GRADS, grads))


def build_grad_oracle(check_shape: Shape, inputs, full_shape: Shape) -> GradOracle:
    """fp64 output, state and gradients on the check inputs, and the error storage precision costs each;
    the same for the small layer's gradients."""
    import torch

    from . import layer

    do, dstate = cotangents(check_shape, inputs)
    o64, s64, g64 = reference_step(inputs, do, dstate, torch.float64)
    lp, tf32 = storage_precision(check_shape.dtype)
    o_lp, s_lp, g_lp = reference_step(inputs, do, dstate, lp, tf32=tf32)
    fwd = make_oracle(check_shape, full_shape, o64, s64, o_lp, s_lp)
    return GradOracle(fwd, g64, {n: rel_rms(g_lp[n], g64[n]) for n in GRADS}, layer.build_oracle(check_shape, inputs))


def judge_step(oracle: GradOracle, out) -> TrainVerdict:
    """Output and state as in forward mode, then each input gradient against its own budget."""
    o, s, grads = out
    fwd = judge(oracle.fwd, o, s)
    problems = [fwd.reason] if fwd.reason else []
    figures = {}
    for name, grad in named_grads(grads).items():
        ref, budget = oracle.grads[name], oracle.budget(name)
        err = rel_rms(grad, ref) if grad.shape == ref.shape else math.inf
        figures[f"d{name}"] = {"err": err, "budget": budget, "lowp_err": oracle.lowp_err[name]}
        if grad.shape != ref.shape:
            problems.append(f"d{name} shape {tuple(grad.shape)} != {tuple(ref.shape)}")
        elif not err <= budget:
            problems.append(f"d{name} rel-RMS error {err:.3g} > budget {budget:.3g}")
    return TrainVerdict(fwd, figures, not problems, "; ".join(problems))


# ----------------------------------------------------------------------------- memory, determinism
def saved_bytes(step) -> int:
    """Bytes autograd keeps for backward in one step: every tensor packed by
    saved_tensors_hooks, counted once per storage (data_ptr, nbytes of the untyped storage),
    so views and tensors saved by several ops count once. Inputs and the cotangents count
    when an op saves them (the cotangents alike in every route)."""
    import torch

    storages: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


def peak_bytes(step, device: str) -> int | None:
    """CUDA memory one step allocates at its peak, above what was allocated before it; None on the CPU."""
    if device != "cuda":
        return None
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def deterministic(step) -> bool:
    """Whether two identical steps give bitwise-identical gradients (atomics in a backward break this)."""
    import torch

    a, b = step()[2], step()[2]
    return all(torch.equal(x, y) for x, y in zip(a, b))


def row_extras(step, device: str) -> dict:
    """The fields a fwd_bwd row adds, measured outside the timed region on the full input."""
    return {"saved_bytes": saved_bytes(step), "peak_bytes": peak_bytes(step, device),
            "deterministic": deterministic(step)}

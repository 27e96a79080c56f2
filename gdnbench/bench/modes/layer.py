"""Mode fwd_bwd: a small GDN / KDA layer around each training route, and its parameter-gradient gate.

Why: the input-gradient gate feeds the kernel leaves q, k, v, g, beta. A model trains the
projections that produce them, through the route's own composition (Megatron's fused q|k
projection, normalized by the caller or by the kernel's flag, split, expanded to HV heads), so
this gate follows the gradients on to the weights of a layer, for every route, against the same
layer in fp64.

The layer, hidden size D = LAYER_WIDTH = 128 (as wide as the usual head dim K = 128, so a
head's q and k are not confined to a smaller subspace; small, so the projections cost nothing
next to the oracle's token recurrence):
    q|k  = x W_qk                                   [B,T,2H,K]   (fused, as Megatron's GDN projects)
    v    = x W_v                                    [B,T,HV,V]
    g    = logsigmoid(x W_a)                        [B,T,HV]     (GDN: one decay per value head)
         = lower_bound * sigmoid(x W_a)             [B,T,HV,K]   (KDA: one per key channel)
    beta = sigmoid(x W_b)                           [B,T,HV]
    o, state = the route's attention on (q, k, v, g, beta)
    y    = o W_o                                    [B,T,D]
loss = (y * dy).sum() + (state * dstate).sum() with seeded cotangents; the gradients of the five
weights and of x. Weights, x and the projections are at the storage dtype, as in a model held in
that dtype; the gates are computed in fp32, the dtype the kernels take g in.

Budget of each gradient: check.budget of the error the same layer makes at storage precision
(projections at the storage dtype, recurrence at storage precision) against the fp64 layer
(the same stored weights and x, every operation in fp64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from ...oracle.check import budget, rel_rms, storage_precision
from ...data.shapes import Shape
from ...vocab import MEGATRON_ROUTES
from .routes import megatron_forward

if TYPE_CHECKING:
    import torch

LAYER_WIDTH = 128
PARAMS = ("W_qk", "W_v", "W_a", "W_b", "W_o")
GRADS = PARAMS + ("x",)
LAYER_SEED_OFFSET = 104729  # the layer's weights, x and cotangents come from their own stream


@dataclass
class LayerData:
    """The layer's weights and input x (GRADS order) and its cotangents, at the storage dtype on the
    check inputs' device: one draw per shape, shared by the oracle and every route."""
    tensors: dict  # name -> tensor
    dy: "torch.Tensor"  # [B,T,D], storage dtype
    dstate: "torch.Tensor"  # [N,HV,K,V], fp32

    def leaves(self, dtype=None) -> list:
        """Fresh leaves that require grad, cast to `dtype` when given."""
        return [t.detach().to(dtype or t.dtype, copy=True).requires_grad_() for t in self.tensors.values()]


@dataclass
class LayerOracle:
    data: LayerData
    grads: dict  # name -> fp64 gradient
    lowp_err: dict  # name -> rel-RMS error of the storage-precision layer's gradient

    def budget(self, name: str) -> float:
        return budget(self.lowp_err[name])


def gate_width(shape: Shape) -> int:
    return shape.HV if shape.family == "gdn" else shape.HV * shape.K


def make_data(shape: Shape, inputs) -> LayerData:
    """Seeded weights (N(0, 1/fan_in), so every projection is about unit scale, like the inputs'),
    x ~ N(0, 1) [B,T,D] with the check inputs' B and T, and the cotangents; drawn on the CPU."""
    import torch

    from ...data.inputs import torch_dtype

    gen = torch.Generator().manual_seed(shape.seed + LAYER_SEED_OFFSET)
    H, HV, K, V, D = shape.H, shape.HV, shape.K, shape.V, LAYER_WIDTH
    B, T = inputs.v.shape[:2]

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float32)

    def weight(fan_in, fan_out):
        return randn(fan_in, fan_out) * fan_in ** -0.5

    drawn = {"W_qk": weight(D, 2 * H * K), "W_v": weight(D, HV * V), "W_a": weight(D, gate_width(shape)),
             "W_b": weight(D, HV), "W_o": weight(HV * V, D), "x": randn(B, T, D)}
    dy, dstate = randn(B, T, D), randn(shape.n_seqs, HV, K, V)
    dt, device = torch_dtype(shape.dtype), inputs.v.device
    return LayerData({n: t.to(dt).to(device) for n, t in drawn.items()}, dy.to(dt).to(device), dstate.to(device))


def project(shape: Shape, w: dict):
    """x -> (fused q|k [B,T,2H,K], v, g, beta), at the weights' dtype (g at fp32, or fp64 for fp64)."""
    import torch
    import torch.nn.functional as F

    x = w["x"]
    B, T = x.shape[:2]
    qk = (x @ w["W_qk"]).view(B, T, 2 * shape.H, shape.K)
    v = (x @ w["W_v"]).view(B, T, shape.HV, shape.V)
    a = (x @ w["W_a"]).to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    if shape.family == "gdn":
        g = F.logsigmoid(a)
    else:
        g = shape.lower_bound * torch.sigmoid(a).view(B, T, shape.HV, shape.K)
    beta = torch.sigmoid(x @ w["W_b"])
    return qk, v, g, beta


def route_attention(backend, shape: Shape, route: str, inputs) -> Callable:
    """(qk, v, g, beta) -> (o, state) through the backend's route: explicit / flag get q and k split
    from the fused projection (H heads, the route normalizes as it always does); the megatron routes
    reuse routes.megatron_forward on the fused tensor."""
    def attention(qk, v, g, beta):
        x = replace(inputs, v=v, g=g, beta=beta)
        if route in MEGATRON_ROUTES:
            return megatron_forward(backend, shape, x, qk, flag=route == "megatron_flag")()[:2]
        q, k = (t.contiguous() for t in qk.split(shape.H, dim=2))
        return backend.prepare(shape, route, replace(x, q=q, k=k))()[:2]

    return attention


def reference_attention(shape: Shape, inputs, dtype, tf32: bool = False) -> Callable:
    """(qk, v, g, beta) -> (o, state) by the token recurrence at `dtype` (it normalizes q and k)."""
    from ...oracle.reference import recurrence

    def attention(qk, v, g, beta):
        q, k = qk.split(shape.H, dim=2)
        return recurrence(q, k, v, g, beta, scale=inputs.scale, initial_state=inputs.initial_state,
                          cu_seqlens=inputs.cu_seqlens_list, dtype=dtype, tf32=tf32)

    return attention


def layer_grads(shape: Shape, data: LayerData, attention: Callable, dtype=None) -> dict:
    """One forward + backward of the layer with `attention`: {name: gradient} over GRADS.
    `dtype` casts the leaves (the fp64 oracle); by default they keep the storage dtype."""
    import torch

    leaves = data.leaves(dtype)
    w = dict(zip(GRADS, leaves))
    with torch.enable_grad():
        o, s = attention(*project(shape, w))
        y = o.flatten(-2).to(w["W_o"].dtype) @ w["W_o"]
        loss = (y * data.dy.to(y.dtype)).sum()
        if s is not None:
            loss = loss + (s * data.dstate.to(s.dtype)).sum()
        return dict(zip(GRADS, torch.autograd.grad(loss, leaves)))


def build_oracle(check_shape: Shape, inputs) -> LayerOracle:
    """The fp64 layer's gradients on the check inputs, and the error storage precision costs each."""
    import torch

    data = make_data(check_shape, inputs)
    g64 = layer_grads(check_shape, data, reference_attention(check_shape, inputs, torch.float64), torch.float64)
    lp, tf32 = storage_precision(check_shape.dtype)
    g_lp = layer_grads(check_shape, data, reference_attention(check_shape, inputs, lp, tf32))
    return LayerOracle(data, g64, {n: rel_rms(g_lp[n], g64[n]) for n in GRADS})


def judge_grads(oracle: LayerOracle, grads: dict) -> tuple[dict, list[str]]:
    """({name: {err, budget, lowp_err}}, the problems, each naming its gradient)."""
    figures, problems = {}, []
    for name in GRADS:
        grad, ref, limit = grads[name], oracle.grads[name], oracle.budget(name)
        err = rel_rms(grad, ref) if grad.shape == ref.shape else math.inf
        figures[name] = {"err": err, "budget": limit, "lowp_err": oracle.lowp_err[name]}
        if not err <= limit:
            problems.append(f"layer d{name} rel-RMS error {err:.3g} > budget {limit:.3g}")
    return figures, problems


def judge_route(verdict, oracle, backend, shape: Shape, route: str, inputs):
    """The fwd_bwd verdict (train.TrainVerdict) with the layer's gradients through this route added:
    a gradient over its budget makes the row incorrect, with the gradient named in the reason."""
    grads = layer_grads(shape, oracle.layer.data, route_attention(backend, shape, route, inputs))
    figures, problems = judge_grads(oracle.layer, grads)
    reason = "; ".join(r for r in (verdict.reason, *problems) if r)
    return replace(verdict, layer=figures, layer_width=LAYER_WIDTH, passed=verdict.passed and not problems,
                   reason=reason)

"""Seeded input tensors for a shape: every route and backend of a shape sees the same tensors.

Tensors are drawn on the CPU from a `torch.Generator` seeded with the shape's seed and
then moved, so they do not depend on the device, the backend or the process.

Conventions (FLA 0.6.0's chunk ops): q, k [B,T,H,K] raw (not normalized: the routes
normalize); v [B,T,HV,V]; beta [B,T,HV] post-sigmoid in the storage dtype; g fp32
natural-log decay, [B,T,HV] for GDN (logsigmoid of a standard normal) and
[B,T,HV,K] for KDA (lower_bound * sigmoid(normal), inside [lower_bound, 0)) in the `strong`
gate regime; in the `long` regime -rate * softplus(normal) with seeded per-head (KDA: per-channel)
rates, a quarter of them 0 (see `_gate`), every other tensor as in `strong`;
states fp32 [N,HV,K,V]; packed shapes have B=1 and int64 cu_seqlens [N+1].

Decode shapes (one token for each of N sequences): q, k [1,N,H,K], v [1,N,HV,V], g, beta as above
with T = N and int64 cu_seqlens 0..N; no initial_state but a state pool [P,HV,K,V] at the shape's
state dtype (every slot drawn as initial states are, so fp32 and bf16 pools hold the same values)
and `state_indices`, int64 [N]: the N sequences' distinct slots, a seeded random subset in random order.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from .shapes import Shape

if TYPE_CHECKING:
    import torch

DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


@dataclass
class Inputs:
    q: "torch.Tensor"
    k: "torch.Tensor"
    v: "torch.Tensor"
    g: "torch.Tensor"
    beta: "torch.Tensor"
    scale: float
    initial_state: "torch.Tensor | None"
    cu_seqlens: "torch.Tensor | None"
    cu_seqlens_list: list[int] | None
    lower_bound: float | None
    state_pool: "torch.Tensor | None" = None  # decode: [P,HV,K,V] at the state dtype
    state_indices: "torch.Tensor | None" = None  # decode: int64 [N], the sequences' slots in the pool

    def to(self, device) -> "Inputs":
        import torch

        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})


def torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name])


def make_inputs(shape: Shape, device="cpu") -> Inputs:
    import torch
    gen = torch.Generator().manual_seed(shape.seed)
    dt = torch_dtype(shape.dtype)
    packed = shape.varlen or shape.decode
    B = 1 if packed else shape.B
    T = shape.tokens if packed else shape.lens[0]
    H, HV, K, V = shape.H, shape.HV, shape.K, shape.V

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float32)

    q = randn(B, T, H, K).to(dt)
    k = randn(B, T, H, K).to(dt)
    v = randn(B, T, HV, V).to(dt)
    beta = torch.sigmoid(randn(B, T, HV)).to(dt)
    g_shape = (B, T, HV) if shape.family == "gdn" else (B, T, HV, K)
    g_draw = randn(*g_shape)  # the same draw in every regime, so the later tensors are too
    h0 = None
    if shape.initial_state:
        # bf16-representable values at a quarter of unit scale, as the KDA harness used
        h0 = (0.25 * randn(shape.n_seqs, HV, K, V)).to(torch.bfloat16).float()
    cu, cu_list, pool, idx = None, None, None, None
    if shape.varlen:
        cu_list = [0]
        for n in shape.lens:
            cu_list.append(cu_list[-1] + n)
    if shape.decode:
        cu_list = list(range(shape.B + 1))
        pool = (0.25 * randn(shape.pool_size, HV, K, V)).to(torch.bfloat16).to(torch_dtype(shape.state_dtype))
        idx = torch.randperm(shape.pool_size, generator=gen)[:shape.B]
    if cu_list is not None:
        cu = torch.tensor(cu_list, dtype=torch.int64)
    g = _gate(shape, g_draw, gen)
    inp = Inputs(q, k, v, g, beta, shape.attn_scale, h0, cu, cu_list, shape.lower_bound, pool, idx)
    return inp if str(device) == "cpu" else inp.to(device)


LONG_RATES = (1e-3, 1e-1)  # range of the log-uniform decay scales of the long regime
LONG_ZERO_SHARE = 4  # one head (KDA: channel) in this many has g = 0 exactly


def _gate(shape: Shape, draw, gen):
    """g from its standard-normal draw. `strong`: GDN logsigmoid(draw), KDA lower_bound * sigmoid(draw).
    `long`: -rate * softplus(draw), one rate per value head (KDA: per head and key channel) drawn
    log-uniform in LONG_RATES after every other tensor, and 1 in LONG_ZERO_SHARE of them 0, so
    those heads (channels) never forget; KDA's clipped to its lower bound."""
    import math

    import torch
    import torch.nn.functional as F

    if shape.gate_regime == "strong":
        return F.logsigmoid(draw) if shape.family == "gdn" else shape.lower_bound * torch.sigmoid(draw)
    per = draw.shape[2:]  # (HV,) or (HV, K)
    lo, hi = math.log(LONG_RATES[0]), math.log(LONG_RATES[1])
    rate = torch.exp(lo + (hi - lo) * torch.rand(*per, generator=gen))
    order = torch.rand(*per, generator=gen).argsort(dim=-1)  # the last dim's zeros: a random choice
    n_zero = max(1, per[-1] // LONG_ZERO_SHARE) if per[-1] > 1 else 0
    rate.scatter_(-1, order[..., :n_zero], 0.0)
    g = -rate * F.softplus(draw)
    return g if shape.family == "gdn" else g.clamp_min(shape.lower_bound)

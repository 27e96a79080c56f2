"""Pure-torch token recurrence for GDN and KDA: the correctness oracle and the CPU backend.

Per sequence and value head, token t (state S is [K, V]):
    S <- diag(exp(g_t)) S              (g scalar per head for GDN, per key channel for KDA)
    S <- S + k_t (beta_t (v_t - k_t S))ᵀ
    o_t = scale * q_t S
with q, k l2-normalized (FLA's l2norm: x / sqrt(sum(x²) + 1e-6)) when `normalize`.
Sequences are padded to a common length and stepped together; padded steps have
g = 0 and beta = 0, which leave the state unchanged.
"""

from __future__ import annotations

import torch

L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """FLA's l2norm: in fp32 (fp64 for fp64 input), eps inside the sqrt, cast to out_dtype."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(work)
    y = xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + L2NORM_EPS)
    return y.to(out_dtype or x.dtype)


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to tf32's 10-bit mantissa (nearest), as tensor cores read fp32 operands.

    Under autograd (the fwd_bwd gate's budget run) the rounding is straight-through: rounded
    values, identity gradient, since the bit trick itself has no derivative."""
    if x.requires_grad:
        return x + (round_to_tf32(x.detach()) - x).detach()
    bits = x.contiguous().view(torch.int32)
    rounded = (bits + 0x1000) & ~0x1FFF
    return rounded.view(torch.float32)


def _split(x: torch.Tensor, cu: list[int] | None) -> list[torch.Tensor]:
    if cu is None:
        return list(x.unbind(0))
    return [x[0, cu[i]:cu[i + 1]] for i in range(len(cu) - 1)]


def _pad(seqs: list[torch.Tensor], length: int) -> torch.Tensor:
    out = seqs[0].new_zeros((len(seqs), length) + tuple(seqs[0].shape[1:]))
    for i, s in enumerate(seqs):
        out[i, : s.shape[0]] = s
    return out


def recurrence(q, k, v, g, beta, *, scale: float, initial_state=None, cu_seqlens: list[int] | None = None,
               normalize: bool = True, dtype: torch.dtype = torch.float64, tf32: bool = False):
    """Run the recurrence with every operand in `dtype`, the state carried and decayed in `dtype` or
    fp32 if wider (g at its fp32 storage) and read as an operand at `dtype`: a kernel's fp32
    accumulators and 16-bit matmul operands. A state carried in bf16 loses every decay below its
    half ulp (2^-9): in bf16 with the long gate regime's decays (gdn-qwen6-long h4_hv8_mixed, 512
    tokens) its output was 2.5e-2 off (rel-RMS) and scaled by 1e-2, carried in fp32 4.5e-3 and 2e-5;
    with the strong regime's decays 5.1e-3 and 4.4e-3, both unbiased.

    `tf32=True` (with dtype float32) rounds q, k, v to tf32 first: the precision a
    tensor-core kernel reads fp32 storage with. Returns (o [like v, in dtype], state [N,HV,K,V] in
    the carried dtype).
    """
    B_or_1, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    if normalize:
        q = l2norm(q, out_dtype=dtype)
        k = l2norm(k, out_dtype=dtype)
    carry = torch.promote_types(dtype, torch.float32)
    q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
    g = g.to(carry)
    if tf32:
        q, k, v = round_to_tf32(q), round_to_tf32(k), round_to_tf32(v)
    seq_q, seq_k, seq_v, seq_g, seq_b = (_split(t, cu_seqlens) for t in (q, k, v, g, beta))
    lens = [s.shape[0] for s in seq_q]
    L = max(lens)
    Q, Kt, Vt, G, Bt = (_pad(s, L) for s in (seq_q, seq_k, seq_v, seq_g, seq_b))
    N = len(lens)
    if initial_state is not None:
        S = initial_state.to(carry).clone()
    else:
        S = q.new_zeros((N, HV, K, V), dtype=carry)
    per_channel = G.dim() == 4  # KDA: [N, L, HV, K]
    O = q.new_zeros((N, L, HV, V))
    for t in range(L):
        qt = Q[:, t].repeat_interleave(group, dim=1)  # [N, HV, K]
        kt = Kt[:, t].repeat_interleave(group, dim=1)
        decay = torch.exp(G[:, t])
        S = S * (decay[..., None] if per_channel else decay[..., None, None])
        pred = torch.einsum("nhk,nhkv->nhv", kt, S.to(dtype))
        delta = Bt[:, t][..., None] * (Vt[:, t] - pred)
        S = S + kt[..., None].to(carry) * delta[:, :, None, :].to(carry)
        O[:, t] = scale * torch.einsum("nhk,nhkv->nhv", qt, S.to(dtype))
    outs = [O[i, : lens[i]] for i in range(N)]
    o = torch.cat(outs, 0)[None] if cu_seqlens is not None else torch.stack(outs, 0)
    return o, S


def decode_step(q, k, v, g, beta, states, *, scale: float, normalize: bool = True,
                dtype: torch.dtype = torch.float64, tf32: bool = False):
    """One decode step: one token for each of N sequences, from their states.

    q, k [1,N,H,K], v [1,N,HV,V], g [1,N,HV] (GDN) or [1,N,HV,K] (KDA), beta [1,N,HV]; `states`
    [N,HV,K,V] are the N sequences' states (gathered from a pool). The recurrence above with the N
    tokens as N sequences of length one. Returns (o [1,N,HV,V], new states [N,HV,K,V]), both in `dtype`."""
    def per_sequence(t):  # [1,N,...] -> [N,1,...]
        return t[0].unsqueeze(1)

    o, s = recurrence(*(per_sequence(t) for t in (q, k, v, g, beta)), scale=scale, initial_state=states,
                      normalize=normalize, dtype=dtype, tf32=tf32)
    return o.transpose(0, 1), s

"""KDA's one-pass state/output kernel (ops.kda_state_output, opt-in) against the state and output kernels it
stands for, on the CPU (TRITON_INTERPRET=1; fp32 and fp16 storage): the same o and final state after the same
kda_intra and w/u stages, on every route's inputs, varlen, an initial state, and heads that share q (HV > H)."""

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from gdnbench.kernels import ops  # noqa: E402
from gdnbench.kernels.config import KernelConfig, default_config  # noqa: E402

TOL = {torch.float32: 2e-6, torch.float16: 2e-3}


def _inputs(T, H, HV, K, V, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = -5.0 * torch.sigmoid(torch.randn(1, T, HV, K, generator=gen))
    beta = torch.rand(1, T, HV, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta


def _both(norm, q, k, v, g, beta, h0, varlen, config):
    """(one pass, state + output): each (o, final state), after the same kda_intra and w/u stages."""
    if norm == "flag":
        q, k = ops.l2norm(q), ops.l2norm(k)
    fuse_k, fuse_q = norm == "fused_qk", norm in ("fused_q", "fused_qk")
    if norm == "fused_q":
        k = ops.l2norm(k)
    run = dict(varlen=varlen, config=config)
    g_cs, A, aqk, rstd_k = ops.kda_intra(q, k, g, beta, fuse_k=fuse_k, raw_q=fuse_q, **run)
    w, u, kg = ops.recompute_wu(k, v, beta, A, g_cs, rstd_k=rstd_k, **run)
    scale = q.shape[-1] ** -0.5
    one = ops.kda_state_output(q, kg, w, u, g_cs, aqk, scale=scale, fuse_q=fuse_q, initial_state=h0,
                               output_final_state=True, **run)
    h, v_new, fs = ops.state_recurrence(kg, w, u, g_cs, initial_state=h0, output_final_state=True, **run)
    o = ops.chunk_output(q, None, v_new, h, g_cs, scale=scale, fuse_q=fuse_q, aqk=aqk, **run)
    return one, (o, fs)


def _rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("norm", ["flag", "fused_q", "fused_qk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_one_pass_matches_state_and_output(norm, dtype):
    q, k, v, g, beta = _inputs(150, 2, 2, 32, 32, dtype, seed=3)
    cfg = default_config(32, 32, q.element_size(), "kda")
    (o1, f1), (o2, f2) = _both(norm, q, k, v, g, beta, None, None, cfg)
    assert o1.dtype == o2.dtype and o1.shape == o2.shape
    assert _rel(o1, o2) < TOL[dtype] and _rel(f1, f2) < TOL[dtype]


@pytest.mark.parametrize("piece, bv", [(16, 16), (32, 32)])
def test_one_pass_varlen_initial_state_shared_q(piece, bv):
    """Three sequences (one shorter than a chunk), h0, two value heads per q head, K in 1 or 2 pieces, V in slabs."""
    q, k, v, g, beta = _inputs(200, 1, 2, 32, 48, torch.float32, seed=4)
    cu = torch.tensor([0, 70, 100, 200])
    h0 = torch.randn(3, 2, 32, 48, generator=torch.Generator().manual_seed(5))
    cfg = dataclasses.replace(default_config(32, 48, 4, "kda"),
                              state=KernelConfig(BK=piece, BV=bv, num_warps=4, num_stages=2))
    (o1, f1), (o2, f2) = _both("fused_q", q, k, v, g, beta, h0, ops.prepare_varlen(cu), cfg)
    assert _rel(o1, o2) < TOL[torch.float32] and _rel(f1, f2) < TOL[torch.float32]


def test_chunk_kda_takes_the_one_pass_under_config_one_pass(monkeypatch):
    """config.one_pass=True: chunk_kda launches kda_state_out_kernel instead of the state and output kernels,
    with the same o and final state."""
    q, k, v, g, beta = _inputs(100, 2, 2, 32, 32, torch.float32, seed=6)
    base = default_config(32, 32, 4, "kda")
    launched = []
    real = ops._launch
    monkeypatch.setattr(ops, "_launch", lambda kernel, *a, **kw: (launched.append(kernel.fn.__name__),
                                                                  real(kernel, *a, **kw))[1])
    o1, f1 = ops.chunk_kda(q, k, v, g, beta, norm="fused_qk", lower_bound=-5.0, output_final_state=True,
                           config=dataclasses.replace(base, one_pass=True))
    one = list(launched)
    launched.clear()
    o2, f2 = ops.chunk_kda(q, k, v, g, beta, norm="fused_qk", lower_bound=-5.0, output_final_state=True, config=base)
    assert "kda_state_out_kernel" in one and "state_kernel" not in one and "output_kernel" not in one
    assert "kda_state_out_kernel" not in launched and "state_kernel" in launched
    assert _rel(o1, o2) < TOL[torch.float32] and _rel(f1, f2) < TOL[torch.float32]

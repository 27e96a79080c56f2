"""KDA's opt-in 16-token form (``GDNConfig.kda_chunk16``, kernels/kda16.py) on the CPU under the interpreter:
every route against the fp64 recurrence (packed and dense, GVA, initial and final states, odd head sizes, gates
at the lower bound, fp32 and fp16), which kernels it launches, and what it refuses."""

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gdnbench.kernels import ops  # noqa: E402
from gdnbench.kernels.config import default_config  # noqa: E402
from gdnbench.kernels.kda16 import _tf32  # noqa: E402
from gdnbench.kernels.ops import GDNConfig, chunk_kda, validate  # noqa: E402

from .test_ops_kda import check, make_inputs, reference  # noqa: E402

ROUTES = ["none", "flag", "fused_q", "fused_qk"]


def chunk16(K, V, dtype):
    base = default_config(K, V, torch.tensor([], dtype=dtype).element_size(), "kda")
    return dataclasses.replace(base, kda_chunk16=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", ROUTES)
def test_packed_varlen_gva2(norm, dtype):
    """Packed sequences (37 tokens: a 5-token last tile; an empty one; 64; 30), initial and final states, GVA 2,
    K = 32, V = 48 (BV 32: a masked second V block)."""
    cu = torch.tensor([0, 37, 37, 101, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 2, 4, 32, 48, dtype, n_seqs=4, h0=True)
    check(norm, dtype, q, k, v, g, beta, s0, cu, config=chunk16(32, 48, dtype))


@pytest.mark.parametrize("norm", ["flag", "fused_qk"])
def test_dense_batch_odd_heads_gva3(norm):
    """B = 2, T = 70 (a chunk's tail of 6 tokens), GVA 3, K = 60, V = 20 (masked channels and columns)."""
    q, k, v, g, beta, s0 = make_inputs(2, 70, 1, 3, 60, 20, torch.float32, h0=True, seed=3)
    check(norm, torch.float32, q, k, v, g, beta, s0, config=chunk16(60, 20, torch.float32))


@pytest.mark.parametrize("norm", ["flag", "fused_q", "fused_qk"])
@pytest.mark.parametrize("bk", [16, 32])
def test_channels_in_steps(norm, bk):
    """kda16_prep.BK: the K channels in steps of 16 or 32 (K = 60: a masked last step), the grams and the norms'
    sums of squares accumulated over them; packed sequences, GVA 2."""
    cu = torch.tensor([0, 21, 90], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 90, 1, 2, 60, 32, torch.float32, n_seqs=2, h0=True, seed=7)
    base = chunk16(60, 32, torch.float32)
    cfg = dataclasses.replace(base, kda16_prep=dataclasses.replace(base.kda16_prep, BK=bk))
    check(norm, torch.float32, q, k, v, g, beta, s0, cu, config=cfg)


def test_gates_at_the_lower_bound():
    """g = -5 on every channel of one head (2^-115 over a tile: k 2^-c at the edge of the range) and on half the
    channels of the other, the rest near 0."""
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, 32, 32, torch.float32, h0=True, seed=2)
    g[:, :, 0] = -5.0
    g[:, :, 1, ::2] = -5.0
    g[:, :, 1, 1::2] = -1e-3
    check("fused_qk", torch.float32, q, k, v, g, beta, s0, config=chunk16(32, 32, torch.float32))


@pytest.mark.parametrize("bk", [16, 32])
def test_fused_qk_normalizes_large_k_rows_before_the_gates(bk):
    """fused_qk normalizes k's rows as they load, before k 2^-c is formed, in one step (BK 32 of K 32) and in steps:
    a row of norm 2^20 under g = -5 (its raw k 2^-c would be 2^115 times it: past fp32), one of 2^13, one of
    2^11.9."""
    q, k, v, g, beta, s0 = make_inputs(1, 48, 1, 1, 32, 32, torch.float32, h0=True, seed=4)
    g[:, :16] = -5.0
    k[0, 35] *= 2.0 ** 13 / k[0, 35].norm()
    k[0, 15] *= 2.0 ** 20 / k[0, 15].norm()
    k[0, 20] *= 2.0 ** 11.9 / k[0, 20].norm()
    base = chunk16(32, 32, torch.float32)
    cfg = dataclasses.replace(base, kda16_prep=dataclasses.replace(base.kda16_prep, BK=bk))
    check("fused_qk", torch.float32, q, k, v, g, beta, s0, config=cfg)


def test_fused_qk_in_one_step_is_as_accurate_as_normalizing_on_load(bf16_interpreter):
    """bf16, K 128, one warp, tf32 grams: fused_qk in one step (rows' sums from the step's own load) against the
    same route in K steps (sums first).  A one-step form carrying k's rstd on the loop's U, against raw M and k_r,
    had put o's error 4.5 % over (3.43e-3 against 3.28e-3 here) and failed the H200's gate on the final state's
    scale."""
    q, k, v, g, beta, _ = make_inputs(1, 512, 2, 2, 128, 64, torch.bfloat16, seed=5)
    ro, rf = reference(q, k, v, g, beta, normalize=True)
    base = chunk16(128, 64, torch.bfloat16)
    err = {}
    for bk in (None, 64):
        prep = dataclasses.replace(base.kda16_prep, BK=bk, num_warps=1, tf32_grams=True)
        o, fs = chunk_kda(q, k, v, g, beta, output_final_state=True, norm="fused_qk", lower_bound=-5.0,
                          config=dataclasses.replace(base, kda16_prep=prep))
        err[bk] = [((x.double() - r).norm() / r.norm()).item() for x, r in ((o, ro), (fs, rf))]
    assert err[64][0] < 4e-3 and err[64][1] < 4e-3, err  # bf16's error, not a broken route
    assert err[None][0] < 1.02 * err[64][0] and err[None][1] < 1.02 * err[64][1], err


def test_launches_two_kernels_and_refuses_unbounded_gates(monkeypatch):
    q, k, v, g, beta, _ = make_inputs(1, 40, 1, 1, 32, 32, torch.float32)
    names = []

    def launch(kernel, grid, args, constexprs, options):
        names.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)
        return real(kernel, grid, args, constexprs, options)
    real = ops.launch
    monkeypatch.setattr(ops, "launch", launch)
    cfg = chunk16(32, 32, torch.float32)
    chunk_kda(q, k, v, g, beta, norm="fused_qk", lower_bound=-5.0, config=cfg)
    assert names == ["kda16_prep_kernel", "kda16_loop_kernel"]
    with pytest.raises(ValueError, match="kda_chunk16=True needs bounded gates"):
        chunk_kda(q, k, v, g, beta, norm="flag", config=cfg)
    with pytest.raises(ValueError, match="kda_chunk16=True is a KDA form"):
        validate(GDNConfig(kda_chunk16=True), 128, 128, 2, "gdn")


@pytest.mark.parametrize("generic_t", [False, True])
def test_generic_t_launches_the_kernel_compiled_for_any_t(monkeypatch, generic_t):
    """kda16_prep.generic_t: the same prepare kernel, compiled without T's specialization, and the same results."""
    from gdnbench.kernels import kda16

    cu = torch.tensor([0, 37, 101], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 101, 2, 4, 32, 48, torch.float32, n_seqs=2, h0=True, seed=3)
    seen = []

    def launch(kernel, grid, args, constexprs, options):
        seen.append(kernel)
        return real(kernel, grid, args, constexprs, options)
    real = ops.launch
    monkeypatch.setattr(ops, "launch", launch)
    base = chunk16(32, 48, torch.float32)
    cfg = dataclasses.replace(base, kda16_prep=dataclasses.replace(base.kda16_prep, generic_t=generic_t))
    check("fused_q", torch.float32, q, k, v, g, beta, s0, cu, config=cfg)
    want = kda16.kda16_prep_kernel_any_t if generic_t else kda16.kda16_prep_kernel
    prep = [x for x in seen if x.fn.__name__ == "kda16_prep_kernel"]  # fused_q: k's l2norm launch first
    assert len(prep) == 1 and prep[0] is want and kda16.kda16_prep_kernel_any_t is not kda16.kda16_prep_kernel
    assert kda16.kda16_prep_kernel_any_t.fn is kda16.kda16_prep_kernel.fn


def test_backend_takes_bounded_kda_shapes_only():
    """`gdnbench-kda16`: KDA shapes with a lower_bound, every route, its config the form's."""
    from gdnbench.backends import get
    from gdnbench.data import shapes

    b = get("gdnbench-kda16")
    smoke = {s.id: s for s in shapes.load("smoke").shapes}
    kda = smoke["kda_fixed"]
    assert kda.lower_bound is not None
    assert all(b.supports(kda, r, "fwd", "cpu") for r in ROUTES[1:] + ["explicit"])
    assert "has no gdn kernel" in b.supports(smoke["gdn_fixed_b2"], "flag", "fwd", "cpu").reason
    unbounded = dataclasses.replace(kda, lower_bound=None)
    assert "bounded gates only" in b.supports(unbounded, "flag", "fwd", "cpu").reason
    cfg, label = b._config(kda, "flag", "cpu")
    assert cfg.kda_chunk16 and label.endswith("kda_chunk16")


@triton.jit
def _round_kernel(x, y):
    o = tl.arange(0, 8)
    tl.store(y + o, _tf32(tl.load(x + o)))


@pytest.mark.parametrize("norm,mma_sums", [("flag", False), ("fused_qk", False), ("fused_qk", True)])
def test_tf32_grams_match_the_recurrence(norm, mma_sums):
    """kda16_prep.tf32_grams (16-bit storage): the grams as one tf32 product of operands rounded to tf32, summed
    over two 16-channel steps; fused_qk's row sums of squares from the squares or (mma_sums) from x x^T on 16-bit
    rows in those steps."""
    cu = torch.tensor([0, 37, 101], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 101, 2, 4, 32, 48, torch.float16, n_seqs=2, h0=True, seed=5)
    base = chunk16(32, 48, torch.float16)
    cfg = dataclasses.replace(base, kda16_prep=dataclasses.replace(base.kda16_prep, tf32_grams=True, BK=16,
                                                                   mma_sums=mma_sums))
    check(norm, torch.float16, q, k, v, g, beta, s0, cu, config=cfg)
    with pytest.raises(ValueError, match="only kda16_prep forms tile grams"):
        validate(dataclasses.replace(base, kda16_loop=dataclasses.replace(base.kda16_loop, tf32_grams=True)), 32, 48,
                 2, "kda")


def test_tf32_rounds_to_nearest():
    """kda16._tf32 keeps 10 mantissa bits, rounding to nearest (ties away from zero): no bias to zero."""
    one = 1.0 + 2.0 ** -10  # tf32's step at 1
    x = torch.tensor([1.0, 1 + 2.0 ** -11 * 0.9, 1 + 2.0 ** -11 * 1.1, -(1 + 2.0 ** -11 * 1.1), 3.0 ** 0.5,
                      1e-30, 2.0 ** 100, 0.0])
    y = torch.empty_like(x)
    _round_kernel[(1,)](x, y)
    bits = x.view(torch.int32)
    want = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    assert torch.equal(y, want)
    assert y[1] == 1.0 and y[2] == one and y[3] == -one
    assert ((y - x).abs() <= x.abs() * 2.0 ** -11).all()

"""Correctness tests of gdnbench.kernels.ops.chunk_gdn (our Triton chunked GDN forward) on the CPU.

TRITON_INTERPRET=1 is set at the very top, before triton or gdnbench.kernels.ops is
imported: Triton reads it when kernels are first decorated, and this machine
has no GPU.  Under the interpreter tl.dot on bf16 operands is unreliable, so
the tests use fp32 and fp16 storage.  Shapes are small (the interpreter is
slow); every case is compared with a private fp64 token-by-token recurrence.
"""

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gdnbench.kernels.ops import (  # noqa: E402
    GDNConfig,
    KernelConfig,
    L2NormConfig,
    chunk_gdn,
    default_config,
    l2norm,
    prepare_varlen,
    validate,
)

FUSED = ("fused_q", "fused_qk")
TOL = {torch.float32: 1e-4, torch.float16: 5e-3}


# ----------------------------------------------------------------------------- reference
def _l2n64(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def reference(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, normalize=True):
    """fp64 recurrence: S = e^g S; S += k (beta (v - S^T k))^T; o = scale S^T q.  Returns (o, final states)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if normalize:
        q, k = _l2n64(q), _l2n64(k)
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    scale = K**-0.5 if scale is None else scale
    head = torch.arange(HV) // (HV // H)
    if cu_seqlens is None:
        segs = [(b, 0, T) for b in range(B)]
    else:
        cu = cu_seqlens.tolist()
        segs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, V, dtype=torch.float64)
    finals = []
    for n, (b, s, e) in enumerate(segs):
        S = torch.zeros(HV, K, V, dtype=torch.float64)
        if initial_state is not None:
            S = initial_state[n].double().clone()
        for t in range(s, e):
            kt, qt = k[b, t, head], q[b, t, head]
            S = S * torch.exp(g[b, t])[:, None, None]
            err = v[b, t] - torch.einsum("hk,hkv->hv", kt, S)
            S = S + torch.einsum("hk,hv->hkv", kt, beta[b, t][:, None] * err)
            o[b, t] = scale * torch.einsum("hk,hkv->hv", qt, S)
        finals.append(S)
    return o, torch.stack(finals)


def rel_rms(x, ref):
    ref = ref.double()
    return ((x.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def make_inputs(B, T, H, HV, K, V, dtype, n_seqs=None, h0=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen) + 2.0)
    beta = torch.rand(B, T, HV, generator=gen)
    N = n_seqs or B
    s0 = torch.randn(N, HV, K, V, generator=gen) if h0 else None
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta, s0


def check(norm, dtype, q, k, v, g, beta, s0=None, cu=None, config=None, **kw):
    o, fs = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu,
                      norm=norm, config=config, **kw)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)  # the "none" route is fed normalized inputs
    ro, rf = reference(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu, normalize=norm != "none")
    assert o.dtype == v.dtype and o.shape == v.shape
    assert fs.dtype == torch.float32 and fs.shape == rf.shape
    assert rel_rms(o, ro) < TOL[dtype], rel_rms(o, ro)
    assert rel_rms(fs, rf) < TOL[dtype], rel_rms(fs, rf)
    return o, fs


# ----------------------------------------------------------------------------- routes vs fp64
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "fused_qk"])
def test_packed_varlen_gva2_unequal_kv(norm, dtype):
    """Packed sequences (tails < 64, an empty one, one > 64) with initial and final states, GVA 2, K != V."""
    cu = torch.tensor([0, 37, 37, 101, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 2, 4, 32, 48, dtype, n_seqs=4, h0=True)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    check(norm, dtype, q, k, v, g, beta, s0, cu)


# head sizes that are not multiples of 16 (FLA's tests use 60 and 100): the masked tails of the K and V tiles;
# fp32 at (60, 100) and (24, 24), fp16 at (100, 60), every route
ODD_HEADS = [(60, 100, torch.float32), (100, 60, torch.float16), (24, 24, torch.float32)]


@pytest.mark.parametrize("K,V,dtype", ODD_HEADS)
@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "fused_qk"])
def test_head_sizes_not_multiples_of_16(norm, K, V, dtype):
    """Packed varlen (a tail < 64, one > 64) with initial and final states, GVA 2."""
    cu = torch.tensor([0, 37, 100], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, K, V, dtype, n_seqs=2, h0=True, seed=11)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    check(norm, dtype, q, k, v, g, beta, s0, cu)


@pytest.mark.parametrize("norm", ["flag", "fused_qk"])
def test_dense_batch_gva3(norm):
    """B=2, T=130 (tail of 2 tokens), GVA ratio 3, no initial state."""
    q, k, v, g, beta, _ = make_inputs(2, 130, 1, 3, 64, 32, torch.float32)
    check(norm, torch.float32, q, k, v, g, beta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "fused_qk"])
def test_gram_shared_across_value_heads(norm, dtype, monkeypatch):
    """gram_solve with one program per key head for its value heads (taken on the GPU from 1024 programs):
    packed varlen with a tail and an empty sequence, GVA 3, initial states; A and the outputs equal the
    per-value-head programs' and the fp64 recurrence."""
    from gdnbench.kernels import ops

    cu = torch.tensor([0, 37, 37, 150], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 150, 2, 6, 32, 16, dtype, n_seqs=3, h0=True, seed=7)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    varlen = prepare_varlen(cu)
    per_head = ops.gram_solve(k, g, beta, varlen=varlen, fuse_k=norm == "fused_qk")
    monkeypatch.setattr(ops, "GRAM_SHARE_MIN_PROGRAMS", 1)
    shared = ops.gram_solve(k, g, beta, varlen=varlen, fuse_k=norm == "fused_qk")
    for a, b in zip(per_head, shared):
        assert (a is None and b is None) or torch.equal(a, b)
    check(norm, dtype, q, k, v, g, beta, s0, cu)


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
@pytest.mark.parametrize("share", [False, True])
def test_gram_redoes_huge_chunks_in_its_one_launch(share, monkeypatch):
    """fused_qk, fp32 k rows of 1e30 (their squares overflow fp32) in two heads and three chunks: gram_solve
    redoes those chunks overflow-safe in the program that found them (one launch), per value head and shared,
    packed varlen, GVA 3, initial states; A finite, the outputs close to the fp64 recurrence."""
    from gdnbench.kernels import ops

    if share:
        monkeypatch.setattr(ops, "GRAM_SHARE_MIN_PROGRAMS", 1)
    cu = torch.tensor([0, 37, 37, 150], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 150, 2, 6, 32, 16, torch.float32, n_seqs=3, h0=True, seed=9)
    k[0, [3, 70], 0] *= 1e30
    k[0, [140], 1] *= 1e30
    _, A, rstd_k, _ = ops.gram_solve(k, g, beta, varlen=prepare_varlen(cu), fuse_k=True)
    assert torch.isfinite(A).all() and torch.isfinite(rstd_k).all()
    o, fs = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm="fused_qk")
    ro, rf = reference(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, (rel_rms(o, ro), rel_rms(fs, rf))


def test_large_k_small_tiles():
    """K=256 (four 64-row state pieces), V=32, small blocks so every K/V loop runs several tiles."""
    cfg = GDNConfig(gram=KernelConfig(BK=32), wu=KernelConfig(BK=64, BV=16),
                    state=KernelConfig(BV=16), output=KernelConfig(BK=32, BV=16, num_warps=2),
                    output_fused=KernelConfig(BK=64, BV=16, num_warps=2, num_stages=1))
    q, k, v, g, beta, s0 = make_inputs(1, 70, 1, 2, 256, 32, torch.float32, h0=True)
    check("fused_qk", torch.float32, q, k, v, g, beta, s0, config=cfg)
    check("flag", torch.float32, q, k, v, g, beta, s0, config=cfg)


@pytest.mark.parametrize("piece,K", [(16, 48), (32, 96), (128, 96), (256, 160)])
def test_state_piece_heights(piece, K):
    """The state slab in pieces of BK rows: several (16 x 3, 32 x 3), one partly masked (128 for
    K 96; 256 for K 160), varlen with initial states."""
    cfg = dataclasses.replace(default_config(K, 16, 4), state=KernelConfig(BK=piece, BV=16, num_stages=1))
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, K, 16, torch.float32, n_seqs=2, h0=True, seed=5)
    cu = torch.tensor([0, 37, 100], dtype=torch.int64)
    check("flag", torch.float32, q, k, v, g, beta, s0, cu, config=cfg)


def test_fused_output_over_several_k_tiles():
    """q's sums of squares come from a q q^T dot accumulated across K tiles (BK 16 < K 64)."""
    cfg = GDNConfig(output_fused=KernelConfig(BK=16, BV=32, num_stages=2))
    q, k, v, g, beta, s0 = make_inputs(1, 70, 2, 4, 64, 32, torch.float32, h0=True)
    check("fused_q", torch.float32, q, k, v, g, beta, s0, config=cfg)
    check("fused_qk", torch.float32, q, k, v, g, beta, s0, config=cfg)


def test_k96_v16_fp16():
    """K=96 (a partly masked second state piece), V=16, fp16, fused q."""
    q, k, v, g, beta, s0 = make_inputs(1, 80, 2, 2, 96, 16, torch.float16, h0=True)
    check("fused_q", torch.float16, q, k, v, g, beta, s0)


def test_precomputed_varlen_and_maxnreg_config():
    """prepare_varlen output passed in gives the same result; maxnreg in a config is accepted."""
    cu = torch.tensor([0, 20, 90], dtype=torch.int64)
    info = prepare_varlen(cu)
    assert info.num_chunks == 3 and info.chunk_indices.tolist() == [[0, 0], [1, 0], [1, 1]]
    assert info.chunk_offsets.tolist() == [0, 1, 3]
    q, k, v, g, beta, s0 = make_inputs(1, 90, 1, 1, 16, 16, torch.float32, n_seqs=2, h0=True)
    cfg = dataclasses.replace(default_config(16, 16, 4), state=KernelConfig(BV=16, maxnreg=128))
    o1, f1 = check("flag", torch.float32, q, k, v, g, beta, s0, cu, config=cfg, chunk_indices=info)
    o2, f2 = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    assert torch.equal(o1, o2) and torch.equal(f1, f2)


def test_no_final_state():
    q, k, v, g, beta, _ = make_inputs(1, 20, 1, 1, 16, 32, torch.float32)
    o, fs = chunk_gdn(q, k, v, g, beta)
    assert fs is None
    assert rel_rms(o, reference(q, k, v, g, beta)[0]) < 1e-4


# ----------------------------------------------------------------------------- fused-norm semantics
def _outputs(norms, q, k, v, g, beta):
    return {n: chunk_gdn(q, k, v, g, beta, norm=n, output_final_state=True) for n in norms}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zero_rows(dtype):
    """All-zero q rows give zero output rows; all-zero k rows act as no-op tokens; fused == explicit."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 2, 32, 16, dtype)
    q[0, [3, 40, 69]] = 0
    k[0, [5, 40, 64]] = 0
    outs = _outputs(("flag",) + FUSED, q, k, v, g, beta)
    ro, rf = reference(q, k, v, g, beta)
    for norm, (o, fs) in outs.items():
        assert torch.isfinite(o).all() and torch.isfinite(fs).all(), norm
        assert (o[0, [3, 40, 69]] == 0).all(), norm
        assert rel_rms(o, ro) < TOL[dtype] and rel_rms(fs, rf) < TOL[dtype], norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_scales_invariant(dtype):
    """Per-row scales 1e-3..1e3 on q (and k) leave fused outputs equal to the explicit route."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 2, 2, 32, 32, dtype, seed=1)
    gen = torch.Generator().manual_seed(2)
    sq = 10 ** (torch.rand(1, 70, 2, 1, generator=gen) * 6 - 3)
    sk = 10 ** (torch.rand(1, 70, 2, 1, generator=gen) * 6 - 3)
    qs, ks = (q.float() * sq).to(dtype), (k.float() * sk).to(dtype)
    outs = _outputs(("flag",) + FUSED, qs, ks, v, g, beta)
    o_ref, f_ref = outs["flag"]
    for norm in FUSED:
        o, fs = outs[norm]
        assert rel_rms(o, o_ref) < TOL[dtype], (norm, rel_rms(o, o_ref))
        assert rel_rms(fs, f_ref) < TOL[dtype], (norm, rel_rms(fs, f_ref))
    ro, _ = reference(qs, ks, v, g, beta)
    assert rel_rms(o_ref, ro) < TOL[dtype]


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("huge_k", [True, False])
def test_huge_rows_finite(huge_k):
    """fp32 rows of magnitude 1e30 (squares overflow fp32) stay finite and normalized on every route
    (huge_k=False: k rows of 1e10, whose sums of squares stay far below the kernels' 2^100 rare-path
    threshold but whose raw products with those q rows, ~1e40, overflow fp32)."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 1, 32, 16, torch.float32, seed=3)
    q[0, [2, 66]] *= 1e30
    k[0, [7, 66]] *= 1e30 if huge_k else 1e10
    outs = _outputs(("flag",) + FUSED, q, k, v, g, beta)
    ro, rf = reference(q, k, v, g, beta)
    for norm, (o, fs) in outs.items():
        assert torch.isfinite(o).all() and torch.isfinite(fs).all(), norm
        assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, norm


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
@pytest.mark.parametrize("fixup", [False, True])
def test_fused_qk_redoes_only_the_risky_output_program(monkeypatch, fixup):
    """A huge row in the last chunk of the last head: that output program (5 of 6) starts again with k normalized
    on load, the others finish on raw k; gram_solve redoes its chunk in its own program.  sm_90's form redoes it in
    the program (output._output_rare); sm_100's (``fixup``, forced here) flags it for the fix-up launch, which reads
    its flags FLAG_BLOCK at a time (1024; 4 here, so the interpreter sees several blocks)."""
    import triton.language as tl

    from gdnbench.kernels import ops
    from gdnbench.kernels import common, intra, output

    if fixup:
        for mod in (common, intra, output):
            monkeypatch.setattr(mod, "FLAG_BLOCK", tl.constexpr(4))
        monkeypatch.setattr(ops, "FLAG_BLOCK", 4)
        monkeypatch.setattr(output, "cuda_capability_geq", lambda major, minor=0: True)
        monkeypatch.setattr(ops, "_fixup_output", lambda device: True)
    fixups = []
    real = ops._launch

    def launch(kernel, *a, **kw):
        fixups.append(kw.get("FIXUP", False))
        return real(kernel, *a, **kw)

    monkeypatch.setattr(ops, "_launch", launch)
    q, k, v, g, beta, _ = make_inputs(1, 3 * 64, 2, 2, 16, 16, torch.float32, seed=5)
    q[0, 141, 1] *= 1e30  # q_141 k_141^T overflows fp32 (output), k_141's square too (gram)
    k[0, 141, 1] *= 1e30
    o, fs = chunk_gdn(q, k, v, g, beta, norm="fused_qk", output_final_state=True,
                      config=dataclasses.replace(default_config(16, 16, 4), one_pass=False))
    assert fixups.count(True) == (1 if fixup else 0)
    ro, rf = reference(q, k, v, g, beta)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, (rel_rms(o, ro), rel_rms(fs, rf))


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_fused_qk_fp16_rows_beyond_fp16_after_q_norm():
    """fp16 k rows of norm 1.7e5 (elements 3e4) with q rows along them: q_norm k^T, which fused_qk's
    output kernel forms on raw k, leaves fp16's range; those programs redo themselves with k normalized
    on load, so the output stays finite and close to the fp64 recurrence.
    (Looser than TOL: w's and u's rows carry k's rstd, ~6e-6 here, among fp16's subnormals.)"""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 1, 32, 16, torch.float16, seed=3)
    k[0, [7, 66]] = (torch.sign(k[0, [7, 66]].float()) * 3e4).half()
    q[0, [9, 66]] = k[0, [7, 66]]
    o, fs = chunk_gdn(q, k, v, g, beta, norm="fused_qk", output_final_state=True)
    ro, rf = reference(q, k, v, g, beta)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 1e-2 and rel_rms(fs, rf) < 1e-2, (rel_rms(o, ro), rel_rms(fs, rf))


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_l2norm_kernel():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 3, 48, generator=gen)
    x[0, 0] = 0
    x[0, 1] *= 1e-4  # eps inside the sqrt matters here (F.normalize would differ)
    x[0, 2] *= 1e30
    y = l2norm(x, L2NormConfig(BR=4))
    ref = _l2n64(x.double())
    ref[0, 2] = F.normalize(x[0, 2].double(), dim=-1)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-7)
    assert (y[0, 0] == 0).all()
    yh = l2norm(x[1:].half())
    assert yh.dtype == torch.float16
    assert torch.allclose(yh.double(), _l2n64(x[1:].half().double()), rtol=2e-3, atol=1e-3)


# ----------------------------------------------------------------------------- rejections
@pytest.mark.parametrize("norm", FUSED)
def test_fused_rejects_grad(norm):
    q, k, v, g, beta, _ = make_inputs(1, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="forward-only"):
        chunk_gdn(q.requires_grad_(), k, v, g, beta, norm=norm)
    with pytest.raises(ValueError, match="forward-only"):
        chunk_gdn(q.detach(), k, v, g, beta.requires_grad_(), norm=norm)


@pytest.mark.parametrize("norm", FUSED)
def test_fused_rejects_compile(norm, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q, k, v, g, beta, _ = make_inputs(1, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="torch.compile"):
        chunk_gdn(q, k, v, g, beta, norm=norm)


def test_bad_arguments():
    q, k, v, g, beta, _ = make_inputs(2, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="norm"):
        chunk_gdn(q, k, v, g, beta, norm="l2")
    with pytest.raises(ValueError, match="B == 1"):
        chunk_gdn(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match=r"K=8 must be in \[16, 256\]"):
        chunk_gdn(q[..., :8], k[..., :8], v, g, beta)


@pytest.mark.parametrize("K,V", [(16, 16), (32, 16), (32, 48), (96, 192), (128, 128), (256, 256), (60, 100),
                                 (100, 60), (24, 24), (17, 255)])
def test_validate_accepts_defaults(K, V):
    validate(default_config(K, V), K, V)
    validate(default_config(K, V, 4), K, V, dtype_bytes=4)
    assert default_config(128, 128) == GDNConfig()  # the tuned defaults, untouched where they fit


@pytest.mark.parametrize("cfg,K,V,match", [
    (GDNConfig(), 8, 64, r"K=8 must be in \[16, 256\]"),
    (GDNConfig(), 64, 512, r"V=512 must be in \[16, 256\]"),
    (GDNConfig(gram=KernelConfig(BK=48)), 64, 64, "BK"),
    (GDNConfig(wu=KernelConfig(BK=64, BV=None)), 64, 64, "BV"),
    (GDNConfig(state=KernelConfig(BV=32, num_warps=3)), 64, 64, "num_warps"),
    (GDNConfig(output=KernelConfig(BK=64, BV=64, num_stages=0)), 64, 64, "num_stages"),
    (GDNConfig(output=KernelConfig(BK=64, BV=64, maxnreg=20)), 64, 64, "maxnreg"),
    (GDNConfig(output=KernelConfig(BK=256, BV=256, num_stages=4)), 256, 256, "shared memory"),
    (GDNConfig(l2norm=L2NormConfig(BR=3)), 64, 64, "BR"),
    (GDNConfig(state=L2NormConfig()), 64, 64, "KernelConfig"),
    (GDNConfig(state=KernelConfig(BK=16, BV=32)), 128, 64, "more than 4 pieces"),
    (GDNConfig(state=KernelConfig(BK=24, BV=32)), 128, 64, "state.BK"),
])
def test_validate_rejects(cfg, K, V, match):
    with pytest.raises(ValueError, match=match):
        validate(cfg, K, V)


def test_small_head_hazards():
    """Configs that read shared memory out of bounds on the H200 at K=32, V=16 (compute-sanitizer memcheck) are
    rejected, and default_config steps their num_warps down; the K = V = 128 defaults keep theirs."""
    with pytest.raises(ValueError, match=r"config\.wu: num_warps=8 at K=32, V=16: fp32 w/u"):
        validate(GDNConfig(), 32, 16, dtype_bytes=4)
    with pytest.raises(ValueError, match=r"config\.output: num_warps=4 at K=32, V=16: .*16-wide V block"):
        validate(GDNConfig(), 32, 16, dtype_bytes=2)
    fp32, bf16 = default_config(32, 16, 4), default_config(32, 16, 2)
    assert (fp32.wu.num_warps, fp32.output.num_warps, fp32.output_fused.num_warps) == (4, 2, 2)
    assert (bf16.wu.num_warps, bf16.output.num_warps, bf16.output_fused.num_warps) == (8, 2, 2)
    assert default_config(16, 32, 4).wu.num_warps == 4 and default_config(64, 32, 4).wu.num_warps == 8
    validate(GDNConfig(output_fused=KernelConfig(BK=32, BV=128, num_warps=4)), 32, 32)  # V=32: not a hazard


def test_fused_out_one_stage_hazard():
    """fused_out's 128-row pieces walking 32 columns at one stage read shared memory out of bounds on the H200
    (compute-sanitizer memcheck): rejected, split_v's 32-column share included; 2 stages, 64-row pieces and BV 64
    pass."""
    def loop(**kw):
        return GDNConfig(in_loop="wu", fused_out=KernelConfig(**kw))
    for bad in (dict(BK=128, BV=32, num_stages=1), dict(BK=128, BV=64, segments=4, split_v=True, num_stages=1),
                dict(BK=128, BV=32, num_warps=8, num_stages=1)):
        with pytest.raises(ValueError, match=r"config\.fused_out: .*walking 32 columns or fewer need num_stages"):
            validate(loop(**bad), 128, 128)
    for good in (dict(BK=128, BV=32, num_stages=2), dict(BK=64, BV=32, num_stages=1), dict(BK=128, BV=64, num_stages=1),
                 dict(BK=64, BV=64, segments=4, split_v=True, num_stages=1)):
        validate(loop(**good), 128, 128)


def test_validate_remembers_only_what_passed():
    """validate caches a passing check; a failing one raises on every call, an unhashable field too."""
    good, bad = GDNConfig(), GDNConfig(gram=KernelConfig(BK=48))
    validate(good, 64, 64)
    validate(good, 64, 64)
    for _ in range(2):
        with pytest.raises(ValueError, match="BK"):
            validate(bad, 64, 64)
    with pytest.raises(ValueError, match=r"must be in \[16, 256\]"):
        validate(good, 8, 64)  # the same config at other head sizes is checked again
    with pytest.raises(ValueError, match="BK"):
        validate(GDNConfig(gram=KernelConfig(BK=[64])), 64, 64)


def test_host_helpers():
    from gdnbench.kernels.config import cdiv, next_pow2

    assert [cdiv(a, 64) for a in (1, 64, 65, 8192)] == [1, 1, 2, 128]
    assert [next_pow2(n) for n in (1, 2, 3, 16, 17, 96, 128, 129)] == [1, 2, 4, 16, 32, 128, 128, 256]


def test_chunk_gdn_rejects_bad_config():
    q, k, v, g, beta, _ = make_inputs(1, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="BV"):
        chunk_gdn(q, k, v, g, beta, config=dataclasses.replace(default_config(16, 16, 4), state=KernelConfig(BV=24)))

"""GDN's one-pass path (chunk_aqk + state_output: kernels/state_out.py) on the CPU under the interpreter,
forced on with ``GDNConfig.one_pass=True``: every route against the fp64 recurrence, the fused-norm
semantics of tests/test_ops_gdn.py, agreement with the two-kernel path, and ``ops.one_pass``'s rule."""

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from gdnbench.kernels import ops  # noqa: E402
from gdnbench.kernels.ops import GDNConfig, KernelConfig, chunk_gdn, default_config, l2norm, prepare_varlen  # noqa: E402

from .test_ops_gdn import FUSED, TOL, check, make_inputs, reference, rel_rms  # noqa: E402


def forced(K, V, dtype, **kernels):
    return dataclasses.replace(default_config(K, V, torch.tensor([], dtype=dtype).element_size()), one_pass=True,
                               **kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "fused_qk"])
def test_packed_varlen_gva2_unequal_kv(norm, dtype):
    """Packed sequences (tails < 64, an empty one, one > 64) with initial and final states, GVA 2, K != V."""
    cu = torch.tensor([0, 37, 37, 101, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 2, 4, 32, 48, dtype, n_seqs=4, h0=True)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    check(norm, dtype, q, k, v, g, beta, s0, cu, config=forced(32, 48, dtype))


@pytest.mark.parametrize("norm", ["flag", "fused_qk"])
def test_dense_batch_gva3(norm):
    """B=2, T=130 (tail of 2 tokens), GVA ratio 3, no initial state."""
    q, k, v, g, beta, _ = make_inputs(2, 130, 1, 3, 64, 32, torch.float32)
    check(norm, torch.float32, q, k, v, g, beta, config=forced(64, 32, torch.float32))


@pytest.mark.parametrize("piece,K,norm", [(16, 48, "fused_q"), (32, 96, "flag"), (64, 128, "fused_qk"),
                                          (128, 96, "fused_q")])
def test_state_pieces_and_tiles(piece, K, norm):
    """The slab in pieces of BK rows (three, two, one partly masked), Aqk over several K tiles (BK 16),
    varlen with initial states."""
    cfg = forced(K, 16, torch.float32, aqk=KernelConfig(BK=16), state_out=KernelConfig(BK=piece, BV=16,
                                                                                          num_warps=2))
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, K, 16, torch.float32, n_seqs=2, h0=True, seed=5)
    check(norm, torch.float32, q, k, v, g, beta, s0, torch.tensor([0, 37, 100]), config=cfg)


@pytest.mark.parametrize("K,V,dtype,norm", [(60, 100, torch.float32, "fused_qk"), (100, 60, torch.float16, "none"),
                                             (24, 24, torch.float32, "fused_q"), (100, 60, torch.float32, "flag")])
def test_head_sizes_not_multiples_of_16(K, V, dtype, norm):
    """aqk and state_out on masked K and V tails (a partly masked state piece at K 100), varlen, initial states."""
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, K, V, dtype, n_seqs=2, h0=True, seed=12)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    check(norm, dtype, q, k, v, g, beta, s0, torch.tensor([0, 37, 100]), config=forced(K, V, dtype))


@pytest.mark.parametrize("norm", ["flag", "fused_q", "fused_qk"])
def test_agrees_with_the_two_kernel_path(norm):
    q, k, v, g, beta, s0 = make_inputs(1, 150, 2, 4, 64, 32, torch.float32, h0=True, seed=7)
    kw = dict(initial_state=s0, output_final_state=True, norm=norm)
    o1, f1 = chunk_gdn(q, k, v, g, beta, config=forced(64, 32, torch.float32), **kw)
    o2, f2 = chunk_gdn(q, k, v, g, beta, config=dataclasses.replace(forced(64, 32, torch.float32), one_pass=False),
                       **kw)
    assert rel_rms(o1, o2) < 1e-6 and rel_rms(f1, f2) < 1e-6, (rel_rms(o1, o2), rel_rms(f1, f2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zero_rows_and_row_scales(dtype):
    """Zero q rows give zero output rows; per-row scales 1e-3..1e3 leave fused outputs at the flag route's."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 2, 2, 32, 32, dtype, seed=1)
    gen = torch.Generator().manual_seed(2)
    q = (q.float() * 10 ** (torch.rand(1, 70, 2, 1, generator=gen) * 6 - 3)).to(dtype)
    k = (k.float() * 10 ** (torch.rand(1, 70, 2, 1, generator=gen) * 6 - 3)).to(dtype)
    q[0, [3, 40, 69]] = 0
    cfg = forced(32, 32, dtype)
    outs = {n: chunk_gdn(q, k, v, g, beta, norm=n, output_final_state=True, config=cfg) for n in ("flag",) + FUSED}
    ro, rf = reference(q, k, v, g, beta)
    for norm, (o, fs) in outs.items():
        assert (o[0, [3, 40, 69]] == 0).all(), norm
        assert rel_rms(o, ro) < TOL[dtype] and rel_rms(fs, rf) < TOL[dtype], (norm, rel_rms(o, ro))


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
@pytest.mark.parametrize("q_scale,k_scale", [(1e30, 1e30), (1e30, 1e10), (1e9, 1e30)])
def test_huge_rows_finite(q_scale, k_scale):
    """fp32 q rows of 1e30, with k rows of 1e30 (squares overflow) or 1e10 (raw q k products would); and q
    rows of 1e9, whose squares stay below the rare path's bound, with k rows of 1e30 (fused_qk's raw
    products overflow: aqk's bound on k takes the chunk)."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 1, 32, 16, torch.float32, seed=3)
    q[0, [2, 66]] *= q_scale
    k[0, [7, 66]] *= k_scale
    cfg = forced(32, 16, torch.float32)
    ro, rf = reference(q, k, v, g, beta)
    for norm in ("flag",) + FUSED:
        o, fs = chunk_gdn(q, k, v, g, beta, norm=norm, output_final_state=True, config=cfg)
        assert torch.isfinite(o).all() and torch.isfinite(fs).all(), norm
        assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, norm


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_fused_qk_fp16_rows_beyond_fp16():
    """fp16 k rows of norm 1.7e5 with q rows along them: q_norm k^T on raw k leaves fp16's range, so
    fused_qk keeps Aqk in fp32 (tolerance as in tests/test_ops_gdn.py's twin)."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 1, 32, 16, torch.float16, seed=3)
    k[0, [7, 66]] = (torch.sign(k[0, [7, 66]].float()) * 3e4).half()
    q[0, [9, 66]] = k[0, [7, 66]]
    o, fs = chunk_gdn(q, k, v, g, beta, norm="fused_qk", output_final_state=True, config=forced(32, 16, torch.float16))
    ro, rf = reference(q, k, v, g, beta)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 1e-2 and rel_rms(fs, rf) < 1e-2, (rel_rms(o, ro), rel_rms(fs, rf))


def test_rule_on_the_contract_shapes():
    """HV * tokens / longest sequence >= 20 streams: one pass on five gdn-qwen6 shapes, not on serving."""
    cfg = GDNConfig()
    assert ops.one_pass(cfg, 128, 32, 8192, 8192) and ops.one_pass(cfg, 128, 32, 32768, 32768)
    assert ops.one_pass(cfg, 128, 64, 8192, 8192)
    assert ops.one_pass(cfg, 128, 8, 8192, 3063)  # h4_hv8_mixed: 21.4 streams
    assert ops.one_pass(cfg, 128, 48, 8192, 1024)
    assert not ops.one_pass(cfg, 128, 8, 8192, 4096)  # h2_hv8_serving: 16
    assert ops.one_pass(cfg, 128, 8, 3 * 100, 100)  # a dense batch of 3: 24
    assert not ops.one_pass(cfg, 256, 64, 8192, 8192)  # above ONE_PASS_MAX_K
    assert not ops.one_pass(dataclasses.replace(cfg, one_pass=False), 128, 64, 8192, 8192)
    assert ops.one_pass(dataclasses.replace(cfg, one_pass=True), 64, 1, 100, 100)
    assert prepare_varlen(torch.tensor([0, 5, 75, 78])).max_len == 70


def test_rule_decides_the_forward(monkeypatch):
    """Unforced, chunk_gdn takes the path the rule names (HV 20 x one sequence: one pass; HV 4: two kernels)."""
    calls = []
    monkeypatch.setattr(ops, "state_output", lambda *a, **k: calls.append("one") or (None, None))
    monkeypatch.setattr(ops, "state_recurrence", lambda *a, **k: calls.append("two") or (None, None, None))
    monkeypatch.setattr(ops, "chunk_output", lambda *a, **k: None)
    for HV in (20, 4):
        q, k, v, g, beta, _ = make_inputs(1, 16, 1, HV, 16, 16, torch.float32)
        chunk_gdn(q, k, v, g, beta, norm="flag")
    assert calls == ["one", "two"]


def test_forcing_it_where_it_is_not_built():
    with pytest.raises(ValueError, match="one_pass=True needs K <= 128 for GDN"):
        ops.validate(GDNConfig(one_pass=True), 192, 128)
    ops.validate(GDNConfig(one_pass=True), 192, 128, family="kda")  # KDA's one pass (kda_state_out) takes any K
    # its config is checked where it runs: 3 stages at BV 64 exceed shared memory (offline sm_90: 253952 B)
    big = dataclasses.replace(default_config(128, 128, 2, "kda"), kda_state_out=KernelConfig(BK=64, BV=64, num_stages=3))
    ops.validate(big, 128, 128, family="kda")
    with pytest.raises(ValueError, match="config.kda_state_out needs ~253952 B"):
        ops.validate(dataclasses.replace(big, one_pass=True), 128, 128, family="kda")
    with pytest.raises(ValueError, match="one_pass='yes'"):
        ops.validate(GDNConfig(one_pass="yes"), 128, 128)


def test_the_callers_on_launch_sees_each_main_launch_of_a_forward():
    """The autotuner reads a candidate's registers through ``on_launch``: every stage's main launch
    reaches it, a fix-up launch (fused_qk) does not, and a call without it runs as before."""
    torch.manual_seed(0)
    T, H, K, V = 64, 1, 16, 16
    q, k, v = torch.randn(1, T, H, K), torch.randn(1, T, H, K), torch.randn(1, T, H, V)
    g, beta = -torch.rand(1, T, H), torch.rand(1, T, H)
    cfg = dataclasses.replace(ops.default_config(K, V, 4), one_pass=False)
    seen = []

    def on_launch(kernel, compiled):
        seen.append(getattr(getattr(kernel, "fn", kernel), "__name__", ""))

    o, _ = ops.chunk_gdn(q, k, v, g, beta, norm="fused_qk", config=cfg, on_launch=on_launch)
    assert seen == ["gram_solve_kernel", "wu_kernel", "state_kernel", "output_kernel"]
    seen.clear()
    ops.chunk_gdn(q, k, v, g, beta, norm="flag", config=dataclasses.replace(cfg, one_pass=True), on_launch=on_launch)
    assert seen == ["l2norm_kernel", "l2norm_kernel", "gram_solve_kernel", "wu_kernel", "aqk_kernel",
                    "state_out_kernel"]
    assert torch.equal(ops.chunk_gdn(q, k, v, g, beta, norm="fused_qk", config=cfg)[0], o)


def aqk_reference(q, k, g_cs, cu, fuse_q):
    """Aqk per value head from its q head's rows: causal q k^T exp2(c_i - c_j) within each 64-token chunk of
    each sequence (q's rows normalized under fuse_q), and c_q's pairs (c, c + log2 rstd(q))."""
    T, H, HV = q.shape[1], q.shape[2], g_cs.shape[2]
    qf, kf, c = q[0].double(), k[0].double(), g_cs[0].double()
    rstd = qf.pow(2).sum(-1).add(1e-6).rsqrt()
    if fuse_q:
        qf = qf * rstd[..., None]
    aqk = torch.zeros(T, HV, 64, dtype=torch.float64)
    for bos, eos in zip(cu[:-1].tolist(), cu[1:].tolist()):
        for t0 in range(bos, eos, 64):
            n = min(64, eos - t0)
            for hv in range(HV):
                h = hv // (HV // H)
                s = qf[t0:t0 + n, h] @ kf[t0:t0 + n, h].T
                cc = c[t0:t0 + n, hv]
                aqk[t0:t0 + n, hv, :n] = torch.tril(s * torch.exp2(cc[:, None] - cc[None, :]))
    c_q = torch.stack([c, c + torch.log2(rstd).repeat_interleave(HV // H, dim=1)], dim=-1)
    return aqk, c_q


@pytest.mark.parametrize("fuse_q", [False, True])
@pytest.mark.parametrize("H,HV", [(2, 8), (3, 3)])
def test_aqk_one_program_per_q_head(H, HV, fuse_q):
    """aqk_kernel forms q k^T once per q head and writes it, gated, for each value head that shares it
    (GVA 4 and 1), on packed sequences with tails and an empty one; under fuse_q its rows and c_q carry q's rstd."""
    gen = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 70, 70, 100, 165])
    q = torch.randn(1, 165, H, 32, generator=gen)
    k = ops.l2norm(torch.randn(1, 165, H, 32, generator=gen))
    g_cs = -torch.rand(1, 165, HV, generator=gen).cumsum(1) * 0.1
    aqk, c_q = ops.chunk_aqk(q, k, g_cs, fuse_q=fuse_q, varlen=prepare_varlen(cu),
                             config=forced(32, 16, torch.float32, aqk=KernelConfig(BK=16)))
    want, want_cq = aqk_reference(q, k, g_cs, cu, fuse_q)
    assert torch.allclose(aqk[0].double(), want, atol=1e-5, rtol=1e-5)
    if fuse_q:
        assert torch.allclose(ops.pairs_by_token(c_q, 1, 165)[0].double(), want_cq, atol=1e-5, rtol=1e-5)
    else:
        assert c_q is None


def _aqk_inputs(H, HV, seed):
    """q, k (rows of norm ~3 sqrt(K)), g, beta of 165 packed tokens in 4 sequences (an empty one, tails), K 32."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 165, H, 32, generator=gen)
    k = torch.randn(1, 165, H, 32, generator=gen) * 3
    g = -torch.rand(1, 165, HV, generator=gen) * 0.1
    return q, k, g, torch.rand(1, 165, HV, generator=gen), prepare_varlen(torch.tensor([0, 70, 70, 100, 165]))


@pytest.mark.parametrize("H,HV", [(2, 8), (2, 6)])
def test_aqk_k_rstd_columns_and_quads(H, HV):
    """Under fused_qk with gram_solve's rstd_k, aqk's Aqk columns take k's rstd (Aqk on normalized k, for the in-loop
    kernel) and k_tile writes quads: each row's c_q pair, then (c + log2 rstd(k), rstd(k)), per value head (GVA 4,
    and 3 in a tile of 4), for its k_rstd_tile; the pairs are as without them."""
    q, k, g, beta, info = _aqk_inputs(H, HV, 5)
    run = dict(varlen=info, config=forced(32, 16, torch.float32, aqk=KernelConfig(BK=16)))
    g_cs, _, rstd_k, ssq_k = ops.gram_solve(k, g, beta, fuse_k=True, **run)
    aqk, quads = ops.chunk_aqk(q, k, g_cs, fuse_q=True, ssq_k=ssq_k, rstd_k=rstd_k, k_tile=True, **run)
    cols, c_q1 = ops.chunk_aqk(q, k, g_cs, fuse_q=True, ssq_k=ssq_k, rstd_k=rstd_k, **run)
    raw, c_q0 = ops.chunk_aqk(q, k, g_cs, fuse_q=True, ssq_k=ssq_k, **run)
    quads, c_q0, c_q1 = (ops.pairs_by_token(x, 1, 165) for x in (quads, c_q0, c_q1))
    assert quads.shape[-1] == 4 and c_q1.shape[-1] == 2
    assert torch.equal(aqk, cols) and torch.equal(quads[..., :2], c_q0) and torch.equal(c_q1, c_q0)
    rk = k[0].double().pow(2).sum(-1).add(1e-6).rsqrt().repeat_interleave(HV // H, dim=1)  # [T, HV]
    n = info.cu_seqlens.tolist()
    for s0, s1 in zip(n[:-1], n[1:]):  # each chunk's columns, per value head
        for c0 in range(s0, s1, 64):
            c1 = min(c0 + 64, s1)
            want = raw[0, c0:c1, :, : c1 - c0].double() * rk[c0:c1].T[None]
            assert torch.allclose(aqk[0, c0:c1, :, : c1 - c0].double(), want, atol=1e-5, rtol=1e-4)
    want = torch.stack([g_cs[0].double() + torch.log2(rk), rk], -1)
    assert torch.allclose(quads[0, ..., 2:].double(), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="rstd_k"):
        ops.chunk_aqk(q, k, g_cs, fuse_q=True, rstd_k=rstd_k, **run)
    with pytest.raises(ValueError, match="rstd_k"):
        ops.chunk_aqk(q, k, g_cs, fuse_q=True, ssq_k=ssq_k, k_tile=True, **run)


def _written(outs):
    """chunk_aqk's (Aqk, c_q) with the row factors viewed by token (the padding rows of their last block are never
    written)."""
    return [outs[0]] + [None if x is None else ops.pairs_by_token(x, 1, 165) for x in outs[1:]]


@pytest.mark.parametrize("H,HV", [(2, 2), (2, 6)])
def test_aqk_early_gates_is_the_same_kernel(H, HV):
    """KernelConfig.early_gates (aqk's gate rows, and k's rstd for the quads, loaded before q k^T) changes when aqk
    loads, not what it writes: Aqk and c_q bitwise equal to the default order, plain / fused_q / fused_qk with quads,
    GVA 1 and 3 (in a tile of 4), varlen with tails; other kernels may not set it."""
    from gdnbench.kernels.config import validate

    q, k, g, beta, info = _aqk_inputs(H, HV, 7)
    late = forced(32, 16, torch.float32, aqk=KernelConfig(BK=16))
    early = forced(32, 16, torch.float32, aqk=KernelConfig(BK=16, early_gates=True))
    g_cs, _, rstd_k, ssq_k = ops.gram_solve(k, g, beta, fuse_k=True, varlen=info, config=late)
    kn = l2norm(k)
    for args, kw in (((q, kn, g_cs), {}), ((q, kn, g_cs), dict(fuse_q=True)),
                     ((q, k, g_cs), dict(fuse_q=True, ssq_k=ssq_k, rstd_k=rstd_k)),
                     ((q, k, g_cs), dict(fuse_q=True, ssq_k=ssq_k, rstd_k=rstd_k, k_tile=True))):
        a = _written(ops.chunk_aqk(*args, varlen=info, config=late, **kw))
        b = _written(ops.chunk_aqk(*args, varlen=info, config=early, **kw))
        for x, y in zip(a, b):
            assert (x is None and y is None) or torch.equal(x, y)
    with pytest.raises(ValueError, match="early_gates"):
        validate(GDNConfig(state_out=KernelConfig(BK=64, BV=32, early_gates=True)), 128, 128)


@pytest.mark.parametrize("H,HV", [(2, 2), (2, 6)])
def test_heads_first_is_the_same_kernel(H, HV):
    """KernelConfig.heads_first (gram_solve's and aqk's grid ordered by head) changes which programs run together,
    not what they write: g_cs, A, rstd_k, ssq_k and Aqk, c_q's quads bitwise equal to the chunk-first grid, plain and
    fused_qk, varlen with tails and an empty sequence, and a dense batch of two; other kernels may not set it."""
    from gdnbench.kernels.config import validate

    q, k, g, beta, info = _aqk_inputs(H, HV, 11)
    dense = (q[:, :128].reshape(2, 64, H, 32), k[:, :128].reshape(2, 64, H, 32), g[:, :128].reshape(2, 64, HV),
             beta[:, :128].reshape(2, 64, HV), None)
    for q, k, g, beta, info in ((q, k, g, beta, info), dense):
        outs = []
        for first in (False, True):
            config = forced(32, 16, torch.float32, gram=KernelConfig(BK=16, heads_first=first),
                            aqk=KernelConfig(BK=16, heads_first=first))
            run = dict(varlen=info, config=config)
            g_cs, A, rstd_k, ssq_k = ops.gram_solve(k, g, beta, fuse_k=True, **run)
            g_n, A_n, _, _ = ops.gram_solve(l2norm(k), g, beta, **run)
            aqk, c_q = ops.chunk_aqk(q, k, g_cs, fuse_q=True, ssq_k=ssq_k, rstd_k=rstd_k, k_tile=True, **run)
            written = [aqk, ops.pairs_by_token(c_q, q.shape[0], q.shape[1])]
            plain = ops.chunk_aqk(l2norm(q), l2norm(k), g_n, **run)[0]
            outs.append([g_cs, A, rstd_k, ssq_k, g_n, A_n, *written, plain])
        for x, y in zip(*outs):
            assert torch.equal(x, y)
    with pytest.raises(ValueError, match="heads_first"):
        validate(GDNConfig(wu=KernelConfig(BK=64, BV=32, heads_first=True)), 128, 128)
    first = KernelConfig(heads_first=True)  # past the grid's second axis the chunks keep the first one
    assert ops._chunk_head_grid(first, ops.GRID_Y_MAX, 4) == ((4, ops.GRID_Y_MAX), True)
    assert ops._chunk_head_grid(first, ops.GRID_Y_MAX + 1, 4) == ((ops.GRID_Y_MAX + 1, 4), False)
    assert ops._chunk_head_grid(KernelConfig(), 3, 4) == ((3, 4), False)


def _tuned_of() -> dict:
    """The tuned kernel (kernels/cache_key.KERNEL_FUNCTIONS) of each jit function name; output_kernel is output's
    (output_fused, listed after it, is the same function under a fused route)."""
    from gdnbench.kernels.cache_key import KERNEL_FUNCTIONS

    out = {}
    for kernel, (_, names) in KERNEL_FUNCTIONS.items():
        for name in names:
            out.setdefault(name, kernel)
    return out


@pytest.mark.parametrize("route", ["flag", "fused_q", "fused_qk"])
@pytest.mark.parametrize("family,form", [("gdn", {"one_pass": False}), ("gdn", {"one_pass": True}),
                                         ("gdn", {"one_pass": True, "in_loop": "wu"}), ("kda", {}),
                                         ("kda", {"one_pass": True}), ("kda", {"kda_chunk16": True})])
def test_stage_kernels_names_the_kernels_a_forward_launches(family, form, route):
    """ops.stage_kernels (what a row's label lists as tuned) against the launches of that forward."""
    torch.manual_seed(0)
    T, H, K, V = 64, 1, 16, 16
    q, k, v = torch.randn(1, T, H, K), torch.randn(1, T, H, K), torch.randn(1, T, H, V)
    g = -torch.rand(1, T, H, K) if family == "kda" else -torch.rand(1, T, H)
    beta = torch.rand(1, T, H)
    cfg = dataclasses.replace(ops.default_config(K, V, 4, family), **form)
    seen, tuned_of = [], _tuned_of()

    def on_launch(kernel, compiled):
        seen.append(tuned_of[getattr(getattr(kernel, "fn", kernel), "__name__", "")])

    if family == "kda":
        ops.chunk_kda(q, k, v, g, beta, norm=route, lower_bound=-5.0, config=cfg, on_launch=on_launch)
    else:
        ops.chunk_gdn(q, k, v, g, beta, norm=route, config=cfg, on_launch=on_launch)
    fused_out = route.startswith("fused")
    launched = [("output_fused" if fused_out and n == "output" else n) for n in dict.fromkeys(seen)]
    assert tuple(launched) == ops.stage_kernels(cfg, family, route)
    if family == "gdn" and "in_loop" not in form:
        with pytest.raises(ValueError, match="pin config.one_pass"):
            ops.stage_kernels(dataclasses.replace(cfg, one_pass=None), family, route)

"""GDN's opt-in one-pass loop that computes w h and u itself (``GDNConfig.in_loop``: kernels/fused_fwd.py) on
the CPU under the interpreter: against the fp64 recurrence, against today's one-pass path (aqk + w/u +
state_out) to tight tolerance, which kernels it launches, what it refuses, and its benchmark backends."""

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from gdnbench.kernels import common, ops, state_out  # noqa: E402
from gdnbench.kernels.config import split_width  # noqa: E402
from gdnbench.kernels.ops import GDNConfig, KernelConfig, chunk_gdn, default_config, l2norm  # noqa: E402

from .test_ops_gdn import check, make_inputs, reference, rel_rms  # noqa: E402

# today's one-pass path against this one: same math, other roundings (fp32: tf32x3 products; fp16: w and u
# rounded to fp16 there, x and v_new here)
AGREE = {torch.float32: 2e-6, torch.float16: 2e-3}


def configs(K, V, dtype, form, **kernels):
    """(the in_loop config, today's one-pass config) at the defaults for K, V and dtype."""
    base = dataclasses.replace(default_config(K, V, torch.tensor([], dtype=dtype).element_size()), one_pass=True,
                               **kernels)
    return dataclasses.replace(base, in_loop=form), base


def check_both(form, norm, dtype, q, k, v, g, beta, s0=None, cu=None, **kernels):
    """The in_loop form against the fp64 recurrence (tests/test_ops_gdn.check) and against today's one pass."""
    K, V = q.shape[-1], v.shape[-1]
    new, old = configs(K, V, dtype, form, **kernels)
    o1, f1 = check(norm, dtype, q, k, v, g, beta, s0, cu, config=new)
    o2, f2 = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm=norm,
                       config=old)
    assert rel_rms(o1, o2) < AGREE[dtype] and rel_rms(f1, f2) < AGREE[dtype], (rel_rms(o1, o2), rel_rms(f1, f2))


@pytest.mark.parametrize("form,norm", [("wu", "none"), ("wu", "flag"), ("wu", "fused_q"), ("wu", "fused_qk"),
                                       ("wu_aqk", "none"), ("wu_aqk", "flag")])
def test_packed_varlen_gva2_unequal_kv(form, norm):
    """Packed sequences (tails < 64, an empty one, one > 64) with initial and final states, GVA 2, K != V."""
    cu = torch.tensor([0, 37, 37, 101, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 2, 4, 32, 48, torch.float32, n_seqs=4, h0=True)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    check_both(form, norm, torch.float32, q, k, v, g, beta, s0, cu)


@pytest.mark.parametrize("form,norm", [("wu", "flag"), ("wu", "fused_qk"), ("wu_aqk", "flag")])
def test_fp16_varlen(form, norm):
    cu = torch.tensor([0, 37, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 1, 2, 32, 32, torch.float16, n_seqs=2, h0=True, seed=4)
    check_both(form, norm, torch.float16, q, k, v, g, beta, s0, cu)


@pytest.mark.parametrize("form", ["wu", "wu_aqk"])
@pytest.mark.parametrize("KV", [64, 128])
def test_head_sizes_64_and_128(form, KV):
    """K = V = 64 and 128 (the contract's), varlen with initial states, GVA 2, the default piece height."""
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, KV, KV, torch.float32, n_seqs=2, h0=True, seed=9)
    check_both(form, "flag", torch.float32, q, k, v, g, beta, s0, torch.tensor([0, 70, 100]))


@pytest.mark.parametrize("form", ["wu", "wu_aqk"])
def test_dense_batch_gva3_no_initial_state(form):
    """B = 2, T = 66 (a tail of 2 tokens), GVA ratio 3, no initial state."""
    q, k, v, g, beta, _ = make_inputs(2, 66, 1, 3, 64, 32, torch.float32, seed=2)
    check_both(form, "flag", torch.float32, q, k, v, g, beta)


@pytest.mark.parametrize("form,piece,K,V", [("wu", 16, 48, 16), ("wu_aqk", 32, 96, 32), ("wu", 128, 96, 32),
                                            ("wu_aqk", 16, 60, 100)])
def test_pieces_and_masked_heads(form, piece, K, V):
    """The slab in pieces of BK rows (three, two, one partly masked) and heads that are not multiples of 16."""
    kernel = KernelConfig(BK=piece, BV=16, num_warps=2)
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, K, V, torch.float32, n_seqs=2, h0=True, seed=5)
    check_both(form, "flag", torch.float32, q, k, v, g, beta, s0, torch.tensor([0, 37, 100]), fused_out=kernel)


def test_fp16_head_sizes_not_multiples_of_16():
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, 100, 60, torch.float16, n_seqs=2, h0=True, seed=12)
    check_both("wu", "fused_q", torch.float16, q, k, v, g, beta, s0, torch.tensor([0, 37, 100]))


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_fused_qk_huge_rows_finite():
    """fp32 q and k rows of 1e30 under fused_qk: k h on raw k, k's rstd on x's and v_new's rows."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 1, 32, 16, torch.float32, seed=3)
    q[0, [2, 66]] *= 1e30
    k[0, [7, 66]] *= 1e30
    new, _ = configs(32, 16, torch.float32, "wu")
    o, fs = chunk_gdn(q, k, v, g, beta, norm="fused_qk", output_final_state=True, config=new)
    ro, rf = reference(q, k, v, g, beta)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, (rel_rms(o, ro), rel_rms(fs, rf))


@pytest.mark.parametrize("form,norm,seg", [("wu", "flag", 1), ("wu", "fused_q", 4), ("wu", "fused_qk", 2),
                                          ("wu_aqk", "none", 1)])
def test_beta_load_orders_are_the_same_loop(form, norm, seg):
    """early_beta and beta_ahead move beta's load, nothing else: the same outputs bitwise, varlen, GVA 2, K != V,
    warm-ups and hand-overs in segments."""
    cu = torch.tensor([0, 37, 37, 101, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 2, 4, 32, 48, torch.float32, n_seqs=4, h0=True, seed=6)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    loop = KernelConfig(BV=16, num_warps=2, segments=seg, split_v=seg == 4)
    new, _ = configs(32, 48, torch.float32, form, fused_out=loop)
    late = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm=norm, config=new)
    for order in ({"early_beta": True}, {"beta_ahead": True}, {"beta_ahead": True, "early_beta": True}):
        moved = check(norm, torch.float32, q, k, v, g, beta, s0, cu,
                      config=dataclasses.replace(new, fused_out=dataclasses.replace(loop, **order)))
        assert all(torch.equal(a, b) for a, b in zip(late, moved)), order


@pytest.mark.parametrize("seg,dtype", [(1, torch.float32), (4, torch.float32), (2, torch.float16)])
def test_k_rstd_tile_is_the_same_loop(seg, dtype):
    """fused_qk's k_rstd_tile reads k's rstd from aqk's quads, as (c + log2 r, r) beside c_q's pair, not as its own
    vector: within rounding of the vector form (exp2(c + log2 r) against exp2(c) r) and of the fp64 recurrence, varlen, GVA 2,
    an initial state, in one segment and in several."""
    cu = torch.tensor([0, 37, 37, 101, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 2, 4, 32, 48, dtype, n_seqs=4, h0=True, seed=8)
    k = k * 3
    loop = KernelConfig(BV=16, num_warps=2, segments=seg, split_v=seg == 4)
    new, _ = configs(32, 48, dtype, "wu", fused_out=loop)
    vec = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm="fused_qk",
                    config=new)
    tile = check("fused_qk", dtype, q, k, v, g, beta, s0, cu,
                 config=dataclasses.replace(new, fused_out=dataclasses.replace(loop, k_rstd_tile=True)))
    assert all(rel_rms(a, b) < AGREE[dtype] for a, b in zip(vec, tile)), [rel_rms(a, b) for a, b in zip(vec, tile)]


@pytest.mark.parametrize("seg,dtype", [(1, torch.float32), (4, torch.float32), (2, torch.float16)])
def test_c_last_from_tile_is_the_same_loop(seg, dtype):
    """c_last_from_tile takes each chunk's last gate cumsum from the k tile's c rows, not a load of its own: the
    same outputs bitwise, varlen (a partial last chunk, an empty sequence), GVA 2, an initial state, one to four
    segments; without the tile it is refused."""
    cu = torch.tensor([0, 37, 37, 101, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 2, 4, 32, 48, dtype, n_seqs=4, h0=True, seed=8)
    loop = KernelConfig(BV=16, num_warps=2, segments=seg, split_v=seg == 4, k_rstd_tile=True)
    new, _ = configs(32, 48, dtype, "wu", fused_out=loop)
    load = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm="fused_qk",
                     config=new)
    summed = check("fused_qk", dtype, q, k, v, g, beta, s0, cu,
                   config=dataclasses.replace(new, fused_out=dataclasses.replace(loop, c_last_from_tile=True)))
    assert all(torch.equal(a, b) for a, b in zip(load, summed))
    with pytest.raises(ValueError, match="c_last_from_tile"):
        chunk_gdn(q, k, v, g, beta, norm="fused_qk", cu_seqlens=cu, config=dataclasses.replace(
            new, fused_out=dataclasses.replace(loop, k_rstd_tile=False, c_last_from_tile=True)))


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_k_rstd_tile_huge_rows_finite():
    """k_rstd_tile with fp32 q and k rows of 1e30: log2 of k's rstd (about -100) in the tile, not the rstd alone."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 1, 32, 16, torch.float32, seed=3)
    q[0, [2, 66]] *= 1e30
    k[0, [7, 66]] *= 1e30
    new, _ = configs(32, 16, torch.float32, "wu", fused_out=KernelConfig(BV=16, num_warps=2, k_rstd_tile=True))
    o, fs = chunk_gdn(q, k, v, g, beta, norm="fused_qk", output_final_state=True, config=new)
    ro, rf = reference(q, k, v, g, beta)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, (rel_rms(o, ro), rel_rms(fs, rf))


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
@pytest.mark.parametrize("tile,blackwell", [(False, False), (True, False), (True, True)])
def test_aqk_rare_call_varlen_gva(monkeypatch, tile, blackwell):
    """aqk's rare path under fused_qk, a non-inlined call (state_out._aqk_rare) that does the chunk's stores itself,
    inlined where cuda_capability_geq(10) (blackwell: that branch taken): huge q and k rows (1e30, fp32) in chunks
    of both key heads, GVA 3 (its factor tiles padded to 4), varlen, an initial state, with and without the k tile;
    the chunks without huge rows take the main path."""
    asked = []
    if blackwell:
        def geq(major, minor=0):
            asked.append(major)
            return True

        monkeypatch.setattr(state_out, "cuda_capability_geq", geq)  # the rare path's branch
        monkeypatch.setattr(common, "cuda_capability_geq", lambda major, minor=0: True)  # vec_max's
    cu = torch.tensor([0, 70, 101, 200], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 200, 2, 6, 32, 16, torch.float32, n_seqs=3, h0=True, seed=9)
    q[0, [2, 66, 150], 1] *= 1e30
    k[0, [7, 66], 0] *= 1e30
    k[0, 180, 1] *= 1e30
    new, _ = configs(32, 16, torch.float32, "wu", fused_out=KernelConfig(BV=16, num_warps=2, k_rstd_tile=tile))
    o, fs = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm="fused_qk",
                      config=new)
    ro, rf = reference(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, (rel_rms(o, ro), rel_rms(fs, rf))
    assert bool(asked) == blackwell


def _launched(monkeypatch, config, norm="flag"):
    names = []
    real = ops._launch

    def spy(kernel, *a, **kw):
        names.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)
        return real(kernel, *a, **kw)

    monkeypatch.setattr(ops, "_launch", spy)
    q, k, v, g, beta, _ = make_inputs(1, 20, 1, 2, 16, 16, torch.float32)
    chunk_gdn(q, k, v, g, beta, norm=norm, config=config)
    return names


def test_kernels_launched(monkeypatch):
    """"wu": no w/u kernel; "wu_aqk": no aqk kernel either; unset: today's kernels, on either path."""
    base = default_config(16, 16, 4)
    assert _launched(monkeypatch, dataclasses.replace(base, in_loop="wu")) == [
        "l2norm_kernel", "l2norm_kernel", "gram_solve_kernel", "aqk_kernel", "fused_state_out_kernel"]
    assert _launched(monkeypatch, dataclasses.replace(base, in_loop="wu_aqk")) == [
        "l2norm_kernel", "l2norm_kernel", "gram_solve_kernel", "fused_state_out_kernel"]
    assert _launched(monkeypatch, dataclasses.replace(base, one_pass=True)) == [
        "l2norm_kernel", "l2norm_kernel", "gram_solve_kernel", "wu_kernel", "aqk_kernel", "state_out_kernel"]
    assert _launched(monkeypatch, base)[-2:] == ["state_kernel", "output_kernel"]  # 2 streams: two kernels
    assert _launched(monkeypatch, dataclasses.replace(base, in_loop="wu"), "fused_qk") == [
        "gram_solve_kernel", "aqk_kernel", "fused_state_out_kernel"]  # gram's rare chunks in its own launch


def test_refusals():
    with pytest.raises(ValueError, match="in_loop='wuaqk' must be one of"):
        ops.validate(GDNConfig(in_loop="wuaqk"), 128, 128)
    with pytest.raises(ValueError, match="one_pass=False contradicts it"):
        ops.validate(GDNConfig(in_loop="wu", one_pass=False), 128, 128)
    with pytest.raises(ValueError, match="needs GDN with K <= 128"):
        ops.validate(GDNConfig(in_loop="wu"), 192, 128)
    with pytest.raises(ValueError, match="needs GDN"):
        ops.validate(GDNConfig(in_loop="wu"), 128, 128, family="kda")
    with pytest.raises(ValueError, match="fused_out.BK=16 splits K=128 into more than 4 pieces"):
        ops.validate(GDNConfig(in_loop="wu", fused_out=KernelConfig(BK=16, BV=32)), 128, 128)
    with pytest.raises(ValueError, match="config.fused_out needs ~"):
        ops.validate(dataclasses.replace(default_config(128, 128, 4), in_loop="wu",
                                         fused_out=KernelConfig(BV=32, num_stages=3)), 128, 128, 4)
    with pytest.raises(ValueError, match="config.state_out.early_beta=True: only fused_out"):
        ops.validate(GDNConfig(one_pass=True, state_out=KernelConfig(BV=32, early_beta=True)), 128, 128)
    ops.validate(GDNConfig(in_loop="wu"), 128, 128)  # the default kernel config, bf16
    q, k, v, g, beta, _ = make_inputs(1, 20, 1, 1, 16, 16, torch.float32)
    for norm in ("fused_q", "fused_qk"):
        with pytest.raises(ValueError, match=f"takes norm 'none' or 'flag', not '{norm}'"):
            chunk_gdn(q, k, v, g, beta, norm=norm, config=dataclasses.replace(default_config(16, 16, 4),
                                                                               in_loop="wu_aqk"))


def test_default_config_fits_fp32_k128():
    """fp32 K = V = 128 lowers the loop's default 3 stages to 2 (its estimate), as default_config does for all."""
    assert default_config(128, 128, 2).fused_out.num_stages == 3
    assert default_config(128, 128, 4).fused_out.num_stages == 2


def test_backends():
    from gdnbench.backends import get
    from gdnbench.data.shapes import load

    by_id = {s.id: s for s in load("gdn-qwen6").shapes}
    wu, wu_aqk = get("gdnbench-fusedwu"), get("gdnbench-fusedwu-aqk")
    serving = by_id["h2_hv8_serving"]  # two kernels under the rule: the in_loop form still runs one pass
    assert wu.config_label(serving, "flag", "cpu") == "default; one pass, in loop: wu"
    cfg = wu._config(serving, "fused_qk", "cpu")[0]
    assert (cfg.one_pass, cfg.in_loop) == (True, "wu")
    cfg = wu_aqk._config(serving, "explicit", "cpu")[0]
    assert (cfg.in_loop, cfg.fused_out.num_stages) == ("wu_aqk", 2)
    assert wu.supports(serving, "fused_qk", "fwd", "cuda")
    why = wu_aqk.supports(serving, "fused_q", "fwd", "cuda")
    assert not why and "has no route 'fused_q'" in why.reason
    kda = load("kda-legacy6").shapes[0]
    assert not wu.supports(kda, "flag", "fwd", "cuda")
    assert "in_loop=wu_aqk" in wu_aqk.variant(serving, "flag")


def test_fusedwu_runs_its_loop_at_state_outs_tuned_config():
    from gdnbench.backends import get
    from gdnbench.data.shapes import load

    shape = {s.id: s for s in load("gdn-qwen6").shapes}["h16_hv64_fixed8k"]
    wu, wu_aqk = get("gdnbench-fusedwu"), get("gdnbench-fusedwu-aqk")
    won = KernelConfig(BK=128, BV=64, num_warps=4, num_stages=3, maxnreg=240)
    base = dataclasses.replace(default_config(128, 128, 2), one_pass=True, in_loop="wu")
    cfg = dataclasses.replace(base, state_out=won)
    assert wu._loop_config(cfg, shape) == (dataclasses.replace(cfg, fused_out=won), " at state_out's config")
    assert wu._loop_config(base, shape) == (base, "")  # state_out untuned: the loop's own default
    own = dataclasses.replace(cfg, fused_out=KernelConfig(BV=64, num_warps=8, num_stages=2))
    assert wu._loop_config(own, shape) == (own, "")  # its own winner
    big = dataclasses.replace(cfg, state_out=KernelConfig(BK=128, BV=128, num_warps=4, num_stages=4))
    assert wu._loop_config(big, shape) == (big, "")  # does not fit the loop: its default
    loop = wu_aqk._loop_config(cfg, shape)[0].fused_out
    assert loop == dataclasses.replace(default_config(128, 128, 2).fused_out, num_stages=2)


def _three_gate_heads(T, seed):
    """Gates per value head: strong (a chunk forgets 2^-90: warm-up from the previous chunk), none (g = 0: a
    walk from the start or the wait for the previous segment), slow (-0.01 per token: 35 chunks to 2^-32)."""
    g = torch.empty(1, T, 3)
    g[..., 0] = -1.0 - torch.rand(1, T, generator=torch.Generator().manual_seed(seed))
    g[..., 1] = 0.0
    g[..., 2] = -0.01
    return g


@pytest.mark.parametrize("form,norm,segments", [("wu", "flag", 2), ("wu", "fused_q", 4), ("wu", "fused_qk", 8),
                                                ("wu_aqk", "none", 4)])
def test_segments_match_one_segment(form, norm, segments):
    """Sequences cut in segments (each program warms up or waits for its predecessor's state) give what one
    program per sequence gives: packed sequences of 8, 1, 0 and 5 chunks (fewer chunks than segments, an empty
    one), initial and final states, three gate regimes, GVA 3."""
    cu = torch.tensor([0, 512, 549, 549, 849])
    q, k, v, _, beta, s0 = make_inputs(1, 849, 1, 3, 32, 16, torch.float32, n_seqs=4, h0=True, seed=21)
    g = _three_gate_heads(849, 21)
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    one, _ = configs(32, 16, torch.float32, form, fused_out=KernelConfig(BK=16, BV=16, num_warps=2))
    cut = dataclasses.replace(one, fused_out=dataclasses.replace(one.fused_out, segments=segments))
    o1, f1 = check(norm, torch.float32, q, k, v, g, beta, s0, cu, config=one)
    o2, f2 = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm=norm,
                       config=cut)
    assert rel_rms(o1, o2) < 1e-6 and rel_rms(f1, f2) < 1e-6, (rel_rms(o1, o2), rel_rms(f1, f2))
    # the heads that never forget keep no warm-up truncation: bitwise what one program gives
    assert torch.equal(o1[..., 1, :], o2[..., 1, :]) and torch.equal(f1[:, 1], f2[:, 1])


def test_segments_dense_batch():
    """B = 2 rows of 6 chunks in 4 segments, no initial state, GVA 3, in_loop "wu" under flag."""
    q, k, v, _, beta, _ = make_inputs(2, 384, 1, 3, 32, 32, torch.float32, seed=22)
    g = _three_gate_heads(384, 22).expand(2, -1, -1).contiguous()
    one, _ = configs(32, 32, torch.float32, "wu")
    cut = dataclasses.replace(one, fused_out=dataclasses.replace(one.fused_out, segments=4))
    o1, f1 = check("flag", torch.float32, q, k, v, g, beta, config=one)
    o2, f2 = chunk_gdn(q, k, v, g, beta, output_final_state=True, norm="flag", config=cut)
    assert rel_rms(o1, o2) < 1e-6 and rel_rms(f1, f2) < 1e-6, (rel_rms(o1, o2), rel_rms(f1, f2))


@pytest.mark.parametrize("norm,segments,V,BV", [("flag", 4, 64, 64), ("fused_qk", 8, 64, 64), ("fused_q", 4, 16, 16)])
def test_split_v_matches_one_segment(norm, segments, V, BV, monkeypatch):
    """split_v: the heads that would wait split their V slab over the segment programs (32 columns each at BV 64;
    at BV 16 one program of the four works, the rest idle) and give what one program per sequence gives (bitwise
    where the split program's slab is the whole slab: the same code); the heads that forget warm up as without
    split_v.  Packed sequences of 8, 1, 0 and 5 chunks, initial and final states, GVA 3."""
    cu = torch.tensor([0, 512, 549, 549, 849])
    q, k, v, _, beta, s0 = make_inputs(1, 849, 1, 3, 32, V, torch.float32, n_seqs=4, h0=True, seed=23)
    g = _three_gate_heads(849, 23)
    one, _ = configs(32, V, torch.float32, "wu", fused_out=KernelConfig(BK=16, BV=BV, num_warps=2))
    cut = dataclasses.replace(one, fused_out=dataclasses.replace(one.fused_out, segments=segments, split_v=True))
    o1, f1 = check(norm, torch.float32, q, k, v, g, beta, s0, cu, config=one)
    syncs = []  # the loop's ticket counter and hand-over flags, as the launch left them

    def launch(kernel, grid, args, constexprs, options):
        out = real_launch(kernel, grid, args, constexprs, options)
        if kernel is ops.fused_state_out_kernel:
            syncs.append(args[kernel.arg_names.index("sync")])
        return out
    real_launch = ops.launch
    monkeypatch.setattr(ops, "launch", launch)
    o2, f2 = chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm=norm,
                       config=cut)
    assert len(syncs) == 1 and syncs[0][1:].sum() == 0  # no state was handed over: the waiting heads split V
    assert rel_rms(o1, o2) < 1e-6 and rel_rms(f1, f2) < 1e-6, (rel_rms(o1, o2), rel_rms(f1, f2))
    for head in (1, 2):  # g = 0 and -0.01 per token: both wait somewhere, so both are split
        assert rel_rms(o1[..., head, :], o2[..., head, :]) < 1e-6 and rel_rms(f1[:, head], f2[:, head]) < 1e-6
        if split_width(BV, segments) == BV:
            assert torch.equal(o1[..., head, :], o2[..., head, :]) and torch.equal(f1[:, head], f2[:, head])


def test_segments_refused_elsewhere():
    with pytest.raises(ValueError, match="fused_out.segments=3 must be one of"):
        ops.validate(GDNConfig(in_loop="wu", fused_out=KernelConfig(BV=32, segments=3)), 128, 128)
    with pytest.raises(ValueError, match="state_out.segments=2: only fused_out"):
        ops.validate(GDNConfig(state_out=KernelConfig(BV=32, segments=2)), 128, 128)
    with pytest.raises(ValueError, match="fused_out.split_v=True: only fused_out in 4 or 8 segments"):
        ops.validate(GDNConfig(in_loop="wu", fused_out=KernelConfig(BV=32, segments=2, split_v=True)), 128, 128)
    with pytest.raises(ValueError, match="state_out.split_v=True: only fused_out in 4 or 8 segments"):
        ops.validate(GDNConfig(state_out=KernelConfig(BV=32, split_v=True)), 128, 128)

"""Correctness tests of gdnbench.kernels.ops.chunk_kda (our Triton chunked KDA forward) on the CPU.

As in test_ops_gdn.py: TRITON_INTERPRET=1 before triton is imported, fp32/fp16 storage
only (bf16 dots are unreliable under the interpreter), small odd shapes, and every case
compared with the fp64 token recurrence of gdnbench.oracle.reference (per-channel gates).
The GDN kernels this op shares are covered, unchanged, by test_ops_gdn.py.
"""

import dataclasses
import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from gdnbench.cli.app import app  # noqa: E402
from gdnbench.kernels.config import default_config  # noqa: E402
from gdnbench.kernels.ops import GDNConfig, KernelConfig, chunk_kda, l2norm, prepare_varlen, validate  # noqa: E402
from gdnbench.oracle.reference import recurrence  # noqa: E402

FUSED = ("fused_q", "fused_qk")
TOL = {torch.float32: 1e-4, torch.float16: 5e-3}


def reference(q, k, v, g, beta, initial_state=None, cu_seqlens=None, normalize=True):
    """fp64 recurrence on the inputs as stored: (o, final states)."""
    cu = None if cu_seqlens is None else cu_seqlens.tolist()
    s0 = None if initial_state is None else initial_state.double()
    return recurrence(*(x.double() for x in (q, k, v, g, beta)), scale=q.shape[-1] ** -0.5, initial_state=s0,
                      cu_seqlens=cu, normalize=normalize)


def rel_rms(x, ref):
    ref = ref.double()
    return ((x.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def make_inputs(B, T, H, HV, K, V, dtype, n_seqs=None, h0=False, seed=0, lower_bound=-5.0):
    """Raw q, k, v; g = lower_bound * sigmoid(normal) per channel (the bounded gate); beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = lower_bound * torch.sigmoid(torch.randn(B, T, HV, K, generator=gen))
    beta = torch.rand(B, T, HV, generator=gen)
    s0 = torch.randn(n_seqs or B, HV, K, V, generator=gen) if h0 else None
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta, s0


def check(norm, dtype, q, k, v, g, beta, s0=None, cu=None, config=None, tol=None, **kw):
    if norm == "none":
        q, k = l2norm(q), l2norm(k)  # the "none" route is fed normalized inputs
    o, fs = chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm=norm,
                      lower_bound=-5.0, config=config, **kw)
    ro, rf = reference(q, k, v, g, beta, s0, cu, normalize=norm != "none")
    assert o.dtype == v.dtype and o.shape == v.shape
    assert fs.dtype == torch.float32 and fs.shape == rf.shape
    tol = tol or TOL[dtype]
    assert rel_rms(o, ro) < tol, rel_rms(o, ro)
    assert rel_rms(fs, rf) < tol, rel_rms(fs, rf)
    return o, fs


# ----------------------------------------------------------------------------- routes vs fp64
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "fused_qk"])
def test_packed_varlen_gva2_unequal_kv(norm, dtype):
    """Packed sequences (tails < 64, an empty one, one > 64) with initial and final states, GVA 2, K=32, V=48."""
    cu = torch.tensor([0, 37, 37, 101, 131], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 131, 2, 4, 32, 48, dtype, n_seqs=4, h0=True)
    check(norm, dtype, q, k, v, g, beta, s0, cu)


# head sizes that are not multiples of 16 (FLA's tests use 60 and 100): fp32 at (60, 100) and (24, 24), fp16 at
# (100, 60), every route
ODD_HEADS = [(60, 100, torch.float32), (100, 60, torch.float16), (24, 24, torch.float32)]


@pytest.mark.parametrize("K,V,dtype", ODD_HEADS)
@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "fused_qk"])
def test_head_sizes_not_multiples_of_16(norm, K, V, dtype):
    """Packed varlen (a tail < 64, one > 64) with initial and final states, GVA 2: masked K and V tails in
    every kernel, per-channel gates on the masked channels included."""
    cu = torch.tensor([0, 37, 100], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, K, V, dtype, n_seqs=2, h0=True, seed=11)
    check(norm, dtype, q, k, v, g, beta, s0, cu)


@pytest.mark.parametrize("norm", ["flag", "fused_qk"])
def test_dense_batch_k96_gva3_fp16(norm):
    """B=2, T=130 (a 2-token tail), GVA 3, K=96 (three K tiles, a partly masked second state piece), fp16."""
    q, k, v, g, beta, s0 = make_inputs(2, 130, 1, 3, 96, 32, torch.float16, h0=True, seed=1)
    check(norm, torch.float16, q, k, v, g, beta, s0)


@pytest.mark.parametrize("norm", ["flag", "fused_q", "fused_qk"])
def test_gates_at_the_lower_bound(norm):
    """g = -5 on every channel of every token of one head (the largest in-chunk gate factors, e^75),
    and on half the channels of the other (the rest near 0, so the state keeps a long memory)."""
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, 32, 32, torch.float32, h0=True, seed=2)
    g[:, :, 0] = -5.0
    g[:, :, 1, ::2] = -5.0
    g[:, :, 1, 1::2] = -1e-3
    check(norm, torch.float32, q, k, v, g, beta, s0)


def unbounded_gates(shape, seed, wild=False):
    """Per-channel gates with no lower bound.  FLA's test form: logsigmoid(normal) * 8 (down to about -40)
    with 30 % of the entries set to -1000.  ``wild``: -exp(3 normal) (about -8000 to -1e-4) with every fifth
    channel at -1000: tiny gates right after huge ones, where the fp32 chunk cumsum that every stage reads
    loses about ulp(|c|) ~ 1e-4 relative on an entry (c reaches -1e5 in log2 units)."""
    gen = torch.Generator().manual_seed(seed)
    if wild:
        g = -torch.exp(3 * torch.randn(shape, generator=gen))
        g[..., ::5] = -1000.0
        return g
    g = torch.nn.functional.logsigmoid(torch.randn(shape, generator=gen)) * 8
    return torch.where(torch.rand(shape, generator=gen) < 0.3, -1000.0, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "fused_qk"])
def test_unbounded_gates(norm, dtype):
    """Gates far below -5 and at -1000, no lower_bound: finite and within the usual budget of the fp64
    recurrence, packed varlen with initial states, GVA 2, every route."""
    cu = torch.tensor([0, 37, 110], dtype=torch.int64)
    q, k, v, _, beta, s0 = make_inputs(1, 110, 1, 2, 32, 32, dtype, n_seqs=2, h0=True, seed=5)
    g = unbounded_gates((1, 110, 2, 32), seed=7)
    assert g.min() == -1000.0 and (g > -5).float().mean() > 0.3
    if norm == "none":
        q, k = l2norm(q), l2norm(k)
    o, fs = chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, norm=norm)
    ro, rf = reference(q, k, v, g, beta, s0, cu, normalize=norm != "none")
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < TOL[dtype], rel_rms(o, ro)
    assert rel_rms(fs, rf) < TOL[dtype], rel_rms(fs, rf)


@pytest.mark.parametrize("norm", ["flag", "fused_qk"])
def test_unbounded_gates_wild(norm):
    """Gates from -8000 to -1e-4 (the wild form): finite, and within the fp32 cumsum's precision
    (3.3e-4 rel-RMS measured, against 1e-4 for bounded gates; see unbounded_gates)."""
    q, k, v, _, beta, s0 = make_inputs(1, 110, 1, 2, 32, 32, torch.float32, h0=True, seed=5)
    g = unbounded_gates((1, 110, 2, 32), seed=7, wild=True)
    o, fs = chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, norm=norm)
    ro, rf = reference(q, k, v, g, beta, s0)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 2e-3 and rel_rms(fs, rf) < 2e-3, (rel_rms(o, ro), rel_rms(fs, rf))


def test_unbounded_gates_big_k_rows():
    """The unbounded form's rare path (fused_qk, k rows with sums of squares past 2^38: the gram is redone
    on rows normalized on load, with the diagonal blocks' k rows too)."""
    q, k, v, _, beta, _ = make_inputs(1, 70, 1, 1, 32, 16, torch.float32, seed=8)
    k[0, 3:40] *= 1e6
    g = unbounded_gates((1, 70, 1, 32), seed=9)
    o, fs = chunk_kda(q, k, v, g, beta, output_final_state=True, norm="fused_qk")
    ro, rf = reference(q, k, v, g, beta)
    assert rel_rms(o, ro) < TOL[torch.float32] and rel_rms(fs, rf) < TOL[torch.float32], (rel_rms(o, ro),
                                                                                           rel_rms(fs, rf))


def test_gates_below_lower_bound_are_refused():
    """lower_bound given and a gate below it: a ValueError before any launch, naming the bound and the
    minimum; the bound itself and above pass."""
    q, k, v, g, beta, _ = make_inputs(1, 20, 1, 1, 16, 16, torch.float32)
    g[0, 7, 0, 3] = -6.0
    with pytest.raises(ValueError, match=r"below lower_bound=-5 \(min g = -6\)"):
        chunk_kda(q, k, v, g, beta, lower_bound=-5.0)
    g[0, 7, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="below lower_bound"):
        chunk_kda(q, k, v, g, beta, lower_bound=-5.0)
    g[0, 7, 0, 3] = -5.0
    o, _ = chunk_kda(q, k, v, g, beta, lower_bound=-5.0)
    assert torch.isfinite(o).all()


def test_small_tiles_k64():
    """Blocks of 16 on K and V so every K/V loop of every kernel runs several tiles."""
    cfg = GDNConfig(kda_intra=KernelConfig(BK=16), wu=KernelConfig(BK=16, BV=16), state=KernelConfig(BV=16),
                    output=KernelConfig(BK=16, BV=16, num_warps=2),
                    output_fused=KernelConfig(BK=16, BV=16, num_warps=2, num_stages=1))
    q, k, v, g, beta, s0 = make_inputs(1, 70, 1, 1, 64, 32, torch.float32, h0=True, seed=3)
    check("fused_qk", torch.float32, q, k, v, g, beta, s0, config=cfg)
    check("flag", torch.float32, q, k, v, g, beta, s0, config=cfg)


def test_state_one_piece_per_channel():
    """KDA's per-channel state decay with the slab as one 128-row piece (K 96, masked rows)."""
    cfg = dataclasses.replace(default_config(96, 32, 4, "kda"), state=KernelConfig(BK=128, BV=32, num_stages=1))
    q, k, v, g, beta, s0 = make_inputs(1, 70, 1, 2, 96, 32, torch.float32, h0=True, seed=6)
    check("flag", torch.float32, q, k, v, g, beta, s0, config=cfg)


def test_precomputed_varlen_defaults_and_no_final_state():
    """prepare_varlen output passed in gives the same result, as does skipping the gate check; lower_bound
    None (the unbounded form) agrees with the bounded one on bounded gates."""
    cu = torch.tensor([0, 20, 90], dtype=torch.int64)
    q, k, v, g, beta, s0 = make_inputs(1, 90, 1, 1, 16, 16, torch.float32, n_seqs=2, h0=True, seed=4)
    o1, f1 = check("flag", torch.float32, q, k, v, g, beta, s0, cu, chunk_indices=prepare_varlen(cu))
    o2, f2 = chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu, lower_bound=-5.0,
                       check_gates=False)
    assert torch.equal(o1, o2) and torch.equal(f1, f2)
    o3, f3 = chunk_kda(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu, lower_bound=-5.0)
    o4, f4 = chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    assert rel_rms(o4, o1) < 1e-5 and rel_rms(f4, f1) < 1e-5, (rel_rms(o4, o1), rel_rms(f4, f1))
    assert f3 is None and torch.equal(o3, o1)


# ----------------------------------------------------------------------------- fused-norm semantics
def _outputs(norms, q, k, v, g, beta):
    return {n: chunk_kda(q, k, v, g, beta, norm=n, output_final_state=True, lower_bound=-5.0) for n in norms}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zero_rows(dtype):
    """All-zero q rows give zero output rows; all-zero k rows act as no-op tokens; fused == explicit."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 2, 32, 16, dtype, seed=5)
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
    """Per-row scales 1e-3..1e3 on q and k leave fused outputs equal to the explicit route."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 2, 2, 32, 32, dtype, seed=6)
    gen = torch.Generator().manual_seed(7)
    sq = 10 ** (torch.rand(1, 70, 2, 1, generator=gen) * 6 - 3)
    sk = 10 ** (torch.rand(1, 70, 2, 1, generator=gen) * 6 - 3)
    qs, ks = (q.float() * sq).to(dtype), (k.float() * sk).to(dtype)
    outs = _outputs(("flag",) + FUSED, qs, ks, v, g, beta)
    o_ref, f_ref = outs["flag"]
    for norm in FUSED:
        o, fs = outs[norm]
        assert rel_rms(o, o_ref) < TOL[dtype], (norm, rel_rms(o, o_ref))
        assert rel_rms(fs, f_ref) < TOL[dtype], (norm, rel_rms(fs, f_ref))
    assert rel_rms(o_ref, reference(qs, ks, v, g, beta)[0]) < TOL[dtype]


def test_fp16_raw_q_gram_beyond_fp16_range():
    """fp16 q rows of norm ~1.7e5: their raw-q gram with k exceeds fp16's range, so fused routes keep it in fp32."""
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 1, 32, 16, torch.float32, seed=8)
    rows = [1, 30, 65]
    q[0, rows] = q[0, rows].sign() * 3e4
    k[0, rows] = q[0, rows].sign()  # q.k_normalized = |q| on the diagonal of the gram
    q, k, v = q.half(), k.half(), v.half()
    outs = _outputs(("flag",) + FUSED, q, k, v, g, beta)
    ro, _ = reference(q, k, v, g, beta)
    for norm, (o, fs) in outs.items():
        assert torch.isfinite(o).all(), norm
        assert rel_rms(o, ro) < TOL[torch.float16], (norm, rel_rms(o, ro))


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_huge_rows_finite():
    """fp32 rows of magnitude 1e30 (squares overflow fp32) stay finite and normalized on every route,
    and so does a k row of 1e7 after 15 tokens of the lowest gate in its chunk (alone there: under
    fused_qk its raw row times the e^75 gate factor overflows unless the chunk normalizes k on load)."""
    q, k, v, g, beta, _ = make_inputs(1, 100, 1, 1, 32, 16, torch.float32, seed=9)
    q[0, [2, 66]] *= 1e30
    k[0, [7, 40]] *= 1e30
    g[0, 64:80] = -5.0
    k[0, 79] *= 1e7
    outs = _outputs(("flag",) + FUSED, q, k, v, g, beta)
    ro, rf = reference(q, k, v, g, beta)
    for norm, (o, fs) in outs.items():
        assert torch.isfinite(o).all() and torch.isfinite(fs).all(), norm
        assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, norm


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
def test_fused_qk_fixup_past_the_first_flag_block(monkeypatch):
    """kda_intra's fix-up launch reads its flags FLAG_BLOCK at a time (1024; 4 here, so the interpreter
    sees several blocks): a k row of 1e7 after 15 tokens of the lowest gate, in the last chunk of the
    last head (program 5 of 6), is found in the second block and redone on rows normalized on load."""
    import triton.language as tl

    from gdnbench.kernels import common, intra, ops

    for mod in (common, intra):
        monkeypatch.setattr(mod, "FLAG_BLOCK", tl.constexpr(4))
    monkeypatch.setattr(ops, "FLAG_BLOCK", 4)
    q, k, v, g, beta, _ = make_inputs(1, 3 * 64, 2, 2, 16, 16, torch.float32, seed=5)
    g[0, 128:144, 1] = -5.0
    k[0, 143, 1] *= 1e7
    o, fs = chunk_kda(q, k, v, g, beta, norm="fused_qk", output_final_state=True, lower_bound=-5.0)
    ro, rf = reference(q, k, v, g, beta)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel_rms(o, ro) < 1e-4 and rel_rms(fs, rf) < 1e-4, (rel_rms(o, ro), rel_rms(fs, rf))


# ----------------------------------------------------------------------------- rejections
@pytest.mark.parametrize("norm", FUSED)
def test_fused_rejects_grad(norm):
    q, k, v, g, beta, _ = make_inputs(1, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="forward-only"):
        chunk_kda(q.requires_grad_(), k, v, g, beta, norm=norm)
    with pytest.raises(ValueError, match="forward-only"):
        chunk_kda(q.detach(), k, v, g.requires_grad_(), beta, norm=norm)


@pytest.mark.parametrize("norm", FUSED)
def test_fused_rejects_compile(norm, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q, k, v, g, beta, _ = make_inputs(1, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="torch.compile"):
        chunk_kda(q, k, v, g, beta, norm=norm)


@pytest.mark.parametrize("lower_bound", [-5.5, 0.0, 0.5])
def test_lower_bound_outside_the_contract(lower_bound):
    q, k, v, g, beta, _ = make_inputs(1, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match=r"lower_bound must be in \[-5, 0\)"):
        chunk_kda(q, k, v, g, beta, lower_bound=lower_bound)


def test_bad_arguments():
    q, k, v, g, beta, _ = make_inputs(1, 8, 2, 3, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="multiple of H"):
        chunk_kda(q, k, v, g, beta)
    q, k, v, g, beta, _ = make_inputs(1, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match=r"g must be \[B,T,HV,K\]"):
        chunk_kda(q, k, v, g[..., 0], beta)
    with pytest.raises(ValueError, match="norm"):
        chunk_kda(q, k, v, g, beta, norm="l2")


@pytest.mark.parametrize("K,V", [(16, 16), (32, 16), (32, 48), (96, 192), (128, 128), (256, 256), (60, 100),
                                 (100, 60), (24, 24)])
def test_validate_accepts_kda_defaults(K, V):
    for elt in (2, 4):
        validate(default_config(K, V, elt, "kda"), K, V, elt, "kda")
    assert default_config(128, 128, 2, "kda") == GDNConfig()


def test_validate_rejects_bad_kda_intra():
    with pytest.raises(ValueError, match="kda_intra.BK"):
        validate(GDNConfig(kda_intra=KernelConfig(BK=24)), 64, 64, family="kda")
    with pytest.raises(ValueError, match="family"):
        validate(GDNConfig(), 64, 64, family="gla")


# ----------------------------------------------------------------------------- through the CLI
def test_cli_run_on_cpu_passes_the_gate(tmp_path):
    """`gdnbench run` on a packed GVA KDA smoke shape: our routes pass the gate against the reference."""
    out = tmp_path / "kda.json"
    r = CliRunner().invoke(app, ["run", "--device", "cpu", "-s", "smoke", "--shape-id", "kda_packed_gva2",
                                 "-b", "gdnbench,reference", "-r", "explicit,fused_q,fused_qk", "--warmup", "0",
                                 "--rounds", "1", "--iters", "1", "--no-plot", "--out", str(out)],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rows = {(x["backend"], x["route"]): x for x in json.loads(out.read_text())["rows"]}
    for route in ("explicit", "fused_q", "fused_qk"):
        row = rows[("gdnbench", route)]
        assert row["status"] == "ok", row
        assert row["check"]["err_o"] <= row["check"]["budget_o"]
        assert "chunk_kda" in row["variant"]

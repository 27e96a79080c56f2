"""Mode decode on the CPU: decode shapes, seeded pools, the one-token reference and its gate, the
FLA and FlashInfer adapters against fakes (and FLA's real kernels under the Triton interpreter),
the byte model, the report and the CLI."""

import dataclasses
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before FLA's kernels are first imported (the real-kernel test)

from gdnbench.bench.modes import decode  # noqa: E402
from gdnbench.data import inputs, shapes
from gdnbench.data.records import RunDocument  # noqa: E402
from gdnbench.analysis import compare, report, roofline
from gdnbench.backends import fla as fla_mod  # noqa: E402
from gdnbench.backends import flashinfer as fi  # noqa: E402
from gdnbench.backends import get  # noqa: E402
from gdnbench.backends.reference import ReferenceBackend  # noqa: E402
from gdnbench.oracle.reference import decode_step, l2norm  # noqa: E402
from gdnbench.bench.runner import run_set  # noqa: E402
from gdnbench.bench.timing import TimingParams  # noqa: E402
from tests.test_cli import invoke  # noqa: E402

SMOKE = shapes.load("smoke-decode")
FAST = TimingParams(warmup=0, rounds=1, iters=2)

GOOD = """
name = "d"
version = 1
hash = ""
[defaults]
family = "gdn"
K = 16
V = 16
decode = true
lens = [1]
[[shape]]
id = "a"
H = 2
HV = 4
B = 3
pool = 5
state_dtype = "bfloat16"
seed = 1
"""


def write(tmp_path, text):
    p = tmp_path / "d.toml"
    p.write_text(text)
    return p


# ----------------------------------------------------------------------------- shapes
def test_decode_sets_content():
    for name, fam, H, HV in (("gdn-decode", "gdn", 16, 32), ("kda-decode", "kda", 32, 32)):
        ss = shapes.load(name)
        assert shapes.verify(ss, shapes.load_ledger()) == []
        got = {(s.B, s.state_dtype) for s in ss.shapes}
        assert got == {(n, d) for n in (1, 32, 256, 1024) for d in ("float32", "bfloat16")}
        for s in ss.shapes:
            assert s.decode and s.lens == (1,) and s.pool_size == 2 * s.B and s.tokens == s.n_seqs == s.B
            assert (s.family, s.H, s.HV, s.K, s.V, s.dtype) == (fam, H, HV, 128, 128, "bfloat16")
            assert s.shortened(1) is s  # one token per sequence: the oracle never shortens
            assert "decode" in s.label() and s.state_dtype in s.label()


def test_new_fields_parse_and_keep_old_hashes(tmp_path):
    s = shapes.load_file(write(tmp_path, GOOD)).shapes[0]
    assert (s.decode, s.pool, s.pool_size, s.state_dtype, s.n_seqs) == (True, 5, 5, "bfloat16", 3)
    assert shapes.load_file(write(tmp_path, GOOD.replace("pool = 5\n", ""))).shapes[0].pool_size == 3
    # a shape with the new fields at their defaults hashes as before they existed
    plain = shapes.load("smoke").shapes[0]
    assert plain.decode is False and plain.pool is None and plain.state_dtype == "float32"
    assert shapes.canonical_hash("smoke", 1, shapes.load("smoke").shapes) == shapes.load("smoke").hash
    assert shapes.canonical_hash("x", 1, (plain,)) != shapes.canonical_hash(
        "x", 1, (dataclasses.replace(plain, decode=True),))


@pytest.mark.parametrize("edit, field, words", [
    (('state_dtype = "bfloat16"', 'state_dtype = "fp8"'), "state_dtype", "is not one of"),
    (('state_dtype = "bfloat16"', "state_dtype = 16"), "state_dtype", "expected str"),
    (("decode = true", 'decode = "yes"'), "decode", "expected bool"),
    (("decode = true", "decode = false"), "pool", "only decode shapes"),
    (("decode = true\nlens = [1]", "lens = [1]"), "pool", "only decode shapes"),
    (("lens = [1]", "lens = [2]"), "lens", "one token per sequence"),
    (("lens = [1]", "lens = [1, 1]"), "lens", "one token per sequence"),
    (("pool = 5", "pool = 2"), "pool", "fewer than B=3"),
    (("pool = 5", "pool = 0"), "pool", "must be positive"),
    (("seed = 1", "seed = 1\ninitial_state = true"), "initial_state", "come from its pool"),
])
def test_bad_decode_fields_are_one_line(tmp_path, edit, field, words):
    p = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(shapes.ShapeError) as e:
        shapes.load_file(p)
    msg = str(e.value)
    assert str(p) in msg and "'a'" in msg and f"field {field!r}" in msg and words in msg and "\n" not in msg


def test_state_dtype_is_for_decode_shapes_only(tmp_path):
    text = GOOD.replace("decode = true\n", "").replace("pool = 5\n", "").replace("lens = [1]", "lens = [8]")
    with pytest.raises(shapes.ShapeError, match="field 'state_dtype': 'bfloat16': only decode shapes"):
        shapes.load_file(write(tmp_path, text))


# ----------------------------------------------------------------------------- inputs, reference
def test_decode_inputs_are_seeded_pools():
    s = SMOKE.get("kda_n3_bf16")  # N=3, pool 6, H=2, HV=4, K=V=16
    a, b = inputs.make_inputs(s), inputs.make_inputs(s)
    for name in ("q", "k", "v", "g", "beta", "state_pool", "state_indices", "cu_seqlens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.q.shape == (1, 3, 2, 16) and a.v.shape == (1, 3, 4, 16) and a.g.shape == (1, 3, 4, 16)
    assert a.beta.shape == (1, 3, 4) and a.initial_state is None
    assert a.state_pool.shape == (6, 4, 16, 16) and a.state_pool.dtype == torch.bfloat16
    assert a.state_indices.dtype == torch.int64 and len(set(a.state_indices.tolist())) == 3
    assert all(0 <= i < 6 for i in a.state_indices.tolist())
    assert a.cu_seqlens.dtype == torch.int64 and a.cu_seqlens.tolist() == [0, 1, 2, 3]
    fp32 = inputs.make_inputs(dataclasses.replace(s, state_dtype="float32"))
    assert fp32.state_pool.dtype == torch.float32 and torch.equal(fp32.state_pool.bfloat16(), a.state_pool)


def test_decode_step_matches_a_hand_written_recurrence():
    gen = torch.Generator().manual_seed(0)
    N, H, HV, K, V = 3, 1, 2, 4, 3
    q, k = (torch.randn(1, N, H, K, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, N, HV, V, generator=gen, dtype=torch.float64)
    g = -torch.rand(1, N, HV, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, N, HV, generator=gen, dtype=torch.float64)
    s0 = torch.randn(N, HV, K, V, generator=gen, dtype=torch.float64)
    o, s1 = decode_step(q, k, v, g, beta, s0, scale=0.5)
    assert o.shape == (1, N, HV, V) and s1.shape == (N, HV, K, V)
    for n in range(N):
        for h in range(HV):
            qn = q[0, n, h // 2] / math.sqrt((q[0, n, h // 2] ** 2).sum() + 1e-6)
            kn = k[0, n, h // 2] / math.sqrt((k[0, n, h // 2] ** 2).sum() + 1e-6)
            s = s0[n, h] * math.exp(g[0, n, h])
            s = s + torch.outer(kn, beta[0, n, h] * (v[0, n, h] - kn @ s))
            assert torch.allclose(s1[n, h], s) and torch.allclose(o[0, n, h], 0.5 * qn @ s)


# ----------------------------------------------------------------------------- the gate
@pytest.mark.parametrize("sid", [s.id for s in SMOKE.shapes])
def test_reference_decode_passes_and_steps_the_pool_in_place(sid):
    s = SMOKE.get(sid)
    inp = inputs.make_inputs(s)
    oracle = decode.build_oracle(s, inp, s)
    for route in ("explicit", "flag"):
        step = decode.prepare_step(ReferenceBackend(), s, route, inp)
        o, pool = step()
        v = decode.judge_step(oracle, (o, pool))
        assert v.passed, (route, v.reason)
        assert pool.dtype == inp.state_pool.dtype and pool.data_ptr() != inp.state_pool.data_ptr()
        assert not torch.equal(pool[inp.state_indices], inp.state_pool[inp.state_indices])
        assert not decode.judge_step(oracle, step()).passed  # a second step starts from the stepped pool
    if s.state_dtype == "bfloat16":  # the budget pays for rounding the states to the pool dtype
        assert oracle.fwd.lowp_err_state > 1e-4


class _Wrong(ReferenceBackend):
    def __init__(self, how):
        self.how = how

    def prepare_decode(self, shape, route, inputs):
        inner = super().prepare_decode(shape, route, inputs)

        def call():
            o, pool = inner()
            if self.how == "slot":
                others = [i for i in range(pool.shape[0]) if i not in inputs.state_indices.tolist()]
                pool[others[0]] += 1
            elif self.how == "dtype":
                pool = pool.double()
            elif self.how == "output":
                o = o * 1.1
            return o, pool
        return call


@pytest.mark.parametrize("how, words", [("slot", "outside the step's indices changed"),
                                        ("dtype", "state pool"), ("output", "output rel-RMS error")])
def test_gate_catches_wrong_decode_steps(how, words):
    s = SMOKE.get("gdn_n3_fp32")  # pool 5 > N 3
    inp = inputs.make_inputs(s)
    v = decode.judge_step(decode.build_oracle(s, inp, s), decode.prepare_step(_Wrong(how), s, "flag", inp)())
    assert not v.passed and words in v.reason


def test_run_set_decode_rows_and_skips():
    objs = [ReferenceBackend(), get("fla"), get("gdnbench"), get("flashinfer")]
    rows = run_set(SMOKE, [], ["explicit", "flag", "fused_qk", "megatron"], mode="decode", device="cpu",
                   check_tokens=64, params=FAST, shape_ids=["gdn_n4_bf16"], isolate=False, backend_objects=objs)
    by = {(r["backend"], r["route"]): r for r in rows}
    assert len(rows) == 4 * 4
    for route in ("explicit", "flag"):
        r = by[("reference", route)]
        assert r["status"] == "ok" and r["mode"] == "decode", r["reason"]
        assert r["step_bytes"] == roofline.bytes_floor(SMOKE.get("gdn_n4_bf16"), route)
        assert r["gbps"]["gpu"] is None and r["gbps"]["wall"] == pytest.approx(
            r["step_bytes"] / r["wall"]["median_us"] / 1e3)
        assert "pool[idx]" in r["variant"]
    assert "no decode step on route 'fused_qk'" in by[("reference", "fused_qk")]["reason"]
    assert "--mode fwd_bwd" in by[("reference", "megatron")]["reason"]
    assert "no decode kernel" in by[("gdnbench", "flag")]["reason"]
    assert by[("fla", "flag")]["status"] == by[("flashinfer", "flag")]["status"] == "skipped"
    # decode shapes and mode decode go together
    fwd = run_set(SMOKE, [], ["flag"], mode="fwd", device="cpu", check_tokens=64, params=FAST,
                  shape_ids=["gdn_n3_fp32"], isolate=False, backend_objects=[ReferenceBackend()])
    assert fwd[0]["status"] == "skipped" and "run it with --mode decode" in fwd[0]["reason"]
    plain = shapes.load("smoke").get("kda_fixed")
    assert "not a decode shape" in ReferenceBackend().supports(plain, "flag", "decode", "cpu").reason


# ----------------------------------------------------------------------------- FLA (fakes, real kernels)
def _fake_fla_gdn(calls, N):
    def fused_recurrent_gated_delta_rule(*args, **kw):
        calls.append((args, kw))
        assert len(args) == 4, "q, k, v, g positional; beta by keyword (the 5th positional is gk)"
        assert "beta" in kw and "gk" not in kw and kw["output_final_state"] is True
        cu = kw["cu_seqlens"]
        assert cu.dtype == torch.int64 and cu.tolist() == list(range(N + 1))
        q, k, v, g = args
        h0 = kw["initial_state"]
        assert h0.shape == (N, v.shape[2], q.shape[3], v.shape[3]) and h0.is_contiguous()
        o, s = decode_step(q, k, v, g, kw["beta"], h0, scale=kw["scale"], normalize=kw["use_qk_l2norm_in_kernel"])
        return o.to(v.dtype), s.float()  # FLA's final state is fp32 whatever the initial state's dtype
    return fused_recurrent_gated_delta_rule


def _fake_fla_kda(calls, N):
    def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                                output_final_state=False, inplace_final_state=True, cu_seqlens=None,
                                ssm_state_indices=None, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                lower_bound=None, **_):
        calls.append(dict(q=q, pool=initial_state, idx=ssm_state_indices, flag=use_qk_l2norm_in_kernel))
        assert inplace_final_state and not use_gate_in_kernel and A_log is None  # g is already the log decay
        assert g.dtype == torch.float32 and g.shape == (1, N, v.shape[2], q.shape[3])
        assert cu_seqlens.dtype == torch.int64 and cu_seqlens.tolist() == list(range(N + 1))
        assert ssm_state_indices.shape == (N,) and ssm_state_indices.dtype == torch.int64
        o, s = decode_step(q, k, v, g, beta, initial_state[ssm_state_indices], scale=scale,
                           normalize=use_qk_l2norm_in_kernel)
        initial_state[ssm_state_indices] = s.to(initial_state.dtype)
        return o.to(v.dtype), initial_state
    return fused_recurrent_kda_fwd


@pytest.mark.parametrize("sid", [s.id for s in SMOKE.shapes])
def test_fla_decode_argument_mapping(monkeypatch, sid):
    s = SMOKE.get(sid)
    calls = []
    fake = (_fake_fla_gdn if s.family == "gdn" else _fake_fla_kda)(calls, s.B)
    monkeypatch.setattr(fla_mod, "_decode_op", lambda family: fake)
    monkeypatch.setattr(fla_mod, "_l2norm_fn", lambda: l2norm)
    inp = inputs.make_inputs(s)
    oracle = decode.build_oracle(s, inp, s)
    for route in ("explicit", "flag"):
        o, pool = decode.prepare_step(fla_mod.FlaBackend(), s, route, inp)()
        v = decode.judge_step(oracle, (o, pool))
        assert v.passed, (route, v.reason)
        if s.family == "gdn":
            args, kw = calls[-1]
            assert kw["use_qk_l2norm_in_kernel"] is (route == "flag")
            assert torch.equal(kw["initial_state"], inp.state_pool[inp.state_indices])  # the gathered states
            q = args[0]
        else:
            c = calls[-1]
            assert c["flag"] is (route == "flag") and c["pool"] is pool and torch.equal(c["idx"], inp.state_indices)
            q = c["q"]
        assert torch.equal(q, inp.q if route == "flag" else l2norm(inp.q))
    b = fla_mod.FlaBackend()
    assert "in-kernel" in b.variant(s, "flag") and ("gathered" in b.variant(s, "flag")) == (s.family == "gdn")


@pytest.mark.parametrize("sid, state_dtype", [("gdn_n3_fp32", "float32"), ("gdn_n4_bf16", "bfloat16"),
                                              ("kda_n3_bf16", "float32")])
def test_fla_real_decode_kernels_under_the_interpreter(sid, state_dtype):
    """Route flag through FLA's own Triton kernels (TRITON_INTERPRET=1). Explicit's FLA l2norm is
    autotuned, which needs a GPU driver. KDA's kernel rounds its bf16 store toward zero under the
    interpreter (not on a GPU), which this tight CPU budget rejects: KDA runs an fp32 pool here."""
    pytest.importorskip("fla")
    s = dataclasses.replace(SMOKE.get(sid), state_dtype=state_dtype)
    inp = inputs.make_inputs(s)
    v = decode.judge_step(decode.build_oracle(s, inp, s), decode.prepare_step(fla_mod.FlaBackend(), s, "flag", inp)())
    assert v.passed, v.reason


def test_fla_decode_support():
    b = fla_mod.FlaBackend()
    gdn = shapes.load("gdn-decode").get("n32_bf16")
    assert b.supports(gdn, "flag", "decode", "cuda") and b.supports(gdn, "explicit", "decode", "cuda")
    assert "does not run on cpu" in b.supports(gdn, "flag", "decode", "cpu").reason
    assert not b.supports(gdn, "fused_qk", "decode", "cuda")
    assert "--mode decode" in b.supports(gdn, "flag", "fwd", "cuda").reason


# ----------------------------------------------------------------------------- FlashInfer (fake)
def _fake_fi_decode(calls):
    def gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,
                                             use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
                                             output_state_indices=None):
        calls.append(dict(q=q, a=a, b=b, pool=initial_state, flag=use_qk_l2norm))
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        assert T == 1 and state is None and initial_state is not None
        for t in (q, k, v, a, b):
            assert t.dtype in (torch.float16, torch.bfloat16)
        assert a.shape == b.shape == (B, 1, HV)
        assert A_log.dtype == torch.float32 and A_log.shape == dt_bias.shape == (HV,)
        assert initial_state.shape[1:] == (HV, V, K) and initial_state.stride(-1) == 1
        assert initial_state.dtype in (torch.float32, torch.bfloat16)
        assert initial_state_indices.shape == (B,) and initial_state_indices.dtype in (torch.int32, torch.int64)
        idx = initial_state_indices.long()
        g = -torch.exp(A_log.double()) * torch.nn.functional.softplus(a.double() + dt_bias.double())
        beta = torch.sigmoid(b.double())
        o, s = decode_step(q.view(1, B, H, K), k.view(1, B, H, K), v.view(1, B, HV, V), g.view(1, B, HV),
                           beta.view(1, B, HV), initial_state[idx].transpose(-1, -2), scale=scale,
                           normalize=use_qk_l2norm)
        initial_state[idx] = s.transpose(-1, -2).to(initial_state.dtype)  # in place, K-last
        return o.view(B, 1, HV, V).to(q.dtype), initial_state
    return gated_delta_rule_decode_pretranspose


@pytest.fixture
def fake_fi(monkeypatch):
    calls = []
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = []
    dec = types.ModuleType("flashinfer.gdn_decode")
    dec.gated_delta_rule_decode_pretranspose = _fake_fi_decode(calls)
    pkg.gdn_decode = dec
    monkeypatch.setitem(sys.modules, "flashinfer", pkg)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_decode", dec)
    monkeypatch.setattr(fi, "_capability", lambda: (9, 0))
    return calls


def test_flashinfer_decode_round_trips_through_raw_gates(fake_fi):
    s = SMOKE.get("gdn_n4_bf16")  # fp16 q/k/v, bf16 pool
    inp = inputs.make_inputs(s)
    kw = fi.to_flashinfer_decode(inp, s)
    assert kw["q"].shape == (4, 1, 2, 16) and kw["q"].data_ptr() == inp.q.data_ptr()  # a view
    assert kw["initial_state"].shape == (4, 4, 16, 16) and torch.equal(kw["initial_state"],
                                                                       inp.state_pool.transpose(-1, -2))
    g_back = -torch.nn.functional.softplus(kw["a"].double())
    assert (g_back - inp.g.double().view(4, 1, 4)).abs().max() < 2e-3  # fp16 rounding of the raw gate
    assert (torch.sigmoid(kw["b"].double()) - inp.beta.double().view(4, 1, 4)).abs().max() < 2e-3
    oracle = decode.build_oracle(s, inp, s)
    for route in ("explicit", "flag"):
        step = decode.prepare_step(fi.FlashinferBackend(), s, route, inp)
        o, pool = step()
        assert o.shape == (1, 4, 4, 16) and pool.shape == inp.state_pool.shape and pool.dtype == torch.bfloat16
        assert pool.data_ptr() == fake_fi[-1]["pool"].data_ptr()  # a view of FlashInfer's K-last pool
        v = decode.judge_step(oracle, (o, pool))
        assert v.passed, (route, v.reason)
        assert fake_fi[-1]["flag"] is (route == "flag")
        if route == "explicit":
            assert torch.equal(fake_fi[-1]["q"], l2norm(inp.q).view(4, 1, 2, 16))
        step()
        assert fake_fi[-1]["a"].data_ptr() == fake_fi[-2]["a"].data_ptr()  # converted once, in prepare


def test_flashinfer_decode_support_reasons(fake_fi, monkeypatch):
    b = fi.FlashinferBackend()
    gdn = shapes.load("gdn-decode").get("n256_bf16")
    assert b.supports(gdn, "flag", "decode", "cuda") and b.supports(gdn, "explicit", "decode", "cuda")
    assert "--mode decode" in b.supports(gdn, "flag", "fwd", "cuda").reason
    assert "GDN decode" in b.supports(shapes.load("kda-decode").get("n32_fp32"), "flag", "decode", "cuda").reason
    assert "fp16/bf16" in b.supports(dataclasses.replace(gdn, dtype="float32"), "flag", "decode", "cuda").reason
    assert "fp32 or bf16" in b.supports(dataclasses.replace(gdn, state_dtype="float16"), "flag", "decode",
                                        "cuda").reason
    assert "head size 128" in b.supports(SMOKE.get("gdn_n4_bf16"), "flag", "decode", "cuda").reason
    monkeypatch.setattr(fi, "_capability", lambda: (8, 0))
    assert "SM90+" in b.supports(gdn, "flag", "decode", "cuda").reason
    monkeypatch.setattr(fi, "_capability", lambda: (10, 0))
    assert b.supports(gdn, "flag", "decode", "cuda")

    def old(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None, use_qk_l2norm=False):
        raise AssertionError("not called")

    sys.modules["flashinfer.gdn_decode"].gated_delta_rule_decode_pretranspose = old
    assert "no state-pool arguments" in b.supports(gdn, "flag", "decode", "cuda").reason
    assert "pool mode" in b.variant(gdn, "flag")


# ----------------------------------------------------------------------------- bytes, report
def test_decode_bytes_by_hand():
    s = shapes.Shape(id="d", family="gdn", H=2, HV=4, K=8, V=16, lens=(1,), seed=0, gate="logsigmoid", B=3,
                     decode=True, pool=7, state_dtype="bfloat16")
    b = roofline.bytes_breakdown(s, "flag")
    assert b == {"q": 3 * 2 * 8 * 2, "k": 3 * 2 * 8 * 2, "v": 3 * 4 * 16 * 2, "g": 3 * 4 * 4, "beta": 3 * 4 * 2,
                 "o": 3 * 4 * 16 * 2, "state_read": 3 * 4 * 8 * 16 * 2, "state_write": 3 * 4 * 8 * 16 * 2,
                 "indices": 3 * 8, "l2norm_q": 2 * 3 * 2 * 8 * 2, "l2norm_k": 2 * 3 * 2 * 8 * 2}
    fp32 = dataclasses.replace(s, state_dtype="float32")
    assert roofline.bytes_floor(fp32, "flag") - roofline.bytes_floor(s, "flag") == 2 * 3 * 4 * 8 * 16 * 2
    kda = dataclasses.replace(s, family="kda", gate="bounded", lower_bound=-5.0)
    assert roofline.bytes_breakdown(kda, "flag")["g"] == 3 * 4 * 8 * 4
    assert roofline.flops_breakdown(s) == {"recurrent": 6 * 3 * 4 * 8 * 16}
    f = roofline.floor_us(s, "flag", roofline.H200_FIELD_NOTES)
    assert f.binding == "memory" and f.bytes == roofline.bytes_floor(s, "flag")
    big = shapes.load("gdn-decode").get("n1024_fp32")  # the states are nearly all of it
    bb = roofline.bytes_breakdown(big, "flag")
    assert (bb["state_read"] + bb["state_write"]) / sum(bb.values()) > 0.97


def _decode_doc():
    def row(shape, backend, route, gpu, gbps):
        return {"shape_id": shape, "family": "gdn", "backend": backend, "route": route, "mode": "decode",
                "status": "ok", "reason": "", "wall": {"median_us": 2 * gpu, "round_spread": 0.0},
                "gpu": {"median_us": gpu, "round_spread": 0.0, "method": "graph"}, "host_bound": True,
                "check": {"passed": True, "err_o": 1e-3, "budget_o": 1e-2, "err_state": 1e-3, "budget_state": 1e-2,
                          "tokens": 32, "shortened": False},
                "step_bytes": 134_000_000, "gbps": {"gpu": gbps, "wall": gbps / 2}}
    rows = [row("n32_fp32", "fla", "explicit", 50.0, 2680.0), row("n32_fp32", "fla", "flag", 40.0, 3350.0),
            {"shape_id": "n32_fp32", "family": "gdn", "backend": "flashinfer", "route": "flag", "mode": "decode",
             "status": "skipped", "reason": "flashinfer-python is not installed"}]
    return {"schema_version": 1, "created_utc": "x", "env": {"device": "cuda"},
            "shape_set": {"name": "gdn-decode", "version": 1, "hash": "sha256:x", "shapes": {"n32_fp32": ""}},
            "timing": {}, "run": {"mode": "decode"}, "rows": rows}


def test_report_renders_decode_rows(tmp_path):
    doc = RunDocument.from_dict(_decode_doc())
    tables = report.report_tables(doc)
    assert "one decode step" in tables[0].title
    dec = [t for t in tables if t.title.startswith("decode step")]
    assert len(dec) == 1 and dec[0].columns[4] == "GB/s gpu"
    assert dec[0].rows == [["n32_fp32", "fla:explicit", "134.00", "50.0", "2680", "100", "1340"],
                           ["n32_fp32", "fla:flag", "134.00", "40.0", "3350", "80.0", "1675"]]
    assert "fla:flag/fla:explicit" in report.to_markdown(tables)
    title, cols, rows, notes = roofline.roofline_table(doc, roofline.H200_FIELD_NOTES, "decode",
                                                        shape_set=shapes.load("gdn-decode"))
    assert [r[1] for r in rows] == ["fla:explicit", "fla:flag"] and rows[0][6] == "memory"
    assert any("the N states read and written" in n for n in notes)
    assert any("geomean B/A [gpu]: 1.000 over 2/2 rows" in n for n in compare.compare(doc, doc)[0].notes)
    p = tmp_path / "d.json"
    p.write_text(json.dumps(doc.to_dict()))
    r = invoke("plot", str(p), "--out", str(tmp_path / "d.png"))
    assert r.exit_code == 0 and (tmp_path / "d.png").exists()
    r = invoke("report", str(p))
    assert r.exit_code == 0 and "GB/s gpu" in r.output and "3350" in r.output
    r = invoke("report", str(p), "--mode", "fwd")
    assert r.exit_code == 0 and "GB/s" not in r.output


# ----------------------------------------------------------------------------- CLI, imports
def test_cli_run_decode_on_cpu(tmp_path):
    out = tmp_path / "dec.json"
    r = invoke("run", "--device", "cpu", "--mode", "decode", "-b", "reference", "--no-plot", "--out", str(out))
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["shape_set"]["name"] == "smoke-decode" and d["run"]["mode"] == "decode"
    assert d["run"]["routes"] == ["explicit", "flag"]
    assert [x["status"] for x in d["rows"]] == ["ok"] * 6
    assert all(x["mode"] == "decode" and x["step_bytes"] > 0 and x["gbps"]["wall"] > 0 for x in d["rows"])
    assert "decode step: time and achieved bandwidth" in r.output
    r = invoke("report", str(out), "--markdown", str(tmp_path / "r.md"))
    assert r.exit_code == 0 and "GB/s wall" in (tmp_path / "r.md").read_text()


def test_cli_decode_on_a_forward_set_gives_skipped_rows(tmp_path):
    """Every row skipped: the rows are written, and the exit code (4) says nothing was measured."""
    out = tmp_path / "x.json"
    r = invoke("run", "--device", "cpu", "--mode", "decode", "-s", "smoke", "--shape-id", "kda_fixed", "-b",
               "reference", "--no-plot", "--out", str(out))
    assert r.exit_code == 4 and "nothing measured" in r.output, r.output
    rows = json.loads(out.read_text())["rows"]
    assert {x["status"] for x in rows} == {"skipped"} and "not a decode shape" in rows[0]["reason"]


def test_light_modules_import_no_torch():
    code = ("import sys, gdnbench.cli.app, gdnbench.analysis.report, gdnbench.data.results, gdnbench.data.shapes, gdnbench.analysis.roofline; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

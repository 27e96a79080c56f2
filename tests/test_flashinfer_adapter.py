"""The FlashInfer adapter on the CPU: conversions round-trip through a fake flashinfer that follows
FlashInfer's documented conventions, and the support/availability reasons.

The fake `chunk_gated_delta_rule` takes packed [T,H,D] q/k, [T,HV,D] v, a LINEAR decay g and beta
(fp32 [T, max(H,HV)]), cu_seqlens, a state [N,HV,V,K] and its l2norm flag, and answers with
gdnbench.oracle.reference.recurrence after converting back; it refuses anything off-convention.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from gdnbench.data import shapes
from gdnbench.backends import get
from gdnbench.backends import flashinfer as fi
from gdnbench.oracle.check import build_oracle, judge, rel_rms
from gdnbench.data.inputs import make_inputs
from gdnbench.oracle.reference import l2norm, recurrence

SMOKE = {s.id: s for s in shapes.load("smoke").shapes}
GDN_QWEN = {s.id: s for s in shapes.load("gdn-qwen6").shapes}
KDA6 = {s.id: s for s in shapes.load("kda-legacy6").shapes}


class Calls:
    def __init__(self):
        self.gdn: list[dict] = []
        self.kda: list[dict] = []


def _fake_gdn(calls: Calls):
    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                               output=None, output_state=None, **_):
        calls.gdn.append(dict(q=q, k=k, v=v, g=g, beta=beta, h0=initial_state, cu=cu_seqlens,
                              flag=use_qk_l2norm_in_kernel))
        assert cu_seqlens is not None, "cu_seqlens is required for varlen mode"
        assert not cu_seqlens.is_floating_point() and cu_seqlens.dim() == 1
        assert q.dim() == k.dim() == v.dim() == 3 and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        T, H, K = q.shape
        HV, V = v.shape[1], v.shape[2]
        sab = max(H, HV)
        for t in (g, beta):
            assert t.dtype == torch.float32 and t.shape == (T, sab) and t.is_contiguous()
        assert bool((g > 0).all() and (g <= 1).all()), "g must be the linear decay in (0, 1]"
        cu = [int(x) for x in cu_seqlens.tolist()]
        N = len(cu) - 1
        h0 = None
        if initial_state is not None:
            assert initial_state.dtype == torch.float32 and initial_state.is_contiguous()
            assert initial_state.shape == (N, sab, V, K)
            h0 = initial_state.transpose(-1, -2)
        o, s = recurrence(q[None], k[None], v[None], torch.log(g)[None], beta[None], scale=scale,
                          initial_state=h0, cu_seqlens=cu, normalize=use_qk_l2norm_in_kernel,
                          dtype=torch.float64)
        o = o[0].to(q.dtype)
        state = s.float().transpose(-1, -2).contiguous()  # FlashInfer's [N, H, V, K]
        return (o, state) if output_final_state else o

    return chunk_gated_delta_rule


def _fake_kda(calls: Calls):
    def recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                      output_final_state=False, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=False,
                      lower_bound=None, cu_seqlens=None, beta_is_logit=False, **_):
        calls.kda.append(dict(g=g, h0=initial_state, flag=use_qk_l2norm_in_kernel))
        for t in (q, k, v, g, beta):
            assert t.dtype == torch.bfloat16
        assert use_gate_in_kernel and beta_is_logit and lower_bound < 0
        assert A_log.dtype == dt_bias.dtype == torch.float32
        B, T, H, K = q.shape
        gate = lower_bound * torch.sigmoid(torch.exp(A_log.double())[:, None] * (g.double() + dt_bias.double().view(H, K)))
        b = torch.sigmoid(beta.double())
        cu = None if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]
        h0 = None
        if initial_state is not None:
            assert initial_state.dtype == torch.bfloat16 and initial_state.shape[-2:] == (v.shape[-1], K)
            h0 = initial_state.transpose(-1, -2)
        o, s = recurrence(q, k, v, gate, b, scale=scale, initial_state=h0, cu_seqlens=cu,
                          normalize=use_qk_l2norm_in_kernel, dtype=torch.float64)
        state = s.to(torch.bfloat16).transpose(-1, -2).contiguous()
        if initial_state is not None:
            initial_state.copy_(state)  # updated in place, as FlashInfer documents
            state = initial_state
        return o.to(q.dtype), (state if output_final_state else None)

    return recurrent_kda


@pytest.fixture
def fake(monkeypatch):
    """A fake flashinfer in sys.modules, an sm90 device with CUDA 12.8 torch unless a test says otherwise."""
    calls = Calls()
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = []
    gdn = types.ModuleType("flashinfer.gdn_prefill")
    gdn.chunk_gated_delta_rule = _fake_gdn(calls)
    kda = types.ModuleType("flashinfer.kda")
    kda.recurrent_kda = _fake_kda(calls)
    pkg.gdn_prefill, pkg.kda = gdn, kda
    monkeypatch.setitem(sys.modules, "flashinfer", pkg)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", gdn)
    monkeypatch.setitem(sys.modules, "flashinfer.kda", kda)
    monkeypatch.setattr(fi, "_cuda_available", lambda: True)
    monkeypatch.setattr(fi, "_capability", lambda: (9, 0))
    monkeypatch.setattr(fi, "_torch_cuda_major", lambda: 12)
    return calls


def _reference(shape, inputs, route):
    q, k = (inputs.q, inputs.k) if route == "flag" else (l2norm(inputs.q), l2norm(inputs.k))
    o, s = recurrence(q, k, inputs.v, inputs.g, inputs.beta, scale=inputs.scale,
                      initial_state=inputs.initial_state, cu_seqlens=inputs.cu_seqlens_list,
                      normalize=route == "flag", dtype=torch.float64)
    return o, s


# ----------------------------------------------------------------------------- conversions
@pytest.mark.parametrize("sid", ["gdn_fixed_b2", "gdn_packed_gva3"])
def test_to_flashinfer_layouts(sid):
    shape = SMOKE[sid]
    inp = make_inputs(shape)
    kw = fi.to_flashinfer(inp, shape)
    T = shape.tokens
    assert kw["q"].shape == (T, shape.H, shape.K) and kw["v"].shape == (T, shape.HV, shape.V)
    assert kw["g"].dtype == kw["beta"].dtype == torch.float32 and kw["g"].shape == (T, shape.HV)
    assert torch.allclose(torch.log(kw["g"]), inp.g.reshape(T, shape.HV))
    assert kw["cu_seqlens"].dtype == torch.int64
    if shape.varlen:
        assert kw["cu_seqlens"].tolist() == inp.cu_seqlens_list
        assert kw["initial_state"].shape == (shape.n_seqs, shape.HV, shape.V, shape.K)
        assert torch.equal(kw["initial_state"], inp.initial_state.transpose(-1, -2))
    else:  # B x T fixed length -> packed with cu_seqlens [0, T, 2T]
        assert kw["cu_seqlens"].tolist() == [i * shape.lens[0] for i in range(shape.B + 1)]
        assert torch.equal(kw["q"][shape.lens[0]:], inp.q[1])
        assert kw["initial_state"] is None
    o = torch.randn(T, shape.HV, shape.V)
    s = torch.randn(shape.n_seqs, shape.HV, shape.V, shape.K)
    o2, s2 = fi.from_flashinfer(o, s, shape)
    assert o2.shape == (1 if shape.varlen else shape.B, T // (1 if shape.varlen else shape.B), shape.HV, shape.V)
    assert o2.data_ptr() == o.data_ptr() and s2.data_ptr() == s.data_ptr()  # views, no copies
    assert torch.equal(s2, s.transpose(-1, -2))


@pytest.mark.parametrize("route", ["explicit", "flag"])
@pytest.mark.parametrize("sid", ["gdn_fixed_b2", "gdn_packed_gva3"])
def test_prepared_call_round_trips_to_the_reference(fake, sid, route):
    shape = SMOKE[sid]
    inp = make_inputs(shape)
    b = fi.FlashinferBackend()
    call = b.prepare(shape, route, inp)
    o, s = call()
    o_ref, s_ref = _reference(shape, inp, route)
    assert o.shape == o_ref.shape and s.shape == s_ref.shape == (shape.n_seqs, shape.HV, shape.K, shape.V)
    tol = 1e-6 if shape.dtype == "float32" else 2e-3
    assert rel_rms(o, o_ref) < tol and rel_rms(s, s_ref) < 1e-6
    assert judge(build_oracle(shape, inp, shape), o, s).passed
    # the flag goes to FlashInfer only on route flag; explicit hands over normalized q/k
    assert fake.gdn[-1]["flag"] is (route == "flag")
    if route == "explicit":
        assert torch.equal(fake.gdn[-1]["q"], l2norm(inp.q).reshape(shape.tokens, shape.H, shape.K))
    # conversions happen once in prepare: a second call gets the very same tensors
    call()
    first, second = fake.gdn[-2], fake.gdn[-1]
    for key in ("v", "g", "beta", "cu") + (("q", "k") if route == "flag" else ()):
        assert first[key].data_ptr() == second[key].data_ptr(), key
    if shape.initial_state:
        assert first["h0"].data_ptr() == second["h0"].data_ptr()


def test_gva_is_native_not_expanded(fake):
    shape = SMOKE["gdn_packed_gva3"]  # H=1, HV=3
    fi.FlashinferBackend().prepare(shape, "flag", make_inputs(shape))()
    assert fake.gdn[-1]["q"].shape[1] == shape.H and fake.gdn[-1]["v"].shape[1] == shape.HV


def test_kda_round_trips_in_bf16(fake):
    shape = dataclasses.replace(SMOKE["kda_fixed"], dtype="bfloat16", initial_state=True)
    inp = make_inputs(shape)
    kw = fi.to_flashinfer_kda(inp, shape)
    # the inverted gate reproduces ours within bf16 rounding of the raw gate
    back = inp.lower_bound * torch.sigmoid(kw["g"].double())
    assert (back - inp.g.double()).abs().max() < 0.05
    call = fi.FlashinferBackend().prepare(shape, "flag", inp)
    o1, s1 = call()
    s1 = s1.clone()
    o2, s2 = call()  # starts again from the initial state though FlashInfer updates it in place
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    assert s2.shape == (shape.n_seqs, shape.HV, shape.K, shape.V)
    o_ref, s_ref = _reference(shape, inp, "flag")
    assert rel_rms(o2, o_ref) < 3e-2 and rel_rms(s2, s_ref) < 3e-2


def test_registry_gives_the_adapter():
    assert isinstance(get("flashinfer"), fi.FlashinferBackend)


# ----------------------------------------------------------------------------- reasons
def test_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", None)
    monkeypatch.setattr(fi, "dist_version", lambda name: None)
    sup = fi.FlashinferBackend().is_available()
    assert not sup and "flashinfer-python is not installed" in sup.reason and "\n" not in sup.reason


def test_broken_import_is_one_line(monkeypatch):
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = []
    monkeypatch.setitem(sys.modules, "flashinfer", pkg)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", types.ModuleType("flashinfer.gdn_prefill"))
    sup = fi.FlashinferBackend().is_available()
    assert not sup and sup.reason.startswith("import flashinfer.gdn_prefill failed: ImportError")
    assert "\n" not in sup.reason


def test_available_needs_cuda(fake, monkeypatch):
    assert fi.FlashinferBackend().is_available()
    monkeypatch.setattr(fi, "_cuda_available", lambda: False)
    sup = fi.FlashinferBackend().is_available()
    assert not sup and "no CUDA device" in sup.reason


def test_supports_reasons(fake, monkeypatch):
    b = fi.FlashinferBackend()
    gdn = GDN_QWEN["h16_hv32_fixed8k"]
    kda = KDA6["h96_fixed"]
    for route in ("explicit", "flag"):
        assert b.supports(gdn, route, "fwd", "cuda")
    assert "head size 128 only" in b.supports(dataclasses.replace(gdn, K=96), "flag", "fwd", "cuda").reason
    assert "head size 128 only" in b.supports(SMOKE["gdn_fixed_b2"], "flag", "fwd", "cuda").reason
    assert "does not run on cpu" in b.supports(gdn, "flag", "fwd", "cpu").reason
    assert not b.supports(gdn, "fused_qk", "fwd", "cuda")
    assert "not implemented" in b.supports(gdn, "flag", "bwd", "cuda").reason
    assert "fp16/bf16" in b.supports(dataclasses.replace(gdn, dtype="float32"), "flag", "fwd", "cuda").reason
    # KDA: Blackwell only
    sup = b.supports(kda, "flag", "fwd", "cuda")
    assert not sup and "Blackwell only" in sup.reason and "sm90" in sup.reason
    monkeypatch.setattr(fi, "_capability", lambda: (10, 0))
    assert b.supports(kda, "flag", "fwd", "cuda")
    assert "route 'flag' only" in b.supports(kda, "explicit", "fwd", "cuda").reason
    # GDN on Blackwell needs a CUDA 13 torch
    sup = b.supports(gdn, "flag", "fwd", "cuda")
    assert not sup and "CUDA >= 13" in sup.reason
    monkeypatch.setattr(fi, "_torch_cuda_major", lambda: 13)
    assert b.supports(gdn, "flag", "fwd", "cuda")
    monkeypatch.setattr(fi, "_capability", lambda: (12, 0))
    assert b.supports(gdn, "flag", "fwd", "cuda") and b.supports(kda, "flag", "fwd", "cuda")
    monkeypatch.setattr(fi, "_capability", lambda: (8, 0))
    sup = b.supports(gdn, "flag", "fwd", "cuda")
    assert not sup and "sm80" in sup.reason


def test_variant_says_what_runs(fake):
    b = fi.FlashinferBackend()
    gdn = GDN_QWEN["h16_hv32_fixed8k"]
    assert "caller l2norm" in b.variant(gdn, "explicit") and "native GVA" in b.variant(gdn, "flag")
    assert "use_qk_l2norm_in_kernel=True" in b.variant(gdn, "flag")
    assert "recurrent_kda" in b.variant(KDA6["h96_fixed"], "flag")


def test_variant_names_the_entry_point_the_first_call_ran(fake):
    """0.7.x picks its kernel per call: the traced first call names it, later calls run untraced."""
    gdn_mod = sys.modules["flashinfer.gdn_prefill"]
    inner = gdn_mod.chunk_gated_delta_rule
    hits = []

    def cp_delta_rule_dsl_sm90(*a, **kw):
        hits.append("cp")

    gdn_mod.cp_delta_rule_dsl_sm90 = cp_delta_rule_dsl_sm90
    gdn_mod.chunk_gated_delta_rule_sm90 = None  # an entry point that failed to import is skipped

    def routed(**kw):  # like flashinfer: looks its kernel up in the module's globals at call time
        gdn_mod.cp_delta_rule_dsl_sm90()
        return inner(**kw)

    gdn_mod.chunk_gated_delta_rule = routed
    b = fi.FlashinferBackend()
    shape = SMOKE["gdn_fixed_b2"]
    assert "not yet called" in b.variant(shape, "flag")
    call = b.prepare(shape, "flag", make_inputs(shape, "cpu"))
    call()
    assert b.variant(shape, "flag").endswith("ran cp_delta_rule_dsl_sm90")
    assert gdn_mod.cp_delta_rule_dsl_sm90 is cp_delta_rule_dsl_sm90  # restored after the traced call
    call()
    assert hits == ["cp", "cp"]

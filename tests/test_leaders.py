"""The leaders' adapters on the CPU: `flashqla` (a fake flash_qla following FlashQLA's documented
API, answering with the reference recurrence) and `fla-dispatch` (FLA's dispatch log read back),
their support reasons, and the runner keeping backends with different worker environments apart."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from gdnbench.bench import runner
from gdnbench.data import shapes
from gdnbench.backends import REGISTRY, get
from gdnbench.backends import fla_dispatch as fd
from gdnbench.backends import flashqla as fq
from gdnbench.oracle.check import build_oracle, judge
from gdnbench.data.inputs import make_inputs
from gdnbench.oracle.reference import l2norm, recurrence

SMOKE = {s.id: s for s in shapes.load("smoke").shapes}
GDN_QWEN = {s.id: s for s in shapes.load("gdn-qwen6").shapes}
KDA6 = {s.id: s for s in shapes.load("kda-legacy6").shapes}


class FakeContext:
    def __init__(self, cu, segments):
        self.is_intra = segments is not None
        self.intra_cp_cu_seqlens = None if segments is None else torch.zeros(segments + 1)


@pytest.fixture
def fake_qla(monkeypatch):
    """A fake flash_qla in sys.modules; an sm90 device; split a sequence only when it is one of >= 16384 tokens."""
    calls = []

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False,
                               state_v_first=False, auto_cp=True, **_):
        calls.append(dict(flag=use_qk_l2norm_in_kernel, auto_cp=auto_cp, cu=cu_seqlens, h0=initial_state))
        assert q.dtype == k.dtype == v.dtype and q.shape[-1] == v.shape[-1] == 128
        assert cu_seqlens is None or (cu_seqlens.dtype == torch.int64 and q.shape[0] == 1)
        cu = None if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]
        o, s = recurrence(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu,
                          normalize=use_qk_l2norm_in_kernel, dtype=torch.float64)
        return o.to(q.dtype), (s.float() if output_final_state else None)

    def auto_ctx(k, v, cu, chunk, auto_cp, is_train, force_intra_cp=False):
        lens = [k.shape[1]] if cu is None else [int(b - a) for a, b in zip(cu[:-1], cu[1:])]
        return FakeContext(cu, 4 * len(lens) if auto_cp and max(lens) >= 16384 else None)

    def l2norm_fwd(x):
        calls.append(dict(norm_rows=x.shape[0], dtype=x.dtype))
        rstd = x.float().pow(2).sum(-1, keepdim=True).add(1e-6).rsqrt()
        return (x * rstd).to(x.dtype), rstd

    def l2norm_bwd(y, rstd, dy):
        calls.append(dict(norm_bwd_rows=y.shape[0]))
        return dy

    pkg = types.ModuleType("flash_qla")
    pkg.chunk_gated_delta_rule = chunk_gated_delta_rule
    utils = types.ModuleType("flash_qla.utils")
    utils.l2norm_fwd, utils.l2norm_bwd = l2norm_fwd, l2norm_bwd
    chunk = types.ModuleType("flash_qla.ops.gated_delta_rule.chunk")
    chunk._auto_intra_cp_context = auto_ctx
    monkeypatch.setitem(sys.modules, "flash_qla", pkg)
    monkeypatch.setitem(sys.modules, "flash_qla.utils", utils)
    monkeypatch.setattr(fq, "PRIME_ROWS", 4096)  # FlashQLA's is 524288; the CPU needs no more to see it done
    monkeypatch.setattr(fq, "_primed", set())
    monkeypatch.setitem(sys.modules, "flash_qla.ops.gated_delta_rule.chunk", chunk)
    monkeypatch.setattr(fq, "dist_version", lambda name: "0.1.3")
    monkeypatch.setattr(fq, "fla_version", lambda: "0.6.0")
    monkeypatch.setattr(fq, "_capability", lambda: (9, 0))
    monkeypatch.setattr(fq.FlashQLABackend, "caller_l2norm", lambda self, x: l2norm(x))  # FLA's needs a GPU
    return calls


def _bf16_128(shape):
    """A smoke shape at FlashQLA's head size (128) and fp32 storage for the CPU gate."""
    return dataclasses.replace(shape, K=128, V=128, dtype="float16")


def test_flashqla_reasons(fake_qla, monkeypatch):
    b = get("flashqla")
    assert b.is_available()
    for s in GDN_QWEN.values():
        assert b.supports(s, "explicit", "fwd", "cuda") and b.supports(s, "megatron_flag", "fwd_bwd", "cuda")
    kda = next(iter(KDA6.values()))
    assert "no kda kernel" in b.supports(kda, "explicit", "fwd", "cuda").reason
    assert "GDN kernels only" in fq.leader_support(kda)
    s = next(iter(GDN_QWEN.values()))
    assert "K = V = 128" in b.supports(dataclasses.replace(s, K=64), "flag", "fwd", "cuda").reason
    assert "bf16 / fp16" in b.supports(dataclasses.replace(s, dtype="float32"), "flag", "fwd", "cuda").reason
    assert "no route 'fused_q'" in b.supports(s, "fused_q", "fwd", "cuda").reason
    monkeypatch.setattr(fq, "_capability", lambda: (8, 0))
    assert "sm80" in b.supports(s, "explicit", "fwd", "cuda").reason
    monkeypatch.setattr(fq, "_capability", lambda: (12, 0))
    assert b.supports(s, "explicit", "fwd", "cuda")
    assert "no backward on sm120" in b.supports(s, "explicit", "fwd_bwd", "cuda").reason
    monkeypatch.setattr(fq, "dist_version", lambda name: None)
    assert "not installed" in get("flashqla").is_available().reason


def test_flashqla_without_fla_skips_the_caller_norm_routes(fake_qla, monkeypatch):
    monkeypatch.setattr(fq, "fla_version", lambda: None)
    b, s = get("flashqla"), next(iter(GDN_QWEN.values()))
    for route, mode in (("explicit", "fwd"), ("megatron", "fwd_bwd")):
        assert "FLA is not installed" in b.supports(s, route, mode, "cuda").reason
    assert b.supports(s, "flag", "fwd", "cuda") and b.supports(s, "megatron_flag", "fwd_bwd", "cuda")


@pytest.mark.parametrize("sid", ["gdn_fixed_b2", "gdn_packed_gva3"])
@pytest.mark.parametrize("route", ["explicit", "flag"])
def test_flashqla_passes_the_gate_through_the_fake(fake_qla, sid, route):
    shape = _bf16_128(SMOKE[sid])
    inp = make_inputs(shape)
    o, s = get("flashqla").prepare(shape, route, inp)()
    call = fake_qla[-1]
    assert call["flag"] is (route == "flag") and call["auto_cp"] is True
    assert (call["cu"] is None) == (not shape.varlen)
    assert call["h0"] is inp.initial_state
    verdict = judge(build_oracle(shape, inp, shape), o, s)
    assert verdict.passed, verdict.reason


def test_flashqla_primes_its_norm_pass_once_before_the_flag_route(fake_qla):
    """The first flag call of a process runs FlashQLA's compiled l2norm on PRIME_ROWS rows first (Inductor keeps
    the launch config of its first call), once per dtype; explicit (q, k normalized by the caller) does not."""
    shape = _bf16_128(SMOKE["gdn_fixed_b2"])
    inp = make_inputs(shape)
    b = get("flashqla")
    b.prepare(shape, "explicit", inp)()
    assert not [c for c in fake_qla if "norm_rows" in c]
    b.prepare(shape, "flag", inp)()
    b.prepare(shape, "flag", inp)()
    primes = [c for c in fake_qla if "norm_rows" in c]
    assert primes == [dict(norm_rows=4096, dtype=inp.q.dtype)]
    assert not [c for c in fake_qla if "norm_bwd_rows" in c]  # no backward in a forward run
    # a training step's leaves require grad: the backward pass is primed too, once
    leaves = dataclasses.replace(inp, q=inp.q.detach().clone().requires_grad_())
    b.kernel(shape, leaves, True)
    b.kernel(shape, leaves, True)
    assert [c for c in fake_qla if "norm_bwd_rows" in c] == [dict(norm_bwd_rows=4096)]


def test_flashqla_records_the_cp_decision(fake_qla):
    long_one = next(s for s in GDN_QWEN.values() if max(s.lens) >= 16384)
    short = next(s for s in GDN_QWEN.values() if max(s.lens) < 16384)
    b = get("flashqla")
    assert fq.cp_decision(long_one, "cpu").startswith("intra-card CP taken (1 sequences split into 4 segments)")
    assert fq.cp_decision(short, "cpu") == "intra-card CP not taken"
    # on the CPU the decision's CUDA tensors fail: the variant says so instead of failing the row
    assert "CP decision unknown" in b.variant(short, "flag")


class FakeRegistry:
    def __init__(self, logged):
        self._logged = set(logged)


def test_fla_dispatch_reads_what_fla_chose(monkeypatch):
    regs = [FakeRegistry({"gated_delta_rule:chunk_gated_delta_rule:flash_qla", "kda:chunk_kda:flash_kda:fail"}),
            FakeRegistry({"common:prepare:intracard_cp"})]
    monkeypatch.setattr(fd, "_registries", lambda: regs)
    assert fd.dispatch_log() == ["common:prepare -> intracard_cp",
                                 "gated_delta_rule:chunk_gated_delta_rule -> flash_qla"]
    fd.clear_dispatch_log()
    assert fd.dispatch_log() == [] and all(not r._logged for r in regs)


def test_fla_dispatch_variant_before_and_after_the_first_call(monkeypatch):
    regs = [FakeRegistry(set())]
    monkeypatch.setattr(fd, "_registries", lambda: regs)
    monkeypatch.setattr(fd.FlaBackend, "version", lambda self: "0.6.0")
    b = get("fla-dispatch")
    s = next(iter(GDN_QWEN.values()))
    assert b.variant(s, "flag").endswith("not yet called")
    b._called.add(s.id)
    assert b.variant(s, "flag").endswith("no backend took the call (FLA Triton)")
    regs[0]._logged.add("gated_delta_rule:chunk_gated_delta_rule:flash_qla")
    assert b.variant(s, "flag").endswith("gated_delta_rule:chunk_gated_delta_rule -> flash_qla")


def test_fla_dispatch_refuses_a_pinned_process(monkeypatch):
    b = get("fla-dispatch")
    s = next(iter(GDN_QWEN.values()))
    monkeypatch.setitem(sys.modules, "fla.backends", types.SimpleNamespace(_DISPATCH_DISABLED=True))
    assert "dispatch disabled in this process" in b.supports(s, "explicit", "fwd", "cuda").reason
    monkeypatch.setitem(sys.modules, "fla.backends", types.SimpleNamespace(_DISPATCH_DISABLED=False))
    assert b.supports(s, "explicit", "fwd", "cuda")


def test_fla_dispatch_availability_names_the_targets(monkeypatch):
    versions = {"fla-core": "0.6.0", "flash-qla": "0.1.3", "tilelang": "0.1.15"}
    monkeypatch.setattr(fd, "dist_version", versions.get)
    monkeypatch.setattr(fd.FlaBackend, "version", lambda self: "0.6.0")
    a = get("fla-dispatch").is_available()
    assert a and a.reason == "dispatch targets installed: flash_qla 0.1.3, tilelang 0.1.15"
    monkeypatch.setattr(fd, "dist_version", {"fla-core": "0.6.0"}.get)
    assert "FLA runs its own Triton kernels" in get("fla-dispatch").is_available().reason


def test_backends_of_different_worker_environments_run_apart():
    groups = runner.env_groups(["gdnbench", "fla-dispatch", "fla", "flashqla"])
    assert groups == [({}, ["gdnbench", "fla", "flashqla"]),
                      ({"FLA_DISABLE_BACKEND_DISPATCH": "0"}, ["fla-dispatch"])]
    env = runner.worker_env("cuda", groups[1][0])
    assert env["FLA_DISABLE_BACKEND_DISPATCH"] == "0"
    assert runner.worker_env("cuda")["FLA_DISABLE_BACKEND_DISPATCH"] == "1"


def test_the_leaders_are_registered():
    assert {"flashqla", "fla-dispatch"} <= set(REGISTRY)

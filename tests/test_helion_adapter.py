"""The Helion backends' plumbing on the CPU, with fakes (runs whether or not helion is installed):
availability reasons, support reasons, the effort option and its cache paths, and the helion-linear
adapter against a fake examples/linear checkout that follows the engine's documented conventions
(head-first [B,H,T,D], natural-log g, GQA by repeating k/v, state [B,H,D,DV]; a newer KDA entry
point with cu_seqlens and use_qk_l2norm_in_kernel) and answers with gdnbench.oracle.reference.recurrence.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap

import pytest

from gdnbench.data import shapes
from gdnbench.backends import BackendOptions, get
from gdnbench.backends import helion as hb
from gdnbench.oracle.check import build_oracle, judge
from gdnbench.data.inputs import make_inputs
from gdnbench.oracle.reference import l2norm

SMOKE = {s.id: s for s in shapes.load("smoke").shapes}
GDN_QWEN = {s.id: s for s in shapes.load("gdn-qwen6").shapes}
KDA6 = {s.id: s for s in shapes.load("kda-legacy6").shapes}


@pytest.fixture
def helion_ok(monkeypatch):
    """helion 'importable' and a CUDA device, whatever this machine has."""
    monkeypatch.setattr(hb, "dist_version", lambda name: "1.4.0" if name == "helion" else None)
    monkeypatch.setattr(hb, "_import_helion", lambda: object())
    monkeypatch.setattr(hb, "_cuda_available", lambda: True)
    monkeypatch.setattr(hb, "_caller_l2norm", l2norm)  # the reference's l2norm: no Triton interpreter needed


# ----------------------------------------------------------------------------- availability
def test_not_installed(monkeypatch):
    monkeypatch.setattr(hb, "dist_version", lambda name: None)
    for name in ("helion", "helion-linear"):
        why = get(name).is_available()
        assert not why and "helion is not installed" in why.reason


def test_import_error_is_one_line(monkeypatch):
    monkeypatch.setattr(hb, "dist_version", lambda name: "1.5.1")

    def broken():
        raise ImportError("cannot import name 'IntelGPUError' from 'torch._inductor.exc'\n(second line)")

    monkeypatch.setattr(hb, "_import_helion", broken)
    for name in ("helion", "helion-linear"):
        why = get(name).is_available()
        assert not why and "\n" not in why.reason
        assert why.reason.startswith("helion 1.5.1 does not import with torch")
        assert "IntelGPUError" in why.reason and "1.4.0 works with torch 2.11" in why.reason


def test_other_import_errors_are_not_swallowed(monkeypatch):
    monkeypatch.setattr(hb, "dist_version", lambda name: "1.4.0")
    monkeypatch.setattr(hb, "_import_helion", lambda: (_ for _ in ()).throw(RuntimeError("bug")))
    with pytest.raises(RuntimeError):
        hb.helion_support()


def test_no_cuda(monkeypatch, helion_ok):
    monkeypatch.setattr(hb, "_cuda_available", lambda: False)
    monkeypatch.setitem(sys.modules, "gdnbench.kernels.helion", type(sys)("gdnbench.kernels.helion"))
    why = get("helion").is_available()
    assert not why and why.reason.startswith("no CUDA device")


# ----------------------------------------------------------------------------- support
def test_supports_reasons():
    b = get("helion")
    assert b.supports(GDN_QWEN["h16_hv32_fixed8k"], "fused_q", "fwd", "cuda")
    assert "has no route 'fused_qk'" in b.supports(GDN_QWEN["h16_hv32_fixed8k"], "fused_qk", "fwd", "cuda").reason
    assert "no backward" in b.supports(GDN_QWEN["h16_hv32_fixed8k"], "explicit", "fwd_bwd", "cuda").reason
    assert "does not run on cpu" in b.supports(GDN_QWEN["h16_hv32_fixed8k"], "flag", "fwd", "cpu").reason
    assert b.supports(KDA6["h96_mixed"], "fused_q", "fwd", "cuda")
    assert "[-5, 0)" in b.supports(dataclasses.replace(KDA6["h96_mixed"], lower_bound=-8.0), "flag", "fwd", "cuda").reason
    odd = dataclasses.replace(GDN_QWEN["h16_hv32_fixed8k"], K=100)
    assert "multiples of 16" in b.supports(odd, "flag", "fwd", "cuda").reason
    assert b.supports(dataclasses.replace(odd, K=96, V=192), "flag", "fwd", "cuda")


def test_variant_says_what_runs_in_helion():
    b = get("helion", BackendOptions(helion_effort="quick"))
    v = b.variant(GDN_QWEN["h16_hv32_fixed8k"], "fused_q")
    assert "Helion stages [gdn state recurrence, output with fused q-norm, l2norm]" in v
    assert "Triton stages [gate cumsum + gram + solve, w/u]" in v and "effort quick" in v
    assert "caller l2norm" in b.variant(GDN_QWEN["h16_hv32_fixed8k"], "explicit")
    assert "kda state recurrence" in b.variant(KDA6["h96_fixed"], "flag") and "kda_intra" in b.variant(KDA6["h96_fixed"],
                                                                                                     "flag")


# ----------------------------------------------------------------------------- effort and cache
def test_effort_is_a_backend_option():
    assert hb.HelionBackend().effort == "none"
    assert get("helion", BackendOptions(helion_effort="FULL")).effort == "full"
    with pytest.raises(ValueError, match="none, quick, full"):
        hb.HelionBackend(effort="max")
    assert get("helion-linear", BackendOptions(helion_examples="/x")).examples_dir == "/x"


def test_cli_effort_option(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from gdnbench.cli.app import app

    monkeypatch.delenv(hb.EXAMPLES_ENV, raising=False)
    r = CliRunner().invoke(app, ["run", "--device", "cpu", "--helion-effort", "max", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "--helion-effort 'max'" in r.output
    seen = []
    monkeypatch.setattr("gdnbench.cli.app._run", lambda *a: seen.append(a[-1]))
    r = CliRunner().invoke(app, ["run", "--helion-effort", "quick", "--helion-examples", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert seen == [BackendOptions("quick", str(tmp_path.resolve()))]
    assert hb.EXAMPLES_ENV not in os.environ and "GDNBENCH_HELION_EFFORT" not in os.environ  # passed, not set


class FakeConfig(dict):
    def save(self, path):
        with open(path, "w") as fh:
            json.dump(self, fh)

    @classmethod
    def load(cls, path):
        with open(path) as fh:
            return cls(json.load(fh))


def test_cache_keys_paths_and_labels(monkeypatch, tmp_path):
    monkeypatch.setattr(hb, "_import_helion", lambda: type("H", (), {"Config": FakeConfig}))
    monkeypatch.setattr(hb, "_device_identity", lambda: {"gpu": "NVIDIA H200", "compute_capability": "9.0"})
    shape = GDN_QWEN["h16_hv32_fixed8k"]
    assert hb.HelionBackend(cache_dir=tmp_path).config_label(shape, "flag", "cuda").startswith("default")
    b = hb.HelionBackend(cache_dir=tmp_path, effort="quick")
    assert b.config_label(shape, "flag", "cuda") == "tuned now (effort quick): l2norm, state, output"

    ident = hb._device_identity()
    key = hb.cache_key(ident, "state", "plain", shape, "quick")
    assert {"gpu", "compute_capability", "helion", "torch", "triton", "source_hash", "shape_key", "effort"} <= set(key)
    assert key["source_hash"].startswith("sha256:") and key["shape_key"].startswith("gdn_K128_V128_H16_HV32")
    path = hb.save_config(tmp_path, key, FakeConfig(block_sizes=[32]))
    assert path.parent == tmp_path / "nvidia-h200" / "helion" and path.name.startswith("state-plain-gdn_K128")
    assert hb.load_config(tmp_path, key) == {"block_sizes": [32]}
    other = dict(key, helion="1.5.1")  # another helion version: another entry
    assert hb.load_config(tmp_path, other) is None
    assert b.config_label(shape, "flag", "cuda") == "tuned now (effort quick): l2norm, output; cached: state"
    for kernel in ("l2norm", "output"):  # a full-effort entry serves a quick request
        hb.save_config(tmp_path, hb.cache_key(ident, kernel, "plain", shape, "full"), FakeConfig(block_sizes=[8]))
    assert b.config_label(shape, "flag", "cuda") == "tuned (cached, effort quick): l2norm, state, output"
    assert b._plan(shape, "flag")[0] == "cached"
    assert b.config_label(shape, "fused_q", "cuda").startswith("tuned now")  # output's fused_q variant: not cached
    assert b.config_label(KDA6["h96_fixed"], "explicit", "cuda") == "tuned now (effort quick): state_kda, output_kda"
    path.with_name(path.name).write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable tuned Helion config"):
        assert hb.load_config(tmp_path, key) is None


# ----------------------------------------------------------------------------- helion-linear
ENGINE = '''
"""A fake Helion examples/linear engine: the documented entry points, answered by the fp64 recurrence."""
import torch
from gdnbench.oracle.reference import recurrence

CALLS = []


def _check_head_first(q, k, v, g, beta, initial_state):
    B, H, T, D = q.shape
    assert k.shape == (B, H, T, D) and v.shape[:3] == (B, H, T) and beta.shape == (B, H, T)
    assert g.dtype == torch.float32 and g.shape[:3] == (B, H, T)
    for t in (q, k, v, g, beta):
        assert t.is_contiguous()
    if initial_state is not None:
        assert initial_state.shape == (B, H, D, v.shape[-1]) and initial_state.dtype == torch.float32


def _run(q, k, v, g, beta, scale, initial_state, normalize=False):
    tok = lambda x: x.transpose(1, 2)  # noqa: E731
    o, s = recurrence(tok(q), tok(k), tok(v), tok(g), tok(beta), scale=scale, initial_state=initial_state,
                      normalize=normalize)
    return o.transpose(1, 2).to(q.dtype), s.float()


def helion_chunk_gated_delta_rule(q, k, v, g=None, beta=None, *, C=64, scale=1.0, initial_state=None,
                                  return_final_state=False):
    CALLS.append(("gdn", tuple(q.shape)))
    assert g.dim() == 3
    _check_head_first(q, k, v, g, beta, initial_state)
    o, s = _run(q, k, v, g, beta, scale, initial_state)
    return (o, s) if return_final_state else o


def helion_chunk_kda(q, k, v, g=None, beta=None, *, C=64, scale=1.0, initial_state=None, return_final_state=False
                     KDA_EXTRA):
    assert g.dim() == 4
    cu = locals().get("cu_seqlens")
    flag = locals().get("use_qk_l2norm_in_kernel", False)
    CALLS.append(("kda", tuple(q.shape), cu is not None, flag))
    if cu is not None:  # token-major [1, T, H, D]
        o, s = recurrence(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu.tolist(),
                          normalize=flag)
        return o.to(q.dtype), s.float()
    _check_head_first(q, k, v, g, beta, initial_state)
    o, s = _run(q, k, v, g, beta, scale, initial_state, normalize=flag)
    return (o, s) if return_final_state else o
'''


def _checkout(root, newer: bool, pretuned: bool = False):
    lin = root / "examples" / "linear"
    lin.mkdir(parents=True)
    (root / "examples" / "__init__.py").write_text("")
    (lin / "__init__.py").write_text("")
    extra = ", cu_seqlens=None, use_qk_l2norm_in_kernel=False" if newer else ""
    (lin / "linear_attention_engine.py").write_text(textwrap.dedent(ENGINE).replace("\n                     KDA_EXTRA",
                                                                                      extra))
    if pretuned:
        (lin / "_helion_aot_linear_attention_engine_cuda_sm90.py").write_text("")
    return root


@pytest.fixture
def engine_env(monkeypatch, helion_ok):
    """A clean module table and environment around each fake checkout."""
    for name in ("HELION_AUTOTUNE_CACHE", "HELION_AOT_DATA_DIR", hb.EXAMPLES_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    yield
    for name in ("examples.linear.linear_attention_engine", "examples.linear", "examples"):
        sys.modules.pop(name, None)


def test_linear_availability_reasons(tmp_path, engine_env, monkeypatch):
    b = hb.HelionLinearBackend()
    assert "no Helion checkout given (--helion-examples DIR or GDNBENCH_HELION_EXAMPLES" in b.is_available().reason
    monkeypatch.setenv(hb.EXAMPLES_ENV, str(tmp_path / "nowhere"))
    assert "no examples/linear/linear_attention_engine.py there" in b.is_available().reason
    root = _checkout(tmp_path / "broken", newer=True)
    (root / "examples" / "linear" / "linear_attention_engine.py").write_text("import helion_missing_dep\n")
    monkeypatch.setenv(hb.EXAMPLES_ENV, str(root))
    why = b.is_available()
    assert not why and why.reason.startswith("import of Helion's examples/linear failed: ModuleNotFoundError")
    assert "\n" not in why.reason


def test_linear_loads_from_root_or_examples_dir(tmp_path, engine_env, monkeypatch):
    root = _checkout(tmp_path / "helion", newer=False, pretuned=True)
    for given in (root, root / "examples" / "linear"):
        b = hb.HelionLinearBackend(str(given))
        assert b.is_available(), b.is_available().reason
    import os

    assert os.environ["HELION_AUTOTUNE_CACHE"] == "AOTAutotuneCache"  # the pretuned configs' cache
    assert "gdnbench-helion-aot" in os.environ["HELION_AOT_DATA_DIR"]
    v = b.variant(KDA6["h96_fixed"], "explicit")
    assert "_helion_aot_linear_attention_engine_cuda_sm90.py" in v and "caller l2norm" in v


def test_linear_support(tmp_path, engine_env):
    old = hb.HelionLinearBackend(str(_checkout(tmp_path / "old", newer=False)))
    assert "has no l2norm flag" in old.supports(GDN_QWEN["h16_hv32_fixed8k"], "flag", "fwd", "cuda").reason
    assert old.supports(GDN_QWEN["h16_hv48_uniform"], "explicit", "fwd", "cuda")  # equal lengths: dense batch
    assert "mixed sequence lengths" in old.supports(GDN_QWEN["h4_hv8_mixed"], "explicit", "fwd", "cuda").reason
    assert "mixed sequence lengths" in old.supports(KDA6["h96_mixed"], "explicit", "fwd", "cuda").reason
    assert "this checkout's helion_chunk_kda has no l2norm flag" in old.supports(KDA6["h96_fixed"], "flag", "fwd",
                                                                                 "cuda").reason
    for name in ("examples.linear.linear_attention_engine", "examples.linear", "examples"):
        sys.modules.pop(name, None)
    new = hb.HelionLinearBackend(str(_checkout(tmp_path / "new", newer=True)))
    for sid in KDA6:
        for route in ("explicit", "flag"):
            assert new.supports(KDA6[sid], route, "fwd", "cuda"), (sid, route)
    assert "mixed sequence lengths: its GDN path" in new.supports(GDN_QWEN["h4_hv8_mixed"], "explicit", "fwd",
                                                                  "cuda").reason
    assert "mode fwd_bwd unsupported" in new.supports(KDA6["h96_fixed"], "explicit", "fwd_bwd", "cuda").reason


GVA_UNIFORM = dataclasses.replace(SMOKE["gdn_packed_gva3"], lens=(40, 40, 40), dtype="float32")
KDA_MIXED = dataclasses.replace(SMOKE["kda_packed_gva2"], H=4, HV=4)


@pytest.mark.parametrize("newer", [False, True])
@pytest.mark.parametrize("shape,route", [
    (SMOKE["gdn_fixed_b2"], "explicit"), (GVA_UNIFORM, "explicit"), (SMOKE["kda_fixed"], "explicit"),
    (SMOKE["kda_fixed"], "flag"), (KDA_MIXED, "flag"), (KDA_MIXED, "explicit"),
], ids=["gdn_fixed_b2", "gdn_uniform_gva3", "kda_fixed", "kda_fixed_flag", "kda_mixed_flag", "kda_mixed"])
def test_linear_conversions_pass_the_gate(tmp_path, engine_env, newer, shape, route):
    b = hb.HelionLinearBackend(str(_checkout(tmp_path / "h", newer=newer)))
    sup = b.supports(shape, route, "fwd", "cuda")
    if not newer and (route == "flag" or shape is KDA_MIXED):
        assert not sup
        return
    assert sup, sup.reason
    inp = make_inputs(shape)
    o, s = b.prepare(shape, route, inp)()
    verdict = judge(build_oracle(shape, inp, shape), o, s)
    assert verdict.passed, verdict.reason
    calls = sys.modules["examples.linear.linear_attention_engine"].CALLS
    if shape is KDA_MIXED:
        assert calls[-1][2] is True and calls[-1][1] == (1, shape.tokens, shape.HV, shape.K)  # token-major, cu_seqlens
    elif shape is GVA_UNIFORM:
        assert calls[-1] == ("gdn", (3, shape.HV, 40, shape.K))  # q/k repeated to HV heads, sequences as a batch
    if route == "flag":
        assert calls[-1][3] is True

"""FLA's KDA entry point on the CPU (a fake fla.ops.kda): `fla` calls chunk_kda as FLA ships it, without
the safe gate, for any gates; `fla-safe-gate` passes safe_gate and the shape's lower_bound, and runs
only KDA prefill."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from gdnbench.backends import REGISTRY, get
from gdnbench.backends import fla as fla_mod
from gdnbench.data import shapes
from gdnbench.data.inputs import make_inputs

KDA = shapes.load("kda-legacy6").get("h64_fixed")
GDN = shapes.load("gdn-qwen6").get("h16_hv32_fixed8k")


@pytest.fixture
def fake_kda(monkeypatch):
    """fla.ops.kda.chunk_kda recording its keyword arguments."""
    calls = []

    def chunk_kda(q, k, v, g, beta, **kw):
        calls.append(kw)
        return q, None

    mods = {name: types.ModuleType(name) for name in ("fla", "fla.ops", "fla.ops.kda")}
    mods["fla.ops.kda"].chunk_kda = chunk_kda
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def _small(shape):
    return dataclasses.replace(shape, H=1, HV=1, lens=[16])


@pytest.mark.parametrize("name, safe", [("fla", False), ("fla-safe-gate", True)])
def test_chunk_kda_arguments(fake_kda, name, safe):
    s = _small(KDA)
    get(name).prepare(s, "flag", make_inputs(s, "cpu"))()
    kw = fake_kda[-1]
    assert kw["use_qk_l2norm_in_kernel"] is True
    if safe:
        assert kw["safe_gate"] is True and kw["lower_bound"] == KDA.lower_bound
    else:
        assert "safe_gate" not in kw and "lower_bound" not in kw
    assert ("safe_gate" in get(name).variant(s, "flag")) is safe


def test_support():
    plain, safe = get("fla"), get("fla-safe-gate")
    unbounded = dataclasses.replace(KDA, lower_bound=None)
    assert plain.supports(unbounded, "flag", "fwd", "cuda")
    assert "needs a lower_bound" in safe.supports(unbounded, "flag", "fwd", "cuda").reason
    assert safe.supports(KDA, "flag", "fwd", "cuda") and safe.supports(KDA, "explicit", "fwd", "cuda")
    assert "GDN runs on `fla`" in safe.supports(GDN, "flag", "fwd", "cuda").reason
    assert "decode" in safe.supports(shapes.load("kda-decode").shapes[0], "flag", "decode", "cuda").reason
    assert isinstance(get("fla-safe-gate"), fla_mod.FlaSafeGateBackend) and "fla-safe-gate" in REGISTRY

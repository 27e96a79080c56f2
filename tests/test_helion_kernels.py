"""Our Helion GDN kernels (gdnbench/kernels/helion.py) on the CPU against the fp64 recurrence.

Skipped when helion does not import. Two ways to run a Helion kernel without a GPU, both tested:

- eager: Helion's ref mode (what HELION_INTERPRET=1 selects; Helion refuses that variable together
  with TRITON_INTERPRET=1, which our Triton stages need here, so the tests switch it on per kernel
  with helion_gdn.set_eager). The kernel bodies run as PyTorch. Shim: hl.dot's eager form calls
  torch.mm(out_dtype=...), which torch has only for CUDA; the test maps it to an fp32 mm.
- compiled: the Triton code Helion generates, run by Triton's interpreter (TRITON_INTERPRET=1).
  Shim: the interpreter runs tl.math but not the libdevice calls Helion emits for exp2 / rsqrt;
  the test points those at tl.math.

fp32 storage only (bf16 dots are unreliable under the interpreter). Shapes: T not a multiple of 64,
packed sequences with initial states, GVA ratio 2, K != V; zero rows; huge rows (|q| ~ 1e30).
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import dataclasses  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("helion", reason="helion is not installed")

from gdnbench.kernels import helion as hg  # noqa: E402
from gdnbench.data import shapes  # noqa: E402
from gdnbench.backends import helion as hb  # noqa: E402
from gdnbench.oracle.check import build_oracle, judge  # noqa: E402
from gdnbench.data.inputs import make_inputs  # noqa: E402
from gdnbench.oracle.reference import recurrence  # noqa: E402

TOL = 1e-4  # fp32 relative RMS error against fp64
SMOKE = {s.id: s for s in shapes.load("smoke").shapes}


@pytest.fixture
def cpu_shims(monkeypatch):
    """The two CPU stand-ins described in the module docstring."""
    import triton.language as tl
    from triton.language.extra import libdevice

    for name in ("exp", "exp2", "rsqrt", "sqrt", "log", "log2"):
        monkeypatch.setattr(libdevice, name, lambda *a, _n=name, **k: getattr(tl.math, _n)(*a, **k), raising=False)
    mm, bmm = torch.mm, torch.bmm

    def with_out_dtype(fn):
        def call(a, b, *args, out_dtype=None, **kw):
            if out_dtype is None:
                return fn(a, b, *args, **kw)
            return fn(a.to(out_dtype), b.to(out_dtype), *args, **kw)
        return call

    monkeypatch.setattr(torch, "mm", with_out_dtype(mm))
    monkeypatch.setattr(torch, "bmm", with_out_dtype(bmm))


@pytest.fixture(params=["eager", "compiled"])
def mode(request, cpu_shims):
    hg.set_eager(request.param == "eager")
    yield request.param
    hg.set_eager(False)


def _inputs(B, lens, H, HV, K, V, h0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens) if B == 1 and len(lens) > 1 else lens[0]

    def rn(*s):
        return torch.randn(*s, generator=gen)

    q, k, v = rn(B, T, H, K), rn(B, T, H, K), rn(B, T, HV, V)
    g = torch.nn.functional.logsigmoid(rn(B, T, HV))
    beta = torch.sigmoid(rn(B, T, HV))
    cu = None
    if len(lens) > 1:
        cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int64)
    n = len(lens) if cu is not None else B
    state = 0.25 * rn(n, HV, K, V) if h0 else None
    return q, k, v, g, beta, cu, state


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


CASES = {
    # packed, initial states, GVA 2, K != V, lengths not multiples of 64 (one shorter than a chunk)
    "packed_gva2": dict(B=1, lens=(37, 100, 5), H=2, HV=4, K=32, V=64, h0=True),
    # fixed length B=2, T=70, no initial state, K > V
    "fixed_b2": dict(B=2, lens=(70,), H=1, HV=2, K=32, V=16, h0=False),
    # head sizes that are not powers of two (Jet-Nemotron / OLMo-Hybrid style K96, V192, scaled down)
    "odd_heads": dict(B=1, lens=(20, 75), H=1, HV=3, K=48, V=80, h0=True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "caller"])
def test_forward_matches_fp64(mode, case, norm):
    c = CASES[case]
    q, k, v, g, beta, cu, h0 = _inputs(**c)
    from gdnbench.oracle.reference import l2norm

    kw = dict(scale=c["K"] ** -0.5, initial_state=h0, cu_seqlens=cu)
    if norm == "none":
        o, s = hg.chunk_gdn(l2norm(q), l2norm(k), v, g, beta, **kw)
    elif norm == "caller":
        o, s = hg.chunk_gdn(q, k, v, g, beta, caller_norm=l2norm, **kw)
    else:
        o, s = hg.chunk_gdn(q, k, v, g, beta, norm=norm, **kw)
    o64, s64 = recurrence(q, k, v, g, beta, scale=kw["scale"], initial_state=h0,
                          cu_seqlens=None if cu is None else cu.tolist())
    assert o.shape == o64.shape and s.shape == s64.shape and s.dtype == torch.float32
    assert _rel(o, o64) < TOL and _rel(s, s64) < TOL


def test_zero_rows(mode):
    q, k, v, g, beta, cu, h0 = _inputs(**CASES["packed_gva2"])
    q[0, 3] = 0
    k[0, 5] = 0
    q[0, 40:50] = 0  # a run of zero rows inside the second sequence
    kw = dict(scale=32 ** -0.5, initial_state=h0, cu_seqlens=cu)
    o64, s64 = recurrence(q, k, v, g, beta, scale=kw["scale"], initial_state=h0, cu_seqlens=cu.tolist())
    for norm in ("flag", "fused_q"):
        o, s = hg.chunk_gdn(q, k, v, g, beta, norm=norm, **kw)
        assert torch.isfinite(o).all() and torch.isfinite(s).all()
        assert _rel(o, o64) < TOL and _rel(s, s64) < TOL
        assert o[0, 3].abs().max() == 0 and o[0, 40:50].abs().max() == 0  # a zero q row reads nothing


def test_huge_rows_fused_q(mode):
    """|q| ~ 1e30: sum of squares overflows fp32; the output kernel's pre-scaled sums keep the row
    normalized (finite, and equal to the fp64 answer, which normalizes in fp64)."""
    q, k, v, g, beta, cu, h0 = _inputs(**CASES["packed_gva2"])
    q[0, 7] *= 1e30
    q[0, 60] *= 1e25
    kw = dict(scale=32 ** -0.5, initial_state=h0, cu_seqlens=cu)
    o64, s64 = recurrence(q.double(), k, v, g, beta, scale=kw["scale"], initial_state=h0, cu_seqlens=cu.tolist())
    for norm in ("fused_q", "flag"):
        o, s = hg.chunk_gdn(q, k, v, g, beta, norm=norm, **kw)
        assert torch.isfinite(o).all(), norm
        assert _rel(o, o64) < TOL and _rel(s, s64) < TOL


def test_l2norm_kernel(mode):
    x = torch.randn(70, 32)
    x[3] = 0
    x[9] *= 1e30
    y = hg.l2norm(x)
    xd = x.double()
    ref = xd / torch.sqrt((xd * xd).sum(-1, keepdim=True) + 1e-6)
    assert torch.isfinite(y).all() and y[3].abs().max() == 0
    assert (y.double() - ref).abs().max().item() < 1e-6


def test_runner_configs(cpu_shims, monkeypatch):
    """'default' sets Helion's default config; 'cached' the given one; a kernel configured before (another
    route on the same arguments) is kept and recorded; 'tune' calls Helion's autotuner once and reports."""
    import helion

    x = torch.randn(40, 16)
    default = hg.StageRunner("default")
    b = default.bound("l2norm", (x,), x.dtype)
    assert b._config is not None and b._config == b.config_spec.default_config() and default.configs == {}
    other = torch.randn(24, 16)  # another specialization: a fresh bound kernel
    cfg = helion.Config(block_sizes=[8])
    cached = hg.StageRunner("cached", configs={"l2norm": cfg})
    b2 = cached.bound("l2norm", (other,), other.dtype)
    assert b2._config["block_sizes"] == [8]
    assert torch.allclose(b2(other), torch.nn.functional.normalize(other, dim=-1), atol=1e-5)
    again = hg.StageRunner("cached", configs={})
    assert again.bound("l2norm", (other,), other.dtype) is b2 and again.configs["l2norm"]["block_sizes"] == [8]

    seen = []

    class FakeBound:
        _config = None

        def autotune(self, args, force):
            seen.append(("autotune", force))
            self._config = helion.Config(block_sizes=[4])
            return self._config

    class FakeKernel:
        def bind(self, args):
            return FakeBound()

    monkeypatch.setattr(hg, "kernel", lambda name, effort, dtype: seen.append(("kernel", name, effort)) or FakeKernel())
    tuner = hg.StageRunner("tune", "quick", on_tuned=lambda name, c: seen.append(("tuned", name, c["block_sizes"])))
    tuner.bound("state", (x,), x.dtype)
    assert seen == [("kernel", "state", "quick"), ("autotune", True), ("tuned", "state", [4])]
    assert tuner.tuned_now == ["state"] and tuner.configs["state"]["block_sizes"] == [4]


# ----------------------------------------------------------------------------- the backend end to end
@pytest.mark.parametrize("sid", ["gdn_fixed_b2", "gdn_packed_gva3", "kda_packed_gva2"])
@pytest.mark.parametrize("route", ["explicit", "flag", "fused_q"])
def test_backend_passes_the_gate(cpu_shims, monkeypatch, tmp_path, sid, route):
    monkeypatch.setattr(hb, "_cuda_available", lambda: True)
    shape = SMOKE[sid]
    if shape.dtype != "float32":  # fp16 dots under the interpreter: keep the test to fp32 storage
        shape = dataclasses.replace(shape, dtype="float32")
    b = hb.HelionBackend(cache_dir=tmp_path)
    assert b.is_available() and b.supports(shape, route, "fwd", "cuda")
    assert b.config_label(shape, route, "cuda").startswith("default")
    inp = make_inputs(shape)
    out = b.prepare(shape, route, inp)()
    verdict = judge(build_oracle(shape, inp, shape), out[0], out[1])
    assert verdict.passed, verdict.reason
    assert (shape.id, route) in b._resolved  # the gate's shortened copy reuses these configs
    assert not list(tmp_path.rglob("*.json"))  # effort none: nothing tuned, nothing written


def test_backend_tunes_once_then_reads_the_cache(cpu_shims, monkeypatch, tmp_path):
    """Effort quick: the first run tunes in prepare (Helion's autotuner faked: it returns a small config),
    saves each kernel's config with Config.save; a fresh backend (a later run) finds them all."""
    from helion.runtime.kernel import BoundKernel

    monkeypatch.setattr(hb, "_cuda_available", lambda: True)
    monkeypatch.setattr(hb, "_device_identity", lambda: {"gpu": "NVIDIA H200", "compute_capability": "9.0"})
    calls = []

    def fake_autotune(self, args, force=True, **kw):
        calls.append(self.kernel.fn.__name__)
        cfg = self.config_spec.default_config()
        self.set_config(cfg)
        return cfg

    monkeypatch.setattr(BoundKernel, "autotune", fake_autotune)
    shape = dataclasses.replace(SMOKE["gdn_fixed_b2"], lens=(65,))
    b = hb.HelionBackend(cache_dir=tmp_path, effort="quick")
    assert b.config_label(shape, "fused_q", "cuda") == "tuned now (effort quick): l2norm, state, output"
    inp = make_inputs(shape)
    out = b.prepare(shape, "fused_q", inp)()
    assert judge(build_oracle(shape, inp, shape), out[0], out[1]).passed
    assert sorted(calls) == ["_l2norm_body", "_output_body", "_state_body"]
    saved = sorted(p.name for p in (tmp_path / "nvidia-h200" / "helion").glob("*.json") if ".key." not in p.name)
    assert len(saved) == 3 and any(n.startswith("output-fused_q-") for n in saved)
    later = hb.HelionBackend(cache_dir=tmp_path, effort="quick")
    assert later.config_label(shape, "fused_q", "cuda") == "tuned (cached, effort quick): l2norm, state, output"
    mode, _, cfgs = later._plan(shape, "fused_q")
    assert mode == "cached" and set(cfgs) == {"l2norm", "state", "output"}
    assert later.config_label(shape, "explicit", "cuda").startswith("tuned now")  # plain output: not tuned yet


# ----------------------------------------------------------------------------- KDA
def _kda_inputs(B, lens, H, HV, K, V, h0, seed=1):
    q, k, v, _, beta, cu, state = _inputs(B, lens, H, HV, K, V, h0, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    g = -5.0 * torch.sigmoid(torch.randn(*v.shape[:3], K, generator=gen))  # bounded gate, lower_bound -5
    return q, k, v, g, beta, cu, state


@pytest.mark.parametrize("case", ["packed_gva2", "fixed_b2"])
@pytest.mark.parametrize("norm", ["caller", "flag", "fused_q"])
def test_kda_forward_matches_fp64(mode, case, norm):
    c = CASES[case]
    q, k, v, g, beta, cu, h0 = _kda_inputs(**c)
    from gdnbench.oracle.reference import l2norm

    kw = dict(scale=c["K"] ** -0.5, initial_state=h0, cu_seqlens=cu)
    if norm == "caller":
        o, s = hg.chunk_gdn(q, k, v, g, beta, caller_norm=l2norm, **kw)
    else:
        o, s = hg.chunk_gdn(q, k, v, g, beta, norm=norm, **kw)
    o64, s64 = recurrence(q, k, v, g, beta, scale=kw["scale"], initial_state=h0,
                          cu_seqlens=None if cu is None else cu.tolist())
    assert _rel(o, o64) < TOL and _rel(s, s64) < TOL


def test_kda_huge_and_zero_rows_fused_q(mode):
    q, k, v, g, beta, cu, h0 = _kda_inputs(**CASES["packed_gva2"])
    q[0, 7] *= 1e30
    q[0, 3] = 0
    kw = dict(scale=32 ** -0.5, initial_state=h0, cu_seqlens=cu)
    o64, s64 = recurrence(q.double(), k, v, g, beta, scale=kw["scale"], initial_state=h0, cu_seqlens=cu.tolist())
    o, s = hg.chunk_gdn(q, k, v, g, beta, norm="fused_q", **kw)
    assert torch.isfinite(o).all() and o[0, 3].abs().max() == 0
    assert _rel(o, o64) < TOL and _rel(s, s64) < TOL

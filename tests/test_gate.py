"""The gate and the measurement loop, with fake backends on the CPU."""

import math

import pytest
import torch

from gdnbench import check, inputs, shapes
from gdnbench.reference import l2norm, recurrence
from gdnbench.runner import run_set
from gdnbench.timing import TimingParams
from tests import fakes

SMOKE = shapes.load("smoke")
FAST = TimingParams(warmup=0, rounds=2, iters=2)


def test_inputs_deterministic_and_shaped():
    s = SMOKE.get("kda_packed_gva2")
    a, b = inputs.make_inputs(s), inputs.make_inputs(s)
    for name in ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.q.shape == (1, 123, 2, 16) and a.v.shape == (1, 123, 4, 32) and a.g.shape == (1, 123, 4, 16)
    assert a.cu_seqlens.dtype == torch.int64 and a.cu_seqlens.tolist() == [0, 50, 120, 123]
    assert a.initial_state.shape == (3, 4, 16, 32) and a.initial_state.dtype == torch.float32
    assert bool((a.g < 0).all()) and bool((a.g >= -5.0).all())
    other = inputs.make_inputs(shapes.Shape(**{**s.__dict__, "seed": 5}))
    assert not torch.equal(a.q, other.q)


def test_l2norm_is_flas_eps_inside_sqrt():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    y = l2norm(x)
    assert torch.allclose(y[0], torch.tensor([3.0, 4.0]) / math.sqrt(25 + 1e-6))
    assert torch.equal(y[1], torch.zeros(2))


def test_recurrence_matches_a_plain_loop():
    torch.manual_seed(0)
    T, H, K, V = 7, 2, 4, 3
    q, k = torch.randn(1, T, H, K, dtype=torch.float64), torch.randn(1, T, H, K, dtype=torch.float64)
    v = torch.randn(1, T, H, V, dtype=torch.float64)
    g = -torch.rand(1, T, H, dtype=torch.float64)
    beta = torch.rand(1, T, H, dtype=torch.float64)
    o, S = recurrence(q, k, v, g, beta, scale=0.5)
    qn, kn = l2norm(q), l2norm(k)
    for h in range(H):
        s = torch.zeros(K, V, dtype=torch.float64)
        for t in range(T):
            s = s * math.exp(g[0, t, h])
            s = s + torch.outer(kn[0, t, h], beta[0, t, h] * (v[0, t, h] - kn[0, t, h] @ s))
            assert torch.allclose(o[0, t, h], 0.5 * qn[0, t, h] @ s)
        assert torch.allclose(S[0, h], s)


def test_budget_is_derived_from_the_data():
    s = SMOKE.get("gdn_packed_gva3")  # fp16
    inp = inputs.make_inputs(s)
    oracle = check.build_oracle(s, inp, s)
    assert 1e-5 < oracle.lowp_err_o < 1e-2 and oracle.budget_o > check.BUDGET_FLOOR
    good = check.judge(oracle, oracle.o.to(torch.float16), oracle.state.float())
    assert good.passed, good.reason
    bad = check.judge(oracle, oracle.o * 1.05, oracle.state)
    assert not bad.passed and "output rel-RMS error" in bad.reason
    nan = oracle.o.clone()
    nan[0, 0, 0, 0] = float("inf")
    assert not check.judge(oracle, nan, None).passed


@pytest.mark.parametrize("times, passes", [(1.5, True), (1.9, True), (2.1, False), (3.0, False)])
def test_a_route_may_lose_twice_what_the_storage_precision_loses(times, passes):
    """An output `times` the storage precision's error away from fp64 passes up to a factor of 2."""
    s = SMOKE.get("gdn_packed_gva3")
    oracle = check.build_oracle(s, inputs.make_inputs(s), s)
    noise = torch.randn(oracle.o.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = oracle.o + noise * (times * oracle.lowp_err_o * oracle.o.norm() / noise.norm())
    assert check.rel_rms(out, oracle.o) == pytest.approx(times * oracle.lowp_err_o)
    verdict = check.judge(oracle, out, oracle.state)
    assert verdict.passed is passes, verdict.reason


def _by_key(rows):
    return {(r["shape_id"], r["backend"], r["route"]): r for r in rows}


def test_fake_backends_every_pair_gets_one_row():
    objs = [fakes.CorrectFake(), fakes.WrongFake(), fakes.NaNFake(), fakes.RaisingFake(), fakes.UnavailableFake(),
            fakes.KdaOnlyFake()]
    ids = ["gdn_fixed_b2", "kda_packed_gva2"]
    routes = ["explicit", "flag"]
    rows = run_set(SMOKE, [], routes, device="cpu", check_tokens=64, params=FAST, shape_ids=ids, isolate=False,
                   backend_objects=objs)
    assert len(rows) == len(ids) * len(objs) * len(routes)
    by = _by_key(rows)
    ok = by[("gdn_fixed_b2", "fake_correct", "explicit")]
    assert ok["status"] == "ok" and ok["wall"]["n"] == 4 and ok["timing_meaningful"] is False
    assert ok["check"]["shortened"] is True and ok["check"]["tokens"] == 64  # 2 x 32 of 2 x 100
    wrong = by[("gdn_fixed_b2", "fake_wrong", "explicit")]
    assert wrong["status"] == "incorrect" and "wall" not in wrong and wrong["check"]["err_o"] > 0.05
    assert by[("kda_packed_gva2", "fake_nan", "explicit")]["status"] == "incorrect"
    err = by[("gdn_fixed_b2", "fake_raising", "explicit")]
    assert err["status"] == "error" and "out of resources" in err["reason"]
    assert by[("gdn_fixed_b2", "fake_unavailable", "explicit")]["reason"] == "library not installed"
    assert by[("gdn_fixed_b2", "fake_wrong", "flag")]["status"] == "skipped"
    assert by[("gdn_fixed_b2", "fake_kda_only", "explicit")]["status"] == "skipped"
    assert by[("kda_packed_gva2", "fake_kda_only", "explicit")]["status"] == "ok"


def test_crash_in_a_worker_keeps_other_rows():
    rows = run_set(SMOKE, ["reference", "tests.fakes:CrashingFake"], ["explicit"], device="cpu", check_tokens=64,
                   params=FAST, shape_ids=["kda_fixed"], isolate=True)
    by = _by_key(rows)
    assert by[("kda_fixed", "reference", "explicit")]["status"] == "ok"
    crash = by[("kda_fixed", "fake_crash", "explicit")]
    assert crash["status"] == "error" and "code 17" in crash["reason"]
    assert len(rows) == 2

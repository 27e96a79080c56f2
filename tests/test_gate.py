"""The gate and the measurement loop, with fake backends on the CPU."""

import math

import pytest
import torch

from gdnbench.oracle import check
from gdnbench.data import inputs, shapes
from gdnbench.oracle.reference import l2norm, recurrence
from gdnbench.bench.runner import run_set
from gdnbench.bench.timing import TimingParams
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


@pytest.mark.parametrize("set_name, shape_id", [("gdn-qwen6-long", "h16_hv48_uniform_long"),
                                                ("kda-legacy6-long", "h64_mixed_long")])
def test_long_gate_regime_draw(set_name, shape_id):
    s = shapes.load(set_name).get(shape_id).shortened(512)
    a = inputs.make_inputs(s)
    assert torch.equal(a.g, inputs.make_inputs(s).g)  # seeded
    strong = inputs.make_inputs(shapes._replace(s, gate_regime="strong"))
    for name in ("q", "k", "v", "beta", "initial_state"):
        x, y = getattr(a, name), getattr(strong, name)
        assert (x is None and y is None) or torch.equal(x, y), name
    g = a.g.flatten(0, 1)  # [tokens, HV] or [tokens, HV, K]
    assert bool((g <= 0).all()) and (s.lower_bound is None or bool((g >= s.lower_bound).all()))
    zero = (g == 0).all(0)  # heads (KDA: head channels) that never forget
    last = g.shape[-1]
    assert (zero.sum(-1) == max(1, last // 4)).all()  # a quarter in each head (KDA) or of the heads (GDN)
    assert bool((g[:, ~zero] < 0).all())
    mean_rate = (-g).mean(0)[~zero]
    assert mean_rate.max() / mean_rate.min() > 20  # rates spread over orders of magnitude
    assert 1e-4 < mean_rate.min() and mean_rate.max() < 0.5  # long memory: nowhere near strong's ~0.8 per token
    assert float((-strong.g).mean()) > 0.5


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


def _bf16_shape(family, regime, seed=7):
    """Small bf16 shapes, where the storage precision's error (~4e-3) is near a 1 % fault's."""
    return shapes.Shape(id=f"{family}_{regime}", family=family, H=2, HV=4, K=32, V=32, lens=(90, 130, 40), seed=seed,
                        gate=shapes.GATES[family], dtype="bfloat16", initial_state=True, gate_regime=regime,
                        lower_bound=-5.0 if family == "kda" else None)


BF16_SHAPES = [_bf16_shape(f, r, seed) for seed, (f, r) in enumerate(
    [("gdn", "strong"), ("gdn", "long"), ("kda", "strong"), ("kda", "long")])]


@pytest.mark.parametrize("s", BF16_SHAPES, ids=lambda s: s.id)
def test_stricter_gate_passes_storage_precision_and_fails_a_1pc_scale(s):
    inp = inputs.make_inputs(s)
    oracle = check.build_oracle(s, inp, s)
    lp, tf32 = check.storage_precision(s.dtype)
    kw = dict(scale=inp.scale, initial_state=inp.initial_state, cu_seqlens=inp.cu_seqlens_list)
    o_lp, s_lp = recurrence(inp.q, inp.k, inp.v, inp.g, inp.beta, dtype=lp, tf32=tf32, **kw)
    rounded = oracle.o.to(torch.bfloat16), oracle.state.float()
    for name, (o, st) in {"storage-precision run": (o_lp, s_lp), "bf16 rounding of fp64": rounded}.items():
        v = check.judge(oracle, o, st)
        assert v.passed, (name, v.reason)
        for stat in ("scale_err_o", "row_err_o", "scale_err_state", "row_err_state"):
            limit = getattr(v, stat.replace("_err", "").replace("scale", "budget_scale").replace("row", "budget_row"))
            assert getattr(v, stat) <= 0.5 * limit + 1e-12, (name, stat)  # the storage run sits at half its budgets
    bad = check.judge(oracle, rounded[0] * 1.01, rounded[1])
    assert not bad.passed and "output scale error" in bad.reason
    subtle = check.judge(oracle, rounded[0] * 1.005, rounded[1])  # inside the rel-RMS budget, not the scale one
    assert subtle.err_o <= subtle.budget_o and not subtle.passed and "output scale error" in subtle.reason
    bad_state = check.judge(oracle, *rounded[:1], rounded[1] * 1.01)
    assert not bad_state.passed and "final-state" in bad_state.reason
    short_head, last_tokens = rounded[0].clone(), rounded[0].clone()
    short_head[0, 220:, 1] = 0  # head 1 of the 40-token sequence
    last_tokens[0, [89, 219, 259]] = 0
    g_shift = torch.cat([inp.g[:, :1], inp.g[:, :-1]], 1)  # token t decays with t-1's gate
    o_shift, s_shift = recurrence(inp.q, inp.k, inp.v, g_shift, inp.beta, dtype=torch.float64, **kw)
    for name, (o, st) in {"short sequence's head zeroed": (short_head, rounded[1]),
                          "last tokens zeroed": (last_tokens, rounded[1]),
                          "gate off by one token": (o_shift.to(torch.bfloat16), s_shift.float())}.items():
        assert not check.judge(oracle, o, st).passed, name


def test_errors_name_the_worst_row():
    ref = torch.randn(1, 50, 3, 8, dtype=torch.float64)
    out = ref.clone()
    out[0, 17, 2] = 0
    e = check.errors(out, ref, check.O_ROW_DIMS)
    assert e.worst_row == (0, 17, 2) and e.rows == 150 and e.vectors == 150
    assert e.row_err == pytest.approx(ref[0, 17, 2].norm().item() / (ref.norm().item() / math.sqrt(150)))
    assert e.scale_err == pytest.approx(ref[0, 17, 2].pow(2).sum().item() / ref.pow(2).sum().item())
    st = check.errors(ref * 1.01, ref, check.STATE_ROW_DIMS)
    assert st.rows == 50 and st.scale_err == pytest.approx(0.01) and st.row_err >= st.rel_rms
    assert check.errors(out.clone().fill_(float("nan")), ref, 1) == check.NOT_FINITE


def test_fake_faults_are_incorrect_and_the_reference_is_not():
    ss = shapes.ShapeSet("bf16", 1, "", "", (BF16_SHAPES[0], BF16_SHAPES[3]))
    faults = {"fake_o_x1.01": "output scale error", "fake_state_x1.01": "final-state scale error",
              "fake_zero_row": "output row error", "fake_doubled_row": "output row error"}
    objs = [fakes.CorrectFake(), fakes.ScaledOFake(), fakes.ScaledStateFake(), fakes.ZeroRowFake(),
            fakes.DoubledRowFake()]
    rows = run_set(ss, [], ["explicit"], device="cpu", check_tokens=4096, params=FAST, isolate=False,
                   backend_objects=objs)
    by = _by_key(rows)
    for s in ss.shapes:
        ok = by[(s.id, "fake_correct", "explicit")]
        assert ok["status"] == "ok", ok["reason"]
        for key in ("scale_err_o", "budget_scale_o", "lowp_scale_err_o", "row_err_o", "worst_row_o", "budget_row_o",
                    "lowp_row_err_o", "scale_err_state", "budget_scale_state", "row_err_state", "budget_row_state"):
            assert ok["check"][key] is not None, key
        for name, words in faults.items():
            r = by[(s.id, name, "explicit")]
            assert r["status"] == "incorrect" and words in r["reason"] and "wall" not in r, (s.id, name, r["reason"])
        middle = 0, s.tokens // 2, 0
        for name in ("fake_zero_row", "fake_doubled_row"):
            assert tuple(by[(s.id, name, "explicit")]["check"]["worst_row_o"]) == middle
            assert f"at row {list(middle)}" in by[(s.id, name, "explicit")]["reason"]


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
    nan = by[("kda_packed_gva2", "fake_nan", "explicit")]
    assert nan["status"] == "incorrect" and nan["check"]["passed"] is False and "wall" not in nan
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


def test_cuda_fwd_gates_the_timed_call_at_full_length(monkeypatch):
    from gdnbench.bench import measure

    s = SMOKE.get("gdn_fixed_b2")  # 2 x 100 tokens
    assert measure.gate_shape(s, "fwd", "cuda", 64) is s
    assert measure.gate_shape(s, "fwd", "cpu", 64).tokens == 64 == measure.gate_shape(s, "fwd_bwd", "cuda", 64).tokens
    real = measure.gate_shape
    monkeypatch.setattr(measure, "gate_shape", lambda shape, mode, device, ct: real(shape, mode, "cuda", ct))
    fake = fakes.RecordingFake()
    rows = run_set(SMOKE, [], ["explicit"], device="cpu", check_tokens=64, params=FAST, shape_ids=[s.id],
                   isolate=False, backend_objects=[fake])
    (row,) = rows
    assert row["status"] == "ok" and row["check"]["tokens"] == 200 and row["check"]["shortened"] is False
    assert fake.prepared == [200]  # one closure, gated and timed: no separate shortened one


def test_cuda_fwd_gate_compares_the_first_call_with_the_judged_one(monkeypatch):
    from gdnbench.analysis.report import check_table
    from gdnbench.bench import measure
    from gdnbench.data.records import Row, RunDocument, ShapeSetInfo

    real = measure.gate_shape
    monkeypatch.setattr(measure, "gate_shape", lambda shape, mode, device, ct: real(shape, mode, "cuda", ct))
    rows = run_set(SMOKE, [], ["explicit"], device="cpu", check_tokens=64, params=FAST, shape_ids=["gdn_fixed_b2"],
                   isolate=False, backend_objects=[fakes.FlakyRowFake(), fakes.CorrectFake()])
    by = _by_key(rows)
    flaky, steady = by[("gdn_fixed_b2", "fake_flaky_row", "explicit")], by[("gdn_fixed_b2", "fake_correct", "explicit")]
    assert flaky["status"] == "incorrect" and flaky["deterministic"] is False
    assert steady["status"] == "ok" and steady["deterministic"] is True
    doc = RunDocument({}, ShapeSetInfo("smoke", "sha256:x", 1, ("gdn",), {}), {}, {"mode": "fwd"},
                      [Row.from_dict(r) for r in rows])
    (note,) = check_table(doc).notes
    assert "fake_flaky_row:explicit at gdn_fixed_b2" in note and "fake_correct" not in note
    # a backend that returns the buffer of its first call again: nothing to compare
    o = torch.zeros(2, 3)
    assert measure._same_outputs((o, None), (o, None)) is None
    assert measure._same_outputs((o, None), (o.clone(), None)) is True
    assert measure._same_outputs((o, None), (o + 1, None)) is False
    # shortened gate inputs (the CPU's): another closure, nothing to compare
    monkeypatch.undo()
    cpu = run_set(SMOKE, [], ["explicit"], device="cpu", check_tokens=64, params=FAST, shape_ids=["gdn_fixed_b2"],
                  isolate=False, backend_objects=[fakes.CorrectFake()])
    assert "deterministic" not in cpu[0]

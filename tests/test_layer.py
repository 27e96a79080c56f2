"""The small layer around each training route (gdnbench/bench/modes/layer.py): its weight gradients pass the gate on the
reference backend for every route, a perturbed gradient fails naming its weight, the report shows them."""

import pytest

from gdnbench.data import inputs, shapes
from gdnbench.bench.modes import layer, train
from gdnbench.analysis import report as rep
from gdnbench.data.records import Row, RunDocument
from gdnbench.backends.reference import ReferenceBackend
from gdnbench.oracle.check import rel_rms
from gdnbench.bench.runner import run_set
from gdnbench.bench.timing import TimingParams
from tests import fakes

SMOKE = shapes.load("smoke")
FAST = TimingParams(warmup=0, rounds=1, iters=1)
TRAIN = ["explicit", "flag", "megatron", "megatron_flag"]
IDS = ["gdn_packed_gva3", "kda_packed_gva2"]  # fp16 and fp32, packed, GVA, initial states


@pytest.fixture(scope="module")
def cases():
    """shape id -> (check shape, its inputs, the fwd_bwd oracle with the layer's)."""
    out = {}
    for sid in IDS:
        s = SMOKE.get(sid).shortened(64)
        inp = inputs.make_inputs(s)
        out[sid] = (s, inp, train.build_grad_oracle(s, inp, s))
    return out


def _verdict(backend, case, route):
    s, inp, oracle = case
    v = train.judge_step(oracle, train.prepare_step(backend, s, route, inp)())
    return layer.judge_route(v, oracle, backend, s, route, inp)


@pytest.mark.parametrize("sid", IDS)
def test_reference_layer_gradients_pass_on_every_route(cases, sid):
    for route in TRAIN:
        v = _verdict(ReferenceBackend(), cases[sid], route)
        assert v.passed, (route, v.reason)
        assert list(v.layer) == ["W_qk", "W_v", "W_a", "W_b", "W_o", "x"]
        for name, f in v.layer.items():
            assert 0 <= f["err"] <= f["budget"] and f["budget"] == pytest.approx(2 * f["lowp_err"]), (route, name)
        d = v.to_dict()
        assert d["layer"] == v.layer and d["layer_width"] == layer.LAYER_WIDTH == 128


def test_layer_shapes_follow_the_family(cases):
    for sid, (s, inp, oracle) in cases.items():
        w = oracle.layer.data.tensors
        assert w["W_qk"].shape == (128, 2 * s.H * s.K) and w["W_o"].shape == (s.HV * s.V, 128)
        assert w["W_a"].shape == (128, s.HV if s.family == "gdn" else s.HV * s.K)
        assert w["x"].shape[:2] == inp.v.shape[:2] and w["x"].dtype == inp.v.dtype
        g = layer.project(s, w)[2]
        assert g.shape == inp.g.shape and g.dtype == inp.g.dtype and bool((g < 0).all())
        if s.family == "kda":
            assert bool((g > s.lower_bound).all())


def test_megatron_and_megatron_flag_weight_gradients_agree(cases):
    """Parity between the two compositions directly: each weight gradient within its budget of the other."""
    s, inp, oracle = cases["gdn_packed_gva3"]
    a, b = (layer.layer_grads(s, oracle.layer.data, layer.route_attention(ReferenceBackend(), s, r, inp))
            for r in ("megatron", "megatron_flag"))
    for name in layer.GRADS:
        assert rel_rms(a[name], b[name]) <= oracle.layer.budget(name), name


def test_perturbed_weight_gradient_fails_naming_it(cases):
    oracle = cases["kda_packed_gva2"][2].layer
    grads = dict(oracle.grads, W_b=oracle.grads["W_b"] * 1.01)
    figures, problems = layer.judge_grads(oracle, grads)
    assert figures["W_b"]["err"] == pytest.approx(0.01) and figures["W_v"]["err"] == 0
    assert len(problems) == 1 and problems[0].startswith("layer dW_b rel-RMS error 0.01 > budget")


@pytest.fixture(scope="module")
def scaled_rows():
    rows = run_set(SMOKE, [], ["megatron"], mode="fwd_bwd", device="cpu", check_tokens=32, params=FAST,
                   shape_ids=["kda_fixed"], isolate=False,
                   backend_objects=[ReferenceBackend(), fakes.ScaledOutputFake()])
    return {r["backend"]: r for r in rows}


def test_kernel_output_off_by_one_percent_makes_the_row_incorrect(scaled_rows):
    ok, bad = scaled_rows["reference"], scaled_rows["fake_scaled_output"]
    assert ok["status"] == "ok" and set(ok["check"]["layer"]) == set(layer.GRADS)
    assert bad["status"] == "incorrect" and "wall" not in bad
    assert bad["check"]["layer"]["W_o"]["err"] == pytest.approx(0.01, rel=0.05)
    assert "layer dW_o rel-RMS error" in bad["reason"] and "layer dW_qk rel-RMS error" in bad["reason"]


def test_report_prints_the_layer_table(scaled_rows):
    doc = RunDocument.from_dict({
        "schema_version": 1, "env": {}, "timing": {}, "run": {"mode": "fwd_bwd"}, "rows": list(scaled_rows.values()),
        "shape_set": {"name": "smoke", "version": 1, "hash": "sha256:x", "shapes": {"kda_fixed": ""}}})
    (t,) = [t for t in rep.report_tables(doc) if t.title.startswith("layer gradient gate")]
    assert t.columns == ["shape", "backend:route", "status", "dW_qk", "dW_v", "dW_a", "dW_b", "dW_o", "dx"]
    bad = next(r for r in t.rows if r[1] == "fake_scaled_output:megatron")
    f = scaled_rows["fake_scaled_output"]["check"]["layer"]["W_o"]
    assert bad[2] == "incorrect" and bad[7] == f"{f['err']:.1e} / {f['budget']:.1e}"
    assert "D = 128" in t.notes[0]
    without = [dict(r, check={k: v for k, v in r["check"].items() if k != "layer"}) for r in scaled_rows.values()]
    empty = rep.layer_table(doc.with_rows(Row.from_dict(r) for r in without))
    assert empty.rows == [] and "no row has layer gradients" in empty.notes[0]

"""Mode fwd_bwd on the CPU: the gradient gate, the training routes, saved bytes, skips, the CLI."""

import json

import pytest
import torch

from gdnbench.data import inputs, shapes
from gdnbench.bench.modes import train
from gdnbench.backends import get
from gdnbench.backends.fla import HOPPER_BWD_REFUSED, FlaBackend, gdn_backward_refused
from gdnbench.backends.reference import ReferenceBackend
from gdnbench.bench.runner import run_set
from gdnbench.bench.timing import TimingParams
from tests import fakes
from tests.test_cli import invoke

SMOKE = shapes.load("smoke")
FAST = TimingParams(warmup=0, rounds=1, iters=1)
TRAIN = ["explicit", "flag", "megatron", "megatron_flag"]
IDS = ["gdn_packed_gva3", "kda_packed_gva2"]  # fp16 and fp32, packed, GVA, initial states


def _by_key(rows):
    return {(r["shape_id"], r["backend"], r["route"]): r for r in rows}


@pytest.fixture(scope="module")
def reference_rows():
    return _by_key(run_set(SMOKE, [], TRAIN, mode="fwd_bwd", device="cpu", check_tokens=64, params=FAST,
                           shape_ids=IDS, isolate=False, backend_objects=[ReferenceBackend()]))


def test_reference_passes_the_gradient_gate_on_every_training_route(reference_rows):
    assert len(reference_rows) == len(IDS) * len(TRAIN)
    for key, r in reference_rows.items():
        assert r["status"] == "ok" and r["mode"] == "fwd_bwd", (key, r["reason"])
        grads = r["check"]["grads"]
        assert set(grads) == {"dq", "dk", "dv", "dg", "dbeta"}
        for name, g in grads.items():
            assert 0 <= g["err"] <= g["budget"] and g["budget"] == pytest.approx(2 * g["lowp_err"]), (key, name)
        assert r["saved_bytes"] > 0 and r["peak_bytes"] is None and r["deterministic"] is True
        assert r["wall"]["n"] == 1 and r["gpu"] is None


@pytest.mark.parametrize("route", ["megatron", "megatron_flag"])
def test_megatron_compositions_match_explicit(route):
    """Same function, same gradients, within the gate's budgets: the fused q|k gradient split back
    into dq, dk agrees with explicit's (fp16 shape: explicit rounds the normalized q/k to fp16)."""
    s = SMOKE.get("gdn_packed_gva3")
    inp = inputs.make_inputs(s)
    oracle = train.build_grad_oracle(s, inp, s)
    o_e, s_e, g_e = train.prepare_step(ReferenceBackend(), s, "explicit", inp)()
    o_m, s_m, g_m = train.prepare_step(ReferenceBackend(), s, route, inp)()
    assert len(g_m) == 4 and g_m[0].shape[2] == 2 * g_e[0].shape[2]  # one gradient for the fused q|k leaf
    assert train.rel_rms(o_m, o_e) <= oracle.fwd.budget_o and train.rel_rms(s_m, s_e) <= oracle.fwd.budget_state
    named_e, named_m = train.named_grads(g_e), train.named_grads(g_m)
    for name in train.GRADS:
        assert train.rel_rms(named_m[name], named_e[name]) <= oracle.budget(name), name


def test_saved_bytes_on_the_reference(reference_rows):
    """The claim fwd_bwd exists to measure: with FLA, megatron_flag keeps less for backward than megatron,
    because only in megatron does the caller's normalized fused q|k [B,T,2H,K] stay alive (FLA's l2norm
    Function saves its output), on top of the HV-head q/k the kernel saves in both routes.

    On the reference backend that does NOT hold, and this test pins what does: its in-kernel l2norm
    (normalize=True) is plain torch that saves its input, the expanded q/k at HV heads, while the caller's
    l2norm on the fused tensor saves the 2H-head q|k; the recurrence makes its own fp64 copies either way.
    So megatron_flag saves more than megatron when HV > H and as much when HV == H."""
    for sid in IDS:
        meg, flag = (reference_rows[(sid, "reference", r)]["saved_bytes"] for r in ("megatron", "megatron_flag"))
        assert flag > meg  # both shapes have HV > H
    kda = SMOKE.get("kda_fixed")  # H == HV
    meg, flag = (train.saved_bytes(train.prepare_step(ReferenceBackend(), kda, r, inputs.make_inputs(kda)))
                 for r in ("megatron", "megatron_flag"))
    assert meg == flag > 0


def test_saved_bytes_counts_each_storage_once():
    x = torch.randn(1000, requires_grad=True)  # 4000 bytes

    def step():
        with torch.enable_grad():
            y = x * x  # saves x twice (one storage)
            z = y[:10].exp() * x[:10]  # saves exp's output (40 B), x again (a view of the same storage)
            return z.sum()

    assert train.saved_bytes(step) == 4000 + 40


def test_wrong_gradient_is_incorrect_with_dq_dk_figures():
    rows = run_set(SMOKE, [], ["explicit"], mode="fwd_bwd", device="cpu", check_tokens=64, params=FAST,
                   shape_ids=["kda_fixed"], isolate=False, backend_objects=[fakes.WrongGradFake()])
    (r,) = rows
    assert r["status"] == "incorrect" and "wall" not in r and "saved_bytes" not in r
    g = r["check"]["grads"]
    assert g["dq"]["err"] == pytest.approx(0.1, rel=0.05) and g["dk"]["err"] == pytest.approx(0.1, rel=0.05)
    assert g["dv"]["err"] <= g["dv"]["budget"] and r["check"]["err_o"] <= r["check"]["budget_o"]
    assert "dq rel-RMS error" in r["reason"] and "dk rel-RMS error" in r["reason"]


def test_unsupported_combinations_are_skipped_with_reasons():
    objs = [ReferenceBackend(), get("gdnbench"), get("fla"), get("flashinfer")]
    rows = _by_key(run_set(SMOKE, [], ["explicit", "megatron", "fused_qk"], mode="fwd_bwd", device="cpu",
                           check_tokens=32, params=FAST, shape_ids=["kda_fixed"], isolate=False,
                           backend_objects=objs))
    assert len(rows) == 4 * 3
    assert "fused_qk" in rows[("kda_fixed", "reference", "fused_qk")]["reason"]
    assert "no backward" in rows[("kda_fixed", "reference", "fused_qk")]["reason"]
    ours = rows[("kda_fixed", "gdnbench", "explicit")]
    assert ours["status"] == "skipped" and ours["reason"]
    assert rows[("kda_fixed", "fla", "megatron")]["status"] == "skipped"
    assert rows[("kda_fixed", "flashinfer", "explicit")]["status"] == "skipped"
    s = SMOKE.get("gdn_fixed_b2")
    assert "no autograd" in get("gdnbench").supports(s, "explicit", "fwd_bwd", "cuda").reason
    assert "no autograd" in get("flashinfer").supports(s, "explicit", "fwd_bwd", "cuda").reason
    assert "--mode fwd_bwd" in ReferenceBackend().supports(s, "megatron", "fwd", "cpu").reason
    assert FlaBackend().supports(s, "megatron_flag", "fwd_bwd", "cpu").reason == "fla does not run on cpu"


def test_fla_hopper_gated_backward_rule():
    assert gdn_backward_refused((9, 0), "3.6.0") and gdn_backward_refused((9, 0), "3.4.0")
    assert not gdn_backward_refused((9, 0), "3.7.1") and not gdn_backward_refused((9, 0), "3.3.1")
    assert not gdn_backward_refused((10, 0), "3.6.0") and not gdn_backward_refused((8, 0), "3.5.0")
    assert "#640" in HOPPER_BWD_REFUSED


def test_cli_run_fwd_bwd_writes_saved_bytes(tmp_path):
    out = tmp_path / "fb.json"
    r = invoke("run", "--device", "cpu", "--mode", "fwd_bwd", "--shapes", "smoke", "--backends", "reference",
               "--shape-id", "kda_fixed", "--check-tokens", "32", "--no-plot", "--out", str(out))
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["run"]["mode"] == "fwd_bwd" and d["run"]["routes"] == TRAIN
    assert [x["status"] for x in d["rows"]] == ["ok"] * 4
    assert all(x["saved_bytes"] > 0 and x["mode"] == "fwd_bwd" for x in d["rows"])
    r = invoke("report", str(out))
    assert r.exit_code == 0 and "reference:megatron_flag/reference:megatron" in r.output
    assert "memory per fwd+bwd step" in r.output and "than reference:megatron for backward" in r.output
    assert "layer gradient gate" in r.output and all(set(x["check"]["layer"]) >= {"W_qk", "x"} for x in d["rows"])
    r = invoke("report", str(out), "--mode", "fwd")
    assert r.exit_code == 0 and "memory per fwd+bwd" not in r.output
    assert invoke("report", str(out), "--mode", "sideways").exit_code == 2

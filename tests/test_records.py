"""Typed results records: no time without a passing check, no failure without its cause, and every
committed results file read and written back unchanged."""

import dataclasses
import json
import math
from glob import glob
from pathlib import Path

import pytest

from gdnbench.data import results
from gdnbench.data.records import Check, ResultsError, Row, RunDocument, ShapeSetInfo, Stats

ROOT = Path(__file__).resolve().parent.parent
RESULTS = sorted(f for f in glob(str(ROOT / "results" / "**" / "*.json"), recursive=True)
                 if "schema_version" in json.loads(Path(f).read_text()))
PASS, FAIL = Check(True, ""), Check(False, "output rel-RMS error 0.3 > budget 0.01")
TIME = Stats(120.0)


def row(status="ok", reason="", **parts) -> Row:
    return Row("s", "gdn", "fla", "flag", "fwd", status, reason, **parts)


def test_every_committed_results_file_loads_and_writes_back_unchanged():
    assert len(RESULTS) >= 10  # the H200 runs under results/
    for f in RESULTS:
        raw = json.loads(Path(f).read_text())
        doc = results.load(f)
        assert len(doc.rows) == len(raw["rows"]) and doc.to_dict() == raw, f
        assert RunDocument.from_dict(json.loads(json.dumps(doc.to_dict()))) == doc, f


def test_an_ok_row_needs_a_passing_check_and_both_times():
    assert row(check=PASS, wall=TIME, gpu=TIME).median("gpu") == 120.0
    with pytest.raises(ResultsError, match="field 'check': status 'ok' needs a passing check, got none"):
        row(wall=TIME, gpu=TIME)
    with pytest.raises(ResultsError, match="field 'check.passed': status 'ok' needs a passing check, got false"):
        row(check=FAIL, wall=TIME, gpu=TIME)
    with pytest.raises(ResultsError, match="field 'wall': status 'ok' needs its wall time"):
        row(check=PASS, gpu=TIME)
    with pytest.raises(ResultsError, match="field 'gpu': status 'ok' needs its gpu time"):
        row(check=PASS, wall=TIME)
    # the CPU's rows have no gpu time, and say so
    cpu = row(check=PASS, wall=TIME, gpu=None, timing_meaningful=False, nulls=frozenset({"gpu"}))
    assert cpu.median("gpu") is None and cpu.to_dict()["gpu"] is None


def test_an_incorrect_row_carries_its_failed_check_and_no_time():
    bad = row("incorrect", FAIL.reason, check=FAIL, first_call_ms=3.0)
    assert bad.median("wall") is None and bad.to_dict()["check"]["passed"] is False
    for name, value in (("wall", TIME), ("gpu", TIME), ("profiler_us", 50.0), ("kernels_us", {"k": 50.0})):
        with pytest.raises(ResultsError, match=f"field '{name}': status 'incorrect' carries no time"):
            row("incorrect", FAIL.reason, check=FAIL, **{name: value})
    with pytest.raises(ResultsError, match="field 'check': status 'incorrect' needs the failed check's figures"):
        row("incorrect", "NaN")
    with pytest.raises(ResultsError, match="field 'check.passed': status 'incorrect' needs a failed check"):
        row("incorrect", "?", check=PASS)


@pytest.mark.parametrize("status", ["skipped", "error"])
def test_skipped_and_error_rows_need_a_reason_and_carry_no_time(status):
    assert row(status, "library not installed").reason == "library not installed"
    with pytest.raises(ResultsError, match=f"status '{status}' needs a reason"):
        row(status)
    with pytest.raises(ResultsError, match=f"field 'wall': status '{status}' carries no time"):
        row(status, "while timing: boom", check=PASS, wall=TIME)


@pytest.mark.parametrize("median", [0, -1.0, math.inf, math.nan, "fast", True, None])
def test_a_median_is_a_positive_finite_number(median):
    with pytest.raises(ResultsError, match="field 'median_us': expected a positive number"):
        Stats(median)
    with pytest.raises(ResultsError, match="field 'wall.median_us'"):
        Row.from_dict({**row(check=PASS, wall=TIME, gpu=TIME).to_dict(), "wall": {"median_us": median}})


@pytest.mark.parametrize("field,value,words", [
    ("status", "great", "status 'great' is not one of"),
    ("mode", "bwd", "mode 'bwd' is not one of"),
    ("family", "mamba", "family 'mamba' is not one of"),
    ("shape_id", 7, "field 'shape_id': expected a string, got a number 7"),
    ("first_call_ms", "slow", "field 'first_call_ms': expected a number, got a string 'slow'"),
    ("check", "passed", "field 'check': expected an object or null, got a string 'passed'"),
    ("seconds", {"oracle": "long"}, "field 'seconds': expected an object of numbers"),
])
def test_a_mistyped_field_is_named_with_its_value(field, value, words):
    good = row(check=PASS, wall=TIME, gpu=TIME).to_dict()
    with pytest.raises(ResultsError, match=words):
        Row.from_dict({**good, field: value})


def test_a_missing_field_and_a_document_error_name_the_file_and_row():
    good = row(check=PASS, wall=TIME, gpu=TIME).to_dict()
    doc = {"schema_version": 1, "env": {}, "timing": {}, "shape_set": {"name": "x", "hash": "h"},
           "rows": [good, {k: v for k, v in good.items() if k != "reason"}]}
    with pytest.raises(ResultsError) as e:
        RunDocument.from_dict(doc, "f.json")
    assert str(e.value) == "f.json: row 1: missing field 'reason'"
    with pytest.raises(ResultsError, match="^f.json: field 'shape_set.hash': expected a string, got a number 3$"):
        RunDocument.from_dict({**doc, "rows": [], "shape_set": {"name": "x", "hash": 3}}, "f.json")


def test_records_are_read_only_and_keep_what_they_do_not_know():
    r = Row.from_dict({**row(check=PASS, wall=TIME, gpu=TIME).to_dict(), "saved_bytes": 10, "profiler_us": None})
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.status = "incorrect"
    with pytest.raises(TypeError):
        r.extras["saved_bytes"] = 0
    with pytest.raises(TypeError):
        r.check.extras["err_o"] = 0.0
    assert r.get("saved_bytes") == 10 and r.profiler_us is None and r.to_dict()["profiler_us"] is None
    assert "profiler_us" not in row(check=PASS, wall=TIME, gpu=TIME).to_dict()  # absent stays absent


def test_a_document_holds_rows_of_its_own_shapes():
    info = ShapeSetInfo("set", "sha256:x", 1, ("gdn",), {"s": "gdn H2/HV2 K16 V16 T8"})
    doc = RunDocument({}, info, {}, {"mode": "fwd"}, [row("skipped", "no")])
    assert doc.mode == "fwd" and doc.header()["shape_set"]["shapes"] == {"s": "gdn H2/HV2 K16 V16 T8"}
    other = dataclasses.replace(row("skipped", "no"), shape_id="t")
    with pytest.raises(ResultsError, match="row 0: field 'shape_id': 't' is not a shape of set 'set'"):
        doc.with_rows([other])

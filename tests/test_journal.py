"""Stopped and killed runs: the journal keeps every measured row, the final path never holds an empty or
partial document, the exit code says what happened, and --resume continues from what was kept."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdnbench.data import journal
from gdnbench.data.records import ResultsError, Row, RunDocument
from gdnbench.data.results import claim_path, fold_journal, load_resumable

ROOT = Path(__file__).resolve().parent.parent
RUN = [sys.executable, "-m", "gdnbench", "run", "--device", "cpu", "--shapes", "smoke", "--no-plot",
       "--routes", "explicit"]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "GDNBENCH_FAKE_SLOW_S": "2"}


def _start(out: Path, *extra):
    """A run in its own process group, as `timeout` starts one (its signal reaches the workers too)."""
    return subprocess.Popen([*RUN, "--out", str(out), *extra], cwd=ROOT, env=_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_rows(jpath: Path, n: int, proc, limit_s: float = 240):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if jpath.exists() and len(journal.read(jpath)[1]) >= n:
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    pytest.fail(f"no {n} journaled rows within {limit_s} s")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_stop_signal_writes_what_was_measured_and_resume_finishes(tmp_path, sig):
    out = tmp_path / "r.json"
    proc = _start(out, "--backends", "reference,tests.fakes:SlowFake")
    _wait_rows(journal.journal_path(out), 2, proc)  # a shape's rows come together, at its end
    assert not out.exists()  # no empty placeholder while running
    os.killpg(proc.pid, getattr(signal, sig))
    text = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + getattr(signal, sig), text
    assert f"interrupted by {sig}" in text and "Traceback" not in text
    doc = json.loads(out.read_text())
    assert doc["run"]["interrupted"] == f"interrupted by {sig}" and 1 <= len(doc["rows"]) < 8
    assert not journal.journal_path(out).exists()
    r = subprocess.run([*RUN[:3], "run", "--device", "cpu", "--no-plot", "--resume", str(out)], cwd=ROOT,
                       env={**_env(), "GDNBENCH_FAKE_SLOW_S": "0"}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    done = json.loads(out.read_text())
    assert len(done["rows"]) == 8 and done["run"]["interrupted"] is None
    whole = [x for x in doc["rows"] if sum(y["shape_id"] == x["shape_id"] for y in doc["rows"]) == 2]
    assert whole and [x for x in done["rows"] if x["shape_id"] in {y["shape_id"] for y in whole}] == whole


def test_a_stop_signal_during_the_journal_write_keeps_the_row():
    """The signal handler raises wherever the main thread is; one that lands while a row is being
    journaled must not drop that row from the document (the journal is removed once it is written)."""
    from types import SimpleNamespace

    from gdnbench.cli.run import _run_with_progress
    from gdnbench.data.journal import Stopped

    def journal_row(row):
        raise Stopped("SIGTERM")  # as if the signal arrived during the write

    objs = [_row("a", 1), _row("b", 1)]
    collected, stopped = _run_with_progress(SimpleNamespace(name="s"), 2,
                                            lambda on_row, on_shape: [on_row(o) for o in objs], journal_row)
    assert isinstance(stopped, Stopped) and collected == [Row.from_dict(objs[0])]


def test_a_killed_run_leaves_its_journal_and_resume_reads_it(tmp_path):
    out = tmp_path / "r.json"
    proc = _start(out, "--backends", "reference,tests.fakes:SlowFake", "--no-isolate")  # slow: killed mid-run
    _wait_rows(journal.journal_path(out), 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not out.exists()  # nothing at the final path: neither empty nor partial
    kept = journal.read(journal.journal_path(out))[1]
    r = subprocess.run([*RUN[:3], "run", "--device", "cpu", "--no-plot", "--resume",
                        str(journal.journal_path(out))], cwd=ROOT, env={**_env(), "GDNBENCH_FAKE_SLOW_S": "0"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    done = json.loads(out.read_text())
    assert [x["shape_id"] for x in done["rows"]] == [s for s in ("gdn_fixed_b2", "gdn_packed_gva3", "kda_fixed",
                                                                 "kda_packed_gva2") for _ in range(2)]
    assert done["rows"][0] == kept[0].to_dict()  # measured rows are kept, not re-measured
    assert not journal.journal_path(out).exists()


def test_every_row_skipped_exits_4(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([*RUN, "--out", str(out), "--backends", "tests.fakes:KdaOnlyFake", "--shape-id",
                        "gdn_fixed_b2", "--no-isolate"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "nothing measured" in r.stderr and "Traceback" not in r.stderr
    assert [x["status"] for x in json.loads(out.read_text())["rows"]] == ["skipped"]


def test_a_name_is_held_by_its_journal_never_by_an_empty_document(tmp_path):
    first = claim_path(tmp_path / "a.json")
    assert first == tmp_path / "a.json" and not first.exists() and journal.journal_path(first).exists()
    assert claim_path(tmp_path / "a.json") == tmp_path / "a-2.json"  # a running run's name is taken
    (tmp_path / "b.json").write_text("{}")
    assert claim_path(tmp_path / "b.json") == tmp_path / "b-2.json"  # so is a finished one's


def _row(shape_id: str, v: int) -> dict:
    return {"shape_id": shape_id, "family": "gdn", "backend": "fla", "route": "flag", "mode": "fwd",
            "status": "skipped", "reason": "not run", "v": v}


HEADER = {"schema_version": 1, "env": {}, "timing": {}, "run": {},
          "shape_set": {"name": "s", "hash": "sha256:x", "shapes": {"a": "", "b": "", "c": ""}}}


def test_journal_rows_of_a_shape_replace_the_documents_and_a_torn_line_is_dropped(tmp_path):
    doc = RunDocument.from_dict({**HEADER, "rows": [_row("a", 1), _row("b", 1)]})
    merged = fold_journal(doc, [Row.from_dict(_row("c", 2)), Row.from_dict(_row("b", 2))])
    assert [(r.shape_id, r.get("v")) for r in merged.rows] == [("a", 1), ("b", 2), ("c", 2)]
    j = tmp_path / "x.jsonl"
    j.write_text(json.dumps({"journal": 1, **HEADER}) + "\n" + json.dumps(_row("a", 1)) + "\n{\"shape_")
    header, rows = journal.read(j)
    assert header == RunDocument.from_dict({**HEADER, "rows": []}) and rows == [Row.from_dict(_row("a", 1))]


def test_a_journal_line_that_is_not_a_row_names_the_journal_and_the_line(tmp_path):
    j = tmp_path / "x.jsonl"
    j.write_text(json.dumps({"journal": 1, **HEADER}) + "\n" + json.dumps(_row("a", 1)) + "\n"
                 + json.dumps({**_row("b", 1), "status": "ok"}) + "\n")
    with pytest.raises(ResultsError, match=r"x.jsonl: line 3: field 'check': status 'ok' needs a passing check"):
        journal.read(j)


def test_resume_of_a_journal_without_header_is_one_line_error(tmp_path):
    (tmp_path / "x.jsonl").write_text(json.dumps(_row("a", 1)) + "\n")
    with pytest.raises(ResultsError, match="without its header"):
        load_resumable(tmp_path / "x.json")

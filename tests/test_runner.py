"""The isolated runner: one worker measures shape after shape; a crashed worker is replaced, its
crash is an `error` row, and the rows already written are kept."""

from gdnbench.bench import runner
from gdnbench.data.shapes import load
from gdnbench.bench.timing import TimingParams

SMOKE = load("smoke")
FAST = TimingParams(warmup=1, rounds=2, iters=2)


def _count_workers(monkeypatch):
    started = []
    init = runner.Worker.__init__

    def counting(self, device, env=None):
        init(self, device, env)
        started.append(self.child.proc.pid)

    monkeypatch.setattr(runner.Worker, "__init__", counting)
    return started


def test_one_worker_measures_every_shape(monkeypatch):
    started = _count_workers(monkeypatch)
    rows = runner.run_set(SMOKE, ["reference"], ["explicit"], device="cpu", check_tokens=64, params=FAST,
                          shape_ids=["gdn_fixed_b2", "kda_fixed", "kda_packed_gva2"], isolate=True)
    assert [(r["shape_id"], r["status"]) for r in rows] == [
        ("gdn_fixed_b2", "ok"), ("kda_fixed", "ok"), ("kda_packed_gva2", "ok")]
    assert len(started) == 1


def test_a_crashed_worker_is_replaced_and_its_crash_is_an_error_row(monkeypatch):
    started = _count_workers(monkeypatch)
    rows = runner.run_set(SMOKE, ["reference", "tests.fakes:CrashingFake"], ["explicit"], device="cpu",
                          check_tokens=64, params=FAST, shape_ids=["gdn_fixed_b2", "kda_fixed"], isolate=True)
    by = {(r["shape_id"], r["backend"]): r for r in rows}
    assert len(rows) == 4
    for sid in ("gdn_fixed_b2", "kda_fixed"):
        assert by[(sid, "reference")]["status"] == "ok"
        crash = by[(sid, "fake_crash")]
        assert crash["status"] == "error" and "code 17" in crash["reason"]
    # per shape: the shared worker dies before any row (rows come at a shape's end), so each backend is
    # re-run alone in a fresh worker: 3 workers a shape, never one reused after its crash
    assert len(started) == 6 and len(set(started)) == 6

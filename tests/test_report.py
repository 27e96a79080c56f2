"""Results files, report tables, geomeans, compare and plot on synthetic documents."""

import json
import math

import pytest

from gdnbench.analysis import compare as cmp, report as rep
from gdnbench.data import results
from gdnbench.data.records import Row, RunDocument


def row(shape, backend, route, wall=None, gpu=None, status="ok", reason=""):
    """A row as JSON: ok rows with a passing check and both times, incorrect ones with a failed check."""
    r = {"shape_id": shape, "family": "gdn", "backend": backend, "route": route, "mode": "fwd", "status": status,
         "reason": reason}
    if status in ("ok", "incorrect"):
        err = 1e-3 if status == "ok" else 0.3
        r["check"] = {"passed": status == "ok", "reason": reason, "err_o": err, "budget_o": 1e-2, "err_state": 1e-3,
                      "budget_state": 1e-2, "tokens": 64, "shortened": False}
    if status == "ok":
        r["wall"] = {"median_us": wall, "round_spread": 0.01}
        r["gpu"] = {"median_us": gpu, "round_spread": 0.01, "method": "graph"}
        r["host_bound"] = wall > 1.2 * gpu
    return r


def doc(rows, hash_="sha256:abc", run=None) -> RunDocument:
    return RunDocument.from_dict({
        "schema_version": results.SCHEMA_VERSION, "created_utc": "x", "env": {"device": "cuda"},
        "shape_set": {"name": "t", "version": 1, "hash": hash_, "shapes": {"a": "", "b": "", "c": ""}},
        "timing": {}, "run": run or {}, "rows": rows})


ROWS = [
    row("a", "fla", "explicit", 400, 200), row("a", "fla", "flag", 300, 200),
    row("a", "gdnbench", "explicit", 200, 100), row("a", "gdnbench", "fused_qk", 100, 50),
    row("b", "fla", "explicit", 800, 400), row("b", "fla", "flag", 800, 400),
    row("b", "gdnbench", "explicit", 400, 400), row("b", "gdnbench", "fused_qk", status="incorrect", reason="err 0.3"),
    row("c", "fla", "explicit", status="error", reason="illegal memory access"), row("c", "fla", "flag", 100, 100),
    row("c", "gdnbench", "explicit", 100, 100), row("c", "gdnbench", "fused_qk", 90, 80),
]


def test_geomean_of_is_the_nth_root_of_the_product_and_none_for_no_ratios():
    assert rep.geomean_of([2.0, 8.0]) == pytest.approx(4.0)
    assert rep.geomean_of([0.5, 2.0, 1.0]) == pytest.approx(1.0)
    assert rep.geomean_of([]) is None


def test_geomean_counts_and_exclusions():
    d = doc(ROWS)
    g = rep.geomean(d, "gdnbench:fused_qk/gdnbench:explicit", "gpu")
    assert g.count == 2 and g.total == 3
    assert g.value == pytest.approx(math.sqrt(0.5 * 0.8))
    assert g.excluded == ["b: gdnbench:fused_qk incorrect: err 0.3"]
    w = rep.geomean(d, "gdnbench:explicit/fla:explicit", "wall")
    assert w.count == 2 and w.value == pytest.approx(0.5) and "illegal memory access" in w.excluded[0]
    best = rep.geomean(d, "gdnbench:best/fla:best", "gpu")  # a: 50/200, b: 400/400, c: 80/100
    assert best.count == 3 and best.value == pytest.approx((0.25 * 1.0 * 0.8) ** (1 / 3))
    assert "1 over" not in g.text() and g.text().endswith("over 2/3 shapes, below 1 on 2")
    assert best.below_one == 2  # b: 400/400 is not below 1


def test_standard_pairs_follow_the_rows():
    pairs = rep.standard_pairs(doc(ROWS))
    for p in ("fla:flag/fla:explicit", "gdnbench:fused_qk/gdnbench:explicit", "gdnbench:explicit/fla:explicit",
              "gdnbench:fused_qk/fla:flag", "gdnbench:best/fla:best"):
        assert p in pairs
    assert not any("helion" in p for p in pairs)


def test_fused_routes_pair_with_flag_where_a_backend_has_no_explicit_row():
    rows = [row("a", "gdnbench", "flag", 200, 100), row("a", "gdnbench", "fused_q", 190, 95),
            row("a", "gdnbench", "fused_qk", 180, 90)]
    assert rep.standard_pairs(doc(rows)) == ["gdnbench:fused_q/gdnbench:flag", "gdnbench:fused_qk/gdnbench:flag"]
    assert rep.geomean(doc(rows), "gdnbench:fused_qk/gdnbench:flag", "gpu").value == pytest.approx(0.9)
    assert "gdnbench:flag/gdnbench:explicit" in rep.standard_pairs(doc(ROWS + [row("a", "gdnbench", "flag", 1, 1)]))


def test_a_report_without_pairs_has_no_geomean_table():
    titles = [t.title for t in rep.report_tables(doc([row("a", "gdnbench", "flag", 200, 100)]))]
    assert not any(t.startswith("geomean time ratios") for t in titles) and titles[0].startswith("t v1")


def test_standard_pairs_set_ours_against_the_leaders():
    rows = ROWS + [row("a", "flashqla", "flag", 150, 75), row("a", "fla-dispatch", "flag", 160, 80)]
    pairs = rep.standard_pairs(doc(rows))
    for p in ("gdnbench:best/flashqla:best", "gdnbench:fused_qk/flashqla:flag", "gdnbench:best/fla-dispatch:best"):
        assert p in pairs
    assert rep.geomean(doc(rows), "gdnbench:best/flashqla:best", "gpu").text() == "0.667 over 1/3 shapes, below 1 on 1"


def test_tuned_over_default_pairs_when_both_gdnbench_backends_ran():
    rows = ROWS + [row("a", "gdnbench-default", "explicit", 250, 125), row("a", "gdnbench-default", "fused_qk", 110, 60)]
    pairs = rep.standard_pairs(doc(rows))
    assert "gdnbench:explicit/gdnbench-default:explicit" in pairs and "gdnbench:best/gdnbench-default:best" in pairs
    g = rep.geomean(doc(rows), "gdnbench:best/gdnbench-default:best", "gpu")
    assert g.count == 1 and g.value == pytest.approx(50 / 60)
    assert "gdnbench-default" not in " ".join(rep.standard_pairs(doc(ROWS)))


def test_default_backend_ignores_the_tuning_cache():
    from gdnbench.backends import get

    from gdnbench.data.shapes import load

    by_id = {s.id: s for s in load("gdn-qwen6").shapes}
    b = get("gdnbench-default")
    assert b.name == "gdnbench-default"
    # the path is named: ops.one_pass's rule on the full shape
    assert b.config_label(by_id["h16_hv32_fixed8k"], "flag", "cuda") == "default; one pass"
    assert b.config_label(by_id["h2_hv8_serving"], "flag", "cuda") == "default; two kernels"


def test_tables_and_markdown():
    tables = rep.report_tables(doc(ROWS))
    titles = [t.title for t in tables]
    assert any("geomean" in t for t in titles) and any("correctness" in t for t in titles)
    time_t = tables[0]
    assert time_t.rows[0][0] == "a" and "200 / 100*" in time_t.rows[0]
    md = rep.to_markdown(tables)
    assert "| shape |" in md and "gdnbench:fused_qk/gdnbench:explicit" in md and "over 2/3 shapes" in md


def test_an_interrupted_run_says_so_and_names_the_shapes_it_never_measured():
    rows = [r for r in ROWS if r["shape_id"] == "a"] + [row("b", "fla", "fused_q", status="skipped", reason="no route")]
    notes = rep.time_table(doc(rows, run={"interrupted": "interrupted by SIGTERM"})).notes
    assert "run interrupted by SIGTERM after 5 rows; nothing measured on b, c (continue it with gdnbench run --resume)" \
        in notes
    assert not any("interrupted" in n for n in rep.time_table(doc(ROWS)).notes)


def test_compare_matches_rows_and_refuses_other_sets():
    a = doc(ROWS)
    faster = [dict(r, gpu={**r["gpu"], "median_us": r["gpu"]["median_us"] / 2}) if r["status"] == "ok" else r
              for r in ROWS]
    t = cmp.compare(a, doc(faster))[0]
    assert any("geomean B/A [gpu]: 0.500" in n for n in t.notes)
    with pytest.raises(cmp.CompareError, match="shape sets differ"):
        cmp.compare(a, doc(ROWS, hash_="sha256:def"))


def test_compare_says_whether_the_runs_shared_a_card():
    def on(uuid):
        d = doc(ROWS).to_dict()
        d["env"] = {"device": "cuda", "gpu": {"name": "NVIDIA H200", "uuid": uuid}}
        return RunDocument.from_dict(d)

    notes = cmp.compare(on("GPU-a"), on("GPU-b"))[0].notes
    assert any(n.startswith("different cards (A GPU-a, B GPU-b)") for n in notes)
    assert "both runs on card GPU-a" in cmp.compare(on("GPU-a"), on("GPU-a"))[0].notes
    assert not any("card" in n for n in cmp.compare(doc(ROWS), on("GPU-a"))[0].notes)  # a file names none


def test_card_uuid_reads_the_device_properties():
    class Props:
        uuid = "4b1d3c2e-0000-1111-2222-333344445555"

    assert results.card_uuid(Props()) == "4b1d3c2e-0000-1111-2222-333344445555"
    assert results.card_uuid(object()) is None


def test_results_round_trip_and_schema_refusal(tmp_path):
    d = doc(ROWS)
    p = results.write_atomic(d, tmp_path / "sub" / "r.json")
    assert results.load(p) == d and json.loads(p.read_text()) == d.to_dict()
    d2 = dict(d.to_dict(), schema_version=results.SCHEMA_VERSION + 1)
    (tmp_path / "old.json").write_text(json.dumps(d2))
    with pytest.raises(results.ResultsError, match="schema_version"):
        results.load(tmp_path / "old.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(results.ResultsError, match="not valid JSON"):
        results.load(tmp_path / "bad.json")
    bad_row = dict(d.to_dict(), rows=[dict(ROWS[0], status="fast")])
    (tmp_path / "badrow.json").write_text(json.dumps(bad_row))
    with pytest.raises(results.ResultsError, match="row 0: status"):
        results.load(tmp_path / "badrow.json")


def test_default_path_names_gpu_sha_and_set():
    env = {"device": "cuda", "gpu": {"name": "NVIDIA H200"}, "git": {"sha": "0123456789abcdef", "dirty": True}}
    p = results.default_path(env, "gdn-qwen6", "20261130T000000Z")
    assert p.parts[-2] == "nvidia-h200" and p.name == "20261130T000000Z_01234567-dirty_gdn-qwen6.json"
    assert results.default_path(env, "kda-legacy6", "20261130T000000Z", "fwd_bwd").name == (
        "20261130T000000Z_01234567-dirty_kda-legacy6-fwd_bwd.json")


def test_claim_path_gives_runs_started_in_the_same_second_their_own_files(tmp_path):
    named = tmp_path / "gpu" / "20261130T000000Z_01234567_kda-legacy6.json"
    first, second, third = (results.claim_path(named) for _ in range(3))
    assert first == named and second.name == "20261130T000000Z_01234567_kda-legacy6-2.json"
    assert third.name.endswith("-3.json")
    # the names are held by their journals, never by empty documents at the final paths
    assert all(p.with_suffix(".jsonl").exists() and not p.exists() for p in (first, second, third))


def test_plot_writes_png(tmp_path):
    from gdnbench.analysis.plot import plot

    out = plot(doc(ROWS), tmp_path / "c.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_the_chart_names_what_failed():
    from gdnbench.analysis.plot import missing_bars

    assert missing_bars(doc(ROWS)) == ["fla:explicit: error on 1/3", "gdnbench:fused_qk: incorrect on 1/3"]
    assert missing_bars(doc([r for r in ROWS if r["status"] == "ok"])) == []


def test_time_spent_counts_each_oracle_once():
    rows = [dict(row("a", "fla", "explicit", 2, 1), seconds={"oracle": 2.0, "check": 1.0, "timing": 3.0}),
            dict(row("a", "fla", "flag", 2, 1), seconds={"oracle": 2.0, "check": 0.5, "timing": 3.0}),
            dict(row("b", "fla", "flag", status="error", reason="boom"), seconds={"oracle": 1.0}),  # failed early
            row("c", "fla", "fused_q", status="skipped", reason="no such route")]
    assert rep.time_spent([Row.from_dict(r) for r in rows]) == {"oracle": 3.0, "check": 1.5, "timing": 6.0}



def test_kernel_table_splits_each_row_and_sums_the_tail():
    r1 = row("a", "gdnbench", "explicit", 200, 100)
    r1["kernels_us"] = {f"k{i}": float(10 - i) for i in range(10)}  # 10 kernels: 8 shown, 2 as 'other'
    r2 = row("a", "gdnbench", "fused_qk", 100, 50)  # no split: left out
    t = rep.kernel_table(doc([r1, r2]))
    assert len(t.rows) == 1
    shape, key, total, kernels = t.rows[0]
    assert (shape, key, total) == ("a", "gdnbench:explicit", "55.0")
    assert kernels.startswith("k0 10.0; k1 9.0") and kernels.endswith("other (2) 3.0")
    assert rep.kernel_table(doc([r2])) is None
    assert any(x.title.startswith("device time per kernel") for x in rep.report_tables(doc([r1, r2])))


def test_kernel_names_lose_templates_and_signatures():
    from gdnbench.bench.timing import kernel_name

    assert kernel_name("void at::native::vectorized_elementwise_kernel<4, Foo>(int, Bar)") == \
        "at::native::vectorized_elementwise_kernel"
    assert kernel_name("gram_solve_kernel") == "gram_solve_kernel"
    assert kernel_name("") == "?"
    assert len(kernel_name("x" * 100)) == 60


def test_bar_colors_one_hue_per_backend_and_shades_per_route():
    """Twelve backend:routes of five backends: tab10 per column repeated two backends' colours."""
    from gdnbench.analysis.plot import bar_colors

    cols = [(b, r) for b in ("fla", "gdnbench", "flashinfer", "fla-dispatch", "flashqla")
            for r in (("explicit", "flag", "fused_q", "fused_qk") if b == "gdnbench" else ("explicit", "flag"))]
    colors = dict(zip(cols, bar_colors(cols)))
    assert len(set(colors.values())) == len(cols)
    firsts = [colors[(b, "explicit")] for b in dict.fromkeys(b for b, _ in cols)]
    assert len(set(firsts)) == 5
    assert sum(colors[("gdnbench", "fused_qk")]) > sum(colors[("gdnbench", "explicit")])  # later routes lighter


def test_a_pair_given_twice_is_listed_once():
    table = rep.geomean_table(doc(ROWS), ["gdnbench:best/fla:best", "fla:flag/fla:explicit", "gdnbench:best/fla:best"])
    assert [r[0] for r in table.rows] == ["gdnbench:best/fla:best", "fla:flag/fla:explicit"]


def test_fusion_table_puts_each_fused_route_against_explicit_less_the_norm_it_drops():
    e = row("a", "gdnbench", "explicit", 200, 100)
    e["kernels_us"] = {"loop": 60.0, "l2norm_kernel": 20.0, "gram": 20.0}  # floor of fused_qk: 80, of fused_q: 90
    q = row("a", "gdnbench", "fused_q", 200, 100)
    q["kernels_us"] = {"loop": 62.0, "l2norm_kernel": 10.0, "gram": 20.0}  # 92 against 60 + 20 + 10
    qk = row("a", "gdnbench", "fused_qk", 200, 100)
    qk["kernels_us"] = {"loop": 64.0, "gram": 24.0}  # 88 against 80
    bad = row("b", "gdnbench", "fused_qk", status="incorrect", reason="err 0.3")
    skipped = row("a", "flashqla", "fused_q", status="skipped", reason="no such route")
    t = rep.fusion_table(doc([e, q, qk, bad, skipped]))
    assert [r[1:] for r in t.rows[:2]] == [["gdnbench:fused_q", "92.0", "90.0", "1.022", "loop +2.0"],
                                           ["gdnbench:fused_qk", "88.0", "80.0", "1.100", "loop +4.0; gram +4.0"]]
    assert t.rows[2:] == [["geomean (1/2)", "gdnbench:fused_q", "", "", "1.022", ""],
                          ["geomean (1/2)", "gdnbench:fused_qk", "", "", "1.100", ""]]
    assert t.notes == ["b: gdnbench:fused_qk left out (gdnbench:fused_qk incorrect)"]
    assert rep.fusion_table(doc([e])) is None
    assert any(x.title.startswith("fused routes against") for x in rep.report_tables(doc([e, q, qk])))


def test_fusion_table_takes_the_floor_from_flag_where_the_run_has_no_explicit_row():
    f = row("a", "gdnbench", "flag", 200, 100)
    f["kernels_us"] = {"loop": 60.0, "l2norm_kernel": 20.0, "gram": 20.0}
    qk = row("a", "gdnbench", "fused_qk", 200, 100)
    qk["kernels_us"] = {"loop": 64.0, "gram": 24.0}
    e = row("b", "gdnbench", "explicit", status="incorrect", reason="err 0.3")
    f_b = row("b", "gdnbench", "flag", 200, 100)
    f_b["kernels_us"] = dict(f["kernels_us"])
    qk_b = row("b", "gdnbench", "fused_qk", 200, 100)
    qk_b["kernels_us"] = dict(qk["kernels_us"])
    t = rep.fusion_table(doc([f, qk, e, f_b, qk_b]))
    assert t.rows[0][1:] == ["gdnbench:fused_qk", "88.0", "80.0", "1.100", "loop +4.0; gram +4.0"]
    # an explicit row that failed keeps its shape out: flag stands in only where explicit is absent
    assert t.notes == ["b: gdnbench:fused_qk left out (gdnbench:explicit incorrect)",
                       "floor from gdnbench:flag on 1/2 shapes (no explicit row)"]
    assert rep.fusion_table(doc([qk])) is None  # no floor row at all

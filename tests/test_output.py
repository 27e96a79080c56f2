"""Report and compare output: --format markdown|csv|json parse, plain full-width tables when piped,
compare --fail-above exit codes."""

import csv
import io
import json

from typer.testing import CliRunner

from gdnbench.analysis import compare as cmp
from gdnbench.cli import app as cli
from gdnbench.cli.app import EXIT_ABOVE_LIMIT, EXIT_BAD_INPUT, app
from tests.test_report import ROWS, doc, row

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def write(path, rows, hash_="sha256:abc"):
    d = doc(rows, hash_).to_dict()
    d["env"]["git"] = {"sha": None, "dirty": None}
    path.write_text(json.dumps(d))
    return path


def test_report_formats_parse(tmp_path):
    f = write(tmp_path / "a.json", ROWS)
    r = invoke("report", f, "--format", "json")
    assert r.exit_code == 0, r.output
    tables = json.loads(r.stdout)["tables"]
    times = next(t for t in tables if t["title"].startswith("t v1: time"))
    assert [row["shape"] for row in times["rows"]] == ["a", "b", "c"]
    assert set(times["rows"][0]) == set(times["columns"]) and "fla:explicit" in times["columns"]

    r = invoke("report", f, "--format", "csv")
    assert r.exit_code == 0, r.output
    lines = [x for x in csv.reader(io.StringIO(r.stdout)) if x]
    headers = [x for x in lines if x[0] == "table"]
    assert len(headers) == len(tables)
    body = [x for x in lines if x[0] == times["title"]]
    assert [x[1] for x in body] == ["a", "b", "c"]
    assert all(len(x) == len(times["columns"]) + 1 for x in body)

    out = tmp_path / "sub" / "r.md"
    r = invoke("report", f, "--format", "markdown", "--out", out)
    assert r.exit_code == 0 and out.exists()
    text = out.read_text()
    assert text.count("### ") == len(tables) and "| shape |" in text


def test_report_rejects_an_unknown_format(tmp_path):
    r = invoke("report", write(tmp_path / "a.json", ROWS), "--format", "xml")
    assert r.exit_code == EXIT_BAD_INPUT and "--format 'xml'" in r.output


def test_piped_tables_are_plain_and_unwrapped(tmp_path, monkeypatch):
    """At 80 columns Rich would fold 'fla:explicit' into fragments; piped output keeps whole cells."""
    monkeypatch.setattr(cli.console, "_width", 80)
    long_reason = "a reason long enough that a boxed table at 80 columns would have to wrap it " * 2
    rows = ROWS + [row("a", "helion", "explicit", status="skipped", reason=long_reason)]
    r = invoke("report", write(tmp_path / "a.json", rows))
    assert r.exit_code == 0, r.output
    assert "│" not in r.stdout and "┃" not in r.stdout
    assert "fla:explicit" in r.stdout and long_reason.strip() in r.stdout
    assert max(len(x) for x in r.stdout.splitlines()) > 150


def test_env_keeps_every_reason_whole(monkeypatch):
    from gdnbench import backends as registry

    monkeypatch.setattr(cli.console, "_width", 80)
    r = invoke("env", "--device", "cpu")
    assert r.exit_code == 0, r.output
    reasons = [registry.get(n).is_available().reason for n in registry.REGISTRY]
    assert any(len(x) > 60 for x in reasons)
    for reason in reasons:
        assert reason in r.stdout


def test_compare_fail_above_exit_codes(tmp_path):
    a = write(tmp_path / "a.json", ROWS)
    slower = [dict(x, wall={**x["wall"], "median_us": x["wall"]["median_us"] * 1.2},
                   gpu={**x["gpu"], "median_us": x["gpu"]["median_us"] * 1.2}) if x["status"] == "ok" else x
              for x in ROWS]
    b = write(tmp_path / "b.json", slower)
    assert invoke("compare", a, b).exit_code == 0
    assert invoke("compare", a, b, "--fail-above", "1.25").exit_code == 0
    r = invoke("compare", a, b, "--fail-above", "1.1")
    assert r.exit_code == EXIT_ABOVE_LIMIT and "geomean [wall]" in r.output
    assert invoke("compare", b, a, "--fail-above", "1.0").exit_code == 0  # B faster: ratios 1/1.2
    # one row much slower: the geomean stays under the limit, the row does not
    one = [dict(x, wall={**x["wall"], "median_us": x["wall"]["median_us"] * 3}) if (x["shape_id"], x["route"]) ==
           ("a", "flag") else x for x in ROWS]
    c = write(tmp_path / "c.json", one)
    assert invoke("compare", a, c, "--fail-above", "1.5").exit_code == 0
    r = invoke("compare", a, c, "--fail-above", "1.5", "--fail-rows")
    assert r.exit_code == EXIT_ABOVE_LIMIT and "a fla:flag [wall] 3.000" in r.output


def test_compare_ratios_geomean():
    a, b = doc(ROWS), doc([dict(x, wall={**x["wall"], "median_us": x["wall"]["median_us"] * 2})
                           if x["status"] == "ok" else x for x in ROWS])
    got = dict(cmp.compare_ratios(a, b))
    assert any(k.startswith("geomean [wall]") and abs(v - 2.0) < 1e-9 for k, v in got.items())
    assert any(k.startswith("geomean [gpu]") and abs(v - 1.0) < 1e-9 for k, v in got.items())


def test_maxnreg_lines_join_only_neighbours_tested_side_by_side():
    from gdnbench.autotune.report import tested_runs

    ticks = [64, 96, 104, 120, 128, 208, 256]
    assert tested_runs([96, 120, 208], ticks, 256) == []  # untested 104, 128 between: markers only
    assert tested_runs([120, 128, 256], ticks, 256) == [[120, 128]]  # never joined to 'none'
    assert tested_runs([64, 96, 104, 128, 208], ticks, 256) == [[64, 96, 104], [128, 208]]


def test_chart_legends_sit_outside_the_axes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gdnbench.analysis import plot as plot_mod

    seen = []
    real = plot_mod.save_figure

    def spy(fig, out):
        fig.canvas.draw()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None:
                box, area = legend.get_window_extent(), ax.get_window_extent()
                seen.append(box.x0 >= area.x1 or box.y0 >= area.y1)
        return real(fig, out)

    plot_mod.save_figure = spy
    try:
        plot_mod.plot(doc(ROWS), tmp_path / "c.png")
    finally:
        plot_mod.save_figure = real
        plt.close("all")
    assert seen == [True]
    assert (tmp_path / "c.png").stat().st_size > 0

"""The CLI through Typer's CliRunner: happy paths and one-line errors with exit codes."""

import json

import pytest
from typer.testing import CliRunner

from gdnbench.cli.app import EXIT_BAD_INPUT, EXIT_NO_DEVICE, app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_help_and_shapes_commands():
    assert invoke("--help").exit_code == 0
    r = invoke("shapes", "list")
    assert r.exit_code == 0 and "kda-legacy6" in r.output
    r = invoke("shapes", "show", "gdn-qwen6")
    assert r.exit_code == 0 and "h2_hv8_serving" in r.output
    r = invoke("shapes", "verify")
    assert r.exit_code == 0 and "FAIL" not in r.output


def test_bad_shape_file_is_one_line_exit_2(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('name="x"\nversion=1\nhash=""\n[[shape]]\nid="s"\nfamily="gdn"\nH=2\nHV=3\nK=16\nV=16\n'
                 'lens=[8]\nseed=1\n')
    r = invoke("shapes", "show", str(p))
    assert r.exit_code == EXIT_BAD_INPUT
    assert "field 'HV'" in r.output and "Traceback" not in r.output
    r = invoke("run", "--device", "cpu", "--shapes", str(p), "--backends", "reference")
    assert r.exit_code == EXIT_BAD_INPUT and "field 'HV'" in r.output


def test_run_without_cuda_points_to_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    r = invoke("run")
    assert r.exit_code == EXIT_NO_DEVICE and "--device cpu" in r.output


@pytest.mark.parametrize("args, words", [
    (("--backends", "nope"), "unknown backend 'nope'"),
    (("--routes", "sideways"), "unknown route 'sideways'"),
    (("--l2", "lukewarm"), "--l2"),
    (("--shapes", "no-such-set"), "no shape set 'no-such-set'"),
    (("--shapes", "smoke", "--shape-id", "gdn_fixed_b2,nope"), "--shape-id: nope in none of smoke"),
])
def test_run_bad_arguments(args, words):
    r = invoke("run", "--device", "cpu", *args)
    assert r.exit_code == EXIT_BAD_INPUT and words in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args, words", [
    (("--shapes", "no-such-set"), "no shape set 'no-such-set'"),
    (("--shapes", "smoke", "--backends", "nope"), "unknown backend 'nope'"),
])
def test_run_named_input_checked_before_the_device(args, words):
    """A wrong set or backend name is reported as such on any machine, not as a missing GPU."""
    r = invoke("run", *args)
    assert r.exit_code == EXIT_BAD_INPUT and words in r.output and "Traceback" not in r.output


def test_run_report_compare_plot_on_cpu(tmp_path):
    out = tmp_path / "smoke.json"
    r = invoke("run", "--device", "cpu", "--shapes", "smoke", "--backends", "reference", "--routes",
               "explicit,flag", "--shape-id", "gdn_fixed_b2,kda_fixed", "--out", str(out))
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["schema_version"] == 1 and d["shape_set"]["name"] == "smoke" and d["run"]["device"] == "cpu"
    assert {r["status"] for r in d["rows"]} == {"ok"} and len(d["rows"]) == 4
    assert all(set(x["seconds"]) == {"oracle", "check", "timing"} and min(x["seconds"].values()) >= 0
               for x in d["rows"])
    assert "2 shape(s) in" in r.output and "oracles" in r.output
    assert out.with_suffix(".png").exists()
    r = invoke("report", str(out), "--baseline", "fla:explicit")
    assert r.exit_code == EXIT_BAD_INPUT and "--baseline 'fla:explicit': not in this file" in r.output
    r = invoke("report", str(out), "--markdown", str(tmp_path / "r.md"))
    assert r.exit_code == 0 and "reference:flag/reference:explicit" in r.output
    assert "over 2/2 shapes" in (tmp_path / "r.md").read_text()
    slower = json.loads(out.read_text())  # B: every time doubled, one row dropped
    for row in slower["rows"]:
        row["wall"]["median_us"] *= 2
    dropped = slower["rows"].pop()
    (tmp_path / "b.json").write_text(json.dumps(slower))
    r = invoke("compare", str(out), str(tmp_path / "b.json"))
    assert r.exit_code == 0 and "geomean B/A [wall]: 2.000 over 3/4 rows" in r.output, r.output
    assert f"excluded {dropped['shape_id']} reference:{dropped['route']}: A ok, B missing" in r.output
    r = invoke("plot", str(out), "--out", str(tmp_path / "p.png"), "--kind", "wall")
    assert r.exit_code == 0 and (tmp_path / "p.png").exists()


def test_two_runs_into_one_folder_in_the_same_second_keep_both_files(tmp_path, monkeypatch):
    from gdnbench.data import results

    monkeypatch.setattr(results, "utc_stamp", lambda: "20261130T000000Z")
    args = ("run", "--device", "cpu", "--shapes", "smoke", "--backends", "reference", "--routes", "explicit",
            "--shape-id", "kda_fixed", "--no-plot", "--out", str(tmp_path))
    assert invoke(*args).exit_code == 0 and invoke(*args).exit_code == 0
    files = sorted(p.name for p in tmp_path.glob("*.json"))
    assert len(files) == 2 and sum(f.endswith("_smoke-2.json") for f in files) == 1, files
    assert all(json.loads((tmp_path / f).read_text())["rows"] for f in files)


def test_report_errors_are_one_line(tmp_path):
    r = invoke("report", str(tmp_path / "missing.json"))
    assert r.exit_code == EXIT_BAD_INPUT and "no such results file" in r.output
    other = tmp_path / "v0.json"
    other.write_text(json.dumps({"schema_version": 0, "env": {}, "shape_set": {}, "timing": {}, "rows": []}))
    r = invoke("report", str(other))
    assert r.exit_code == EXIT_BAD_INPUT and "schema_version 0" in r.output


def test_env_lists_backends():
    r = invoke("env", "--device", "cpu")
    assert r.exit_code == 0
    for name in ("gdnbench", "fla", "helion", "flashinfer", "reference"):
        assert name in r.output


def test_resume_measures_only_the_missing_shapes(tmp_path):
    out = tmp_path / "part.json"
    args = ("--device", "cpu", "--shapes", "smoke", "--backends", "reference", "--routes", "explicit,flag")
    r = invoke("run", *args, "--shape-id", "gdn_fixed_b2", "--out", str(out), "--no-plot")
    assert r.exit_code == 0, r.output
    first = json.loads(out.read_text())["rows"]
    r = invoke("run", "--device", "cpu", "--resume", str(out), "--shape-id", "gdn_fixed_b2,kda_fixed", "--no-plot")
    assert r.exit_code == 0, r.output
    assert "1 shape(s) to measure: kda_fixed" in r.output
    d = json.loads(out.read_text())
    assert [(x["shape_id"], x["route"]) for x in d["rows"]] == [
        ("gdn_fixed_b2", "explicit"), ("gdn_fixed_b2", "flag"), ("kda_fixed", "explicit"), ("kda_fixed", "flag")]
    assert d["rows"][:2] == first  # measured rows are kept as they were, never re-measured
    assert d["run"]["resumed"][0]["shapes"] == ["kda_fixed"] and d["run"]["interrupted"] is None
    r = invoke("run", "--device", "cpu", "--resume", str(out), "--shape-id", "gdn_fixed_b2,kda_fixed")
    assert r.exit_code == 0 and "nothing to resume" in r.output


def test_resume_on_another_card_says_so_and_records_the_card(tmp_path, monkeypatch):
    from gdnbench.data import results

    out = tmp_path / "part.json"
    args = ("--device", "cpu", "--shapes", "smoke", "--backends", "reference", "--routes", "explicit")
    assert invoke("run", *args, "--shape-id", "gdn_fixed_b2", "--out", str(out), "--no-plot").exit_code == 0
    d = json.loads(out.read_text())
    d["env"]["gpu"] = {"name": "Card", "uuid": "GPU-a"}
    out.write_text(json.dumps(d))
    real = results.capture_env
    card_b = {"name": "Card", "uuid": "GPU-b"}
    monkeypatch.setattr(results, "capture_env", lambda device: {**real(device), "gpu": card_b})
    r = invoke("run", "--device", "cpu", "--resume", str(out), "--shape-id", "gdn_fixed_b2,kda_fixed", "--no-plot")
    assert r.exit_code == 0, r.output
    assert "the file began on card GPU-a, this is GPU-b: its rows will come from two cards" in r.output
    assert json.loads(out.read_text())["run"]["resumed"][0]["gpu_uuid"] == "GPU-b"


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["shape_set"].update(hash="sha256:0"), "shape set hash"),
    (lambda d: d["env"]["git"].update(sha="0" * 40), "measured with git.sha '" + "0" * 40),
    (lambda d: d["env"]["git"].update(dirty=not d["env"]["git"]["dirty"]), "measured with git.dirty"),
    (lambda d: d["env"]["versions"].update(torch="0.0"), "measured with versions.torch '0.0', here"),
])
def test_resume_refuses_another_context(tmp_path, edit, words):
    out = tmp_path / "part.json"
    r = invoke("run", "--device", "cpu", "--shapes", "smoke", "--backends", "reference", "--routes", "explicit",
               "--shape-id", "gdn_fixed_b2", "--out", str(out), "--no-plot")
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    edit(d)
    out.write_text(json.dumps(d))
    r = invoke("run", "--device", "cpu", "--resume", str(out))
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = invoke("run", "--device", "cpu", "--resume", str(out), "--out", str(tmp_path / "x.json"))
    assert r.exit_code == 2 and "leave out --out" in r.output

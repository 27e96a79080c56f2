"""Every class of bad input: exit code 2, one line naming the file / field / value, no traceback.

Each case builds its input under tmp_path and returns the command line; the same command on the
good input it was derived from must succeed (so a case cannot pass by failing for another reason).
"""

import json
from glob import glob
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnbench.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
GOOD_TOML = ('name = "x"\nversion = 1\nhash = ""\n[[shape]]\nid = "s"\nfamily = "gdn"\nH = 2\nK = 16\nV = 16\n'
             'lens = [8]\nseed = 1\n')


def _results(mode: str) -> Path:
    """A committed results file of kda-legacy6 in ``mode`` (both modes exist in the same set) with an ok row and,
    for fwd, a skipped one (the cases edit both)."""
    need = {"ok", "skipped"} if mode == "fwd" else {"ok"}
    for f in sorted(glob(str(ROOT / "results" / "*" / "*kda-legacy6*.json"))):
        d = json.loads(Path(f).read_text())
        if (d.get("run") or {}).get("mode", "fwd") == mode and need <= {r["status"] for r in d["rows"]}:
            return Path(f)
    pytest.skip(f"no committed kda-legacy6 {mode} results file")


def _doc(tmp_path, edit, name="bad.json") -> str:
    d = json.loads(_results("fwd").read_text())
    edit(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


def _ok_row(d):
    return next(r for r in d["rows"] if r["status"] == "ok")


def _skipped_row(d):
    return next(r for r in d["rows"] if r["status"] == "skipped")


def _failed_but_timed(d):
    """An ok row turned incorrect (its check failed) that still carries its times."""
    r = _ok_row(d)
    r.update(status="incorrect", check={**r["check"], "passed": False})


def _binary(tmp_path) -> str:
    p = tmp_path / "blob.bin"
    p.write_bytes(bytes(range(256)) * 4)
    return str(p)


def _toml(tmp_path, text, name="bad.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


READERS = {  # a command that reads a results file, as a function of that file
    "report": lambda f, tmp: ["report", f],
    "plot": lambda f, tmp: ["plot", f, "--out", str(tmp / "p.png")],
    "compare-a": lambda f, tmp: ["compare", f, str(_results("fwd"))],
    "compare-b": lambda f, tmp: ["compare", str(_results("fwd")), f],
}
SHAPE_READERS = {  # a command that reads a shape file
    "show": lambda f, tmp: ["shapes", "show", f],
    "freeze": lambda f, tmp: ["shapes", "freeze", f],
    "verify": lambda f, tmp: ["shapes", "verify", f],
    "run": lambda f, tmp: ["run", "--device", "cpu", "--shapes", f, "--backends", "reference"],
}
BAD_FILES = {
    "binary": lambda tmp: _binary(tmp),
    "directory": lambda tmp: str(tmp),
}
BAD_DOCS = {  # edit of a good results document -> the word the error names
    "rows-not-a-list": (lambda d: d.update(rows=5), "'rows'"),
    "rows-not-objects": (lambda d: d.update(rows=[1, 2]), "row 0"),
    "env-not-object": (lambda d: d.update(env="x"), "'env'"),
    "run-not-object": (lambda d: d.update(run=[1]), "'run'"),
    "shape_set-not-object": (lambda d: d.update(shape_set="kda"), "'shape_set'"),
    "shape_set-without-hash": (lambda d: d["shape_set"].pop("hash"), "shape_set.hash"),
    "median-a-string": (lambda d: _ok_row(d)["wall"].update(median_us="fast"), "wall.median_us"),
    "median-negative": (lambda d: _ok_row(d)["wall"].update(median_us=-3.0), "wall.median_us"),
    "median-zero": (lambda d: _ok_row(d)["gpu"].update(median_us=0), "gpu.median_us"),
    "shape_id-an-int": (lambda d: _ok_row(d).update(shape_id=7), "'shape_id'"),
    "check-a-string": (lambda d: _ok_row(d).update(check="passed"), "'check'"),
    "status-unknown": (lambda d: _ok_row(d).update(status="great"), "status 'great'"),
    "ok-with-a-failed-check": (lambda d: _ok_row(d)["check"].update(passed=False), "field 'check.passed': status 'ok'"),
    "ok-without-check": (lambda d: _ok_row(d).pop("check"), "field 'check': status 'ok' needs a passing check"),
    "ok-without-gpu": (lambda d: _ok_row(d).update(gpu=None), "field 'gpu': status 'ok' needs its gpu time"),
    "incorrect-with-a-time": (_failed_but_timed, "field 'wall': status 'incorrect' carries no time"),
    "skipped-without-reason": (lambda d: _skipped_row(d).update(reason=""), "status 'skipped' needs a reason"),
    "first_call_ms-a-string": (lambda d: _ok_row(d).update(first_call_ms="slow"),
                               "field 'first_call_ms': expected a number, got a string 'slow'"),
    "route-unknown": (lambda d: _ok_row(d).update(route="sideways"), "route 'sideways' is not one of"),
    "shape-not-in-the-set": (lambda d: _ok_row(d).update(shape_id="h1"), "'h1' is not a shape of set"),
}
BAD_TOMLS = {  # shape-file text -> the word the error names
    "shape-not-a-table": ('name = "x"\nversion = 1\nhash = ""\nshape = [1, 2]\n', "shape #0"),
    "H-absurd": (GOOD_TOML.replace("H = 2", "H = 100000000000000000000000"), None),
    "lens-absurd": (GOOD_TOML.replace("lens = [8]", "lens = [1000000000000]"), "'lens'"),
    "bytes-absurd": (GOOD_TOML.replace("H = 2", "H = 65536").replace("lens = [8]", "lens = [100000000]"),
                     "TiB"),
    "no-shapes-brackets-kept": ('name = "x"\nversion = 1\nhash = ""\n', "no [[shape]] entries"),
    "hash-missing": (GOOD_TOML.replace('hash = ""\n', ""), "gdnbench shapes freeze"),
    "defaults-brackets-kept": ('name = "x"\nversion = 1\nhash = ""\ndefaults = 3\n[[shape]]\nid = "s"\n',
                               "[defaults] must be a table"),
}


def cases():
    out = []
    for fname, make in BAD_FILES.items():
        for cmd, argv in {**READERS, **{f"shapes-{k}": v for k, v in SHAPE_READERS.items()}}.items():
            out.append(pytest.param(lambda tmp, m=make, a=argv: (a(m(tmp), tmp), None), id=f"{fname}-{cmd}"))
    for dname, (edit, word) in BAD_DOCS.items():
        for cmd, argv in READERS.items():
            out.append(pytest.param(lambda tmp, e=edit, a=argv, w=word: (a(_doc(tmp, e), tmp), w),
                                    id=f"{dname}-{cmd}"))
    for tname, (text, word) in BAD_TOMLS.items():
        for cmd in ("show", "run"):
            out.append(pytest.param(lambda tmp, t=text, c=cmd, w=word: (SHAPE_READERS[c](_toml(tmp, t), tmp), w),
                                    id=f"{tname}-{cmd}"))
    out += [
        pytest.param(lambda tmp: (["report", str(_results("fwd")), "--pair", "garbage"], "--pair 'garbage'"),
                     id="report-pair-garbage"),
        pytest.param(lambda tmp: (["report", str(_results("fwd")), "--pair", "nope:explicit/fla:explicit"],
                                  "nope:explicit"), id="report-pair-absent"),
        pytest.param(lambda tmp: (["report", str(_results("fwd")), "--mode", "sideways"], "--mode 'sideways'"),
                     id="report-mode"),
        pytest.param(lambda tmp: (["plot", str(_results("fwd")), "--out", str(tmp / "p.png"), "--kind", "cpu"],
                                  "--kind 'cpu'"), id="plot-kind"),
        pytest.param(lambda tmp: (["env", "--device", "gpu"], "--device 'gpu'"), id="env-device"),
        pytest.param(lambda tmp: (["run", "--device", "gpu"], "--device 'gpu'"), id="run-device"),
        pytest.param(lambda tmp: (["run", "--device", "cpu", "--helion-effort", "max"], "--helion-effort"),
                     id="run-helion-effort"),
        pytest.param(lambda tmp: (["run", "--device", "cpu", "--mode", "bwd"], "--mode 'bwd'"), id="run-mode"),
        *[pytest.param(lambda tmp, o=o, v=v: (["run", "--device", "cpu", o, v], f"{o} {v}: use a value of at least"),
                       id=f"run{o}") for o, v in (("--iters", "0"), ("--rounds", "-3"), ("--warmup", "-1"),
                                                   ("--check-tokens", "-5"), ("--worker-timeout", "-1.0"))],
        pytest.param(lambda tmp: (["autotune", "--device", "gpu", "--dry-run"], "--device 'gpu'"),
                     id="autotune-device"),
        pytest.param(lambda tmp: (["autotune", "--family", "mamba", "--dry-run"], "--family 'mamba'"),
                     id="autotune-family"),
        pytest.param(lambda tmp: (["compare", str(_results("fwd")), str(_results("fwd")), "--fail-above", "-1"],
                                  "--fail-above -1.0: use a value of at least 0"), id="compare-fail-above"),
        pytest.param(lambda tmp: (["compare", str(_results("fwd")), str(_results("fwd_bwd"))], "modes differ"),
                     id="compare-fwd-vs-fwd_bwd"),
        pytest.param(lambda tmp: (["report", str(tmp / "a[red]b" / "x.json")], "a[red]b"), id="path-brackets-kept"),
    ]
    return out


@pytest.mark.parametrize("make", cases())
def test_bad_input_is_one_line_exit_2(tmp_path, make):
    argv, word = make(tmp_path)
    r = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and isinstance(r.exception, (SystemExit, type(None)))
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    if word:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("argv", [
    lambda tmp: ["report", str(_results("fwd"))],
    lambda tmp: ["compare", str(_results("fwd")), str(_results("fwd"))],
    lambda tmp: ["plot", str(_results("fwd")), "--out", str(tmp / "p.png")],
    lambda tmp: ["shapes", "show", _toml(tmp, GOOD_TOML)],
    lambda tmp: ["env", "--device", "cpu"],
], ids=["report", "compare", "plot", "show", "env"])
def test_the_good_inputs_the_cases_derive_from_succeed(tmp_path, argv):
    r = runner.invoke(app, argv(tmp_path), env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("argv, words", [
    (["run", "--iters", "abc"], "gdnbench run: Invalid value for '--iters'"),
    (["run", "--no-such-option"], "gdnbench run: No such option: --no-such-option"),
    (["sideways"], "gdnbench: No such command 'sideways'"),
    (["run", "--device", "cpu", "--iters", "0"], "--iters 0: use a value of at least 1"),
], ids=["not-a-number", "unknown-option", "unknown-command", "out-of-range"])
def test_the_command_says_what_its_parser_refuses_in_one_line(capsys, argv, words):
    """`gdnbench` (cli.app.main): what typer's parser refuses gets the one line every other bad input gets, not
    typer's boxed usage message."""
    from gdnbench.cli.app import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], err


def test_the_command_without_a_subcommand_prints_its_help(capsys):
    from gdnbench.cli.app import main

    with pytest.raises(SystemExit):
        main(["shapes"])
    out, err = capsys.readouterr()
    assert "Usage: gdnbench shapes" in out + err and "error:" not in out + err

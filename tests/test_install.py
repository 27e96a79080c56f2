"""An installed gdnbench: package data in the wheel, user cache before shipped winners, results under the
working directory, and the git commit recorded only for gdnbench's own checkout."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gdnbench import paths
from gdnbench.data import results
from gdnbench.data import shapes as shp
from gdnbench.kernels import cache_key, tuned

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from this tree (no network: the installed setuptools builds it)."""
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {r.stderr.strip()[-300:]}")
    [whl] = out.glob("gdnbench-*.whl")
    return whl


def test_wheel_carries_every_shape_set_and_tuned_winner(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for p in paths.SHAPE_SETS_DIR.iterdir():
        if p.suffix in (".toml", ".json"):
            assert f"gdnbench/shape_sets/{p.name}" in names, p.name
    shipped = sorted(paths.SHIPPED_TUNED_DIR.glob("*/*.json"))
    assert shipped, "no shipped tuned winners"
    for p in shipped:
        assert f"gdnbench/kernels/tuned_configs/{p.parent.name}/{p.name}" in names, p
    assert "gdnbench/kernels/kda16_prep.cu" in names  # compiled at first use (kernels/kda16_cuda.py)


def test_the_package_list_in_pyproject_is_every_package_of_the_tree():
    """pyproject.toml lists the packages (it maps shapes/ to gdnbench.shape_sets): a new subpackage must be added."""
    import tomllib

    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "gdnbench").rglob("__init__.py")}
    assert set(listed) == found | {"gdnbench.shape_sets"}
    assert paths.SHAPE_SETS_DIR == REPO / "shapes"  # this checkout's sets, not an installed copy


def test_unpacked_wheel_loads_every_shipped_set_and_the_winners(wheel, tmp_path):
    """From a folder that is no checkout: every set loads and verifies, the winners are read."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import json, gdnbench, gdnbench.data.shapes as s, gdnbench.kernels.tuned as t\n"
            "import gdnbench.data.results as r\n"
            "sets = {n: s.load(n) for n in s.available()}\n"
            "bad = [p for ss in sets.values() for p in s.verify(ss, s.ledger_for(ss))]\n"
            "rows = [e for d in t.read_dirs() for f in d.glob('*/*.json') for e in t.load_entries(f)]\n"
            "print(json.dumps({'file': gdnbench.__file__, 'sets': sorted(sets), 'bad': bad, 'entries': len(rows),"
            " 'git': r.git_info()}))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GDNBENCH_GIT_SHA", "GDNBENCH_GIT_DIRTY")}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["file"].startswith(str(site))
    assert got["sets"] == sorted(shp.available()) and "smoke" in got["sets"]
    assert got["bad"] == []
    assert got["entries"] > 0
    assert got["git"] == {"sha": None, "dirty": None, "source": "installed"}


def test_user_cache_is_read_before_the_shipped_winners(tmp_path, monkeypatch):
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    assert tuned.write_dir() == tmp_path / "cache" / "tuned"
    assert tuned.read_dirs() == [tmp_path / "cache" / "tuned", paths.SHIPPED_TUNED_DIR]
    assert tuned.read_dirs(user) == [user]
    shape = shp.load("smoke").shapes[0]
    env = {"gpu": "Fake GPU", "compute_capability": "9.0", "triton": "3.6.0"}
    key = cache_key.entry_key(env, "state", shape, "plain")
    tuned.save_entry(shipped, {"key": key, "kernel": "state", "best": {"config": {"BV": 32}, "time_us": 1.0}})
    assert tuned.find_entry([user, shipped], env, "state", shape, "plain")["best"]["config"] == {"BV": 32}
    tuned.save_entry(user, {"key": key, "kernel": "state", "best": {"config": {"BV": 64}, "time_us": 0.5}})
    assert tuned.find_entry([user, shipped], env, "state", shape, "plain")["best"]["config"] == {"BV": 64}


def test_user_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.user_cache_dir() == tmp_path / "xdg" / "gdnbench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.user_cache_dir() == tmp_path / "home" / ".cache" / "gdnbench"
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "mine"))
    assert paths.user_tuned_dir() == tmp_path / "mine" / "tuned"


def test_results_default_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"device": "cpu", "git": {"sha": None, "dirty": None}, "versions": {"gdnbench": "0.1.0"}}
    p = results.default_path(env, "smoke", "20261130T000000Z")
    assert p == tmp_path / "results" / "cpu" / "20261130T000000Z_v0.1.0_smoke.json"


def test_decode_sets_are_not_named_twice_by_mode():
    env = {"device": "cpu", "git": {"sha": "0123456789", "dirty": False}}
    assert results.default_path(env, "gdn-decode", "S", "decode").name == "S_01234567_gdn-decode.json"
    assert results.default_path(env, "smoke", "S", "decode").name == "S_01234567_smoke-decode.json"
    assert results.default_path(env, "smoke", "S", "fwd_bwd").name == "S_01234567_smoke-fwd_bwd.json"


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _checkout(root: Path, project: str) -> Path:
    """A git repository at ``root`` whose pyproject names ``project``, with a gdnbench/ folder."""
    (root / "gdnbench").mkdir(parents=True)
    (root / "gdnbench" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(f'[project]\nname = "{project}"\nversion = "0"\n')
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    return root


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_is_recorded_only_for_gdnbench_own_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("GDNBENCH_GIT_SHA", raising=False)
    monkeypatch.delenv("GDNBENCH_GIT_DIRTY", raising=False)
    own = _checkout(tmp_path / "own", "gdnbench")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=own, capture_output=True, text=True).stdout.strip()
    assert results.source_checkout(own / "gdnbench") == own.resolve()
    assert results.git_info(own / "gdnbench") == {"sha": sha, "dirty": False, "source": "checkout"}
    # another project's repository holding an installed gdnbench (a venv inside it)
    other = _checkout(tmp_path / "other", "someproject")
    site = other / "venv" / "site-packages" / "gdnbench"
    site.mkdir(parents=True)
    assert results.git_info(site) == {"sha": None, "dirty": None, "source": "installed"}
    assert results.git_info(other / "gdnbench") == {"sha": None, "dirty": None, "source": "installed"}
    # a venv inside a gdnbench checkout: the installed copy is not the checkout's gdnbench/
    inner = own / ".venv" / "site-packages" / "gdnbench"
    inner.mkdir(parents=True)
    assert results.source_checkout(inner) is None
    # no repository at all
    bare = tmp_path / "bare" / "gdnbench"
    bare.mkdir(parents=True)
    assert results.git_info(bare)["source"] == "installed"


def test_freeze_writes_the_ledger_beside_a_user_set(tmp_path):
    p = tmp_path / "mine.toml"
    shutil.copy(shp.available()["smoke"], p)
    p.write_text(p.read_text().replace('name = "smoke"', 'name = "mine"'))
    ss = shp.load_file(p)
    assert any("not recorded" in x for x in shp.verify(ss, shp.ledger_for(ss)))
    shp.freeze(p)
    assert json.loads((tmp_path / shp.FROZEN_LEDGER).read_text())["mine"]
    assert "mine" not in shp.load_ledger()  # the shipped ledger is untouched
    ss = shp.load_file(p)
    assert shp.verify(ss, shp.ledger_for(ss)) == []

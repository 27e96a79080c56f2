"""`pytest -m gpu tests/` (or any mark expression that selects GPU tests only) collects the GPU tests without the
modules that switch Triton's interpreter on."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import selects_only_gpu, switches_interpreter_on

TESTS = Path(__file__).parent
# collects as `pytest -m gpu tests/` does, then prints the collected ids and the interpreter switch as it stands
_COLLECT = """import os, sys, pytest
class Report:
    def pytest_collection_finish(self, session):
        print("ids", *[i.nodeid for i in session.items])
        print("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET"))
sys.exit(pytest.main(["-p", "no:cacheprovider", "--collect-only", "-q", "-m", sys.argv[1], "tests"],
                     plugins=[Report()]))
"""


def test_every_module_that_switches_the_interpreter_on_is_recognized():
    setters = [p for p in TESTS.glob("*.py") if re.search(r"^os\.environ.*TRITON_INTERPRET", p.read_text(), re.M)]
    assert len(setters) >= 5
    for p in setters:
        assert switches_interpreter_on(p.read_text()), p.name
    assert not switches_interpreter_on((TESTS / "conftest.py").read_text())  # it names the patterns, sets nothing


@pytest.mark.parametrize("markexpr, only_gpu", [
    ("gpu", True), ("gpu and not slow", True), ("(gpu)", True), ("gpu and (slow or not slow)", True),
    ("not (not gpu)", True), ("gpu or slow", False), ("not slow", False), ("slow", False), ("", False),
    ("gpu and", False),  # not an expression: only "gpu" itself counts
])
def test_which_mark_expressions_select_gpu_tests_only(markexpr, only_gpu):
    assert selects_only_gpu(markexpr) is only_gpu


@pytest.mark.parametrize("markexpr", ["gpu", "gpu and not interpreter"])
def test_gpu_selection_leaves_the_interpreter_off(markexpr):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COLLECT, markexpr], capture_output=True, text=True,
                         cwd=TESTS.parent, env=env, timeout=300).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(("ids ", "TRITON_INTERPRET ")))
    assert "tests/test_gpu.py::test_small_heads_on_the_gpu" in lines.get("ids", ""), out[-2000:]
    assert lines.get("TRITON_INTERPRET") == "None", out[-2000:]

"""docs/adding-a-backend.md's example, as written: its adapter is loaded as gdnbench.backends.mylib and its CPU
test runs against it, so the guide cannot drift from the interface it describes."""

import re
import sys
import types
from pathlib import Path

import gdnbench.backends

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-a-backend.md"


def _block(marker: str) -> str:
    """The guide's one python block that contains ``marker``."""
    [code] = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if marker in b]
    return code


def test_the_guide_s_adapter_passes_its_own_test(monkeypatch):
    module = types.ModuleType("gdnbench.backends.mylib")
    module.__package__ = "gdnbench.backends"
    exec(compile(_block("class MyLibBackend"), f"{DOC}:adapter", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(gdnbench.backends, "mylib", module, raising=False)
    test = {}
    exec(compile(_block("def test_mylib"), f"{DOC}:test", "exec"), test)
    test["test_mylib_passes_the_gate_through_a_fake"](monkeypatch)

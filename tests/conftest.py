import itertools
import os
import re

import pytest

# Rich sizes its consoles from COLUMNS when they are created (gdnbench.cli.app's, at import): wide enough
# that table cells are not wrapped, also in pytest-xdist workers, whose stdout is not a terminal.
os.environ["COLUMNS"] = "250"
# pytest-xdist runs one worker per core, and each worker's torch (OpenMP) and BLAS pools would take every core too:
# on 2 cores, test_train.py and test_journal.py took 103 s with the default pools, 26 s with one thread per worker.
# Set before torch loads; the subprocesses tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# what gdnbench writes at run time (autotune entries, Helion configs) goes to a throwaway user cache, never
# the developer's ~/.cache/gdnbench
if "GDNBENCH_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["GDNBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="gdnbench-test-cache-")


# how the CPU kernel tests switch Triton's interpreter on, at import, before triton is first imported
_INTERPRETER_ON = ('os.environ["TRITON_INTERPRET"] = "1"', 'os.environ.setdefault("TRITON_INTERPRET", "1")')


def switches_interpreter_on(text: str) -> bool:
    """Whether a module's source sets the interpreter at module level (a line of its own, not a mention in a string)."""
    return any(re.search("^" + re.escape(s), text, re.M) for s in _INTERPRETER_ON)


_MARK_WORDS = ("and", "or", "not")
_MARK_NAMES_MAX = 10  # beyond this many other marks, only the plain "gpu" expression counts


def selects_only_gpu(markexpr: str) -> bool:
    """Whether ``-m markexpr`` is false for every test without the gpu mark, whatever its other marks ("gpu",
    "gpu and not slow": yes; "gpu or slow", "not slow": no).  Uses pytest's own expression parser; where that
    is missing or moved, only the expression "gpu" counts."""
    if not markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression

        expr = Expression.compile(markexpr)
    except Exception:
        return markexpr.strip() == "gpu"
    names = sorted({w for w in re.findall(r"[\w:+\-.\[\]\\/]+", markexpr) if w not in _MARK_WORDS} - {"gpu"})
    if len(names) > _MARK_NAMES_MAX:
        return markexpr.strip() == "gpu"
    for bits in itertools.product((False, True), repeat=len(names)):
        marks = dict(zip(names, bits))
        if expr.evaluate(lambda name, /, **kwargs: marks.get(name, False)):
            return False
    return True


def pytest_ignore_collect(collection_path, config):
    """Where ``-m`` selects GPU tests only, leave out the modules that switch Triton's interpreter on: once one is
    imported, every kernel the process compiles runs interpreted, and the GPU tests ran so (on an H100 six of the
    first nine failed and the run was cut at 400 s)."""
    if collection_path.suffix != ".py" or not selects_only_gpu(config.getoption("markexpr", "") or ""):
        return None
    return True if switches_interpreter_on(collection_path.read_text(encoding="utf-8")) else None


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the mark, not a keyword (a parameter id "gpu" is one)
            item.add_marker(skip)


@pytest.fixture
def bf16_interpreter(monkeypatch):
    """bf16 under TRITON_INTERPRET=1 as the GPU computes it: Triton's interpreter (3.6 to 3.9) multiplies a bf16
    dot's operands as their raw 16-bit patterns and truncates fp32 -> bf16 casts; patched for one test, the
    operands are widened to fp32 and the casts rounded to nearest even (torch's).  Skips where the interpreter's
    internals differ."""
    import numpy as np
    import torch

    interp = pytest.importorskip("triton.runtime.interpreter")
    import triton.language as tl

    builder = getattr(interp, "InterpreterBuilder", None)
    if builder is None or not all(hasattr(x, n) for x, n in ((interp, "_convert_float"), (interp, "TensorHandle"),
                                                               (builder, "create_dot"), (builder, "cast_impl"))):
        pytest.skip("this Triton's interpreter has other internals")
    dot, cast = builder.create_dot, builder.cast_impl

    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        return interp.TensorHandle(interp._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32),
                                   tl.float32)

    def create_dot(self, a, b, d, *rest):
        return dot(self, widen(a), widen(b), d, *rest)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return interp.TensorHandle(t.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    monkeypatch.setattr(builder, "create_dot", create_dot)
    monkeypatch.setattr(builder, "cast_impl", cast_impl)

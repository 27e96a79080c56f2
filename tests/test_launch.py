"""gdnbench.kernels.launch: the direct launch of a cached compiled kernel, with a fake kernel and
driver (no GPU): what its cache key separates, and that a hit passes the arguments in the
kernel's parameter order."""

import pytest
import torch

from gdnbench.kernels import launch as L


def test_arg_key_separates_what_triton_specializes_on():
    t = torch.zeros(64, dtype=torch.float32)
    assert L._arg_key(t) == (torch.float32, True)
    assert L._arg_key(t[1:]) == (torch.float32, False)  # 4 bytes in: not 16-byte aligned
    assert L._arg_key(t.half()) != L._arg_key(t)
    assert L._arg_key(None) is None
    assert len({L._arg_key(v) for v in (1, 16, 17, 32, 2**31)}) == 4  # 16 and 32 share a key
    assert L._arg_key(16) == L._arg_key(32)
    assert L._arg_key(0.5) == L._arg_key(2.0)
    with pytest.raises(L._Unkeyable):
        L._arg_key("a string")


class FakeCompiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *values):
        return None

    def run(self, g0, g1, g2, stream, function, packed_metadata, launch_metadata, enter, exit_, *values):
        self.runs.append(((g0, g1, g2), stream, values))


class FakeKernel:
    """A JIT kernel's interface as launch uses it: kernel[grid](...) compiles and launches."""

    arg_names = ["x", "n", "A", "B"]

    def __init__(self):
        self.jit_calls = []
        self.compiled = []

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            self.compiled.append(FakeCompiled())
            return self.compiled[-1]
        return jit


class FakeDriver:
    class active:
        @staticmethod
        def get_current_device():
            return 0

        @staticmethod
        def get_current_stream(device):
            return 123


class FakeKnobs:
    class runtime:
        launch_enter_hook = launch_exit_hook = None


@pytest.fixture
def fake_api(monkeypatch):
    monkeypatch.setattr(L, "_direct_launch_api", lambda: (FakeKernel, FakeDriver, FakeKnobs))
    monkeypatch.setattr(L, "_COMPILED", {})


def test_second_launch_runs_the_compiled_kernel_directly(fake_api):
    k, x = FakeKernel(), torch.zeros(8)
    opts = {"num_warps": 4, "num_stages": 2}
    first = L.launch(k, (3, 2), (x, 64), {"B": 5, "A": True}, opts)
    again = L.launch(k, (7,), (x, 80), {"B": 5, "A": True}, opts)
    assert len(k.jit_calls) == 1 and again is first
    assert first.runs == [((7, 1, 1), 123, (x, 80, True, 5))]  # constexprs in parameter order


def test_a_new_specialization_goes_through_the_jit_path(fake_api):
    k, x = FakeKernel(), torch.zeros(8)
    opts = {"num_warps": 4, "num_stages": 2}
    L.launch(k, (1,), (x, 64), {"A": 1, "B": 2}, opts)
    L.launch(k, (1,), (x[1:], 64), {"A": 1, "B": 2}, opts)  # unaligned pointer
    L.launch(k, (1,), (x, 65), {"A": 1, "B": 2}, opts)  # not divisible by 16
    L.launch(k, (1,), (x, 64), {"A": 1, "B": 3}, opts)  # another constexpr
    L.launch(k, (1,), (x, 64), {"A": 1, "B": 2}, {"num_warps": 8, "num_stages": 2})
    L.launch(k, (1,), (x, 64), {"A": 1, "B": 2}, opts)  # the first again: a hit
    assert len(k.jit_calls) == 5 and len(k.compiled[0].runs) == 1


def test_jit_path_when_turned_off(monkeypatch):
    monkeypatch.setattr(L, "_COMPILED", {})
    monkeypatch.setenv("GDNBENCH_JIT_LAUNCH", "1")
    L._direct_launch_api.cache_clear()
    try:
        assert L._direct_launch_api() is None
        k = FakeKernel()
        for _ in range(2):
            L.launch(k, (1,), (torch.zeros(4), 3), {"A": 1, "B": 2}, {})
        assert len(k.jit_calls) == 2 and not L._COMPILED
    finally:
        L._direct_launch_api.cache_clear()

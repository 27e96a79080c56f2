"""GPU checks (skipped without CUDA): real backends through the gate and both timers."""

import pytest

from gdnbench import backends
from gdnbench.runner import run_set
from gdnbench.shapes import Shape, ShapeSet
from gdnbench.timing import TimingParams

pytestmark = pytest.mark.gpu

SMALL = ShapeSet("gpu-small", 1, "", "", (
    Shape(id="gdn", family="gdn", H=2, HV=4, K=128, V=128, lens=(300, 200), seed=7, gate="logsigmoid",
          initial_state=True),
    Shape(id="kda", family="kda", H=4, HV=4, K=128, V=128, lens=(512,), seed=8, gate="bounded", lower_bound=-5.0),
), families=("gdn", "kda"))


@pytest.mark.parametrize("name", ["fla", "gdnbench"])
def test_backend_passes_gate_and_gets_both_times(name):
    b = backends.get(name)
    if not b.is_available():
        pytest.skip(b.is_available().reason)
    rows = run_set(SMALL, [name], ["explicit", "flag"], device="cuda", check_tokens=512,
                   params=TimingParams(warmup=2, rounds=2, iters=5), isolate=False)
    for r in rows:
        if r["status"] == "skipped":
            continue
        assert r["status"] == "ok", r
        assert r["gpu"]["median_us"] > 0 and r["wall"]["median_us"] > 0 and r["profiler_us"] > 0

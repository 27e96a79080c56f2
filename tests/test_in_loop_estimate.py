"""The in_loop estimate (gdnbench/analysis/in_loop.py): bytes, FLOP growth, break-even, bad input."""
import pytest

from gdnbench.analysis import in_loop
from gdnbench.analysis.roofline import make_calib
from gdnbench.data.shapes import load

SHAPES = {s.id: s for s in load("gdn-qwen6").shapes}
CALIB = make_calib(4e12, 800e12)


def test_bytes_saved_by_hand():
    s = SHAPES["h16_hv32_fixed8k"]  # T 8192, H 16, HV 32, K = V = 128, bf16
    w_u = 2 * 8192 * 32 * (128 + 128) * 2
    assert in_loop.bytes_saved(s, "wu") == w_u + 8192 * 16 * 128 * 2 + 4 * 8192 * 32
    aqk = 2 * 8192 * 32 * 64 * 2 + 2 * 8192 * 16 * 128 * 2 + 4 * 8192 * 32
    assert in_loop.bytes_saved(s, "wu_aqk") - in_loop.bytes_saved(s, "wu") == aqk


def test_loop_growth_and_steps():
    e = in_loop.estimate(SHAPES["h16_hv32_fixed8k"], "wu", CALIB)
    assert e.growth == pytest.approx(1024 / 896)  # (6 K + 4 C) / (6 K + 2 C) at K = V = 128, C = 64
    assert in_loop.estimate(SHAPES["h16_hv32_fixed8k"], "wu_aqk", CALIB).growth == pytest.approx(1536 / 896)
    assert in_loop.loop_steps(SHAPES["h16_hv32_fixed8k"]) == 128  # 128 programs: the sequence's 128 chunks
    assert in_loop.loop_steps(SHAPES["h16_hv48_uniform"]) == -(-4 * 48 * 128 // 132)  # programs outnumber SMs
    assert e.break_even is None and e.net_us is None


def test_break_even_from_a_measured_split():
    split = {"state_out_kernel": 200.0, "wu_kernel": 80.0, "aqk_kernel": 40.0}
    e = in_loop.estimate(SHAPES["h16_hv32_fixed8k"], "wu", CALIB, split)
    assert e.break_even == pytest.approx(1.4)
    lo, hi = e.net_us
    assert lo == pytest.approx(e.added_at_peak_us - 80) and hi == pytest.approx((1024 / 896 - 1) * 200 - 80)
    assert in_loop.estimate(SHAPES["h16_hv32_fixed8k"], "wu_aqk", CALIB, split).break_even == pytest.approx(1.6)
    run = {"rows": [{"shape_id": "a", "backend": "gdnbench", "route": "flag", "kernels_us": split},
                    {"shape_id": "b", "backend": "fla", "route": "flag", "kernels_us": split}]}
    assert in_loop.measured_split(run) == {"a": split}


def test_bad_input_exit_2(capsys, tmp_path):
    assert in_loop.main(["--set", "no-such-set"]) == 2
    bad = tmp_path / "calib.json"
    bad.write_text('{"bandwidth_bytes_per_s": -1, "matmul_flops_per_s": 1}')
    assert in_loop.main(["--calib", str(bad)]) == 2
    assert "bandwidth_bytes_per_s" in capsys.readouterr().err
    assert in_loop.main([]) == 0

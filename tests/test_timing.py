"""The statistics every reported time rests on: median (not min or mean), percentiles, per-round
medians and their spread, and the host-bound margin."""

import pytest

from gdnbench.bench import timing


def test_summarize_reports_the_median_not_the_min_or_mean():
    s = timing.summarize([5.0, 1.0, 3.0, 100.0, 4.0])
    assert s["median_us"] == 4.0  # min 1, mean 22.6: an outlier must not move the headline number
    assert (s["min_us"], s["mean_us"], s["n"]) == (1.0, 22.6, 5)
    assert (s["p20_us"], s["p80_us"]) == (3.0, 5.0)
    assert s["samples_us"] == [5.0, 1.0, 3.0, 100.0, 4.0]  # in measurement order
    assert timing.summarize([2.0, 8.0])["median_us"] == 5.0  # even count: mean of the middle two


def test_summarize_keeps_each_rounds_median_and_their_spread():
    s = timing.summarize([3.0, 1.0, 2.0, 30.0, 10.0, 20.0], round_size=3)
    assert s["round_medians_us"] == [2.0, 20.0]
    assert s["round_spread"] == pytest.approx((20.0 - 2.0) / 11.0)
    assert timing.summarize([1.0, 2.0, 3.0], round_size=3)["round_spread"] == 0.0


@pytest.mark.parametrize("wall, gpu, expected", [
    (100.0, 100.0, False),
    (110.0, 100.0, False),   # 10 % over: within the margin
    (119.0, 100.0, False),
    (121.0, 100.0, True),    # 21 % over: the host set the pace
    (300.0, 100.0, True),
    (90.0, 100.0, False),    # wall below gpu is never host-bound
    (50.0, 0.0, False),      # no gpu time: no verdict
])
def test_host_bound_is_wall_over_gpu_by_more_than_the_margin(wall, gpu, expected):
    assert timing.HOST_BOUND_MARGIN == pytest.approx(0.20)
    assert timing.host_bound(wall, gpu) is expected

"""common.vec_max's sm_100 form (a flattening tl.max, taken where cuda_capability_geq(10)) under the
interpreter, which otherwise runs the sm_90 form: every fused route gives bit-for-bit the sm_90 form's
outputs on inputs that take each branch the vector max decides (zero rows; q and k rows of 1e30,
whose sums of squares reach the rare path's 2^100; raw q k^T products of 1e40, which overflow aqk's
gram and make the output kernel redo its program; KDA's k row of 1e7 under the lowest gates)."""

import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from gdnbench.kernels import common  # noqa: E402
from gdnbench.kernels.ops import chunk_gdn, chunk_kda, default_config  # noqa: E402

from .test_ops_gdn import make_inputs, rel_rms  # noqa: E402
from .test_ops_gdn import reference as gdn_reference  # noqa: E402
from .test_ops_kda import make_inputs as kda_inputs  # noqa: E402
from .test_ops_kda import reference as kda_reference  # noqa: E402


def _both_forms(monkeypatch, run):
    """run() with the sm_90 form, then with the sm_100 form; fails unless the latter was taken."""
    plain = run()
    asked = []

    def blackwell(major, minor=0):
        asked.append((major, minor))
        return True

    monkeypatch.setattr(common, "cuda_capability_geq", blackwell)
    flat = run()
    assert asked, "the sm_100 form was never reached"
    return plain, flat


def _gdn_inputs():
    q, k, v, g, beta, s0 = make_inputs(1, 100, 1, 2, 32, 16, torch.float32, h0=True, seed=3)
    q[0, [3, 40]] = 0
    k[0, [5, 41]] = 0
    q[0, [2, 66]] *= 1e30  # sums of squares overflow: row_rstd's rare path
    k[0, 66] *= 1e30
    k[0, 7] *= 1e10  # q_2 k_7^T ~ 1e40 overflows fp32: aqk's redo, the output kernel's redo
    return q, k, v, g, beta, s0


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("norm", ["fused_q", "fused_qk"])
def test_gdn_fused_routes_same_bits(monkeypatch, norm, one_pass):
    q, k, v, g, beta, s0 = _gdn_inputs()
    cfg = dataclasses.replace(default_config(32, 16, 4), one_pass=one_pass)

    def run():
        return chunk_gdn(q, k, v, g, beta, initial_state=s0, output_final_state=True, norm=norm, config=cfg)

    (o0, f0), (o1, f1) = _both_forms(monkeypatch, run)
    assert torch.equal(o0, o1) and torch.equal(f0, f1)
    ro, rf = gdn_reference(q, k, v, g, beta, initial_state=s0)
    assert rel_rms(o1, ro) < 1e-4 and rel_rms(f1, rf) < 1e-4, (rel_rms(o1, ro), rel_rms(f1, rf))
    assert (o1[0, [3, 40]] == 0).all()


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
@pytest.mark.parametrize("norm", ["fused_q", "fused_qk"])
def test_kda_fused_routes_same_bits(monkeypatch, norm):
    q, k, v, g, beta, _ = kda_inputs(1, 100, 1, 1, 32, 16, torch.float32, seed=9)
    q[0, [3, 40]] = 0
    q[0, [2, 66]] *= 1e30
    k[0, [7, 40]] *= 1e30
    g[0, 64:80] = -5.0
    k[0, 79] *= 1e7  # raw row times its e^75 gate factor overflows: kda_intra's redo on normalized rows

    def run():
        return chunk_kda(q, k, v, g, beta, output_final_state=True, norm=norm, lower_bound=-5.0)

    (o0, f0), (o1, f1) = _both_forms(monkeypatch, run)
    assert torch.equal(o0, o1) and torch.equal(f0, f1)
    ro, rf = kda_reference(q, k, v, g, beta)
    assert rel_rms(o1, ro) < 1e-4 and rel_rms(f1, rf) < 1e-4, (rel_rms(o1, ro), rel_rms(f1, rf))
    assert (o1[0, [3, 40]] == 0).all()

"""What GDN's opt-in in_loop forms (``GDNConfig.in_loop``, kernels/fused_fwd.py) save and cost, per shape, from
bytes and FLOPs only: the estimate to check against the H200's timing of `gdnbench-fusedwu`.

    python -m gdnbench.analysis.in_loop [--set gdn-qwen6] [--run RUN.json] [--calib calibration.json]

Bytes saved (HBM, per forward; each tensor crosses HBM once per kernel that reads it: the V-slab programs
of one head run side by side and share their reads through L2; q, k per key head, as the roofline counts):

    "wu":      w and u, written by the w/u kernel and read by the loop   2 T HV (K + V) e
               the w/u kernel's k and g_cs reads                         T H K e + 4 T HV
               (its A, v and beta reads move into the loop: no change)
    "wu_aqk":  also Aqk, written and read                                2 T HV C e
               the aqk kernel's q, k and g_cs reads                      2 T H K e + 4 T HV

FLOPs (tensor-core, full tiles as the kernels issue them, per chunk and value head): today's loop does
w h, q h, k^T v_new (2 C K V each) and Aqk v_new (2 C^2 V); "wu" adds A x (2 C^2 V: +14 % at K = V = 128)
and takes the w/u kernel's 2 C^2 (K + V) away; "wu_aqk" adds q k^T per V slab, V / BV times 2 C^2 K
(+57 % more at BV 32), and takes the aqk kernel's 2 C^2 K away.  The added work sits in the serial loop.

Time: ``memory_us`` is the saved bytes at the calibrated copy rate.  The loop's added time lies between
``added_at_peak_us`` (the added FLOPs at one SM's share of the matmul rate, over the loop's chunk steps:
the longest sequence's chunks or, where programs outnumber SMs, total program-chunks / SMs) and
``growth`` x the measured loop time (the loop slowing in proportion to its FLOPs).  With a run, the
break-even growth is 1 + (the measured time of the kernels the form removes) / (the loop's measured time):
the form wins where its loop grows by less.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..data.shapes import Shape
from .roofline import CHUNK, FP32, _elem, chunk_lens, rates, seq_lens

FORMS = ("wu", "wu_aqk")
REMOVED = {"wu": ("wu_kernel",), "wu_aqk": ("wu_kernel", "aqk_kernel")}  # kernels a form takes away
LOOP_KERNEL = "state_out_kernel"
SMS = 132  # H200
BV = 32  # the loop's default V slab (kernels/config.py fused_out)


@dataclass(frozen=True)
class Estimate:
    shape: str
    form: str
    bytes_saved: int
    memory_us: float
    loop_flops: int  # today's loop, whole shape
    added_flops: int  # in the loop, whole shape
    growth: float  # loop FLOPs after / before
    added_at_peak_us: float
    measured_loop_us: float | None = None
    measured_removed_us: float | None = None

    @property
    def net_us(self) -> tuple[float, float] | None:
        """The forward's change (negative: faster), from the removed kernels' measured time and the loop's added
        time between ``added_at_peak_us`` and (growth - 1) x its measured time."""
        if not self.measured_loop_us or self.measured_removed_us is None:
            return None
        lo, hi = self.added_at_peak_us, (self.growth - 1) * self.measured_loop_us
        return min(lo, hi) - self.measured_removed_us, max(lo, hi) - self.measured_removed_us

    @property
    def break_even(self) -> float | None:
        if not self.measured_loop_us or self.measured_removed_us is None:
            return None
        return 1 + self.measured_removed_us / self.measured_loop_us


def bytes_saved(shape: Shape, form: str) -> int:
    T, H, HV, K, V, e = shape.tokens, shape.H, shape.HV, shape.K, shape.V, _elem(shape)
    out = 2 * T * HV * (K + V) * e + T * H * K * e + FP32 * T * HV
    if form == "wu_aqk":
        out += 2 * T * HV * CHUNK * e + 2 * T * H * K * e + FP32 * T * HV
    return out


def loop_flops_per_chunk(K: int, V: int, form: str | None, bv: int = BV) -> int:
    """Tensor-core FLOPs of one chunk step for one value head (all its V slabs), full tiles."""
    C = CHUNK
    f = 6 * C * K * V + 2 * C * C * V
    if form in FORMS:
        f += 2 * C * C * V
    if form == "wu_aqk":
        f += -(-V // bv) * 2 * C * C * K
    return f


def loop_steps(shape: Shape, bv: int = BV) -> int:
    """Chunk steps the loop takes one after another: the longest sequence's, or total program-chunks over the
    SMs where the programs (V slabs x sequences x value heads, one per SM) outnumber them."""
    chunks = [-(-L // CHUNK) for L in seq_lens(shape)]
    slabs = -(-shape.V // bv)
    return max(max(chunks), -(-slabs * shape.HV * sum(chunks) // SMS))


def estimate(shape: Shape, form: str, calib: dict, kernels_us: dict | None = None) -> Estimate:
    bandwidth, matmul = rates(calib)
    n_chunks = len(chunk_lens(shape))
    K, V, HV = shape.K, shape.V, shape.HV
    today = loop_flops_per_chunk(K, V, None)
    added = loop_flops_per_chunk(K, V, form) - today
    per_program = added / -(-V // BV)
    saved = bytes_saved(shape, form)
    loop_us = removed_us = None
    if kernels_us and LOOP_KERNEL in kernels_us:
        loop_us = kernels_us[LOOP_KERNEL]
        removed_us = sum(kernels_us.get(k, 0.0) for k in REMOVED[form])
    return Estimate(shape.id, form, saved, saved / bandwidth * 1e6, today * HV * n_chunks, added * HV * n_chunks,
                    (today + added) / today, loop_steps(shape) * per_program / (matmul / SMS) * 1e6, loop_us,
                    removed_us)


def measured_split(run: dict, backend: str = "gdnbench", route: str = "flag") -> dict[str, dict]:
    """{shape id: the profiler's per-kernel µs} of a run document's rows of ``backend`` on ``route``."""
    return {r["shape_id"]: r["kernels_us"] for r in run.get("rows", [])
            if r.get("backend") == backend and r.get("route") == route and r.get("kernels_us")}


def table(shapes: list[Shape], calib: dict, split: dict[str, dict]) -> str:
    head = ("| shape | form | HBM MB saved | at copy rate µs | loop FLOPs growth | added at peak µs | "
            "loop µs (run) | removed µs (run) | break-even growth | net µs |")
    lines = [head, "|" + "---|" * 10]
    for s in shapes:
        for form in FORMS:
            e = estimate(s, form, calib, split.get(s.id))
            cells = [s.id, form, f"{e.bytes_saved / 1e6:.1f}", f"{e.memory_us:.1f}", f"{e.growth:.3f}",
                     f"{e.added_at_peak_us:.1f}", _num(e.measured_loop_us), _num(e.measured_removed_us),
                     "" if e.break_even is None else f"{e.break_even:.2f}",
                     "" if e.net_us is None else f"{e.net_us[0]:+.1f} .. {e.net_us[1]:+.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(x) -> str:
    return "" if x is None else f"{x:.1f}"


def main(argv=None) -> int:
    from ..data.shapes import ShapeError, load
    from .roofline import H200_FIELD_NOTES, RooflineError

    ap = argparse.ArgumentParser(prog="python -m gdnbench.analysis.in_loop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="gdn-qwen6", help="a shape set (GDN)")
    ap.add_argument("--run", help="a run document (JSON) whose gdnbench flag rows give the measured split")
    ap.add_argument("--calib", help="a calibration JSON (default: the H200 field notes' rates)")
    a = ap.parse_args(argv)
    try:
        shapes = [s for s in load(a.set).shapes if s.family == "gdn" and not s.decode]
        calib = json.loads(Path(a.calib).read_text()) if a.calib else H200_FIELD_NOTES
        rates(calib)
        split = measured_split(json.loads(Path(a.run).read_text())) if a.run else {}
    except (OSError, ValueError, ShapeError, RooflineError) as e:
        print(f"in_loop: {e}", file=sys.stderr)
        return 2
    print(table(shapes, calib, split))
    return 0


if __name__ == "__main__":
    sys.exit(main())

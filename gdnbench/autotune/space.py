"""The search space of one stage kernel for one shape.

Space. Per kernel: its block sizes (BR for l2norm; BK and/or BV for the others, powers of two
from 16 up to the head size rounded up to a power of two: larger blocks are clamped by the
kernel to the same code), num_warps 1..16, num_stages 1..4 (1 for l2norm, which has no loop)
and maxnreg: None (the compiler's choice) plus caps 64, 72, .., 248 (every multiple of 8 that
ptxas accepts between 64 and 255); fused_out also its segments per sequence (1, 2, 4, 8) and
split_v (at 4 or 8 segments), early_beta and beta_ahead, and under fused_qk k_rstd_tile and
c_last_from_tile; aqk early_gates; gram and aqk heads_first; kda16_prep also tf32_grams (its BK:
the K channels a step), generic_t and, under the fused routes, mma_sums. Points that
:func:`gdnbench.kernels.config.validate` rejects (the same function the defaults pass, asked
through :func:`~gdnbench.kernels.config.kernel_check`, its per-kernel part) - shared memory,
block divisibility, register file - are pruned before anything runs. The other kernels keep
the shape's default config.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Callable

from ..kernels import tuned
from ..kernels.config import SEGMENTS
from ..vocab import dtype_bytes


KERNELS = tuned.KERNELS
MAXNREG_CAPS = tuple(range(64, 256, 8))  # 64, 72, ..., 248
MAXNREG_VALUES = (None,) + MAXNREG_CAPS
WARPS = (1, 2, 4, 8, 16)
STAGES = (1, 2, 3, 4)
BR_VALUES = (1, 2, 4, 8, 16, 32, 64)
BLOCKS = (16, 32, 64, 128, 256)

Point = dict  # dimension name -> value, in the space's dimension order


def _blocks_for(dim: int) -> tuple[int, ...]:
    """Block sizes that give distinct code for a head dimension (larger ones are clamped)."""
    top = 1 << max(dim - 1, 0).bit_length()
    return tuple(b for b in BLOCKS if b <= max(top, BLOCKS[0]))


def dimensions(kernel: str, K: int, V: int, variant: str = "plain") -> list[tuple[str, tuple]]:
    """The tuned dimensions of a kernel's variant and their values, in coordinate-descent order."""
    tail = [("num_warps", WARPS), ("num_stages", (1,) if kernel in ("l2norm", "kda16_prep") else STAGES),
            ("maxnreg", MAXNREG_VALUES)]
    if kernel == "l2norm":
        return [("BR", BR_VALUES)] + tail
    blocks = {"gram": ("BK",), "kda_intra": ("BK",), "wu": ("BK", "BV"), "state": ("BK", "BV"), "output": ("BK", "BV"),
              "output_fused": ("BK", "BV"), "aqk": ("BK",), "state_out": ("BK", "BV"), "fused_out": ("BK", "BV"),
              "kda_state_out": ("BK", "BV"), "kda16_prep": ("BK",), "kda16_loop": ("BV",)}[kernel]
    segs = {"fused_out": [("segments", SEGMENTS), ("split_v", (False, True))],
            "kda16_prep": [("tf32_grams", (False, True)), ("generic_t", (False, True))]}.get(kernel, [])
    # fused_out's beta load order first: one compile from the start point; faster at 5 of 8 shipped entries, slower at 1
    # (kernels/fused_fwd.py)
    first = {"fused_out": [("early_beta", (False, True)), ("beta_ahead", (False, True))],
             "aqk": [("early_gates", (False, True)), ("heads_first", (False, True))],
             "gram": [("heads_first", (False, True))]}.get(kernel, [])
    if kernel == "kda16_prep" and variant != "plain":
        segs = segs + [("mma_sums", (False, True))]
    if kernel == "fused_out" and variant == "fused_qk":
        # where k's rstd comes from: its own vector or aqk's tile (H200, the loop alone, kernels/fused_fwd.py: the
        # tile searched 803 us at h16_hv32_fixed32k against 893; at 2 stages it cost 192 -> 346 at h16_hv48_uniform)
        # and, with the tile, where c_last comes from (H100: the loop 641.0 -> 609.9 us at h16_hv32_fixed32k, slower at
        # h4_hv8_mixed; kernels/fused_fwd.py)
        first = [("k_rstd_tile", (False, True)), ("c_last_from_tile", (False, True))] + first
    return first + [(b, _blocks_for(K if b == "BK" else V)) for b in blocks] + segs + tail


def restricted(space: "Space", names, anchor: Point) -> "Space":
    """``space`` searched over the dimensions ``names`` alone: every other one fixed at ``anchor``'s value (the
    start's where the anchor lacks it). The start stays the default config, so the entry still times it.
    Why: a fuse_k variant's anchors and first sweeps took a 12 s budget at six aqk searches, so its register
    cap (the last dimension) was never swept; its 25 values alone are one compile wave."""
    dims = [(d, v if d in names else (anchor.get(d, space.start[d]),)) for d, v in space.dims]
    return dataclasses.replace(space, dims=dims)


def dimension_names(kernel: str, variant: str = "plain") -> tuple[str, ...]:
    return tuple(d for d, _ in dimensions(kernel, 128, 128, variant))


def point_key(point: Point) -> tuple:
    return tuple(point.items())


@dataclass
class Space:
    """A kernel's search space for one shape: its dimensions, the start point, the validity test."""

    kernel: str
    dims: list[tuple[str, tuple]]
    start: Point
    is_valid: Callable[[Point], bool]

    def points(self):
        names = [d for d, _ in self.dims]
        for values in itertools.product(*(v for _, v in self.dims)):
            yield dict(zip(names, values))

    @property
    def total(self) -> int:
        return math.prod(len(v) for _, v in self.dims)

    def valid_points(self, limit: int | None = None) -> list[Point]:
        """The valid points in order, the first ``limit`` of them where given (a search only asks whether a space
        is small enough to try whole: fused_out's has 512 000 points)."""
        return list(itertools.islice((p for p in self.points() if self.is_valid(p)), limit))

    def pass_size(self) -> int:
        """Points one coordinate-descent pass visits at most."""
        return 1 + sum(len(v) - 1 for _, v in self.dims)


# the path pinned while a kernel of one path is tuned, so its gate runs that kernel (GDN: ops.one_pass; KDA:
# kda_state_out is the one pass)
_PATH_OF = {"aqk": True, "state_out": True, "fused_out": True, "kda_state_out": True, "state": False, "output": False,
            "output_fused": False}


def full_config(kernel: str, point: Point, base):
    """``base`` (a GDNConfig) with ``kernel``'s config replaced by the point's, and the path pinned to the
    one that runs ``kernel`` (ops.validate rejects GDN's one-pass path where it is not built)."""
    return dataclasses.replace(base, **{kernel: tuned.kernel_config(kernel, point)},
                               one_pass=_PATH_OF.get(kernel) if base.one_pass is None else base.one_pass,
                               in_loop=tuned.IN_LOOP_OF.get(kernel, base.in_loop),
                               kda_chunk16=kernel in tuned.KDA16_KERNELS or base.kda_chunk16)


def _start_point(kernel: str, base, dims, K: int, V: int) -> Point:
    """The base config of the kernel as a point, blocks clamped as the kernel clamps them."""
    from ..kernels.config import block, kda16_step, state_piece

    c = getattr(base, kernel)
    out = {}
    for name, _ in dims:
        v = getattr(c, name)
        if kernel in ("state", "state_out", "fused_out", "kda_state_out") and name == "BK":
            v = block(state_piece(c, K), K)
        elif kernel == "kda16_prep" and name == "BK":
            v = kda16_step(c, K)
        elif name in ("BK", "BV"):
            v = block(v, K if name == "BK" else V)
        out[name] = v
    return out


def build_space(kernel: str, K: int, V: int, dtype: str, family: str = "gdn", variant: str = "plain") -> Space:
    """The space of ``kernel``'s variant for head sizes K, V, a storage dtype and a family, pruned by validate()
    (KDA's kernels stream fp32 gate tiles too: their shared-memory estimates differ)."""
    from ..kernels.config import default_config, kernel_check

    elt = dtype_bytes(dtype)
    base = default_config(K, V, elt, family)
    dims = dimensions(kernel, K, V, variant)
    start = _start_point(kernel, base, dims, K, V)
    why_not = kernel_check(full_config(kernel, start, base), kernel, K, V, elt, family)

    def is_valid(point: Point) -> bool:
        try:
            return why_not(tuned.kernel_config(kernel, point)) is None
        except TypeError:  # a point naming no field of the kernel's config
            return False

    return Space(kernel, dims, start, is_valid)


@functools.lru_cache(maxsize=None)
def count_valid(kernel: str, K: int, V: int, dtype: str, family: str = "gdn", variant: str = "plain") -> int:
    return len(build_space(kernel, K, V, dtype, family, variant).valid_points())

"""Launch configurations of the chunked GDN and KDA forward kernels.

Every kernel takes its tunables from one frozen dataclass; :class:`GDNConfig`
collects them for both ops: KDA (``chunk_kda``) runs the same w/u, state and
output kernels with per-channel gates, under the same fields, plus its own
intra-chunk kernel (``kda_intra``).  Nothing is autotuned at call time: a
benchmark harness builds configs itself and checks them with :func:`validate`
(the single validity function) before timing.

Block sizes are *upper bounds*: a kernel uses ``min(BK, next_pow2(K))`` (and
likewise for BV), so the defaults are valid for every supported head size.
Head sizes are any K, V in [16, 256]: every kernel masks its K and V tiles
(``o_k < K``, ``o_v < V``), so a head of 60 or 100 runs the tiles of 64 or 128
with the columns past it zero (they add nothing to the dots, norms or the state).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

from ..vocab import FAMILIES

CHUNK_SIZE = 64  # BT, fixed: the intra-chunk solve is written for 4 sub-blocks of 16
SUB_CHUNK = 16  # BC: forward-substitution block of the (I + A)^-1 solve
MAX_HEAD_DIM = 256
SMEM_LIMIT_BYTES = 227 * 1024  # Hopper (H100/H200) opt-in shared memory per block
REGISTERS_PER_SM = 64 * 1024  # 32-bit registers per SM (and per block) on sm_70..sm_100

ONE_PASS_MAX_K = 128  # GDN's one-pass path (aqk + state_out) is built and measured up to K = 128
IN_LOOP_FORMS = (None, "wu", "wu_aqk")  # GDNConfig.in_loop
_BLOCKS = (16, 32, 64, 128, 256)
_WARPS = (1, 2, 4, 8, 16)
SEGMENTS = (1, 2, 4, 8)  # KernelConfig.segments (fused_out)


@dataclass(frozen=True)
class KernelConfig:
    """Tunables of one Triton kernel.  ``BK``/``BV`` are None where a kernel has no such block."""

    BK: int | None = None
    BV: int | None = None
    num_warps: int = 4
    num_stages: int = 2
    maxnreg: int | None = None
    # fused_out only: segments each sequence's chunks are cut into, one program per segment (context parallelism,
    # kernels/fused_fwd.py); exact to 2^-32 for unit-norm k rows, which every route gives the loop
    segments: int = 1
    # fused_out in 4 or 8 segments only: a head one of whose segments would wait for its predecessor's state splits its
    # V slab over the segment programs instead (split_width columns each), each walking the whole sequence
    split_v: bool = False
    # kda16_prep only, 16-bit storage: the tile grams as one tf32 product of operands rounded to tf32 first (to
    # nearest) instead of tf32x3; offline sm_90 198 registers and no stack at 4 warps, against tf32x3's 255 and 8-16 B
    tf32_grams: bool = False
    # kda16_prep under fused_q / fused_qk only, 16-bit storage, K in steps: the rows' sums of squares as the diagonal of
    # x x^T on the tensor cores, not the squares' row sums (offline, sm_90, one warp, BK 64: fused_q 3776 SASS
    # instructions at 255 registers, against 3936 at 215)
    mma_sums: bool = False
    # kda16_prep only: compiled for any T, not specialized on T % 16 == 0 (kernels/kda16.py, kda16_prep_kernel_any_t).
    # (H200, h96_fixed, the prepare op: flag 499.8 us against 568.1 specialized; fused_qk 552.4 against 539.4)
    generic_t: bool = False
    # fused_out only: beta's rows loaded before each chunk step's first product (kernels/fused_fwd.py), not after k h
    early_beta: bool = False
    # fused_out only, over early_beta (which it makes moot): each step loads the next chunk's beta rows and uses the
    # ones the step before loaded, so no product of the step waits on them (kernels/fused_fwd.py)
    beta_ahead: bool = False
    # fused_out under fused_qk only: k's rstd comes in a (c + log2 rstd, rstd) tile aqk_kernel writes, not as its own
    # [64] vector (kernels/fused_fwd.py)
    k_rstd_tile: bool = False
    # fused_out with k_rstd_tile only: each chunk's last gate cumsum taken from that tile's c rows, not loaded on its
    # own (kernels/fused_fwd.py)
    c_last_from_tile: bool = False
    # aqk only: the chunk's gate rows (and k's rstd for fused_out's k_rstd_tile) loaded before q k^T's products,
    # not after them (kernels/state_out.py)
    early_gates: bool = False
    # gram and aqk only: their grid runs a chunk's key heads in a row (grid axis 0 the heads), not a head's chunks
    # (kernels/intra.py, gram_solve_kernel)
    heads_first: bool = False


@dataclass(frozen=True)
class L2NormConfig:
    """Tunables of the standalone l2norm kernel (``BR`` rows per program)."""

    BR: int = 16
    num_warps: int = 4
    num_stages: int = 1
    maxnreg: int | None = None


@dataclass(frozen=True)
class GDNConfig:
    """One config per stage kernel of :func:`gdnbench.kernels.ops.chunk_gdn` and :func:`gdnbench.kernels.ops.chunk_kda`.

    Defaults are the fastest of a per-stage config sweep on the H200
    (B1 T8192 H16 HV32, K = V = 128, bf16, Triton 3.6), per stage: w/u 98 -> 78 us,
    state 258 -> 164 us (3 stages), output 202 -> 106 us (BK 64, BV 128, 4 warps) against
    the first, spill-free picks; gram as its searches chose (below)."""

    l2norm: L2NormConfig = field(default_factory=L2NormConfig)
    # gate cumsum + beta*K K^T gram + (I + A)^-1 solve, per (chunk, head).  H200, gdn-qwen6: every one of its
    # 12 searches chose 1 warp (0.63-0.70x the time at 2 warps, 2 stages), BK 64 and 3 stages in 6
    gram: KernelConfig = field(default_factory=lambda: KernelConfig(BK=64, num_warps=1, num_stages=3))
    # w = A (beta exp(g) k), u = A (beta v), per (chunk, head)
    wu: KernelConfig = field(default_factory=lambda: KernelConfig(BK=128, BV=128, num_warps=8, num_stages=2))
    # inter-chunk state recurrence, per (V block, sequence*head); K is split into pieces of BK rows
    # (64 when BK is None), at most four
    state: KernelConfig = field(default_factory=lambda: KernelConfig(BV=32, num_warps=4, num_stages=3))
    # output, per (V block, chunk, batch*head)
    output: KernelConfig = field(default_factory=lambda: KernelConfig(BK=64, BV=128, num_warps=4, num_stages=2))
    # output with q's norm folded in (fused_q, fused_qk): the extra q q^T dot wants 3 stages and a
    # register cap (H200: 115.7 us uncapped, 104.7 us at maxnreg 168, see kernels/output.py)
    output_fused: KernelConfig = field(default_factory=lambda: KernelConfig(BK=32, BV=128, num_warps=4,
                                                                           num_stages=3, maxnreg=168))
    # GDN's one-pass path (kernels/state_out.py): the gated causal q k^T per (chunk, head), and the state
    # recurrence that also writes o, per (V block, sequence*head), K in pieces of BK rows as in `state`
    aqk: KernelConfig = field(default_factory=lambda: KernelConfig(BK=64, num_warps=4, num_stages=2))
    state_out: KernelConfig = field(default_factory=lambda: KernelConfig(BV=32, num_warps=4, num_stages=3))
    # GDN: True / False force the one-pass path on / off; None lets ops.one_pass decide per call.  KDA: True runs
    # state and output in one pass (kda_state_out), None / False the state and output kernels
    one_pass: bool | None = None
    # GDN, opt-in (kernels/fused_fwd.py): what the one-pass loop computes itself instead of reading it from an
    # earlier kernel.  None: w, u (wu_kernel) and Aqk (aqk_kernel) are read; "wu": w h and u from A in the
    # loop, no wu_kernel; "wu_aqk": q k^T in the loop too, no aqk_kernel (norm none / flag only).  Set, it
    # implies the one-pass path on every shape
    in_loop: str | None = None
    # the one-pass loop of `in_loop`, per (V block, sequence*head), K in pieces of BK rows as in `state`
    fused_out: KernelConfig = field(default_factory=lambda: KernelConfig(BV=32, num_warps=4, num_stages=3))
    # KDA only: per-channel gate cumsum (g_cs, times log2 e), per (chunk, head, K block)
    kda_cumsum: KernelConfig = field(default_factory=lambda: KernelConfig(BK=64, num_warps=4, num_stages=1))
    # KDA only: gated K K^T and Q K^T grams from g_cs, (I + A)^-1 solve, per (chunk, head), both grams in one
    # program for bounded gates.  H200, kda-legacy6, the kernel alone under flag (h96_fixed / h64_fixed): 620.1 /
    # 426.7 us at BK 16, 2 warps, 3 stages; 952.4 / 645.4 at BK 32, 2 warps, 1 stage; 902.5 / 611.0 at BK 32, 4
    # warps, 2 stages; 1391.8 / 945.3 at 1 warp (offline sm_90: 880-1096 B of stack)
    kda_intra: KernelConfig = field(default_factory=lambda: KernelConfig(BK=16, num_warps=2, num_stages=3))
    # KDA only, where one_pass: the state recurrence that also writes o (kernels/state_out_kda.py), per (V block,
    # sequence*head), K in pieces of BK rows as in `state`.  Offline sm_90 (Triton 3.6, bf16 K = V = 128): 163
    # registers and no stack under flag, 234 under fused_q; BV 64 spills under fused_q, 3 stages exceed shared memory
    kda_state_out: KernelConfig = field(default_factory=lambda: KernelConfig(BK=64, BV=32, num_warps=4, num_stages=2))
    # KDA, opt-in (kernels/kda16.py): FlashKDA's decomposition in 16-token tiles, a prepare kernel per (tile, head)
    # and one loop per (V block, sequence*head) that forms u and o itself; bounded gates only (lower_bound).
    # Both kernels are tuned kernels; `gdnbench` takes the form where the tuner timed it faster (tuned.kda16_choice)
    kda_chunk16: bool = False
    # the 16-token prepare kernel in CUDA C++ (kernels/kda16_cuda.py) where it applies (Hopper, bf16, K = 128),
    # whatever kda16_prep says; the autotuner turns it off to time kda16_prep's Triton configs
    kda16_prep_cuda: bool = True
    kda16_prep: KernelConfig = field(default_factory=lambda: KernelConfig(num_warps=4, num_stages=1))
    kda16_loop: KernelConfig = field(default_factory=lambda: KernelConfig(BV=32, num_warps=4, num_stages=2))


DEFAULT_CONFIG = GDNConfig()
GRID_Y_MAX = 65535  # CUDA's limit on a grid's second axis


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1).  Host-side helpers here are plain ints: triton's
    cdiv / next_power_of_2 are constexpr functions costing ~1.6 us per host call (Triton 3.6),
    and a forward made ~28 such calls."""
    return 1 << (n - 1).bit_length()


def block(b: int, dim: int) -> int:
    """The block size a kernel actually uses for a dimension of size ``dim``."""
    return min(b, next_pow2(dim))


def kda16_step(c: KernelConfig, K: int) -> int:
    """K channels per step of kda16_prep (``KernelConfig.BK``; None: all of them in one step)."""
    return next_pow2(K) if c.BK is None else block(c.BK, K)


def split_width(BV: int, segments: int) -> int:
    """Columns per program of a V-split head (KernelConfig.split_v): the V slab shared by the segment programs,
    at least 32 (the narrowest slab measured on the H200), at most the slab."""
    return min(BV, max(BV // segments, 32))


def state_piece(c: KernelConfig, K: int) -> int:
    """Rows per piece of the state kernel's slab: the config's BK clamped to K's power of two, 64 when
    unset (the only height before BK was tuned, so older tuned entries keep their code; for K < 64 that
    is one partly masked piece, which no set BK gives, so there the autotuner's start point, a K-row
    piece, is not exactly the default config)."""
    return 64 if c.BK is None else block(c.BK, K)


def _smem_estimate(name: str, c, K: int, V: int, elt: int, family: str = "gdn") -> int:
    """Rough estimate of a kernel's shared memory (bytes): pipelined operand tiles x stages.

    Calibrated against offline sm_90 compiles; it is a guard against configs that
    cannot launch, not an exact figure.  KDA's kernels also stream fp32 per-channel gate tiles."""
    BT, BC = CHUNK_SIZE, SUB_CHUNK
    st = max(c.num_stages, 1)
    gate = 4 if family == "kda" else 0  # bytes per element of a [BT, BK] gate tile
    if name == "l2norm":
        return c.BR * next_pow2(K) * 4
    if name == "gram":
        return st * 4 * BC * block(c.BK, K) * elt
    if name == "kda_cumsum":
        return BT * block(c.BK, K) * 4
    if name == "kda_intra":
        return st * BT * block(c.BK, K) * (2 * elt + 4)
    if name == "wu":
        bk, bv = block(c.BK, K), block(c.BV, V)
        return BT * BT * elt + st * BT * max(bk, bv) * elt + st * BT * bk * gate
    if name == "aqk":
        # q, k and (fused routes) q again per stage; fp32 K 128 BK 64, 2 stages: 65536 B plain, 98304 fused
        return st * 3 * BT * block(c.BK, K) * elt + BT * BT * 4
    if name == "fused_out":
        # the q and k tiles of every piece and the A, Aqk and v tiles per stage after the first, and, pipelined
        # (2+ stages), 16-bit staging of about two [BT, K] tiles.  44 offline sm_90 compiles (Triton 3.6, K 64 /
        # 128, BV 16-64, 1-3 stages, both in_loop forms): pipelined, bf16 took 29-160 KB, each at or below this
        # (1.03-1.07x at K = V = 128, BV 32, form wu), fp32 57-124 KB, 1.4-2.2x below; at 1 stage 20-33 KB
        # (bf16 K 128: 28672 B against 24576 here).  fp32 K 128 at 3 stages (~270 KB here) is refused untried
        bv, piece = block(c.BV, V), state_piece(c, K)
        per_stage = cdiv(K, piece) * 2 * BT * piece * elt + 2 * BT * BT * elt + BT * bv * elt
        staging = 2 * BT * next_pow2(K) * 2 + 4096 if st > 1 else 0
        return BT * BT * 4 + 2 * BT * bv * elt + (st - 1) * per_stage + staging
    if name == "state_out":
        # the w, q and k tiles of every piece, the Aqk and u tiles, per stage after the first; calibrated on
        # 48 offline sm_90 compiles (Triton 3.6), validate's verdict matching each compiled size: fp32 K 128
        # BV 32 takes 32768 / 139524 / 262664 B at 1 / 2 / 3 stages (this gives 32768 / 155648 / 278528);
        # 16-bit builds take 12-34 KB at any stage count
        bv, piece = block(c.BV, V), state_piece(c, K)
        per_stage = cdiv(K, piece) * 3 * BT * piece * elt + BT * BT * elt + BT * bv * elt
        return BT * BT * 4 + 2 * BT * bv * elt + (st - 1) * per_stage
    if name == "kda_state_out":
        # the w, q, kg and fp32 gate tiles of every piece and the Aqk and u tiles per stage after the first, and
        # 16-bit staging; offline sm_90 (Triton 3.6, bf16 K = V = 128, BV 32-128, 2 and 3 stages): 139-254 KB,
        # each equal to this or up to 4 KB below
        bv, piece = block(c.BV, V), state_piece(c, K)
        per_stage = cdiv(K, piece) * BT * piece * (3 * elt + 4) + BT * BT * elt + BT * bv * elt
        return BT * BT * 4 + 2 * BT * bv * elt + 3 * BT * min(piece, 64) * 2 + (st - 1) * per_stage
    if name == "state":
        # the pipeliner double-buffers the w and k tiles of every state piece (measured for fp32
        # with 64-row pieces; 16-bit builds stay far below this)
        bv, piece = block(c.BV, V), state_piece(c, K)
        return max(st - 1, 1) * cdiv(K, piece) * 2 * BT * piece * elt + 2 * BT * bv * elt
    if name in ("output", "output_fused"):
        bk, bv = block(c.BK, K), block(c.BV, V)
        return st * (2 * BT * bk + bk * bv) * elt + st * BT * bk * gate + BT * bv * elt + BT * BT * elt
    if name == "kda16_prep":  # [16, K] tiles of q, k, the gates and their products, no pipelining
        return 6 * SUB_CHUNK * next_pow2(K) * 4
    if name == "kda16_loop":  # per stage the step's q_d, k_d, k_r, INV, M and v tiles, and the state's staging
        bv = block(c.BV, V)
        per_stage = 3 * SUB_CHUNK * next_pow2(K) * elt + 2 * SUB_CHUNK * SUB_CHUNK * elt + SUB_CHUNK * bv * 4
        return st * per_stage + next_pow2(K) * bv * elt
    raise KeyError(name)


def _codegen_hazard(name: str, c, K: int, V: int, elt: int) -> str | None:
    """Why a kernel config is known to go wrong on sm_90 (Triton 3.6), or None.

    compute-sanitizer memcheck on the H200, one process at a time: at K = 32, V = 16,
    wu_kernel with fp32 storage at 8 warps reads shared memory out of bounds at its w or u dot (clean at
    4), and the output kernels in 16-bit storage at 4 warps do so at the final [64, 64] x [64, 16] dot,
    every route (clean at 2 warps or BK 16); KDA fused_qk bf16 there gave a wrong o (rel-RMS 0.73)
    with no sanitizer error.  The rules cover every 16-wide block, not only the measured heads; with
    them 44 sanitizer runs (heads 16..256, both families, fp32/bf16/fp16) were clean.  fused_out at
    K = V = 128 (bf16, h16_hv32_fixed8k): 128-row state pieces walking 32 columns (BV 32, or split_v's
    32-column share of BV 64) at one stage read shared memory out of bounds at the state update's dot, at
    4 and 8 warps (295-982 errors; a plain run died of an illegal memory access); clean at 2 stages, at
    64-row pieces and at BV 64."""
    if name == "wu" and elt == 4 and c.num_warps > 4 and min(block(c.BK, K), block(c.BV, V)) <= 16:
        return "fp32 w/u at a 16-wide block needs num_warps <= 4"
    if name in ("output", "output_fused", "state_out", "fused_out", "kda_state_out") and block(c.BV, V) <= 16 \
            and c.num_warps > 2:
        # state_out ends each chunk with the same [64, 64] x [64, BV] dot (not measured there: the rule's reach)
        return "the output kernels at a 16-wide V block need num_warps <= 2"
    if name == "fused_out" and c.num_stages == 1 and state_piece(c, K) >= 128:
        width = split_width(block(c.BV, V), c.segments) if c.split_v else block(c.BV, V)
        if width <= 32:
            return "fused_out's 128-row state pieces walking 32 columns or fewer need num_stages >= 2"
    return None


def validate(config: GDNConfig, K: int, V: int, dtype_bytes: int = 2, family: str = "gdn") -> None:
    """Raise ValueError if ``config`` cannot run head sizes ``K``/``V`` for ``family`` ("gdn" or "kda").

    Checks head sizes (16 to 256), block sizes (powers of two
    in 16..256 where the kernel has them), warps/stages/maxnreg ranges, a register
    cap that the register file can hold for every thread of the block, and a
    rough shared-memory estimate against the Hopper limit.  A config that passed is
    remembered (every forward validates; the checks cost ~20 us of host time per call).
    """
    try:
        _check_cached(config, K, V, dtype_bytes, family)
    except TypeError:  # a field holding an unhashable value: check it uncached (it fails there)
        _check(config, K, V, dtype_bytes, family)


def kernel_check(config: GDNConfig, name: str, K: int, V: int, dtype_bytes: int = 2, family: str = "gdn"):
    """A test of kernel ``name``'s configs within ``config``: for a config ``c`` it returns why
    ``dataclasses.replace(config, **{name: c})`` fails :func:`validate`, or None.

    The rest of ``config`` is checked once, here; each call checks ``c`` alone.  The autotuner tests the points of
    a space this way (fused_out's has 512 000): validating the whole config took ~70 us a point, a dry run of the
    smoke set's 34 searches 36 s (7 s this way)."""
    try:
        needs = _launched(config, K, V, family)
        for other, blocks in needs.items():
            if other != name:
                _check_kernel(other, getattr(config, other), blocks, K, V, dtype_bytes, family)
    except ValueError as e:
        return lambda c, why=str(e): why
    if name not in needs:
        return lambda c: None
    blocks = needs[name]

    def check(c) -> str | None:
        try:
            _check_kernel(name, c, blocks, K, V, dtype_bytes, family)
        except (ValueError, TypeError) as e:
            return str(e)
        return None

    return check


# KernelConfig flags that only some kernels' code reads: flag -> (those kernels, what they do)
_OWNED_FLAGS = {"tf32_grams": (("kda16_prep",), "forms tile grams"),
                "mma_sums": (("kda16_prep",), "takes sums of squares on the tensor cores"),
                "generic_t": (("kda16_prep",), "compiles for any T"),
                "early_beta": (("fused_out",), "has that load order"),
                "beta_ahead": (("fused_out",), "has that load order"),
                "k_rstd_tile": (("fused_out",), "reads k's rstd in a tile"),
                "c_last_from_tile": (("fused_out",), "reads c_last from k's rstd tile"),
                "early_gates": (("aqk",), "has that load order"),
                "heads_first": (("gram", "aqk"), "order their grid by head")}


def _check(config: GDNConfig, K: int, V: int, dtype_bytes: int, family: str) -> None:
    for name, blocks in _launched(config, K, V, family).items():
        _check_kernel(name, getattr(config, name), blocks, K, V, dtype_bytes, family)


def _launched(config: GDNConfig, K: int, V: int, family: str) -> dict[str, tuple[str, ...]]:
    """The kernels ``config`` launches for ``family`` at head sizes K, V, each with the block fields it must set;
    ValueError where the config's form or the head sizes cannot run."""
    if not isinstance(config, GDNConfig):
        raise ValueError(f"config must be a GDNConfig, got {type(config).__name__}")
    if config.one_pass not in (None, True, False):
        raise ValueError(f"config.one_pass={config.one_pass!r} must be None, True or False")
    if config.in_loop not in IN_LOOP_FORMS:
        raise ValueError(f"config.in_loop={config.in_loop!r} must be one of {IN_LOOP_FORMS}")
    if family not in FAMILIES:
        raise ValueError(f"family must be 'gdn' or 'kda', got {family!r}")
    for name, dim in (("K", K), ("V", V)):
        if not 16 <= dim <= MAX_HEAD_DIM:
            raise ValueError(f"{name}={dim} must be in [16, {MAX_HEAD_DIM}]")
    needs = {"l2norm": (), "gram": ("BK",), "wu": ("BK", "BV"), "state": ("BV",), "output": ("BK", "BV"),
             "output_fused": ("BK", "BV"), "kda_cumsum": ("BK",), "kda_intra": ("BK",), "aqk": ("BK",),
             "state_out": ("BV",), "fused_out": ("BV",), "kda_state_out": ("BV",)}
    if family != "gdn" or K > ONE_PASS_MAX_K:
        if config.one_pass and family == "gdn":
            raise ValueError(f"config.one_pass=True needs K <= {ONE_PASS_MAX_K} for GDN, got K={K}")
        if config.in_loop:
            raise ValueError(f"config.in_loop={config.in_loop!r} needs GDN with K <= {ONE_PASS_MAX_K}, "
                             f"got {family} K={K}")
        del needs["aqk"], needs["state_out"], needs["fused_out"]
    if family != "kda" or not config.one_pass:
        del needs["kda_state_out"]  # KDA's one pass runs it; elsewhere it is not launched
    if config.kda_chunk16:
        if family != "kda":
            raise ValueError("config.kda_chunk16=True is a KDA form (per-channel gates)")
        needs = {"l2norm": (), "kda16_prep": (), "kda16_loop": ("BV",)}
    if config.in_loop and config.one_pass is False:
        raise ValueError(f"config.in_loop={config.in_loop!r} is a one-pass form: one_pass=False contradicts it")
    return needs


def _check_kernel(name: str, c, blocks: tuple[str, ...], K: int, V: int, dtype_bytes: int, family: str) -> None:
    """ValueError where kernel ``name``'s config ``c`` cannot run (``blocks``: the block fields it must set)."""
    want = L2NormConfig if name == "l2norm" else KernelConfig
    if not isinstance(c, want):
        raise ValueError(f"config.{name} must be a {want.__name__}")
    for b in blocks:
        val = getattr(c, b)
        if val not in _BLOCKS:
            raise ValueError(f"config.{name}.{b}={val!r} must be one of {_BLOCKS}")
    if name in ("state", "state_out", "fused_out", "kda_state_out", "kda16_prep") and c.BK is not None:
        if c.BK not in _BLOCKS:
            raise ValueError(f"config.{name}.BK={c.BK!r} must be None or one of {_BLOCKS}")
        if name != "kda16_prep" and cdiv(K, state_piece(c, K)) > 4:
            raise ValueError(f"config.{name}.BK={c.BK} splits K={K} into more than 4 pieces")
    if name not in ("l2norm", "fused_out") and c.segments != 1:
        raise ValueError(f"config.{name}.segments={c.segments}: only fused_out cuts sequences in segments")
    if name == "fused_out" and c.segments not in SEGMENTS:
        raise ValueError(f"config.fused_out.segments={c.segments!r} must be one of {SEGMENTS}")
    if name != "l2norm" and c.split_v and (name != "fused_out" or c.segments < 4):
        # in two segments none waits (the second one's warm-up reaches back to the sequence start)
        raise ValueError(f"config.{name}.split_v=True: only fused_out in 4 or 8 segments splits V")
    for flag, (owners, what) in _OWNED_FLAGS.items():
        if name != "l2norm" and name not in owners and getattr(c, flag):
            raise ValueError(f"config.{name}.{flag}=True: only {' and '.join(owners)} {what}")
    if name == "fused_out" and c.c_last_from_tile and not c.k_rstd_tile:
        raise ValueError("config.fused_out.c_last_from_tile=True needs k_rstd_tile=True (c_last comes from that tile)")
    if name == "l2norm" and (c.BR < 1 or c.BR & (c.BR - 1)):
        raise ValueError(f"config.l2norm.BR={c.BR} must be a power of two")
    if c.num_warps not in _WARPS:
        raise ValueError(f"config.{name}.num_warps={c.num_warps} must be one of {_WARPS}")
    if not 1 <= c.num_stages <= 8:
        raise ValueError(f"config.{name}.num_stages={c.num_stages} must be in [1, 8]")
    if c.maxnreg is not None and (not 32 <= c.maxnreg <= 255 or c.maxnreg % 8):
        raise ValueError(f"config.{name}.maxnreg={c.maxnreg} must be None or a multiple of 8 in [32, 255]")
    if c.maxnreg is not None and c.maxnreg * 32 * c.num_warps > REGISTERS_PER_SM:
        # a block whose threads cannot all hold maxnreg registers cannot launch
        raise ValueError(f"config.{name}: maxnreg={c.maxnreg} x {32 * c.num_warps} threads exceeds the "
                         f"register file ({REGISTERS_PER_SM})")
    hazard = _codegen_hazard(name, c, K, V, dtype_bytes)
    if hazard:
        raise ValueError(f"config.{name}: num_warps={c.num_warps} at K={K}, V={V}: {hazard} "
                         "(out-of-bounds shared reads on sm_90)")
    smem = _smem_estimate(name, c, K, V, dtype_bytes, family)
    if smem > SMEM_LIMIT_BYTES:
        raise ValueError(f"config.{name} needs ~{smem} B of shared memory (> {SMEM_LIMIT_BYTES})")


_check_cached = functools.lru_cache(maxsize=256)(_check)  # exceptions are not cached


@functools.lru_cache(maxsize=None)
def default_config(K: int, V: int, dtype_bytes: int = 2, family: str = "gdn") -> GDNConfig:
    """DEFAULT_CONFIG with each kernel's num_stages lowered until its shared memory fits ``family``'s kernels,
    and its num_warps halved while :func:`_codegen_hazard` names the config (small heads only).

    The defaults are tuned for K = V = 128 in 16-bit storage; there the 3-stage state kernel
    is 1.6x faster than 2 stages, but at K = 256 with fp32 storage it does not fit."""
    cfg = DEFAULT_CONFIG
    for name in ("gram", "wu", "state", "output", "output_fused", "kda_cumsum", "kda_intra", "aqk", "state_out",
                 "fused_out", "kda_state_out"):
        c = getattr(cfg, name)
        while c.num_stages > 1 and _smem_estimate(name, c, K, V, dtype_bytes, family) > SMEM_LIMIT_BYTES:
            c = dataclasses.replace(c, num_stages=c.num_stages - 1)
        while c.num_warps > 1 and _codegen_hazard(name, c, K, V, dtype_bytes):
            c = dataclasses.replace(c, num_warps=c.num_warps // 2)
        cfg = dataclasses.replace(cfg, **{name: c})
    return cfg

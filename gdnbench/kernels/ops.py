"""Our chunked Gated DeltaNet and Kimi Delta Attention forwards in Triton (FLA 0.6.0
``chunk_gated_delta_rule`` / ``chunk_kda`` conventions).

Public API
----------
``chunk_gdn(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
cu_seqlens=None, norm="flag", config=None, chunk_indices=None) -> (o, final_state | None)``

``chunk_kda(q, k, v, g, beta, *, ..., lower_bound=None, ...)``: the same with per-channel
gates g [B,T,HV,K] (see :func:`chunk_kda`).

``l2norm(x)``, ``prepare_varlen(cu_seqlens)``, ``GDNConfig`` / ``KernelConfig`` /
``L2NormConfig`` / ``validate`` and the stage functions (``gram_solve`` / ``kda_intra``,
``recompute_wu``, ``state_recurrence``, ``chunk_output``) used by the benchmark
scripts to time each kernel on its own.  Stages 2-4 are shared: they take the gate
kind from g_cs (scalar [B,T,HV] for GDN, per-channel [B,T,HV,K] for KDA).

Shapes: q, k [B,T,H,K]; v [B,T,HV,V] (HV % H == 0, value head i reads key head
i // (HV // H)); g (natural-log decay, per token) and beta (post-sigmoid)
[B,T,HV]; states [N,HV,K,V] fp32; packed varlen: B == 1 and int64 cu_seqlens [N+1].

Per sequence and value head the op computes, for t = 1..T,
``S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = scale * S^T q_t``.

Stages (chunk size 64): (1) gram_solve: chunk-local cumsum of g, the beta K K^T
gram and A = (I + L)^-1; (2) recompute_wu: w = A (beta exp(g) k), u = A (beta v);
(3) state_recurrence: h per chunk and v_new = u - w h; (4) chunk_output.  GDN runs
(3)-(4) in one pass where :func:`one_pass` says so: chunk_aqk (each chunk's gated
q k^T) then state_output (the recurrence writing o; no h per chunk, no v_new).

``norm``: "none" (q, k as given), "flag" (standalone l2norm of q and k, then the
kernels), "fused_q" (q's norm folded into the output kernel, k standalone),
"fused_qk" (k's norm too: its rstd is computed by the gram kernel, applied to the
gram and, GDN, to the rows of w and u, so v_new carries it and the state and output
kernels run on raw k; no normalized copy of k is written).  Fused routes are
forward-only.  Every route is forward-only in the sense that no autograd graph
is recorded; only the fused routes refuse inputs that require grad.

KDA (``chunk_kda``): stage 1 is ``kda_intra`` (per-channel cumsum, the gated K K^T and
Q K^T grams, the same solve), stage 2 also writes kg = k * exp(g_last - g) for the
state update, and the output kernel reads the precomputed gated Q K^T (Aqk) instead
of k.  Under the fused routes Aqk is built from raw q, and the output kernel scales
each output row by q's rstd once, at the end.  With ``config.one_pass`` stages 3-4 run
as one kernel (``kda_state_output``): no h per chunk, no v_new in memory.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch

from ..vocab import FUSED_ROUTES, NORM_MODES
from .common import FLAG_BLOCK as _FLAG_BLOCK, l2norm_kernel
from .config import (
    CHUNK_SIZE,
    DEFAULT_CONFIG,
    GRID_Y_MAX,
    ONE_PASS_MAX_K,
    SUB_CHUNK,
    GDNConfig,
    KernelConfig,
    L2NormConfig,
    block,
    cdiv,
    default_config,
    kda16_step,
    next_pow2,
    split_width,
    state_piece,
    validate,
)
from .fused_fwd import WARM_UP_LOG2, fused_state_out_kernel
from . import kda16_cuda
from .kda16 import kda16_loop_kernel, kda16_prep_kernel, kda16_prep_kernel_any_t
from .intra import gram_solve_kernel, kda_cumsum_kernel, kda_intra_kernel, wu_kernel
from .launch import launch
from .output import output_kernel
from .state import state_kernel
from .state_out import aqk_kernel, state_out_kernel
from .state_out_kda import kda_state_out_kernel

__all__ = [
    "GDNConfig",
    "KernelConfig",
    "L2NormConfig",
    "NORM_MODES",
    "VarlenInfo",
    "chunk_aqk",
    "chunk_gdn",
    "chunk_kda",
    "check_kda_gates",
    "chunk_output",
    "default_config",
    "gram_solve",
    "kda_intra",
    "l2norm",
    "one_pass",
    "prepare_varlen",
    "recompute_wu",
    "state_output",
    "state_output_in_loop",
    "kda_state_output",
    "state_recurrence",
    "stage_kernels",
    "validate",
]

FLAG_BLOCK = _FLAG_BLOCK.value  # flags per program of a fix-up launch
KDA_MIN_LOWER_BOUND = -5.0  # the bounded form's gate factors are sized for g >= -5 (kernels/intra.py)


# ----------------------------------------------------------------------------- helpers
def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _launch(kernel, grid, cfg, *args, hooks=None, **kwargs):
    """Launch with the config's num_warps/num_stages; maxnreg only on GPU and only when set.
    ``hooks``: the caller's ``on_launch(kernel, compiled)``, called after the launch (the autotuner
    reads registers and spills, compiled.n_regs / n_spills, this way); None for a fix-up launch, so
    it sees the main kernel's registers."""
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.maxnreg is not None and not _interpreting():
        opts["maxnreg"] = cfg.maxnreg
    compiled = launch(kernel, grid, args, kwargs, opts)
    if hooks is not None:
        hooks(kernel, compiled)


def _launch_fixed_up(kernel, grid, cfg, args, fixup_args, n_flags, fixup: bool, hooks=None, **kwargs):
    """The main launch over ``grid`` (FIXUP False) and, where ``fixup``, the fix-up launch: FIXUP True, grid
    cdiv(n_flags, FLAG_BLOCK), each program reading FLAG_BLOCK flags and redoing the flagged programs.
    ``fixup_args`` follow ``args`` in the fix-up launch only; the main launch passes None for each (an unused
    argument would change the main PTX).  ``hooks`` see the main launch only."""
    _launch(kernel, grid, cfg, *args, *(None,) * len(fixup_args), FIXUP=False, hooks=hooks, **kwargs)
    if fixup:
        _launch(kernel, (cdiv(n_flags, FLAG_BLOCK),), cfg, *args, *fixup_args, FIXUP=True, **kwargs)


def _chunk_head_grid(cfg: KernelConfig, n_chunks: int, n_heads: int) -> tuple[tuple[int, int], bool]:
    """(grid, heads_first) of a gram / aqk launch: (heads, chunks) where ``cfg.heads_first`` asks for it, else
    (chunks, heads).  Heads first, the chunks take the grid's second axis, so more than GRID_Y_MAX of them keep
    the chunk-first order."""
    first = cfg.heads_first and n_chunks <= GRID_Y_MAX
    return ((n_heads, n_chunks) if first else (n_chunks, n_heads)), first


def _precision(dtype: torch.dtype) -> str:
    """Precision of the kernels' fp32 x fp32 dots.

    fp32 storage: "tf32x3" (three tensor-core tf32 products, about fp32 accuracy);
    "ieee" would lower to an FMA loop whose operand staging needs ~300 KB of shared
    memory in the state kernel at K = 256.  16-bit storage: only the solve's fp32
    block products see this, and tf32 is plenty there (as in FLA)."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


@dataclass(frozen=True)
class VarlenInfo:
    """Host-built chunk tables of a packed batch (see :func:`prepare_varlen`)."""

    cu_seqlens: torch.Tensor  # [N+1] int64
    chunk_indices: torch.Tensor  # [num_chunks, 2] int32: (sequence id, chunk id within sequence)
    chunk_offsets: torch.Tensor  # [N+1] int32: first global chunk of each sequence
    num_chunks: int
    num_seqs: int
    max_len: int  # tokens of the longest sequence


def prepare_varlen(cu_seqlens: torch.Tensor, chunk_size: int = CHUNK_SIZE) -> VarlenInfo:
    """Build the chunk tables for packed sequences.  Syncs with the device once (``.tolist()``),
    so call it outside a timed region and pass the result as ``chunk_indices=``."""
    if chunk_size != CHUNK_SIZE:
        raise ValueError(f"chunk_size must be {CHUNK_SIZE}")
    cu = cu_seqlens.to(torch.int64)
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError("cu_seqlens must be a 1-D tensor [N+1]")
    lens = cu[1:] - cu[:-1]
    if bool((lens < 0).any()):
        raise ValueError("cu_seqlens must be non-decreasing")
    n_chunks = (lens + chunk_size - 1) // chunk_size
    offsets = torch.zeros_like(cu)
    offsets[1:] = torch.cumsum(n_chunks, 0)
    total, max_len = torch.stack([offsets[-1], lens.max()]).tolist()
    seq_ids = torch.repeat_interleave(torch.arange(len(lens), device=cu.device), n_chunks)
    within = torch.arange(total, device=cu.device) - offsets[seq_ids]
    table = torch.stack([seq_ids, within], 1).to(torch.int32).contiguous()
    return VarlenInfo(cu.contiguous(), table, offsets.to(torch.int32), total, len(lens), max_len)


def _chunk_grid(B: int, T: int, varlen: VarlenInfo | None) -> tuple[int, int]:
    """(chunks per grid row, NT) where NT is the per-sequence chunk count of the dense layout."""
    NT = cdiv(T, CHUNK_SIZE)
    return (varlen.num_chunks if varlen is not None else NT), NT


def _varlen_args(varlen: VarlenInfo | None):
    return (None, None) if varlen is None else (varlen.cu_seqlens, varlen.chunk_indices)


# ----------------------------------------------------------------------------- l2norm
def l2norm(x: torch.Tensor, config: L2NormConfig | None = None, on_launch=None) -> torch.Tensor:
    """x / sqrt(sum(x^2, -1) + 1e-6) in fp32, cast back to x's dtype (Triton kernel).

    Rows with max|x| > 2**50 are normalized on a pre-scaled copy, so they come
    out normalized instead of 0 or NaN; for all other rows this is the plain formula."""
    cfg = config or DEFAULT_CONFIG.l2norm
    D = x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    M = xc.numel() // D if D else 0
    if M == 0:
        return y
    _launch(l2norm_kernel, (cdiv(M, cfg.BR),), cfg, xc, y, M, D=D, DP=next_pow2(D), BR=cfg.BR, hooks=on_launch)
    return y


# ----------------------------------------------------------------------------- stages
# gram_solve computes each chunk's gram once per key head for its HV / H value heads (SHARE) from this many
# (chunk, key head) programs.  H200, the kernel alone at its best of 1 / 2 / 4 warps: shared 0.87-0.93x on
# the H16 shapes of gdn-qwen6 (2048-8192 programs; h16_hv64_fixed8k 80.0 -> 71.8 us), but 1.21x on
# h4_hv8_mixed (about 530) and 1.95x on h2_hv8_serving (about 260), where it leaves SMs idle
GRAM_SHARE_MIN_PROGRAMS = 1024


def gram_solve(k, g, beta, *, varlen=None, fuse_k=False, config: GDNConfig = DEFAULT_CONFIG, on_launch=None):
    """Stage 1: (g_cs [B,T,HV] fp32 = cumsum(g)*log2 e per chunk, A [B,T,HV,64] in k's dtype,
    rstd_k [B,T,H] fp32 or None, ssq_k [chunks, H] fp32 or None: the largest sum of squares of each
    chunk's k rows).  fuse_k: a chunk whose ssq_k reached 2^100 is redone, overflow-safe, by its own
    program (intra._gram_solve_rare)."""
    B, T, H, K = k.shape
    HV = beta.shape[2]
    n_grid, NT = _chunk_grid(B, T, varlen)
    g_cs = torch.empty(B, T, HV, device=k.device, dtype=torch.float32)
    A = torch.empty(B, T, HV, CHUNK_SIZE, device=k.device, dtype=k.dtype)
    rstd_k = torch.empty(B, T, H, device=k.device, dtype=torch.float32) if fuse_k else None
    ssq_k = torch.empty(B * n_grid, H, device=k.device, dtype=torch.float32) if fuse_k else None
    cfg = config.gram
    share = HV > H and B * n_grid * H >= GRAM_SHARE_MIN_PROGRAMS
    grid, first = _chunk_head_grid(cfg, n_grid, B * (H if share else HV))
    _launch(gram_solve_kernel, grid, cfg,
            k, g, beta, g_cs, A, rstd_k, ssq_k, *_varlen_args(varlen), T, NT,
            H=H, HV=HV, K=K, BK=block(cfg.BK, K), BT=CHUNK_SIZE, BC=SUB_CHUNK, IS_VARLEN=varlen is not None,
            FUSE_K=fuse_k, PREC=_precision(k.dtype), SHARE=share, HEADS_FIRST=first, hooks=on_launch)
    return g_cs, A, rstd_k, ssq_k


def kda_intra(q, k, g, beta, *, varlen=None, fuse_k=False, raw_q=False, unbounded=False,
              config: GDNConfig = DEFAULT_CONFIG, on_launch=None):
    """KDA stage 1: (g_cs [B,T,HV,K] fp32 = per-channel cumsum(g)*log2 e per chunk, A [B,T,HV,64]
    in k's dtype, Aqk [B,T,HV,64] (gated causal q k^T, unscaled), rstd_k [B,T,H] fp32 or None).
    Two kernels: kda_cumsum (g_cs), then kda_intra (both grams from g_cs, the solve); with bf16
    storage the grams' gated operands are rounded to bf16 for the dots (tf32 otherwise).

    ``raw_q``: q is not normalized (fused routes); with fp16 storage Aqk is then kept in fp32,
    since raw-q grams can leave fp16's range (bf16 and fp32 have fp32's).

    ``unbounded``: gates with no lower bound; the grams take the form whose gate factors never exceed 1
    (kernels/intra.py, _kda_grams), else the bounded form (g >= -5).  fuse_k: a second launch (FIXUP)
    redoes, on k rows normalized on load, the programs with a k row of norm >= 2^19."""
    B, T, H, K = k.shape
    HV = beta.shape[2]
    n_grid, NT = _chunk_grid(B, T, varlen)
    g_cs = torch.empty(B, T, HV, K, device=k.device, dtype=torch.float32)
    A = torch.empty(B, T, HV, CHUNK_SIZE, device=k.device, dtype=k.dtype)
    aqk_dtype = torch.float32 if raw_q and q.dtype == torch.float16 else q.dtype
    Aqk = torch.empty(B, T, HV, CHUNK_SIZE, device=k.device, dtype=aqk_dtype)
    rstd_k = torch.empty(B, T, H, device=k.device, dtype=torch.float32) if fuse_k else None
    cs = config.kda_cumsum
    _launch(kda_cumsum_kernel, (n_grid, B * HV, cdiv(K, block(cs.BK, K))), cs,
            g, g_cs, *_varlen_args(varlen), T, NT, HV=HV, K=K, BK=block(cs.BK, K), BT=CHUNK_SIZE,
            IS_VARLEN=varlen is not None, hooks=on_launch)
    cfg = config.kda_intra
    grid = (n_grid, B * HV, 1 if not unbounded else 2)
    n_flags = grid[0] * grid[1] * grid[2]
    risky = torch.empty(n_flags, device=k.device, dtype=torch.int8) if fuse_k else None
    _launch_fixed_up(kda_intra_kernel, grid, cfg,
                     (q, k, beta, g_cs, A, Aqk, rstd_k, risky, *_varlen_args(varlen), T, NT), (n_grid, n_flags),
                     n_flags, fuse_k, H=H, HV=HV, K=K, BK=block(cfg.BK, K), BT=CHUNK_SIZE, BC=SUB_CHUNK,
                     IS_VARLEN=varlen is not None, FUSE_K=fuse_k, DOT_BF16=k.dtype == torch.bfloat16,
                     PREC=_precision(k.dtype), UNBOUNDED=unbounded, ONE_PROGRAM=not unbounded, hooks=on_launch)
    return g_cs, A, Aqk, rstd_k


def recompute_wu(k, v, beta, A, g_cs, *, rstd_k=None, varlen=None, config: GDNConfig = DEFAULT_CONFIG,
                 on_launch=None):
    """Stage 2: w [B,T,HV,K] (k's dtype), u [B,T,HV,V] (v's dtype), and, for per-channel gates
    (g_cs [B,T,HV,K]), kg = k_norm * exp(g_last - g) [B,T,HV,K] in k's dtype (else None)."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    per_channel = g_cs.dim() == 4
    n_grid, NT = _chunk_grid(B, T, varlen)
    w = torch.empty(B, T, HV, K, device=k.device, dtype=k.dtype)
    u = torch.empty_like(v)
    kg = torch.empty_like(w) if per_channel else None
    cfg = config.wu
    _launch(wu_kernel, (n_grid, B * HV), cfg,
            k, v, beta, g_cs, A, rstd_k, w, u, kg, *_varlen_args(varlen), T, NT,
            H=H, HV=HV, K=K, V=V, BK=block(cfg.BK, K), BV=block(cfg.BV, V), BT=CHUNK_SIZE,
            IS_VARLEN=varlen is not None, FUSE_K=rstd_k is not None, PER_CHANNEL=per_channel,
            PREC=_precision(k.dtype), hooks=on_launch)
    return w, u, kg


def _final_state(N: int, HV: int, K: int, V: int, device, wanted: bool):
    """[N, HV, K, V] fp32 for the final states, or None where they are not wanted."""
    return torch.empty(N, HV, K, V, device=device, dtype=torch.float32) if wanted else None


def state_recurrence(k, w, u, g_cs, *, initial_state=None, output_final_state=False,
                     varlen=None, config: GDNConfig = DEFAULT_CONFIG, on_launch=None):
    """Stage 3: (h [num_chunks, HV, K, V] in k's dtype, v_new like u, final_state [N,HV,K,V] fp32 or None).

    Per-channel gates (g_cs [B,T,HV,K]): pass stage 2's kg as ``k`` (k's rstd already in it).
    Under fused_qk k is raw: stage 2 put k's rstd on the rows of w and u (so on v_new's)."""
    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    N = varlen.num_seqs if varlen is not None else B
    n_chunks = varlen.num_chunks if varlen is not None else B * cdiv(T, CHUNK_SIZE)
    h = torch.empty(n_chunks, HV, K, V, device=k.device, dtype=k.dtype)
    v_new = torch.empty_like(u)
    ht = _final_state(N, HV, K, V, k.device, output_final_state)
    cfg = config.state
    BV = block(cfg.BV, V)
    _launch(state_kernel, (cdiv(V, BV), N * HV), cfg,
            k, w, u, g_cs, h, v_new, initial_state, ht,
            None if varlen is None else varlen.cu_seqlens, None if varlen is None else varlen.chunk_offsets, T,
            H=H, HV=HV, K=K, V=V, BV=BV, BT=CHUNK_SIZE,
            IS_VARLEN=varlen is not None, PER_CHANNEL=g_cs.dim() == 4,
            USE_H0=initial_state is not None, STORE_HT=output_final_state, PREC=_precision(k.dtype),
            PIECE=state_piece(cfg, K), hooks=on_launch)
    return h, v_new, ht


@functools.cache
def _fixup_output(device) -> bool:
    """Whether fused_qk's output kernel leaves its risky programs to a fix-up launch (sm_100 and later, where Triton
    3.6 fails to compile the call that redoes them in the program: kernels/output.py, _output_rare); asked once per
    device, as kda16_cuda._runs_on is: every fused_qk forward on the two-kernel path asks."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 10


def chunk_output(q, k, v_new, h, g_cs, *, scale, rstd_k=None, ssq_k=None, fuse_q=False, varlen=None,
                 config: GDNConfig = DEFAULT_CONFIG, aqk=None, on_launch=None):
    """Stage 4: o [B,T,HV,V] in v_new's dtype.

    Per-channel gates (g_cs [B,T,HV,K]): pass stage 1's ``aqk``; k is not read (may be None).
    GDN fused_qk (``rstd_k`` and ``ssq_k`` from :func:`gram_solve`, fuse_q): k is raw and v_new's
    rows carry k's rstd; a program where a raw q k^T could overflow starts again with k normalized (in the program on
    sm_90, in a second launch, FIXUP, on sm_100 and later: :func:`_fixup_output`)."""
    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    n_grid, NT = _chunk_grid(B, T, varlen)
    o = torch.empty_like(v_new)
    fuse_k = rstd_k is not None
    if fuse_k and (ssq_k is None or not fuse_q or g_cs.dim() == 4):
        raise ValueError("chunk_output: rstd_k needs ssq_k and fuse_q (GDN fused_qk)")
    cfg = config.output_fused if fuse_q else config.output
    BV = block(cfg.BV, V)
    grid = (cdiv(V, BV), n_grid, B * HV)
    n_flags = grid[0] * grid[1] * grid[2]
    fixup = fuse_k and _fixup_output(q.device)
    risky = torch.empty(n_flags, device=q.device, dtype=torch.int8) if fixup else None  # sm_90's redo writes no flag
    _launch_fixed_up(output_kernel, grid, cfg,
                     (q, k, v_new, h, g_cs, rstd_k, ssq_k, aqk, o, risky, *_varlen_args(varlen), float(scale), T, NT),
                     (n_grid, n_flags), n_flags, fixup, H=H, HV=HV, K=K, V=V, BK=block(cfg.BK, K), BV=BV,
                     BT=CHUNK_SIZE, IS_VARLEN=varlen is not None, FUSE_Q=fuse_q, FUSE_K=fuse_k,
                     PER_CHANNEL=g_cs.dim() == 4, PREC=_precision(q.dtype), hooks=on_launch)
    return o


def kda_state_output(q, kg, w, u, g_cs, aqk, *, scale, fuse_q=False, initial_state=None, output_final_state=False,
                     varlen=None, config: GDNConfig = DEFAULT_CONFIG, on_launch=None):
    """KDA's stages 3-4 in one pass (opt-in, kernels/state_out_kda.py): (o [B,T,HV,V] in u's dtype, final_state
    [N,HV,K,V] fp32 or None) as :func:`state_recurrence` + :func:`chunk_output` give them, from stage 2's kg, w,
    u and kda_intra's Aqk, with no h per chunk and no v_new in memory (``chunk_kda`` under ``config.one_pass``)."""
    B, T, H, K = q.shape
    HV, V = u.shape[2], u.shape[3]
    N = varlen.num_seqs if varlen is not None else B
    o, ht = torch.empty_like(u), _final_state(N, HV, K, V, u.device, output_final_state)
    cfg = config.kda_state_out
    BV = block(cfg.BV, V)
    _launch(kda_state_out_kernel, (cdiv(V, BV), N * HV), cfg,
            q, kg, w, u, g_cs, aqk, o, initial_state, ht, None if varlen is None else varlen.cu_seqlens,
            float(scale), T, H=H, HV=HV, K=K, V=V, BV=BV, BT=CHUNK_SIZE, IS_VARLEN=varlen is not None,
            USE_H0=initial_state is not None, STORE_HT=output_final_state, FUSE_Q=fuse_q, PREC=_precision(u.dtype),
            PIECE=state_piece(cfg, K), hooks=on_launch)
    return o, ht


# one pass from this many (value head, sequence) streams over the longest sequence, HV * tokens / longest.
# H200, the two stages alone (CUDA graphs, tuned configs): h2_hv8_serving (16 streams) lost,
# 1.103; h4_hv8_mixed (21.4) won, 0.978, as did every shape of 32 streams or more (0.834-0.918).  In the
# whole explicit forward (gdn-qwen6 runs, two kernels -> one pass) h4_hv8_mixed broke even, 1.014, the others 0.886-0.950
ONE_PASS_MIN_STREAMS = 20


def one_pass(config: GDNConfig, K: int, HV: int, tokens: int, longest: int) -> bool:
    """Whether GDN's forward runs state and output in one pass (chunk_aqk + state_output) instead of
    state_recurrence + chunk_output, for ``tokens`` tokens in all whose ``longest`` sequence has that
    many.  ``config.one_pass`` decides where set.  Otherwise one pass where the work is wide against
    the longest sequence (HV * tokens / longest streams): each chunk step of the one-pass kernel is longer
    (q h and Aqk v_new join w h and k^T v_new), and the longest sequence pays that once per chunk, while
    the h and v_new traffic and the output kernel it saves grow with every sequence's tokens and heads.

    Every route follows it: the fused routes' one-pass forms cost about what the plain ones do in
    state_out, and more in aqk (H200, run 20261201T001017Z_6351747: 38 -> 55 us at h16_hv32_fixed8k,
    134 -> 218 at 32K; kernels/state_out.py)."""
    if config.one_pass is not None:
        return config.one_pass
    if K > ONE_PASS_MAX_K:
        return False
    return HV * tokens >= ONE_PASS_MIN_STREAMS * max(longest, 1)


def chunk_aqk(q, k, g_cs, *, fuse_q=False, ssq_k=None, rstd_k=None, k_tile=False, varlen=None,
              config: GDNConfig = DEFAULT_CONFIG, on_launch=None):
    """One-pass stage 3a (GDN): (Aqk [B,T,HV,64] = causal(q k^T * exp(g_i - g_j)) per chunk, unscaled,
    c_q under fuse_q, else None: each row's gate cumsum c and c + log2 of q's row rstd, fp32 pairs
    [cdiv(B*T, 64), H, 64, HV / H, 2], or under ``k_tile`` quads [..., 4] that add c + log2 of k's row rstd and
    that rstd; :func:`pairs_by_token` views them [B,T,HV,2 or 4]).
    ``ssq_k``: under fused_qk (k raw), gram_solve's largest sum of squares of each chunk's k rows, which bounds
    the raw products.  ``rstd_k`` (the in-loop kernel's): Aqk's columns take k's rstd (Aqk on k's normalized
    rows), from the k tiles aqk loads, gram_solve's overflow-safe ``rstd_k`` on the rare path; ``k_tile``
    writes the quads for ``k_rstd_tile``.  Aqk is in q's dtype, fp32 under fused_qk with fp16 storage (raw k may
    leave fp16's range).

    The pairs' layout puts the [64, 2 G] tile each program writes in one place.  In [B,T,HV,2], its rows lay
    HV * 8 bytes apart, G * 8 bytes each, and the H programs that fill each row's 32-byte sectors ran a whole
    head's chunks apart (H200, aqk alone at the tuned fused_qk configs, CUDA graphs, µs,
    [B,T,HV,2] -> this layout): fused_q 119.7 -> 111.5 and fused_qk with k_q 151.4 -> 128.3 at
    h16_hv32_fixed32k, within 1 at HV32 8K and HV48; at HV64 (G = 4, whose rows were whole 32-byte sectors)
    fused_q 41.3 -> 43.3, its c_q tile stored as 64-bit pieces, not 128."""
    B, T, H, K = q.shape
    HV = g_cs.shape[2]
    n_grid, NT = _chunk_grid(B, T, varlen)
    fuse_k = ssq_k is not None
    if fuse_k and not fuse_q:
        raise ValueError("chunk_aqk: ssq_k (raw k) needs fuse_q")
    if rstd_k is not None and not fuse_k:
        raise ValueError("chunk_aqk: rstd_k (raw k) needs ssq_k")
    if k_tile and rstd_k is None:
        raise ValueError("chunk_aqk: k_tile writes k's rstd: it needs rstd_k")
    dtype = torch.float32 if fuse_k and q.dtype == torch.float16 else q.dtype
    aqk = torch.empty(B, T, HV, CHUNK_SIZE, device=q.device, dtype=dtype)
    c_q = _pairs(B * T, H, HV, q.device, 4 if k_tile else 2) if fuse_q else None
    cfg = config.aqk
    grid, first = _chunk_head_grid(cfg, n_grid, B * H)
    _launch(aqk_kernel, grid, cfg, q, k, g_cs, aqk, c_q, ssq_k, rstd_k, *_varlen_args(varlen), T,
            NT, H=H, HV=HV, K=K, BK=block(cfg.BK, K), BT=CHUNK_SIZE, IS_VARLEN=varlen is not None, FUSE_Q=fuse_q,
            FUSE_K=fuse_k, PREC=_precision(q.dtype), GP=next_pow2(HV // H), K_TILE=k_tile,
            K_COLS=rstd_k is not None, EARLY=cfg.early_gates, HEADS_FIRST=first, hooks=on_launch)
    return aqk, c_q


def _pairs(tokens: int, H: int, HV: int, device, width: int = 2) -> torch.Tensor:
    """An fp32 row-factor tensor (c_q) for ``tokens`` tokens: [cdiv(tokens, 64), H, 64, HV / H, width]
    (common.pair_ptrs)."""
    return torch.empty(cdiv(tokens, CHUNK_SIZE), H, CHUNK_SIZE, HV // H, width, device=device, dtype=torch.float32)


def pairs_by_token(pairs: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """A row-factor tensor viewed [B,T,HV,width] (a copy)."""
    H, G, W = pairs.shape[1], pairs.shape[3], pairs.shape[4]
    return pairs.permute(0, 2, 1, 3, 4).reshape(-1, H * G, W)[: B * T].reshape(B, T, H * G, W)


def state_output(q, k, w, u, g_cs, aqk, c_q=None, *, scale, initial_state=None, output_final_state=False,
                 varlen=None, config: GDNConfig = DEFAULT_CONFIG, on_launch=None):
    """One-pass stage 3b (GDN): (o [B,T,HV,V] in u's dtype, final_state [N,HV,K,V] fp32 or None): the state
    recurrence of :func:`state_recurrence` writing o as it goes, from :func:`chunk_aqk`'s Aqk (and c_q:
    q is raw, and the rows of q h take q's rstd from it)."""
    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    N = varlen.num_seqs if varlen is not None else B
    o = torch.empty_like(u)
    ht = _final_state(N, HV, K, V, k.device, output_final_state)
    cfg = config.state_out
    BV = block(cfg.BV, V)
    _launch(state_out_kernel, (cdiv(V, BV), N * HV), cfg,
            q, k, w, u, g_cs, aqk, c_q, o, initial_state, ht, None if varlen is None else varlen.cu_seqlens,
            float(scale), T, H=H, HV=HV, K=K, V=V, BV=BV, BT=CHUNK_SIZE, IS_VARLEN=varlen is not None,
            USE_H0=initial_state is not None, STORE_HT=output_final_state, FUSE_Q=c_q is not None,
            PREC=_precision(k.dtype), PIECE=state_piece(cfg, K), hooks=on_launch)
    return o, ht


def state_output_in_loop(q, k, v, beta, g_cs, A, aqk=None, c_q=None, rstd_k=None, *, scale,
                         initial_state=None, output_final_state=False, varlen=None, config: GDNConfig = DEFAULT_CONFIG,
                         on_launch=None):
    """One-pass stage (GDN, ``config.in_loop``): (o, final_state) as :func:`state_output` gives them, with
    w h and u computed in the loop from :func:`gram_solve`'s A (no :func:`recompute_wu`), and q k^T too
    where ``aqk`` is None (no :func:`chunk_aqk`; q as given: norm none / flag).  ``rstd_k``: fused_qk's
    k rstd from gram_solve (k is raw), read from ``c_q``'s quads (chunk_aqk's ``k_tile``) where
    ``config.fused_out.k_rstd_tile``; ``c_q``: the fused routes' from chunk_aqk (kernels/fused_fwd.py).
    ``config.fused_out.segments`` > 1 cuts each sequence into that many programs (k's rows must be unit-norm);
    ``split_v`` gives a head that would wait for a segment's state those programs' V columns instead."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    N = varlen.num_seqs if varlen is not None else B
    o = torch.empty_like(v)
    ht = _final_state(N, HV, K, V, k.device, output_final_state)
    cfg = config.fused_out
    tile = _reads_k_rstd_tile(config, rstd_k)
    if c_q is not None and c_q.shape[-1] != (4 if tile else 2):
        raise ValueError(f"state_output_in_loop: config.fused_out.k_rstd_tile={tile} with c_q of width "
                         f"{c_q.shape[-1]} (chunk_aqk's k_tile writes quads, the loop's tile reads them)")
    BV = block(cfg.BV, V)
    seg = cfg.segments
    grid, sync, hand = (cdiv(V, BV), N * HV), None, None
    if seg > 1:
        grid = (N * seg * HV * cdiv(V, BV),)
        sync = torch.zeros(1 + grid[0], device=k.device, dtype=torch.int32)
        hand = torch.empty(N * seg * HV, K, V, device=k.device, dtype=torch.float32)
    _launch(fused_state_out_kernel, grid, cfg,
            q, k, v, beta, g_cs, A, None if tile else rstd_k, aqk, c_q, o, initial_state, ht,
            None if varlen is None else varlen.cu_seqlens, sync, hand, float(scale), T,
            H=H, HV=HV, K=K, V=V, BV=BV, BT=CHUNK_SIZE, IS_VARLEN=varlen is not None,
            USE_H0=initial_state is not None, STORE_HT=output_final_state, FUSE_Q=c_q is not None,
            FUSE_K=rstd_k is not None, IN_LOOP_AQK=aqk is None, PREC=_precision(k.dtype), PIECE=state_piece(cfg, K),
            SEG=seg, THRESH=WARM_UP_LOG2, SPLIT_V=cfg.split_v, BVS=split_width(BV, seg) if cfg.split_v else BV,
            EARLY_BETA=cfg.early_beta and not cfg.beta_ahead, K_TILE=tile, BETA_AHEAD=cfg.beta_ahead,
            C_LAST_TILE=tile and cfg.c_last_from_tile, hooks=on_launch)
    return o, ht


def kda_chunk16(q, k, v, g, beta, *, scale, initial_state=None, output_final_state=False, norm_q=False,
                norm_k=False, varlen=None, config: GDNConfig = DEFAULT_CONFIG, on_launch=None):
    """KDA's forward in 16-token tiles (``config.kda_chunk16``, kernels/kda16.py): (o, final_state).  Bounded gates
    (g >= -5); ``norm_q`` / ``norm_k``: q's / k's rows are raw and normalized in the prepare kernel."""
    run = dict(varlen=varlen, config=config, on_launch=on_launch)
    tiles = kda16_prepare(q, k, g, beta, scale=scale, norm_q=norm_q, norm_k=norm_k, **run)
    return kda16_loop(tiles, v, initial_state=initial_state, output_final_state=output_final_state, **run)


def kda16_prepare(q, k, g, beta, *, scale, norm_q=False, norm_k=False, varlen=None,
                  config: GDNConfig = DEFAULT_CONFIG, on_launch=None) -> dict:
    """The 16-token form's prepare kernel: per token q_d, k_d, k_r [B,T,HV,K] in k's dtype; per tile INV (beta
    folded in) and M [tiles, HV, 16, 16] in k's dtype, 2^c_last [tiles, HV, K] fp32 (tiles: 4 per chunk);
    ``norm_q`` / ``norm_k`` fold q's / k's row norm in.  The CUDA C++ kernel (kernels/kda16_cuda.py) where
    ``config.kda16_prep_cuda`` and it applies, else the Triton kernel under ``config.kda16_prep``."""
    B, T, H, K = k.shape
    HV = beta.shape[2]
    n_chunks, NT = _chunk_grid(B, T, varlen)
    tiles = (n_chunks if varlen is not None else B * n_chunks) * 4
    qd, kd, kr = (torch.empty(B, T, HV, K, device=k.device, dtype=k.dtype) for _ in range(3))
    inv, mqk = (torch.empty(tiles, HV, 16, 16, device=k.device, dtype=k.dtype) for _ in range(2))
    dec = torch.empty(tiles, HV, K, device=k.device, dtype=torch.float32)
    out = dict(qd=qd, kd=kd, kr=kr, inv=inv, mqk=mqk, dec=dec)
    if config.kda16_prep_cuda and kda16_cuda.applies(q, k, g, beta):
        kda16_cuda.launch(q, k, g, beta, out, scale=scale, norm_q=norm_q, norm_k=norm_k, varlen=varlen, T=T, NT=NT,
                          n_chunks=n_chunks)
        return out
    kernel = kda16_prep_kernel_any_t if config.kda16_prep.generic_t else kda16_prep_kernel
    _launch(kernel, (n_chunks, B * HV, 4), config.kda16_prep,
            q, k, g, beta, qd, kd, kr, inv, mqk, dec, *_varlen_args(varlen), T, NT, float(scale), H=H, HV=HV,
            K=K, BK=next_pow2(K), BKS=kda16_step(config.kda16_prep, K), IS_VARLEN=varlen is not None, NORM_Q=norm_q,
            NORM_K=norm_k, TF32_GRAMS=config.kda16_prep.tf32_grams and k.dtype != torch.float32,
            MMA_SUMS=config.kda16_prep.mma_sums and k.dtype != torch.float32, hooks=on_launch)
    return out


def kda16_loop(tiles: dict, v, *, initial_state=None, output_final_state=False, varlen=None,
               config: GDNConfig = DEFAULT_CONFIG, on_launch=None):
    """The 16-token form's loop over :func:`kda16_prepare`'s tiles: (o like v, final_state [N,HV,K,V] or None)."""
    kd = tiles["kd"]
    B, T, HV, K = kd.shape
    V = v.shape[3]
    N = varlen.num_seqs if varlen is not None else B
    _, NT = _chunk_grid(B, T, varlen)
    o = torch.empty_like(v)
    ht = _final_state(N, HV, K, V, kd.device, output_final_state)
    cfg = config.kda16_loop
    BV = block(cfg.BV, V)
    _launch(kda16_loop_kernel, (cdiv(V, BV), N * HV), cfg,
            tiles["qd"], kd, tiles["kr"], v, tiles["inv"], tiles["mqk"], tiles["dec"], o, initial_state, ht,
            None if varlen is None else varlen.cu_seqlens, None if varlen is None else varlen.chunk_offsets, T, NT,
            HV=HV, K=K, BK=next_pow2(K), V=V, BV=BV, IS_VARLEN=varlen is not None, USE_H0=initial_state is not None,
            STORE_HT=output_final_state, PREC=_precision(kd.dtype), hooks=on_launch)
    return o, ht


def _reads_k_rstd_tile(config: GDNConfig, rstd_k) -> bool:
    """Whether the in-loop kernel reads k's rstd from chunk_aqk's quads (fused_qk, ``config.fused_out.k_rstd_tile``)."""
    return rstd_k is not None and config.fused_out.k_rstd_tile


def _in_loop_forward(q, k, v, beta, g_cs, A, rstd_k, ssq_k, fuse_q, scale, initial_state, output_final_state, run):
    """GDN's forward after gram_solve under ``config.in_loop``: chunk_aqk unless "wu_aqk", then the loop.
    ``run``: every stage's varlen, config and on_launch."""
    aqk = c_q = None
    if run["config"].in_loop == "wu":
        tile = _reads_k_rstd_tile(run["config"], rstd_k)
        aqk, c_q = chunk_aqk(q, k, g_cs, fuse_q=fuse_q, ssq_k=ssq_k, rstd_k=rstd_k, k_tile=tile, **run)
    return state_output_in_loop(q, k, v, beta, g_cs, A, aqk, c_q, rstd_k, scale=scale,
                                initial_state=initial_state, output_final_state=output_final_state, **run)


# ----------------------------------------------------------------------------- entry point
def _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, norm, per_channel=False):
    if norm not in NORM_MODES:
        raise ValueError(f"norm must be one of {NORM_MODES}, got {norm!r}")
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B,T,H,K], got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:2] != (B, T):
        raise ValueError(f"v must be [B,T,HV,V] with B,T={B},{T}, got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"HV={HV} must be a multiple of H={H}")
    g_shape, g_name = ((B, T, HV, K), "[B,T,HV,K]") if per_channel else ((B, T, HV), "[B,T,HV]")
    if g.shape != g_shape:
        raise ValueError(f"g must be {g_name}={g_shape}, got {tuple(g.shape)}")
    if beta.shape != (B, T, HV):
        raise ValueError(f"beta must be [B,T,HV]={(B, T, HV)}, got {tuple(beta.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v must share one of fp16/bf16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"packed varlen input needs B == 1, got B={B}")
    if initial_state is not None:
        N = (cu_seqlens.numel() - 1) if cu_seqlens is not None else B
        if initial_state.shape != (N, HV, K, V):
            raise ValueError(f"initial_state must be {(N, HV, K, V)}, got {tuple(initial_state.shape)}")
    if norm.startswith("fused"):
        tensors = (q, k, v, g, beta, initial_state)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            raise ValueError(f"norm={norm!r} is forward-only: inputs must not require grad "
                             "(use norm='flag' under torch.no_grad(), or detach)")
        if torch.compiler.is_compiling():
            raise ValueError(f"norm={norm!r} is forward-only and not traceable by torch.compile; use norm='flag'")


def chunk_gdn(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None, norm="flag", config: GDNConfig | None = None,
              chunk_indices: VarlenInfo | None = None, on_launch=None):
    """Chunked Gated DeltaNet forward.  Returns (o [B,T,HV,V] in v's dtype, final_state or None).

    ``chunk_indices``: a :class:`VarlenInfo` from :func:`prepare_varlen` (built here if omitted).
    ``on_launch(kernel, compiled)``: called after each kernel's launch (fix-up launches aside)."""
    _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, norm)
    with torch.no_grad():
        config = config or default_config(q.shape[-1], v.shape[-1], q.element_size())
        return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, norm,
                        config, chunk_indices, on_launch=on_launch)


def chunk_kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None, norm="flag", lower_bound=None, config: GDNConfig | None = None,
              chunk_indices: VarlenInfo | None = None, check_gates: bool = True, on_launch=None):
    """Chunked Kimi Delta Attention forward.  Returns (o [B,T,HV,V] in v's dtype, final_state or None).

    As :func:`chunk_gdn` (shapes, GVA, varlen, ``norm``, ``config``, ``on_launch``) but g [B,T,HV,K] is a
    per-channel natural-log decay: S = diag(exp(g_t)) S; S += k_t (beta_t (v_t - S^T k_t))^T.

    ``lower_bound`` states the bounded-gate contract g in [lower_bound, 0) with lower_bound in
    [-5, 0): the intra-chunk gate factors then take the fast form (at most 15 tokens of decay, e^75,
    in one factor; see kernels/intra.py).  ``check_gates`` checks the data against it before launch
    (one reduction and a device sync) and raises ValueError where a gate falls below it; pass False
    only where the gates were checked already (a benchmark checks its inputs once, not per call).
    None: gates of any magnitude (FLA's tests use -1000), computed with factors that never exceed 1;
    the diagonal 16-blocks of the grams are then summed per entry, a slower intra-chunk stage."""
    if lower_bound is not None and not KDA_MIN_LOWER_BOUND <= lower_bound < 0:
        raise ValueError(f"lower_bound must be in [{KDA_MIN_LOWER_BOUND:g}, 0) (the bounded-gate contract "
                         f"g in [lower_bound, 0)), got {lower_bound!r}")
    _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, norm, per_channel=True)
    if lower_bound is not None and check_gates:
        check_kda_gates(g, lower_bound)
    with torch.no_grad():
        if config is None:
            config = default_config(q.shape[-1], v.shape[-1], q.element_size(), "kda")
            if lower_bound is None:
                config = _unbounded_default(config)
        return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, norm,
                        config, chunk_indices, unbounded=lower_bound is None, on_launch=on_launch)


def _unbounded_default(config: GDNConfig) -> GDNConfig:
    """The default config with kda_intra at 4 warps for the unbounded form: at 2 warps (BK 32, 1 stage) it
    spills on sm_90 (Triton 3.6, offline, K = V = 128 bf16: 255 registers and 600 B of stack under flag,
    760 B under fused_qk); at 4 warps, BK 16, 3 stages 252 registers and no stack under flag, 8 B under
    fused_qk (results/offline-sm100/kernel_resources.md).  Untimed."""
    return dataclasses.replace(config, kda_intra=dataclasses.replace(config.kda_intra, num_warps=4))


def check_kda_gates(g: torch.Tensor, lower_bound: float) -> None:
    """Raise ValueError if a KDA gate lies below ``lower_bound`` (or is NaN): the bounded form of the
    intra-chunk kernel would overflow there.  One reduction and a device sync."""
    with torch.no_grad():
        low = g.detach().amin().item() if g.numel() else 0.0
    if not low >= lower_bound:
        raise ValueError(f"KDA gates fall below lower_bound={lower_bound:g} (min g = {low:g}); pass "
                         "lower_bound=None for gates without a bound")


def stage_kernels(config: GDNConfig, family: str, route: str) -> tuple[str, ...]:
    """The tuned kernels (kernels/cache_key.KERNEL_FUNCTIONS) a forward launches under ``config`` on ``route``
    (explicit: the caller's l2norm, then flag's kernels), following :func:`_forward`; GDN's path must be pinned
    (``config.one_pass`` set, as the gdnbench backend does per shape)."""
    if family == "gdn" and config.one_pass is None and config.in_loop is None:
        raise ValueError("stage_kernels: GDN's path is decided per shape; pin config.one_pass first")
    out = ("l2norm",) if route != "fused_qk" else ()
    last = "output_fused" if route.startswith("fused") else "output"
    if family == "kda":
        if config.kda_chunk16:
            return out + ("kda16_prep", "kda16_loop")
        return out + ("kda_intra", "wu") + (("kda_state_out",) if config.one_pass else ("state", last))
    if config.in_loop is not None:
        return out + ("gram",) + (() if config.in_loop == "wu_aqk" else ("aqk",)) + ("fused_out",)
    return out + ("gram", "wu") + (("aqk", "state_out") if config.one_pass else ("state", last))


def _forward(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, norm, config, chunk_indices,
             unbounded=False, on_launch=None):
    K, V = q.shape[-1], v.shape[-1]
    per_channel = g.dim() == 4
    validate(config, K, V, q.element_size(), "kda" if per_channel else "gdn")
    if config.in_loop == "wu_aqk" and norm.startswith("fused"):
        raise ValueError(f"config.in_loop='wu_aqk' forms q k^T on q as given, so it takes norm 'none' or 'flag', "
                         f"not {norm!r} (q's rstd would be needed in the loop); use in_loop='wu'")
    scale = K**-0.5 if scale is None else scale
    varlen = None
    if cu_seqlens is not None:
        varlen = chunk_indices if chunk_indices is not None else prepare_varlen(cu_seqlens)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g, beta = g.contiguous(), beta.contiguous()
    if initial_state is not None:
        initial_state = initial_state.to(torch.float32).contiguous()

    if norm in ("flag", "fused_q"):
        k = l2norm(k, config.l2norm, on_launch)
    if norm == "flag":
        q = l2norm(q, config.l2norm, on_launch)
    fuse_k, fuse_q = norm == "fused_qk", norm in FUSED_ROUTES
    run = dict(varlen=varlen, config=config, on_launch=on_launch)  # every stage's

    if per_channel and config.kda_chunk16:
        if unbounded:
            raise ValueError("config.kda_chunk16=True needs bounded gates (lower_bound): its 16-token grams "
                             "take k 2^-c in one factor")
        return kda_chunk16(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, norm_q=fuse_q, norm_k=fuse_k, **run)
    if per_channel:
        g_cs, A, aqk, rstd_k = kda_intra(q, k, g, beta, fuse_k=fuse_k, raw_q=fuse_q, unbounded=unbounded, **run)
        w, u, kg = recompute_wu(k, v, beta, A, g_cs, rstd_k=rstd_k, **run)
        if config.one_pass:
            return kda_state_output(q, kg, w, u, g_cs, aqk, scale=scale, fuse_q=fuse_q, initial_state=initial_state,
                                    output_final_state=output_final_state, **run)
        h, v_new, final_state = state_recurrence(kg, w, u, g_cs, initial_state=initial_state,
                                                 output_final_state=output_final_state, **run)
        o = chunk_output(q, None, v_new, h, g_cs, scale=scale, fuse_q=fuse_q, aqk=aqk, **run)
        return o, final_state
    g_cs, A, rstd_k, ssq_k = gram_solve(k, g, beta, fuse_k=fuse_k, **run)
    if config.in_loop is not None:
        return _in_loop_forward(q, k, v, beta, g_cs, A, rstd_k, ssq_k, fuse_q, scale, initial_state,
                                output_final_state, run)
    w, u, _ = recompute_wu(k, v, beta, A, g_cs, rstd_k=rstd_k, **run)
    B, T, HV = beta.shape
    if one_pass(config, K, HV, B * T, T if varlen is None else varlen.max_len):
        aqk, c_q = chunk_aqk(q, k, g_cs, fuse_q=fuse_q, ssq_k=ssq_k, **run)
        return state_output(q, k, w, u, g_cs, aqk, c_q, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, **run)
    h, v_new, final_state = state_recurrence(k, w, u, g_cs, initial_state=initial_state,
                                             output_final_state=output_final_state, **run)
    o = chunk_output(q, k, v_new, h, g_cs, scale=scale, rstd_k=rstd_k, ssq_k=ssq_k, fuse_q=fuse_q, **run)
    return o, final_state

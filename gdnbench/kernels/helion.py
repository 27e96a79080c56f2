"""Our chunked Gated DeltaNet forward with its last two stages written in Helion.

Conventions as :func:`gdnbench.kernels.ops.chunk_gdn` (FLA 0.6.0 ``chunk_gated_delta_rule``): q, k [B,T,H,K];
v [B,T,HV,V] (HV % H == 0, value head i reads key head i // (HV // H)); g natural-log decay per token
and beta (post-sigmoid) [B,T,HV]; states [N,HV,K,V] fp32; packed varlen: B == 1 with int64
cu_seqlens [N+1].

Stages (chunk size 64), and which of them run in Helion:

- ``l2norm`` (Helion, routes ``flag`` and ``fused_q`` (k only)): ``x / sqrt(sum x^2 + 1e-6)`` in fp32,
  FLA's convention; a row whose sum of squares reaches 2^100 is normalized from a pre-scaled sum
  (as gdnbench.kernels.ops.l2norm), so huge rows come out normalized instead of 0.
- gate cumsum + beta K K^T gram + (I + A)^-1 solve, and w / u: our Triton kernels
  (:func:`gdnbench.kernels.ops.gram_solve`, :func:`gdnbench.kernels.ops.recompute_wu`) at their default configs;
  for KDA (per-channel g [B,T,HV,K]) :func:`gdnbench.kernels.ops.kda_intra` (per-channel cumsum, the gated
  K K^T and Q K^T grams, the solve) and recompute_wu, which also writes kg = k * exp2(c_last - c).
- ``state`` (Helion): the inter-chunk recurrence. One program owns a [K, BV] slab of one
  (sequence, value head) state and walks the sequence's chunks in order (decays in log2 units,
  c = the chunk-local cumsum that gram_solve stores)::

      h[chunk] = S;  v_new = u - w S;  S = exp2(c_last) S + k^T (exp2(c_last - c) * v_new)

- ``output`` (Helion): per (chunk, value head, V block), over K tiles, the products q h and q k^T;
  then ``o = scale * (exp2(c) * (q h) + causal(q k^T * exp2(c_i - c_j)) v_new)``. With ``fuse_q``
  (route ``fused_q``) q arrives raw: its row sums of squares are the diagonal of one more product,
  q q^T, accumulated in the same K loop (a plain sum of the squared q tile in a software-pipelined
  loop gave wrong sums in our Triton output kernel on the H200, the dot never did), and one row
  scale 1/sqrt(ssq + 1e-6) is applied to both q-terms at the end, before the cast of the
  intra-chunk matrix (every q-term is linear in q's row). A chunk holding a row whose sum reached
  2^100 re-reads its q rows for the pre-scaled sums (rare path).

KDA (``state_kda``, ``output_kda``, Helion): the same walk with ``h = diag(exp2(c_last)) h + kg^T v_new``
(each state row decays by its own channel), and ``o = scale * ((q * exp2(c)) h + Aqk v_new)`` with the
gated causal q k^T (Aqk) from the intra stage; under ``fuse_q`` Aqk is built on raw q and q's row
rstd (same q q^T diagonal, same rare path) scales each output row once, at the end.

Every kernel runs on the packed token axis: fixed-length [B,T] input is viewed as [1,B*T] with
cu_seqlens [0,T,..,B*T] (built by the caller, outside any timed region), so one kernel serves both.

Configs: each kernel is wrapped per autotune effort (:func:`kernel`); :func:`run_stage` binds it to
its arguments and runs Helion's default config, a given (cached) config, or tunes one. Under
``HELION_INTERPRET=1`` (or :func:`set_eager`) the kernel bodies run as eager PyTorch.
"""

from __future__ import annotations

import functools
import os

import torch

import helion
import helion.language as hl

CHUNK = 64
EPS = 1e-6
SSQ_BIG = 2.0**100  # a row's sum of squares at or above this is taken from the pre-scaled sum
SSQ_LO = 2.0**-70  # the pre-scale (a power of two: exact)
STAGES = ("l2norm", "state", "output", "state_kda", "output_kda")  # the Helion kernels, by name
def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 operands: three tf32 products (about fp32), as gdnbench.kernels.ops does; 16-bit: tf32 (unused)."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


# ----------------------------------------------------------------------------- kernel bodies
def _l2norm_body(x: torch.Tensor) -> torch.Tensor:
    """y[m] = x[m] / sqrt(sum x[m]^2 + eps) in fp32, cast back; x [M, D] contiguous."""
    M, D = x.size()
    D = hl.specialize(D)
    y = torch.empty_like(x)
    for tile_m in hl.tile(M):
        xf = x[tile_m, :].to(torch.float32)
        ssq = torch.sum(xf * xf, dim=-1)
        xl = xf * SSQ_LO
        lo = torch.sum(xl * xl, dim=-1)
        big = ssq >= SSQ_BIG
        plain = xf * torch.rsqrt(ssq + EPS)[:, None]
        huge = xl * torch.rsqrt(torch.where(big, lo, 1.0))[:, None]
        y[tile_m, :] = torch.where(big[:, None], huge, plain).to(y.dtype)
    return y


def _state_body(
    k: torch.Tensor,  # [T, H, K]
    w: torch.Tensor,  # [T, HV, K]
    u: torch.Tensor,  # [T, HV, V]
    g_cs: torch.Tensor,  # [T, HV] fp32, chunk-local cumsum of g in log2 units
    h0: torch.Tensor | None,  # [N, HV, K, V] fp32
    cu_seqlens: torch.Tensor,  # [N+1] int64
    chunk_offsets: torch.Tensor,  # [N+1] int32: first global chunk of each sequence
    n_chunks: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h [n_chunks, HV, K, V] in k's dtype: the state entering each chunk, v_new like u,
    final states [N, HV, K, V] fp32)."""
    T, H, K = k.size()
    HV = w.size(1)
    V = u.size(2)
    K = hl.specialize(K)
    group = HV // H
    N = cu_seqlens.size(0) - 1
    h = torch.empty([n_chunks, HV, K, V], dtype=k.dtype, device=k.device)
    v_new = torch.empty_like(u)
    ht = torch.empty([N, HV, K, V], dtype=torch.float32, device=k.device)
    for tile_n, tile_hv, tile_v in hl.tile([N, HV, V], block_size=[1, 1, None]):
        i_n = tile_n.begin
        i_hv = tile_hv.begin
        i_h = i_hv // group
        if h0 is not None:
            b_h = h0[i_n, i_hv, :, tile_v].to(torch.float32)
        else:
            b_h = hl.zeros([K, tile_v], dtype=torch.float32)
        bos = cu_seqlens[i_n]
        eos = cu_seqlens[i_n + 1]
        boh = chunk_offsets[i_n]
        for tile_j in hl.tile(boh, chunk_offsets[i_n + 1], block_size=1):
            i_c = tile_j.begin  # global chunk index: the row of h
            h[i_c, i_hv, :, tile_v] = b_h.to(h.dtype)
            tok0 = bos + (i_c - boh) * 64
            # one step: the chunk's rows as a tile, masked at the sequence's end
            for tile_t in hl.tile(tok0, torch.minimum(tok0 + 64, eos), block_size=64):
                b_w = w[tile_t, i_hv, :]
                b_vn = u[tile_t, i_hv, tile_v].to(torch.float32) - hl.dot(b_w, b_h.to(b_w.dtype))
                v_new[tile_t, i_hv, tile_v] = b_vn.to(v_new.dtype)
                c = g_cs[tile_t, i_hv]
                c_last = g_cs[tile_t.end - 1, i_hv]
                # rows past the sequence's end load as 0 in k, w, u: they add nothing below
                b_vd = (b_vn * torch.exp2(c_last - c)[:, None]).to(k.dtype)
                b_k = k[tile_t, i_h, :]
                b_h = hl.dot(b_k.transpose(0, 1), b_vd, acc=b_h * torch.exp2(c_last))
        ht[i_n, i_hv, :, tile_v] = b_h
    return h, v_new, ht


def _output_body(
    q: torch.Tensor,  # [T, H, K]
    k: torch.Tensor,  # [T, H, K]
    v_new: torch.Tensor,  # [T, HV, V]
    h: torch.Tensor,  # [n_chunks, HV, K, V]
    g_cs: torch.Tensor,  # [T, HV] fp32 (log2 units)
    cu_seqlens: torch.Tensor,  # [N+1] int64
    chunk_indices: torch.Tensor,  # [n_chunks, 2] int32: (sequence, chunk within it)
    scale: float,
    fuse_q: hl.constexpr,
) -> torch.Tensor:
    """o [T, HV, V] in v_new's dtype (module docstring)."""
    T, H, K = q.size()
    HV = v_new.size(1)
    V = v_new.size(2)
    K = hl.specialize(K)
    group = HV // H
    n_chunks = chunk_indices.size(0)
    o = torch.empty_like(v_new)
    for tile_c, tile_hv, tile_v in hl.tile([n_chunks, HV, V], block_size=[1, 1, None]):
        i_c = tile_c.begin
        i_hv = tile_hv.begin
        i_h = i_hv // group
        i_n = chunk_indices[i_c, 0]
        tok0 = cu_seqlens[i_n] + chunk_indices[i_c, 1] * 64
        eos = cu_seqlens[i_n + 1]
        idx = hl.arange(64)
        rows = tok0 + idx
        valid = rows < eos
        b_o = hl.zeros([64, tile_v], dtype=torch.float32)
        b_s = hl.zeros([64, 64], dtype=torch.float32)
        b_qq = hl.zeros([64, 64], dtype=torch.float32)
        for tile_k in hl.tile(K):
            b_q = hl.load(q, [rows, i_h, tile_k], extra_mask=valid[:, None])
            b_k = hl.load(k, [rows, i_h, tile_k], extra_mask=valid[:, None])
            b_h = h[i_c, i_hv, tile_k, tile_v]
            b_o = hl.dot(b_q, b_h, acc=b_o)
            b_s = hl.dot(b_q, b_k.transpose(0, 1), acc=b_s)
            if fuse_q:
                b_qq = hl.dot(b_q, b_q.transpose(0, 1), acc=b_qq)
        c = hl.load(g_cs, [rows, i_hv], extra_mask=valid)
        b_o = b_o * torch.exp2(c)[:, None]
        keep = (idx[:, None] >= idx[None, :]) & valid[:, None] & valid[None, :]
        b_s = torch.where(keep, b_s * torch.exp2(c[:, None] - c[None, :]), 0.0)
        if fuse_q:
            ssq = torch.sum(torch.where(idx[:, None] == idx[None, :], b_qq, 0.0), dim=-1)
            lo = torch.zeros_like(ssq)
            if torch.amax(ssq) >= SSQ_BIG:  # rare: a huge q row; its rstd from pre-scaled sums
                for tile_k2 in hl.tile(K):
                    b_ql = hl.load(q, [rows, i_h, tile_k2], extra_mask=valid[:, None]).to(torch.float32) * SSQ_LO
                    lo = lo + torch.sum(b_ql * b_ql, dim=-1)
            big = ssq >= SSQ_BIG
            r_q = torch.where(big, SSQ_LO * torch.rsqrt(torch.where(big, lo, 1.0)),
                              torch.rsqrt(torch.where(big, 1.0, ssq) + EPS))
            b_o = b_o * r_q[:, None]
            b_s = b_s * r_q[:, None]
        b_vn = hl.load(v_new, [rows, i_hv, tile_v], extra_mask=valid[:, None])
        b_o = hl.dot(b_s.to(b_vn.dtype), b_vn, acc=b_o) * scale
        hl.store(o, [rows, i_hv, tile_v], b_o.to(o.dtype), extra_mask=valid[:, None])
    return o


def _state_kda_body(
    kg: torch.Tensor,  # [T, HV, K]: k * exp2(c_last - c) per channel, from the w/u stage
    w: torch.Tensor,  # [T, HV, K]
    u: torch.Tensor,  # [T, HV, V]
    g_cs: torch.Tensor,  # [T, HV, K] fp32, chunk-local per-channel cumsum in log2 units
    h0: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    chunk_offsets: torch.Tensor,
    n_chunks: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KDA's recurrence: each state row decays by its own channel, h = diag(exp2(c_last)) h + kg^T v_new."""
    T, HV, K = kg.size()
    V = u.size(2)
    K = hl.specialize(K)
    N = cu_seqlens.size(0) - 1
    h = torch.empty([n_chunks, HV, K, V], dtype=kg.dtype, device=kg.device)
    v_new = torch.empty_like(u)
    ht = torch.empty([N, HV, K, V], dtype=torch.float32, device=kg.device)
    for tile_n, tile_hv, tile_v in hl.tile([N, HV, V], block_size=[1, 1, None]):
        i_n = tile_n.begin
        i_hv = tile_hv.begin
        if h0 is not None:
            b_h = h0[i_n, i_hv, :, tile_v].to(torch.float32)
        else:
            b_h = hl.zeros([K, tile_v], dtype=torch.float32)
        bos = cu_seqlens[i_n]
        eos = cu_seqlens[i_n + 1]
        boh = chunk_offsets[i_n]
        for tile_j in hl.tile(boh, chunk_offsets[i_n + 1], block_size=1):
            i_c = tile_j.begin
            h[i_c, i_hv, :, tile_v] = b_h.to(h.dtype)
            tok0 = bos + (i_c - boh) * 64
            for tile_t in hl.tile(tok0, torch.minimum(tok0 + 64, eos), block_size=64):
                b_w = w[tile_t, i_hv, :]
                b_vn = u[tile_t, i_hv, tile_v].to(torch.float32) - hl.dot(b_w, b_h.to(b_w.dtype))
                v_new[tile_t, i_hv, tile_v] = b_vn.to(v_new.dtype)
                gl = g_cs[tile_t.end - 1, i_hv, :]
                b_kg = kg[tile_t, i_hv, :]
                b_h = hl.dot(b_kg.transpose(0, 1), b_vn.to(kg.dtype), acc=b_h * torch.exp2(gl)[:, None])
        ht[i_n, i_hv, :, tile_v] = b_h
    return h, v_new, ht


def _output_kda_body(
    q: torch.Tensor,  # [T, H, K]
    v_new: torch.Tensor,  # [T, HV, V]
    h: torch.Tensor,  # [n_chunks, HV, K, V]
    g_cs: torch.Tensor,  # [T, HV, K] fp32 (log2 units)
    aqk: torch.Tensor,  # [T, HV, 64]: the gated causal q k^T of each chunk (unscaled), from the intra stage
    cu_seqlens: torch.Tensor,
    chunk_indices: torch.Tensor,
    scale: float,
    fuse_q: hl.constexpr,
) -> torch.Tensor:
    """KDA's output: o = scale * ((q * exp2(c)) h + Aqk v_new). With fuse_q, Aqk was built on raw q (its
    rows are linear in q's), and q's row rstd (from the q q^T diagonal) scales each output row once."""
    T, H, K = q.size()
    HV = v_new.size(1)
    V = v_new.size(2)
    K = hl.specialize(K)
    group = HV // H
    n_chunks = chunk_indices.size(0)
    o = torch.empty_like(v_new)
    for tile_c, tile_hv, tile_v in hl.tile([n_chunks, HV, V], block_size=[1, 1, None]):
        i_c = tile_c.begin
        i_hv = tile_hv.begin
        i_h = i_hv // group
        i_n = chunk_indices[i_c, 0]
        tok0 = cu_seqlens[i_n] + chunk_indices[i_c, 1] * 64
        eos = cu_seqlens[i_n + 1]
        idx = hl.arange(64)
        rows = tok0 + idx
        valid = rows < eos
        b_o = hl.zeros([64, tile_v], dtype=torch.float32)
        b_qq = hl.zeros([64, 64], dtype=torch.float32)
        for tile_k in hl.tile(K):
            b_q = hl.load(q, [rows, i_h, tile_k], extra_mask=valid[:, None])
            b_g = hl.load(g_cs, [rows, i_hv, tile_k], extra_mask=valid[:, None])
            b_qg = (b_q.to(torch.float32) * torch.exp2(b_g)).to(b_q.dtype)  # |q exp(g)| <= |q|
            b_o = hl.dot(b_qg, h[i_c, i_hv, tile_k, tile_v], acc=b_o)
            if fuse_q:
                b_qq = hl.dot(b_q, b_q.transpose(0, 1), acc=b_qq)
        b_a = hl.load(aqk, [rows, i_hv, slice(None)], extra_mask=valid[:, None])
        b_vn = hl.load(v_new, [rows, i_hv, tile_v], extra_mask=valid[:, None])
        b_o = hl.dot(b_a, b_vn.to(b_a.dtype), acc=b_o)
        if fuse_q:
            ssq = torch.sum(torch.where(idx[:, None] == idx[None, :], b_qq, 0.0), dim=-1)
            lo = torch.zeros_like(ssq)
            if torch.amax(ssq) >= SSQ_BIG:
                for tile_k2 in hl.tile(K):
                    b_ql = hl.load(q, [rows, i_h, tile_k2], extra_mask=valid[:, None]).to(torch.float32) * SSQ_LO
                    lo = lo + torch.sum(b_ql * b_ql, dim=-1)
            big = ssq >= SSQ_BIG
            r_q = torch.where(big, SSQ_LO * torch.rsqrt(torch.where(big, lo, 1.0)),
                              torch.rsqrt(torch.where(big, 1.0, ssq) + EPS))
            b_o = b_o * (r_q * scale)[:, None]
        else:
            b_o = b_o * scale
        hl.store(o, [rows, i_hv, tile_v], b_o.to(o.dtype), extra_mask=valid[:, None])
    return o


BODIES = {"l2norm": _l2norm_body, "state": _state_body, "output": _output_body,
          "state_kda": _state_kda_body, "output_kda": _output_kda_body}
_EAGER = {"on": False}


def set_eager(on: bool) -> None:
    """Run the kernel bodies as eager PyTorch (Helion's ref mode, what HELION_INTERPRET=1 does) from now on.

    For tests run under TRITON_INTERPRET=1 (our Triton stages need it on the CPU), where Helion
    refuses the HELION_INTERPRET environment variable."""
    _EAGER["on"] = bool(on)


@functools.lru_cache(maxsize=None)
def _kernel(name: str, effort: str, precision: str, eager: bool):
    kw = dict(autotune_effort=effort, dot_precision=precision, static_shapes=True)
    if eager:
        kw["ref_mode"] = helion.RefMode.EAGER
    return helion.kernel(BODIES[name], **kw)


def kernel(name: str, effort: str = "none", dtype: torch.dtype = torch.bfloat16):
    """Our Helion kernel ``name`` (STAGES) with Helion's autotune effort ``effort``."""
    return _kernel(name, effort, _dot_precision(dtype), _EAGER["on"])


def _eager() -> bool:
    return _EAGER["on"] or os.environ.get("HELION_INTERPRET", "0") == "1"


# ----------------------------------------------------------------------------- configs
class StageRunner:
    """How each Helion stage gets its config: ``mode`` 'default' (Helion's default config, no tuning),
    'cached' (``configs[name]``, a helion.Config) or 'tune' (Helion's autotuner at ``effort`` on the
    first arguments seen; the found configs end up in ``configs`` and ``on_tuned`` is told).

    ``bound(name, args)`` is the kernel bound to its arguments with its config set, ready to call:
    bind and set_config happen once per argument specialization (a host-side step that prepare
    does, outside any timed region)."""

    def __init__(self, mode: str = "default", effort: str = "none", configs: dict | None = None,
                 on_tuned=None):
        if mode not in ("default", "cached", "tune"):
            raise ValueError(f"mode {mode!r}")
        self.mode, self.effort = mode, effort
        self.configs: dict = dict(configs or {})
        self.on_tuned = on_tuned
        self.tuned_now: list[str] = []

    def bound(self, name: str, args: tuple, dtype: torch.dtype):
        k = kernel(name, self.effort if self.mode == "tune" else "none", dtype)
        b = k.bind(args)
        if _eager():
            return b
        if getattr(b, "_config", None) is not None:  # bound (and configured) before, e.g. by another route
            if self.mode != "default":
                self.configs.setdefault(name, b._config)  # so the gate's shortened copy runs it too
            return b
        if self.mode == "tune" and name not in self.configs:
            cfg = b.autotune(args, force=True)
            self.configs[name] = cfg
            self.tuned_now.append(name)
            if self.on_tuned is not None:
                self.on_tuned(name, cfg)
            return b
        cfg = self.configs.get(name)
        b.set_config(cfg if cfg is not None else b.config_spec.default_config())
        return b


# ----------------------------------------------------------------------------- the forward
def packed_layout(B: int, T: int, cu_seqlens: torch.Tensor | None, device) -> torch.Tensor:
    """int64 cu_seqlens of the packed token axis: the given one, or [0, T, .., B*T] for fixed length."""
    if cu_seqlens is not None:
        return cu_seqlens.to(torch.int64).contiguous()
    return torch.arange(0, (B + 1) * T, T, dtype=torch.int64, device=device)


def l2norm(x: torch.Tensor, runner: StageRunner | None = None) -> torch.Tensor:
    """Helion l2norm over the last dim (FLA's convention, overflow-safe)."""
    runner = runner or StageRunner()
    D = x.shape[-1]
    x2 = x.contiguous().view(-1, D)
    if x2.shape[0] == 0:
        return torch.empty_like(x)
    return runner.bound("l2norm", (x2,), x.dtype)(x2).view(x.shape)


def prepare_forward(q, k, v, g, beta, *, scale: float, initial_state=None, cu_seqlens=None, norm: str = "none",
                    runner: StageRunner | None = None, triton_config=None, caller_norm=None):
    """Host-side preparation (outside any timed region): the packed layout, the chunk tables, the Triton
    stage config and the Helion kernels bound to these arguments. Returns a zero-argument closure
    that runs the forward and returns (o [B,T,HV,V], final_state [N,HV,K,V] fp32).

    ``norm``: 'none' (q, k as given), 'flag' (Helion l2norm of q and k first), 'fused_q' (Helion
    l2norm of k; q's norm folded into the Helion output kernel). ``caller_norm`` (with norm 'none'):
    a function the call applies to q and k first, the caller's own l2norm of route explicit."""
    from . import ops

    if norm not in ("none", "flag", "fused_q"):
        raise ValueError(f"norm must be none, flag or fused_q, got {norm!r}")
    if caller_norm is not None and norm != "none":
        raise ValueError("caller_norm goes with norm='none'")
    runner = runner or StageRunner()
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"HV={HV} must be a multiple of H={H}")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"packed varlen input needs B == 1, got B={B}")
    dev = q.device
    cu = packed_layout(B, T, cu_seqlens, dev)
    info = ops.prepare_varlen(cu)
    tot = B * T
    qp = q.contiguous().view(1, tot, H, K)
    kp = k.contiguous().view(1, tot, H, K)
    vp = v.contiguous().view(1, tot, HV, V)
    kda = g.dim() == 4  # per-channel gates [B,T,HV,K]: KDA
    gp = g.contiguous().view(1, tot, HV, K) if kda else g.contiguous().view(1, tot, HV)
    bp = beta.contiguous().view(1, tot, HV)
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    cfg = triton_config or ops.default_config(K, V, q.element_size(), "kda" if kda else "gdn")
    scale = float(scale)
    dt = q.dtype
    fuse_q = norm == "fused_q"
    tables = (info.cu_seqlens, info.chunk_offsets, info.num_chunks)

    def stages(qn, kn):
        """The Triton stages: (state kernel's arguments, output kernel's arguments less v_new and h)."""
        if kda:
            g_cs, A, aqk, _ = ops.kda_intra(qn, kn, gp, bp, varlen=info, raw_q=fuse_q, config=cfg)
            w, u, kg = ops.recompute_wu(kn, vp, bp, A, g_cs, varlen=info, config=cfg)
            return (kg[0], w[0], u[0], g_cs[0], h0) + tables, (qn[0], g_cs[0], aqk[0])
        g_cs, A, _, _ = ops.gram_solve(kn, gp, bp, varlen=info, config=cfg)
        w, u, _ = ops.recompute_wu(kn, vp, bp, A, g_cs, varlen=info, config=cfg)
        return (kn[0], w[0], u[0], g_cs[0], h0) + tables, (qn[0], kn[0], g_cs[0])

    def output_args(o_in, v_new, hs):
        if kda:
            q0, g_cs, aqk = o_in
            return (q0, v_new, hs, g_cs, aqk, info.cu_seqlens, info.chunk_indices, scale, fuse_q)
        q0, k0, g_cs = o_in
        return (q0, k0, v_new, hs, g_cs, info.cu_seqlens, info.chunk_indices, scale, fuse_q)

    names = ("state_kda", "output_kda") if kda else ("state", "output")
    # bind once here (set_config / autotune happen now, not in the timed call); tuning needs real data,
    # so the inputs go through the pipeline once
    with torch.no_grad():
        kn = l2norm(kp, runner) if norm in ("flag", "fused_q") else (caller_norm(kp) if caller_norm else kp)
        qn = l2norm(qp, runner) if norm == "flag" else (caller_norm(qp) if caller_norm else qp)
        s_args, o_in = stages(qn, kn)
        st = runner.bound(names[0], s_args, dt)
        hs, v_new, _ = st(*s_args)
        ot = runner.bound(names[1], output_args(o_in, v_new, hs), dt)
        ln = runner.bound("l2norm", (kp.view(-1, K),), dt) if norm in ("flag", "fused_q") else None
        del hs, v_new, s_args, o_in

    def norm_rows(x):
        x2 = x.view(-1, x.shape[-1])
        return ln(x2).view(x.shape)

    def call():
        if caller_norm is not None:
            qq, kk = caller_norm(qp), caller_norm(kp)
        else:
            kk = norm_rows(kp) if ln is not None else kp
            qq = norm_rows(qp) if norm == "flag" else qp
        s_args, o_in = stages(qq, kk)
        hs, v_new, ht = st(*s_args)
        o = ot(*output_args(o_in, v_new, hs))
        return o.view(B, T, HV, V), ht

    return call


def chunk_gdn(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, norm="none", runner=None,
              caller_norm=None):
    """One-shot forward (prepare + run): (o [B,T,HV,V], final_state [N,HV,K,V] fp32). GDN with g [B,T,HV];
    KDA with per-channel g [B,T,HV,K] (bounded gate, g >= -5: the Triton intra stage's contract)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return prepare_forward(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                           norm=norm, runner=runner, caller_norm=caller_norm)()


__all__ = ["STAGES", "StageRunner", "chunk_gdn", "kernel", "l2norm", "prepare_forward", "set_eager"]

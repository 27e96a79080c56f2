"""Roofline floor of a forward call or a decode step: the fewest bytes it must move and the FLOPs it must do.

No torch, no GPU: everything here follows from the shape (and the route), plus a calibration
(`gdnbench.analysis.calibrate`: the GPU's measured copy bandwidth and bf16 matmul rate).

Notation
--------
T tokens in all, N sequences, H key heads, HV value heads, K / V head dims, e bytes per
element of the storage dtype (2 for bf16/fp16, 4 for fp32), C = 64 the chunk size. A sequence
of length L is cut into chunks of c = C tokens and a last chunk of L mod C tokens (if any).

Bytes floor ("fewest bytes"): every input read once, every output written once
--------------------------------------------------------------------------------
    q, k       2 * T*H*K*e
    v          T*HV*V*e
    g          T*HV*4          (GDN: one fp32 log-decay per token and value head)
               T*HV*K*4        (KDA: per channel)
    beta       T*HV*e          (post-sigmoid, storage dtype, as gdnbench.data.inputs draws it)
    h0         N*HV*K*V*4      (fp32, only when the shape has initial states)
    o          T*HV*V*e
    h_T        N*HV*K*V*4      (fp32 final state: the benchmark always asks for it)
  + route:     standalone l2norm passes, each reads its tensor and writes the normalized copy
               that the kernels then read again, i.e. 2*T*H*K*e more per pass:
               explicit, flag: q and k   (2 passes; explicit = the caller's, flag = the op's)
               fused_q:        k only    (q's norm is folded into the output kernel)
               fused_qk:       none      (both folded in)
               none:           none      (inputs already normalized; not a benchmark route)
Side outputs such as an l2norm's fp32 rstd and every intermediate of the chunked algorithm
(A, w, u, h per chunk, v_new) are not counted: a fully fused kernel would not need them in
DRAM. q and k are counted once per *key* head even with GVA (HV > H): the value heads sharing
a key head can share its reads through L2.

FLOP convention
---------------
A multiply-add counts as 2 FLOPs. Only matrix products are counted (the work that tensor
cores do); elementwise work (beta and gate scaling, exp of the cumulative gates, the
subtraction in v_new, masking, the state's decay, l2norm) is left out: it is
O(T*HV*(K+V+C) + T*HV*K*V/C) against O(T*HV*K*V) + O(T*HV*C*(K+V)), about 1 % at K = V = 128. Triangular products are counted
over the triangle they need (incl. the diagonal where it is needed), not as full squares.

FLOPs of the chunked algorithm (C = 64), per chunk of c tokens and per value head
-------------------------------------------------------------------------------
    gram       beta K K^T, strictly lower part                       K * c(c-1)
    solve      A = (I + L)^-1, L strictly lower c x c, by forward
               substitution: sum_{i>j} (i-j) multiply-adds           (c^3 - c) / 3
    w, u       w = A (beta e^g k), u = A (beta v), A lower incl.
               its diagonal                                           (K + V) * c(c+1)
    state      v_new = u - w h  and  h' = decay h + k~^T v_new        4 c K V
    output     q h                                                    2 c K V
               q k^T causal (incl. diagonal)  and  (q k^T) v_new      (K + V) * c(c+1)
  so  F(c) = 6 c K V + K c(c-1) + 2 (K+V) c(c+1) + (c^3 - c)/3,
  and for a full chunk, per token: 6KV + K(C-1) + 2(K+V)(C+1) + (C^2-1)/3
  (K = V = d: ~ 6d^2 + 5Cd + C^2/3; at d = 128, C = 64: 141,013 FLOPs per token and value head).
  F_chunked = HV * sum over chunks F(c), minus, for shapes without initial states, the two
  products with the zero state in each sequence's first chunk (w h and q h: 4 c_0 K V per
  sequence and value head). KDA has the same matmul count: its per-channel gate scales k and q
  elementwise before the same products. The last chunk's state update is counted: the final
  state is an output.
  `share_key_products=True` counts K K^T and q k^T once per key head instead of per value
  head (possible for GDN's scalar gate under GVA; neither FLA nor our kernels do it).

Minimal recurrent FLOPs (second figure): the token recurrence S^T k, the rank-1 update
k (beta (v - S^T k))^T and o = S^T q: 6 K V per token and value head, F_rec = 6 T HV K V.
The chunked algorithm's extra work over it is the intra-chunk O(C) part.

Decode step (shapes with decode = true, mode decode)
----------------------------------------------------
One new token for each of N sequences (T = N), the states in a pool at the shape's state dtype,
s bytes per element (4 fp32, 2 bf16). Bytes the step must move:
    q, k           2 * N*H*K*e
    v, o           2 * N*HV*V*e
    g              N*HV*4 (GDN) or N*HV*K*4 (KDA), fp32
    beta           N*HV*e
    state_read     N*HV*K*V*s      (the N states, read from their pool slots once)
    state_write    N*HV*K*V*s      (and written back once, in place, at the state dtype)
    indices        N*8             (int64 slot indices)
  + route:         the forward's standalone l2norm passes, 2*N*H*K*e each (explicit, flag: q and k).
At K = V = 128 the states are > 97 % of it. A backend that gathers the states into a temporary and
scatters them back (FLA 0.6.0's GDN recurrence takes no slot indices) moves more than this floor;
its achieved GB/s (floor bytes / time) shows the cost. FLOPs: the one-token recurrence,
F_rec = 6 N HV K V. With a warm L2 the small-N steps can run above DRAM bandwidth.

How others count
----------------
* FlashInfer, benchmarks/bench_gdn_prefill.py (`_gdn_tflops`, read at commit 028cc7a4 of
  flashinfer-ai/flashinfer): flops = 2 * total_tokens * h_v * d * d * 2, "2 GEMMs (kv outer
  product + q@state) per token per head", i.e. 4 T HV d^2: the recurrent count without the
  S^T k retrieval and without any intra-chunk work. Its TFLOPS column is ~0.46x of ours at
  d = 128 (65,536 vs 141,013 per token and value head).
* Kimi Linear technical report (arXiv 2510.26692), as quoted by NVIDIA NeMo AutoModel's
  kimi_linear flops docs ("KDA's forward kernel count per head is 6Sd^2 + 3SCd + SC^2, with
  C=64") and by a public summary of the report: FLOPs_KDA(T; C, d_h) = 6 T d_h^2 + 3 T C d_h
  + T C^2 per head. I could not open the report's own text to check its counting rules.
  Same leading 6 T d^2 term as ours; its C terms (3Cd + C^2 = 28,672 at d = 128) differ from
  ours (5Cd + C^2/3 ~ 42,709): ours counts each triangular product over its triangle at 2
  FLOPs per multiply-add. Ours is 1.11x the Kimi figure at d = 128, C = 64.

Floor
-----
    memory_us  = bytes / bandwidth        (bandwidth: measured device-to-device copy,
                                           bytes read + written per second)
    compute_us = flops / matmul_rate      (bf16 8192^3 matmul, 2 n^3 FLOPs per product)
    floor_us   = max(memory_us, compute_us), `binding` names the larger term;
    fraction   = floor_us / measured median (gpu, and wall), 1 = at the roofline.
A floor assumes every FLOP runs at dense-GEMM speed and every byte at copy speed at once;
the chunked algorithm's serial state recurrence makes it unreachable at few heads.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..data.records import Row, RunDocument
from ..data.shapes import Shape, ShapeError
from ..vocab import DTYPE_BYTES
from .tables import fmt_us

CHUNK = 64
FP32 = 4
# standalone l2norm passes per route (each: read the tensor, write the normalized copy)
ROUTE_L2_PASSES = {"explicit": ("q", "k"), "flag": ("q", "k"), "fused_q": ("k",), "fused_qk": (), "none": ()}
# numbers measured on our H200 (d2d copy ~4.3 TB/s, bf16 8192^3 matmul ~790 TFLOP/s), for sanity checks and as a stand-in calibration
H200_BANDWIDTH = 4.3e12
H200_MATMUL = 790e12


class RooflineError(ValueError):
    """A shape, route, row or calibration the roofline cannot use; the message names it."""


# ----------------------------------------------------------------------------- calibration dicts
def make_calib(bandwidth_bytes_per_s: float, matmul_flops_per_s: float, **context) -> dict:
    """A calibration dict by hand (the shape `calibrate.measure` returns, without the raw samples)."""
    return {"bandwidth_bytes_per_s": float(bandwidth_bytes_per_s), "matmul_flops_per_s": float(matmul_flops_per_s),
            **context}


H200_FIELD_NOTES = make_calib(H200_BANDWIDTH, H200_MATMUL, gpu={"name": "NVIDIA H200"},
                              source="FIELD-NOTES.md: d2d copy ~4.3 TB/s, bf16 8192^3 matmul ~790 TFLOP/s")


def rates(calib: dict) -> tuple[float, float]:
    """(bandwidth bytes/s, matmul FLOP/s) of a calibration dict."""
    if not isinstance(calib, dict):
        raise RooflineError(f"calibration: expected a dict, got {type(calib).__name__}")
    out = []
    for key in ("bandwidth_bytes_per_s", "matmul_flops_per_s"):
        v = calib.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise RooflineError(f"calibration: field {key!r} must be a positive number, got {v!r}")
        out.append(float(v))
    return out[0], out[1]


# ----------------------------------------------------------------------------- shape helpers
def seq_lens(shape: Shape) -> list[int]:
    return list(shape.lens) if shape.varlen else [shape.lens[0]] * shape.B


def chunk_lens(shape: Shape, chunk: int = CHUNK) -> list[int]:
    """Lengths of all chunks of all sequences (the last chunk of a sequence may be short)."""
    out = []
    for L in seq_lens(shape):
        out += [chunk] * (L // chunk) + ([L % chunk] if L % chunk else [])
    return out


def _elem(shape: Shape) -> int:
    return DTYPE_BYTES[shape.dtype]


# ----------------------------------------------------------------------------- bytes
def bytes_breakdown(shape: Shape, route: str) -> dict[str, int]:
    """Fewest bytes of one forward call (or decode step) on `route`, per tensor (see the module docstring)."""
    if route not in ROUTE_L2_PASSES:
        raise RooflineError(f"route {route!r}: the roofline knows {', '.join(ROUTE_L2_PASSES)}")
    if shape.decode:
        return decode_bytes_breakdown(shape, route)
    T, H, HV, K, V, N, e = shape.tokens, shape.H, shape.HV, shape.K, shape.V, shape.n_seqs, _elem(shape)
    state = N * HV * K * V * FP32
    out = {
        "q": T * H * K * e,
        "k": T * H * K * e,
        "v": T * HV * V * e,
        "g": T * HV * (K if shape.family == "kda" else 1) * FP32,
        "beta": T * HV * e,
        "h0": state if shape.initial_state else 0,
        "o": T * HV * V * e,
        "ht": state,
    }
    for t in ROUTE_L2_PASSES[route]:
        out[f"l2norm_{t}"] = 2 * T * H * K * e
    return out


def decode_bytes_breakdown(shape: Shape, route: str) -> dict[str, int]:
    """Bytes one decode step must move, per tensor (module docstring, "Decode step")."""
    N, H, HV, K, V, e = shape.B, shape.H, shape.HV, shape.K, shape.V, _elem(shape)
    state = N * HV * K * V * DTYPE_BYTES[shape.state_dtype]
    out = {
        "q": N * H * K * e,
        "k": N * H * K * e,
        "v": N * HV * V * e,
        "g": N * HV * (K if shape.family == "kda" else 1) * FP32,
        "beta": N * HV * e,
        "o": N * HV * V * e,
        "state_read": state,
        "state_write": state,
        "indices": N * 8,
    }
    for t in ROUTE_L2_PASSES[route]:
        out[f"l2norm_{t}"] = 2 * N * H * K * e
    return out


def bytes_floor(shape: Shape, route: str) -> int:
    return sum(bytes_breakdown(shape, route).values())


# ----------------------------------------------------------------------------- FLOPs
def chunk_flops(c: int, K: int, V: int) -> dict[str, int]:
    """Matmul FLOPs (multiply-add = 2) of one chunk of c tokens for one value head, per term."""
    return {
        "gram": K * c * (c - 1),
        "solve": (c ** 3 - c) // 3,  # c^3 - c = (c-1)c(c+1) is divisible by 3
        "wu": (K + V) * c * (c + 1),
        "state": 4 * c * K * V,
        "output": 2 * c * K * V + (K + V) * c * (c + 1),
    }


def flops_breakdown(shape: Shape, chunk: int = CHUNK, share_key_products: bool = False) -> dict[str, int]:
    """Matmul FLOPs of the chunked forward for the whole shape, per term (see the module docstring);
    for a decode shape, the one-token recurrence's."""
    if shape.decode:
        return {"recurrent": flops_recurrent(shape)}
    K, V, HV = shape.K, shape.V, shape.HV
    tot = dict.fromkeys(("gram", "solve", "wu", "state", "output"), 0)
    gram_key = qk_key = 0  # K K^T and q k^T depend on keys / queries only (GDN's gate is elementwise)
    for c in chunk_lens(shape, chunk):
        for name, f in chunk_flops(c, K, V).items():
            tot[name] += f
        gram_key += K * c * (c - 1)
        qk_key += K * c * (c + 1)
    tot = {name: HV * f for name, f in tot.items()}
    if share_key_products and shape.family == "gdn":
        tot["gram"] -= (HV - shape.H) * gram_key
        tot["output"] -= (HV - shape.H) * qk_key
    if not shape.initial_state:
        firsts = [min(L, chunk) for L in seq_lens(shape)]
        zero_state = HV * sum(2 * c0 * K * V for c0 in firsts)  # w h = 0 and q h = 0 in each first chunk
        tot["state"] -= zero_state
        tot["output"] -= zero_state
    return tot


def flops_chunked(shape: Shape, chunk: int = CHUNK, share_key_products: bool = False) -> int:
    return sum(flops_breakdown(shape, chunk, share_key_products).values())


def flops_recurrent(shape: Shape) -> int:
    """Minimal token-recurrence matmul FLOPs: S^T k, the rank-1 update and S^T q, 2KV each."""
    return 6 * shape.tokens * shape.HV * shape.K * shape.V


# ----------------------------------------------------------------------------- floor
@dataclass(frozen=True)
class Floor:
    shape_id: str
    route: str
    bytes: int
    flops: int
    flops_recurrent: int
    memory_us: float
    compute_us: float
    floor_us: float
    binding: str  # "memory" or "compute"
    gpu_us: float | None = None
    wall_us: float | None = None
    fraction_gpu: float | None = None  # floor / gpu median; 1 = at the roofline
    fraction_wall: float | None = None
    status: str | None = None
    backend: str | None = None
    breakdown: dict = field(default_factory=dict, compare=False)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte of the floor."""
        return self.flops / self.bytes if self.bytes else math.inf


def floor_us(row_or_shape, route: str | None = None, calib: dict | None = None, *, shape: Shape | None = None) -> Floor:
    """The roofline floor of one forward call.

    `row_or_shape`: a `Shape` (then `route` is required), or a results `Row` (then `shape=` gives
    its dimensions and `route` defaults to the row's). For an ok row the fractions floor / measured
    median are filled in.
    `calib`: {'bandwidth_bytes_per_s', 'matmul_flops_per_s', ...} (calibrate.measure / load_for)."""
    row = None
    if isinstance(row_or_shape, Shape):
        shape = row_or_shape
    elif isinstance(row_or_shape, Row):
        row = row_or_shape
        route = route or row.route
        if shape is None:
            raise RooflineError(f"row {row.shape_id!r}: pass shape= (rows carry no dimensions)")
    else:
        raise RooflineError(f"expected a Shape or a results row, got {type(row_or_shape).__name__}")
    if route is None:
        raise RooflineError(f"shape {shape.id!r}: no route given")
    if calib is None:
        raise RooflineError("no calibration given (gdnbench calibrate, or roofline.make_calib)")
    bw, mm = rates(calib)
    bb = bytes_breakdown(shape, route)
    fb = flops_breakdown(shape)
    nbytes, flops = sum(bb.values()), sum(fb.values())
    mem, comp = nbytes / bw * 1e6, flops / mm * 1e6
    floor = max(mem, comp)
    gpu = wall = None
    if row is not None:
        gpu, wall = row.median("gpu"), row.median("wall")
    return Floor(shape.id, route, nbytes, flops, flops_recurrent(shape), mem, comp, floor,
                 "memory" if mem >= comp else "compute", gpu, wall,
                 floor / gpu if gpu else None, floor / wall if wall else None,
                 row.status if row else None, row.backend if row else None,
                 {"bytes": bb, "flops": fb})


# ----------------------------------------------------------------------------- results documents
_LABEL = re.compile(r"^(?P<fam>gdn|kda) H(?P<H>\d+)/HV(?P<HV>\d+) K(?P<K>\d+) V(?P<V>\d+) "
                    r"(?:T(?P<T>\d+)(?:xB(?P<B>\d+))?|(?P<n>\d+)seq/(?P<tok>\d+))$")


def shape_from_label(shape_id: str, label: str) -> Shape:
    """An approximate Shape from a results file's label (`Shape.label()`): bf16, no initial
    states, and a packed mix taken as equal lengths (the label keeps only count and total)."""
    m = _LABEL.match(label.strip())
    if not m:
        raise RooflineError(f"shape {shape_id!r}: cannot read dimensions from label {label!r}")
    fam = m["fam"]
    if m["T"]:
        lens, B = (int(m["T"]),), int(m["B"] or 1)
    else:
        n, tok = int(m["n"]), int(m["tok"])
        lens, B = tuple(tok // n + (1 if i < tok % n else 0) for i in range(n)), 1
    return Shape(id=shape_id, family=fam, H=int(m["H"]), HV=int(m["HV"]), K=int(m["K"]), V=int(m["V"]), lens=lens,
                 seed=0, gate="logsigmoid" if fam == "gdn" else "bounded", B=B,
                 lower_bound=-5.0 if fam == "kda" else None)


def shapes_for_doc(doc: RunDocument, shape_set=None) -> tuple[dict[str, Shape], list[str]]:
    """The shapes of a results document: from `shape_set` if given, else the set of that name
    under shapes/ when its hash matches the document's, else read from the labels (approximate;
    said in the notes)."""
    from ..data import shapes as shp

    meta = doc.shape_set
    notes: list[str] = []
    if shape_set is None:
        try:
            cand = shp.load(meta.name)
        except ShapeError as e:
            cand, why = None, str(e)
        else:
            why = f"shapes/{cand.name}.toml hash {cand.hash[:19]} differs from the file's {meta.hash[:19]}"
            if cand.hash != meta.hash:
                cand = None
        shape_set = cand
        if shape_set is None:
            notes.append(f"shape dimensions read from the file's labels ({why}): packed mixes taken as equal "
                         "lengths, dtype bf16, no initial states")
    if shape_set is not None:
        return {s.id: s for s in shape_set.shapes}, notes
    labels = meta.shapes or {}
    out = {}
    for sid, label in labels.items():
        try:
            out[sid] = shape_from_label(sid, label)
        except RooflineError as e:
            notes.append(str(e))
    return out, notes


def doc_floors(doc: RunDocument, calib: dict, mode: str = "fwd", shape_set=None,
               include_skipped: bool = False) -> tuple[list[Floor], list[str]]:
    """A Floor per results row of `mode` (skipped rows left out unless asked), and notes."""
    shapes_by_id, notes = shapes_for_doc(doc, shape_set)
    out, missing = [], set()
    for r in doc.rows:
        if r.mode != mode or (r.status == "skipped" and not include_skipped):
            continue
        s = shapes_by_id.get(r.shape_id)
        if s is None:
            missing.add(r.shape_id)
            continue
        if r.route not in ROUTE_L2_PASSES:
            notes.append(f"{r.shape_id} {r.spec}: unknown route, no floor")
            continue
        out.append(floor_us(r, None, calib, shape=s))
    notes += [f"{sid}: no dimensions for this shape, rows left out" for sid in sorted(missing)]
    return out, notes


def _calib_text(calib: dict) -> str:
    bw, mm = rates(calib)
    name = (calib.get("gpu") or {}).get("name") if isinstance(calib.get("gpu"), dict) else None
    return f"{bw / 1e12:.2f} TB/s copy, {mm / 1e12:.0f} TFLOP/s bf16 matmul" + (f" ({name})" if name else "")


DECODE_NOTE = ("bytes (decode): q, k, v, gates, o once, the N states read and written once at the state dtype, "
               "int64 indices, + 2 x |q| or |k| per standalone l2norm pass; FLOPs: the one-token recurrence, 6 K V "
               "per sequence and value head")


def roofline_table(doc: RunDocument, calib: dict, mode: str = "fwd", shape_set=None):
    """(title, columns, rows, notes) with a line per non-skipped row: bytes, FLOPs, floor,
    binding term, measured times and the fraction floor / measured (wrap with report.Table(*t))."""
    floors, notes = doc_floors(doc, calib, mode, shape_set)
    columns = ["shape", "backend:route", "MB", "GFLOP", "FLOP/B", "floor µs", "binds", "gpu µs", "floor/gpu",
               "wall µs", "floor/wall"]
    rows = []
    for f in floors:
        frac_g = f"{f.fraction_gpu:.3f}" if f.fraction_gpu is not None else (f.status or "-")
        frac_w = f"{f.fraction_wall:.3f}" if f.fraction_wall is not None else (f.status or "-")
        rows.append([f.shape_id, f"{f.backend}:{f.route}", f"{f.bytes / 1e6:.1f}", f"{f.flops / 1e9:.2f}",
                     f"{f.intensity:.0f}", fmt_us(f.floor_us), f.binding, fmt_us(f.gpu_us), frac_g,
                     fmt_us(f.wall_us), frac_w])
    title = f"{doc.shape_set.name} v{doc.shape_set.version}: roofline floor per backend:route ({mode})"
    notes = [f"calibration: {_calib_text(calib)}",
             "floor = max(bytes / copy bandwidth, matmul FLOPs / matmul rate); floor/gpu = floor / median gpu "
             "time (1 = at the roofline)",
             DECODE_NOTE if mode == "decode" else
             f"bytes: each input read once, each output written once, fp32 final state, + 2 x |q| or |k| per "
             f"standalone l2norm pass (explicit, flag: q and k; fused_q: k); FLOPs: chunked algorithm, C = {CHUNK}, "
             "matmuls only, multiply-add = 2"] + notes
    return title, columns, rows, notes


def best_floors(doc: RunDocument, calib: dict, kind: str = "gpu", mode: str = "fwd",
                shape_set=None) -> dict[tuple[str, str], Floor]:
    """(shape_id, backend) -> the Floor of that backend's fastest ok route on the shape."""
    floors, _ = doc_floors(doc, calib, mode, shape_set)
    best: dict[tuple[str, str], Floor] = {}
    for f in floors:
        t = f.gpu_us if kind == "gpu" else f.wall_us
        if t is None:
            continue
        key = (f.shape_id, f.backend)
        cur = best.get(key)
        if cur is None or t < (cur.gpu_us if kind == "gpu" else cur.wall_us):
            best[key] = f
    return best


def roofline_chart(doc: RunDocument, calib: dict, out_png, kind: str = "gpu", mode: str = "fwd", shape_set=None):
    """Bars per shape and backend: floor / measured time of the backend's fastest ok route
    (1 = at the roofline), labelled with the time, the route, its floor and the binding term.
    Routes have different floors (fused_qk moves fewer bytes than explicit), so the height says how
    near a backend runs to its own floor, never which is faster: the labels carry the times.
    Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plot import save_figure
    from .report import BACKEND_ORDER, shape_ids

    best = best_floors(doc, calib, kind, mode, shape_set)
    if kind == "gpu" and not best:
        kind, best = "wall", best_floors(doc, calib, "wall", mode, shape_set)
    if not best:
        raise RooflineError("nothing to chart: no ok rows with times")
    backends = sorted({b for _, b in best},
                      key=lambda b: (BACKEND_ORDER.index(b) if b in BACKEND_ORDER else len(BACKEND_ORDER), b))
    shapes = [s for s in shape_ids(doc) if any((s, b) in best for b in backends)]
    fig, ax = plt.subplots(figsize=(max(8, 1.5 * len(shapes) + 3), 5.5))
    width = 0.8 / len(backends)
    cmap = plt.get_cmap("tab10")
    top, labelled = 0.0, set()
    for j, b in enumerate(backends):
        for i, s in enumerate(shapes):
            f = best.get((s, b))
            if f is None:
                continue
            frac = f.fraction_gpu if kind == "gpu" else f.fraction_wall
            x = i + (j - (len(backends) - 1) / 2) * width
            ax.bar(x, frac, width, color=cmap(j % 10), label=None if b in labelled else b)
            labelled.add(b)
            t = f.gpu_us if kind == "gpu" else f.wall_us
            ax.text(x, frac, f"{100 * frac:.0f}%\n{fmt_us(t)}\n{f.route}\nfl {fmt_us(f.floor_us)}\n{f.binding[:3]}",
                    ha="center", va="bottom", fontsize=6.5)
            top = max(top, frac)
    if top > 0.7:
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_ylim(0, 1.15 if top > 0.7 else top * 1.6)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, rotation=20, ha="right", fontsize=9)
    ax.set_ylabel(f"fraction of its own route's floor\n(floor / {kind} time; 1 = at the floor)")
    ss = doc.shape_set
    ax.set_title(f"{ss.name} v{ss.version}: best route per backend vs that route's roofline "
                 f"floor\n{_calib_text(calib)}\nfloors differ by route: a taller bar is nearer its own floor, not "
                 f"faster; compare the times. Label: % of floor, {kind} time, route, floor (fl), binding term",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, out_png)

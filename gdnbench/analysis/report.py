"""Tables and geomean time ratios from results documents (no torch, no GPU).

Documents and rows are the typed records of gdnbench.data.records; the tables' renderings live in
gdnbench.analysis.tables. A ratio pair is written NUM/DEN with each side `backend:route`; route
`best` means the fastest ok route of that backend on each shape. A geomean is taken over the
shapes where both sides are `ok`; every shape left out is listed with the reason, and the count
is always printed. Each ratio is given on both times: `wall` (events around eager calls) and
`gpu` (kernels' own time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..data.records import TIME_KINDS, Row, RunDocument
from ..vocab import (ALL_ROUTES, FUSED_ROUTES, MODES, PLAIN_ROUTES,  # noqa: F401  (MODES: the report command checks --mode)
                     ROUTES)
from .tables import FORMATS, Table, fmt_us, to_csv, to_json, to_markdown, to_rich, to_text  # noqa: F401

MODE_TITLES = {"fwd_bwd": " (one forward + backward step)", "decode": " (one decode step)"}
MB = 1e6


@dataclass
class Geomean:
    pair: str
    kind: str
    value: float | None
    count: int
    total: int
    excluded: list[str]
    per_shape: dict[str, float] = field(default_factory=dict)

    @property
    def below_one(self) -> int:
        """Shapes where NUM is faster than DEN."""
        return sum(r < 1 for r in self.per_shape.values())

    def text(self) -> str:
        if self.value is None:
            return f"n/a over {self.count}/{self.total} shapes"
        return f"{self.value:.3f} over {self.count}/{self.total} shapes, below 1 on {self.below_one}"


def median(row: Row | None, kind: str) -> float | None:
    """The median µs of an ok row's time `kind`; None for no row, a row that is not ok or has no such time."""
    return row.median(kind) if row is not None else None


def index_rows(doc: RunDocument, mode: str = "fwd") -> dict[tuple[str, str, str], Row]:
    return {r.key: r for r in doc.rows if r.mode == mode}


def run_mode(doc: RunDocument) -> str:
    """The mode the file was run in (files without one are forward runs)."""
    return doc.mode


def rows_of_mode(doc: RunDocument, mode: str) -> RunDocument:
    """The document with only the rows of one mode: every table is about one mode."""
    return doc.with_rows(r for r in doc.rows if r.mode == mode)


def shape_ids(doc: RunDocument) -> list[str]:
    """Shapes that have rows, in the set's order."""
    have = {r.shape_id for r in doc.rows}
    ids = [s for s in doc.shape_set.ids if s in have]
    return ids + sorted(have - set(ids))


BACKEND_ORDER = ("fla", "gdnbench", "gdnbench-default", "helion", "helion-linear", "flashinfer", "reference")
ROUTE_ORDER = ALL_ROUTES


def keys_present(doc: RunDocument) -> list[tuple[str, str]]:
    """(backend, route) pairs of the rows, in a stable order: known backends and routes first."""
    seen = dict.fromkeys((r.backend, r.route) for r in doc.rows)

    def rank(key):
        b, r = key
        return (BACKEND_ORDER.index(b) if b in BACKEND_ORDER else len(BACKEND_ORDER), b,
                ROUTE_ORDER.index(r) if r in ROUTE_ORDER else len(ROUTE_ORDER), r)

    return sorted(seen, key=rank)


def _side(idx, shape: str, spec: str, kind: str) -> tuple[float | None, str]:
    backend, _, route = spec.partition(":")
    if route == "best":
        cands = [(r.median(kind), r.route) for (s, b, _), r in idx.items() if s == shape and b == backend]
        ok = [c for c in cands if c[0] is not None]
        if not ok:
            return None, f"{backend} has no ok route" if cands else f"no {backend} rows"
        return min(ok)[0], ""
    row = idx.get((shape, backend, route))
    if row is None:
        return None, f"no {spec} row"
    t = row.median(kind)
    if t is None:
        why = row.reason or ("no gpu time" if row.status == "ok" else "")
        return None, f"{spec} {row.status}" + (f": {why[:80]}" if why else "")
    return t, ""


def geomean_of(ratios: list[float]) -> float | None:
    """The geometric mean of positive ratios; None for none."""
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def geomean(doc: RunDocument, pair: str, kind: str, mode: str = "fwd") -> Geomean:
    num, _, den = pair.partition("/")
    idx = index_rows(doc, mode)
    ids = [s for s in shape_ids(doc) if any(k[0] == s for k in idx)]
    excluded, per = [], {}
    for s in ids:
        a, why_a = _side(idx, s, num, kind)
        b, why_b = _side(idx, s, den, kind)
        if a is None or b is None or b <= 0:
            excluded.append(f"{s}: {why_a or why_b}")
            continue
        per[s] = a / b
    return Geomean(pair, kind, geomean_of(list(per.values())), len(per), len(ids), excluded, per)


# the route a fused route is set against (its geomean pair and its floor), in order: our backends' flag runs the same
# kernels as explicit, its norm pass inside the op instead of before it (a run of flag and fused_qk alone has no
# explicit row)
FLOOR_ROUTES = PLAIN_ROUTES


def standard_pairs(doc: RunDocument) -> list[str]:
    """The pairs that make sense for the rows present: flag/explicit per backend, the fused
    routes against explicit (against flag where the backend has no explicit row), ours against each
    other backend (same route, best, vs flag)."""
    present = _columns(doc)
    backends = [b for b, _ in present]
    have = set(present)
    pairs = []
    for b in dict.fromkeys(backends):
        base = next((r for r in FLOOR_ROUTES if (b, r) in have), None)
        for r in ("flag", *FUSED_ROUTES):
            if base and r != base and (b, r) in have:
                pairs.append(f"{b}:{r}/{b}:{base}")
        if (b, "megatron_flag") in have and (b, "megatron") in have:
            pairs.append(f"{b}:megatron_flag/{b}:megatron")
    ours = "gdnbench"
    if ours in backends and "gdnbench-default" in backends:  # the autotune's gain: tuned / default configs
        pairs += [f"{ours}:{r}/gdnbench-default:{r}" for r in ROUTES
                  if (ours, r) in have and ("gdnbench-default", r) in have]
        pairs.append(f"{ours}:best/gdnbench-default:best")
    for other in ("fla", "fla-dispatch", "flashqla", "flashinfer", "helion", "helion-linear"):
        if ours not in backends or other not in backends:
            continue
        for r in PLAIN_ROUTES:
            if (ours, r) in have and (other, r) in have:
                pairs.append(f"{ours}:{r}/{other}:{r}")
        for r in FUSED_ROUTES:
            if (ours, r) in have and (other, "flag") in have:
                pairs.append(f"{ours}:{r}/{other}:flag")
        pairs.append(f"{ours}:best/{other}:best")
        if (other, "flag") in have:
            pairs.append(f"{ours}:best/{other}:flag")
    return pairs


def _cell(row: Row | None) -> str:
    if row is None:
        return "(no row)"
    if row.status != "ok":
        return row.status
    w, g = row.median("wall"), row.median("gpu")
    mark = "*" if row.host_bound else ""
    return f"{fmt_us(w)} / {fmt_us(g)}{mark}" if g is not None else f"{fmt_us(w)}"


def default_baseline(doc: RunDocument) -> str | None:
    """fla:explicit (else fla:flag, else the first key) among keys with an ok row."""
    ok = dict.fromkeys((r.backend, r.route) for r in doc.rows if r.status == "ok")
    ok = [k for k in keys_present(doc) if k in ok]
    for cand in (("fla", "explicit"), ("fla", "flag")):
        if cand in ok:
            return ":".join(cand)
    return ":".join(ok[0]) if ok else None


def kinds_present(doc: RunDocument) -> list[str]:
    """The time kinds some row has (a CPU run has no gpu time)."""
    return [k for k in TIME_KINDS if any(r.median(k) is not None for r in doc.rows)] or ["wall"]


def _columns(doc: RunDocument) -> list[tuple[str, str]]:
    """backend:route pairs with at least one row that is not skipped."""
    ran = {(r.backend, r.route) for r in doc.rows if r.status != "skipped"}
    return [k for k in keys_present(doc) if k in ran]


def _interrupted_note(doc: RunDocument) -> list[str]:
    """A stopped run's note: why it stopped and the shapes it measured nothing on."""
    why = (doc.run or {}).get("interrupted")
    if not why:
        return []
    done = {r.shape_id for r in doc.rows if r.status != "skipped"}
    missing = [s for s in doc.shape_set.ids if s not in done]
    return [f"run {why} after {len(doc.rows)} rows" + (f"; nothing measured on {', '.join(missing)}" if missing else "")
            + " (continue it with gdnbench run --resume)"]


def time_table(doc: RunDocument, mode: str = "fwd") -> Table:
    idx = index_rows(doc, mode)
    cols = _columns(doc)
    rows = [[s] + [_cell(idx.get((s, b, r))) for b, r in cols] for s in shape_ids(doc)]
    notes = ["cells: median wall µs / median gpu µs; * = host-bound (wall > gpu by more than the margin)"]
    if any(r.timing_meaningful is False for r in doc.rows if r.status == "ok"):
        notes.append("CPU run: timings are not meaningful (interpreter / fp64 reference)")
    skipped = sorted({f"{r.spec}: {r.reason}" for r in doc.rows if r.status == "skipped"})
    notes += [f"skipped {s}" for s in skipped]
    notes += _interrupted_note(doc)
    title = f"{doc.shape_set.name} v{doc.shape_set.version}: time per backend:route"
    title += MODE_TITLES.get(mode, "")
    return Table(title, ["shape"] + [f"{b}:{r}" for b, r in cols], rows, notes)


def ratio_table(doc: RunDocument, baseline: str, kind: str = "gpu", mode: str = "fwd") -> Table:
    idx = index_rows(doc, mode)
    cols = _columns(doc)
    rows = []
    for s in shape_ids(doc):
        base, _ = _side(idx, s, baseline, kind)
        line = [s]
        for b, r in cols:
            t, _ = _side(idx, s, f"{b}:{r}", kind)
            line.append(f"{t / base:.3f}" if t is not None and base else "-")
        rows.append(line)
    return Table(f"{kind}-time ratio to {baseline} (< 1 = faster)", ["shape"] + [f"{b}:{r}" for b, r in cols], rows)


def _sci(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def check_table(doc: RunDocument, mode: str = "fwd") -> Table:
    """Each gated row's error figures (a row whose output was not finite has none: '-')."""
    rows = []
    for r in doc.rows:
        c = r.check
        if r.mode != mode or c is None:
            continue
        tokens = "-" if c.get("tokens") is None else str(c.get("tokens")) + (" (short)" if c.get("shortened") else "")
        rows.append([r.shape_id, r.spec, r.status, _sci(c.get("err_o")), _sci(c.get("budget_o")),
                     _sci(c.get("err_state")), _sci(c.get("budget_state")), tokens])
    differed = [f"{r.spec} at {r.shape_id}" for r in doc.rows if r.mode == mode and r.get("deterministic") is False]
    notes = [f"the first call and the judged call on the same inputs differed: {', '.join(differed)}"] if differed else []
    return Table("correctness gate (rel-RMS error vs fp64 recurrence; budget = "
                 "2 x error of the recurrence at storage precision)",
                 ["shape", "backend:route", "status", "err o", "budget o", "err state", "budget state", "check tokens"],
                 rows, notes)


def geomean_table(doc: RunDocument, pairs: list[str] | None = None, mode: str = "fwd") -> Table | None:
    """The geomean of each pair (the standard pairs unless ``pairs``); None where there is no pair."""
    rows, notes = [], []
    kinds = kinds_present(doc)
    for pair in dict.fromkeys(pairs or standard_pairs(doc)):  # a --pair that is also a standard pair: once
        gs = [geomean(doc, pair, k, mode) for k in kinds]
        rows.append([pair] + [g.text() for g in gs])
        for e in dict.fromkeys(e for g in gs for e in g.excluded):
            kinds = [g.kind for g in gs if e in g.excluded]
            notes.append(f"{pair}: excluded {e}" + ("" if len(kinds) == len(gs) else f" [{','.join(kinds)} only]"))
    if not rows:
        return None
    return Table("geomean time ratios (NUM/DEN; < 1 means NUM is faster)", ["pair"] + kinds, rows, notes)


def _spread(t) -> str:
    return "-" if t is None else f"{100 * (t.round_spread or 0):.1f}%"


def spread_table(doc: RunDocument, mode: str = "fwd") -> Table:
    rows = []
    for r in doc.rows:
        if r.mode != mode or r.status != "ok":
            continue
        rows.append([r.shape_id, r.spec, _spread(r.wall), _spread(r.gpu), (r.gpu and r.gpu.method) or "-",
                     fmt_us(r.profiler_us), f"{r.first_call_ms or 0:.0f}"])
    return Table("timing detail (spread = (max - min) / median of per-round medians)",
                 ["shape", "backend:route", "wall spread", "gpu spread", "gpu method", "profiler µs", "first call ms"],
                 rows)


KERNELS_SHOWN = 8


def kernel_table(doc: RunDocument, mode: str = "fwd") -> Table | None:
    """Each ok row's device time split by kernel (torch.profiler, µs per call, largest first; the
    rest summed as 'other'): the stage a route gains or loses in. None when no row has a split."""
    rows = []
    for r in doc.rows:
        split = r.kernels_us
        if r.mode != mode or r.status != "ok" or not split:
            continue
        items = list(split.items())
        shown = [f"{n} {t:.1f}" for n, t in items[:KERNELS_SHOWN]]
        if len(items) > KERNELS_SHOWN:
            shown.append(f"other ({len(items) - KERNELS_SHOWN}) {sum(t for _, t in items[KERNELS_SHOWN:]):.1f}")
        rows.append([r.shape_id, r.spec, fmt_us(sum(split.values())), "; ".join(shown)])
    if not rows:
        return None
    return Table("device time per kernel (torch.profiler, µs per call, largest first)",
                 ["shape", "backend:route", "sum µs", "kernels"], rows)


NORM_KERNEL_MARK = "l2norm"  # our norm pass's launches (kernels/ops.py: l2norm_kernel, once per normalized tensor)


def _norm_us(split) -> float:
    return sum(t for n, t in split.items() if NORM_KERNEL_MARK in n)


def _left_out(fused: Row, base: Row | None) -> str:
    """Why a fused row cannot be set against its floor's row ``base``, explicit's or flag's ('' when it can)."""
    for x in (fused, base):
        if x is not None and x.status != "ok":
            return f"{x.spec} {x.status}"
    if base is None:
        return "no explicit or flag row"
    for x in (fused, base):
        if not x.kernels_us:
            return f"{x.spec} has no kernel split"
    return ""


def _excess_by_kernel(fused: Row, base: Row) -> str:
    """Where a fused route's time over its floor lies: its kernels less the floor row's, per kernel name, the norm
    launches left out (the floor accounts for them), largest difference first; '-' where none differ by 0.05 µs."""
    names = dict.fromkeys([*base.kernels_us, *fused.kernels_us])
    diffs = [(n, fused.kernels_us.get(n, 0.0) - base.kernels_us.get(n, 0.0))
             for n in names if NORM_KERNEL_MARK not in n]
    shown = [f"{n} {d:+.1f}" for n, d in sorted(diffs, key=lambda nd: -abs(nd[1])) if abs(d) >= 0.05]
    return "; ".join(shown[:KERNELS_SHOWN]) or "-"


def fusion_table(doc: RunDocument, mode: str = "fwd") -> Table | None:
    """Each fused route against its zero-cost floor: the explicit route's kernels (flag's where the run has no
    explicit row) less the norm launches the fused route no longer makes (that route's norm time less the fused
    route's own), from the same run's profiler splits. A ratio of 1 means folding the norm in cost nothing beyond
    the pass it removed; the last column says in which kernels the difference lies. None without such pairs."""
    idx = index_rows(doc, mode)
    shapes = shape_ids(doc)
    order = {s: i for i, s in enumerate(shapes)}
    rows, notes, ratios, stand_ins = [], [], {}, {}
    for (s, backend, route), r in sorted(idx.items(), key=lambda item: order[item[0][0]]):
        if route not in FUSED_ROUTES or r.status == "skipped":
            continue
        e = next((idx[(s, backend, f)] for f in FLOOR_ROUTES if (s, backend, f) in idx), None)
        if e is not None and e.route != FLOOR_ROUTES[0]:
            stand_ins.setdefault(e.spec, set()).add(s)
        why = _left_out(r, e)
        if why:
            notes.append(f"{s}: {r.spec} left out ({why})")
            continue
        floor = sum(e.kernels_us.values()) - _norm_us(e.kernels_us) + _norm_us(r.kernels_us)
        took = sum(r.kernels_us.values())
        ratios.setdefault(r.spec, []).append(took / floor)
        rows.append([s, r.spec, fmt_us(took), fmt_us(floor), f"{took / floor:.3f}", _excess_by_kernel(r, e)])
    if not rows:
        return None
    for spec, xs in ratios.items():
        rows.append([f"geomean ({len(xs)}/{len(shapes)})", spec, "", "", f"{geomean_of(xs):.3f}", ""])
    notes += [f"floor from {spec} on {len(ss)}/{len(shapes)} shapes (no {FLOOR_ROUTES[0]} row)"
              for spec, ss in stand_ins.items()]
    return Table("fused routes against their zero-cost floor (explicit's kernels, or flag's, less the norm launches "
                 "the route drops; profiler µs per call)",
                 ["shape", "backend:route", "route µs", "floor µs", "route / floor",
                  "by kernel, route less floor row (µs)"], rows, notes)


def _figure(row: Row, name: str):
    """A figure of the row's check (None without a check or that figure)."""
    return row.check.get(name) if row.check is not None else None


def grad_table(doc: RunDocument) -> Table:
    """fwd_bwd gate: each input gradient's rel-RMS error and budget."""
    names = ("dq", "dk", "dv", "dg", "dbeta")
    rows = []
    for r in doc.rows:
        grads = _figure(r, "grads")
        if grads:
            rows.append([r.shape_id, r.spec, r.status]
                        + [f"{grads[n]['err']:.1e} / {grads[n]['budget']:.1e}" if n in grads else "-" for n in names])
    return Table("gradient gate (rel-RMS error / budget vs fp64 autograd; budget = 2 x error at storage precision)",
                 ["shape", "backend:route", "status"] + list(names), rows)


def layer_table(doc: RunDocument) -> Table:
    """fwd_bwd: the small layer's weight (and x) gradients through each route, rel-RMS error vs the
    fp64 layer / budget. Parity between routes is read from these: two routes' gradients differ by
    at most the sum of their errors (relative to the fp64 gradient's norm)."""
    rows_with = [r for r in doc.rows if _figure(r, "layer")]
    names = list(dict.fromkeys(n for r in rows_with for n in _figure(r, "layer")))
    rows = []
    for r in rows_with:
        layer = _figure(r, "layer")
        rows.append([r.shape_id, r.spec, r.status]
                    + [f"{layer[n]['err']:.1e} / {layer[n]['budget']:.1e}" if n in layer else "-" for n in names])
    widths = sorted({_figure(r, "layer_width") for r in rows_with} - {None})
    notes = [f"layer (gdnbench/bench/modes/layer.py): hidden size D = {', '.join(map(str, widths)) or '?'}; y = attention(q|k = "
             "x W_qk, v = x W_v, g = gate(x W_a), beta = sigmoid(x W_b)) W_o; columns: d(loss)/d(weight), d(loss)/dx",
             "two routes' gradients differ by at most the sum of their errors (relative to the fp64 gradient)"]
    if not rows_with:
        notes = ["no row has layer gradients (none reached the gate, or a file from before gdnbench/bench/modes/layer.py)"]
    return Table("layer gradient gate (rel-RMS error / budget vs the fp64 layer; budget = 2 x error of the layer "
                 "at storage precision)", ["shape", "backend:route", "status"] + [f"d{n}" for n in names], rows, notes)


def _mb(x) -> str:
    return "-" if x is None else f"{x / MB:.2f}"


def saved_pair(doc: RunDocument, pair: str) -> str | None:
    """'NUM keeps X MB less than DEN ...': mean saved_bytes difference and geomean ratio over shapes
    where both rows are ok; None when no shape has both."""
    num, _, den = pair.partition("/")
    idx = index_rows(doc, "fwd_bwd")
    diffs, ratios = [], []
    for s in shape_ids(doc):
        a, b = (idx.get((s, *side.split(":"))) for side in (num, den))
        if a and b and a.status == b.status == "ok" and a.get("saved_bytes") and b.get("saved_bytes"):
            diffs.append(b.get("saved_bytes") - a.get("saved_bytes"))
            ratios.append(a.get("saved_bytes") / b.get("saved_bytes"))
    if not diffs:
        return None
    d = sum(diffs) / len(diffs)
    return (f"{num} keeps {abs(d) / MB:.2f} MB {'less' if d >= 0 else 'more'} than {den} for backward (mean per shape; "
            f"saved_bytes ratio geomean {geomean_of(ratios):.3f} over {len(diffs)} shapes)")


def memory_table(doc: RunDocument) -> Table:
    """fwd_bwd: bytes saved for backward, peak bytes of one step, determinism; the saved-bytes pairs as notes."""
    rows = [[r.shape_id, r.spec, r.status, _mb(r.get("saved_bytes")), _mb(r.get("peak_bytes")),
             str(r.get("deterministic", "-")).lower()]
            for r in doc.rows if r.status != "skipped"]
    backends = dict.fromkeys(b for b, _ in _columns(doc))
    pairs = [f"{b}:{n}/{b}:{d}" for b in backends for n, d in (("megatron_flag", "megatron"), ("flag", "explicit"))]
    notes = [t for t in (saved_pair(doc, p) for p in pairs) if t]
    notes.append("saved = tensors autograd keeps for backward, once per storage; peak = CUDA peak of one "
                 "fwd+bwd above what was allocated before (none on the CPU)")
    return Table("memory per fwd+bwd step (MB)", ["shape", "backend:route", "status", "saved MB", "peak MB",
                                                  "deterministic"], rows, notes)


def _gbps(x) -> str:
    return "-" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.3g}")


def decode_table(doc: RunDocument) -> Table:
    """decode: per ok row, the bytes the step must move, its times and the achieved GB/s on each."""
    rows = []
    for r in doc.rows:
        if r.mode != "decode" or r.status != "ok":
            continue
        gb = r.get("gbps") or {}
        rows.append([r.shape_id, r.spec, _mb(r.get("step_bytes")), fmt_us(r.median("gpu")), _gbps(gb.get("gpu")),
                     fmt_us(r.median("wall")), _gbps(gb.get("wall"))])
    notes = ["GB/s = bytes the step must move / median time: q, k, v, gates and o once, the N states read and "
             "written once at the pool's dtype, the int64 indices, + the route's standalone l2norm passes "
             "(gdnbench/analysis/roofline.py); a backend that gathers and scatters its states moves more than that",
             "with a warm L2 the small-N steps can exceed DRAM bandwidth (--l2 cold flushes it before each call)"]
    return Table("decode step: time and achieved bandwidth", ["shape", "backend:route", "MB/step", "gpu µs",
                                                              "GB/s gpu", "wall µs", "GB/s wall"], rows, notes)


def report_tables(doc: RunDocument, baseline: str | None = None, pairs: list[str] | None = None,
                  mode: str | None = None) -> list[Table]:
    """The tables of one mode's rows (default: the file's run mode)."""
    mode = mode or run_mode(doc)
    doc = rows_of_mode(doc, mode)
    base = baseline or default_baseline(doc)
    tables = [time_table(doc, mode)]
    if base:
        tables.append(ratio_table(doc, base, kinds_present(doc)[-1], mode))
    optional = (geomean_table(doc, pairs, mode), check_table(doc, mode), spread_table(doc, mode),
                kernel_table(doc, mode), fusion_table(doc, mode))
    tables += [t for t in optional if t is not None]
    if mode == "fwd_bwd":
        tables += [grad_table(doc), layer_table(doc), memory_table(doc)]
    if mode == "decode":
        tables.append(decode_table(doc))
    return tables


def time_spent(rows: list[Row]) -> dict:
    """Seconds a run spent on oracles (once per shape), row checks (prepare, first call, gate) and
    timing loops, summed from the rows' ``seconds`` (rows without it count nothing)."""
    oracle: dict[str, float] = {}
    check = timing = 0.0
    for r in rows:
        sec = r.seconds or {}
        if "oracle" in sec:
            oracle[r.shape_id] = sec["oracle"]
        check += sec.get("check", 0.0)
        timing += sec.get("timing", 0.0)
    return {"oracle": sum(oracle.values()), "check": check, "timing": timing}


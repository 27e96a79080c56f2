"""Two runs of one shape set side by side: per-row and geomean B/A time ratios (``gdnbench compare``; its
``--fail-above`` holds :func:`compare_ratios` against a limit)."""

from __future__ import annotations

from ..data.records import TIME_KINDS, RunDocument
from ..data.results import card_of
from .report import geomean_of, index_rows, median, run_mode
from .tables import Table, fmt_us


class CompareError(ValueError):
    pass


def _matched(a: RunDocument, b: RunDocument, mode: str | None, backends: list[str] | None):
    """(row keys compared, A's rows, B's rows): CompareError when the shape sets differ; rows skipped in
    both runs are left out."""
    if run_mode(a) != run_mode(b):
        raise CompareError(f"modes differ: A is a {run_mode(a)} run, B a {run_mode(b)} run; compare runs of one mode")
    mode = mode or run_mode(a)
    sa, sb = a.shape_set, b.shape_set
    if sa.hash != sb.hash:
        raise CompareError(f"shape sets differ: {sa.name} v{sa.version} ({sa.hash[:19]}) vs "
                           f"{sb.name} v{sb.version} ({sb.hash[:19]})")
    ia, ib = index_rows(a, mode), index_rows(b, mode)
    keys = [k for k in ia if k in ib] + [k for k in ib if k not in ia] + [k for k in ia if k not in ib]
    keys = [k for k in dict.fromkeys(keys) if not backends or k[1] in backends]
    keys = [k for k in keys if any(r is not None and r.status != "skipped" for r in (ia.get(k), ib.get(k)))]
    return keys, ia, ib


def compare_ratios(a: RunDocument, b: RunDocument, mode: str | None = None, backends: list[str] | None = None,
                   rows: bool = False) -> list[tuple[str, float]]:
    """(label, B/A) of each time kind's geomean over the rows timed in both runs, and with ``rows`` of
    each such row: what ``gdnbench compare --fail-above`` holds against its limit."""
    keys, ia, ib = _matched(a, b, mode, backends)
    out = []
    for kind in TIME_KINDS:
        per_row = [(f"{k[0]} {k[1]}:{k[2]} [{kind}]", median(ib.get(k), kind) / median(ia.get(k), kind))
                   for k in keys if median(ia.get(k), kind) and median(ib.get(k), kind)]
        if per_row:
            out.append((f"geomean [{kind}] over {len(per_row)} rows", geomean_of([r for _, r in per_row])))
        out += per_row if rows else []
    return out


def compare(a: RunDocument, b: RunDocument, mode: str | None = None, backends: list[str] | None = None) -> list[Table]:
    """Per-row and geomean B/A time ratios of two runs of the same shape set.

    Rows skipped in both runs are left out; every other row without a time on both sides is
    listed as excluded. `backends` restricts the comparison (e.g. to a backend whose code
    did not change between the runs)."""
    keys, ia, ib = _matched(a, b, mode, backends)
    rows, notes = [], []
    ratios = {k: [] for k in TIME_KINDS}
    for key in keys:
        ra, rb = ia.get(key), ib.get(key)
        line = [key[0], f"{key[1]}:{key[2]}"]
        for kind in TIME_KINDS:
            ta, tb = median(ra, kind), median(rb, kind)
            if ta and tb:
                ratios[kind].append(tb / ta)
                line += [fmt_us(ta), fmt_us(tb), f"{tb / ta:.3f}"]
            else:
                line += [fmt_us(ta), fmt_us(tb), "-"]
        if median(ra, "wall") is None or median(rb, "wall") is None:
            notes.append(f"excluded {key[0]} {key[1]}:{key[2]}: A {ra.status if ra else 'missing'}, "
                         f"B {rb.status if rb else 'missing'}")
        rows.append(line)
    for kind in reversed(TIME_KINDS):
        xs = ratios[kind]
        gm = f"{geomean_of(xs):.3f}" if xs else "n/a"
        spread = f", per-row range {min(xs):.3f}..{max(xs):.3f}" if xs else ""
        notes.insert(0, f"geomean B/A [{kind}]: {gm} over {len(xs)}/{len(keys)} rows{spread}")
    notes += _cards(a, b)
    headers = ["shape", "backend:route", "A wall", "B wall", "B/A wall", "A gpu", "B gpu", "B/A gpu"]
    return [Table("compare B/A (median µs)", headers, rows, notes)]


def _cards(a: RunDocument, b: RunDocument) -> list[str]:
    """A note on whether the two runs shared a card, where both files name theirs (env.gpu.uuid)."""
    ua, ub = card_of(a.env), card_of(b.env)
    if not (ua and ub):
        return []
    if ua == ub:
        return [f"both runs on card {ua}"]
    return [f"different cards (A {ua}, B {ub}): a kernel's time at one config can differ between cards of a model; "
            "judge small changes on one card"]

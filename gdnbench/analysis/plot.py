"""Charts: grouped bars of time per shape for each backend:route, and a panel of ratios
to the baseline. Bars are the chosen time kind (gpu by default); a black tick on each bar
marks the wall time, so host-bound rows show as ticks far above their bars."""

from __future__ import annotations

from pathlib import Path

from ..data.records import RunDocument
from .report import _columns, _side, default_baseline, index_rows, median, shape_ids


def plot(doc: RunDocument, out: str | Path, kind: str = "gpu", baseline: str | None = None, mode: str = "fwd") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    idx = index_rows(doc, mode)
    if kind == "gpu" and not any(median(r, "gpu") for r in idx.values()):
        kind = "wall"  # CPU runs have no gpu time
    cols = [c for c in _columns(doc) if any(median(idx.get((s, *c)), kind) for s in shape_ids(doc))]
    shapes = [s for s in shape_ids(doc) if any(median(idx.get((s, *c)), kind) for c in cols)]
    baseline = baseline or default_baseline(doc)
    if not cols or not shapes:
        raise ValueError("nothing to plot: no ok rows with times")

    fig, (ax_t, ax_r) = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(shapes) + 3), 8.5), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 2]})
    width = 0.8 / len(cols)
    colors = bar_colors(cols)
    for j, (b, r) in enumerate(cols):
        xs = [i + (j - (len(cols) - 1) / 2) * width for i in range(len(shapes))]
        times = [median(idx.get((s, b, r)), kind) or 0.0 for s in shapes]
        ax_t.bar(xs, times, width, label=f"{b}:{r}", color=colors[j])
        if kind == "gpu":
            walls = [median(idx.get((s, b, r)), "wall") for s in shapes]
            wx = [x for x, w in zip(xs, walls) if w]
            ax_t.scatter(wx, [w for w in walls if w], marker="_", s=120, color="black", zorder=3,
                         label="wall (events per eager call)" if j == 0 else None)
        if baseline:
            ratios = []
            for s in shapes:
                t, _ = _side(idx, s, f"{b}:{r}", kind)
                base, _ = _side(idx, s, baseline, kind)
                ratios.append(t / base if t and base else 0.0)
            ax_r.bar(xs, ratios, width, color=colors[j])
    ax_t.set_ylabel(f"{kind} time per call, median (µs)")
    ss = doc.shape_set
    gpu = (doc.env.get("gpu") or {}).get("name", "CPU")
    ax_t.set_title(f"{ss.name} v{ss.version} on {gpu}: bars = {kind} time")
    # outside the axes, right of the bars: inside, it covered the first shapes' bars
    ax_t.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax_t.grid(axis="y", alpha=0.3)
    if baseline:
        ax_r.axhline(1.0, color="black", lw=0.8)
        ax_r.set_ylabel(f"{kind} time / {baseline}")
        ax_r.grid(axis="y", alpha=0.3)
    ax_r.set_xticks(range(len(shapes)))
    ax_r.set_xticklabels(shapes, rotation=20, ha="right", fontsize=9)
    missing = missing_bars(doc, mode)
    if missing:
        ax_r.text(1.01, 1.0, "no bar:\n" + "\n".join(missing), transform=ax_r.transAxes, fontsize=7, va="top")
    return save_figure(fig, out)


def missing_bars(doc: RunDocument, mode: str = "fwd") -> list[str]:
    """Each backend:route whose rows failed (not skipped) somewhere: which status on how many shapes,
    so a chart never drops a failing backend without a word."""
    failed: dict[str, dict[str, int]] = {}
    for r in doc.rows:
        if r.mode == mode and r.status not in ("ok", "skipped"):
            counts = failed.setdefault(r.spec, {})
            counts[r.status] = counts.get(r.status, 0) + 1
    n = len(shape_ids(doc))
    return [f"{spec}: " + ", ".join(f"{status} on {k}/{n}" for status, k in sorted(counts.items()))
            for spec, counts in sorted(failed.items())]


def bar_colors(cols: list[tuple[str, str]]) -> list[tuple]:
    """One hue per backend (tab10, in order of appearance), its routes in lighter shades of it: with
    five backends and twelve backend:routes, tab10 per column repeated colours across backends."""
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    backends = list(dict.fromkeys(b for b, _ in cols))
    routes = {b: [r for bb, r in cols if bb == b] for b in backends}
    out = []
    for b, r in cols:
        base = cmap(backends.index(b) % 10)
        k, n = routes[b].index(r), len(routes[b])
        mix = 0.55 * k / max(1, n - 1)  # 0 for a backend's first route, up to 0.55 towards white
        out.append(tuple(c + (1 - c) * mix for c in base[:3]))
    return out


def save_figure(fig, out: str | Path) -> Path:
    """Lay out, write as PNG (parents created) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # "tight" keeps a legend placed outside the axes
    plt.close(fig)
    return out

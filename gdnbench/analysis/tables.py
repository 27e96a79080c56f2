"""Report tables as data (`Table`) and their renderings: markdown, plain text, CSV, JSON, Rich."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def fmt_us(t: float | None) -> str:
    """A time in µs for a table cell: whole µs from 100 up, one decimal below, '-' for none."""
    if t is None:
        return "-"
    return f"{t:.0f}" if t >= 100 else f"{t:.1f}"


def to_markdown(tables: list[Table]) -> str:
    out = []
    for t in tables:
        out.append(f"### {t.title}\n")
        out.append("| " + " | ".join(t.columns) + " |")
        out.append("|" + "|".join("---" for _ in t.columns) + "|")
        for r in t.rows:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
        out.append("")
        for n in t.notes:
            out.append(f"- {n}")
        out.append("")
    return "\n".join(out)


def to_text(tables: list[Table]) -> str:
    """Plain aligned columns at full width, nothing wrapped: the tables where stdout is no terminal."""
    out = []
    for t in tables:
        widths = [max(len(x) for x in [c, *(r[i] if i < len(r) else "" for r in t.rows)])
                  for i, c in enumerate(t.columns)]
        out.append(t.title)
        for line in [t.columns, ["-" * w for w in widths], *t.rows]:
            out.append("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
        out += [f"  {n}" for n in t.notes] + [""]
    return "\n".join(out)


def to_csv(tables: list[Table]) -> str:
    """Each table as a CSV block (a header line, then its rows), each line led by the table's title;
    blocks separated by an empty line. Notes are left out."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for i, t in enumerate(tables):
        if i:
            buf.write("\n")
        w.writerow(["table", *t.columns])
        w.writerows([t.title, *r] for r in t.rows)
    return buf.getvalue()


def to_json(tables: list[Table]) -> str:
    """{"tables": [{title, columns, rows: [{column: cell}], notes}]}."""
    import json

    return json.dumps({"tables": [{"title": t.title, "columns": t.columns,
                                   "rows": [dict(zip(t.columns, r)) for r in t.rows], "notes": t.notes}
                                  for t in tables]}, indent=1, ensure_ascii=False) + "\n"


FORMATS = {"markdown": to_markdown, "csv": to_csv, "json": to_json, "text": to_text}


def to_rich(t: Table):
    from rich.markup import escape
    from rich.table import Table as RichTable

    rt = RichTable(title=escape(t.title), title_justify="left", show_lines=False)
    for c in t.columns:
        rt.add_column(escape(c), overflow="fold")
    for r in t.rows:
        rt.add_row(*(escape(c) for c in r))
    if t.notes:
        rt.caption = escape("\n".join(t.notes))
        rt.caption_justify = "left"
    return rt

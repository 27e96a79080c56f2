"""Typed results records: a `Row` per backend x route x shape, and the `RunDocument` that holds a run.

Each record checks itself when it is built, so a row that breaks the rules cannot exist: `ok` carries
a passing check and its times, `incorrect` its failing check and no time, `skipped` and `error` a
reason and no time; every median is a positive finite number. `to_dict` / `from_dict` are the JSON
format of results files, journals and the worker's row stream: a field these records do not know is
kept as it came (`extras`), and a field written as null stays null (`nulls`), so a document read and
written again is the same document. Nested values are read-only (mappings and tuples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Mapping

from ..vocab import ALL_ROUTES, FAMILIES, MODES, ROW_STATUSES

SCHEMA_VERSION = 1
TIME_KINDS = ("wall", "gpu")
EMPTY: Mapping = MappingProxyType({})


class ResultsError(ValueError):
    """A results document, row or file that cannot be used, in one line naming where it is (file, row),
    the field and the value. `inside` and `at` add an enclosing record's part of that name."""

    def __init__(self, detail: str, field: str = "", where: str = "", style: str = "field"):
        self.detail, self.field, self.where, self.style = detail, field, where, style
        if not field:
            body = detail
        elif style == "missing":
            body = f"missing field {field!r}"
        elif style == "vocab":
            body = f"{field} {detail}"
        else:
            body = f"field {field!r}: {detail}"
        super().__init__(f"{where}: {body}" if where else body)

    def inside(self, parent: str) -> "ResultsError":
        name = f"{parent}.{self.field}" if self.field else parent
        return ResultsError(self.detail, name, self.where, self.style)

    def at(self, where: str) -> "ResultsError":
        return ResultsError(self.detail, self.field, f"{where}: {self.where}" if self.where else where, self.style)


def kind(value) -> str:
    """A JSON value's kind and the value, briefly, for an error message."""
    names = {dict: "an object", list: "a list", tuple: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    shown = repr(value) if not isinstance(value, (Mapping, list, tuple)) else ""
    name = "an object" if isinstance(value, Mapping) else names.get(type(value), type(value).__name__)
    return f"{name} {shown[:60]}".strip()


def freeze(value):
    """A read-only copy of a JSON value: mappings become read-only mappings, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value):
    """The plain JSON value (dicts and lists) of a frozen one, or of a record."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


# ----------------------------------------------------------------------------- field checks
def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_KINDS = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "num": (_is_num, "a number"),
    "pos": (lambda v: _is_num(v) and 0 < v < math.inf, "a positive number"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "map": (lambda v: isinstance(v, Mapping), "an object"),
    "nums": (lambda v: isinstance(v, tuple) and all(_is_num(x) for x in v), "a list of numbers"),
    "strs": (lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v), "a list of strings"),
    "num_map": (lambda v: isinstance(v, Mapping) and all(_is_num(x) for x in v.values()),
                "an object of numbers"),
    "str_map": (lambda v: isinstance(v, Mapping) and all(isinstance(x, str) for x in v.values()),
                "an object of strings"),
}


def _check_fields(rec, types: dict[str, str], required: tuple[str, ...] = ()) -> None:
    """Freeze each field, then check it has its kind (None allowed unless required) and that
    every name in `nulls` is a field that is None."""
    for name, k in types.items():
        value = freeze(getattr(rec, name))
        object.__setattr__(rec, name, value)
        if value is None and name not in required:
            continue
        test, words = _KINDS[k]
        if not test(value):
            raise ResultsError(f"expected {words}, got {kind(value)}", name)
    object.__setattr__(rec, "extras", freeze(rec.extras))
    object.__setattr__(rec, "nulls", frozenset(rec.nulls))
    known = {f.name for f in fields(rec)} - {"extras", "nulls"}
    for name in rec.nulls:
        if name not in known or getattr(rec, name) is not None:
            raise ResultsError(f"nulls names {name!r}, not a field that is null", name)


def _to_dict(rec) -> dict:
    out = {}
    for f in fields(rec):
        if f.name in ("extras", "nulls"):
            continue
        v = getattr(rec, f.name)
        if v is not None or f.name in rec.nulls:
            out[f.name] = thaw(v)
    out.update(thaw(rec.extras))
    return out


def _from_dict(cls, d, nested: Mapping[str, type] = EMPTY, required: tuple[str, ...] = ()):
    """`cls` built from a JSON object: known keys become fields (`nested` ones records of their own),
    null ones are listed in `nulls`, the rest kept in `extras`."""
    if not isinstance(d, Mapping):
        raise ResultsError(f"expected an object, got {kind(d)}")
    for name in required:
        if name not in d:
            raise ResultsError("", name, style="missing")
    known = {f.name for f in fields(cls)} - {"extras", "nulls"}
    kw: dict[str, Any] = {}
    nulls = set()
    for name in [k for k in d if k in known]:  # in the object's order: the first bad field is named
        v = d[name]
        if v is None and name not in required:
            nulls.add(name)
        elif name in nested:
            if not isinstance(v, Mapping):
                raise ResultsError(f"expected an object or null, got {kind(v)}", name)
            try:
                kw[name] = nested[name].from_dict(v)
            except ResultsError as e:
                raise e.inside(name) from None
        else:
            kw[name] = v
    return cls(**kw, extras={k: v for k, v in d.items() if k not in known}, nulls=frozenset(nulls))


# ----------------------------------------------------------------------------- a row's parts
@dataclass(frozen=True)
class Stats:
    """One time of a row over its timed calls (`bench.timing.summarize`), µs per call."""

    median_us: float
    p20_us: float | None = None
    p80_us: float | None = None
    min_us: float | None = None
    mean_us: float | None = None
    n: int | None = None
    samples_us: tuple[float, ...] | None = None
    round_medians_us: tuple[float, ...] | None = None
    round_spread: float | None = None  # (max - min) / median of the per-round medians
    method: str | None = None  # gpu: "graph" (replays of a CUDA graph) or "profiler" (kernel sum)
    graph_error: str | None = None  # gpu: why the capture failed
    extras: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    TYPES = {"median_us": "pos", "p20_us": "num", "p80_us": "num", "min_us": "num", "mean_us": "num", "n": "int",
             "samples_us": "nums", "round_medians_us": "nums", "round_spread": "num", "method": "str",
             "graph_error": "str"}

    def __post_init__(self):
        _check_fields(self, self.TYPES, ("median_us",))

    def to_dict(self) -> dict:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, d) -> "Stats":
        return _from_dict(cls, d, required=("median_us",))


@dataclass(frozen=True)
class Check:
    """The gate's verdict on a row (`oracle.check.Verdict` and the modes' verdicts): passed, why not,
    and its figures (err_o, budget_o, ..., grads, layer) as the gate wrote them, in `extras`."""

    passed: bool
    reason: str | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    def __post_init__(self):
        _check_fields(self, {"passed": "bool", "reason": "str"}, ("passed",))

    def get(self, name: str, default=None):
        """One figure of the verdict (None where the gate wrote none)."""
        return self.extras.get(name, default)

    def to_dict(self) -> dict:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, d) -> "Check":
        return _from_dict(cls, d, required=("passed",))


# ----------------------------------------------------------------------------- the row
TIME_FIELDS = ("wall", "gpu", "profiler_us", "kernels_us")  # what only an `ok` row may carry


@dataclass(frozen=True)
class Row:
    """One backend x route x shape of a run. Fields beyond these (a mode's saved_bytes, peak_bytes,
    deterministic, step_bytes, gbps; an error's traceback or stderr_tail) are in `extras`."""

    shape_id: str
    family: str
    backend: str
    route: str
    mode: str
    status: str
    reason: str = ""
    timing_meaningful: bool | None = None  # false on the CPU: interpreter kernels, no gpu time
    check: Check | None = None
    first_call_ms: float | None = None
    backend_version: str | None = None
    variant: str | None = None  # what ran for the route
    config: str | None = None  # which launch config ran
    seconds: Mapping[str, float] | None = None  # where the run's time went: oracle, check, timing
    wall: Stats | None = None  # events around eager calls
    gpu: Stats | None = None  # the kernels' own time
    profiler_us: float | None = None  # torch.profiler's kernel sum per call
    kernels_us: Mapping[str, float] | None = None  # the same, split by kernel
    host_bound: bool | None = None  # wall exceeds gpu by more than the margin
    extras: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    REQUIRED = ("shape_id", "family", "backend", "route", "mode", "status", "reason")
    TYPES = {"shape_id": "str", "family": "str", "backend": "str", "route": "str", "mode": "str", "status": "str",
             "reason": "str", "timing_meaningful": "bool", "first_call_ms": "num", "backend_version": "str",
             "variant": "str", "config": "str", "seconds": "num_map", "profiler_us": "num", "kernels_us": "num_map",
             "host_bound": "bool"}
    NESTED = {"check": Check, "wall": Stats, "gpu": Stats}

    def __post_init__(self):
        _check_fields(self, self.TYPES, self.REQUIRED)
        for name, cls in self.NESTED.items():
            if getattr(self, name) is not None and not isinstance(getattr(self, name), cls):
                raise ResultsError(f"expected {cls.__name__}, got {kind(getattr(self, name))}", name)
        for name, vocab in (("status", ROW_STATUSES), ("mode", MODES), ("family", FAMILIES), ("route", ALL_ROUTES)):
            if getattr(self, name) not in vocab:
                raise ResultsError(f"{getattr(self, name)!r} is not one of {vocab}", name, style="vocab")
        self._check_status()

    def _check_status(self) -> None:
        """No time without a passing check; no failure without its cause."""
        s = self.status
        if s == "ok":
            if self.check is None:
                raise ResultsError("status 'ok' needs a passing check, got none", "check")
            if not self.check.passed:
                raise ResultsError("status 'ok' needs a passing check, got false", "check.passed")
            if self.wall is None:
                raise ResultsError("status 'ok' needs its wall time, got none", "wall")
            if self.gpu is None and self.timing_meaningful is not False:
                raise ResultsError("status 'ok' needs its gpu time (none only where timing_meaningful is false), "
                                   "got none", "gpu")
            return
        for name in TIME_FIELDS:
            if getattr(self, name) is not None:
                raise ResultsError(f"status {s!r} carries no time, got {kind(thaw(getattr(self, name)))}", name)
        if s == "incorrect":
            if self.check is None:
                raise ResultsError("status 'incorrect' needs the failed check's figures, got none", "check")
            if self.check.passed:
                raise ResultsError("status 'incorrect' needs a failed check, got true", "check.passed")
        elif not self.reason:
            raise ResultsError(f"status {s!r} needs a reason, got ''", "reason")

    @property
    def key(self) -> tuple[str, str, str]:
        return self.shape_id, self.backend, self.route

    @property
    def spec(self) -> str:
        """`backend:route`, as the report and the command line name it."""
        return f"{self.backend}:{self.route}"

    def median(self, kind: str) -> float | None:
        """The median µs of a time kind (`wall` or `gpu`) of an ok row; None otherwise."""
        t = getattr(self, kind) if self.status == "ok" else None
        return t.median_us if t is not None else None

    def get(self, name: str, default=None):
        """A field beyond the typed ones (saved_bytes, step_bytes, ...)."""
        return self.extras.get(name, default)

    def to_dict(self) -> dict:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, d) -> "Row":
        return _from_dict(cls, d, cls.NESTED, cls.REQUIRED)


# ----------------------------------------------------------------------------- the document
@dataclass(frozen=True)
class ShapeSetInfo:
    """The frozen shape set a run measured: name, version, content hash, families, and each shape's
    label in the set's order."""

    name: str
    hash: str
    version: int | None = None
    families: tuple[str, ...] | None = None
    shapes: Mapping[str, str] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    def __post_init__(self):
        _check_fields(self, {"name": "str", "hash": "str", "version": "int", "families": "strs",
                             "shapes": "str_map"}, ("name", "hash"))

    @classmethod
    def of(cls, shape_set) -> "ShapeSetInfo":
        """The record of a loaded `ShapeSet`."""
        return cls(shape_set.name, shape_set.hash, shape_set.version, tuple(shape_set.families),
                   {s.id: s.label() for s in shape_set.shapes})

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self.shapes or ())

    def to_dict(self) -> dict:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, d) -> "ShapeSetInfo":
        return _from_dict(cls, d, required=("name", "hash"))


def _schema_error(version) -> ResultsError:
    return ResultsError(f"schema_version {version!r}, this gdnbench reads {SCHEMA_VERSION}; use the gdnbench "
                        f"version that wrote it")


@dataclass(frozen=True)
class RunDocument:
    """A run: where it ran (`env`), how it timed (`timing`), what was asked (`run`: argv, backends,
    routes, mode, ...), the shape set, and the rows, each of a shape of that set."""

    env: Mapping[str, Any]
    shape_set: ShapeSetInfo
    timing: Mapping[str, Any]
    run: Mapping[str, Any] | None = None
    rows: tuple[Row, ...] = ()
    created_utc: str | None = None
    schema_version: int = SCHEMA_VERSION
    extras: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    def __post_init__(self):
        if self.schema_version != SCHEMA_VERSION:
            raise _schema_error(self.schema_version)
        object.__setattr__(self, "rows", tuple(self.rows))
        _check_fields(self, {"env": "map", "timing": "map", "run": "map", "created_utc": "str"}, ("env", "timing"))
        if not isinstance(self.shape_set, ShapeSetInfo):
            raise ResultsError(f"expected an object, got {kind(self.shape_set)}", "shape_set")
        known = set(self.shape_set.ids)
        for i, r in enumerate(self.rows):
            if not isinstance(r, Row):
                raise ResultsError(f"expected a Row, got {kind(r)}").at(f"row {i}")
            if known and r.shape_id not in known:
                raise ResultsError(f"{r.shape_id!r} is not a shape of set {self.shape_set.name!r}",
                                   "shape_id").at(f"row {i}")

    @property
    def mode(self) -> str:
        """The mode the run measured (documents without one are forward runs)."""
        return (self.run or {}).get("mode") or "fwd"

    def with_rows(self, rows) -> "RunDocument":
        return replace(self, rows=tuple(rows))

    def header(self) -> dict:
        """The document without its rows: a journal's first line."""
        d = self.to_dict()
        d.pop("rows")
        return d

    def to_dict(self) -> dict:
        out = {"schema_version": self.schema_version}
        if self.created_utc is not None or "created_utc" in self.nulls:
            out["created_utc"] = self.created_utc
        out.update(env=thaw(self.env), shape_set=self.shape_set.to_dict(), timing=thaw(self.timing))
        if self.run is not None or "run" in self.nulls:
            out["run"] = thaw(self.run)
        out["rows"] = [r.to_dict() for r in self.rows]
        out.update(thaw(self.extras))
        return out

    @classmethod
    def from_dict(cls, d, source: str = "") -> "RunDocument":
        """The document of a JSON object; ResultsError naming `source` (a path), the row and the field."""
        try:
            return cls._from_dict(d)
        except ResultsError as e:
            raise (e.at(source) if source else e) from None

    @classmethod
    def _from_dict(cls, d) -> "RunDocument":
        if not isinstance(d, Mapping) or "schema_version" not in d:
            raise ResultsError("not a gdnbench results file (no schema_version)")
        if d["schema_version"] != SCHEMA_VERSION:
            raise _schema_error(d["schema_version"])
        for name in ("env", "shape_set", "timing", "rows"):
            if name not in d:
                raise ResultsError("", name, style="missing")
        for name in ("env", "shape_set", "timing"):
            if not isinstance(d[name], Mapping):
                raise ResultsError(f"expected an object, got {kind(d[name])}", name)
        if not isinstance(d["rows"], list):
            raise ResultsError(f"expected a list of objects, got {kind(d['rows'])}", "rows")
        rows = []
        for i, r in enumerate(d["rows"]):
            try:
                rows.append(Row.from_dict(r))
            except ResultsError as e:
                raise e.at(f"row {i}") from None
        try:
            info = ShapeSetInfo.from_dict(d["shape_set"])
        except ResultsError as e:
            raise e.inside("shape_set") from None
        top = {f.name for f in fields(cls)} - {"extras", "nulls"}
        nulls = frozenset(k for k in ("run", "created_utc") if k in d and d[k] is None)
        return cls(env=d["env"], shape_set=info, timing=d["timing"], run=d.get("run"), rows=rows,
                   created_utc=d.get("created_utc"), extras={k: v for k, v in d.items() if k not in top},
                   nulls=nulls)

"""Frozen, versioned shape sets: <name>.toml -> typed `Shape`s (the shipped ones in shapes/, installed as
gdnbench/shape_sets/).

A shape-set file has top-level `name`, `version`, `hash`, optional `description`,
an optional `[defaults]` table merged under every `[[shape]]`, and the shapes.
`hash` freezes the content: it is the sha256 of the canonical JSON of the resolved
shapes, so reformatting the TOML keeps it and any change of meaning breaks it.
The ledger `frozen.json` beside a set's file records every (name, version) -> hash ever published, so
a changed set must bump its version (and be recorded) to verify again. Fields added to the
format later (`decode`, `pool`, `state_dtype`, `gate_regime`) enter the hash only when set away from their
default, so every set frozen before them keeps its hash.

Decode shapes (`decode = true`, mode decode): one new token for each of N = B sequences,
`lens = [1]`; the sequences' states live in a pool of `pool` slots (default B) at
`state_dtype` (float32 default; other dtypes only for decode shapes), read and updated in place
at seeded distinct slot indices (gdnbench.data.inputs).

`gate_regime` (default `strong`) picks how the decay g is drawn (gdnbench.data.inputs): `strong` is
every set's draw before the field, `long` gives heads memories of ~10 to ~1000 tokens and some
unbounded (g = 0), so the inter-chunk recurrence carries the answer.

No torch import here: `gdnbench shapes ...` and the tests run anywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..paths import SHAPE_SETS_DIR
from .files import read_text
from ..vocab import DTYPES, FAMILIES  # noqa: F401

SHAPES_DIR = SHAPE_SETS_DIR
FROZEN_LEDGER = "frozen.json"

GATES = {"gdn": "logsigmoid", "kda": "bounded"}
# how the decay g is drawn (gdnbench.data.inputs): `strong`, every head forgets within a chunk; `long`, per-head
# (KDA: per-channel) rates over two decades and some exactly 0, as in trained models
GATE_REGIMES = ("strong", "long")
MAX_HEAD_DIM = 256
# Sizes no GPU could hold are refused at load (H = 10**23 once loaded, and its run "succeeded" with
# an error row whose reason was lost): every count within int32 (the kernels' index type), and a
# shape's q, k, v, o, gates and states within 1 TiB (an H200 holds 141 GB).
MAX_COUNT = 2**31 - 1
MAX_SHAPE_BYTES = 2**40


class ShapeError(ValueError):
    """A shape file that cannot be used; the message names file, shape and field."""


@dataclass(frozen=True)
class Shape:
    id: str
    family: str
    H: int
    HV: int
    K: int
    V: int
    lens: tuple[int, ...]
    seed: int
    gate: str
    B: int = 1
    dtype: str = "bfloat16"
    lower_bound: float | None = None
    initial_state: bool = False
    scale: float | None = None
    note: str = ""
    decode: bool = False
    pool: int | None = None
    state_dtype: str = "float32"
    gate_regime: str = "strong"

    @property
    def varlen(self) -> bool:
        """Several lengths = one packed batch (B=1) with cu_seqlens."""
        return len(self.lens) > 1

    @property
    def n_seqs(self) -> int:
        return len(self.lens) if self.varlen else self.B

    @property
    def tokens(self) -> int:
        return sum(self.lens) if self.varlen else self.B * self.lens[0]

    @property
    def pool_size(self) -> int:
        """State-pool slots of a decode shape (default: one per sequence)."""
        return self.pool if self.pool is not None else self.B

    @property
    def attn_scale(self) -> float:
        return self.scale if self.scale is not None else self.K ** -0.5

    def shortened(self, max_tokens: int) -> "Shape":
        """The same heads, dims and length mix with at most ~max_tokens tokens (for the oracle).
        A decode shape is one token per sequence: nothing to shorten."""
        if self.decode or self.tokens <= max_tokens:
            return self
        if not self.varlen:
            per_seq = max(1, max_tokens // self.B)
            return _replace(self, lens=(per_seq,))
        f = max_tokens / self.tokens
        return _replace(self, lens=tuple(max(1, round(n * f)) for n in self.lens))

    def label(self) -> str:
        if self.decode:
            return (f"{self.family} H{self.H}/HV{self.HV} K{self.K} V{self.V} decode N{self.B} pool{self.pool_size} "
                    f"{self.state_dtype} state")
        mix = f"T{self.lens[0]}" + (f"xB{self.B}" if self.B > 1 else "") if not self.varlen else f"{len(self.lens)}seq/{self.tokens}"
        regime = "" if self.gate_regime == "strong" else f" {self.gate_regime}-g"
        return f"{self.family} H{self.H}/HV{self.HV} K{self.K} V{self.V} {mix}{regime}"


def _replace(shape: Shape, **kw) -> Shape:
    d = asdict(shape)
    d.update(kw)
    return Shape(**d)


@dataclass(frozen=True)
class ShapeSet:
    name: str
    version: int
    hash: str
    description: str
    shapes: tuple[Shape, ...]
    path: str = ""
    families: tuple[str, ...] = field(default=())

    def get(self, shape_id: str) -> Shape:
        for s in self.shapes:
            if s.id == shape_id:
                return s
        raise ShapeError(f"{self.path}: no shape {shape_id!r} in set {self.name}")


# field -> (type(s), required)
_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "id": ((str,), True),
    "family": ((str,), True),
    "H": ((int,), True),
    "HV": ((int,), False),
    "K": ((int,), True),
    "V": ((int,), True),
    "lens": ((list,), True),
    "seed": ((int,), True),
    "gate": ((str,), False),
    "B": ((int,), False),
    "dtype": ((str,), False),
    "lower_bound": ((float, int), False),
    "initial_state": ((bool,), False),
    "scale": ((float, int), False),
    "note": ((str,), False),
    "decode": ((bool,), False),
    "pool": ((int,), False),
    "state_dtype": ((str,), False),
    "gate_regime": ((str,), False),
}
# fields added after sets were first frozen -> their default: left out of the hash at the default
_LATER_FIELDS = {"decode": False, "pool": None, "state_dtype": "float32", "gate_regime": "strong"}
_TOP_KEYS = {"name", "version", "hash", "description", "defaults", "shape"}


def one_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _fail(path: str, sid: str, fld: str, msg: str) -> ShapeError:
    return ShapeError(f"{path}: shape {sid!r}: field {fld!r}: {msg}")


def _parse_shape(path: str, raw: dict, defaults: dict, index: int) -> Shape:
    merged = {**defaults, **raw}
    sid = str(merged.get("id", f"#{index}"))
    for key, value in merged.items():
        if key not in _FIELDS:
            raise _fail(path, sid, key, "unknown key")
        types, _ = _FIELDS[key]
        if isinstance(value, bool) and bool not in types:
            raise _fail(path, sid, key, f"expected {types[0].__name__}, got bool {value!r}")
        if not isinstance(value, types):
            raise _fail(path, sid, key, f"expected {types[0].__name__}, got {type(value).__name__} {value!r}")
    for key, (_, required) in _FIELDS.items():
        if required and key not in merged:
            raise _fail(path, sid, key, "missing")
    fam = merged["family"]
    if fam not in FAMILIES:
        raise _fail(path, sid, "family", f"{fam!r} is not one of {FAMILIES}")
    merged.setdefault("HV", merged["H"])
    merged.setdefault("gate", GATES[fam])
    for key in ("H", "HV", "K", "V", "B", "pool", "seed"):
        if key in merged and not merged[key] <= MAX_COUNT:
            raise _fail(path, sid, key, f"{merged[key]} is over {MAX_COUNT}")
    for key in ("H", "HV", "K", "V", "B", "pool"):
        if key in merged and merged[key] <= 0:
            raise _fail(path, sid, key, f"must be positive, got {merged[key]}")
    if merged["HV"] % merged["H"]:
        raise _fail(path, sid, "HV", f"{merged['HV']} is not a multiple of H={merged['H']}")
    for key in ("K", "V"):
        if merged[key] > MAX_HEAD_DIM:
            raise _fail(path, sid, key, f"{merged[key]} is over {MAX_HEAD_DIM}")
    lens = merged["lens"]
    if not lens:
        raise _fail(path, sid, "lens", "empty")
    for n in lens:
        if isinstance(n, bool) or not isinstance(n, int):
            raise _fail(path, sid, "lens", f"expected integers, got {n!r}")
        if n <= 0:
            raise _fail(path, sid, "lens", f"length {n} is not positive")
        if n > MAX_COUNT:
            raise _fail(path, sid, "lens", f"length {n} is over {MAX_COUNT}")
    _check_decode(path, sid, merged)
    if len(lens) > 1 and merged.get("B", 1) != 1:
        raise _fail(path, sid, "B", "packed lens (several lengths) need B = 1")
    if merged["gate"] != GATES[fam]:
        raise _fail(path, sid, "gate", f"{merged['gate']!r}: family {fam} uses {GATES[fam]!r}")
    if merged.get("gate_regime", "strong") not in GATE_REGIMES:
        raise _fail(path, sid, "gate_regime", f"{merged['gate_regime']!r} is not one of {GATE_REGIMES}")
    if merged.get("dtype", "bfloat16") not in DTYPES:
        raise _fail(path, sid, "dtype", f"{merged['dtype']!r} is not one of {DTYPES}")
    lb = merged.get("lower_bound")
    if fam == "kda":
        if lb is None:
            raise _fail(path, sid, "lower_bound", "missing (the bounded gate needs it)")
        if not -5.0 <= lb < 0.0:
            raise _fail(path, sid, "lower_bound", f"{lb} is outside [-5, 0)")
        merged["lower_bound"] = float(lb)
    elif lb is not None:
        raise _fail(path, sid, "lower_bound", "only the kda family has a bounded gate")
    if merged.get("scale") is not None:
        if not (math.isfinite(merged["scale"]) and merged["scale"] > 0):
            raise _fail(path, sid, "scale", f"{merged['scale']} must be a positive number")
        merged["scale"] = float(merged["scale"])
    merged["lens"] = tuple(lens)
    shape = Shape(**merged)
    if shape_bytes(shape) > MAX_SHAPE_BYTES:
        raise _fail(path, sid, "lens", f"{shape.tokens} tokens x H{shape.H}/HV{shape.HV} K{shape.K} V{shape.V} need "
                                       f"{shape_bytes(shape) / 2**40:.1f} TiB, over {MAX_SHAPE_BYTES // 2**40} TiB")
    return shape


def shape_bytes(s: Shape) -> int:
    """Bytes of a shape's inputs, output and states at its dtypes (fp32 gates): a lower bound of a run's
    memory, for refusing sizes no GPU holds."""
    elt = 4 if s.dtype == "float32" else 2
    per_token = (2 * s.H * s.K + 2 * s.HV * s.V) * elt + s.HV * (s.K + 1) * 4
    return s.tokens * per_token + (s.pool_size if s.decode else s.n_seqs) * s.HV * s.K * s.V * 4


def _check_decode(path: str, sid: str, merged: dict) -> None:
    """The decode fields: state_dtype, and decode shapes' one token per sequence and pool."""
    sd = merged.get("state_dtype", "float32")
    if sd not in DTYPES:
        raise _fail(path, sid, "state_dtype", f"{sd!r} is not one of {DTYPES}")
    if not merged.get("decode", False):
        if "pool" in merged:
            raise _fail(path, sid, "pool", "only decode shapes (decode = true) have a state pool")
        if sd != "float32":
            raise _fail(path, sid, "state_dtype", f"{sd!r}: only decode shapes (decode = true) keep states "
                                                  "at a dtype other than float32")
        return
    if list(merged["lens"]) != [1]:
        raise _fail(path, sid, "lens", f"{merged['lens']}: a decode shape steps one token per sequence, "
                                       "use lens = [1] and B = N sequences")
    if merged.get("initial_state"):
        raise _fail(path, sid, "initial_state", "a decode shape's states come from its pool; drop initial_state")
    B = merged.get("B", 1)
    if merged.get("pool", B) < B:
        raise _fail(path, sid, "pool", f"{merged['pool']} slots is fewer than B={B} sequences")


def _canonical(shape: Shape) -> dict:
    d = asdict(shape)
    for key, default in _LATER_FIELDS.items():
        if d[key] == default:
            del d[key]
    return d


def canonical_hash(name: str, version: int, shapes: tuple[Shape, ...]) -> str:
    """sha256 over the canonical JSON of the resolved set (independent of TOML layout)."""
    doc = {"name": name, "version": version, "shapes": [_canonical(s) for s in shapes]}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def load_file(path: str | Path, frozen: bool = True) -> ShapeSet:
    """A set from its file; ``frozen=False`` (``freeze``) takes a file that has no ``hash`` yet."""
    p = str(path)
    text = read_text(p, ShapeError, "shape file", "TOML")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ShapeError(f"{p}: not valid TOML: {one_line(e)}") from None
    for key in raw:
        if key not in _TOP_KEYS:
            raise ShapeError(f"{p}: unknown top-level key {key!r}")
    if "hash" not in raw:
        if frozen:
            raise ShapeError(f"{p}: top-level field 'hash': missing (`gdnbench shapes freeze {p}` writes it)")
        raw["hash"] = ""
    for key, typ in (("name", str), ("version", int), ("hash", str)):
        if not isinstance(raw.get(key), typ) or isinstance(raw.get(key), bool):
            raise ShapeError(f"{p}: top-level field {key!r}: expected {typ.__name__}, got {raw.get(key)!r}")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ShapeError(f"{p}: [defaults] must be a table")
    raw_shapes = raw.get("shape", [])
    if not isinstance(raw_shapes, list) or not raw_shapes:
        raise ShapeError(f"{p}: no [[shape]] entries")
    for i, entry in enumerate(raw_shapes):
        if not isinstance(entry, dict):
            raise ShapeError(f"{p}: shape #{i}: expected a [[shape]] table, got {type(entry).__name__} {entry!r}")
    shapes = tuple(_parse_shape(p, s, defaults, i) for i, s in enumerate(raw_shapes))
    ids = [s.id for s in shapes]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ShapeError(f"{p}: shape {sorted(dup)[0]!r}: field 'id': duplicated")
    return ShapeSet(
        name=raw["name"],
        version=raw["version"],
        hash=raw["hash"],
        description=str(raw.get("description", "")),
        shapes=shapes,
        path=p,
        families=tuple(sorted({s.family for s in shapes})),
    )


def available(directory: Path = SHAPES_DIR) -> dict[str, Path]:
    return {p.stem: p for p in sorted(directory.glob("*.toml"))}


def load(name_or_path: str, directory: Path = SHAPES_DIR) -> ShapeSet:
    """A set by name (a shipped set, <SHAPES_DIR>/<name>.toml) or by path to a .toml file."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        return load_file(name_or_path)
    sets = available(directory)
    if name_or_path not in sets:
        raise ShapeError(f"no shape set {name_or_path!r} (known: {', '.join(sets) or 'none'})")
    return load_file(sets[name_or_path])


def load_ledger(directory: Path = SHAPES_DIR) -> dict[str, dict[str, str]]:
    path = directory / FROZEN_LEDGER
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def ledger_for(ss: ShapeSet) -> dict[str, dict[str, str]]:
    """The shipped ledger with the one beside the set's file (a user's own frozen sets) over it."""
    ledger = {name: dict(v) for name, v in load_ledger().items()}
    if ss.path and Path(ss.path).parent.resolve() != SHAPES_DIR:
        for name, versions in load_ledger(Path(ss.path).parent).items():
            ledger.setdefault(name, {}).update(versions)
    return ledger


def verify(ss: ShapeSet, ledger: dict[str, dict[str, str]]) -> list[str]:
    """Problems with a set's freezing; empty when the set is intact."""
    problems = []
    actual = canonical_hash(ss.name, ss.version, ss.shapes)
    if actual != ss.hash:
        problems.append(f"{ss.path}: content hash {actual} differs from the frozen hash {ss.hash} "
                        f"(a changed set needs a new version and a new hash)")
    frozen = ledger.get(ss.name, {}).get(str(ss.version))
    if frozen is None:
        problems.append(f"{ss.path}: {ss.name} v{ss.version} is not recorded in {Path(ss.path).parent / FROZEN_LEDGER}")
    elif frozen != actual:
        problems.append(f"{ss.path}: {ss.name} v{ss.version} was frozen as {frozen}; its content changed "
                        f"without a version bump")
    return problems


def freeze(path: str | Path, directory: Path | None = None) -> str:
    """Write a set's content hash into its file and record (name, version) in the ledger
    (``directory``/frozen.json, default the one beside the file: for a shipped set in a checkout,
    the package's; for a user's set, its own folder's).

    Refuses when that version is already recorded with another hash: bump the version.
    """
    import re

    ss = load_file(path, frozen=False)
    directory = Path(path).resolve().parent if directory is None else Path(directory)
    actual = canonical_hash(ss.name, ss.version, ss.shapes)
    ledger = load_ledger(directory)
    recorded = ledger.get(ss.name, {}).get(str(ss.version))
    if recorded is not None and recorded != actual:
        raise ShapeError(f"{path}: {ss.name} v{ss.version} is frozen as {recorded}; bump 'version' to change it")
    text = Path(path).read_text()
    new_text, n = re.subn(r'(?m)^hash\s*=.*$', f'hash = "{actual}"', text, count=1)
    if n != 1:  # no hash line yet: the first one goes after the top-level version line
        new_text, n = re.subn(r'(?m)^(version\s*=.*)$', lambda m: f'{m.group(1)}\nhash = "{actual}"', text, count=1)
    if n != 1:
        raise ShapeError(f"{path}: no top-level 'hash' or 'version' line to write the hash at")
    Path(path).write_text(new_text)
    ledger.setdefault(ss.name, {})[str(ss.version)] = actual
    (directory / FROZEN_LEDGER).write_text(json.dumps(ledger, indent=2, sort_keys=True) + "\n")
    return actual

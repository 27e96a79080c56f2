"""Results files: environment capture, atomic writes, loading, resuming.

One JSON file per (run, shape set): a `RunDocument` (gdnbench.data.records, which checks the
schema version and every row). No torch import at module load; `capture_env` imports it lazily.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import os
import platform
import re
import socket
import subprocess
import tempfile
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..paths import PACKAGE_DIR, results_dir
from ..vocab import ROW_STATUSES  # noqa: F401  (read here by older callers)
from .files import read_text
from .records import SCHEMA_VERSION, ResultsError, Row, RunDocument, ShapeSetInfo, thaw  # noqa: F401


def dist_version(name: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_checkout(package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The top level of gdnbench's own git checkout when ``package_dir`` is its ``gdnbench`` folder,
    else None. An installed package can sit inside another repository (a venv in a project) or inside
    a gdnbench checkout it was not built from (a venv in the checkout): the top level must hold a
    pyproject naming the project gdnbench and have this very folder as its ``gdnbench/``."""
    import tomllib

    top = _git(package_dir, "rev-parse", "--show-toplevel")
    if not top:
        return None
    top_path = Path(top).resolve()
    try:
        name = tomllib.loads((top_path / "pyproject.toml").read_text()).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if name != "gdnbench" or (top_path / "gdnbench").resolve() != Path(package_dir).resolve():
        return None
    return top_path


def git_info(package_dir: Path = PACKAGE_DIR) -> dict:
    """sha and dirty flag of gdnbench's own checkout (source "checkout"); an installed package has
    none: sha None and source "installed" (the package version is in env.versions.gdnbench).
    GDNBENCH_GIT_SHA / GDNBENCH_GIT_DIRTY stand in where the tree has no .git."""
    root = source_checkout(package_dir)
    sha = os.environ.get("GDNBENCH_GIT_SHA") or (_git(root, "rev-parse", "HEAD") if root else None)
    if "GDNBENCH_GIT_DIRTY" in os.environ:
        dirty = os.environ["GDNBENCH_GIT_DIRTY"] not in ("0", "", "false")
    elif root is None:
        dirty = None
    else:
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
        dirty = None if status is None else bool(status)
    return {"sha": sha, "dirty": dirty, "source": "checkout" if root or sha else "installed"}


def _nvidia_smi() -> dict:
    fields = ["driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.limit",
              "power.draw", "temperature.gpu", "persistence_mode"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(fields, values))


def card_uuid(props) -> str | None:
    """The card's UUID (torch's device properties), so runs tell whether they shared a card: kernels at one config
    and code timed up to 10 % apart in two runs on H200s leased 14 hours apart (docs/design.md)."""
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid is not None else None


def card_of(env) -> str | None:
    """The UUID of the card a run's env names (``env.gpu.uuid``), None where it names none (CPU, older files)."""
    return (env.get("gpu") or {}).get("uuid")


def capture_env(device: str) -> dict:
    env = {
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "git": git_info(),
        "versions": {name: dist_version(dist) for name, dist in (
            ("gdnbench", "gdnbench"), ("torch", "torch"), ("triton", "triton"), ("fla", "fla-core"),
            ("helion", "helion"), ("flashinfer", "flashinfer-python"))},
        "device": device,
        "fla_dispatch_disabled": os.environ.get("FLA_DISABLE_BACKEND_DISPATCH", "1") == "1",
    }
    from .. import __version__

    env["versions"]["gdnbench"] = __version__
    try:
        import torch

        env["versions"]["torch"] = torch.__version__
        env["cuda_runtime"] = torch.version.cuda
        if device == "cuda" and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["gpu"] = {
                "name": p.name,
                "compute_capability": f"{p.major}.{p.minor}",
                "sm_count": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "l2_bytes": getattr(p, "L2_cache_size", None),
                "count": torch.cuda.device_count(),
                "uuid": card_uuid(p),
                **_nvidia_smi(),
            }
    except ImportError:
        pass
    try:
        import triton

        env["versions"]["triton"] = triton.__version__
    except ImportError:
        pass
    return env


def slug(gpu_name: str, empty: str = "cpu") -> str:
    """A GPU's directory name under results/ ("NVIDIA H200" -> "nvidia-h200")."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or empty


def gpu_slug(env: dict) -> str:
    name = env.get("gpu", {}).get("name") if env.get("device") == "cuda" else None
    return slug(name) if name else "cpu"


def utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def default_path(env: dict, shape_set_name: str, stamp: str, mode: str = "fwd", root: Path | None = None) -> Path:
    """<root, default ./results>/<gpu>/<stamp>_<sha8 or v<version>>[-dirty]_<set>[-<mode>].json; the
    mode suffix is left out for fwd and where the set's name already ends with it (gdn-decode)."""
    sha = env["git"]["sha"]
    installed = (env.get("versions") or {}).get("gdnbench")
    tag = (sha[:8] if sha else f"v{installed}" if installed else "nogit") + ("-dirty" if env["git"]["dirty"] else "")
    suffix = "" if mode == "fwd" or shape_set_name.endswith(f"-{mode}") else f"-{mode}"
    return (root or results_dir()) / gpu_slug(env) / f"{stamp}_{tag}_{shape_set_name}{suffix}.json"


def claim_path(path: Path) -> Path:
    """Reserve a fresh results name: `path`, or `path` with -2, -3, ... before `.json` when it (or its
    journal) exists.

    Two runs of one set started in the same second (one per GPU) got the same default name, and the
    second to finish overwrote the first's results. The name is held by its journal (`x.jsonl`,
    created here), never by an empty document: a run stopped before its end once left a 0-byte
    results file."""
    from .journal import journal_path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        candidate = path if i == 1 else path.with_name(f"{path.stem}-{i}{path.suffix}")
        if candidate.exists():
            continue
        try:
            os.close(os.open(journal_path(candidate), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return candidate
        except FileExistsError:
            continue


def make_document(env: dict, shape_set, timing: dict, run: dict, rows: list[Row], stamp: str) -> RunDocument:
    return RunDocument(env=env, shape_set=ShapeSetInfo.of(shape_set), timing=timing, run=run, rows=rows,
                       created_utc=stamp)


def write_atomic(doc: dict, path: Path) -> Path:
    """``doc`` (a JSON object, or a record with ``to_dict``) written to ``path`` by an atomic rename."""
    path = Path(path)
    doc = doc.to_dict() if hasattr(doc, "to_dict") else doc
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=False, allow_nan=True)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_json(path: str | Path, error: type[ValueError], what: str):
    """A JSON file's content; a missing or malformed file raises `error` with a one-line message."""
    text = read_text(path, error, what, "JSON")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def load(path: str | Path) -> RunDocument:
    """The results document of a file; ResultsError naming the file, the row and the field."""
    return RunDocument.from_dict(read_json(path, ResultsError, "results file"), str(path))


def load_resumable(path: str | Path) -> tuple[RunDocument, Path]:
    """What a stopped or killed run kept, and the results path to write back to.

    ``path`` names a results file or its journal. The document, when there is one, with the rows
    of the journal beside it (a resumed run killed before its end) replacing its rows of the same
    shapes; else the journal alone, as a document marked interrupted."""
    from .journal import journal_path, read, results_path_of

    final = results_path_of(path)
    jpath = journal_path(final)
    has_journal = jpath.is_file() and jpath.stat().st_size > 0
    rows: list[Row] = []
    if has_journal:
        try:
            header, rows = read(jpath)
        except (OSError, UnicodeDecodeError) as e:
            raise ResultsError(f"{jpath}: unreadable journal ({type(e).__name__})") from None
    if final.exists() or not has_journal:
        doc = load(final)
    else:
        if header is None:
            raise ResultsError(f"{jpath}: a journal without its header line; nothing to resume from")
        doc = replace(header, run={**(header.run or {}), "interrupted": "killed (rows from its journal)"})
    if rows:
        doc = fold_journal(doc, rows, str(jpath))
    return doc, final


def _in_set_order(rows: list[Row], order) -> list[Row]:
    """``rows`` sorted by shape in set order (stable: a shape's rows keep theirs)."""
    rank = {s: i for i, s in enumerate(order)}
    return sorted(rows, key=lambda r: rank.get(r.shape_id, len(rank)))


def fold_journal(doc: RunDocument, rows: list[Row], source: str = "") -> RunDocument:
    """``doc`` with its rows of the shapes that ``rows`` holds replaced by those (a shape is measured
    whole, so the later rows of a shape are the newer measurement), in shape-set order."""
    fresh = {r.shape_id for r in rows}
    kept = [r for r in doc.rows if r.shape_id not in fresh]
    try:
        return doc.with_rows(_in_set_order(kept + list(rows), doc.shape_set.ids))
    except ResultsError as e:
        raise (e.at(source) if source else e) from None


# ----------------------------------------------------------------------------- resuming a run
def _context(env) -> dict:
    """What must not change between a run and its resumption: device, GPU, versions, code."""
    return {"device": env.get("device"), "gpu": (env.get("gpu") or {}).get("name"),
            "versions": thaw(env.get("versions")), "git": thaw(env.get("git"))}


def check_resumable(doc: RunDocument, path, env: dict, shape_set) -> None:
    """ResultsError (one line, naming the file and what differs) unless ``doc`` was measured on this
    shape set, device, GPU, package versions and code, so that old and new rows compare."""
    got = doc.shape_set
    for key in ("name", "version", "hash"):
        if getattr(got, key) != getattr(shape_set, key):
            raise ResultsError(f"{path}: shape set {key} {getattr(got, key)!r} differs from this one's "
                               f"{getattr(shape_set, key)!r}; resume a file of the same shape set")
    differs = _first_difference(_context(doc.env), _context(env))
    if differs:
        key, was, now = differs
        raise ResultsError(f"{path}: measured with {key} {was!r}, here {now!r}; a resumed run "
                           f"needs the same device, GPU, versions and code")


def _first_difference(old, new, at: str = ""):
    """(dotted key, old value, new value) of the first leaf where two nested dicts differ, else None."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            found = _first_difference(old.get(key), new.get(key), f"{at}.{key}" if at else key)
            if found:
                return found
        return None
    return (at, old, new) if old != new else None


def shapes_to_resume(doc: RunDocument, shape_ids: list[str], pairs: list[tuple[str, str]]) -> list[str]:
    """The shapes (of ``shape_ids``, in order) that lack a row for some (backend, route) in ``pairs``."""
    have: dict[str, set] = {}
    for r in doc.rows:
        have.setdefault(r.shape_id, set()).add((r.backend, r.route))
    return [s for s in shape_ids if not set(pairs) <= have.get(s, set())]


def merge_resumed(doc: RunDocument, new_rows: list[Row], rerun: list[str], run_note: dict) -> RunDocument:
    """``doc`` with the rows of the re-run shapes replaced by ``new_rows`` (a shape is always measured
    whole: its routes are interleaved), rows in shape-set order, and the resumption noted in
    run['resumed']."""
    kept = [r for r in doc.rows if r.shape_id not in set(rerun)]
    run = thaw(doc.run) or {}
    run["resumed"] = list(run.get("resumed", [])) + [run_note]
    run["interrupted"] = run_note.get("interrupted")
    return replace(doc, run=run, rows=_in_set_order(kept + list(new_rows), doc.shape_set.ids))

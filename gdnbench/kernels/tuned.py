"""The autotune cache: <root>/<gpu-slug>/<kernel>.json, and the lookup `gdnbench run` uses.

Roots (gdnbench.paths): autotune writes to the per-user cache (<cache>/tuned, or --cache-dir); a lookup
reads the user cache first, then the winners shipped in the package (kernels/tuned_configs/), or
only --cache-dir when given. Same keys in both: a shipped entry is used exactly where a user's would be.

An entry holds one search of one kernel on one shape key; it is used only where its whole
key matches the machine and the code:

- ``gpu`` (device name) and ``compute_capability``: another chip has other limits;
- ``triton``: another compiler makes other code from the same config;
- ``source_hash``: sha256 of the source of the kernel's jit functions and of every module-level
  definition they reach by name (helpers, constants; ``from .common import`` followed), so an
  edit makes stale the entries of exactly the kernels whose code it touches: they are ignored
  with a warning (a new ``gdnbench autotune`` replaces them);
- ``shape_key``: the family (``gdn_`` / ``kda_`` prefix: KDA runs other specializations of the
  shared kernels, with per-channel gates), K, V, H, HV, storage dtype, fixed or varlen (the
  kernels compile separately for each), and the token count rounded up to a power of two (the
  grid size that decides occupancy; shapes within a factor of two share their tuning), e.g.
  ``kda_K128_V128_H96_HV96_bfloat16_fixed_T8192``;
- ``variant``: which specialization of the kernel ran (``plain``; ``fuse_k`` for the k-norm
  folded into gram/kda_intra/wu under fused_qk (the state kernel runs plain: GDN's v_new carries
  k's rstd, KDA's kg does); ``fused_q`` / ``fused_qk`` for output_fused; ``fused_q`` for aqk and
  state_out under both fused routes (their FUSE_Q form)).

No torch import here; :func:`device_env` imports it lazily.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import warnings
from pathlib import Path

from ..data.results import slug, write_atomic
from ..paths import SHIPPED_TUNED_DIR, tuned_read_dirs, user_tuned_dir
from ..vocab import ROUTES, dtype_bytes

CACHE_SCHEMA = 1
KERNEL_DIR = Path(__file__).resolve().parent
# the jit functions each tuned kernel launches: (module in kernels/, function names)
KERNEL_FUNCTIONS = {
    "l2norm": ("common.py", ("l2norm_kernel",)),
    "gram": ("intra.py", ("gram_solve_kernel",)),
    "kda_intra": ("intra.py", ("kda_cumsum_kernel", "kda_intra_kernel")),
    "wu": ("intra.py", ("wu_kernel",)),
    "state": ("state.py", ("state_kernel",)),
    "output": ("output.py", ("output_kernel",)),
    "output_fused": ("output.py", ("output_kernel",)),
    "aqk": ("state_out.py", ("aqk_kernel",)),
    "state_out": ("state_out.py", ("state_out_kernel",)),
}
KERNELS = tuple(KERNEL_FUNCTIONS)
# the stage kernels each route launches, per family (explicit runs the same kernels as flag);
# KDA runs kda_intra where GDN runs gram and shares the others; GDN's explicit and flag routes run
# state + output or, in one pass (ops.one_pass, per shape), aqk + state_out: every route lists both
ONE_PASS_KERNELS = ("aqk", "state_out")
_GDN_ROUTES = {
    "explicit": ("l2norm", "gram", "wu", "state", "output") + ONE_PASS_KERNELS,
    "flag": ("l2norm", "gram", "wu", "state", "output") + ONE_PASS_KERNELS,
    "fused_q": ("l2norm", "gram", "wu", "state", "output_fused") + ONE_PASS_KERNELS,
    "fused_qk": ("gram", "wu", "state", "output_fused") + ONE_PASS_KERNELS,
}
ROUTE_KERNELS = {"gdn": _GDN_ROUTES,
                 "kda": {r: tuple("kda_intra" if k == "gram" else k for k in ks if k not in ONE_PASS_KERNELS)
                         for r, ks in _GDN_ROUTES.items()}}
# the route a (kernel, variant) is measured under
MEASURE_ROUTE = {"plain": "flag", "fuse_k": "fused_qk", "fused_q": "fused_q", "fused_qk": "fused_qk"}
DISABLE_ENV = "GDNBENCH_TUNED"  # GDNBENCH_TUNED=0: `gdnbench run` ignores the cache


class StaleEntry(UserWarning):
    """A cache entry whose kernel source or Triton version no longer matches."""


def variant_of(kernel: str, route: str, family: str = "gdn") -> str:
    """Which compiled specialization of ``kernel`` the route runs (the constexpr flags that differ).

    KDA's state kernel reads kg, which w/u wrote with k's rstd already in it: no fuse_k there; and
    its output kernel reads Aqk, which kda_intra built with k's rstd: fused_qk runs fused_q's."""
    if kernel == "output_fused":
        return "fused_q" if family == "kda" else route
    if kernel in ONE_PASS_KERNELS and route.startswith("fused"):
        return "fused_q"  # FUSE_Q: q raw (under fused_qk, k's rstd rides on w, u and v_new)
    fuse_k = ("gram", "wu") if family == "gdn" else ("kda_intra", "wu")
    if kernel in fuse_k and route == "fused_qk":
        return "fuse_k"
    return "plain"


@functools.lru_cache(maxsize=None)
def _module_defs(module: str) -> dict[str, tuple[str, str, ast.AST]]:
    """Module-level name -> (module, source text, node) of one file in kernels/, names imported
    with ``from .x import`` resolved to their defining module."""
    text = (KERNEL_DIR / module).read_text()
    defs = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            other = _module_defs(node.module + ".py")
            defs.update({a.asname or a.name: other[a.name] for a in node.names if a.name in other})
        elif isinstance(node, (ast.FunctionDef, ast.Assign, ast.AnnAssign)):
            targets = [node.name] if isinstance(node, ast.FunctionDef) else [
                t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)]
            for name in targets:
                defs[name] = (module, ast.get_source_segment(text, node), node)
    return defs


@functools.lru_cache(maxsize=None)
def source_hash(kernel: str) -> str:
    """sha256 over the source of ``kernel``'s jit functions and every module-level definition
    they reach by name, transitively (see KERNEL_FUNCTIONS)."""
    module, roots = KERNEL_FUNCTIONS[kernel]
    seen, todo = {}, [(module, name) for name in roots]
    while todo:
        where, name = todo.pop()
        found = _module_defs(where).get(name)
        if found is None or found[:2] in seen:
            continue
        seen[found[:2]] = name
        todo += [(found[0], n.id) for n in ast.walk(found[2]) if isinstance(n, ast.Name)]
    h = hashlib.sha256()
    for (where, text), name in sorted(seen.items()):
        h.update(f"{where}:{name}".encode() + b"\0" + text.encode() + b"\0")
    return "sha256:" + h.hexdigest()


def token_bucket(tokens: int) -> int:
    """The token count rounded up to a power of two (at least one chunk, 64)."""
    b = 64
    while b < tokens:
        b *= 2
    return b


def shape_key(shape) -> str:
    """The part of a shape that tuning depends on, as one string (see the module docstring)."""
    mix = "varlen" if shape.varlen else "fixed"
    return (f"{shape.family}_K{shape.K}_V{shape.V}_H{shape.H}_HV{shape.HV}_{shape.dtype}_{mix}"
            f"_T{token_bucket(shape.tokens)}")


def normalize_env(env: dict) -> dict:
    """{gpu, compute_capability, triton} from a device_env() dict or a results.capture_env() dict."""
    if isinstance(env.get("gpu"), dict):  # capture_env's layout
        return {"gpu": env["gpu"].get("name"), "compute_capability": env["gpu"].get("compute_capability"),
                "triton": env.get("versions", {}).get("triton")}
    return {k: env.get(k) for k in ("gpu", "compute_capability", "triton")}


@functools.lru_cache(maxsize=None)
def device_env(index: int = 0) -> dict | None:
    """The tuning identity of CUDA device ``index``; None without CUDA."""
    import torch
    import triton

    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(index)
    return {"gpu": p.name, "compute_capability": f"{p.major}.{p.minor}", "triton": triton.__version__}


def entry_key(env: dict, kernel: str, shape, variant: str) -> dict:
    env = normalize_env(env)
    return {**env, "source_hash": source_hash(kernel), "shape_key": shape_key(shape), "variant": variant}


def read_dirs(cache_dir=None) -> list[Path]:
    """The roots a lookup reads, in order: ``cache_dir`` (a path or a list of paths) when given, else
    the user cache then the shipped winners."""
    if isinstance(cache_dir, (list, tuple)):
        return [Path(d) for d in cache_dir]
    return tuned_read_dirs(cache_dir)


def write_dir(cache_dir: Path | None = None) -> Path:
    """The root autotune writes to: ``cache_dir``, else the user cache."""
    return Path(cache_dir) if cache_dir is not None else user_tuned_dir()


def cache_path(cache_dir: Path, gpu_name: str, kernel: str) -> Path:
    return Path(cache_dir) / slug(gpu_name, empty="unknown") / f"{kernel}.json"


def _identity(key: dict) -> tuple:
    """What a new entry replaces: same machine, shape and variant, whatever the source hash."""
    return tuple(key.get(k) for k in ("gpu", "compute_capability", "triton", "shape_key", "variant"))


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int) -> tuple:
    doc = json.loads(Path(path).read_text())
    return tuple(doc.get("entries", []))


def load_entries(path: Path) -> list[dict]:
    """The entries of one cache file ([] when absent or unreadable, with a warning for the latter)."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        return list(_read(str(path), path.stat().st_mtime_ns))
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        warnings.warn(f"{path}: unreadable tuning cache ignored ({e})", StaleEntry, stacklevel=2)
        return []


def _read_fresh(path: Path) -> list[dict]:
    """load_entries without its cache (under the write lock, another writer may have just saved)."""
    _read.cache_clear()
    return load_entries(path)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path``'s kernel file for a read-modify-write: two sweeps sharing a cache
    (e.g. --family gdn and --family kda at once, one per GPU) write the same kernel files, and without
    it one H200 pair of sweeps lost 5 of 54 entries."""
    try:
        import fcntl
    except ImportError:  # no POSIX locks (Windows): one writer at a time is the caller's business
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def save_entry(cache_dir: Path | None, entry: dict) -> Path:
    """Add ``entry`` to its kernel's file under write_dir(cache_dir), replacing any entry with the same
    identity."""
    key = entry["key"]
    path = cache_path(write_dir(cache_dir), key["gpu"], entry["kernel"])
    with _locked(path):
        kept = [e for e in _read_fresh(path) if _identity(e.get("key", {})) != _identity(key)]
        doc = {"schema": CACHE_SCHEMA, "kernel": entry["kernel"], "entries": kept + [entry]}
        return write_atomic(doc, path)


def find_entry(cache_dir, env: dict, kernel: str, shape, variant: str) -> dict | None:
    """The matching entry of the first root (read_dirs) holding one, or None. When none matches,
    entries for this GPU and shape whose source hash or Triton version differ are reported with a
    StaleEntry warning."""
    want = entry_key(env, kernel, shape, variant)
    stale = []
    for root in read_dirs(cache_dir):
        for e in load_entries(cache_path(root, want["gpu"] or "unknown", kernel)):
            key = e.get("key", {})
            if key == want:
                return e
            if all(key.get(k) == want[k] for k in ("gpu", "compute_capability", "shape_key", "variant")):
                stale.append("source hash" if key.get("source_hash") != want["source_hash"] else "Triton version")
    for what in dict.fromkeys(stale):
        warnings.warn(f"tuned {kernel} [{variant}] for {want['shape_key']} ignored: kernel {what} changed "
                      f"since it was tuned; re-run gdnbench autotune", StaleEntry, stacklevel=2)
    return None


def point_label(point: dict) -> str:
    """Short text of a config point, e.g. 'BK=64 BV=128 w=4 s=2 r=none'."""
    short = {"num_warps": "w", "num_stages": "s", "maxnreg": "r"}
    return " ".join(f"{short.get(k, k)}={'none' if v is None else v}" for k, v in point.items())


def kernel_config(kernel: str, point: dict):
    """The KernelConfig / L2NormConfig of a point."""
    from .config import KernelConfig, L2NormConfig

    return (L2NormConfig if kernel == "l2norm" else KernelConfig)(**point)


def winner(entry: dict) -> dict | None:
    """The entry's best config point when it beat the default, else None."""
    best, default = entry.get("best"), entry.get("default")
    if not best or best.get("time_us") is None:
        return None
    if default and default.get("config") == best["config"]:
        return None
    return best["config"]


def tuned_config(shape, route: str, env: dict | None, cache_dir: Path | None = None):
    """(GDNConfig, description) for ``shape`` on ``route``: the default config of the shape's family
    with each stage kernel the family runs replaced by its tuned winner where a matching cache
    entry exists (the shape key carries the family, so only that family's entries match).

    The description is 'default' or 'tuned: kernel[config], ...'. Without a device identity
    (CPU) or with GDNBENCH_TUNED=0 it is always the default."""
    from .config import default_config, validate

    elt = dtype_bytes(shape.dtype)
    cfg = default_config(shape.K, shape.V, elt, shape.family)
    if env is None or os.environ.get(DISABLE_ENV, "1") == "0":
        return cfg, "default"
    changed = {}
    for kernel in ROUTE_KERNELS[shape.family][route]:
        e = find_entry(cache_dir, env, kernel, shape, variant_of(kernel, route, shape.family))
        point = winner(e) if e else None
        if point is not None:
            changed[kernel] = point
    if not changed:
        return cfg, "default"
    try:
        new = dataclasses.replace(cfg, **{k: kernel_config(k, p) for k, p in changed.items()})
        validate(new, shape.K, shape.V, elt, shape.family)
    except (TypeError, ValueError) as e:
        warnings.warn(f"tuned config for {shape_key(shape)} {route} is invalid ({e}); using the default",
                      StaleEntry, stacklevel=2)
        return cfg, "default"
    return new, "tuned: " + ", ".join(f"{k}[{point_label(p)}]" for k, p in changed.items())

"""The autotune cache: <root>/<gpu-slug>/<kernel>.json, and the lookup `gdnbench run` uses.

Roots (gdnbench.paths): autotune writes to the per-user cache (<cache>/tuned, or --cache-dir); a lookup
reads the user cache first, then the winners shipped in the package (kernels/tuned_configs/), or
only --cache-dir when given. Same keys in both: a shipped entry is used exactly where a user's would be.

An entry holds one search of one kernel on one shape key; it is used only where its whole key
(gdnbench.kernels.cache_key: machine, Triton, kernel source hash, shape key, variant) matches the
machine and the code. An entry whose source hash or Triton version no longer matches is ignored
with a warning (a new ``gdnbench autotune`` replaces it). Where this GPU has no entry of a key, `gdnbench run`
borrows that key's entry from another GPU of the same compute capability (an H100 takes the shipped H200
winners) and its rows say so; autotune never borrows. ``variant``: which specialization of the
kernel ran (``plain``; ``fuse_k`` for the k-norm folded into gram/kda_intra/wu under fused_qk (the
state kernel runs plain: GDN's v_new carries k's rstd, KDA's kg does); ``fused_q`` / ``fused_qk`` for
output_fused and for aqk, fused_out and kda16_prep under those routes; ``fused_q`` for state_out and
kda_state_out under both fused routes (their FUSE_Q form)).

No torch import here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import warnings
from pathlib import Path

from ..data.results import slug, write_atomic
from ..paths import tuned_read_dirs, user_tuned_dir
from ..vocab import dtype_bytes
# source_hash, KERNEL_FUNCTIONS and KERNELS stay importable from here: `python -m gdnbench.autotune.rekey`
# reads them from this tree and from older ones, which have no cache_key module
from .cache_key import KERNEL_FUNCTIONS, CacheKey, Machine, shape_key, source_hash  # noqa: F401

CACHE_SCHEMA = 1
KERNELS = tuple(KERNEL_FUNCTIONS)
# the stage kernels each route launches, per family (explicit runs the same kernels as flag);
# KDA runs kda_intra where GDN runs gram and shares the others; GDN's explicit and flag routes run
# state + output or, in one pass (ops.one_pass, per shape), aqk + state_out, or aqk + fused_out where
# the in-loop form is chosen (:func:`in_loop_choice`): every route lists all of them
ONE_PASS_KERNELS = ("aqk", "state_out", "fused_out")
IN_LOOP_OF = {"fused_out": "wu"}  # the GDNConfig.in_loop form whose loop a kernel is
KDA16_KERNELS = ("kda16_prep", "kda16_loop")  # KDA's 16-token form (GDNConfig.kda_chunk16), every route
_GDN_ROUTES = {
    "explicit": ("l2norm", "gram", "wu", "state", "output") + ONE_PASS_KERNELS,
    "flag": ("l2norm", "gram", "wu", "state", "output") + ONE_PASS_KERNELS,
    "fused_q": ("l2norm", "gram", "wu", "state", "output_fused") + ONE_PASS_KERNELS,
    "fused_qk": ("gram", "wu", "state", "output_fused") + ONE_PASS_KERNELS,
}
# KDA: state + output, or in one pass (GDNConfig.one_pass, :func:`kda_one_pass_choice`) kda_state_out, or in
# 16-token tiles (GDNConfig.kda_chunk16) its two kernels
ROUTE_KERNELS = {"gdn": _GDN_ROUTES,
                 "kda": {r: tuple("kda_intra" if k == "gram" else k for k in ks if k not in ONE_PASS_KERNELS)
                         + ("kda_state_out",) + KDA16_KERNELS for r, ks in _GDN_ROUTES.items()}}
# the route a (kernel, variant) is measured under
MEASURE_ROUTE = {"plain": "flag", "fuse_k": "fused_qk", "fused_q": "fused_q", "fused_qk": "fused_qk"}
TUNED_PREFIX = "tuned: "  # Winners.label: TUNED_PREFIX + "kernel[config], ..."
# GDNBENCH_TUNED=0: `gdnbench run` ignores the cache; =own: it takes this GPU's entries only, borrowing none
DISABLE_ENV = "GDNBENCH_TUNED"
# an entry found for another GPU of the same compute capability (find_entry's borrow) carries that GPU's name
# under this field.  The shipped winners are the H200's, and an H100's at 20 keys; with the H200's borrowed for every
# key, an H100 80GB HBM3 (sm_90 too) took ours to 0.494x the built-in defaults on kda-legacy6 and 0.678x on
# gdn-qwen6 (gpu geomeans, 24 rows; explicit at h96_fixed 2953 -> 1573 us, at h16_hv32_fixed32k 1725 -> 1113;
# README, "H100")
BORROWED_FROM = "borrowed_from"


class StaleEntry(UserWarning):
    """A cache entry whose kernel source or Triton version no longer matches."""


def variant_of(kernel: str, route: str, family: str = "gdn") -> str:
    """Which compiled specialization of ``kernel`` the route runs (the constexpr flags that differ).

    KDA's state kernel reads kg, which w/u wrote with k's rstd already in it: no fuse_k there; and
    its output kernel reads Aqk, which kda_intra built with k's rstd: fused_qk runs fused_q's."""
    if kernel == "output_fused":
        return "fused_q" if family == "kda" else route
    # FUSE_Q / NORM_Q under both fused routes, FUSE_K / NORM_K under fused_qk (aqk's: the bound on raw k)
    if kernel in ("fused_out", "kda16_prep", "aqk"):
        return route if route.startswith("fused") else "plain"
    if kernel in ONE_PASS_KERNELS + ("kda_state_out",) and route.startswith("fused"):
        return "fused_q"  # FUSE_Q: q raw (under fused_qk, k's rstd rides on w, u and v_new; KDA's on kg and Aqk)
    fuse_k = ("gram", "wu") if family == "gdn" else ("kda_intra", "wu")
    if kernel in fuse_k and route == "fused_qk":
        return "fuse_k"
    return "plain"


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
    same = CacheKey.from_dict(key).identity()
    with _locked(path):
        kept = [e for e in _read_fresh(path) if CacheKey.from_dict(e.get("key", {})).identity() != same]
        doc = {"schema": CACHE_SCHEMA, "kernel": entry["kernel"], "entries": kept + [entry]}
        return write_atomic(doc, path)


def _lookup(cache_dir, env: dict, kernel: str, shape, variant: str) -> tuple[dict | None, list[str]]:
    """(the matching entry of the first root holding one, or None; what differs in this GPU's and shape's
    entries that no longer match: 'source hash', 'Triton version')."""
    want = CacheKey.of(env, kernel, shape, variant)
    stale = []
    for root in read_dirs(cache_dir):
        for e in load_entries(cache_path(root, want.machine.gpu or "unknown", kernel)):
            key = CacheKey.from_dict(e.get("key", {}))
            if key == want:
                return e, []
            what = want.stale_part(key)
            if what is not None:
                stale.append(what)
    return None, list(dict.fromkeys(stale))


def borrowed_entry(cache_dir, want: CacheKey, kernel: str) -> dict | None:
    """``want``'s entry as tuned on another GPU of the same compute capability and Triton (the first root
    holding one, GPU folders in name order), marked with BORROWED_FROM: that GPU's name."""
    for root in read_dirs(cache_dir):
        for path in sorted(Path(root).glob(f"*/{kernel}.json")):
            for e in load_entries(path):
                key = CacheKey.from_dict(e.get("key", {}))
                if key.machine.lends_to(want.machine) and key == dataclasses.replace(want, machine=key.machine):
                    return {**e, BORROWED_FROM: key.machine.gpu}
    return None


def cache_summary(env: dict | None, cache_dir=None) -> str:
    """What a run on the machine ``env`` finds in the cache: its own entries and those it may borrow, counted per
    GPU (entries of the current Triton; source hashes are checked per lookup), e.g. '0 for NVIDIA H100 80GB HBM3;
    borrows from NVIDIA H200 (151)'."""
    if env is None:
        return "none (no GPU)"
    if tuning_off():
        return f"off ({DISABLE_ENV}=0)"
    want = Machine.of(env)
    counts: dict[str, int] = {}
    for root in read_dirs(cache_dir):
        for path in sorted(Path(root).glob("*/*.json")):
            for e in load_entries(path):
                m = CacheKey.from_dict(e.get("key", {})).machine
                if m == want or m.lends_to(want):
                    counts[m.gpu] = counts.get(m.gpu, 0) + 1
    own = counts.pop(want.gpu, 0)
    lend = ", ".join(f"{gpu} ({n})" for gpu, n in counts.items()) if borrowing() else ""
    return f"{own} for {want.gpu}" + (f"; borrows from {lend}" if lend else "")


def tuning_off() -> bool:
    """Whether `gdnbench run` ignores the cache (GDNBENCH_TUNED=0)."""
    return os.environ.get(DISABLE_ENV, "1") == "0"


def borrowing() -> bool:
    """Whether a lookup for `gdnbench run` may borrow another GPU's entries (not under GDNBENCH_TUNED=own)."""
    return os.environ.get(DISABLE_ENV, "1") != "own"


def find_entry(cache_dir, env: dict, kernel: str, shape, variant: str, borrow: bool = False) -> dict | None:
    """The matching entry of the first root (read_dirs) holding one, or None. When none matches,
    entries for this GPU and shape whose source hash or Triton version differ are reported with a
    StaleEntry warning, and with ``borrow`` the same key tuned on another GPU of the same compute capability
    is taken (:func:`borrowed_entry`; autotune's own lookups never borrow: a search there is this GPU's)."""
    e, stale = _lookup(cache_dir, env, kernel, shape, variant)
    for what in stale:
        warnings.warn(f"tuned {kernel} [{variant}] for {shape_key(shape)} ignored: kernel {what} changed "
                      f"since it was tuned; re-run gdnbench autotune", StaleEntry, stacklevel=2)
    if e is None and borrow:
        e = borrowed_entry(cache_dir, CacheKey.of(env, kernel, shape, variant), kernel)
    return e


def stale_kernels(shape, route: str, env: dict | None, cache_dir: Path | None = None) -> list[str]:
    """'kernel[variant]' for each kernel ``route`` may run whose only entries for this GPU and shape no longer
    match its code or Triton: the run ignores them and that kernel runs untuned, so a row names them (stale
    kda16_prep entries once took KDA's flag forward at h96_fixed from 1392 to 2181 us, the log silent)."""
    if env is None or tuning_off():
        return []
    out = []
    for kernel in ROUTE_KERNELS[shape.family][route]:
        variant = variant_of(kernel, route, shape.family)
        e, stale = _lookup(cache_dir, env, kernel, shape, variant)
        if e is None and stale:
            out.append(f"{kernel}[{variant}]")
    return out


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


@dataclasses.dataclass(frozen=True)
class Winners:
    """The tuned winners one lookup found for a (shape key, route): each kernel's config point, in the family's
    stage order, and for a winner borrowed from another GPU (find_entry) that GPU's name."""

    points: dict = dataclasses.field(default_factory=dict)  # kernel -> config point
    lenders: dict = dataclasses.field(default_factory=dict)  # kernel -> the GPU it was tuned on, borrowed ones only

    def __bool__(self) -> bool:
        return bool(self.points)

    def __contains__(self, kernel: str) -> bool:
        return kernel in self.points

    def label(self, runs=None) -> str:
        """'default' or 'tuned: kernel[config], ...', ending with '; tuned on GPU (none here): kernel, ...' for the
        borrowed ones; ``runs`` (ops.stage_kernels of the config that runs) limits it to the kernels launched, so a
        form not taken lists none of its entries."""
        shown = [k for k in self.points if runs is None or k in runs]
        if not shown:
            return "default"
        lent: dict[str, list[str]] = {}
        for k in shown:
            if k in self.lenders:
                lent.setdefault(self.lenders[k], []).append(k)
        return (TUNED_PREFIX + ", ".join(f"{k}[{point_label(self.points[k])}]" for k in shown)
                + "".join(f"; tuned on {gpu} (none here): {', '.join(ks)}" for gpu, ks in lent.items()))


def tuned_winners(shape, route: str, env: dict | None, cache_dir: Path | None = None):
    """(GDNConfig, Winners) for ``shape`` on ``route``: the default config of the shape's family with each stage
    kernel the family runs replaced by its tuned winner where a matching cache entry exists (the shape key carries
    the family, so only that family's entries match). Without a device identity (CPU), with GDNBENCH_TUNED=0 or
    with winners that make no valid config together it is the default, with no winners."""
    from .config import default_config, validate

    elt = dtype_bytes(shape.dtype)
    cfg = default_config(shape.K, shape.V, elt, shape.family)
    if env is None or tuning_off():
        return cfg, Winners()
    points, lenders = {}, {}
    for kernel in ROUTE_KERNELS[shape.family][route]:
        e = find_entry(cache_dir, env, kernel, shape, variant_of(kernel, route, shape.family), borrowing())
        point = winner(e) if e else None
        if point is not None:
            points[kernel] = point
            if BORROWED_FROM in e:
                lenders[kernel] = e[BORROWED_FROM]
    if not points:
        return cfg, Winners()
    try:
        new = dataclasses.replace(cfg, **{k: kernel_config(k, p) for k, p in points.items()})
        validate(new, shape.K, shape.V, elt, shape.family)
    except (TypeError, ValueError) as e:
        warnings.warn(f"tuned config for {shape_key(shape)} {route} is invalid ({e}); using the default",
                      StaleEntry, stacklevel=2)
        return cfg, Winners()
    return new, Winners(points, lenders)


def _best_times(shape, route: str, env: dict, cache_dir, kernels, lent: bool) -> tuple[dict, str | None]:
    """({kernel: its current entry's best time_us} for ``kernels`` on this shape key and route, the first
    kernel without one or None): this GPU's own entries, or with ``lent`` only those it borrows (borrowed_entry)."""
    times = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StaleEntry)  # tuned_winners reports stale entries once
        for kernel in kernels:
            variant = variant_of(kernel, route, shape.family)
            if lent:
                e = borrowed_entry(cache_dir, CacheKey.of(env, kernel, shape, variant), kernel)
            else:
                e = find_entry(cache_dir, env, kernel, shape, variant)
            t = ((e or {}).get("best") or {}).get("time_us")
            if t is None:
                return times, kernel
            times[kernel] = t
    return times, None


class _NoTime(Exception):
    """A path choice lacks a tuned time (its message: the kernel)."""


def _times(shape, route: str, env: dict, cache_dir, kernels, lent: bool) -> dict:
    times, missing = _best_times(shape, route, env, cache_dir, kernels, lent)
    if missing:
        raise _NoTime(missing)
    return times


def _one_machine(choose, no):
    """``choose(lent)``'s (choice, why) on this GPU's own tuned times, else, where those are incomplete and it may
    borrow, on the borrowed ones alone: one choice never weighs an own time against a borrowed one (the GPU
    that searched one kernel again would have its time set against another GPU's). ``no``: the choice that
    leaves a form out; its why names the first kernel without an own time."""
    try:
        return choose(False)
    except _NoTime as own:
        if borrowing():
            try:
                return choose(True)
            except _NoTime:
                pass
        return no, f"no tuned {own}"


def in_loop_choice(shape, route: str, env: dict | None, cache_dir: Path | None = None) -> tuple[str | None, str]:
    """(form, why): ``"wu"`` where the autotuner timed the in-loop form's loop (fused_out: no w/u kernel) below
    the state_out + wu pair it replaces, for this shape key and route; else None. GDN only; needs all three
    entries current, on one GPU (:func:`_one_machine`). H200 searches, gdn-qwen6, plain variant, the loop in
    segments timed as the geometric mean over both gate regimes: it wins on all five searched shapes (HV32 8K
    221.9 against 188.3 + 78.0 us, HV64 336.4 against 245.6 + 146.4, HV48 210.9 against 199.4 + 114.4;
    docs/design.md)."""
    if shape.family != "gdn" or env is None or tuning_off():
        return None, ""

    def choose(lent):
        times = _times(shape, route, env, cache_dir, ("fused_out", "state_out", "wu"), lent)
        pair = times["state_out"] + times["wu"]
        why = f"fused_out {times['fused_out']:.1f} us vs state_out + wu {pair:.1f} us"
        return ("wu" if times["fused_out"] < pair else None), why

    return _one_machine(choose, None)


def loop_reads_k_tile(shape, route: str, env: dict | None, cache_dir: Path | None = None) -> bool:
    """Whether ``route``'s tuned forward on this machine reads k's rstd from aqk's quad tile: fused_qk, the in-loop
    form chosen (:func:`in_loop_choice`) and its loop's config asking for the tile (``k_rstd_tile``)."""
    if route != "fused_qk" or in_loop_choice(shape, route, env, cache_dir)[0] != "wu":
        return False
    return tuned_winners(shape, route, env, cache_dir)[0].fused_out.k_rstd_tile


def _one_pass(shape, route: str, env: dict, cache_dir, lent: bool) -> tuple[bool, str]:
    out = "output_fused" if route.startswith("fused") else "output"
    times = _times(shape, route, env, cache_dir, ("kda_state_out", "state", out), lent)
    pair = times["state"] + times[out]
    return times["kda_state_out"] < pair, f"kda_state_out {times['kda_state_out']:.1f} us vs state + {out} {pair:.1f} us"


def kda_one_pass_choice(shape, route: str, env: dict | None, cache_dir: Path | None = None) -> tuple[bool, str]:
    """(one pass, why): True where the autotuner timed KDA's one-pass kernel (kda_state_out) below the state and
    output kernels it replaces, for this shape key and route; needs all three entries current, on one GPU
    (:func:`_one_machine`). H200: 519.4 against 299.2 + 242.8 us at h64_fixed (flag), 958.0 against 428.1 + 363.3
    at h96_fixed, where its 192 programs are 1.45 waves; the fused_q form loses on all four kda-legacy6 keys
    (docs/design.md)."""
    if shape.family != "kda" or env is None or tuning_off():
        return False, ""
    return _one_machine(lambda lent: _one_pass(shape, route, env, cache_dir, lent), False)


def _time_or_flags(shape, route: str, env: dict, cache_dir, kernel: str, lent: bool) -> float:
    """``kernel``'s tuned time on ``route``, else its plain counterpart's on flag (output for output_fused)."""
    for r, k in ((route, kernel), ("flag", "output" if kernel == "output_fused" else kernel)):
        times, gap = _best_times(shape, r, env, cache_dir, (k,), lent)
        if gap is None:
            return times[k]
    raise _NoTime(kernel)


def kda16_choice(shape, route: str, env: dict | None, cache_dir: Path | None = None) -> tuple[bool, str]:
    """(16-token form, why): True where the autotuner timed KDA's 16-token form (kda16_prep + kda16_loop,
    kernels/kda16.py) below the kernels it replaces - kda_intra (with the cumsum), wu, and state + output or
    kda_state_out where that is chosen - for this shape key and route; bounded gates only, every entry current,
    on one GPU (:func:`_one_machine`).  A replaced kernel the route has no entry for runs at its default; flag's
    entry (the plain variant, less work, tuned) stands in for it, erring toward the kernels replaced.  H200,
    h96_fixed, fused_qk: tuned 987.2 + 694.2 us; the run's gpu median 2049.9 -> 1688 us (docs/design.md)."""
    if shape.family != "kda" or shape.lower_bound is None or env is None or tuning_off():
        return False, ""

    def choose(lent):
        times = _times(shape, route, env, cache_dir, KDA16_KERNELS, lent)
        one = kda_one_pass_choice(shape, route, env, cache_dir)[0]  # the pick the backend takes
        rest = ("kda_state_out",) if one else ("state", "output_fused" if route.startswith("fused") else "output")
        old = {k: _time_or_flags(shape, route, env, cache_dir, k, lent) for k in ("kda_intra", "wu") + rest}
        new, before = sum(times.values()), sum(old.values())
        return new < before, f"kda16_prep + kda16_loop {new:.1f} us vs kda_intra + wu + {' + '.join(rest)} {before:.1f} us"

    return _one_machine(choose, False)

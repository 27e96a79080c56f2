"""Helion: our own Helion GDN kernels (`helion`) and Helion's chunked linear-attention engine (`helion-linear`).

`helion` (gdnbench/kernels/helion.py): the inter-chunk state recurrence and the output stage run in Helion
(the output kernel with q's norm folded in on route `fused_q`), the standalone l2norm too (routes
`flag`, and k on `fused_q`); the gate cumsum, the gram + solve and w/u come from our Triton pipeline
(gdnbench.kernels.ops stage functions, default configs; KDA: kda_intra and w/u/kg). Routes: `explicit` (the
caller's l2norm, gdnbench.kernels.ops.l2norm, then the Helion pipeline), `flag` (Helion l2norm inside),
`fused_q`. GDN and KDA (bounded gate, lower_bound >= -5).

Configs (`gdnbench run --helion-effort none|quick|full`, BackendOptions.helion_effort, handed to each worker
with its task):
`none` runs Helion's default config of each kernel, no tuning; `quick` / `full` take a cached config
from <cache>/tuned/<gpu>/helion/ (the user cache, gdnbench.paths; Config.save / Config.load; an entry
per kernel, route variant and shape key, keyed by GPU name, compute capability, helion / torch / triton
versions and the sha256 of helion_gdn.py) or tune with Helion's autotuner at that effort (HELION_AUTOTUNE_EFFORT's presets) on
the full shape in prepare, outside the timed region, and save what it found. The row's `config` says
which: `default`, `tuned (cached, effort E)` or `tuned now (effort E)`. The gate's shortened copy of a
shape runs the configs resolved for the full shape.

`helion-linear`: Helion's examples/linear engine (not on PyPI, not in the helion wheel, never copied
here) loaded from a checkout the user points at (`--helion-examples DIR` or GDNBENCH_HELION_EXAMPLES;
DIR is the repository root or its examples/linear). Its public forward entry points are
`helion_chunk_gated_delta_rule` and `helion_chunk_kda(q, k, v, g, beta, *, C=64, scale,
initial_state, return_final_state)`, head-first [B, H, T, D] inputs, GQA by repeating k/v up to q's
heads (ours is the other way: q/k are repeated to the HV value heads here, in prepare), natural-log
g ([B,H,T] scalar for GDN, [B,H,T,D] per channel for KDA), state [B, H, D, DV]. Newer checkouts add
`cu_seqlens` (token-major [1, T, H, D], states [N, H, D, DV]) and `use_qk_l2norm_in_kernel` to
helion_chunk_kda (detected from its signature): KDA then runs packed sequences and route `flag`.
Packed sequences of equal length run as a dense batch (the inputs' layout change is done in prepare;
the output's copy back to the packed token order is the one conversion left in the timed call); a
mixed-length GDN shape is unsupported (the GDN path has no cu_seqlens). Pretuned sm90 / sm100 configs ship next to the engine
as _helion_aot_linear_attention_engine_cuda_sm*.py and are used through HELION_AUTOTUNE_CACHE=
AOTAutotuneCache (set before the import unless the user set it); without one for this GPU Helion
falls back to its default configs (the variant says which).

Availability: helion not installed; helion installed but not importable with this torch (the
ImportError, one line: helion 1.5.x needs a newer torch than 2.11, 1.4.0 works there); no CUDA.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

from ..data.results import dist_version, slug, write_atomic
from .base import PLAIN_ROUTES, YES, Backend, Support, no, one_line

DIST = "helion"
EXAMPLES_ENV = "GDNBENCH_HELION_EXAMPLES"
EFFORTS = ("none", "quick", "full")
ENGINE = Path("examples") / "linear" / "linear_attention_engine.py"
ENGINE_MODULE = "examples.linear.linear_attention_engine"
ROUTE_NORM = {"explicit": "none", "flag": "flag", "fused_q": "fused_q"}
KERNEL_SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "helion.py"  # our Helion kernels


def source_hash() -> str:
    """sha256 of gdnbench/kernels/helion.py: a tuned config is valid only for the kernel text it was tuned on."""
    from ..kernels.cache_key import file_hash

    return file_hash(KERNEL_SOURCE)


# ----------------------------------------------------------------------------- environment probes
# Module-level so tests can replace them.
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _device_identity() -> dict:
    """GPU name and compute capability of device 0 (the tuning key's machine part)."""
    from ..kernels.cache_key import device_env

    return device_env(0)


def _import_helion():
    import helion
    import helion.language  # noqa: F401

    return helion


def helion_support() -> Support:
    """Whether helion imports here, as one line."""
    version = dist_version(DIST)
    if version is None:
        return no("helion is not installed (pip install helion==1.4.0; 1.5.x needs a newer torch than 2.11)")
    try:
        _import_helion()
    except ImportError as e:  # the known failure: a helion newer than the installed torch
        import torch

        return no(one_line(e, f"helion {version} does not import with torch {torch.__version__} "
                              "(helion 1.4.0 works with torch 2.11)"))
    return YES


def effort_of(name: str | None) -> str:
    """A Helion autotune effort by name (any case; empty: none)."""
    e = (name or "none").strip().lower() or "none"
    if e not in EFFORTS:
        raise ValueError(f"helion effort {e!r}: use one of {', '.join(EFFORTS)}")
    return e


def _caller_l2norm(x):
    """The explicit route's l2norm (FLA semantics): our Triton kernel (the CPU runs it under the interpreter)."""
    from ..kernels.ops import l2norm

    return l2norm(x)


# ----------------------------------------------------------------------------- the tuned-config cache
def cache_key(identity: dict, kernel: str, variant: str, shape, effort_name: str) -> dict:
    """The tuning cache key (gdnbench.kernels.cache_key: machine with this Triton, this kernel file's
    hash, shape key, variant) and what Helion's configs also depend on: the helion and torch versions,
    the kernel and the effort."""
    import torch
    import triton

    from ..kernels.cache_key import CacheKey, Machine, shape_key

    machine = Machine(identity["gpu"], identity["compute_capability"], triton.__version__)
    key = CacheKey(machine, source_hash(), shape_key(shape), variant).as_dict()
    return {**key, "helion": dist_version(DIST), "torch": torch.__version__, "kernel": kernel, "effort": effort_name}


def cache_paths(cache_dir: Path, key: dict) -> tuple[Path, Path]:
    """(the Config.save file, its key file) of an entry under <cache_dir>/<gpu-slug>/helion/."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    stem = f"{key['kernel']}-{key['variant']}-{key['shape_key']}-{key['effort']}-{digest}"
    d = Path(cache_dir) / slug(key["gpu"] or "", empty="unknown") / "helion"
    return d / f"{stem}.json", d / f"{stem}.key.json"


def load_config(cache_dir: Path, key: dict):
    """The cached helion.Config of ``key``, or None (absent, or unreadable: a warning)."""
    path, key_path = cache_paths(cache_dir, key)
    if not (path.exists() and key_path.exists()):
        return None
    try:
        if json.loads(key_path.read_text()) != key:
            return None
        return _import_helion().Config.load(path)
    except Exception as e:  # a damaged file must not stop the run: tune again
        warnings.warn(f"{path}: unreadable tuned Helion config ignored ({one_line(e)})", stacklevel=2)
        return None


def save_config(cache_dir: Path, key: dict, config) -> Path:
    path, key_path = cache_paths(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    config.save(path)
    write_atomic(key, key_path)
    return path


# ----------------------------------------------------------------------------- our Helion kernels
class HelionBackend(Backend):
    name = "helion"
    routes = PLAIN_ROUTES + ("fused_q",)
    families = ("gdn", "kda")
    devices = ("cuda",)
    no_backward = "has no backward (our Helion GDN kernels are a forward-only pipeline, no autograd)"
    no_decode = "has no decode kernel (our Helion kernels are a chunked forward)"

    def __init__(self, cache_dir: Path | None = None, effort: str = "none"):
        from ..kernels.tuned import read_dirs, write_dir

        self.effort = effort_of(effort)  # `gdnbench run --helion-effort`
        self.cache_dir = write_dir(cache_dir)  # where new configs go; read_dirs: where they are looked up
        self.read_dirs = read_dirs(cache_dir)
        self._resolved: dict = {}  # (shape id, route) -> {kernel: helion.Config}: the full shape's configs

    def is_available(self):
        why = helion_support()
        if not why:
            return why
        try:
            from ..kernels import helion as helion_gdn  # noqa: F401
        except ImportError as e:
            return no(one_line(e, "import gdnbench.kernels.helion failed"))
        if not _cuda_available():
            return no("no CUDA device (Helion compiles to Triton for a GPU)")
        return YES

    def version(self):
        return dist_version(DIST)

    def supports(self, shape, route, mode, device):
        base = super().supports(shape, route, mode, device)
        if not base:
            return base
        if shape.family == "kda" and shape.lower_bound is not None and not -5.0 <= shape.lower_bound < 0:
            return no(f"lower_bound {shape.lower_bound}: the KDA intra stage (Triton) takes bounded gates in [-5, 0)")
        if shape.K % 16 or shape.V % 16 or shape.K > 256 or shape.V > 256:
            return no(f"K={shape.K}, V={shape.V}: our Helion kernels take head sizes that are multiples of 16, "
                      "up to 256")
        if shape.HV % shape.H:
            return no(f"H={shape.H}, HV={shape.HV}: GVA needs HV a multiple of H")
        return YES

    # -- configs
    def _kernels(self, route: str, family: str = "gdn") -> list[tuple[str, str]]:
        """(kernel, variant) of each Helion kernel the route runs."""
        sfx = "_kda" if family == "kda" else ""
        out = [("state" + sfx, "plain"), ("output" + sfx, "fused_q" if route == "fused_q" else "plain")]
        return ([("l2norm", "plain")] if route in ("flag", "fused_q") else []) + out

    def _plan(self, shape, route: str):
        """(mode, effort, {kernel: cached Config}) for the full shape: StageRunner's arguments."""
        eff = self.effort
        if eff == "none":
            return "default", eff, {}
        ident = _device_identity()
        cached = {}
        kernels = self._kernels(route, shape.family)
        for kernel, variant in kernels:
            for e in ((eff, "full") if eff == "quick" else (eff,)):  # a full-effort config serves a quick request
                key = cache_key(ident, kernel, variant, shape, e)
                cfg = next((c for c in (load_config(d, key) for d in self.read_dirs) if c is not None), None)
                if cfg is not None:
                    cached[kernel] = cfg
                    break
        if len(cached) == len(kernels):
            return "cached", eff, cached
        return "tune", eff, cached

    def config_label(self, shape, route, device):
        if self.effort == "none":
            return "default (Helion's default config of each kernel, no tuning)"
        try:
            mode, eff, cached = self._plan(shape, route)
        except Exception as e:  # a label must not fail a row; prepare reports the real error
            return f"unknown ({one_line(e)})"
        kernels = [k for k, _ in self._kernels(route, shape.family)]
        if mode == "cached":
            return f"tuned (cached, effort {eff}): {', '.join(kernels)}"
        return f"tuned now (effort {eff}): {', '.join(k for k in kernels if k not in cached)}" + (
            f"; cached: {', '.join(cached)}" if cached else "")

    def _runner(self, shape, route: str):
        from ..kernels.helion import StageRunner

        key = (shape.id, route)
        if key in self._resolved:  # the gate's shortened copy: the full shape's configs
            return StageRunner("cached", configs=self._resolved[key])
        mode, eff, cached = self._plan(shape, route)
        variants = dict(self._kernels(route, shape.family))
        runner = StageRunner(mode, eff, cached)
        if mode == "tune":
            ident = _device_identity()

            def on_tuned(kernel, cfg):
                save_config(self.cache_dir, cache_key(ident, kernel, variants[kernel], shape, eff), cfg)

            runner.on_tuned = on_tuned
        return runner

    def variant(self, shape, route):
        how = {"explicit": "caller l2norm (gdnbench.kernels.ops.l2norm, Triton)",
               "flag": "l2norm of q and k (Helion)",
               "fused_q": "l2norm of k (Helion), q's norm fused in the output kernel"}[route]
        out = "output with fused q-norm" if route == "fused_q" else "output"
        triton = ("per-channel gate cumsum + gated K K^T / Q K^T grams + solve (kda_intra), w/u/kg" if shape.family == "kda"
                  else "gate cumsum + gram + solve, w/u")
        return (f"helion {self.version()}: Helion stages [{shape.family} state recurrence, {out}"
                f"{', l2norm' if route != 'explicit' else ''}], Triton stages [{triton}] "
                f"(gdnbench.kernels.ops, default configs); {how}; effort {self.effort}")

    def prepare(self, shape, route, inputs):
        from ..kernels import helion as helion_gdn

        runner = self._runner(shape, route)
        call = helion_gdn.prepare_forward(
            inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, scale=inputs.scale,
            initial_state=inputs.initial_state, cu_seqlens=inputs.cu_seqlens, norm=ROUTE_NORM[route], runner=runner,
            # explicit: the caller's l2norm is the route's own work, inside the timed call
            caller_norm=_caller_l2norm if route == "explicit" else None)
        self._resolved.setdefault((shape.id, route), dict(runner.configs))
        return call


# ----------------------------------------------------------------------------- Helion's examples/linear
def examples_root(path: str | os.PathLike) -> Path | None:
    """The checkout root holding examples/linear/linear_attention_engine.py, given the root or examples/linear."""
    p = Path(path).expanduser()
    for root in (p, p.parent.parent):
        if (root / ENGINE).is_file():
            return root.resolve()
    return None


def load_engine(path: str | os.PathLike):
    """Import examples.linear.linear_attention_engine from a Helion checkout (raises on failure)."""
    root = examples_root(path)
    if root is None:
        raise FileNotFoundError(f"{path}: no {ENGINE.as_posix()} (point at a Helion repository checkout)")
    # the pretuned sm90 / sm100 configs next to the engine are read through the AOT cache (evaluate mode);
    # its data directory would otherwise be created in the current directory
    os.environ.setdefault("HELION_AUTOTUNE_CACHE", "AOTAutotuneCache")
    os.environ.setdefault("HELION_AOT_DATA_DIR", str(Path(tempfile.gettempdir()) / "gdnbench-helion-aot"))
    mod = sys.modules.get(ENGINE_MODULE)
    if mod is not None and Path(getattr(mod, "__file__", "")).resolve() == (root / ENGINE).resolve():
        return mod
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    for name in ("examples.linear", "examples", ENGINE_MODULE):  # another checkout's package, if any
        m = sys.modules.get(name)
        if m is not None and not str(getattr(m, "__file__", "") or "").startswith(str(root)):
            del sys.modules[name]
    return importlib.import_module(ENGINE_MODULE)


def pretuned_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / ENGINE).parent.glob("_helion_aot_linear_attention_engine_*.py"))


class HelionLinearBackend(Backend):
    name = "helion-linear"
    routes = PLAIN_ROUTES
    families = ("gdn", "kda")
    devices = ("cuda",)
    no_backward = "is run forward-only here (its autograd backward is not adapted)"
    no_decode = "has no pool decode adapter (its recurrent_step takes no slot indices)"

    def __init__(self, examples_dir: str | None = None):
        self.examples_dir = examples_dir

    def _dir(self) -> str | None:
        return self.examples_dir or os.environ.get(EXAMPLES_ENV) or None

    def _engine(self):
        return load_engine(self._dir())

    def is_available(self):
        why = helion_support()
        if not why:
            return why
        d = self._dir()
        if not d:
            return no(f"no Helion checkout given (--helion-examples DIR or {EXAMPLES_ENV}; examples/linear is "
                      "not in the helion wheel)")
        if examples_root(d) is None:
            return no(f"{d}: no {ENGINE.as_posix()} there (give the Helion repository root or its examples/linear)")
        try:
            eng = self._engine()
        except Exception as e:  # any import-time failure of third-party example code
            return no(one_line(e, "import of Helion's examples/linear failed"))
        missing = [f for f in ("helion_chunk_gated_delta_rule", "helion_chunk_kda") if not hasattr(eng, f)]
        if missing:
            return no(f"Helion's examples/linear has no {', '.join(missing)} (checkout too old or too new)")
        if not _cuda_available():
            return no("no CUDA device (Helion compiles to Triton for a GPU)")
        return YES

    def version(self):
        v = dist_version(DIST)
        return None if v is None else f"{v} (examples: {self._dir() or 'none'})"

    def _features(self, family: str) -> set[str]:
        fn = getattr(self._engine(), "helion_chunk_kda" if family == "kda" else "helion_chunk_gated_delta_rule")
        params = inspect.signature(fn).parameters
        return {p for p in ("cu_seqlens", "use_qk_l2norm_in_kernel") if p in params}

    def supports(self, shape, route, mode, device):
        base = super().supports(shape, route, mode, device)
        if not base:
            return base
        if shape.HV % shape.H:
            return no(f"H={shape.H}, HV={shape.HV}: GVA needs HV a multiple of H")
        feats = self._features(shape.family)
        if route == "flag" and "use_qk_l2norm_in_kernel" not in feats:
            what = "its GDN entry point" if shape.family == "gdn" else "this checkout's helion_chunk_kda"
            return no(f"{what} has no l2norm flag (use_qk_l2norm_in_kernel): route explicit only")
        if shape.varlen and len(set(shape.lens)) > 1 and "cu_seqlens" not in feats:
            what = "its GDN path" if shape.family == "gdn" else "this checkout's KDA path"
            return no(f"mixed sequence lengths: {what} takes no cu_seqlens (dense [B,H,T,D] only; equal lengths "
                      "run as a dense batch)")
        return YES

    def variant(self, shape, route):
        root = examples_root(self._dir() or ".")
        fn = "helion_chunk_kda" if shape.family == "kda" else "helion_chunk_gated_delta_rule"
        feats = self._features(shape.family) if root else set()
        packed = shape.varlen and "cu_seqlens" in feats and (shape.family == "kda")
        layout = ("token-major [1,T,HV,D] + cu_seqlens" if packed
                  else "head-first [B,HV,T,D]" + (" (equal-length sequences as a dense batch; the output's copy back "
                                                   "to packed tokens is in the call)" if shape.varlen else ""))
        norm = "use_qk_l2norm_in_kernel=True" if route == "flag" else "caller l2norm (gdnbench.kernels.ops.l2norm)"
        tuned = pretuned_files(root) if root else []
        cache = os.environ.get("HELION_AUTOTUNE_CACHE", "AOTAutotuneCache")
        # HELION_AUTOTUNE_EFFORT=none makes Helion take its default config before asking the AOT cache
        skip = "; HELION_AUTOTUNE_EFFORT=none: default configs" if os.environ.get("HELION_AUTOTUNE_EFFORT") == "none" else ""
        return (f"helion {dist_version(DIST)} examples/linear {fn}, {layout}, q/k repeated to HV heads, {norm}; "
                f"autotune cache {cache}, pretuned: {', '.join(tuned) or 'none (Helion default configs)'}{skip}")

    def prepare(self, shape, route, inputs):
        eng = self._engine()
        fn = getattr(eng, "helion_chunk_kda" if shape.family == "kda" else "helion_chunk_gated_delta_rule")
        kw, unpack = to_helion_linear(inputs, shape, self._features(shape.family))
        q, k = kw.pop("q"), kw.pop("k")
        if route == "flag":
            kw["use_qk_l2norm_in_kernel"] = True

            def call():
                o, s = fn(q, k, **kw)
                return unpack(o, s)
        else:
            def call():
                o, s = fn(_caller_l2norm(q), _caller_l2norm(k), **kw)
                return unpack(o, s)
        return call


def to_helion_linear(inputs, shape, features: set[str]):
    """Our inputs -> (keyword arguments of helion_chunk_* with q and k, unpack(o, state) -> ours).

    q/k [B,T,H,K] -> repeat_interleave to HV heads; dense: everything head-first [B,HV,T,D]
    contiguous, g [B,HV,T] (GDN) / [B,HV,T,K] (KDA) fp32, beta [B,HV,T]; packed sequences of equal
    length L: the same on the [N, L] view; packed KDA with a cu_seqlens-capable engine: token-major
    [1,T,HV,D] and int64 cu_seqlens. State [N,HV,K,V] fp32 either way. unpack returns views."""
    import torch

    HV, H = shape.HV, shape.H
    rep = HV // H

    def heads(x):
        return x.repeat_interleave(rep, dim=2) if rep > 1 else x

    q, k, v, g, beta = heads(inputs.q), heads(inputs.k), inputs.v, inputs.g.float(), inputs.beta
    h0 = None if inputs.initial_state is None else inputs.initial_state.float().contiguous()
    kw = dict(scale=float(inputs.scale), initial_state=h0, return_final_state=True)
    if shape.varlen and shape.family == "kda" and "cu_seqlens" in features:
        kw.update(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g.contiguous(), beta=beta.contiguous(),
                  cu_seqlens=inputs.cu_seqlens.to(torch.int64).contiguous())
        return kw, lambda o, s: (o, s)
    B, T = (len(shape.lens), shape.lens[0]) if shape.varlen else (shape.B, shape.lens[0])
    if shape.varlen and len(set(shape.lens)) > 1:
        raise ValueError(f"mixed lengths {list(shape.lens)}: the dense path needs equal lengths")

    def head_first(x):
        x = x.reshape(B, T, *x.shape[2:])
        return x.transpose(1, 2).contiguous()

    kw.update(q=head_first(q), k=head_first(k), v=head_first(v), g=head_first(g), beta=head_first(beta))

    def unpack(o, s):  # o [B,HV,T,V] -> [1 or B, T', HV, V]
        o = o.transpose(1, 2)
        return (o.reshape(1, B * T, *o.shape[2:]) if shape.varlen else o), s

    return kw, unpack

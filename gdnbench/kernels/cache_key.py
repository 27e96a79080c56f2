"""The key of every tuning cache, defined once: what a tuned config depends on.

Two caches on disk use it: the tuned winners of our Triton kernels (kernels/tuned.py, written by
`gdnbench autotune`, which also reads it to resume and to seed its searches; read by `gdnbench
run`) and the Helion backend's tuned configs (backends/helion.py, which adds the versions and
the effort Helion's configs also depend on). A key (:class:`CacheKey`) is:

- :class:`Machine`: the GPU's name and compute capability (another chip has other limits) and
  the Triton version (another compiler makes other code from the same config);
- ``source_hash``: the kernel's code (:func:`source_hash`: sha256 of the source of its jit
  functions and of every module-level definition they reach by name, ``from .common import``
  followed, so an edit makes stale the entries of exactly the kernels whose code it touches);
- :class:`ShapeKey`: what of a shape tuning depends on, as text, e.g.
  ``kda_K128_V128_H96_HV96_bfloat16_fixed_T8192``: the family (KDA runs other specializations of
  the shared kernels, with per-channel gates), K, V, H, HV, the storage dtype, fixed or varlen (the
  kernels compile separately for each) and the token count rounded up to a power of two (the grid
  size that decides occupancy; shapes within a factor of two share their tuning);
- ``variant``: which specialization of the kernel ran (kernels/tuned.py, ``variant_of``).

On disk a key is the flat dict of :meth:`CacheKey.as_dict` (its text is what the shipped
kernels/tuned_configs hold). Other caches key on other things and stay out of this module: the
direct launcher's in-memory table (kernels/launch.py) keys on Triton's own specialization of the
arguments, and Triton's on-disk compile cache is Triton's.

No torch import here; :func:`device_env` imports it lazily.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
# the jit functions each tuned kernel launches: (module in kernels/, function names; the last is the
# main one, whose registers the autotuner records)
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
    "fused_out": ("fused_fwd.py", ("fused_state_out_kernel",)),
    "kda_state_out": ("state_out_kda.py", ("kda_state_out_kernel",)),
    "kda16_prep": ("kda16.py", ("kda16_prep_kernel_any_t", "kda16_prep_kernel")),
    "kda16_loop": ("kda16.py", ("kda16_loop_kernel",)),
}


@dataclass(frozen=True)
class Machine:
    """The machine part of a key."""

    gpu: str | None
    compute_capability: str | None
    triton: str | None

    @classmethod
    def of(cls, env: dict) -> "Machine":
        """From a device_env() dict, a key dict or a results.capture_env() dict."""
        if isinstance(env.get("gpu"), dict):  # capture_env's layout
            return cls(env["gpu"].get("name"), env["gpu"].get("compute_capability"),
                       env.get("versions", {}).get("triton"))
        return cls(env.get("gpu"), env.get("compute_capability"), env.get("triton"))

    def as_dict(self) -> dict:
        return asdict(self)

    def lends_to(self, other: "Machine") -> bool:
        """Another GPU of ``other``'s compute capability and Triton: its entries serve ``other`` where that has
        none of its own (kernels/tuned.py, borrowed_entry)."""
        return self.gpu != other.gpu and (self.compute_capability, self.triton) == (
            other.compute_capability, other.triton)


@functools.lru_cache(maxsize=None)
def device_env(index: int = 0) -> dict | None:
    """The :class:`Machine` of CUDA device ``index`` as a dict (it travels between processes); None
    without CUDA."""
    import torch
    import triton

    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(index)
    return Machine(p.name, f"{p.major}.{p.minor}", triton.__version__).as_dict()


def device_identity(device: str) -> dict:
    """The Machine (as a dict) of this process's ``device``: gpu 'cpu' off the GPU, 'unknown' where
    CUDA is asked for and absent."""
    import triton

    if device != "cuda":
        return Machine("cpu", None, triton.__version__).as_dict()
    return device_env(0) or Machine("unknown", None, triton.__version__).as_dict()


def token_bucket(tokens: int) -> int:
    """The token count rounded up to a power of two (at least one chunk, 64)."""
    b = 64
    while b < tokens:
        b *= 2
    return b


_SHAPE_KEY = re.compile(r"(?P<family>gdn|kda)_K(?P<K>\d+)_V(?P<V>\d+)_H(?P<H>\d+)_HV(?P<HV>\d+)_(?P<dtype>\w+?)_"
                        r"(?P<mix>fixed|varlen)_T(?P<T>\d+)$")


@dataclass(frozen=True)
class ShapeKey:
    """The part of a shape that tuning depends on (module docstring); ``text`` is its on-disk form."""

    family: str
    K: int
    V: int
    H: int
    HV: int
    dtype: str
    varlen: bool
    tokens: int  # rounded up to a power of two

    @classmethod
    def of(cls, shape) -> "ShapeKey":
        return cls(shape.family, shape.K, shape.V, shape.H, shape.HV, shape.dtype, bool(shape.varlen),
                   token_bucket(shape.tokens))

    @classmethod
    def parse(cls, text: str) -> "ShapeKey | None":
        """The key a text names; None for text that names none."""
        m = _SHAPE_KEY.match(text or "")
        if m is None:
            return None
        return cls(m["family"], int(m["K"]), int(m["V"]), int(m["H"]), int(m["HV"]), m["dtype"],
                   m["mix"] == "varlen", int(m["T"]))

    @property
    def text(self) -> str:
        return (f"{self.family}_K{self.K}_V{self.V}_H{self.H}_HV{self.HV}_{self.dtype}_"
                f"{'varlen' if self.varlen else 'fixed'}_T{self.tokens}")

    def same_heads(self, other: "ShapeKey | None") -> bool:
        """Same family, head sizes and dtype (configs valid for one are valid for the other)."""
        return other is not None and (self.family, self.K, self.V, self.dtype) == (
            other.family, other.K, other.V, other.dtype)


def shape_key(shape) -> str:
    """A shape's key text."""
    return ShapeKey.of(shape).text


@dataclass(frozen=True)
class CacheKey:
    """The whole key of one tuned entry (module docstring)."""

    machine: Machine
    source_hash: str | None
    shape_key: str | None
    variant: str | None

    @classmethod
    def of(cls, env: dict, kernel: str, shape, variant: str) -> "CacheKey":
        """The key of ``kernel``'s tuning on ``shape`` under the current source, on the machine ``env``."""
        return cls(Machine.of(env), source_hash(kernel), shape_key(shape), variant)

    @classmethod
    def from_dict(cls, key: dict) -> "CacheKey":
        return cls(Machine.of(key), key.get("source_hash"), key.get("shape_key"), key.get("variant"))

    def as_dict(self) -> dict:
        return {**self.machine.as_dict(), "source_hash": self.source_hash, "shape_key": self.shape_key,
                "variant": self.variant}

    def same_search(self, other: "CacheKey") -> bool:
        """The same search (shape key and variant), whatever the machine and source."""
        return (self.shape_key, self.variant) == (other.shape_key, other.variant)

    def identity(self) -> tuple:
        """What a new entry replaces: same machine, shape and variant, whatever the source hash."""
        return self.machine, self.shape_key, self.variant

    def stale_part(self, older: "CacheKey") -> str | None:
        """What changed since ``older`` was keyed, when it is the same search on the same GPU: 'source
        hash' or 'Triton version'; None when it is another search, another GPU, or this very key."""
        m, o = self.machine, older.machine
        if older == self or not self.same_search(older) or (m.gpu, m.compute_capability) != (
                o.gpu, o.compute_capability):
            return None
        return "source hash" if older.source_hash != self.source_hash else "Triton version"


def entry_key(env: dict, kernel: str, shape, variant: str) -> dict:
    """The on-disk key of a tuned entry (:meth:`CacheKey.as_dict` of :meth:`CacheKey.of`)."""
    return CacheKey.of(env, kernel, shape, variant).as_dict()


# ----------------------------------------------------------------------------- source hashes
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


def file_hash(path: Path) -> str:
    """sha256 of a whole file (a kernel file whose every config depends on all of it)."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def clear_caches() -> None:
    """Forget computed source hashes (after kernel files changed under a running process)."""
    _module_defs.cache_clear()
    source_hash.cache_clear()

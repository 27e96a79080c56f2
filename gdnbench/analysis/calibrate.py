"""Calibration for the roofline: the GPU's measured copy bandwidth and bf16 matmul rate.

`measure(device="cuda")` times, with CUDA events after warm-up, the median of several repeats of
  * a device-to-device copy of `copy_bytes` (default 2 GiB; bandwidth counts the bytes read
    plus the bytes written: 2 * copy_bytes / time), and
  * a bf16 matmul n x n x n (default 8192) on random normal data (not zeros, which some
    hardware runs faster), rate = 2 n^3 / time;
and returns a dict with `bandwidth_bytes_per_s` and `matmul_flops_per_s` (what
`roofline.floor_us` reads), the raw samples and the environment (GPU name, driver, torch and
CUDA versions, UTC date). `save` writes it to results/<gpu-slug>/calibration.json, `load_for`
finds it again by GPU name. No torch import at module load.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from collections.abc import Mapping
from pathlib import Path

from ..data.results import read_json, slug, write_atomic

CALIB_SCHEMA = 1
CALIB_FILE = "calibration.json"


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file."""


class NoCudaError(RuntimeError):
    """`measure` was asked to run where there is no CUDA device (the CLI's exit code 3)."""


def _results_dir() -> Path:
    from ..paths import results_dir

    return results_dir()


def _time_us(fn, warmup: int, repeats: int) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out


def measure(device: str = "cuda", copy_bytes: int = 2 * 2**30, matmul_n: int = 8192, warmup: int = 3,
            repeats: int = 10) -> dict:
    """Measure copy bandwidth and bf16 matmul rate on `device` (a CUDA device). Raises NoCudaError
    when torch sees no CUDA device."""
    import torch

    if not str(device).startswith("cuda"):
        raise NoCudaError(f"calibration measures a CUDA GPU; device {device!r} is not one")
    if not torch.cuda.is_available():
        raise NoCudaError(f"calibration needs a CUDA device, and torch {torch.__version__} sees none "
                          f"(built with CUDA {torch.version.cuda})")
    dev = torch.device(device)
    if dev.index is None:  # torch 2.11's set_device rejects a bare "cuda" (measured on the H200 image)
        dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    gen = torch.Generator(device=dev).manual_seed(0)

    n_elem = copy_bytes // 4
    src = torch.randn(n_elem, device=dev, dtype=torch.float32, generator=gen)
    dst = torch.empty_like(src)
    copy_us = _time_us(lambda: dst.copy_(src), warmup, repeats)
    nbytes = n_elem * 4
    del src, dst

    a = torch.randn(matmul_n, matmul_n, device=dev, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(matmul_n, matmul_n, device=dev, dtype=torch.bfloat16, generator=gen)
    c = torch.empty(matmul_n, matmul_n, device=dev, dtype=torch.bfloat16)
    mm_us = _time_us(lambda: torch.matmul(a, b, out=c), warmup, repeats)
    del a, b, c
    torch.cuda.empty_cache()

    copy_med, mm_med = statistics.median(copy_us), statistics.median(mm_us)
    flops = 2 * matmul_n ** 3
    return {
        "calibration_schema": CALIB_SCHEMA,
        "bandwidth_bytes_per_s": 2 * nbytes / (copy_med * 1e-6),
        "matmul_flops_per_s": flops / (mm_med * 1e-6),
        "copy": {"bytes": nbytes, "bytes_moved": 2 * nbytes, "what": "device-to-device copy_, read + written",
                 "median_us": copy_med, "samples_us": copy_us},
        "matmul": {"n": matmul_n, "dtype": "bfloat16", "flops": flops, "what": "torch.matmul n x n x n, randn",
                   "median_us": mm_med, "samples_us": mm_us},
        "timing": {"method": "cuda events around each call, median", "warmup": warmup, "repeats": repeats},
        **_context(dev),
    }


def _context(dev) -> dict:
    import torch

    from ..data.results import _nvidia_smi

    p = torch.cuda.get_device_properties(dev)
    smi = _nvidia_smi()
    return {
        "gpu": {"name": p.name, "compute_capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1), "driver_version": smi.get("driver_version"),
                "clocks.max.sm": smi.get("clocks.max.sm"), "clocks.max.mem": smi.get("clocks.max.mem")},
        "versions": {"torch": torch.__version__, "cuda_runtime": torch.version.cuda},
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def default_path(gpu_name: str, directory: str | Path | None = None) -> Path:
    return Path(directory or _results_dir()) / slug(gpu_name) / CALIB_FILE


def _gpu_name(calib: dict) -> str:
    gpu = calib.get("gpu")
    name = gpu.get("name") if isinstance(gpu, dict) else None
    if not isinstance(name, str) or not name:
        raise CalibrationError("calibration has no gpu.name; cannot choose its results directory")
    return name


def save(calib: dict, path: str | Path | None = None) -> Path:
    """Write a calibration (atomically); default results/<gpu-slug>/calibration.json. Returns the path."""
    return write_atomic(calib, Path(path) if path else default_path(_gpu_name(calib)))


def _check(calib, p: str) -> dict:
    if not isinstance(calib, dict):
        raise CalibrationError(f"{p}: not a calibration (expected a JSON object)")
    for key in ("bandwidth_bytes_per_s", "matmul_flops_per_s"):
        v = calib.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise CalibrationError(f"{p}: field {key!r} must be a positive number, got {v!r}")
    return calib


def load(path: str | Path) -> dict:
    return _check(read_json(path, CalibrationError, "calibration file"), str(path))


def load_for(gpu_name: str, directory: str | Path | None = None) -> dict | None:
    """The saved calibration of a GPU (by name) under `directory` (default results/), or None."""
    path = default_path(gpu_name, directory)
    return load(path) if path.exists() else None


def load_for_doc(doc, directory: str | Path | None = None, beside: str | Path | None = None) -> dict | None:
    """The saved calibration of the GPU a results document (a `RunDocument`) was measured on, or None:
    first the calibration.json beside the document's file (``beside``: results/<gpu>/ holds both), when
    it is for the same GPU, then the one under ``directory`` (default ./results)."""
    gpu = doc.env.get("gpu") or {}
    name = gpu.get("name") if isinstance(gpu, Mapping) else None
    if not name:
        return None
    if beside is not None:
        sibling = Path(beside).parent / CALIB_FILE
        if sibling.exists():
            calib = load(sibling)
            if (calib.get("gpu") or {}).get("name") == name:
                return calib
    return load_for(name, directory)


def summary(calib: dict) -> str:
    """One line for the CLI."""
    name = (calib.get("gpu") or {}).get("name", "?")
    return (f"{name}: copy {calib['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s (read + written), "
            f"bf16 matmul {calib['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s")

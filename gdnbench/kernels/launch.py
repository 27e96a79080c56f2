"""Launch our kernels with less host time than Triton's JIT path.

``kernel[grid](...)`` cost 20.5 us of host time per launch on the H200 machine (Triton 3.6,
perf_counter around each launch); the compiled kernel's own launcher was 6.6 of that, the rest
binding and specializing the arguments, building the cache key and finding the compiled kernel.
A forward makes four to eight launches and is host-bound on the serving shapes, so after the
first launch of a specialization :func:`launch` calls the compiled kernel directly.  Against the
JIT path on the same machine (alternated, best of four rounds, four shapes x four routes): host time
per forward 0.803x, wall 0.882x (geomean of 16), outputs bitwise equal.

Its key holds what Triton specializes on for our kernels' arguments: the constexpr values and
compile options, and per runtime argument: None, a tensor's dtype and 16-byte alignment, an
int's width, equality to 1 and divisibility by 16, or a float.  Anything else (and the
interpreter, and ``GDNBENCH_JIT_LAUNCH=1``) goes through ``kernel[grid](...)``.
"""

from __future__ import annotations

import functools
import os

import torch

_COMPILED: dict = {}  # key -> (compiled kernel, the constexpr names in the kernel's parameter order)
_I32 = range(-(2**31), 2**31)


class _Unkeyable(Exception):
    pass


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if a is None or isinstance(a, bool):
        return a
    if isinstance(a, int):
        return a == 1, a % 16 == 0, a in _I32
    if isinstance(a, float):
        return float
    raise _Unkeyable


@functools.cache
def _direct_launch_api():
    """(JITFunction, driver, knobs) where the compiled-kernel launch API this module uses exists
    (Triton 3.6 and 3.9 have it), else None."""
    if os.environ.get("GDNBENCH_JIT_LAUNCH", "0") == "1":
        return None
    try:
        from triton import knobs
        from triton.runtime.driver import driver
        from triton.runtime.jit import JITFunction

        knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook  # noqa: B018
    except (ImportError, AttributeError):
        return None
    return JITFunction, driver, knobs


def launch(kernel, grid: tuple, args: tuple, constexprs: dict, options: dict):
    """``kernel[grid](*args, **constexprs, **options)``; returns the compiled kernel."""
    api = _direct_launch_api()
    if api is None or not isinstance(kernel, api[0]):  # the interpreter's kernels are not JITFunctions
        return kernel[grid](*args, **constexprs, **options)
    _, driver, knobs = api
    device = driver.active.get_current_device()
    try:
        key = (kernel, device, tuple(constexprs.items()), tuple(options.items()), tuple(map(_arg_key, args)))
    except _Unkeyable:
        return kernel[grid](*args, **constexprs, **options)
    hit = _COMPILED.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **constexprs, **options)
        names = tuple(kernel.arg_names[len(args):])
        if sorted(names) == sorted(constexprs) and hasattr(compiled, "packed_metadata"):
            _COMPILED[key] = (compiled, names)
        return compiled
    compiled, names = hit
    values = (*args, *(constexprs[n] for n in names))
    stream = driver.active.get_current_stream(device)
    g0, g1, g2 = (*grid, 1, 1)[:3]
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *values),
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)
    return compiled

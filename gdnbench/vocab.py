"""The project's vocabularies, defined once: modes, routes per mode, families, dtypes and their sizes,
and the statuses of a results row.

A route is how q/k normalization meets the kernel: `explicit` (the caller's l2norm, then the kernel),
`flag` (the kernel's own flag), `fused_q` / `fused_qk` (our kernels fold q's, or q's and k's, norm into
their stages), `megatron` / `megatron_flag` (Megatron's composition around the kernel: fused q|k,
heads repeated to HV). Only the forward routes without a fused norm have a backward and a decode step.
"""

from __future__ import annotations

FAMILIES = ("gdn", "kda")
MODES = ("fwd", "fwd_bwd", "decode")

PLAIN_ROUTES = ("explicit", "flag")  # the caller's l2norm, or the kernel's flag: the routes every backend has
FUSED_ROUTES = ("fused_q", "fused_qk")  # the norm folded into our kernels
ROUTES = PLAIN_ROUTES + FUSED_ROUTES  # forward mode
MEGATRON_ROUTES = ("megatron", "megatron_flag")
TRAIN_ROUTES = PLAIN_ROUTES + MEGATRON_ROUTES  # fwd_bwd mode
DECODE_ROUTES = PLAIN_ROUTES  # decode mode (fused routes: only where a backend has them)
ROUTES_BY_MODE = {"fwd": ROUTES, "fwd_bwd": TRAIN_ROUTES, "decode": DECODE_ROUTES}
ALL_ROUTES = tuple(dict.fromkeys(ROUTES + TRAIN_ROUTES))
NO_BACKWARD_ROUTES = FUSED_ROUTES
# our kernels' norm argument (kernels/ops.py): a route's name, but "none" where the caller normalized (explicit)
NORM_MODES = ("none", "flag") + FUSED_ROUTES

# A results row's status: `ok` passed the gate and was timed; `incorrect` failed the gate (figures, no
# time); `skipped`: the backend cannot run the combination; `error`: it raised, or its worker died.
ROW_STATUSES = ("ok", "skipped", "incorrect", "error")

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DTYPES = tuple(DTYPE_BYTES)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a storage dtype name (16-bit unless float32)."""
    return DTYPE_BYTES.get(dtype, 2)

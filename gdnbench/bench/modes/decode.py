"""Mode decode: one decode step, one new token for each of N sequences whose states live in a pool.

The step (what is timed): the backend's `prepare_decode` closure reads the N sequences' states
from the pool at `state_indices`, advances each by one token, writes them back in place at the
pool's dtype and returns (o [1,N,HV,V], the pool [P,HV,K,V]). Each prepared step gets its own copy
of the seeded pool (made here, outside the timed region): the gate judges a first step from the
seeded pool, while the timed closure keeps stepping its own copy.

The gate: the output and the N updated states against the fp64 one-token recurrence from the same
states (gdnbench.oracle.reference.decode_step), with check.py's budgets (2 x the error of the same step at
the storage precision; that run's states are rounded to the pool's dtype, the rounding any kernel
storing a bf16 pool must pay). The returned pool must have the shape's state dtype, and every slot
outside the step's indices must come back bit-identical.

Rows add `step_bytes` (gdnbench.analysis.roofline's decode byte model: what the step must move) and `gbps`
(step_bytes / median time, per time kind).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ...oracle.check import Oracle, Verdict, judge, make_oracle, storage_precision
from ...data.shapes import Shape

if TYPE_CHECKING:
    import torch


def prepare_step(backend, shape: Shape, route: str, inputs) -> Callable[[], tuple]:
    """The timed closure of mode decode, on a private copy of the pool."""
    return backend.prepare_decode(shape, route, dataclasses.replace(inputs, state_pool=inputs.state_pool.clone()))


@dataclass
class DecodeOracle:
    fwd: Oracle  # o [1,N,HV,V] and the N updated states [N,HV,K,V] in fp64
    pool: "torch.Tensor"  # the seeded pool, never stepped
    indices: "torch.Tensor"
    untouched: "torch.Tensor"  # bool [P]: slots the step must leave as they are


def build_oracle(check_shape: Shape, inputs, full_shape: Shape) -> DecodeOracle:
    import torch

    from ...data.inputs import torch_dtype
    from ...oracle.reference import decode_step

    idx = inputs.state_indices
    states = inputs.state_pool.index_select(0, idx)
    args = (inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, states)
    o64, s64 = decode_step(*args, scale=inputs.scale, dtype=torch.float64)
    lp, tf32 = storage_precision(check_shape.dtype)
    o_lp, s_lp = decode_step(*args, scale=inputs.scale, dtype=lp, tf32=tf32)
    s_lp = s_lp.to(torch_dtype(check_shape.state_dtype))
    untouched = torch.ones(inputs.state_pool.shape[0], dtype=torch.bool, device=idx.device)
    untouched[idx] = False
    return DecodeOracle(make_oracle(check_shape, full_shape, o64, s64, o_lp, s_lp), inputs.state_pool, idx, untouched)


def judge_step(oracle: DecodeOracle, out) -> Verdict:
    """Output and updated states as the forward gate judges them, plus the pool's dtype and its other slots."""
    import torch

    o, pool = out
    ref = oracle.pool
    if pool.shape != ref.shape or pool.dtype != ref.dtype:
        v = judge(oracle.fwd, o, None)
        why = f"state pool {tuple(pool.shape)} {pool.dtype} != {tuple(ref.shape)} {ref.dtype}"
        return dataclasses.replace(v, passed=False, reason="; ".join(filter(None, [v.reason, why])))
    idx, keep = oracle.indices.to(pool.device), oracle.untouched.to(pool.device)
    v = judge(oracle.fwd, o, pool.index_select(0, idx))
    if keep.any() and not torch.equal(pool[keep], ref.to(pool.device)[keep]):
        v = dataclasses.replace(v, passed=False, reason="; ".join(
            filter(None, [v.reason, "pool slots outside the step's indices changed"])))
    return v


def finite(out) -> bool:
    import torch

    o, pool = out
    return bool(torch.isfinite(o).all()) and bool(torch.isfinite(pool).all())


def finish(shape: Shape, route: str, times: dict) -> dict:
    """An ok row's bytes per step and achieved GB/s on each time it has (``times``: kind -> median µs,
    None where the row has no such time)."""
    from ...analysis.roofline import ROUTE_L2_PASSES, bytes_floor

    if route not in ROUTE_L2_PASSES:
        return {"step_bytes": None, "gbps": None}
    nbytes = bytes_floor(shape, route)
    return {"step_bytes": nbytes,
            "gbps": {kind: (nbytes / times[kind] / 1e3 if times.get(kind) else None) for kind in ("gpu", "wall")}}

"""The correctness gate: no time is reported for a route that did not pass it.

Every route computes the same function (attention on l2-normalized q and k), so one
oracle per shape serves all routes: the fp64 recurrence on the check inputs.

The error budget is derived from the data, not hand-set: the same recurrence is run
at the route's storage precision (bf16 / fp16 arithmetic and state; fp32 storage with
operands rounded to tf32, the precision tensor cores read fp32 with), and its error
against fp64 is what that precision costs on these inputs. A route passes when its
relative RMS error is within BUDGET_FACTOR times that, for the output and, when the
backend returns one, the final state. NaN or Inf never passes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ..data.shapes import Shape

if TYPE_CHECKING:
    import torch

BUDGET_FACTOR = 2.0
BUDGET_FLOOR = 1e-7  # a budget of exactly zero (e.g. all-zero data) would reject exact answers


def budget(lowp_err: float) -> float:
    """What a route may lose against fp64, given what the storage precision alone loses."""
    return max(BUDGET_FACTOR * lowp_err, BUDGET_FLOOR)


def storage_precision(dtype_name: str):
    """(torch dtype, tf32 rounding) of the budget run: the storage dtype, or fp32 read through tf32."""
    import torch

    return (torch.float32, True) if dtype_name == "float32" else (getattr(torch, dtype_name), False)


@dataclass
class Oracle:
    o: "torch.Tensor"
    state: "torch.Tensor"
    lowp_err_o: float
    lowp_err_state: float
    lens: tuple[int, ...]
    tokens: int
    shortened: bool

    @property
    def budget_o(self) -> float:
        return budget(self.lowp_err_o)

    @property
    def budget_state(self) -> float:
        return budget(self.lowp_err_state)


@dataclass
class Verdict:
    passed: bool
    reason: str
    err_o: float | None
    err_state: float | None
    maxabs_o: float | None
    budget_o: float
    budget_state: float
    lowp_err_o: float
    lowp_err_state: float
    lens: tuple[int, ...]
    tokens: int
    shortened: bool

    def to_dict(self) -> dict:
        return asdict(self)


def rel_rms(out, ref) -> float:
    """||out - ref|| / ||ref|| in fp64; inf when out has NaN/Inf."""
    import torch

    o = out.detach().to(torch.float64)
    r = ref.to(torch.float64).to(o.device)
    if not torch.isfinite(o).all():
        return math.inf
    denom = r.norm().item()
    num = (o - r).norm().item()
    return num / denom if denom > 0 else num


def max_abs_rel(out, ref) -> float:
    import torch

    o = out.detach().to(torch.float64)
    r = ref.to(torch.float64).to(o.device)
    if not torch.isfinite(o).all():
        return math.inf
    scale = r.abs().max().item()
    return (o - r).abs().max().item() / (scale if scale > 0 else 1.0)


def make_oracle(check_shape: Shape, full_shape: Shape, o64, s64, o_lp, s_lp) -> Oracle:
    """The fp64 answer and the storage-precision run's errors against it."""
    return Oracle(o=o64, state=s64, lowp_err_o=rel_rms(o_lp, o64), lowp_err_state=rel_rms(s_lp, s64),
                  lens=check_shape.lens, tokens=check_shape.tokens, shortened=check_shape.tokens < full_shape.tokens)


def build_oracle(check_shape: Shape, inputs, full_shape: Shape) -> Oracle:
    """fp64 answer on the check inputs, and the error the storage precision alone costs."""
    import torch

    from .reference import recurrence

    kw = dict(scale=inputs.scale, initial_state=inputs.initial_state, cu_seqlens=inputs.cu_seqlens_list)
    args = (inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta)
    o64, s64 = recurrence(*args, dtype=torch.float64, **kw)
    lp, tf32 = storage_precision(check_shape.dtype)
    o_lp, s_lp = recurrence(*args, dtype=lp, tf32=tf32, **kw)
    return make_oracle(check_shape, full_shape, o64, s64, o_lp, s_lp)


def judge(oracle: Oracle, o, state) -> Verdict:
    err_o = rel_rms(o, oracle.o) if o.shape == oracle.o.shape else math.inf
    err_s = None
    if state is not None:
        err_s = rel_rms(state, oracle.state) if state.shape == oracle.state.shape else math.inf
    problems = []
    if o.shape != oracle.o.shape:
        problems.append(f"output shape {tuple(o.shape)} != {tuple(oracle.o.shape)}")
    elif not math.isfinite(err_o):
        problems.append("output has NaN/Inf")
    elif err_o > oracle.budget_o:
        problems.append(f"output rel-RMS error {err_o:.3g} > budget {oracle.budget_o:.3g}")
    if err_s is not None:
        if not math.isfinite(err_s):
            problems.append("final state has NaN/Inf or wrong shape")
        elif err_s > oracle.budget_state:
            problems.append(f"final-state rel-RMS error {err_s:.3g} > budget {oracle.budget_state:.3g}")
    return Verdict(
        passed=not problems,
        reason="; ".join(problems),
        err_o=err_o,
        err_state=err_s,
        maxabs_o=max_abs_rel(o, oracle.o) if o.shape == oracle.o.shape else None,
        budget_o=oracle.budget_o,
        budget_state=oracle.budget_state,
        lowp_err_o=oracle.lowp_err_o,
        lowp_err_state=oracle.lowp_err_state,
        lens=oracle.lens,
        tokens=oracle.tokens,
        shortened=oracle.shortened,
    )

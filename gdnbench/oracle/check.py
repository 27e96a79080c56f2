"""The correctness gate: no time is reported for a route that did not pass it.

Every route computes the same function (attention on l2-normalized q and k), so one
oracle per shape serves all routes: the fp64 recurrence on the check inputs.

The error budget is derived from the data, not hand-set: the same recurrence is run
at the route's storage precision (bf16 / fp16 arithmetic and state; fp32 storage with
operands rounded to tf32, the precision tensor cores read fp32 with), and its error
against fp64 is what that precision costs on these inputs. A route passes when its
relative RMS error is within BUDGET_FACTOR times that, for the output and, when the
backend returns one, the final state. NaN or Inf never passes.

One global rel-RMS cannot see an error that is small in total: a 1 % scale on every output
(1e-2 against a budget of ~1e-2 in bf16) or one (token, head) row wrong among 10^5. Two more
statistics, each budgeted from the same storage-precision run, close that:
  scale error   |<out, ref> / <ref, ref> - 1|: a systematic scale. Budget: BUDGET_FACTOR times the
                storage run's, or what random errors at the rel-RMS budget give over n vectors of
                the last dim (SCALE_SIGMAS standard deviations of budget / sqrt(n)), whichever is larger;
  row error     max over rows of ||out_row - ref_row|| / (RMS row norm of ref), rows = (token, head)
                of the output and (sequence, head) of the state: one wrong row stands out.
                Budget: BUDGET_FACTOR times the storage run's largest row error.
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
SCALE_SIGMAS = 6.0  # the scale budget's statistical floor, in standard deviations of random errors
O_ROW_DIMS, STATE_ROW_DIMS = 1, 2  # a row: the output's last dim (V), the state's last two (K, V)


def budget(lowp_err: float) -> float:
    """What a route may lose against fp64, given what the storage precision alone loses."""
    return max(BUDGET_FACTOR * lowp_err, BUDGET_FLOOR)


def scale_budget(lowp_scale_err: float, rms_budget: float, vectors: int) -> float:
    """The scale error allowed: the storage run's times BUDGET_FACTOR, or SCALE_SIGMAS standard
    deviations of the scale error that random errors at the rel-RMS budget give (budget / sqrt(n) over
    n vectors of the last dim, not elements: a vector's errors share the state they came through)."""
    return max(BUDGET_FACTOR * lowp_scale_err, SCALE_SIGMAS * rms_budget / math.sqrt(max(vectors, 1)), BUDGET_FLOOR)


def storage_precision(dtype_name: str):
    """(torch dtype, tf32 rounding) of the budget run: the storage dtype, or fp32 read through tf32."""
    import torch

    return (torch.float32, True) if dtype_name == "float32" else (getattr(torch, dtype_name), False)


@dataclass(frozen=True)
class Errors:
    """One tensor against its fp64 answer. worst_row: the index of the worst row (output: batch,
    token, head; state: sequence, head)."""
    rel_rms: float
    scale_err: float
    row_err: float
    worst_row: tuple[int, ...]
    rows: int
    vectors: int  # vectors of the last dim (V)


NOT_FINITE = Errors(math.inf, math.inf, math.inf, (), 0, 0)


def errors(out, ref, row_dims: int) -> Errors:
    """rel-RMS, scale and row errors of `out` against `ref` in fp64; infinite when out has NaN/Inf."""
    import torch

    o = out.detach().to(torch.float64)
    r = ref.to(torch.float64).to(o.device)
    if not torch.isfinite(o).all():
        return NOT_FINITE
    d = o - r
    rr = (r * r).sum().item()
    row_sq = (d * d).flatten(-row_dims).sum(-1)  # [leading dims]: each row's squared error
    rows = row_sq.numel()
    dd = row_sq.sum().item()
    if rr > 0:
        rel, scale_err = math.sqrt(dd / rr), abs((o * r).sum().item() / rr - 1.0)
        row_rms = math.sqrt(rr / rows)
    else:
        rel, scale_err, row_rms = math.sqrt(dd), math.sqrt(dd), 1.0
    worst = int(row_sq.flatten().argmax().item())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), row_sq.shape))
    return Errors(rel, scale_err, math.sqrt(row_sq.flatten()[worst].item()) / row_rms, where, rows,
                  d.numel() // max(d.shape[-1], 1))


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


@dataclass
class Oracle:
    o: "torch.Tensor"
    state: "torch.Tensor"
    lowp_o: Errors
    lowp_state: Errors
    lens: tuple[int, ...]
    tokens: int
    shortened: bool

    @property
    def lowp_err_o(self) -> float:
        return self.lowp_o.rel_rms

    @property
    def lowp_err_state(self) -> float:
        return self.lowp_state.rel_rms

    @property
    def budget_o(self) -> float:
        return budget(self.lowp_o.rel_rms)

    @property
    def budget_state(self) -> float:
        return budget(self.lowp_state.rel_rms)

    def budgets(self, which: str) -> dict[str, float]:
        """rel_rms / scale_err / row_err -> budget of `o` or `state`."""
        low = self.lowp_o if which == "o" else self.lowp_state
        rms = budget(low.rel_rms)
        return {"rel_rms": rms, "scale_err": scale_budget(low.scale_err, rms, low.vectors),
                "row_err": budget(low.row_err)}


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
    scale_err_o: float | None = None
    budget_scale_o: float | None = None
    lowp_scale_err_o: float | None = None
    row_err_o: float | None = None
    worst_row_o: tuple[int, ...] | None = None
    budget_row_o: float | None = None
    lowp_row_err_o: float | None = None
    scale_err_state: float | None = None
    budget_scale_state: float | None = None
    lowp_scale_err_state: float | None = None
    row_err_state: float | None = None
    worst_row_state: tuple[int, ...] | None = None
    budget_row_state: float | None = None
    lowp_row_err_state: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


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
    return Oracle(o=o64, state=s64, lowp_o=errors(o_lp, o64, O_ROW_DIMS), lowp_state=errors(s_lp, s64, STATE_ROW_DIMS),
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


_WHAT = {"rel_rms": "rel-RMS error", "scale_err": "scale error |<out,ref>/<ref,ref> - 1|",
         "row_err": "row error (worst row / RMS row norm)"}


def _judge_one(label: str, out, ref, row_dims: int, limits: dict[str, float]) -> tuple[Errors | None, list[str]]:
    """One tensor's errors and what is wrong with them (empty: within every budget)."""
    if out.shape != ref.shape:
        return None, [f"{label} shape {tuple(out.shape)} != {tuple(ref.shape)}"]
    e = errors(out, ref, row_dims)
    if not math.isfinite(e.rel_rms):
        return e, [f"{label} has NaN/Inf"]
    problems = [f"{label} {_WHAT[k]} {getattr(e, k):.3g} > budget {limit:.3g}"
                + (f" at row {list(e.worst_row)}" if k == "row_err" else "")
                for k, limit in limits.items() if not getattr(e, k) <= limit]
    return e, problems


def _figures(suffix: str, e: Errors | None, limits: dict[str, float], low: Errors) -> dict:
    return {f"scale_err_{suffix}": e.scale_err if e else None, f"budget_scale_{suffix}": limits["scale_err"],
            f"lowp_scale_err_{suffix}": low.scale_err, f"row_err_{suffix}": e.row_err if e else None,
            f"worst_row_{suffix}": e.worst_row if e else None, f"budget_row_{suffix}": limits["row_err"],
            f"lowp_row_err_{suffix}": low.row_err}


def judge(oracle: Oracle, o, state) -> Verdict:
    """The output and, when given, the final state: each statistic within its budget."""
    lim_o, lim_s = oracle.budgets("o"), oracle.budgets("state")
    e_o, problems = _judge_one("output", o, oracle.o, O_ROW_DIMS, lim_o)
    extra = _figures("o", e_o, lim_o, oracle.lowp_o)
    e_s = None
    if state is not None:
        e_s, more = _judge_one("final-state", state, oracle.state, STATE_ROW_DIMS, lim_s)
        problems += more
        extra.update(_figures("state", e_s, lim_s, oracle.lowp_state))
        err_s = e_s.rel_rms if e_s else math.inf
    else:
        err_s = None
    return Verdict(
        passed=not problems,
        reason="; ".join(problems),
        err_o=e_o.rel_rms if e_o else math.inf,
        err_state=err_s,
        maxabs_o=max_abs_rel(o, oracle.o) if e_o else None,
        budget_o=oracle.budget_o,
        budget_state=oracle.budget_state,
        lowp_err_o=oracle.lowp_err_o,
        lowp_err_state=oracle.lowp_err_state,
        lens=oracle.lens,
        tokens=oracle.tokens,
        shortened=oracle.shortened,
        **extra,
    )

"""The autotune worker: one candidate per request, gated then timed (`python -m gdnbench.autotune.bench --worker SPEC`).

Candidate. Run in a worker subprocess (one per shape and rank, restarted when it dies, so an
illegal memory access or a hang costs one candidate, recorded as ``crashed`` / ``timeout``):
compiled and gated on the whole forward of the shape's family (``chunk_gdn`` or ``chunk_kda``) on
the kernel's route under the candidate config, against the fp64 recurrence with gdnbench.oracle.check's
data-derived budget (the rel-RMS error against the default config's output is recorded too); then
the stage kernel alone is timed by gdnbench.bench.timing: CUDA-graph replays of 1-16 stage calls, per call, on
the full input (stage inputs precomputed with the default config), median over rounds; a kernel of GATED_KERNELS is
timed under each gate regime's input and ranked by the geometric mean. Every candidate yields a result with a status
(ok, incorrect, compile_error, error, crashed, timeout) and a reason; none is dropped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

from ..backends.base import one_line
from ..bench.protocol import serve
from ..data.shapes import GATE_REGIMES
from ..kernels.cache_key import KERNEL_FUNCTIONS, device_env, device_identity
from ..kernels.tuned import loop_reads_k_tile
from ..vocab import FUSED_ROUTES
from .space import dtype_bytes, full_config, Point


# kernels whose time depends on the gates' values: fused_out cut in segments warms up where gates forget and
# hands states over where they do not.  H200, HV32 8K, BV 64, 4 segments: 137.1 us on strong gates, 414.2 on
# long-memory ones (399.6 as one segment), so its candidates are timed under every gate regime and ranked by
# the geometric mean of those times
GATED_KERNELS = ("fused_out",)

# a stage's graph replays as many calls as take REPLAY_MIN_US (1 to STAGE_CALLS_MAX), timed per call: a replay of one
# short call is mostly the replay's own cost.  H100, h2_hv8_serving, wu alone at six configs (torch.profiler: 25.8-27.9
# µs): events around a replay of one call read 35.9-38.2 µs and ranked BK 128 / 4 warps first; per call of a 10-call
# replay 26.6-28.5, ranked as the profiler's times (BK 64 / 4 warps / 1 stage first)
REPLAY_MIN_US = 200.0
STAGE_CALLS_MAX = 16


def calls_per_replay(one_call_us: float) -> int:
    """Stage calls per timed graph replay, from the time of a replay of one."""
    return max(1, min(STAGE_CALLS_MAX, math.ceil(REPLAY_MIN_US / max(one_call_us, 1e-3))))


# the jit function whose registers and spills a candidate records: its kernel's main one
MAIN_FUNCTION = {kernel: names[-1] for kernel, (_, names) in KERNEL_FUNCTIONS.items()}


class _Bench:
    """Everything one shape's candidates share: inputs, oracle, default outputs, stage inputs."""

    def __init__(self, spec: dict):
        import torch

        from ..kernels import ops
        from ..oracle.check import build_oracle
        from ..data.inputs import make_inputs
        from ..kernels.config import default_config
        from ..data.shapes import load_file
        from ..bench.timing import TimingParams

        self.torch, self.ops = torch, ops
        self.device = spec["device"]
        self.shape = load_file(spec["shape_set"]).get(spec["shape_id"])
        self.params = TimingParams(**spec["params"])
        s = self.shape
        self.kda = s.family == "kda"
        # kda16_prep's configs are the Triton kernel's: the CUDA C++ one (GDNConfig.kda16_prep_cuda) has none
        self.base = dataclasses.replace(default_config(s.K, s.V, dtype_bytes(s.dtype), s.family), kda16_prep_cuda=False)
        check_shape = s.shortened(spec["check_tokens"])
        self.full = make_inputs(s, self.device)
        self.small = self.full if check_shape is s else make_inputs(check_shape, self.device)
        self.info = {id(x): (ops.prepare_varlen(x.cu_seqlens) if x.cu_seqlens is not None else None)
                     for x in (self.full, self.small)}
        self._by_gates = {s.gate_regime: self.full}  # full inputs per gate regime, made when first timed
        self.oracle = None
        if not spec.get("warm_only"):
            with torch.no_grad():
                self.oracle = build_oracle(check_shape, self.small, s)
        self._default_o: dict[str, object] = {}
        self._stage: dict[str, dict] = {}
        self.cache_dir = Path(spec["cache_dir"]) if spec.get("cache_dir") else None
        self._k_tile: dict[str, bool] = {}  # per route

    def aqk_writes_k_tile(self, route: str) -> bool:
        """Whether ``route``'s forward on this machine runs aqk writing the quad tile (kernels/tuned.py,
        ``loop_reads_k_tile``): then aqk's candidates are timed writing it, as the forward runs them (32K, H200:
        132.9 us in a search without the store, 158.6 with it in a contract run)."""
        if self.kda or self.device != "cuda":
            return False
        if route not in self._k_tile:
            self._k_tile[route] = loop_reads_k_tile(self.shape, route, device_env(), self.cache_dir)
        return self._k_tile[route]

    def forward(self, inputs, route: str, cfg, on_launch=None):
        """The whole chunk_gdn / chunk_kda forward of a route, as the gdnbench backend runs it."""
        ops, x = self.ops, inputs
        kw = dict(scale=x.scale, initial_state=x.initial_state, output_final_state=True, config=cfg,
                  on_launch=on_launch)
        op = ops.chunk_gdn
        if self.kda:
            op = ops.chunk_kda
            kw["lower_bound"] = x.lower_bound
        if x.cu_seqlens is not None:
            kw.update(cu_seqlens=x.cu_seqlens, chunk_indices=self.info[id(x)])
        if route == "explicit":
            q, k = (ops.l2norm(t, cfg.l2norm, on_launch) for t in (x.q, x.k))
            return op(q, k, x.v, x.g, x.beta, norm="none", **kw)
        return op(x.q, x.k, x.v, x.g, x.beta, norm=route, **kw)

    def full_inputs(self, gates: str | None = None):
        """The full inputs under the gate regime ``gates`` (default: the shape's)."""
        gates = gates or self.shape.gate_regime
        if gates not in self._by_gates:
            from ..data.inputs import make_inputs

            x = make_inputs(dataclasses.replace(self.shape, gate_regime=gates), self.device)
            self.info[id(x)] = self.info[id(self.full)] if x.cu_seqlens is not None else None
            self._by_gates[gates] = x
        return self._by_gates[gates]

    def default_output(self, route: str):
        if route not in self._default_o:
            self._default_o[route] = self.forward(self.small, route, self.base)[0]
        return self._default_o[route]

    def stage_inputs(self, route: str, gates: str | None = None) -> dict:
        """The inputs of every stage on the full shape, computed once with the default config, chained
        as ops._forward chains them. KDA: kda_intra also gives Aqk (for the output kernel, which then
        reads no k), and the state kernel reads w/u's kg as its k, with k's rstd already in it."""
        gates = gates or self.shape.gate_regime
        if (route, gates) in self._stage:
            return self._stage[route, gates]
        x = self.full_inputs(gates)
        ops, cfg, info = self.ops, self.base, self.info[id(x)]
        fuse_k, fuse_q = route == "fused_qk", route in FUSED_ROUTES
        k = x.k if fuse_k else ops.l2norm(x.k)
        q = x.q if fuse_q else ops.l2norm(x.q)
        h0 = None if x.initial_state is None else x.initial_state.float().contiguous()
        aqk = None
        if self.kda:
            g_cs, A, aqk, rk = ops.kda_intra(q, k, x.g, x.beta, varlen=info, fuse_k=fuse_k, raw_q=fuse_q, config=cfg)
        else:
            g_cs, A, rk, ssq = ops.gram_solve(k, x.g, x.beta, varlen=info, fuse_k=fuse_k, config=cfg)
        w, u, kg = ops.recompute_wu(k, x.v, x.beta, A, g_cs, rstd_k=rk, varlen=info, config=cfg)
        # the operands of the state and output kernels that differ by family
        state_k = kg if self.kda else k
        out_k, out_rk, out_ssq = (None, None, None) if self.kda else (k, rk, ssq)
        h, vn, _ = ops.state_recurrence(state_k, w, u, g_cs, initial_state=h0,
                                        output_final_state=True, varlen=info, config=cfg)
        # GDN's one pass: its own q k^T gram (and q's rstd under the fused routes) for state_out; under fused_qk
        # also the quads the loop's k_rstd_tile reads, whose first two columns are the pairs the other forms read
        a1, cq = (None, None) if self.kda else ops.chunk_aqk(q, k, g_cs, fuse_q=fuse_q, ssq_k=ssq, rstd_k=rk,
                                                             k_tile=rk is not None, varlen=info, config=cfg)
        cq4 = None
        if rk is not None and cq is not None:
            cq4, cq = cq, cq[..., :2].contiguous()
        self._stage[route, gates] = dict(q=q, k=k, g_cs=g_cs, A=A, aqk=aqk, rk=rk, w=w, u=u, h0=h0, h=h, vn=vn,
                                         info=info, fuse_k=fuse_k, fuse_q=fuse_q, state_k=state_k,
                                         out_k=out_k, out_rk=out_rk, out_ssq=out_ssq, a1=a1, cq=cq, cq4=cq4)
        return self._stage[route, gates]

    def kda16_tiles(self, route: str, gates: str | None = None) -> dict:
        """The 16-token form's prepared tiles (the loop's inputs), once per route and gate regime."""
        key = ("kda16", route, gates or self.shape.gate_regime)
        if key not in self._stage:
            self._stage[key] = self.stage_call("kda16_prep", route, self.base, gates=gates)()
        return self._stage[key]

    def stage_call(self, kernel: str, route: str, cfg, on_launch=None, gates: str | None = None):
        """A zero-argument call of the one stage kernel under ``cfg`` (what is timed), on the inputs of the
        gate regime ``gates`` (default: the shape's)."""
        ops, st, x = self.ops, self.stage_inputs(route, gates), self.full_inputs(gates)
        run = dict(varlen=st["info"], config=cfg, on_launch=on_launch)  # every stage's
        if kernel == "l2norm":
            return lambda: ops.l2norm(x.k, cfg.l2norm, on_launch)
        if kernel == "gram":
            return lambda: ops.gram_solve(st["k"], x.g, x.beta, fuse_k=st["fuse_k"], **run)
        if kernel == "kda_intra":
            return lambda: ops.kda_intra(st["q"], st["k"], x.g, x.beta, fuse_k=st["fuse_k"], raw_q=st["fuse_q"],
                                         **run)
        if kernel == "wu":
            return lambda: ops.recompute_wu(st["k"], x.v, x.beta, st["A"], st["g_cs"], rstd_k=st["rk"], **run)
        if kernel == "state":
            return lambda: ops.state_recurrence(st["state_k"], st["w"], st["u"], st["g_cs"],
                                                initial_state=st["h0"], output_final_state=True, **run)
        if kernel == "aqk":
            return lambda: ops.chunk_aqk(st["q"], st["k"], st["g_cs"], fuse_q=st["fuse_q"], ssq_k=st["out_ssq"],
                                         rstd_k=st["out_rk"], k_tile=self.aqk_writes_k_tile(route), **run)
        if kernel == "fused_out":
            cq = st["cq4"] if st["rk"] is not None and cfg.fused_out.k_rstd_tile else st["cq"]
            return lambda: ops.state_output_in_loop(st["q"], st["k"], x.v, x.beta, st["g_cs"], st["A"], st["a1"],
                                                    cq, st["rk"], scale=x.scale, initial_state=st["h0"],
                                                    output_final_state=True, **run)
        if kernel == "kda_state_out":
            return lambda: ops.kda_state_output(st["q"], st["state_k"], st["w"], st["u"], st["g_cs"], st["aqk"],
                                                scale=x.scale, fuse_q=st["fuse_q"], initial_state=st["h0"],
                                                output_final_state=True, **run)
        if kernel == "kda16_prep":
            return lambda: ops.kda16_prepare(st["q"], st["k"], x.g, x.beta, scale=x.scale, norm_q=st["fuse_q"],
                                             norm_k=st["fuse_k"], **run)
        if kernel == "kda16_loop":
            tiles = self.kda16_tiles(route, gates)
            return lambda: ops.kda16_loop(tiles, x.v, initial_state=st["h0"], output_final_state=True, **run)
        if kernel == "state_out":
            return lambda: ops.state_output(st["q"], st["k"], st["w"], st["u"], st["g_cs"], st["a1"], st["cq"],
                                            scale=x.scale, initial_state=st["h0"], output_final_state=True, **run)
        return lambda: ops.chunk_output(st["q"], st["out_k"], st["vn"], st["h"], st["g_cs"], scale=x.scale,
                                        rstd_k=st["out_rk"], ssq_k=st["out_ssq"], fuse_q=st["fuse_q"], aqk=st["aqk"],
                                        **run)

    def time_us(self, fn) -> tuple[float, str]:
        """Median µs per call: CUDA-graph replays of :func:`calls_per_replay` calls on the GPU (events around each
        eager call where capture fails)."""
        from ..bench import timing

        p = self.params
        for _ in range(p.warmup):
            fn()
        if self.device != "cuda":
            return statistics.median(timing.time_cpu(fn, p.iters * p.rounds)), "cpu perf_counter"
        try:
            graph = timing.capture_graph(fn)
        except timing.GraphUnsafe:
            samples = [t for _ in range(p.rounds) for t in timing.time_wall(fn, p.iters)]
            return statistics.median(samples), "cuda events per eager call (graph capture failed)"
        calls = calls_per_replay(statistics.median(timing.time_graph(graph, 5)))
        if calls > 1:
            del graph

            def repeated():
                for _ in range(calls):
                    fn()

            graph = timing.capture_graph(repeated)
        samples = [t / calls for _ in range(p.rounds) for t in timing.time_graph(graph, p.iters)]
        del graph
        return statistics.median(samples), f"cuda graph replay of {calls} stage calls, per call"

    def warm(self, kernel: str, route: str, point: Point) -> dict:
        """Compile one candidate (its forward on the gate's input, run once) to fill Triton's cache."""
        t0 = time.monotonic()
        try:
            with self.torch.no_grad():
                self.forward(self.small, route, full_config(kernel, point, self.base))
                self._sync()
        except Exception as e:
            return {"status": "error", "reason": one_line(e), "seconds": round(time.monotonic() - t0, 3),
                    "context_lost": not self._context_ok()}
        return {"status": "ok", "reason": "", "seconds": round(time.monotonic() - t0, 3)}

    def evaluate(self, kernel: str, route: str, point: Point) -> dict:
        """Compile -> gate -> time one candidate; every outcome is a result dict."""
        from ..oracle.check import judge, rel_rms

        torch = self.torch
        res: dict = {"status": "error", "reason": "", "time_us": None}
        seen: dict = {}  # jit function name -> its compiled kernel, from this candidate's launches

        def on_launch(kernel, compiled):
            seen[getattr(getattr(kernel, "fn", kernel), "__name__", "")] = compiled

        t0 = time.monotonic()
        stage = "compile"
        try:
            with torch.no_grad():
                cfg = full_config(kernel, point, self.base)
                ref = self.default_output(route)
                o, s = self.forward(self.small, route, cfg, on_launch)
                self._sync()
                res["first_call_s"] = round(time.monotonic() - t0, 3)
                self._registers(res, seen.get(MAIN_FUNCTION[kernel]))
                stage = "gate"
                v = judge(self.oracle, o, s)
                res.update(err_o=v.err_o, err_state=v.err_state, budget_o=v.budget_o, budget_state=v.budget_state,
                           err_vs_default=rel_rms(o, ref) if o.shape == ref.shape else None, check_tokens=v.tokens)
                del o, s
                if not v.passed:
                    res.update(status="incorrect", reason=v.reason)
                    return res
                stage = "timing"
                if kernel in GATED_KERNELS:
                    times = {r: self.time_us(self.stage_call(kernel, route, cfg, on_launch, r)) for r in GATE_REGIMES}
                    res["time_us_by_gates"] = {r: t for r, (t, _) in times.items()}
                    res["time_us"] = math.prod(res["time_us_by_gates"].values()) ** (1 / len(times))
                    res["timing_method"] = next(iter(times.values()))[1] + ", geomean over gate regimes"
                else:
                    res["time_us"], res["timing_method"] = self.time_us(self.stage_call(kernel, route, cfg,
                                                                                        on_launch))
                    if kernel == "aqk" and self.aqk_writes_k_tile(route):
                        res["timing_method"] += ", writing the quad tile (the loop's entry reads it)"
                self._registers(res, seen.get(MAIN_FUNCTION[kernel]))
                res["status"] = "ok"
        except Exception as e:  # a failing candidate is data
            res["status"] = "compile_error" if stage == "compile" and _is_compile_error(e) else "error"
            res["reason"] = f"{stage}: {one_line(e)}"
            res["traceback"] = traceback.format_exc()[-1500:]
            res["time_us"] = None
            if not self._context_ok():
                res["context_lost"] = True
        finally:
            res["seconds"] = round(time.monotonic() - t0, 3)
        return res

    def _sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def _context_ok(self) -> bool:
        try:
            self._sync()
            return True
        except Exception:
            return False

    @staticmethod
    def _registers(res: dict, compiled) -> None:
        for attr in ("n_regs", "n_spills"):
            try:
                val = getattr(compiled, attr, None)
            except Exception:
                val = None
            if val is not None:
                res[attr] = int(val)


def _is_compile_error(e: BaseException) -> bool:
    names = {"CompilationError", "CompileTimeAssertionFailure", "OutOfResources", "PTXASError"}
    return type(e).__name__ in names or type(e).__module__.startswith("triton.compiler")


def worker_main(spec_json: str) -> int:
    """Child process (gdnbench.bench.protocol): set up the shape's bench, then answer one result per
    candidate request; a result with ``context_lost`` (the CUDA context is poisoned) ends it."""
    spec = json.loads(spec_json)
    bench: list[_Bench] = []

    def start() -> dict:
        bench.append(_Bench(spec))
        return {"env": device_identity(spec["device"])}

    def answer(req: dict, send) -> dict:
        run = bench[0].warm if req.get("warm") else bench[0].evaluate
        return run(req["kernel"], req["route"], req["point"])

    return serve(answer, start)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(worker_main(sys.argv[2]))
    sys.exit("usage: python -m gdnbench.autotune.bench --worker SPEC_JSON (started by gdnbench autotune)")

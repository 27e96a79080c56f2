"""The `gdnbench autotune` command (registered on the main app by ``register(app)``).

Parses, checks and renders only; the work is in gdnbench.autotune. No torch import at module
load. Bad input: one line and exit code 2; interrupted (SIGINT): one line and exit code 130. With
--nproc-per-node N > 1 the command becomes torchrun (exec), running itself once per GPU; torchrun
passes a SIGINT on to the ranks, and rank 0 says what was saved.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ..vocab import ROUTES
from .console import EXIT_INTERRUPTED, EXIT_NO_DEVICE, console, err_console, fail as _fail, say
from .options import DEVICES, FAMILIES, SHARDS, UsageError, at_least, choice

# the shape sets tuned when --shapes is not given, per --family
DEFAULT_SETS = {"gdn": ("gdn-qwen6",), "kda": ("kda-legacy6",), "all": ("gdn-qwen6", "kda-legacy6")}
# set on the torchrun re-launch (do not re-launch again) to the command's start, time.monotonic()
RANK_ENV = "GDNBENCH_AUTOTUNE_RANKED"


class _Bad(ValueError):
    pass


def _split(values: Optional[list[str]]) -> list[str]:
    return [x.strip() for v in values or [] for x in v.split(",") if x.strip()]


def _pick(values: Optional[list[str]], known: tuple, what: str) -> list[str]:
    got = _split(values) or list(known)
    for v in got:
        if v not in known:
            raise _Bad(f"{what}: unknown value {v!r} (known: {', '.join(known)})")
    return got


def select_shapes(set_names: list[str], shape_ids: list[str], family: str) -> list[tuple[str, object]]:
    """(set path, shape) pairs to tune: the sets' shapes of ``family`` (gdn, kda or all)."""
    from ..data import shapes as shp

    pairs = []
    for name in set_names:
        ss = shp.load(name)
        pairs += [(ss.path, s) for s in ss.shapes if not shape_ids or s.id in shape_ids]
    if shape_ids and not pairs:
        raise _Bad(f"--shape-id: none of {', '.join(shape_ids)} is in {', '.join(set_names)}")
    return [(p, s) for p, s in pairs if family in ("all", s.family)]


def relaunch_command(argv: list[str], nproc: int) -> list[str]:
    """The torchrun command (through :func:`torchrun_main`) that runs this autotune with ``nproc``
    ranks on this node."""
    return [sys.executable, "-m", "gdnbench.cli.autotune", "torchrun", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "gdnbench.cli.autotune", "autotune", *argv]


def torchrun_main(args: list[str]) -> int:
    """torchrun with ``args``; a SIGINT ends it with exit code 130 instead of its traceback (it has
    passed the signal on to the ranks; rank 0 prints what was saved)."""
    import logging

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.run import main

    # its 'Received 2 death signal' and 'Sending process N closing signal' (rank 0's line says it)
    for name in ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        main(args)
    except SignalException as e:
        if e.sigval != signal.SIGINT:
            raise
        return EXIT_INTERRUPTED
    return 0


def _relaunch(argv: list[str], nproc: int, started: float):
    """Replace this process by torchrun running this autotune on ``nproc`` ranks (so a signal sent to
    this process reaches torchrun, which passes it on)."""
    env = {**os.environ, RANK_ENV: repr(started), "NCCL_NVLS_ENABLE": "0"}
    cmd = relaunch_command(argv, nproc)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)


def _start_time() -> float:
    """When this command started (time.monotonic(), one clock for all processes): now, or for a
    torchrun rank, when the command that re-launched it did."""
    return float(os.environ.get(RANK_ENV) or time.monotonic())


def _argv(opts: dict) -> list[str]:
    """The command-line options of this run (for the torchrun re-launch), without --nproc-per-node."""
    out = []
    for name, value in opts.items():
        flag = "--" + name.replace("_", "-")
        if name == "seeds":  # on by default: only its negation travels
            out += [] if value else ["--no-seeds"]
        elif isinstance(value, bool):
            out += [flag] if value else []
        elif value is not None:
            out += [flag, str(value)]
    return out


def _only_dimensions(names: list[str], tasks) -> list[str]:
    """--only's names, each a dimension of some selected kernel (a selected kernel that has none of them
    re-times its first seed)."""
    from ..autotune.space import dimension_names

    known = dict.fromkeys(d for t in tasks for d in dimension_names(t.kernel, t.variant))
    for n in names:
        if n not in known:
            raise _Bad(f"--only {n}: not a dimension of --kernels {','.join(dict.fromkeys(t.kernel for t in tasks))} "
                       f"(they have {', '.join(known)})")
    return names


def _resolve_device(device: str, dry_run: bool) -> str:
    choice("--device", device, DEVICES)
    if dry_run or device == "cpu":
        return "cuda" if device == "auto" else device
    import torch

    if not torch.cuda.is_available():
        _fail("no CUDA device found; see the search space with --dry-run, or exercise the path on the CPU "
              "with --device cpu --shapes smoke (times are not meaningful there)", EXIT_NO_DEVICE)
    return "cuda"


def _print_dry_run(rows: list[dict], cache_dir: Optional[Path]) -> None:
    """One block per search: what it tunes, its counts and strategy, where it is cached, then each
    dimension's values."""
    from ..autotune.report import fmt_values

    for r in rows:
        strat = "exhaustive" if r["strategy"] == "exhaustive" else f"coordinate descent (≤{r['per_pass']} per pass)"
        cached = "".join(f" [cached on {gpu}: {summary}]" for gpu, summary in r["cached"].items())
        console.print(f"{r['kernel']} variant={r['variant']} route={r['route']} {r['shape_key']} "
                      f"({r['shape_id']}): {r['total']} candidates, {r['valid']} valid, {strat}{cached}",
                      markup=False, highlight=False, soft_wrap=True)
        for d, v in r["dims"].items():
            console.print(f"  {d}: {fmt_values(v)}", markup=False, highlight=False, soft_wrap=True)
    n_cached = sum(1 for r in rows if r["cached"])
    under = ", ".join(str(d) for d in cache_dir) if isinstance(cache_dir, list) else str(cache_dir)
    where = f"; {n_cached} marked cached (under {under})" if cache_dir is not None else ""
    console.print(f"{len(rows)} searches, nothing run{where}; valid = kept by kernels.config.validate()",
                  highlight=False, soft_wrap=True)


def _run_with_progress(shapes, tasks, opts, dist, tally):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ..autotune import tune as at_tune
    from ..kernels.cache_key import shape_key

    show = dist.rank == 0
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=err_console, disable=not show) as progress:
        bar = progress.add_task("autotune", total=None)
        planned = {"n": 0}

        def on_event(kind, info):
            tally.count(kind, info)
            if kind == "search":
                planned["n"] += info["estimate"]
                progress.update(bar, total=planned["n"],
                                description=f"{info['task'].kernel}[{info['task'].variant}] {info['shape'].id}")
            elif kind == "result":
                r = info["result"]
                t = progress.tasks[0]
                if t.completed + 1 > (t.total or 0):  # a later pass: grow the estimate
                    planned["n"] += 1
                    progress.update(bar, total=planned["n"])
                progress.update(bar, advance=1)
                if r["status"] != "ok" and show:
                    progress.console.print(f"  {info['task'].kernel} {r['config']}: {r['status']}: {r['reason']}",
                                           highlight=False)
            elif kind == "entry" and show:
                e = info["entry"]
                d, b = e["default"]["time_us"], (e["best"] or {}).get("time_us")
                ratio = f"{b / d:.3f}" if d and b else "-"
                progress.console.print(f"[green]{e['kernel']}[{e['variant']}] {e['key']['shape_key']}[/green]: "
                                       f"default {d} µs, best {b} µs (ratio {ratio}), "
                                       f"{e['search']['evaluated']} evaluated -> {info['path']}", highlight=False)
            elif kind == "cached" and show:
                t = info["task"]
                progress.console.print(f"skipped {t.kernel}[{t.variant}] {shape_key(info['shape'])}: "
                                       f"{info['reason']}", markup=False, highlight=False)
            elif kind == "skip" and show:
                progress.console.print(f"[red]failed[/red] {info['shape'].id}: {len(info['tasks'])} searches not "
                                       f"run: {info['reason']}", highlight=False)

        return at_tune.tune(shapes, tasks, opts, dist, on_event)


def _summary(tally, wall_s: float, world: int = 1) -> str:
    """The sweep's counts and times (the searches' own time and the command's wall time)."""
    own = ("(the rest: imports, worker starts, inputs)" if world == 1 else f"(summed over {world} ranks)")
    return (f"searches: {tally.run} run, {tally.skipped} skipped (cached), {tally.failed} failed; "
            f"wall time {wall_s:.1f} s, searches {tally.search_s:.1f} s {own}")


def register(app: typer.Typer) -> None:
    """Add the `autotune` command to ``app``."""

    @app.command()
    def autotune(
        shapes: Optional[list[str]] = typer.Option(None, "--shapes", "-s", help="Shape set names or .toml paths "
                                                    "(default: gdn-qwen6 for --family gdn, kda-legacy6 "
                                                    "for kda, both for all)."),
        shape_ids: Optional[list[str]] = typer.Option(None, "--shape-id", help="Only these shape ids."),
        family: str = typer.Option("all", help="gdn, kda or all: tune the selected shapes of this family "
                                   "(chunk_gdn's or chunk_kda's kernels)."),
        kernels: Optional[list[str]] = typer.Option(None, "--kernels", "-k", help="Comma-separated stage kernels "
                                                     "(default: l2norm,gram,kda_intra,wu,state,output,output_fused; "
                                                     "gram runs for gdn shapes, kda_intra for kda)."),
        routes: Optional[list[str]] = typer.Option(None, "--routes", "-r", help="Routes whose kernel "
                                                    "specializations to tune (default: all)."),
        budget: float = typer.Option(300.0, help="Seconds per kernel and shape search (checked between sweeps)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the search spaces and counts; run nothing "
                                     "(CPU is fine). A search is marked 'cached on <gpu>' when that GPU's folder of "
                                     "--cache-dir holds a working entry of it for the current kernel source: a real "
                                     "run there skips it (if its compute capability and Triton version match too)."),
        retune: bool = typer.Option(False, "--retune", help="Search again where the cache holds a current entry "
                                    "(default: skip those, so a re-run resumes an interrupted sweep)."),
        nproc_per_node: int = typer.Option(1, "--nproc-per-node", help="GPUs to share the work over (torchrun, one rank per GPU; see --shard)."),
        device: str = typer.Option("auto", help="auto, cuda or cpu (cpu: interpreter, plumbing only)."),
        cache_dir: Optional[Path] = typer.Option(None, help="Cache root, read and written alone (default: write the user cache, "
                                                 "$GDNBENCH_CACHE_DIR or ~/.cache/gdnbench/tuned; read it, then the "
                                                 "winners shipped with gdnbench)."),
        exhaustive_max: int = typer.Option(256, help="Search exhaustively when at most this many valid points."),
        min_gain: float = typer.Option(0.01, help="Relative gain a move of coordinate descent needs."),
        check_tokens: Optional[int] = typer.Option(None, help="Gate input length cap (default 8192; 1024 on CPU)."),
        warmup: int = typer.Option(5), rounds: int = typer.Option(3), iters: int = typer.Option(20),
        timeout: float = typer.Option(600.0, help="Seconds one candidate may take before its worker is killed."),
        shard: str = typer.Option("searches", help="With --nproc-per-node > 1: share out whole searches "
                                  "(each GPU runs its own) or the candidates of each search (lockstep)."),
        compile_workers: Optional[int] = typer.Option(None, help="Processes per GPU compiling a batch of "
                                                      "candidates in parallel before it is timed (default: the "
                                                      "node's cores per GPU less 2, at most 8; 0 on the CPU)."),
        seeds: bool = typer.Option(True, "--seeds/--no-seeds", help="Start coordinate descent from the fastest of "
                                   "the default and up to 6 cached winners of the same kernel (this shape's "
                                   "other variants, then other shapes of the family)."),
        only: Optional[list[str]] = typer.Option(None, "--only", help="Comma-separated dimensions to search "
                                                  "alone (e.g. maxnreg); the others stay at the first seed: with "
                                                  "--retune, the search's cached winner, its register cap "
                                                  "included (search maxnreg beside BK and the like)."),
        report: bool = typer.Option(False, "--report", help="Print the cache's default vs tuned table (with "
                                    "--kernels, only theirs); tune nothing."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="With --report: write a time-vs-maxnreg chart "
                                             "per cache entry into this folder."),
    ):
        """Tune block sizes, warps, stages and register caps of our kernels per shape; cache the winners.

        Each search is saved as it ends; searches already cached for this GPU, compute capability,
        Triton version and kernel source are skipped (--retune searches them again)."""
        started = _start_time()
        if report:
            try:
                only = _pick(kernels, _known_kernels(), "--kernels") if kernels else None
            except _domain_errors() as e:
                _fail(str(e))
            _report(cache_dir, plot, only)
            return
        try:
            fam = choice("--family", family, FAMILIES)
            kernel_l = _pick(kernels, _known_kernels(), "--kernels")
            route_l = _pick(routes, ROUTES, "--routes")
            choice("--shard", shard, SHARDS)
            for name, val, low in (("--budget", budget, 0), ("--min-gain", min_gain, 0),
                                   ("--compile-workers", compile_workers, 0), ("--nproc-per-node", nproc_per_node, 1),
                                   ("--exhaustive-max", exhaustive_max, 0), ("--rounds", rounds, 1),
                                   ("--iters", iters, 1), ("--warmup", warmup, 0), ("--check-tokens", check_tokens, 1),
                                   ("--timeout", timeout, 1)):
                at_least(name, val, low)
            dev = _resolve_device(device, dry_run)
            set_names = _split(shapes) or list(DEFAULT_SETS[fam])
            pairs = select_shapes(set_names, _split(shape_ids), fam)
        except _domain_errors() as e:
            _fail(str(e))
        if not pairs:
            _fail(f"no {'' if fam == 'all' else fam + ' '}shapes selected in {', '.join(set_names)}")
        from ..autotune import dist as at_dist, plan as at_plan, report as at_report
        from ..kernels import tuned

        tasks = []
        for f in dict.fromkeys(s.family for _, s in pairs):
            planned = at_plan.plan_tasks(route_l, kernel_l, f)
            if not planned:  # e.g. --kernels gram on kda shapes, which run kda_intra
                n = sum(1 for _, s in pairs if s.family == f)
                console.print(f"[yellow]{n} {f} shape(s) left out: --kernels {','.join(kernel_l)} are not run by "
                              f"{f} on --routes {','.join(route_l)}[/yellow]")
            tasks += planned
        if not tasks:
            _fail(f"--kernels {','.join(kernel_l)} are not run by --routes {','.join(route_l)}")
        try:
            only_l = _only_dimensions(_split(only), tasks)
        except _domain_errors() as e:
            _fail(str(e))
        if dry_run:
            root = None if retune else tuned.read_dirs(cache_dir)
            rows = at_report.dry_run_rows([s for _, s in pairs], tasks, exhaustive_max, root, tuple(only_l))
            _print_dry_run(rows, root)
            return
        if nproc_per_node > 1 and RANK_ENV not in os.environ:
            opts = dict(shapes=",".join(_split(shapes)) or None, shape_id=",".join(_split(shape_ids)) or None,
                        family=fam, kernels=",".join(kernel_l), routes=",".join(route_l), budget=budget,
                        device=dev, cache_dir=cache_dir, exhaustive_max=exhaustive_max, min_gain=min_gain,
                        check_tokens=check_tokens, warmup=warmup, rounds=rounds, iters=iters, timeout=timeout,
                        retune=retune, compile_workers=compile_workers, seeds=seeds, shard=shard,
                        only=",".join(only_l) or None)
            _relaunch(_argv(opts), nproc_per_node, started)
        opts = at_plan.TuneOptions(device=dev, budget_s=budget, exhaustive_max=exhaustive_max, min_gain=min_gain,
                              check_tokens=check_tokens or (8192 if dev == "cuda" else 1024), warmup=warmup,
                              rounds=rounds, iters=iters, timeout_s=timeout,
                              cache_dir=cache_dir, retune=retune, seeds=seeds,
                              shard=shard, only=tuple(only_l))
        dist = at_dist.torch_dist()
        opts.compile_workers = (at_dist.default_compile_workers(dev, at_dist.ranks_on_node(dist)) if compile_workers is None
                                else compile_workers)
        tally = at_report.Tally()
        try:
            entries = _run_with_progress(at_plan.unique_shapes_pairs(pairs), tasks, opts, dist, tally)
        except KeyboardInterrupt:
            if dist.rank == 0:
                who = " by rank 0 (every rank saves its own)" if dist.world > 1 and opts.shard == "searches" else ""
                where = tuned.write_dir(opts.cache_dir)
                _fail(f"interrupted: {tally.written} finished search(es) saved under {where}{who} "
                      f"({tally.skipped} skipped as cached); run the same command again to resume", EXIT_INTERRUPTED)
            raise typer.Exit(EXIT_INTERRUPTED)
        tallies = dist.all_gather(tally)
        if dist.rank == 0:
            total = at_report.Tally.sum(tallies)
            console.print(f"{len(entries)} searches written under {tuned.write_dir(opts.cache_dir)}", markup=False,
                          soft_wrap=True)
            console.print(_summary(total, time.monotonic() - started, dist.world)
                          + (f"; {dist.world} ranks sharing {opts.shard}" if dist.world > 1 else "; 1 rank") + ", "
                          f"{opts.compile_workers} compile workers per GPU", highlight=False, soft_wrap=True)


def _report(cache_dir: Optional[Path], plot_dir: Optional[Path], kernels: Optional[list[str]] = None) -> None:
    """The tuning cache as a table (and charts): what `gdnbench autotune --report` prints; --kernels: only
    those kernels' entries."""
    from ..autotune import report as at_report
    from ..kernels import tuned
    from .tables import print_tables

    roots = tuned.read_dirs(cache_dir)
    table = at_report.report_table(roots, kernels)
    if not table.rows:
        _fail(f"no tuning cache entries{' of ' + ','.join(kernels) if kernels else ''} under "
              f"{', '.join(map(str, roots))}")
    print_tables(console, [table])
    if plot_dir is not None:
        for gpu, e in at_report.cache_entries(roots, kernels):
            name = f"{gpu}_{e['kernel']}_{e['variant']}_{e['key']['shape_key']}.png"
            try:
                say("chart", "green", str(at_report.chart(e, Path(plot_dir) / name)))
            except ValueError as err:  # no ok candidates: say so, keep going
                console.print(f"[yellow]{name}: {err}[/yellow]")


def _known_kernels() -> tuple:
    from ..kernels.tuned import KERNELS

    return KERNELS


def _domain_errors():
    from ..data.shapes import ShapeError

    return (_Bad, UsageError, ShapeError)


def _standalone_app() -> typer.Typer:
    """An app with only this command (what the torchrun re-launch runs)."""
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root():
        """gdnbench autotune."""

    register(app)
    return app


if __name__ == "__main__":
    if sys.argv[1:2] == ["torchrun"]:
        sys.exit(torchrun_main(sys.argv[2:]))
    _standalone_app()(prog_name="gdnbench")

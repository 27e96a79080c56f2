"""The `gdnbench` command: thin Typer commands that parse, call the library and render.

Domain errors become a one-line message and exit code 2 here; no torch import at
module load, so `gdnbench --help` is instant.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from ..analysis import compare as cmp, report as rep
from ..data import shapes as shp
from ..data.journal import journal_path
from ..data.results import ResultsError
from .console import (EXIT_ABOVE_LIMIT, EXIT_BAD_INPUT, EXIT_CODES_HELP, EXIT_NO_DEVICE, EXIT_NOTHING_MEASURED,  # noqa: F401
                      EXIT_OK, EXIT_STOPPED_BY_ERROR, console, err_console, fail as _fail, print_error,
                      say as _say)
from .options import DEVICES, HELION_EFFORTS, L2_MODES, UsageError, at_least, choice
from .tables import FORMAT_NAMES, emit, print_tables

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Correctness-gated benchmarks of GDN / KDA linear-attention backends and q/k-norm routes.")
shapes_app = typer.Typer(no_args_is_help=True, help="List, show, verify and freeze shape sets.")
app.add_typer(shapes_app, name="shapes")
CONTRACT_SETS = ("kda-legacy6", "gdn-qwen6")
DECODE_SETS = ("gdn-decode", "kda-decode")


def _domain_errors():
    from ..backends import UnknownBackend
    from ..analysis.calibrate import CalibrationError
    from ..analysis.roofline import RooflineError

    return (shp.ShapeError, ResultsError, cmp.CompareError, UnknownBackend, UsageError, CalibrationError,
            RooflineError)


@contextmanager
def _bad_input_exits():
    """A domain error (bad file, field, value or argument) becomes one line and exit code 2."""
    try:
        yield
    except _domain_errors() as e:
        _fail(str(e))


def _split(values: Optional[list[str]]) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


@app.command(epilog=EXIT_CODES_HELP)
def run(
    shapes: Optional[list[str]] = typer.Option(None, "--shapes", "-s", help="Shape set names or .toml paths "
                                                "(default: the contract sets on CUDA, smoke on the CPU; "
                                                "--mode decode: gdn-decode,kda-decode on CUDA, smoke-decode on "
                                                "the CPU)."),
    backends: Optional[list[str]] = typer.Option(None, "--backends", "-b", help="Comma-separated backends "
                                                  "(default: all but reference on CUDA; reference,gdnbench on the CPU)."),
    routes: Optional[list[str]] = typer.Option(None, "--routes", "-r", help="Comma-separated routes (default: the "
                                                "mode's: explicit,flag,fused_q,fused_qk for fwd; explicit,flag,"
                                                "megatron,megatron_flag for fwd_bwd; explicit,flag for decode)."),
    shape_ids: Optional[list[str]] = typer.Option(None, "--shape-id", help="Only these shape ids."),
    mode: Optional[str] = typer.Option(None, help="fwd (default); fwd_bwd: forward + backward with a gradient "
                                       "gate, saved/peak bytes; decode: one token for each of N sequences "
                                       "from a state pool (decode shape sets), time per step and GB/s."),
    device: str = typer.Option("auto", help="auto, cuda or cpu."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Results file (one set) or directory."),
    l2: str = typer.Option("warm", help="warm, or cold: flush L2 before each timed call."),
    warmup: int = typer.Option(10), rounds: int = typer.Option(5),
    iters: int = typer.Option(20, help="Timed calls per route per round."),
    check_tokens: Optional[int] = typer.Option(None, help="Oracle length cap (default 1024 on CPU and in fwd_bwd "
                                                "mode; CUDA fwd gates the full-length call)."),
    isolate: bool = typer.Option(True, help="Run the shapes in a worker subprocess (crash isolation; one "
                                 "worker per run, replaced when it dies)."),
    plot_chart: bool = typer.Option(True, "--plot/--no-plot", help="Write a PNG chart next to each results file."),
    worker_timeout: float = typer.Option(1800, help="Seconds a shape may take before its worker is killed."),
    helion_effort: str = typer.Option("none", help="Helion autotuning of our Helion kernels (backend helion): none "
                                      "(Helion's default configs), quick or full (HELION_AUTOTUNE_EFFORT's presets); "
                                      "tuned configs are cached in the user cache, <cache>/tuned/<gpu>/helion/ "
                                      "($GDNBENCH_CACHE_DIR or ~/.cache/gdnbench)."),
    helion_examples: Optional[Path] = typer.Option(None, help="A Helion repository checkout (or its examples/linear) "
                                                   "for backend helion-linear (default: $GDNBENCH_HELION_EXAMPLES)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue an interrupted run: measure the shapes "
                                          "of this results file (or of its .jsonl journal, which a killed run "
                                          "leaves beside it) that lack a row for some backend:route, keep the "
                                          "rest, write all back to it. Set, mode, backends, routes and timing "
                                          "options default to the file's; device, GPU, versions and code must "
                                          "match."),
):
    """Check, then time, each backend x route on each shape of the sets; write results and print the report."""
    with _bad_input_exits():
        for option, value, low in (("--warmup", warmup, 0), ("--rounds", rounds, 1), ("--iters", iters, 1),
                                   ("--check-tokens", check_tokens, 1), ("--worker-timeout", worker_timeout, 1)):
            at_least(option, value, low)
        options = _backend_options(helion_effort, helion_examples)
        if resume is not None:
            from ..data import results

            prior, _ = results.load_resumable(resume)
            run0, t0 = prior.run or {}, prior.timing
            if out is not None:
                raise UsageError("--resume writes back to its own file; leave out --out")
            shapes = shapes or [prior.shape_set.name]
            mode = mode or run0.get("mode")
            backends = backends or run0.get("backends")
            routes = routes or run0.get("routes")
            check_tokens = check_tokens or run0.get("check_tokens")
            warmup, rounds, iters, l2 = t0["warmup_calls"], t0["rounds"], t0["iters_per_round"], t0["l2"]
        _run(shapes, backends, routes, shape_ids, mode or "fwd", device, out, l2, warmup, rounds, iters,
             check_tokens, isolate, plot_chart, worker_timeout, resume, options)


def _backend_options(effort: str = "none", examples: Optional[Path] = None):
    """The backends' options (the runner builds them with these, in each worker too)."""
    from ..backends.base import BackendOptions

    choice("--helion-effort", effort, HELION_EFFORTS)
    return BackendOptions(effort, str(examples.expanduser().resolve()) if examples is not None else None)


def _resolve_device(device: str) -> str:
    choice("--device", device, DEVICES)
    if device == "cpu":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        _fail("no CUDA device found; run on the CPU with: gdnbench run --device cpu --shapes smoke", EXIT_NO_DEVICE)
    return "cuda"


def _run(shapes, backends, routes, shape_ids, mode, device, out, l2, warmup, rounds, iters, check_tokens, isolate,
         plot_chart, worker_timeout, resume=None, options=None):
    from .. import backends as registry
    from ..data import results
    from ..bench.runner import run_set
    from ..bench.timing import TimingParams
    from .run import fresh_path, measure_and_write

    choice("--l2", l2, L2_MODES)
    choice("--mode", mode, registry.MODES)
    routes_l = _split(routes) or list(registry.ROUTES_BY_MODE[mode])
    for r in routes_l:
        if r not in registry.ALL_ROUTES:
            raise UsageError(f"--routes: unknown route {r!r} (known: {', '.join(registry.ALL_ROUTES)})")
    named_sets = [shp.load(n) for n in _split(shapes)]  # named input fails before the device probe
    for b in _split(backends):
        registry.get(b)  # unknown names fail here, before anything runs
    device = _resolve_device(device)
    defaults = (DECODE_SETS, ("smoke-decode",)) if mode == "decode" else (CONTRACT_SETS, ("smoke",))
    sets = named_sets or [shp.load(n) for n in (defaults[0] if device == "cuda" else defaults[1])]
    backend_names = _split(backends) or list(registry.DEFAULT_BACKENDS[device])
    if device == "cpu":
        warmup, rounds, iters = min(warmup, 1), min(rounds, 2), min(iters, 2)
    # fwd_bwd: the fp64 oracle's autograd keeps ~2 states [N,HV,K,V] per token, hence the shorter default
    check_tokens = check_tokens or (8192 if device == "cuda" and mode == "fwd" else 1024)
    params = TimingParams(warmup=warmup, rounds=rounds, iters=iters, l2=l2)
    if out is not None and len(sets) > 1 and out.suffix == ".json":
        raise UsageError(f"--out {out}: several shape sets write several files; give a directory")
    ids = _split(shape_ids)
    unknown = [i for i in ids if all(i not in {s.id for s in ss.shapes} for ss in sets)]
    if unknown:
        raise UsageError(f"--shape-id: {', '.join(unknown)} in none of {', '.join(ss.name for ss in sets)}")
    env = results.capture_env(device)
    if resume is not None and len(sets) > 1:
        raise UsageError("--resume continues one results file: give one shape set")
    codes = []
    for ss in sets:
        bad = [i for i in ids if i not in {s.id for s in ss.shapes}]
        if ids and len(bad) == len(ids):
            continue
        wanted = [i for i in ids if i not in bad] or [s.id for s in ss.shapes]
        stamp = results.utc_stamp()
        run_info = {"argv": sys.argv[1:], "backends": backend_names, "routes": routes_l, "mode": mode,
                    "device": device, "check_tokens": check_tokens, "isolate": isolate, "interrupted": None}
        if resume is not None:
            prior, path = results.load_resumable(resume)
            results.check_resumable(prior, resume, env, ss)
            names = [registry.get(b).name for b in backend_names]  # a 'module:Class' spec names its rows otherwise
            wanted = results.shapes_to_resume(prior, wanted, [(b, r) for b in names for r in routes_l])
            results.write_atomic(prior, path)  # what the journal kept becomes the document it starts from
            journal_path(path).unlink(missing_ok=True)
            if not wanted:
                console.print(f"nothing to resume: every shape of {path} has its rows", markup=False, soft_wrap=True)
                print_tables(console, rep.report_tables(prior))
                continue
            console.print(f"resuming {path}: {len(wanted)} shape(s) to measure: {', '.join(wanted)}", markup=False,
                          soft_wrap=True)
            _say_if_another_card(prior.env, env)
            header = prior
        else:
            path = fresh_path(out, results.default_path(env, ss.name, stamp, mode))
            header = results.make_document(env, ss, params.describe(), run_info, [], stamp)
        codes.append(measure_and_write(ss, wanted, backend_names, routes_l, header, Path(path),
                                        resume, stamp, plot_chart, mode, lambda on_row, on_shape: run_set(
            ss, backend_names, routes_l, mode, device, check_tokens, params, wanted, isolate, on_row, on_shape,
            worker_timeout, options=options or _backend_options()), card=results.card_of(env)))
        if codes[-1] not in (EXIT_OK, EXIT_NOTHING_MEASURED):
            break
    code = next((c for c in codes if c not in (EXIT_OK, EXIT_NOTHING_MEASURED)),
                EXIT_NOTHING_MEASURED if EXIT_NOTHING_MEASURED in codes else EXIT_OK)
    if code == EXIT_NOTHING_MEASURED:
        _fail("nothing measured: no row passed its check and was timed (every row skipped, incorrect or error)",
              code)
    if code != EXIT_OK:
        raise typer.Exit(code)


@app.command()
def report(
    file: Path = typer.Argument(..., help="A results JSON file."),
    baseline: Optional[str] = typer.Option(None, help="backend:route the ratios divide by (default fla:explicit)."),
    pair: Optional[list[str]] = typer.Option(None, "--pair", help="Extra geomean pair NUM/DEN, e.g. gdnbench:best/fla:flag."),
    markdown: Optional[Path] = typer.Option(None, help="Also write the tables as markdown."),
    mode: Optional[str] = typer.Option(None, help="Which rows: fwd, fwd_bwd or decode (default: the file's run "
                                                  "mode)."),
    fmt: str = typer.Option("table", "--format", help="table (Rich on a terminal, plain text when piped), "
                                                      "markdown, csv or json."),
    to: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the tables in --format to this file "
                                                                "instead of stdout."),
):
    """Tables per shape, ratios to a baseline, geomean ratios with counts and exclusions."""
    from ..data import results

    _check_format(fmt)
    with _bad_input_exits():
        doc = results.load(file)
        _check_baseline(doc, baseline)
        mode = choice("--mode", mode or rep.run_mode(doc), rep.MODES)
        pairs = rep.standard_pairs(rep.rows_of_mode(doc, mode)) + _check_pairs(doc, _split(pair)) if pair else None
        tables = rep.report_tables(doc, baseline, pairs, mode)
        tables += _roofline_tables(doc, file, mode) if mode in ("fwd", "decode") else []
    emit(console, tables, fmt, to)
    if markdown:
        markdown.write_text(rep.to_markdown(tables))
        _say("wrote", "green", str(markdown))


def _say_if_another_card(was: dict, now: dict) -> None:
    """One line when a resumed run continues on another card than the one its file began on (both named)."""
    from ..data.results import card_of

    ua, ub = card_of(was), card_of(now)
    if ua and ub and ua != ub:
        console.print(f"note: the file began on card {ua}, this is {ub}: its rows will come from two cards",
                      markup=False, soft_wrap=True)


def _check_format(fmt: str) -> None:
    if fmt not in FORMAT_NAMES:
        _fail(f"--format {fmt!r}: use {', '.join(FORMAT_NAMES)}")


def _check_baseline(doc, baseline: Optional[str]) -> None:
    """A --baseline must name a backend:route of the file (else every ratio would read '-')."""
    known = sorted({r.spec for r in doc.rows})
    if baseline is not None and baseline not in known:
        raise UsageError(f"--baseline {baseline!r}: not in this file (its backend:routes: {', '.join(known)})")


def _check_pairs(doc, pairs: list[str]) -> list[str]:
    """Each --pair is NUM/DEN, each side a backend:route (or backend:best) of the file."""
    known = {r.spec for r in doc.rows} | {f"{r.backend}:best" for r in doc.rows}
    for p in pairs:
        sides = p.split("/")
        if len(sides) != 2 or not all(s.count(":") == 1 for s in sides):
            raise UsageError(f"--pair {p!r}: use NUM/DEN, each a backend:route, e.g. gdnbench:best/fla:flag")
        missing = [s for s in sides if s not in known]
        if missing:
            raise UsageError(f"--pair {p!r}: {missing[0]} is not in this file (its backend:routes: "
                             f"{', '.join(sorted(known))})")
    return pairs


def _calibration_for(doc, file) -> dict:
    from ..analysis.calibrate import load_for_doc

    calib = load_for_doc(doc, beside=file)
    if calib is None:
        raise UsageError(f"{file}: no calibration for its GPU; run `gdnbench calibrate` there first")
    return calib


def _roofline_tables(doc, file, mode: str = "fwd") -> list:
    """The distance of each row to its roofline floor, when the run's GPU has a calibration."""
    from ..analysis import calibrate
    from ..analysis.roofline import roofline_table

    calib = calibrate.load_for_doc(doc, beside=file)
    if calib is None:
        gpu = (doc.env.get("gpu") or {}).get("name")
        if not gpu:
            return []
        return [rep.Table("roofline", ["note"], [[f"no calibration for {gpu}: run `gdnbench calibrate` on it"]])]
    return [rep.Table(*roofline_table(doc, calib, mode))]


@app.command()
def calibrate():
    """Measure this GPU's copy bandwidth and bf16 matmul rate for the roofline (results/<gpu>/calibration.json)."""
    from ..analysis import calibrate as cal

    try:
        calib = cal.measure()
    except cal.NoCudaError as e:
        _fail(str(e), EXIT_NO_DEVICE)
    path = cal.save(calib)
    console.print(cal.summary(calib), markup=False)
    _say("wrote", "green", str(path))


@app.command()
def compare(
    a: Path = typer.Argument(..., help="Results file A (the base)."),
    b: Path = typer.Argument(..., help="Results file B."),
    markdown: Optional[Path] = typer.Option(None, help="Also write the table as markdown."),
    backends: Optional[list[str]] = typer.Option(None, "--backends", "-b", help="Only these backends."),
    fail_above: Optional[float] = typer.Option(None, "--fail-above", help="Exit 1 when a geomean B/A "
                                               "ratio (wall or gpu) exceeds this, e.g. 1.05 for a 5% regression."),
    fail_rows: bool = typer.Option(False, "--fail-rows", help="With --fail-above: hold every row's ratio to it "
                                   "too, not only the geomeans."),
    fmt: str = typer.Option("table", "--format", help="table, markdown, csv or json."),
    to: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the table in --format to this file."),
):
    """Match rows of two runs of the same shape set; per-row and geomean B/A ratios."""
    from ..data import results

    _check_format(fmt)
    with _bad_input_exits():
        at_least("--fail-above", fail_above, 0)
        da, db = results.load(a), results.load(b)
        try:
            tables = cmp.compare(da, db, backends=_split(backends) or None)
            ratios = cmp.compare_ratios(da, db, backends=_split(backends) or None, rows=fail_rows)
        except cmp.CompareError as e:
            raise cmp.CompareError(f"{a} vs {b}: {e}") from None
    emit(console, tables, fmt, to)
    if markdown:
        markdown.write_text(rep.to_markdown(tables))
    if fail_above is not None:
        over = [f"{label} {r:.3f}" for label, r in ratios if r > fail_above]
        if not ratios:
            err_console.print(f"--fail-above {fail_above}: no row timed in both runs", markup=False)
            raise typer.Exit(EXIT_ABOVE_LIMIT)
        if over:
            err_console.print(f"B/A above {fail_above}: " + "; ".join(over), markup=False, soft_wrap=True)
            raise typer.Exit(EXIT_ABOVE_LIMIT)


@app.command()
def plot(
    file: Path = typer.Argument(..., help="A results JSON file."),
    out: Path = typer.Option(..., "--out", "-o", help="PNG path."),
    kind: str = typer.Option("gpu", help="gpu or wall time for the bars."),
    baseline: Optional[str] = typer.Option(None, help="backend:route for the ratio panel."),
    roofline: bool = typer.Option(False, help="Chart each shape's best route as a fraction of its roofline floor."),
):
    """Grouped bars of time per shape for each backend:route, with a ratio panel (or --roofline)."""
    from ..data import results
    from ..analysis.plot import plot as draw

    with _bad_input_exits():
        choice("--kind", kind, rep.TIME_KINDS)
        doc = results.load(file)
        _check_baseline(doc, baseline)
        calib = _calibration_for(doc, file) if roofline else None
    try:
        if calib is not None:
            from ..analysis.roofline import roofline_chart

            path = roofline_chart(doc, calib, out, kind, mode=rep.run_mode(doc))
        else:
            path = draw(doc, out, kind, baseline, mode=rep.run_mode(doc))
    except ValueError as e:  # nothing to plot
        _fail(f"{file}: {e}")
    _say("wrote", "green", str(path))


@shapes_app.command("list")
def shapes_list():
    """The shape sets shipped with gdnbench (shapes/ in a checkout, gdnbench/shape_sets installed)."""
    rows = []
    for name, path in shp.available().items():
        with _bad_input_exits():
            ss = shp.load_file(path)
        rows.append([ss.name, str(ss.version), ",".join(ss.families), str(len(ss.shapes)), ss.hash[:19],
                     ss.description])
    print_tables(console, [rep.Table(f"shape sets ({shp.SHAPES_DIR})",
                                     ["name", "version", "families", "shapes", "hash", "description"], rows)])


@shapes_app.command("show")
def shapes_show(name: str = typer.Argument(..., help="Set name or .toml path.")):
    """Every shape of a set with its resolved fields."""
    with _bad_input_exits():
        ss = shp.load(name)
    rows = []
    for s in ss.shapes:
        lens = str(list(s.lens)) + (f" x B{s.B}" if s.B > 1 else "")
        dtype = s.dtype + (f", {s.state_dtype} state" if s.decode else "")
        if s.decode:
            lens = f"decode N={s.B}, pool {s.pool_size}"
        gate = s.gate + (f"({s.lower_bound})" if s.lower_bound is not None else "")
        rows.append([s.id, s.family, str(s.H), str(s.HV), str(s.K), str(s.V), lens, str(s.tokens), dtype,
                     str(s.seed), gate, "yes" if s.initial_state else "", s.note])
    print_tables(console, [rep.Table(f"{ss.name} v{ss.version} {ss.hash}", ["id", "family", "H", "HV", "K", "V", "lens",
                                     "tokens", "dtype", "seed", "gate", "h0", "note"], rows)])


@shapes_app.command("verify")
def shapes_verify(names: Optional[list[str]] = typer.Argument(None, help="Sets to verify (default: all).")):
    """Recompute each set's canonical hash and compare it with the frozen one and the ledger."""
    problems = []
    with _bad_input_exits():
        sets = [shp.load(n) for n in names] if names else [shp.load_file(p) for p in shp.available().values()]
    for ss in sets:
        p = shp.verify(ss, shp.ledger_for(ss))
        problems += p
        _say("ok" if not p else "FAIL", "green" if not p else "red", f"{ss.name} v{ss.version} {ss.hash}")
    if problems:
        _fail("; ".join(problems))


@shapes_app.command("freeze")
def shapes_freeze(path: Path = typer.Argument(..., help="A shape-set .toml file, after bumping its version.")):
    """Write a set's hash into its file and record the version in the frozen.json beside it."""
    with _bad_input_exits():
        h = shp.freeze(path)
    console.print(f"froze {path}: {h}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def env(device: str = typer.Option("auto", help="auto, cuda or cpu."),
        helion_examples: Optional[Path] = typer.Option(None, help="A Helion checkout for backend helion-linear "
                                                       "(default: $GDNBENCH_HELION_EXAMPLES).")):
    """Versions, GPU, and each backend's availability with its reason."""
    from .. import backends as registry
    from .. import paths
    from ..data import results

    options = _backend_options(examples=helion_examples)
    with _bad_input_exits():
        choice("--device", device, DEVICES)
    dev = device
    if device == "auto":
        try:
            import torch

            dev = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            dev = "cpu"
    info = results.capture_env(dev)
    rows = [[k, str(v)] for k, v in info["versions"].items()]
    rows += [[k, str(info.get(k))] for k in ("python", "device", "cuda_runtime", "host")]
    git = info["git"]
    rows.append(["git", f"{git['sha']} dirty={git['dirty']}" if git["sha"] else f"none ({git.get('source')})"])
    rows += [[f"gpu.{k}", str(v)] for k, v in info.get("gpu", {}).items()]
    rows += [["cache", str(paths.user_cache_dir())]]
    if dev == "cuda":
        from ..kernels.cache_key import device_env
        from ..kernels.tuned import cache_summary

        rows.append(["tuned entries", cache_summary(device_env())])
    backend_rows = []
    for name in registry.REGISTRY:
        b = registry.get(name, options)
        a = b.is_available()
        backend_rows.append([name, str(b.version()), "yes" if a else "no", a.reason, ",".join(b.routes)])
    print_tables(console, [rep.Table("environment", ["key", "value"], rows),
                           rep.Table("backends", ["backend", "version", "available", "reason", "routes"], backend_rows)])


from .autotune import register as _register_autotune  # noqa: E402  (keeps its imports lazy)

_register_autotune(app)


def _parser_errors() -> tuple:
    """The exceptions typer's parser raises for a bad command line (typer 0.29 carries its own click)."""
    try:
        from typer._click.exceptions import ClickException, NoArgsIsHelpError
    except ImportError:
        from click.exceptions import ClickException, NoArgsIsHelpError
    return ClickException, NoArgsIsHelpError


def main(argv: Optional[list[str]] = None) -> None:
    """The ``gdnbench`` command: the app, with what its parser refuses (an unknown option, a value that is not a
    number) as the one line every other bad input gets, exit 2, in place of typer's boxed usage message."""
    parser_error, no_args = _parser_errors()
    try:
        code = app(args=argv, prog_name="gdnbench", standalone_mode=False)
    except no_args as e:  # `gdnbench shapes` alone: its help, as typer prints it
        e.show()
        code = e.exit_code
    except parser_error as e:
        where = e.ctx.command_path if getattr(e, "ctx", None) is not None else "gdnbench"
        print_error(f"{where}: {e.format_message()} (see {where} --help)")
        code = e.exit_code
    except typer.Abort:
        print_error("aborted")
        code = EXIT_STOPPED_BY_ERROR
    sys.exit(code if isinstance(code, int) else EXIT_OK)

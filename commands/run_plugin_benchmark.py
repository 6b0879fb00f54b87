"""``run-plugin-benchmark POLICY [BENCH|training|test|all ...]``: compile benchmarks with an
inlining policy answering the compiler (a policy file evaluated by the compiler itself,
``-inlining-policy``; any other policy through its policy channel) and measure each against
the heuristic build.

POLICY is ``heuristic``, ``never-inline``, ``always-inline``, an overrides file
(``optimal.sexp``) or a policy file ``train-policy`` wrote
(``dispatcher.build.policies.parse_policy``).  Each benchmark is compiled with the policy
serving the compiler, then compared with its heuristic build in pairs on one worker CPU, as
``run-benchmark`` compares; each comparison is written to
``<results>/<bench>/plugins/plugin_<name>.csv`` (one line per worker for the policy's runs and
one for the heuristic's, as ``run-all-benchmarks`` writes) as soon as it ends.  The table at
the end: each benchmark's speedup with its 95% interval, the geometric mean over the training
split and over the test split with its interval (``dispatcher.core.stats.geomean_speedup_ci``), and
how many benchmarks are significantly faster or slower.

``--baselines`` also measures, on the same benchmarks, the best global Flambda setting tuned on
the training split (``dispatcher.baselines``: chosen once, recorded in
``<results>/global-setting.json``, ``--retune`` to tune again), ``never-inline`` and
``always-inline``, each against the heuristic and written as its own ``plugin_<name>.csv``, and
reports the policy against each (per benchmark and per split, with intervals and binary sizes;
also ``<results>/plugin_<name>.summary.csv``).
"""
from __future__ import annotations

import math
import re
import sys
from contextlib import closing
from pathlib import Path
from typing import NoReturn

import click

from analysis.result_files import csv_rows, outcome, summary_rows, write_csv
from analysis.results import Outcome, format_speedup
from commands.common import (
    backend_errors_in_one_line,
    closing_session,
    show_warnings,
)
from dispatcher import baselines as base
from dispatcher.build.manifest import (
    SPLITS,
    Benchmark,
    ManifestError,
    bundled_benchmarks,
    resolve_benchmark,
)
from dispatcher.build.policies import PolicyError, PolicySpec, parse_policy
from dispatcher.build.service import CompileJob
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.compare import Contender, Failure, compare_with_heuristic, pairing_policy
from dispatcher.config import MAX_RUNS, ConfigError, load_config
from dispatcher.core.stats import geomean_speedup_ci
from dispatcher.session import Session
from pipeline.longrun import progress

PROG = "run-plugin-benchmark"
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]")


def _fail(message: str) -> NoReturn:
    click.echo(f"{PROG}: {message}", err=True)
    sys.exit(2)


def policy_name(spec: PolicySpec, given: str | None) -> str:
    """The name in ``plugin_<name>.csv``: given, or the policy file's stem, or its kind."""
    raw = given or (Path(spec.source).stem if spec.source else spec.kind)
    name = _NAME_BAD.sub("_", raw)
    if not name.strip("._"):
        _fail(f"--name {given!r}: expected letters, digits, '.', '_' or '-'")
    return name


def select(names: tuple[str, ...]) -> list[Benchmark]:
    """Benchmarks by name or directory, or whole splits (training, test, all)."""
    chosen: dict[Path, Benchmark] = {}
    for name in names or ("all",):
        try:
            if name == "all":
                found = bundled_benchmarks()
            elif name in SPLITS:
                found = bundled_benchmarks(name)
            else:
                found = [resolve_benchmark(name)]
        except ManifestError as exc:
            _fail(str(exc))
        for b in found:
            chosen.setdefault(b.directory.resolve(), b)
    return list(chosen.values())


def summary_lines(outcomes: list[Outcome], splits: dict[str, str]) -> list[str]:
    """Per split: the geometric mean speedup with its interval, and how many benchmarks are
    significantly faster or slower than the heuristic."""
    lines = []
    for split in SPLITS:
        mine = [o for o in outcomes if splits.get(o.benchmark) == split
                and o.speedup is not None]
        if not mine:
            continue
        with_ci = [(o.speedup, o.low, o.high) for o in mine
                   if o.low is not None and o.high is not None and o.speedup is not None]
        faster = sum(1 for o in mine if o.low is not None and o.low > 1)
        slower = sum(1 for o in mine if o.high is not None and o.high < 1)
        if len(with_ci) == len(mine):
            g, low, high = geomean_speedup_ci(with_ci)
            mean = f"{g:.3f} [{low:.3f}, {high:.3f}]"
        else:
            mean = "- (a benchmark has no interval)"
        lines.append(f"{split}: geometric mean speedup {mean} over {len(mine)} benchmark"
                     f"{'s' if len(mine) != 1 else ''}; significantly faster {faster}, "
                     f"slower {slower}")
    return lines


@click.command()
@click.argument("policy")
@click.argument("benchmarks", nargs=-1)
@click.option("--name", help="The policy's name in plugin_<name>.csv (default: its file's "
                             "stem, or the built-in policy's name).")
@click.option("--results", type=click.Path(path_type=Path), default=Path("results"),
              show_default=True, help="Where results/<bench>/plugins/ go.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--size", help="Benchmark size from its manifest (default: config).")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="Fewest pairs per comparison (default: config run.runs).")
@click.option("--max-pairs", type=click.IntRange(1, MAX_RUNS),
              help="Most pairs per comparison (default: config measure.max_pairs).")
@click.option("--baselines", is_flag=True,
              help="Also measure the best global setting tuned on the training split, "
                   "never-inline and always-inline, and report the policy against each.")
@click.option("--tune-on", multiple=True, metavar="BENCH",
              help="--baselines: tune the global setting on these benchmarks (names or "
                   "splits; default: training).")
@click.option("--retune", is_flag=True,
              help="--baselines: tune again, even where RESULTS/global-setting.json holds a "
                   "choice made on the same benchmarks, size and grid.")
@backend_errors_in_one_line
def run_plugin_benchmark(policy: str, benchmarks: tuple[str, ...], name: str | None,
                         results: Path, config_path: Path | None, size: str | None,
                         runs: int | None, max_pairs: int | None, baselines: bool,
                         tune_on: tuple[str, ...], retune: bool) -> None:
    """Compile BENCHMARKS (names, directories, training, test or all; default all) with
    POLICY answering the compiler, measure each against its heuristic build, write
    RESULTS/<bench>/plugins/plugin_<name>.csv and print the speedups.

    POLICY is heuristic, never-inline, always-inline, an overrides file (.sexp) or a .policy file
    train-policy wrote (plain data, which the compiler evaluates itself: docs/policies.md)."""
    try:
        spec = parse_policy(policy)
        config = load_config(config_path)
    except (PolicyError, ConfigError) as exc:
        _fail(str(exc))
    label = policy_name(spec, name)
    if (tune_on or retune) and not baselines:
        _fail("--tune-on, --retune: only with --baselines")
    benches = select(benchmarks)
    tuning_benches = select(tune_on or ("training",)) if baselines else []
    size_name = size or config.run.size
    try:
        sizes = {b.name: b.size(size_name) for b in [*benches, *tuning_benches]}
    except ManifestError as exc:
        _fail(str(exc))
    splits = {b.name: b.split for b in benches}
    runs = runs or config.run.runs
    pairing = pairing_policy(config, runs, max_pairs)
    try:
        session = Session(config)
    except CompilerNotFound as exc:
        _fail(str(exc))
    show_warnings()
    outcomes: list[Outcome] = []
    errors = 0

    def error(message: str) -> None:
        nonlocal errors
        errors += 1
        click.echo(f"{PROG}: {message}", err=True)

    contenders: list[Contender] = [
        Contender((label, bench), bench, CompileJob(bench, policy=spec), sizes[bench.name])
        for bench in benches]
    others: list[str] = []  # the baselines' names, in the table's order
    figures: dict[tuple[str, str], base.Measured] = {}  # (build, benchmark) -> figure
    with closing_session(session):
        if baselines:
            tuning = tune_global(session, results, tuning_benches, sizes, size_name, runs,
                                 pairing, retune)
            extra: list[tuple[str, tuple[str, ...] | None]] = [("never-inline", None),
                                                                ("always-inline", None)]
            if tuning.chosen is not None:
                extra.insert(0, (f"global-{tuning.chosen}", tuning.flags))
            for build, flags in extra:
                if build == label:
                    continue
                others.append(build)
                for bench in benches:
                    job = (CompileJob(bench, flags=base.setting_flags(bench, flags))
                           if flags is not None else CompileJob(bench, policy=parse_policy(build)))
                    contenders.append(Contender((build, bench), bench, job, sizes[bench.name]))
        with closing(compare_with_heuristic(session, contenders, runs, pairing)) as compared_all:
            for got in compared_all:
                build, bench = got.contender.tag
                figures[(build, bench.name)] = base.measured_of(session, got)
                if build != label:
                    measured_baseline(results, got, build, figures[(build, bench.name)])
                    continue
                if got.failure in (Failure.COMPILE, Failure.HEURISTIC):
                    error(f"{bench.name}: compile failed: {got.error}")
                elif got.failure is Failure.MEASURE:
                    error(f"{bench.name}: not measured: {got.error}")
                else:
                    compared = got.comparison
                    assert compared is not None
                    path = results / bench.name / "plugins" / f"plugin_{label}.csv"
                    try:
                        write_csv(path, csv_rows(compared, str(spec), ()))
                    except OSError as exc:  # the comparison is in the store: a rerun writes it
                        _fail(f"{results}: cannot write the results: {exc.strerror or exc}")
                    got_outcome = outcome(bench.name, label, compared)
                    outcomes.append(got_outcome)
                    figure = (f"speedup {format_speedup(got_outcome)} ({compared.pairs} "
                              f"pairs on {compared.worker})" if compared.resolved
                              else f"no speedup, {compared.unresolved_line()}")
                    progress(f"{bench.name}: {figure} -> {path}")
                    if compared.failed:
                        error(f"{bench.name}: a run of the policy's build failed")
    print_table(outcomes, splits, label)
    if baselines:
        print_baselines(figures, label, others, benches, splits)
        path = results / f"plugin_{label}.summary.csv"
        try:
            write_csv(path, summary_rows(
                (b.name, b.split, build, figures.get((build, b.name), base.Measured()),
                 None if build == label else base.against(
                     figures.get((label, b.name), base.Measured()),
                     figures.get((build, b.name), base.Measured())))
                for b in benches for build in [label, *others]))
        except OSError as exc:
            _fail(f"{path}: cannot write the summary: {exc.strerror or exc}")
        progress(f"summary -> {path}")
    if errors:
        sys.exit(1)


def tune_global(session: Session, results: Path, benches: list[Benchmark],
                sizes: dict, size_name: str, runs: int, pairing, retune: bool) -> base.Tuning:
    """The global setting (``dispatcher.baselines.tune``), with a progress line per comparison
    and one line on the choice."""
    def each(tag: tuple[str, str], m: base.Measured) -> None:
        progress(f"tuning {tag[0]} on {tag[1]}: speedup {m.figure()}"
                 + (f" ({m.error})" if m.error else ""))
    try:
        tuning = base.tune(session, results, benches, sizes, size_name, runs, pairing, retune,
                           on_each=each, say=progress)
    except base.BaselineError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{results / base.RECORD}: cannot write the choice: {exc.strerror or exc}")
    where = (f"reused from {results / base.RECORD}" if tuning.reused
             else f"recorded in {results / base.RECORD}")
    if tuning.chosen is None:
        click.echo(f"global setting: none measured on every tuning benchmark ({where})")
    else:
        g = tuning.table[tuning.chosen]["geomean"]
        click.echo(f"global setting: {tuning.chosen} ({' '.join(tuning.flags)}), training "
                   f"geometric mean speedup {g[0]:.3f} [{g[1]:.3f}, {g[2]:.3f}] over "
                   f"{len(tuning.benchmarks)} benchmarks ({where})")
    return tuning


def measured_baseline(results: Path, got, build: str, m: base.Measured) -> None:
    """A baseline's comparison written as ``plugin_<build>.csv`` (the policies' layout), one
    progress line; a baseline that does not compile is said, not an error."""
    bench = got.contender.bench
    if got.comparison is not None:
        path = results / bench.name / "plugins" / f"plugin_{build}.csv"
        try:
            write_csv(path, csv_rows(got.comparison, build, ()))
        except OSError as exc:
            _fail(f"{results}: cannot write the results: {exc.strerror or exc}")
    size = f", binary {m.size_ratio:.3f}x" if m.size_ratio is not None else ""
    progress(f"{bench.name}: {build}: speedup {m.figure()}{size}"
             + (f" ({m.error})" if m.error else ""))


def print_baselines(figures: dict[tuple[str, str], base.Measured], label: str,
                    others: list[str], benches: list[Benchmark],
                    splits: dict[str, str]) -> None:
    """Per benchmark and baseline: the baseline's speedup against the heuristic and its size,
    and the policy against it; per split, the geometric means of both with their intervals."""
    click.echo(f"policy {label} against each baseline (speedup: the heuristic's time / the "
               "build's, paired; policy against a baseline: the ratio of the two speedups, "
               "interval from both; size: binary size / the heuristic's)")
    click.echo(f"{'benchmark':20} {'split':9} {'build':24} {'speedup [95% CI]':24} "
               f"{'size':>6}  {label} against it [95% CI]")
    ordered = sorted(benches, key=lambda b: (splits.get(b.name, ""), b.name))
    for b in ordered:
        mine = figures.get((label, b.name), base.Measured())
        for build in [label, *others]:
            m = figures.get((build, b.name), base.Measured())
            size = f"{m.size_ratio:.3f}" if m.size_ratio is not None else "-"
            vs = "-" if build == label else base.against(mine, m).figure()
            click.echo(f"{b.name:20} {splits.get(b.name, ''):9} {build:24} {m.figure():24} "
                       f"{size:>6}  {vs}")
    for split in SPLITS:
        names = [b.name for b in ordered if splits.get(b.name) == split]
        if not names:
            continue
        for build in [label, *others]:
            g = base.geomean(figures.get((build, n), base.Measured()) for n in names)
            line = f"{split}: {build}: geometric mean speedup {_ci(g)}"
            if build != label:
                rel = base.geomean(base.against(figures.get((label, n), base.Measured()),
                                                figures.get((build, n), base.Measured()))
                                   for n in names)
                line += f"; {label} against it {_ci(rel)}"
            sizes = [r for n in names
                     if (r := figures.get((build, n), base.Measured()).size_ratio)]
            if len(sizes) == len(names):
                line += (f"; binary size geometric mean "
                         f"{math.exp(sum(math.log(x) for x in sizes) / len(sizes)):.3f}x")
            click.echo(line + f" over {len(names)} benchmark{'s' if len(names) != 1 else ''}")


def _ci(g: tuple[float, float, float] | None) -> str:
    return "- (a benchmark has no figure)" if g is None else \
        f"{g[0]:.3f} [{g[1]:.3f}, {g[2]:.3f}]"


def print_table(outcomes: list[Outcome], splits: dict[str, str], label: str) -> None:
    click.echo(f"policy {label} against the heuristic (speedup = heuristic time / policy "
               "time, paired, 95% interval)")
    click.echo(f"{'benchmark':24} {'split':9} {'speedup [95% CI]':28} {'significant':12} pairs")
    for o in sorted(outcomes, key=lambda o: (splits.get(o.benchmark, ""), o.benchmark)):
        sig = o.significant
        word = "-" if sig is None else ("faster" if sig and o.speedup and o.speedup > 1
                                       else "slower" if sig else "no")
        click.echo(f"{o.benchmark:24} {splits.get(o.benchmark, ''):9} "
                   f"{format_speedup(o):28} {word:12} {o.pairs}")
    for line in summary_lines(outcomes, splits):
        click.echo(line)


main = run_plugin_benchmark

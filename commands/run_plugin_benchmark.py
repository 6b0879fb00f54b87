"""``run-plugin-benchmark POLICY [BENCH|training|test|all ...]``: compile benchmarks with an
inlining policy answering the compiler (a policy file evaluated by the compiler itself,
``-inlining-policy``; any other policy through its policy channel) and measure each against
the heuristic build.

POLICY is ``heuristic``, ``never-inline``, an overrides file (``optimal.sexp``) or a policy
file ``train-policy`` wrote (``dispatcher.build.policies.parse_policy``).  Each benchmark is
compiled with the policy serving the compiler, then compared with its heuristic build in pairs
on one worker CPU, as ``run-benchmark`` compares; each comparison is written to
``<results>/<bench>/plugins/plugin_<name>.csv`` (one line per worker for the policy's runs and
one for the heuristic's, as ``run-all-benchmarks`` writes) as soon as it ends.  The table at
the end: each benchmark's speedup with its 95% interval, the geometric mean over the training
split and over the test split with its interval (``dispatcher.core.stats.geomean_speedup_ci``), and
how many benchmarks are significantly faster or slower.
"""
from __future__ import annotations

import re
import sys
from contextlib import closing
from pathlib import Path
from typing import NoReturn

import click

from analysis.result_files import csv_rows, outcome, write_csv
from analysis.results import Outcome, format_speedup
from commands.common import (
    backend_errors_in_one_line,
    progress,
    report_lost_workers,
    show_warnings,
)
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
                             "stem, or heuristic / never-inline).")
@click.option("--results", type=click.Path(path_type=Path), default=Path("results"),
              show_default=True, help="Where results/<bench>/plugins/ go.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--size", help="Benchmark size from its manifest (default: config).")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="Fewest pairs per comparison (default: config run.runs).")
@click.option("--max-pairs", type=click.IntRange(1, MAX_RUNS),
              help="Most pairs per comparison (default: config measure.max_pairs).")
@backend_errors_in_one_line
def run_plugin_benchmark(policy: str, benchmarks: tuple[str, ...], name: str | None,
                         results: Path, config_path: Path | None, size: str | None,
                         runs: int | None, max_pairs: int | None) -> None:
    """Compile BENCHMARKS (names, directories, training, test or all; default all) with
    POLICY answering the compiler, measure each against its heuristic build, write
    RESULTS/<bench>/plugins/plugin_<name>.csv and print the speedups.

    POLICY is heuristic, never-inline, an overrides file (.sexp) or a .policy file
    train-policy wrote (plain data, which the compiler evaluates itself: docs/policies.md)."""
    try:
        spec = parse_policy(policy)
        config = load_config(config_path)
    except (PolicyError, ConfigError) as exc:
        _fail(str(exc))
    label = policy_name(spec, name)
    benches = select(benchmarks)
    try:
        sizes = {b.name: b.size(size or config.run.size) for b in benches}
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

    contenders = [Contender(bench, bench, CompileJob(bench, policy=spec), sizes[bench.name])
                  for bench in benches]
    try:
        with closing(compare_with_heuristic(session, contenders, runs, pairing)) as compared_all:
            for got in compared_all:
                bench = got.contender.tag
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
    except KeyboardInterrupt:
        # Ctrl-C: queued runs are dropped and the agents closed at once (an agent kills its
        # run); closing as usual would first run every pair still asked for.
        session.close(abort=True)
        raise
    except BaseException:
        session.close()
        raise
    session.close()
    report_lost_workers(session)
    print_table(outcomes, splits, label)
    if errors:
        sys.exit(1)


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
